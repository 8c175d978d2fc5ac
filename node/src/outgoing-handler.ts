/**
 * The host's `wasi:http/outgoing-handler` for the provider component.
 *
 * It wraps preview2-shim's handler and enforces, per call:
 * - exactly one allowed origin (the `api-origin` that `validate-config`
 *   returned for the call's config); every other request is answered with
 *   the `HTTP-request-denied` error code and never leaves the process;
 * - the secret header (the API key) added only to requests for that origin,
 *   replacing any header of the same name the component set; the key is never
 *   visible to the component (its `fields.entries()` never show it);
 * - the provider's declared rate limit, spent through the shared
 *   {@link Pacer} (one budget per origin per machine): a request starts only
 *   when the budget allows (process and sandbox `DELETE`, which clean up, go
 *   ahead of waiting work), and not after the call's deadline
 *   (`connection-timeout` then, as the Rust host answers); a declared
 *   limit is not spent on an origin whose latest answer said it came from
 *   our embedded engine (the engine's own budget, or none, instead; see
 *   {@link Pacer.noteAnswer});
 * - 429 is information: it pauses the origin's budget for its `Retry-After`
 *   (whole seconds; else one window; at most 5 minutes), and the same
 *   request is sent again after the pause, at most
 *   {@link MAX_THROTTLED_REPEATS} times and never past the call's deadline
 *   (the contract's `rate-limit`: a 429 means the API did not carry the
 *   request out, so a create it answered did not happen); the request is
 *   sent again with the body this host kept (below). When the repeats are
 *   spent or the deadline would pass, the 429 reaches the component, which
 *   fails the operation as before.
 *
 * The shim locks a request's headers when the request is built, so the key
 * cannot be added by mutation. Instead, the component's `fields` resource is
 * a subclass of the shim's whose `entries()` includes the key only while this
 * handler is inside the shim's synchronous `handle` for that one request.
 * Likewise the component's request bodies are kept in this host
 * (`request-body.ts`); a request is sent when `outgoing-body.finish`
 * completes its body, head and whole body together.
 */
import { clocks, http, io } from "@bytecodealliance/preview2-shim";
import type { Grant, Pacer, Priority } from "./pacer.js";
import { keptBody, type BodyCopy } from "./request-body.js";
import type { WitRateLimit } from "./wit-types.js";

/** How many times a request answered 429 is sent again (each after the pause the answer asked for). */
export const MAX_THROTTLED_REPEATS = 3;
/** The longest pause a 429's `Retry-After` can impose. */
export const MAX_THROTTLE_PAUSE_MS = 300_000;

/** What the handler allows and injects during one provider call. */
export interface OutgoingPolicy {
  /** The only origin requests may go to (`scheme://host[:port]`), if any. */
  allowedOrigin: string | undefined;
  /** The secret headers for that origin (none when no secret was resolved). */
  secrets: readonly { header: string; value: string }[];
  /** The request budget per origin (none: no limit). */
  rateLimit: WitRateLimit | undefined;
  /**
   * `rateLimit` is the provider's declaration, not the operator's: an
   * origin that answers as our engine does not spend it.
   */
  rateLimitDeclared?: boolean;
  /** Epoch milliseconds: no request starts, and none is repeated, after this (the call's deadline). */
  deadlineMs?: number;
  /** Whether the call was cancelled (a waiting work request then gives up). */
  cancelled?: () => boolean;
  /**
   * The longest 429 pause after which a request is repeated: the provider's
   * budget for one request (`request-ms`). A longer pause sends the 429 to
   * the component at once (none: only the call's deadline bounds it).
   */
  maxThrottleWaitMs?: number;
}

type ShimFields = InstanceType<typeof http.types.Fields>;
const BaseFields = http.types.Fields as unknown as new () => ShimFields & {
  entries(): [string, Uint8Array][];
};

/** Fields created by the component through this host (brand, not `instanceof`). */
const hostFields = new WeakSet<object>();
/** The fields whose `entries()` carry the secrets right now, and their headers. */
let injecting: { fields: object; headers: [string, Uint8Array][] } | undefined;

