/**
 * Sandboxes that a failed acquire created and could not delete, kept in
 * Paperclip's plugin state (`ctx.state`, Paperclip's database) so that a
 * later call can delete them.
 *
 * Paperclip never learns such a sandbox's id: the acquire failed, and
 * `@paperclipai/plugin-sdk` 2026.916.1 sends only the code and message of a
 * thrown error (the id is in the message for people, but no code reads it).
 * So the plugin itself remembers it, per company and environment (namespace
 * `orphaned-sandboxes`, state key = the environment id): the sandbox id, the
 * API origin it lives at, the run and the reason. The next acquire, and a
 * release or destroy without a lease, of the same environment sweeps them:
 * each is destroyed through the component, and only a confirmed receipt
 * (deleted or already gone, from the same origin) removes the record. Until
 * then the sandbox id is also poisoned (see `poison.ts`).
 *
 * `ctx.state` has no list and no compare-and-set, so the record is one list
 * per environment, updated by read-modify-write under an in-process lock and
 * checked after writing; two server processes recording an orphan of the
 * same environment at the same instant could still lose one entry (its
 * poison record stays).
 */
import type { PluginContext } from "@paperclipai/plugin-sdk";

/** The state namespace orphan records live in. */
export const ORPHAN_NAMESPACE = "orphaned-sandboxes";

/** A sandbox a failed acquire left behind. */
export interface OrphanRecord {
  providerLeaseId: string;
  /** The API origin (`scheme://host[:port]`) the sandbox was created at: only a sweep against it can prove it gone. */
  apiOrigin: string;
  runId?: string;
  /** Why (the readable message of the failure). */
  reason: string;
  recordedAt: string;
}

type StateClient = PluginContext["state"];

function key(companyId: string, environmentId: string) {
  return { scopeKind: "company" as const, scopeId: companyId, namespace: ORPHAN_NAMESPACE, stateKey: environmentId };
}

function parse(value: unknown): OrphanRecord[] {
  const list = (value as { sandboxes?: unknown } | null)?.sandboxes;
  if (!Array.isArray(list)) return [];
  return list.filter(
    (entry): entry is OrphanRecord =>
      typeof entry === "object" && entry !== null && typeof entry.providerLeaseId === "string" && typeof entry.apiOrigin === "string",
  );
}

/** Reads and writes orphan records through `ctx.state`. */
export class OrphanStore {
  readonly #locks = new Map<string, Promise<unknown>>();

  constructor(private readonly state: () => StateClient) {}

  /** Runs `change` on one environment's list, one change at a time in this process. */
  #update(companyId: string, environmentId: string, change: (list: OrphanRecord[]) => OrphanRecord[], check: (list: OrphanRecord[]) => boolean) {
    const lockKey = `${companyId}\u0000${environmentId}`;
    const previous = this.#locks.get(lockKey) ?? Promise.resolve();
    const next = previous.then(async () => {
      for (let attempt = 0; attempt < 3; attempt++) {
        const list = await this.list(companyId, environmentId);
        await this.state().set(key(companyId, environmentId), { sandboxes: change(list) });
        if (check(await this.list(companyId, environmentId))) return;
      }
      throw new Error(`the record of sandboxes left by failed acquires of environment ${environmentId} could not be updated`);
    });
    const settled = next.catch(() => {});
    this.#locks.set(lockKey, settled);
    void settled.then(() => {
      if (this.#locks.get(lockKey) === settled) this.#locks.delete(lockKey);
    });
    return next;
  }

  /** The sandboxes recorded for an environment. */
  async list(companyId: string, environmentId: string): Promise<OrphanRecord[]> {
    return parse(await this.state().get(key(companyId, environmentId)));
  }

  /** Records a sandbox a failed acquire left behind. */
  async record(companyId: string, environmentId: string, orphan: OrphanRecord): Promise<void> {
    await this.#update(
      companyId,
      environmentId,
      (list) => [...list.filter((entry) => entry.providerLeaseId !== orphan.providerLeaseId), orphan],
      (list) => list.some((entry) => entry.providerLeaseId === orphan.providerLeaseId),
    );
  }

  /** Removes a sandbox proven gone. */
  async remove(companyId: string, environmentId: string, providerLeaseId: string): Promise<void> {
    await this.#update(
      companyId,
      environmentId,
      (list) => list.filter((entry) => entry.providerLeaseId !== providerLeaseId),
      (list) => !list.some((entry) => entry.providerLeaseId === providerLeaseId),
    );
  }
}
