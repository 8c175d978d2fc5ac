/**
 * The provider's declared rate limit, per API origin, spent as one sliding
 * window budget shared by every worker thread of the pool.
 *
 * `describe()` declares `rate-limit`: at most `requests` request starts in
 * any sliding window of `window-ms`, and optionally at most `per-second` in
 * any second. A request starts at once while fewer than that many requests
 * started in the last window; otherwise it waits exactly until the oldest
 * of them leaves the window. There is no fixed gap between requests.
 *
 * Each origin hashes to one slot of a `SharedArrayBuffer`. A slot holds
 * - a ring of the most recent start times (microseconds since the epoch)
 *   and the number of starts recorded so far;
 * - a ticket counter and a "now serving" counter: a request takes a ticket
 *   and waits (`Atomics.wait`) until it is served, so waiters go in arrival
 *   order (FIFO). Only the request being served reads and writes the ring;
 *   it waits there until the budget allows its start, records it, and
 *   serves the next ticket;
 * - how many starts had to wait for the budget ({@link pacerWaits}).
 *
 * Windows are counted slightly longer than declared ({@link windowMargin}:
 * 1% of the window, at least 25 ms) so that network jitter between the
 * start here and the arrival at the server cannot make the server count
 * one start too many in its window.
 *
 * Two origins that hash to the same slot share one budget, and a limit
 * above {@link RING_SIZE} requests per window is counted as
 * {@link RING_SIZE}; both only make the budget stricter, never looser.
 * A thread that is terminated while it is being served would stall its
 * slot; the pool terminates threads only when it closes.
 */
import type { WitRateLimit } from "./wit-types.js";

/** How many origin slots the shared table has. */
export const PACER_SLOTS = 64;
/** How many recent starts each slot remembers (the largest usable `requests`). */
export const RING_SIZE = 1024;

/** Int32 cells per slot: ticket, now serving, starts that had to wait. */
const INT_CELLS = 3;
/** BigInt64 cells per slot: count of recorded starts, then the ring. */
const BIG_CELLS = 1 + RING_SIZE;
const INT_BYTES = PACER_SLOTS * INT_CELLS * Int32Array.BYTES_PER_ELEMENT;

/** Creates the shared table a pool hands to each of its threads. */
export function createPacerBuffer(): SharedArrayBuffer {
  return new SharedArrayBuffer(INT_BYTES + PACER_SLOTS * BIG_CELLS * BigInt64Array.BYTES_PER_ELEMENT);
}

/** How many request starts, over all origins, had to wait for the budget. */
export function pacerWaits(buffer: SharedArrayBuffer): number {
  const ints = new Int32Array(buffer, 0, PACER_SLOTS * INT_CELLS);
  let waits = 0;
  for (let slot = 0; slot < PACER_SLOTS; slot++) waits += Atomics.load(ints, slot * INT_CELLS + 2);
  return waits;
}

/** How many turns `origin`'s slot has handed out and how many it has served. */
export function pacerQueue(buffer: SharedArrayBuffer, origin: string): { taken: number; served: number } {
  const ints = new Int32Array(buffer, 0, PACER_SLOTS * INT_CELLS);
  const cell = pacerSlot(origin) * INT_CELLS;
  return { taken: Atomics.load(ints, cell), served: Atomics.load(ints, cell + 1) };
}

/**
 * The starts `origin`'s slot recorded (the last {@link RING_SIZE}), oldest
 * first, in milliseconds since the epoch: the budget's own account of what
 * it let go.
 */
export function recordedStarts(buffer: SharedArrayBuffer, origin: string): number[] {
  const bigs = new BigInt64Array(buffer, INT_BYTES, PACER_SLOTS * BIG_CELLS);
  const base = pacerSlot(origin) * BIG_CELLS;
  const count = Number(Atomics.load(bigs, base));
  const starts: number[] = [];
  for (let i = Math.max(0, count - RING_SIZE); i < count; i++) starts.push(Number(Atomics.load(bigs, base + 1 + (i % RING_SIZE))) / 1000);
  return starts;
}

/** Microseconds since the epoch, comparable across threads. */
export function nowMicros(): bigint {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1000));
}

/** The slot an origin's budget lives in (FNV-1a of the origin). */
export function pacerSlot(origin: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < origin.length; i++) {
    hash ^= origin.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash % PACER_SLOTS;
}

/** How much longer than declared a window is counted: 1% of it, at least 25 ms. */
export function windowMargin(windowMs: number): number {
  return Math.max(25, Math.ceil(windowMs / 100));
}

/** One thread's view of the shared budget table. */
export class Pacer {
  readonly #ints: Int32Array;
  readonly #bigs: BigInt64Array;
  readonly #sleeper = new Int32Array(new SharedArrayBuffer(4));

  constructor(buffer: SharedArrayBuffer) {
    this.#ints = new Int32Array(buffer, 0, PACER_SLOTS * INT_CELLS);
    this.#bigs = new BigInt64Array(buffer, INT_BYTES, PACER_SLOTS * BIG_CELLS);
  }

  #sleepUntil(micros: bigint) {
    for (let now = nowMicros(); now < micros; now = nowMicros()) {
      Atomics.wait(this.#sleeper, 0, 0, Math.max(1, Number(micros - now) / 1000));
    }
  }

  /**
   * The earliest moment the next start fits `limit` starts per `windowMs`
   * (counted with its margin), from the slot's recorded starts.
   */
  #earliest(base: number, count: bigint, limit: number, windowMs: number): bigint {
    const n = BigInt(Math.min(Math.max(1, Math.floor(limit)), RING_SIZE));
    if (count < n) return 0n;
    // The n-th most recent start: once it leaves the window, one more fits.
    const oldest = Atomics.load(this.#bigs, base + 1 + Number((count - n) % BigInt(RING_SIZE)));
    return oldest + BigInt(Math.round((windowMs + windowMargin(windowMs)) * 1000));
  }

  /**
   * Waits (blocking this thread) until `limit` allows one more request to
   * `origin`, in arrival order among waiting threads, records its start and
   * returns it (microseconds since the epoch). Without a limit it returns at
   * once and records nothing.
   */
  waitForTurn(origin: string, limit: WitRateLimit | undefined): bigint {
    if (!limit) return nowMicros();
    const slot = pacerSlot(origin);
    const ticketCell = slot * INT_CELLS;
    const servingCell = ticketCell + 1;
    const base = slot * BIG_CELLS;
    const ticket = Atomics.add(this.#ints, ticketCell, 1);
    for (let serving = Atomics.load(this.#ints, servingCell); serving !== ticket; serving = Atomics.load(this.#ints, servingCell)) {
      Atomics.wait(this.#ints, servingCell, serving);
    }
    try {
      const count = Atomics.load(this.#bigs, base);
      let earliest = this.#earliest(base, count, limit.requests, limit.windowMs);
      if (limit.perSecond !== undefined) {
        const second = this.#earliest(base, count, limit.perSecond, 1000);
        if (second > earliest) earliest = second;
      }
      if (earliest > nowMicros()) {
        Atomics.add(this.#ints, ticketCell + 2, 1);
        this.#sleepUntil(earliest);
      }
      const start = nowMicros();
      Atomics.store(this.#bigs, base + 1 + Number(count % BigInt(RING_SIZE)), start);
      Atomics.store(this.#bigs, base, count + 1n);
      return start;
    } finally {
      Atomics.add(this.#ints, servingCell, 1);
      Atomics.notify(this.#ints, servingCell);
    }
  }
}
