/**
 * The machine-wide record of API request starts per origin: one SQLite file
 * (Node's built-in `node:sqlite`) that every worker process of the plugin on
 * this machine, and every thread of each, opens. It is what makes the
 * provider's declared rate limit one budget per origin per machine instead
 * of one per process.
 *
 * Each start is one short `BEGIN IMMEDIATE` transaction: drop the starts
 * that left the window, read the origin's 429 pause, decide, record. A
 * request occupies the window from its start until its answer came
 * ({@link RateLedger.settle} moves its time then): the API counts a request
 * when it arrives, somewhere between the two, so counting it until the
 * answer keeps the host within the limit however the network or a busy
 * machine delays a request. Times are wall-clock milliseconds, the one clock
 * processes share; {@link windowMargin} covers its granularity.
 *
 * The schema and the decision rule are the Rust host's
 * (`sandbox-host/src/network/request_pacer.rs`): tables `request_starts (origin,
 * at_ms)` and `origin_pauses (origin, until_ms)`.
 */
import { lstatSync, mkdirSync } from "node:fs";
import { tmpdir, userInfo } from "node:os";
import path from "node:path";
import { DatabaseSync, type StatementSync } from "node:sqlite";

import type { WitRateLimit } from "./wit-types.js";

/** How long an open that finds the ledger locked is tried again. */
const OPEN_RETRY_MS = 5000;
/** A synchronous sleep between those tries (nothing ever notifies it). */
const OPEN_RETRY_SLEEPER = new Int32Array(new SharedArrayBuffer(4));

/** Environment variable that names the ledger file (tests, or a shared data directory). */
export const LEDGER_PATH_ENV = "PAPERCLIP_WASM_RATE_LEDGER";
/** Its earlier name (the package once served CreateOS only), still read when the new one is unset. */
export const LEDGER_PATH_ENV_ALIAS = "PAPERCLIP_CREATEOS_RATE_LEDGER";

/** How much longer than declared a window is counted: 1% of it, at least 25 ms. */
export function windowMargin(windowMs: number): number {
  return Math.max(25, Math.ceil(windowMs / 100));
}

/**
 * Where the ledger lives when nobody says: Paperclip gives a plugin worker
 * no data directory (its SDK context has none, and the worker manager passes
 * only `PATH`, `NODE_PATH`, `NODE_ENV`, `TZ` and `PAPERCLIP_PLUGIN_ID`), so
 * the file is in the system temporary directory, in a directory of this
 * user only (mode 0700): every worker of one Paperclip server runs as its
 * user and finds the same file; the origin is a column, so one file holds
 * every origin's budget. It only matters while requests run, so losing it
 * on reboot loses nothing. `PAPERCLIP_WASM_RATE_LEDGER` (or its alias
 * `PAPERCLIP_CREATEOS_RATE_LEDGER`) overrides it. Every packed provider
 * shares the file (one budget per origin, whichever plugin spends it).
 */
export function defaultLedgerPath(env: NodeJS.ProcessEnv = process.env): string {
  const configured = env[LEDGER_PATH_ENV] || env[LEDGER_PATH_ENV_ALIAS];
  if (configured) return configured;
  const { uid } = userInfo();
  return path.join(tmpdir(), `paperclip-wasm-provider-${uid}`, "rate-budget.sqlite");
}

/** Creates the ledger's directory (0700) and refuses one that another user owns or that is a symlink. */
function ensurePrivateDirectory(dir: string) {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const info = lstatSync(dir);
  const uid = process.getuid?.();
  if (!info.isDirectory() || (uid !== undefined && info.uid !== uid)) {
    throw new Error(`the request pacer's directory ${dir} is not a directory of this user; remove it or set ${LEDGER_PATH_ENV}`);
  }
}

/** Environment variable with the operator's limit instead of the declared one (`REQUESTS/WINDOW_MS[/PER_SECOND]`). */
export const RATE_LIMIT_ENV = "PAPERCLIP_WASM_RATE_LIMIT";
/** Its earlier name, still read when the new one is unset. */
export const RATE_LIMIT_ENV_ALIAS = "PAPERCLIP_CREATEOS_RATE_LIMIT";

/**
 * Parses `REQUESTS/WINDOW_MS` (for example `300/60000`) or
 * `REQUESTS/WINDOW_MS/PER_SECOND`, as the `sandbox` CLI's `--rate-limit`;
 * throws a readable error naming the setting otherwise.
 */
export function parseRateLimit(text: string, setting = RATE_LIMIT_ENV): WitRateLimit {
  const parts = text.split("/").map((part) => part.trim());
  const number = (part: string, what: string) => {
    if (!/^\d+$/.test(part) || Number(part) <= 0 || !Number.isSafeInteger(Number(part))) {
      throw new Error(`invalid ${setting} ${JSON.stringify(text)}: ${what} must be a positive whole number`);
    }
    return Number(part);
  };
  if (parts.length !== 2 && parts.length !== 3) {
    throw new Error(`invalid ${setting} ${JSON.stringify(text)}: expected REQUESTS/WINDOW_MS, for example 300/60000`);
  }
  return {
    requests: number(parts[0], "the request count"),
    windowMs: number(parts[1], "the window (ms)"),
    perSecond: parts.length === 3 ? number(parts[2], "the per-second cap") : undefined,
  };
}

/** A start the ledger allowed (its row), or how long to wait before asking again. */
export type StartDecision = { entry: number } | { waitMs: number };

/**
 * How long to wait before a start is allowed, given the starts still in the
 * counted window (ascending), the end of a 429 pause, the limit and the
 * counted window length; `undefined` when a start is allowed now.
 */