/**
 * The `fields` class the component sees. `instanceof` accepts every shim
 * `fields` (responses carry the shim's own), so jco's resource checks pass.
 */
export class HostFields extends BaseFields {
  constructor() {
    super();
    hostFields.add(this);
  }

  static [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === "object" && value !== null && Object.prototype.isPrototypeOf.call(BaseFields.prototype, value);
  }

  override entries(): [string, Uint8Array][] {
    const entries = super.entries();
    if (injecting?.fields !== this) return entries;
    const names = new Set(injecting.headers.map(([header]) => header.toLowerCase()));
    return [...entries.filter(([key]) => !names.has(key.toLowerCase())), ...injecting.headers];
  }
}

/** The origin a request targets, normalised like `URL.origin`. */
export function requestOrigin(scheme: { tag: string; val?: string } | undefined, authority: string | undefined): string | undefined {
  if (!scheme || !authority) return undefined;
  const name = scheme.tag === "HTTP" ? "http" : scheme.tag === "HTTPS" ? "https" : undefined;
  if (!name) return undefined;
  try {
    return new URL(`${name}://${authority}`).origin;
  } catch {
    return undefined;
  }
}

/**
 * The origins a config's `validate-config` answer allows, normalised like
 * {@link requestOrigin}. The one place that reads the answer's origin: the
 * provider thread (which origin the handler allows) and the plugin (where a
 * left-behind sandbox lives) both ask here.
 */
export function allowedOrigins(validation: { apiOrigins?: string[] }): string[] {
  return (validation.apiOrigins ?? []).flatMap((origin) => normaliseOrigin(origin) ?? []);
}

/** Normalises an allowed origin the same way as {@link requestOrigin}. */
export function normaliseOrigin(origin: string): string | undefined {
  try {
    const url = new URL(origin);
    return url.protocol === "http:" || url.protocol === "https:" ? url.origin : undefined;
  } catch {
    return undefined;
  }
}


/** Every case of `wasi:http/types.error-code` (the tags jco lowers). */
const ERROR_CODE_TAGS = new Set([
  "DNS-timeout", "DNS-error", "destination-not-found", "destination-unavailable", "destination-IP-prohibited",
  "destination-IP-unroutable", "connection-refused", "connection-terminated", "connection-timeout",
  "connection-read-timeout", "connection-write-timeout", "connection-limit-reached", "TLS-protocol-error",
  "TLS-certificate-error", "TLS-alert-received", "HTTP-request-denied", "HTTP-request-length-required",
  "HTTP-request-body-size", "HTTP-request-method-invalid", "HTTP-request-URI-invalid", "HTTP-request-URI-too-long",
  "HTTP-request-header-section-size", "HTTP-request-header-size", "HTTP-request-trailer-section-size",
  "HTTP-request-trailer-size", "HTTP-response-incomplete", "HTTP-response-header-section-size",
  "HTTP-response-header-size", "HTTP-response-body-size", "HTTP-response-trailer-section-size",
  "HTTP-response-trailer-size", "HTTP-response-transfer-coding", "HTTP-response-content-coding",
  "HTTP-response-timeout", "HTTP-upgrade-failed", "HTTP-protocol-error", "loop-detected", "configuration-error",
  "internal-error",
]);

/** A `wasi:http` error code as jco lowers it. */
export type WasiErrorCode = { tag: string; val?: unknown };

/** Whether `value` is an `error-code` jco can hand to the component. */
export function isErrorCode(value: unknown): value is WasiErrorCode {
  return typeof value === "object" && value !== null && ERROR_CODE_TAGS.has((value as { tag?: unknown }).tag as string);
}

/**
 * The `error-code` of a failed request or response body stream, from the
 * Node error preview2-shim keeps as the stream error's payload (its
 * `code` and `message`). A body that broke off after the request went out
 * is a transport failure the component knows how to handle (reconnect,
 * or clean up), exactly as under wasmtime, never a value jco cannot lower.
 */
