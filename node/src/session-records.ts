/**
 * Durable records of open interactive sessions (login terminals, duplex
 * channels), kept in Paperclip's plugin state (`ctx.state`) per lease.
 *
 * A session is recorded before its process is created and forgotten once
 * its end is proven. A record this worker process does not hold a live
 * session for was left by a worker that stopped without ending it (a
 * crash, a kill): its process may still run in the sandbox, so the lease
 * is poisoned (`plugin.ts`), exactly as a command whose cleanup failed.
 * `ctx.state` has no compare-and-set: the list is updated under an
 * in-process lock per lease.
 */
import type { PluginContext } from "@paperclipai/plugin-sdk";

/** The state namespace session records live in. */
export const SESSION_NAMESPACE = "interactive-sessions";

/** What is recorded about one open session. */
export interface SessionRecord {
  hostRouteId: string;
  workerSessionId: string;
  kind: "login-pty" | "duplex-channel";
  /** Which worker process opened it (a fresh id per process). */
  workerInstance: string;
  openedAt: string;
}

type StateClient = PluginContext["state"];

function key(companyId: string, providerLeaseId: string) {
  return { scopeKind: "company" as const, scopeId: companyId, namespace: SESSION_NAMESPACE, stateKey: providerLeaseId };
}

export class SessionRecords {
  readonly #locks = new Map<string, Promise<unknown>>();
  constructor(private readonly state: () => StateClient) {}

  async list(companyId: string, providerLeaseId: string): Promise<SessionRecord[]> {
    const value = await this.state().get(key(companyId, providerLeaseId));
    return Array.isArray(value) ? (value as SessionRecord[]) : [];
  }

  add(companyId: string, providerLeaseId: string, record: SessionRecord): Promise<void> {
    return this.#update(companyId, providerLeaseId, (list) => [...list.filter((r) => r.workerSessionId !== record.workerSessionId), record]);
  }

  remove(companyId: string, providerLeaseId: string, workerSessionIds: readonly string[]): Promise<void> {
    return this.#update(companyId, providerLeaseId, (list) => list.filter((r) => !workerSessionIds.includes(r.workerSessionId)));
  }

  #update(companyId: string, providerLeaseId: string, change: (list: SessionRecord[]) => SessionRecord[]): Promise<void> {
    const lockKey = `${companyId}\u0000${providerLeaseId}`;
    const previous = this.#locks.get(lockKey) ?? Promise.resolve();
    const next = previous
      .catch(() => {})
      .then(async () => {
        const list = change(await this.list(companyId, providerLeaseId));
        if (list.length === 0) await this.state().delete(key(companyId, providerLeaseId));
        else await this.state().set(key(companyId, providerLeaseId), list);
      });
    this.#locks.set(lockKey, next);
    const forget = () => {
      if (this.#locks.get(lockKey) === next) this.#locks.delete(lockKey);
    };
    next.then(forget, forget);
    return next;
  }
}
