/**
 * The host's deadline for one provider call, from the same budget model the
 * Rust host uses (`sandbox-host/src/budget.rs`): the provider declares its
 * plan in `validate-config`'s `operation-budget` (contract 0.2.0) — a
 * lifecycle operation within `operation-ms`, a command within its own
 * timeout (or `operation-ms`), each request within `request-ms`, and each
 * cleanup request gets `request-ms` afresh after the work's budget is
 * spent; the host reads no provider config field. The host's deadline is that plan plus a cleanup reserve (two
 * cleanup requests) plus a margin, so a request waiting for the request pacer,
 * or repeated after a 429, never starts after the provider itself would have
 * given up.
 */
import type { ProviderOperation, WitExecuteRequest, WitOperationBudget } from "./wit-types.js";

/** `operation-ms` when the provider declares no budget. */
export const DEFAULT_TIMEOUT_MS = 300_000;
/** `request-ms` when the provider declares no budget. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/** The longest budget a config can set (24 hours). */
export const MAX_BUDGET_MS = 86_400_000;
/** The margin beyond the plan and its cleanup reserve. */
export const DEADLINE_MARGIN_MS = 5_000;
/**
 * Past the command's timeout, how long a live-output sink may go without
 * taking a chunk and still count as reading.
 */
export const OUTPUT_GRACE_MS = 1_000;
/** Cleanup requests one operation may make after its budget is spent. */
const CLEANUP_REQUESTS = 2;
/** Requests `execute` makes before its command's timeout starts. */
const SETUP_REQUESTS = 3;

function capped(value: bigint | undefined, fallback: number): number {
  return value === undefined ? fallback : Math.min(Number(value), MAX_BUDGET_MS);
}

/**
 * How long, in milliseconds from its start, a call of `operation` may send
 * requests, given the normalised config `validate-config` returned and the
 * call's arguments. `describe` and `validate-config` send none: no bound.
 */
export function callBudgetMs(operation: ProviderOperation, budget: WitOperationBudget | undefined, args: unknown[]): number {
  if (operation === "describe" || operation === "validateConfig") return Number.POSITIVE_INFINITY;
  const timeout = capped(budget?.operationMs, DEFAULT_TIMEOUT_MS);
  const request = capped(budget?.requestMs, DEFAULT_REQUEST_TIMEOUT_MS);
  const reserve = request * CLEANUP_REQUESTS;
  if (operation === "execute" || operation === "interact") {
    // An interactive process (`interact`) is bounded like a command: its own timeout, or `operation-ms`.
    const asked = (args[2] as WitExecuteRequest | undefined)?.timeoutMs;
    const command = asked === undefined ? timeout : Math.min(Number(asked), MAX_BUDGET_MS);
    return command + request * SETUP_REQUESTS + reserve + DEADLINE_MARGIN_MS;
  }
  return timeout + reserve + DEADLINE_MARGIN_MS;
}

/**
 * The command's own timeout of an `execute` (or `interact`) call, in milliseconds (the
 * one its provider ends it at); for any other operation its whole budget.
 * A live-output sink that stops taking output is waited for until then.
 */
export function outputWaitMs(operation: ProviderOperation, budget: WitOperationBudget | undefined, args: unknown[]): number {
  if (operation !== "execute" && operation !== "interact") return callBudgetMs(operation, budget, args);
  const asked = (args[2] as WitExecuteRequest | undefined)?.timeoutMs;
  return asked === undefined ? capped(budget?.operationMs, DEFAULT_TIMEOUT_MS) : Math.min(Number(asked), MAX_BUDGET_MS);
}

/**
 * The provider's budget for one request (`request-ms`), in milliseconds: a
 * request answered 429 is repeated only when the pause it asks for fits
 * in it (the Rust host's `with_max_throttle_wait`). A longer pause would
 * outlast the provider's own wait for that request, which then counts a
 * request the 429 proved never ran as unanswered (an unconfirmed creation
 * that poisons the lease); beyond it the 429 goes to the provider at once,
 * a definite rejection.
 */
export function requestBudgetMs(budget: WitOperationBudget | undefined): number {
  return capped(budget?.requestMs, DEFAULT_REQUEST_TIMEOUT_MS);
}
