/**
 * The host's deadline for one provider call, from the same budget model the
 * Rust host uses (`sandbox-host/src/budget.rs`): the provider plans a
 * lifecycle operation within `timeoutMs`, a command within its own timeout
 * (or `timeoutMs`), each request within `requestTimeoutMs`, and each
 * cleanup request gets `requestTimeoutMs` afresh after the work's budget
 * is spent. The host's deadline is that plan plus a cleanup reserve (two
 * cleanup requests) plus a margin, so a request waiting for the rate budget,
 * or repeated after a 429, never starts after the provider itself would have
 * given up.
 */
import type { ProviderOperation, WitExecuteRequest } from "./wit-types.js";

/** `timeoutMs` when the config has none (the CreateOS provider's default). */
export const DEFAULT_TIMEOUT_MS = 300_000;
/** `requestTimeoutMs` when the config has none. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/** The longest budget a config can set (24 hours). */
export const MAX_BUDGET_MS = 86_400_000;
/** The margin beyond the plan and its cleanup reserve. */
export const DEADLINE_MARGIN_MS = 5_000;
/** Cleanup requests one operation may make after its budget is spent. */
const CLEANUP_REQUESTS = 2;
/** Requests `execute` makes before its command's timeout starts. */
const SETUP_REQUESTS = 3;

function field(config: Record<string, unknown>, name: string, fallback: number): number {
  const value = config[name];
  return typeof value === "number" && Number.isFinite(value) && value >= 0 ? Math.min(value, MAX_BUDGET_MS) : fallback;
}

/**
 * How long, in milliseconds from its start, a call of `operation` may send
 * requests, given the normalised config `validate-config` returned and the
 * call's arguments. `describe` and `validate-config` send none: no bound.
 */
export function callBudgetMs(operation: ProviderOperation, normalizedConfig: string | undefined, args: unknown[]): number {
  if (operation === "describe" || operation === "validateConfig") return Number.POSITIVE_INFINITY;
  let config: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(normalizedConfig ?? "{}") as unknown;
    if (parsed && typeof parsed === "object") config = parsed as Record<string, unknown>;
  } catch {
    // An unreadable config plans with the defaults.
  }
  const timeout = field(config, "timeoutMs", DEFAULT_TIMEOUT_MS);
  const request = field(config, "requestTimeoutMs", DEFAULT_REQUEST_TIMEOUT_MS);
  const reserve = request * CLEANUP_REQUESTS;
  if (operation === "execute") {
    const asked = (args[2] as WitExecuteRequest | undefined)?.timeoutMs;
    const command = asked === undefined ? timeout : Math.min(Number(asked), MAX_BUDGET_MS);
    return command + request * SETUP_REQUESTS + reserve + DEADLINE_MARGIN_MS;
  }
  return timeout + reserve + DEADLINE_MARGIN_MS;
}
