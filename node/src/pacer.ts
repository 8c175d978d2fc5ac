/**
 * The provider's declared request spacing, per API origin, as one budget
 * shared by every worker thread of the pool.
 *
 * `describe()` declares `request-spacing-ms`: the minimum gap between the
 * starts of two requests to the same origin, across every instance. Each
 * origin hashes to one slot of a `SharedArrayBuffer` that holds the earliest
 * start time (microseconds since the epoch) the next request may take.
 * A request reserves its start with a compare-and-swap (first come, first
 * served: reservations are granted in the order they are taken) and the
 * thread then sleeps until its start with `Atomics.wait`. Because a thread
 * can wake a little late, the moment a request is let go is also recorded
 * per slot, and a request never goes less than the spacing after the one
 * let go before it. No fixed gap is
 * added beyond the declared spacing: a request that comes after an idle
 * period starts at once.
 *
 * Two origins that hash to the same slot share one budget; that only makes
 * the spacing stricter, never looser.
 */

/** How many origin slots the shared table has. */
export const PACER_SLOTS = 64;

/** Creates the shared table a pool hands to each of its threads. */
export function createPacerBuffer(): SharedArrayBuffer {
  // Reservations in the first half, the last granted start in the second.
  return new SharedArrayBuffer(2 * PACER_SLOTS * BigInt64Array.BYTES_PER_ELEMENT);
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

/** One thread's view of the shared spacing table. */
export class Pacer {
  readonly #next: BigInt64Array;
  readonly #sleeper = new Int32Array(new SharedArrayBuffer(4));

  constructor(buffer: SharedArrayBuffer) {
    this.#next = new BigInt64Array(buffer);
  }

  #sleepUntil(micros: bigint) {
    for (let now = nowMicros(); now < micros; now = nowMicros()) {
      Atomics.wait(this.#sleeper, 0, 0, Math.max(1, Number(micros - now) / 1000));
    }
  }

  /**
   * Reserves the next start for `origin`, blocks this thread until it, and
   * returns the start it was granted (microseconds since the epoch).
   */
  waitForTurn(origin: string, spacingMs: number): bigint {
    if (spacingMs <= 0) return nowMicros();
    const slot = pacerSlot(origin);
    const lastSlot = PACER_SLOTS + slot;
    const spacing = BigInt(Math.round(spacingMs * 1000));
    for (;;) {
      const reserved = Atomics.load(this.#next, slot);
      const now = nowMicros();
      const start = reserved > now ? reserved : now;
      if (Atomics.compareExchange(this.#next, slot, reserved, start + spacing) === reserved) {
        this.#sleepUntil(start);
        break;
      }
    }
    for (;;) {
      const last = Atomics.load(this.#next, lastSlot);
      const earliest = last === 0n ? 0n : last + spacing;
      const now = nowMicros();
      if (now < earliest) {
        this.#sleepUntil(earliest);
        continue;
      }
      if (Atomics.compareExchange(this.#next, lastSlot, last, now) === last) return now;
    }
  }
}