export function streamFailureCode(failure: unknown): WasiErrorCode {
  if (isErrorCode(failure)) return failure;
  const { code } = (typeof failure === "object" && failure !== null ? failure : {}) as { code?: unknown };
  switch (code) {
    case "ECONNRESET":
    case "EPIPE":
    case "ECONNABORTED":
    case "ERR_STREAM_PREMATURE_CLOSE":
      return { tag: "connection-terminated" };
    case "ETIMEDOUT":
    case "UND_ERR_BODY_TIMEOUT":
      return { tag: "connection-read-timeout" };
    case "HPE_INVALID_CHUNK_SIZE":
    case "HPE_INVALID_CONSTANT":
    case "HPE_UNEXPECTED_CONTENT_LENGTH":
      return { tag: "HTTP-protocol-error" };
    default:
      // "aborted" (the server closed the connection mid-body) and anything else: the answer is incomplete.
      return { tag: "HTTP-response-incomplete" };
  }
}

/**
 * `wasi:http/types.http-error-code`: the shim answers a body stream's
 * error with the Node `Error` it caught (not an `error-code`), which jco
 * cannot lower (`invalid variant tag value 'undefined' (received 'Error:
 * aborted')`: a trap that poisoned the lease). This answers a real
 * `error-code` for every stream failure.
 */
export function httpErrorCode(error: unknown): WasiErrorCode | undefined {
  let code: unknown;
  try {
    code = http.types.httpErrorCode(error as never);
  } catch {
    code = undefined;
  }
  if (code === undefined || code === null) return undefined;
  if (isErrorCode(code)) return code;
  return streamFailureCode(code);
}

type ShimOutgoingRequest = InstanceType<typeof http.types.OutgoingRequest>;
type ShimIncomingResponse = (typeof http.types.IncomingResponse)["prototype"];
type ShimFuture = (typeof http.types.FutureIncomingResponse)["prototype"];
type FutureValue = ReturnType<ShimFuture["get"]>;

/** The method name of a request (`GET`, `DELETE`, ...). */
function methodOf(request: ShimOutgoingRequest): string {
  const method = request.method() as { tag: string; val?: string };
  return (method.tag === "other" ? (method.val ?? "") : method.tag).toUpperCase();
}

/** A response's `Retry-After` text, if it has one. */
function retryAfterHeader(response: ShimIncomingResponse): string | undefined {
  return headerText(response, "retry-after");
}

/** The first value of a response header, as text. */
function headerText(response: ShimIncomingResponse, name: string): string | undefined {
  const values = response.headers().get(name) as Uint8Array[];
  return values.length === 0 ? undefined : new TextDecoder().decode(values[0]);
}

/** A `Retry-After` given in seconds (an HTTP date is not trusted: clocks differ). */
export function retryAfterMs(response: ShimIncomingResponse): number | undefined {
  const text = retryAfterHeader(response);
  return text === undefined ? undefined : retryAfterTextMs(text);
}

/**
 * A `Retry-After` value in milliseconds: only delta-seconds (digits, no
 * sign); a value too large for any clock still counts (the pause is capped
 * anyway); a date or anything else is no answer.
 */
export function retryAfterTextMs(text: string): number | undefined {
  const trimmed = text.trim();
  if (!/^\d+$/.test(trimmed)) return undefined;
  return Number(trimmed) * 1000;
}

/**
 * How long a 429 pauses its origin: its `Retry-After` (seconds), else one
 * window, at most {@link MAX_THROTTLE_PAUSE_MS}. The Rust host's
 * `throttle_pause`; the shared decision table holds both.
 */
export function throttlePauseMs(retryAfter: string | undefined, windowMs: number): number {
  const asked = retryAfter === undefined ? undefined : retryAfterTextMs(retryAfter);
  return Math.min(asked ?? windowMs, MAX_THROTTLE_PAUSE_MS);
}

function responseOf(value: FutureValue): ShimIncomingResponse | undefined {
  const outer = value as { tag: string; val: { tag: string; val: ShimIncomingResponse } } | undefined;
  return outer?.tag === "ok" && outer.val.tag === "ok" ? outer.val.val : undefined;
}

