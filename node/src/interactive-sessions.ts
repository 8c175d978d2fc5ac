/**
 * Paperclip's interactive sessions over `provider.interact` (contract
 * 0.6.0): the login terminal (`loginPty*` hooks, a terminal running one
 * command of a closed map) and the duplex channel (`duplexChannel*` hooks,
 * an argv with pipes). This module holds what a session is, how one is
 * found (by the host's route id, by the worker session id, bound to its
 * exact pair), and the requests each kind opens; `plugin.ts` wires them to
 * the hooks and the pool.
 */
import { randomUUID } from "node:crypto";
import { ProviderFailure } from "./mapping.js";
import type { RunningInteraction } from "./pool.js";
import type { WitExecuteResult, WitInteractionEvent, WitInteractionRequest, WitTerminalSize } from "./wit-types.js";

/** The two kinds of session Paperclip opens. */
export type SessionKind = "login-pty" | "duplex-channel";

/** Paperclip's closed set of login command keys (`PluginLoginCommandKey`). */
export type LoginCommandKey = "claude" | "codex" | "grok";

/**
 * The command each login key runs, fixed here (the open request carries no
 * command): a shell script with no parameter but the session home, which
 * reaches it only as the variable `LOGIN_HOME` (and the adapter's own home
 * variable), never inside the script's text.
 */
export const LOGIN_COMMANDS: Readonly<Record<LoginCommandKey, { homeVariable: string; script: string }>> = {
  claude: { homeVariable: "CLAUDE_CONFIG_DIR", script: 'umask 077 && mkdir -p "$LOGIN_HOME" && exec claude setup-token' },
  codex: {
    homeVariable: "CODEX_HOME",
    script: `umask 077 && mkdir -p "$LOGIN_HOME" && exec codex -c 'cli_auth_credentials_store="file"' login --device-auth`,
  },
  grok: { homeVariable: "GROK_HOME", script: 'umask 077 && mkdir -p "$LOGIN_HOME" && exec grok login --device-auth' },
};

/** The exact shape of a login session home: Paperclip's root, one slash, one lower-case UUID. */
export const SESSION_HOME_PATTERN = /^\/tmp\/paperclip-adapter-login\/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The login terminal's size (the one the public CreateOS plugin uses). */
export const LOGIN_TERMINAL: WitTerminalSize = { columns: 120, rows: 30 };

/** How long a login terminal may run: Paperclip's login attempts last 30 minutes. */
export const LOGIN_TIMEOUT_MS = 30 * 60 * 1000;

/** How long a duplex channel may run: as long as the longest budget (24 h); it ends with its lease. */
export const CHANNEL_TIMEOUT_MS = 24 * 60 * 60 * 1000;

/** The interaction request of a login terminal, or a typed refusal before anything is created. */
export function loginRequest(key: unknown, sessionHome: unknown): WitInteractionRequest {
  if (typeof key !== "string" || !Object.hasOwn(LOGIN_COMMANDS, key)) {
    throw new ProviderFailure(
      `The login command key ${JSON.stringify(key)} is not one of claude, codex or grok; no terminal was opened.`,
      "invalid-request",
      "none",
    );
  }
  if (typeof sessionHome !== "string" || !SESSION_HOME_PATTERN.test(sessionHome)) {
    throw new ProviderFailure(
      "The login session home is not of the form /tmp/paperclip-adapter-login/<uuid>; no terminal was opened.",
      "invalid-request",
      "none",
    );
  }
  const command = LOGIN_COMMANDS[key as LoginCommandKey];
  return {
    command: "/bin/sh",
    args: ["-c", command.script],
    cwd: undefined,
    env: [
      ["LOGIN_HOME", sessionHome],
      [command.homeVariable, sessionHome],
      ["TERM", "xterm-256color"],
    ],
    terminal: LOGIN_TERMINAL,
    timeoutMs: BigInt(LOGIN_TIMEOUT_MS),
    resultChars: 64 * 1024,
  };
}

/** The interaction request of a duplex channel (an argv, run verbatim with pipes), or a typed refusal. */
export function channelRequest(command: unknown): WitInteractionRequest {
  if (!Array.isArray(command) || command.length === 0 || command.some((part) => typeof part !== "string")) {
    throw new ProviderFailure("A duplex channel's command must be a non-empty array of strings (the program, then its arguments); no channel was opened.", "invalid-request", "none");
  }
  if (command[0] === "") {
    throw new ProviderFailure("A duplex channel's program is empty; no channel was opened.", "invalid-request", "none");
  }
  return {
    command: command[0],
    args: command.slice(1),
    cwd: undefined,
    env: [],
    terminal: undefined,
    timeoutMs: BigInt(CHANNEL_TIMEOUT_MS),
    // The channel's bytes go live to Paperclip; the result keeps only a little.
    resultChars: 64 * 1024,
  };
}

