/**
 * The provider's declared rate limit, per API origin, spent as one sliding
 * window budget per machine: the starts are kept in the {@link RateLedger}
 * file that every worker process opens; this module orders the threads of
 * one process in front of it.
 *
 * `describe()` declares `rate-limit`: at most `requests` request starts in
 * any sliding window of `window-ms`, and optionally at most `per-second` in
 * any second. A request starts at once while the budget allows it;
 * otherwise it waits exactly until the oldest start leaves the window.
 * There is no fixed gap between requests.
 *
 * In-process fast path: each origin hashes to one slot of a
 * `SharedArrayBuffer` that all threads of the pool share. A slot holds two
 * lanes of ticket / now-serving counters, one for cleanup (process and
 * sandbox `DELETE`) and one for everything else. Only the head of each lane
 * reads the ledger; the others sleep (`Atomics.wait`) until the slot moves,
 * so waiters of one process go first in, first out, and cleanup goes ahead
 * of waiting work: the head of the work lane does not ask the ledger while
 * a cleanup request waits, and a cleanup request arriving wakes it.
 * A waiter that gives up (its call's deadline passed, or its call was
 * cancelled) leaves its lane without holding anyone up: it marks its
 * ticket, and whoever serves up to it skips it.
 *
 * A 429 from the API ({@link Pacer.throttled}) pauses the origin in the
 * ledger, for every process, until its `Retry-After` (else one window).
 *
 * A declared budget protects the provider's real service. An origin whose
 * answers say they come from our embedded engine ({@link ENGINE_HEADER})
 * is not that service: each thread remembers, per exact origin, what the
 * origin's latest answer said ({@link Pacer.noteAnswer}), and the outgoing
 * handler spends the engine's own budget ({@link ENGINE_RATE_LIMIT_HEADER})
 * or none instead ({@link Pacer.budgetFor}). The first request to an origin
 * is always paced (nothing is known yet), an answer without the header
 * takes the claim back, and a claim never touches another origin (the
 * slots below are shared by hash; the claims are not): a real service
 * that sent the header would only give up its own pacing. The Rust host's
 * rule (`sandbox-host/src/network/request_pacer.rs`).
 *
 * Two origins that hash to the same slot share one queue (never looser).
 * A thread terminated while it is a head would stall its lane; the pool
 * terminates threads only when it closes.
 */
import { parseRateLimit, RateLedger } from "./rate-ledger.js";
import type { WitRateLimit } from "./wit-types.js";

/** The header every answer of the embedded engine (`createos-local`) carries, naming it. */
export const ENGINE_HEADER = "x-sandbox-engine";
/** The engine's own budget (`REQUESTS/WINDOW_MS`), on the answers of the paths it limits. */
export const ENGINE_RATE_LIMIT_HEADER = "x-sandbox-engine-rate-limit";

/** How many origin slots the shared table has. */
export const PACER_SLOTS = 64;
/** Abandoned-ticket marks per lane: more than the threads that can wait at once. */
const ABANDON_RING = 256;

/** Which lane a request waits in. */
export type Priority = "cleanup" | "work";

const GEN = 0;
const TICKET = { cleanup: 1, work: 3 } as const;
const SERVING = { cleanup: 2, work: 4 } as const;
const WAITED = 5;
const THROTTLED = 6;
const STARTED = 7;
const HEADER_CELLS = 8;
const RING_BASE = { cleanup: HEADER_CELLS, work: HEADER_CELLS + ABANDON_RING } as const;
const SLOT_CELLS = HEADER_CELLS + 2 * ABANDON_RING;

/** How often a waiter with a cancellation check looks at it. */
const CANCEL_POLL_MS = 50;

/** Creates the shared table a pool hands to each of its threads. */
export function createPacerBuffer(): SharedArrayBuffer {
  return new SharedArrayBuffer(PACER_SLOTS * SLOT_CELLS * Int32Array.BYTES_PER_ELEMENT);
}

function sum(buffer: SharedArrayBuffer, cell: number): number {
  const ints = new Int32Array(buffer);
  let total = 0;
  for (let slot = 0; slot < PACER_SLOTS; slot++) total += Atomics.load(ints, slot * SLOT_CELLS + cell);
  return total;
}