/** Waits for `future`'s answer until `deadline` (epoch ms); whether it came. */
function answeredBy(future: ShimFuture, deadline: number): boolean {
  const answer = future.subscribe();
  if (!Number.isFinite(deadline)) {
    answer.block();
    return true;
  }
  const remaining = BigInt(Math.max(0, Math.ceil(deadline - Date.now()))) * 1_000_000n;
  const ready = io.poll.poll([answer, clocks.monotonicClock.subscribeDuration(remaining)]) as ArrayLike<number>;
  return Array.from(ready).includes(0);
}

/** The per-phase timeouts of a request's options, read before the shim consumes them. */
interface Timeouts {
  connect: bigint | undefined;
  firstByte: bigint | undefined;
  betweenBytes: bigint | undefined;
}

function timeoutsOf(options: any): Timeouts {
  return { connect: options?.connectTimeout(), firstByte: options?.firstByteTimeout(), betweenBytes: options?.betweenBytesTimeout() };
}

/** Request options the shim reads, from kept timeouts (the component's own options resource may be gone by then). */
function optionsOf(timeouts: Timeouts) {
  return { connectTimeout: () => timeouts.connect, firstByteTimeout: () => timeouts.firstByte, betweenBytesTimeout: () => timeouts.betweenBytes };
}

const ShimFutureClass = http.types.FutureIncomingResponse as unknown as { prototype: object };

/**
 * Whether a request answered 429 is sent again: while repeats are left,
 * the pause ends before the call's deadline, and the pause fits in one
 * request's budget (`maxThrottleWaitMs`). Otherwise the 429 reaches the
 * component at once (a definite rejection: the API did not carry the
 * request out). The same rule as the Rust host's `Guard`
 * (`sandbox-host/src/network/policy.rs`); the shared scenarios hold both.
 */
export function throttleRepeatAllowed(repeats: number, pauseMs: number, nowMs: number, deadlineMs: number, maxThrottleWaitMs: number | undefined): boolean {
  if (repeats >= MAX_THROTTLED_REPEATS) return false;
  if (nowMs + pauseMs >= deadlineMs) return false;
  return maxThrottleWaitMs === undefined || pauseMs <= maxThrottleWaitMs;
}

/** The grant of a request under no limit. */
const NO_LIMIT: Grant = { settle() {} };

/**
 * Builds the handler; `policy(target)` gives the rules of the call in
 * progress for a request to `target` (its origin; `allowedOrigin` is unset
 * when the call may not reach it, `secrets` are that origin's headers).
 */
