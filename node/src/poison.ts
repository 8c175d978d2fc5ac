/**
 * Durable poison: a lease whose cleanup could not be confirmed, kept in
 * Paperclip's plugin state (`ctx.state`, stored in Paperclip's database).
 *
 * The record survives a worker restart and is seen by every server process.
 * A poisoned lease is refused for execute, resume and a pausing release
 * until `environmentDestroyLease` confirms the sandbox is gone (that is the
 * only call that clears it).
 */
import type { PluginContext } from "@paperclipai/plugin-sdk";

/** The state namespace poison records live in. */
export const POISON_NAMESPACE = "poisoned-leases";

/** What is recorded about a poisoned lease. */
export interface PoisonRecord {
  providerLeaseId: string;
  environmentId: string;
  /** Why (the readable message of the failure). */
  reason: string;
  processId?: string;
  recordedAt: string;
}

type StateClient = PluginContext["state"];

function key(companyId: string, providerLeaseId: string) {
  return { scopeKind: "company" as const, scopeId: companyId, namespace: POISON_NAMESPACE, stateKey: providerLeaseId };
}

/** Reads and writes poison records through `ctx.state`. */
export class PoisonStore {
  constructor(private readonly state: () => StateClient) {}

  async get(companyId: string, providerLeaseId: string): Promise<PoisonRecord | null> {
    const value = await this.state().get(key(companyId, providerLeaseId));
    return value && typeof value === "object" ? (value as PoisonRecord) : null;
  }

  async record(companyId: string, record: PoisonRecord): Promise<void> {
    await this.state().set(key(companyId, record.providerLeaseId), record);
  }

  async clear(companyId: string, providerLeaseId: string): Promise<void> {
    await this.state().delete(key(companyId, providerLeaseId));
  }
}