export function waitFor(recent: number[], pausedUntil: number, limit: WitRateLimit, countedWindowMs: number, now: number): number | undefined {
  let allowedAt = pausedUntil;
  const requests = Math.max(1, Math.floor(limit.requests));
  if (recent.length >= requests) {
    // The start that must leave the window before one more fits.
    allowedAt = Math.max(allowedAt, recent[recent.length - requests] + countedWindowMs);
  }
  if (limit.perSecond !== undefined) {
    const second = 1000 + Math.min(windowMargin(limit.windowMs), 25);
    const inSecond = recent.filter((at) => at > now - second);
    const cap = Math.max(1, Math.floor(limit.perSecond));
    if (inSecond.length >= cap) allowedAt = Math.max(allowedAt, inSecond[inSecond.length - cap] + second);
  }
  return allowedAt > now ? allowedAt - now : undefined;
}

/** One connection to the ledger file (one per thread: `DatabaseSync` is not shared across threads). */
export class RateLedger {
  readonly #db: DatabaseSync;
  readonly #dropOld: StatementSync;
  readonly #pausedUntil: StatementSync;
  readonly #recent: StatementSync;
  readonly #insert: StatementSync;
  readonly #settle: StatementSync;
  readonly #pause: StatementSync;

  private constructor(db: DatabaseSync) {
    this.#db = db;
    this.#dropOld = db.prepare("DELETE FROM request_starts WHERE origin = ? AND at_ms <= ?");
    this.#pausedUntil = db.prepare("SELECT until_ms FROM origin_pauses WHERE origin = ?");
    this.#recent = db.prepare("SELECT at_ms FROM request_starts WHERE origin = ? ORDER BY at_ms");
    this.#insert = db.prepare("INSERT INTO request_starts (origin, at_ms) VALUES (?, ?)");
    this.#settle = db.prepare("UPDATE request_starts SET at_ms = max(at_ms, ?) WHERE rowid = ?");
    this.#pause = db.prepare(
      "INSERT INTO origin_pauses (origin, until_ms) VALUES (?, ?) ON CONFLICT (origin) DO UPDATE SET until_ms = max(until_ms, excluded.until_ms)",
    );
  }

  /** Opens (creating if needed) the ledger at `file`. Throws a readable error when it cannot. */
  static open(file: string): RateLedger {
    // Two processes opening a new ledger at once race to switch it to WAL, and
    // SQLite answers that switch "database is locked" at once, without its busy
    // handler: such an open is tried again, for up to OPEN_RETRY_MS.
    const deadline = Date.now() + OPEN_RETRY_MS;
    for (;;) {
      let db: DatabaseSync | undefined;
      try {
        ensurePrivateDirectory(path.dirname(file));
        db = new DatabaseSync(file);
        // Wait for another process's transaction rather than fail (the pragma, not the
        // constructor option, so that it also holds on Node 22, which Paperclip runs on).
        // The ledger only matters while requests run: no fsync needed.
        db.exec("PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;");
        db.exec(`CREATE TABLE IF NOT EXISTS request_starts (origin TEXT NOT NULL, at_ms INTEGER NOT NULL);
                 CREATE INDEX IF NOT EXISTS request_starts_by_origin ON request_starts (origin, at_ms);
                 CREATE TABLE IF NOT EXISTS origin_pauses (origin TEXT PRIMARY KEY, until_ms INTEGER NOT NULL);`);
        return new RateLedger(db);
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        try {
          db?.close();
        } catch {
          // already closed or never opened
        }
        if (/locked|busy/i.test(message) && Date.now() < deadline) {
          Atomics.wait(OPEN_RETRY_SLEEPER, 0, 0, 20);
          continue;
        }
        throw new Error(`the request pacer's ledger ${file} cannot be opened (${message})`);
      }
    }
  }

  /** Records a start at `now` if `limit` allows it; otherwise says how long to wait. */
  tryStart(origin: string, limit: WitRateLimit, now: number): StartDecision {
    const counted = limit.windowMs + windowMargin(limit.windowMs);
    this.#db.exec("BEGIN IMMEDIATE");
    try {
      this.#dropOld.run(origin, now - counted);
      const paused = this.#pausedUntil.get(origin) as { until_ms: number } | undefined;
      const recent = (this.#recent.all(origin) as { at_ms: number }[]).map((row) => Number(row.at_ms));
      const wait = waitFor(recent, paused ? Number(paused.until_ms) : 0, limit, counted, now);
      if (wait !== undefined) {
        this.#db.exec("COMMIT");
        return { waitMs: wait };
      }
      const entry = Number(this.#insert.run(origin, now).lastInsertRowid);
      this.#db.exec("COMMIT");
      return { entry };
    } catch (error) {
      try {
        this.#db.exec("ROLLBACK");
      } catch {
        // No transaction was open (BEGIN itself failed).
      }
      throw error;
    }
  }

  /** The answer to start `entry` came at `at`: it counts from then. */
  settle(entry: number, at: number): void {
    this.#settle.run(at, entry);
  }

  /** A 429 from `origin`: no start there before `until`. */
  pause(origin: string, until: number): void {
    this.#pause.run(origin, until);
  }

  /** The starts (or answers) of `origin` still recorded, oldest first (tests, diagnostics). */
  recorded(origin: string): number[] {
    return (this.#recent.all(origin) as { at_ms: number }[]).map((row) => Number(row.at_ms));
  }

  /** The end of `origin`'s 429 pause (0: none recorded). */
  pausedUntil(origin: string): number {
    const paused = this.#pausedUntil.get(origin) as { until_ms: number } | undefined;
    return paused ? Number(paused.until_ms) : 0;
  }

  close(): void {
    this.#db.close();
  }
}