/** How many request starts, over all origins, had to wait for the budget (this process). */
export function pacerWaits(buffer: SharedArrayBuffer): number {
  return sum(buffer, WAITED);
}

/** How many 429 answers paused an origin's budget (this process). */
export function pacerThrottled(buffer: SharedArrayBuffer): number {
  return sum(buffer, THROTTLED);
}

/** How many requests the budget let start (this process). */
export function pacerStarted(buffer: SharedArrayBuffer): number {
  return sum(buffer, STARTED);
}

/** How many turns `origin`'s slot has handed out and how many it has served, per lane. */
export function pacerQueue(buffer: SharedArrayBuffer, origin: string, lane: Priority = "work"): { taken: number; served: number } {
  const ints = new Int32Array(buffer);
  const base = pacerSlot(origin) * SLOT_CELLS;
  return { taken: Atomics.load(ints, base + TICKET[lane]), served: Atomics.load(ints, base + SERVING[lane]) };
}

/** The slot an origin's queue lives in (FNV-1a of the origin). */
export function pacerSlot(origin: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < origin.length; i++) {
    hash ^= origin.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash % PACER_SLOTS;
}

/** A request's place in the window; settle it when the answer came. */
export interface Grant {
  /** The answer came now: the request counts from now. Idempotent. */
  settle(): void;
}

/** What a waiter may give up for. */
export interface WaitBounds {
  /** Epoch milliseconds after which the request must not start. */
  deadlineMs: number;
  /** The call was cancelled (checked for work requests only: cleanup must still run). */
  cancelled?: () => boolean;
}

/** One thread's view of the shared queue table and of the ledger file. */
export class Pacer {
  readonly #ints: Int32Array;
  readonly #ledgerPath: string;
  #ledger: RateLedger | undefined;
  /** Origins whose latest answer came from the engine, and the budget it named (`null`: none). */
  readonly #engines = new Map<string, WitRateLimit | null>();

  constructor(buffer: SharedArrayBuffer, ledgerPath: string) {
    this.#ints = new Int32Array(buffer);
    this.#ledgerPath = ledgerPath;
  }

  /**
   * Remembers what an answer from `origin` said about who gave it
   * (`header(name)`: the answer's header value): from the engine, with
   * the budget it named if that can be read, or not (which takes back an
   * earlier claim). A claim with a budget that cannot be read counts as no
   * claim.
   */
  noteAnswer(origin: string, header: (name: string) => string | undefined): void {
    if (header(ENGINE_HEADER) === undefined) {
      this.#engines.delete(origin);
      return;
    }
    const named = header(ENGINE_RATE_LIMIT_HEADER);
    if (named === undefined) {
      this.#engines.set(origin, null);
      return;
    }
    try {
      this.#engines.set(origin, parseRateLimit(named, ENGINE_RATE_LIMIT_HEADER));
    } catch {
      this.#engines.delete(origin);
    }
  }

  /** The budget a request to `origin` spends under the `declared` one: the engine's own (or none) once it said it is the engine. */
  budgetFor(origin: string, declared: WitRateLimit | undefined): WitRateLimit | undefined {
    const engine = this.#engines.get(origin);
    if (engine === undefined) return declared;
    return engine ?? undefined;
  }

  /** This thread's connection to the ledger, opened on first use. */
  ledger(): RateLedger {
    this.#ledger ??= RateLedger.open(this.#ledgerPath);
    return this.#ledger;
  }