export function createOutgoingHandler(policy: (target: string | undefined) => OutgoingPolicy, pacer: Pacer) {
  const encoder = new TextEncoder();

  /** Sends `request` through the shim, with the key injected when there is one. */
  function send(request: ShimOutgoingRequest, options: unknown, secrets: OutgoingPolicy["secrets"]): ShimFuture {
    if (secrets.length === 0) return http.outgoingHandler.handle(request as never, options as never) as ShimFuture;
    injecting = { fields: request.headers(), headers: secrets.map(({ header, value }) => [header, encoder.encode(value)]) };
    try {
      return http.outgoingHandler.handle(request as never, options as never) as ShimFuture;
    } finally {
      injecting = undefined;
    }
  }

  /** Waits for the budget; `connection-timeout` when the call's deadline or cancellation comes first. */
  function admit(origin: string, limit: WitRateLimit | undefined, current: OutgoingPolicy, priority: Priority): Grant | undefined {
    let grant: Grant | undefined;
    try {
      grant = pacer.acquire(origin, limit, priority, {
        deadlineMs: current.deadlineMs ?? Number.POSITIVE_INFINITY,
        cancelled: current.cancelled,
      });
    } catch (error) {
      // The host could not read its own budget: it refuses to send rather than risk the provider's limit.
      throw { tag: "internal-error", val: error instanceof Error ? error.message : String(error) };
    }
    return grant;
  }

  /**
   * Sends a request with the component's method, target and headers and
   * the whole kept body. A body that fits the shim's stream buffer is
   * written before the head leaves, so both go out together; a larger one
   * is written as the server reads it, and writing stops when the answer
   * comes first (a 429 before the body was read) or the call's deadline
   * passes: the answer, not the write, decides.
   */
  function sendWhole(original: ShimOutgoingRequest, copy: BodyCopy, timeouts: Timeouts, secrets: OutgoingPolicy["secrets"], deadline: number): ShimFuture {
    const headers = new HostFields();
    for (const [name, value] of original.headers().entries()) headers.append(name, value);
    const request = new http.types.OutgoingRequest(headers as never);
    request.setMethod(original.method());
    request.setScheme(original.scheme());
    request.setAuthority(original.authority());
    request.setPathWithQuery(original.pathWithQuery());
    const body = request.body();
    const stream = body.write();
    const pieces: Uint8Array[] = [];
    for (const chunk of copy.chunks) for (let at = 0; at < chunk.byteLength; at += 4096) pieces.push(chunk.subarray(at, at + 4096));
    if (copy.bytes <= Number(stream.checkWrite())) {
      for (const piece of pieces) stream.write(piece);
      http.types.OutgoingBody.finish(body, undefined);
      return send(request, optionsOf(timeouts), secrets);
    }
    const future = send(request, optionsOf(timeouts), secrets);
    const timer = Number.isFinite(deadline)
      ? clocks.monotonicClock.subscribeDuration(BigInt(Math.max(0, Math.ceil(deadline - Date.now()))) * 1_000_000n)
      : undefined;
    try {
      let next = 0;
      while (next < pieces.length) {
        let room: number;
        try {
          room = Number(stream.checkWrite());
        } catch {
          return future; // the request broke off: its answer (or error) tells what happened
        }
        if (room > 0) {
          const piece = pieces[next];
          if (piece.byteLength <= room) {
            stream.write(piece);
            next += 1;
          } else {
            stream.write(piece.subarray(0, room));
            pieces[next] = piece.subarray(room);
          }
          continue;
        }
        const space = stream.subscribe();
        const answer = future.subscribe();
        const ready = Array.from(io.poll.poll(timer ? [space, answer, timer] : [space, answer]) as ArrayLike<number>);
        for (const pollable of [space, answer]) (pollable as unknown as Record<symbol, () => void>)[Symbol.dispose]?.();
        if (!ready.includes(0)) return future; // answered before the body was read, or out of time
      }
      http.types.OutgoingBody.finish(body, undefined);
    } catch {
      // A write the server no longer reads: its answer decides.
    } finally {
      (timer as unknown as Record<symbol, () => void> | undefined)?.[Symbol.dispose]?.();
    }
    return future;
  }

  return {
    handle(request: ShimOutgoingRequest, options: unknown) {
      const target = requestOrigin(request.scheme(), request.authority());
      const current = policy(target);
      const allowed = current.allowedOrigin ? normaliseOrigin(current.allowedOrigin) : undefined;
      if (!target || !allowed || target !== allowed) {
        // The typed WASI error; the request never leaves this process.
        throw { tag: "HTTP-request-denied" };
      }
      const headers = request.headers();
      if (current.secrets.length > 0 && !hostFields.has(headers)) {
        // A request whose headers did not come from this host cannot carry the key.
        throw { tag: "internal-error", val: "request headers were not created through the host" };
      }
      const copy = keptBody(request);
      const limit = current.rateLimitDeclared ? pacer.budgetFor(target, current.rateLimit) : current.rateLimit;
      if (!copy) {
        // A request whose body did not go through this host: the shim sends it as it is.
        const grant = limit ? admit(target, limit, current, "work") : NO_LIMIT;
        if (!grant) throw { tag: "connection-timeout" };
        const future = send(request, options, current.secrets);
        grant.settle();
        return noting(future, target);
      }
      const priority: Priority = methodOf(request) === "DELETE" ? "cleanup" : "work";
      const grant = limit ? admit(target, limit, current, priority) : NO_LIMIT;
      if (!grant) throw { tag: "connection-timeout" };
      const timeouts = timeoutsOf(options);
      const deadline = current.deadlineMs ?? Number.POSITIVE_INFINITY;
      let real: ShimFuture | undefined;
      const start = () => {
        real ??= sendWhole(request, copy, timeouts, current.secrets, deadline);
      };
      // The request leaves when the component finishes its body.
      if (copy.finished) start();
      else copy.onFinish = start;
      let answered = false;
      const future = Object.create(ShimFutureClass.prototype) as ShimFuture & Record<symbol, () => void>;
      Object.assign(future, {
        // Before the body is finished there is nothing to wait for yet.
        subscribe: () => (real ? real.subscribe() : clocks.monotonicClock.subscribeDuration(0n)),
        get: (): FutureValue => {
          if (!real) return undefined;
          const value = real.get();
          if (value === undefined || answered) return value;
          answered = true;
          // The API counted the request when it arrived, before this.
          grant.settle();
          noteAnswer(target, value);
          return limit ? afterThrottling(request, copy, value, target, limit, priority, current, timeouts) : value;
        },
      });
      future[Symbol.dispose] = () => {
        grant.settle();
        (real as (ShimFuture & Record<symbol, () => void>) | undefined)?.[Symbol.dispose]();
      };
      return future;
    },
  };

  /** Tells the pacer who answered `origin` (our engine says so in a header). */
  function noteAnswer(origin: string, value: FutureValue) {
    const response = responseOf(value);
    if (response) pacer.noteAnswer(origin, (name) => headerText(response, name));
  }

  /** `real`, with its answer noted once it came (`noteAnswer`). */
  function noting(real: ShimFuture, origin: string): ShimFuture {
    let answered = false;
    const future = Object.create(ShimFutureClass.prototype) as ShimFuture & Record<symbol, () => void>;
    Object.assign(future, {
      subscribe: () => real.subscribe(),
      get: (): FutureValue => {
        const value = real.get();
        if (value !== undefined && !answered) {
          answered = true;
          noteAnswer(origin, value);
        }
        return value;
      },
    });
    future[Symbol.dispose] = () => (real as ShimFuture & Record<symbol, () => void>)[Symbol.dispose]();
    return future;
  }

  /**
   * Answers a 429 as information: pauses the origin, then sends the request
   * again while it may be repeated, fits the deadline and the repeats last.
   * Returns the answer the component gets.
   */
  function afterThrottling(
    request: ShimOutgoingRequest,
    copy: BodyCopy,
    first: FutureValue,
    origin: string,
    limit: WitRateLimit,
    priority: Priority,
    current: OutgoingPolicy,
    timeouts: Timeouts,
  ): FutureValue {
    let value = first;
    for (let repeats = 0; ; repeats++) {
      const response = responseOf(value);
      if (!response || response.status() !== 429) return value;
      const pause = throttlePauseMs(retryAfterHeader(response), limit.windowMs);
      try {
        pacer.throttled(origin, pause);
      } catch {
        // Without a working budget the 429 goes to the provider.
        return value;
      }
      const deadline = current.deadlineMs ?? Number.POSITIVE_INFINITY;
      if (!throttleRepeatAllowed(repeats, pause, Date.now(), deadline, current.maxThrottleWaitMs)) return value;
      let grant: Grant | undefined;
      try {
        grant = admit(origin, limit, current, priority);
      } catch {
        return value;
      }
      if (!grant) return value;
      let next: FutureValue;
      try {
        const future = sendWhole(request, copy, timeouts, current.secrets, deadline);
        if (!answeredBy(future, deadline)) {
          // No answer by the call's deadline: the component gets the 429 it would have had.
          (future as unknown as Record<symbol, () => void>)[Symbol.dispose]();
          return value;
        }
        next = future.get();
      } catch {
        return value;
      } finally {
        grant.settle();
      }
      (response as unknown as { [Symbol.dispose](): void })[Symbol.dispose]();
      value = next;
    }
  }
}