/** One open (or opening) session. */
export class Session {
  readonly workerSessionId = randomUUID();
  /** Set once the open reply went out: output waits for it, so the host knows the session id first. */
  bound = false;
  /** `close-input` was sent (pipes): later input is refused. */
  inputClosed = false;
  /** Its end was asked for (stop, close, release, shutdown). */
  ending = false;
  /** Its exit was reported to Paperclip (at most once). */
  exitReported = false;
  /** Settles once the process's end is known and its exit reported. */
  ended: Promise<void> = Promise.resolve();
  /** Its process has ended (its outcome is known). */
  done = false;
  /** Why the session failed (its end may be unproven), once it ended so; undefined for a proven end. */
  failure: unknown = undefined;
  /** Its end was written to `ctx.state` (poison when unproven, its record removed). */
  settled = false;
  #running: RunningInteraction<WitExecuteResult> | undefined;
  #markBound: () => void = () => {};
  readonly whenBound = new Promise<void>((resolve) => (this.#markBound = resolve));

  constructor(
    readonly kind: SessionKind,
    readonly hostRouteId: string,
    readonly providerLeaseId: string,
    readonly companyId: string,
    readonly environmentId: string,
    /** The terminal's size, or undefined for pipes. */
    readonly terminal: WitTerminalSize | undefined,
    /** Whether the provider can resize a terminal while it runs (`terminal-resize`). */
    readonly resizable: boolean,
  ) {}

  attach(running: RunningInteraction<WitExecuteResult>) {
    this.#running = running;
  }

  /** The open reply is on its way: output may flow. */
  bind() {
    this.bound = true;
    this.#markBound();
  }

  /** The open failed: nothing of the session goes to Paperclip (no reply named it). */
  abandon() {
    this.#markBound();
  }

  /** Stops the process at once with proof (the call's cancellation; works before it started too). */
  cancel() {
    this.ending = true;
    this.#running?.cancel();
  }

  /** Asks the process to end (terminated and proven gone, then its result). */
  async end(): Promise<void> {
    if (this.ending) return;
    this.ending = true;
    if (!this.#running || !(await this.#running.send({ tag: "end" }))) this.#running?.cancel();
  }

  /** Writes bytes to the process's terminal or stdin; a typed refusal when that cannot be. */
  async write(bytes: Uint8Array): Promise<void> {
    if (this.inputClosed) throw sessionFailure(this, "its input was closed; input after close is refused");
    await this.#send({ tag: "input", val: bytes });
  }

  /** Closes the process's stdin (pipes only: a terminal's end of input is the byte 0x04). */
  async closeInput(): Promise<void> {
    if (this.terminal) throw sessionFailure(this, "a terminal has no separate input to close (send the byte 0x04, ^D)");
    if (this.inputClosed) return;
    this.inputClosed = true;
    await this.#send({ tag: "close-input" });
  }

  /** A new window size (a terminal of a provider with `terminal-resize` only). */
  async resize(size: WitTerminalSize): Promise<void> {
    if (!this.terminal) throw sessionFailure(this, "it runs with pipes, which have no window size to change");
    if (!this.resizable) throw sessionFailure(this, "this provider keeps a terminal at the size it was opened with (no terminal-resize)");
    if (!Number.isInteger(size?.columns) || !Number.isInteger(size?.rows) || size.columns < 1 || size.rows < 1 || size.columns > 65535 || size.rows > 65535) {
      throw sessionFailure(this, "a window size needs whole columns and rows from 1 to 65535");
    }
    await this.#send({ tag: "resize", val: { columns: size.columns, rows: size.rows } });
  }

  /** A signal for the process's whole tree. */
  async signal(signal: Extract<WitInteractionEvent, { tag: "signal" }>["val"]): Promise<void> {
    await this.#send({ tag: "signal", val: signal });
  }

  async #send(event: WitInteractionEvent): Promise<void> {
    if (this.ending) throw sessionFailure(this, "it is ending; nothing more is sent to it");
    if (!this.#running || !(await this.#running.send(event))) throw sessionFailure(this, "it has ended; nothing more reaches it");
  }
}

function sessionName(session: Session): string {
  return session.kind === "login-pty" ? "login terminal" : "duplex channel";
}

function sessionFailure(session: Session, why: string): ProviderFailure {
  return new ProviderFailure(`The ${sessionName(session)} ${session.workerSessionId} refused this: ${why}.`, "invalid-request", "none");
}

/** How many closed session ids are remembered, to tell "closed" from "never opened". */
const REMEMBERED_CLOSED = 1024;

/** The open sessions of this worker, by route and by worker session id. */
export class SessionRegistry {
  readonly #byRoute = new Map<string, Session>();
  readonly #byId = new Map<string, Session>();
  readonly #closed = new Map<string, SessionKind>();
  /** Closed sessions by route: a later close of the same route is acknowledged with the same pair. */
  readonly #closedRoutes = new Map<string, Session>();
  /** Closed sessions by session id: their outcome, for the records a later call reconciles. */
  readonly #closedSessions = new Map<string, Session>();

  get size(): number {
    return this.#byRoute.size;
  }

  all(): Session[] {
    return [...this.#byRoute.values()];
  }

  onLease(providerLeaseId: string): Session[] {
    return this.all().filter((session) => session.providerLeaseId === providerLeaseId);
  }

  /** Registers a new session; a route already in use is refused. */
  add(session: Session) {
    if (typeof session.hostRouteId !== "string" || session.hostRouteId === "") {
      throw new ProviderFailure("The open request has no host route id; nothing was opened.", "invalid-request", "none");
    }
    if (this.#byRoute.has(session.hostRouteId)) {
      throw new ProviderFailure(`The host route ${session.hostRouteId} already has an open session; nothing was opened.`, "invalid-request", "none");
    }
    this.#byRoute.set(session.hostRouteId, session);
    this.#byId.set(session.workerSessionId, session);
  }

  remove(session: Session) {
    if (this.#byRoute.get(session.hostRouteId) === session) this.#byRoute.delete(session.hostRouteId);
    this.#byId.delete(session.workerSessionId);
    this.#closed.set(session.workerSessionId, session.kind);
    this.#closedRoutes.set(session.hostRouteId, session);
    this.#closedSessions.set(session.workerSessionId, session);
    while (this.#closedSessions.size > REMEMBERED_CLOSED) this.#closedSessions.delete(this.#closedSessions.keys().next().value!);
    while (this.#closed.size > REMEMBERED_CLOSED) this.#closed.delete(this.#closed.keys().next().value!);
    while (this.#closedRoutes.size > REMEMBERED_CLOSED) this.#closedRoutes.delete(this.#closedRoutes.keys().next().value!);
  }

  byRoute(hostRouteId: unknown): Session | undefined {
    return typeof hostRouteId === "string" ? this.#byRoute.get(hostRouteId) : undefined;
  }

  /** A session of this worker by its id, open or closed (remembered for a while). */
  known(workerSessionId: string): Session | undefined {
    return this.#byId.get(workerSessionId) ?? this.#closedSessions.get(workerSessionId);
  }

  /** The session a route had, once it was closed (or forgotten with its lease). */
  closedByRoute(hostRouteId: unknown): Session | undefined {
    return typeof hostRouteId === "string" ? this.#closedRoutes.get(hostRouteId) : undefined;
  }

  /**
   * The session of `workerSessionId`, of `kind`, and (when given) bound to
   * exactly `hostRouteId`; a typed refusal otherwise, which says whether
   * the session was closed, never opened here, or belongs to another route.
   */
  find(kind: SessionKind, workerSessionId: unknown, hostRouteId?: unknown): Session {
    const name = kind === "login-pty" ? "login terminal" : "duplex channel";
    const session = typeof workerSessionId === "string" ? this.#byId.get(workerSessionId) : undefined;
    if (!session || session.kind !== kind) {
      const closed = typeof workerSessionId === "string" && this.#closed.get(workerSessionId) === kind;
      throw new ProviderFailure(
        closed
          ? `The ${name} ${workerSessionId} is closed; nothing more reaches it.`
          : `No ${name} ${JSON.stringify(workerSessionId)} is open in this worker (never opened, or opened before the worker restarted, which ended it).`,
        "invalid-request",
        "none",
      );
    }
    if (hostRouteId !== undefined && session.hostRouteId !== hostRouteId) {
      throw new ProviderFailure(
        `The ${name} ${session.workerSessionId} belongs to another route; this request is refused and nothing was written.`,
        "invalid-request",
        "none",
      );
    }
    return session;
  }
}