  #moved(base: number) {
    Atomics.add(this.#ints, base + GEN, 1);
    Atomics.notify(this.#ints, base + GEN);
  }

  #cleanupWaiting(base: number): boolean {
    return Atomics.load(this.#ints, base + TICKET.cleanup) !== Atomics.load(this.#ints, base + SERVING.cleanup);
  }

  /** Moves `lane`'s serving counter past `ticket` and past any abandoned tickets after it. */
  #serveAfter(base: number, lane: Priority, ticket: number) {
    Atomics.store(this.#ints, base + SERVING[lane], (ticket + 1) | 0);
    for (let next = (ticket + 1) | 0; ; next = (next + 1) | 0) {
      const mark = base + RING_BASE[lane] + ((next >>> 0) % ABANDON_RING);
      // Whoever clears an abandoned mark moves past it (see #abandon).
      if (Atomics.compareExchange(this.#ints, mark, (next + 1) | 0, 0) !== ((next + 1) | 0)) break;
      Atomics.compareExchange(this.#ints, base + SERVING[lane], next, (next + 1) | 0);
    }
    this.#moved(base);
  }

  /** Leaves `lane` without being served. */
  #abandon(base: number, lane: Priority, ticket: number) {
    if (Atomics.load(this.#ints, base + SERVING[lane]) === ticket) {
      this.#serveAfter(base, lane, ticket);
      return;
    }
    const mark = base + RING_BASE[lane] + ((ticket >>> 0) % ABANDON_RING);
    Atomics.store(this.#ints, mark, (ticket + 1) | 0);
    // The lane may have reached this ticket since: then skip it here.
    if (Atomics.load(this.#ints, base + SERVING[lane]) === ticket && Atomics.compareExchange(this.#ints, mark, (ticket + 1) | 0, 0) === ((ticket + 1) | 0)) {
      this.#serveAfter(base, lane, ticket);
      return;
    }
    this.#moved(base);
  }

  /**
   * Waits (blocking this thread) until `limit` allows one more request to
   * `origin`, records its start in the ledger and returns its grant.
   * Returns `undefined` when the waiter gave up (deadline or cancellation)
   * before its start. Without a limit it returns at once and records
   * nothing. Throws when the ledger cannot be read or written.
   */
  acquire(origin: string, limit: WitRateLimit | undefined, priority: Priority, bounds: WaitBounds): Grant | undefined {
    if (!limit) return { settle() {} };
    const ints = this.#ints;
    const base = pacerSlot(origin) * SLOT_CELLS;
    const ticket = Atomics.add(ints, base + TICKET[priority], 1);
    // A cleanup request arriving wakes the work head so it can step aside.
    if (priority === "cleanup") this.#moved(base);
    const cancelled = priority === "work" ? bounds.cancelled : undefined;
    let waited = false;
    try {
      for (;;) {
        const generation = Atomics.load(ints, base + GEN);
        let sleepMs = Number.POSITIVE_INFINITY;
        const head = Atomics.load(ints, base + SERVING[priority]) === ticket;
        if (head && (priority === "cleanup" || !this.#cleanupWaiting(base))) {
          const decision = this.ledger().tryStart(origin, limit, Date.now());
          if ("entry" in decision) {
            this.#serveAfter(base, priority, ticket);
            Atomics.add(ints, base + STARTED, 1);
            if (waited) Atomics.add(ints, base + WAITED, 1);
            return this.#grant(decision.entry);
          }
          // Only a spent budget counts as waiting (not a place behind others).
          waited = true;
          sleepMs = decision.waitMs;
        }
        const remaining = bounds.deadlineMs - Date.now();
        if (remaining <= 0 || cancelled?.()) {
          this.#abandon(base, priority, ticket);
          return undefined;
        }
        let timeout = Math.min(sleepMs, remaining);
        if (cancelled) timeout = Math.min(timeout, CANCEL_POLL_MS);
        Atomics.wait(ints, base + GEN, generation, Math.max(1, timeout));
      }
    } catch (error) {
      this.#abandon(base, priority, ticket);
      throw error;
    }
  }

  #grant(entry: number): Grant {
    let settled = false;
    return {
      settle: () => {
        if (settled) return;
        settled = true;
        try {
          this.ledger().settle(entry, Date.now());
        } catch {
          // An unwritable ledger keeps the start time: the request then
          // counts from its start, which the margin covers in most cases.
        }
      },
    };
  }

  /** Records a 429 from `origin`: no request starts there, in any process, before `pauseMs` passed. */
  throttled(origin: string, pauseMs: number): void {
    const base = pacerSlot(origin) * SLOT_CELLS;
    Atomics.add(this.#ints, base + THROTTLED, 1);
    this.ledger().pause(origin, Date.now() + pauseMs);
    this.#moved(base);
  }
}
