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
 *   (`connection-timeout` then, as the Rust host answers);
 * - 429 is information: it pauses the origin's budget for its `Retry-After`
 *   (whole seconds; else one window; at most 5 minutes), and the same
 *   request is sent again after the pause, at most
 *   {@link MAX_THROTTLED_REPEATS} times and never past the call's deadline
 *   (the contract's `rate-limit`: a 429 means the API did not carry the
 *   request out, so a create it answered did not happen). Only a request
 *   whose whole body this host holds can be repeated (bodies are kept up to
 *   {@link MAX_REPEATABLE_BODY} bytes); any other 429 reaches the component
 *   as before, which fails the operation.
 *
 * The shim locks a request's headers when the request is built, so the key
 * cannot be added by mutation. Instead, the component's `fields` resource is
 * a subclass of the shim's whose `entries()` includes the key only while this
 * handler is inside the shim's synchronous `handle` for that one request.
 * Likewise the component's `outgoing-request` is a subclass that keeps a
 * copy of the body it writes, and `outgoing-body.finish` marks it complete.
 */
import { clocks, http, io } from "@bytecodealliance/preview2-shim";
import type { Grant, Pacer, Priority } from "./pacer.js";
import type { WitRateLimit } from "./wit-types.js";

/** How many times a request answered 429 is sent again (each after the pause the answer asked for). */
export const MAX_THROTTLED_REPEATS = 3;
/** The longest pause a 429's `Retry-After` can impose. */
export const MAX_THROTTLE_PAUSE_MS = 300_000;
/** The largest request body kept so that a throttled request can be repeated. */
export const MAX_REPEATABLE_BODY = 8 * 1024 * 1024;

/** What the handler allows and injects during one provider call. */
export interface OutgoingPolicy {
  /** The only origin requests may go to (`scheme://host[:port]`), if any. */
  allowedOrigin: string | undefined;
  /** The secret header for that origin, if a secret was resolved. */
  secret: { header: string; value: string } | undefined;
  /** The request budget per origin (none: no limit). */
  rateLimit: WitRateLimit | undefined;
  /** Epoch milliseconds: no request starts, and none is repeated, after this (the call's deadline). */
  deadlineMs?: number;
  /** Whether the call was cancelled (a waiting work request then gives up). */
  cancelled?: () => boolean;
}

type ShimFields = InstanceType<typeof http.types.Fields>;
const BaseFields = http.types.Fields as unknown as new () => ShimFields & {
  entries(): [string, Uint8Array][];
};

/** Fields created by the component through this host (brand, not `instanceof`). */
const hostFields = new WeakSet<object>();
/** The fields whose `entries()` carry the secret right now, and the header. */
let injecting: { fields: object; header: string; value: Uint8Array } | undefined;

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
    const name = injecting.header.toLowerCase();
    return [...entries.filter(([key]) => key.toLowerCase() !== name), [injecting.header, injecting.value]];
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
export function allowedOrigins(validation: { apiOrigin?: string }): string[] {
  const origin = validation.apiOrigin ? normaliseOrigin(validation.apiOrigin) : undefined;
  return origin ? [origin] : [];
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


type ShimOutgoingRequest = InstanceType<typeof http.types.OutgoingRequest>;
type ShimOutgoingBody = (typeof http.types.OutgoingBody)["prototype"];
type ShimIncomingResponse = (typeof http.types.IncomingResponse)["prototype"];
type ShimFuture = (typeof http.types.FutureIncomingResponse)["prototype"];
type FutureValue = ReturnType<ShimFuture["get"]>;

/** The body a request wrote so far, kept so that a throttled request can be sent again. */
interface BodyCopy {
  chunks: Uint8Array[];
  bytes: number;
  /** More than {@link MAX_REPEATABLE_BODY}, or written in a way not kept: cannot be repeated. */
  lost: boolean;
  /** `outgoing-body.finish` was called: the copy is the whole body. */
  finished: boolean;
  /**
   * A send held back until the body is complete (see the handler): run
   * when the body is finished, or when its buffer is full before that.
   */
  release?: () => void;
}

const bodyOfRequest = new WeakMap<object, BodyCopy>();
const bodyOfOutgoingBody = new WeakMap<object, BodyCopy>();

function keep(copy: BodyCopy, bytes: Uint8Array) {
  if (copy.lost) return;
  if (copy.bytes + bytes.byteLength > MAX_REPEATABLE_BODY) {
    copy.lost = true;
    copy.chunks = [];
    return;
  }
  copy.chunks.push(bytes.slice());
  copy.bytes += bytes.byteLength;
}

/**
 * The `outgoing-request` class the component constructs. Its body's output
 * stream keeps a copy of what the component writes (instance methods: the
 * shim's classes are unchanged, jco calls methods on the instance).
 */
export class HostOutgoingRequest extends (http.types.OutgoingRequest as unknown as new (headers: ShimFields) => ShimOutgoingRequest) {
  override body(): ShimOutgoingBody {
    const body = super.body();
    const copy: BodyCopy = { chunks: [], bytes: 0, lost: false, finished: false };
    bodyOfRequest.set(this, copy);
    bodyOfOutgoingBody.set(body, copy);
    const openStream = body.write.bind(body);
    (body as { write: () => unknown }).write = () => {
      const stream = openStream() as unknown as Record<string, (...args: any[]) => unknown>;
      for (const name of ["write", "blockingWriteAndFlush"]) {
        const original = stream[name].bind(stream);
        stream[name] = (bytes: Uint8Array) => {
          const result = original(bytes);
          keep(copy, bytes);
          // A held-back send goes out before the component would wait for buffer space.
          if (copy.release && (stream.checkWrite() as bigint) === 0n) copy.release();
          return result;
        };
      }
      for (const name of ["writeZeroes", "blockingWriteZeroesAndFlush", "splice", "blockingSplice"]) {
        const original = stream[name].bind(stream);
        stream[name] = (...args: unknown[]) => {
          copy.lost = true;
          return original(...args);
        };
      }
      return stream;
    };
    return body;
  }
}

const ShimOutgoingBodyClass = http.types.OutgoingBody as unknown as {
  prototype: object;
  finish(body: ShimOutgoingBody, trailers: unknown): void;
};

/** The `outgoing-body` class: `finish` marks the kept copy complete. Accepts every shim body. */
export class HostOutgoingBody extends (http.types.OutgoingBody as unknown as new () => ShimOutgoingBody) {
  static [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === "object" && value !== null && Object.prototype.isPrototypeOf.call(ShimOutgoingBodyClass.prototype, value);
  }

  static finish(body: ShimOutgoingBody, trailers: unknown): void {
    ShimOutgoingBodyClass.finish(body, trailers);
    const copy = bodyOfOutgoingBody.get(body);
    if (!copy) return;
    copy.finished = true;
    copy.release?.();
  }
}

/** The method name of a request (`GET`, `DELETE`, ...). */
function methodOf(request: ShimOutgoingRequest): string {
  const method = request.method() as { tag: string; val?: string };
  return (method.tag === "other" ? (method.val ?? "") : method.tag).toUpperCase();
}

/** A `Retry-After` given in seconds (an HTTP date is not trusted: clocks differ). */
export function retryAfterMs(response: ShimIncomingResponse): number | undefined {
  const values = response.headers().get("retry-after") as Uint8Array[];
  if (values.length === 0) return undefined;
  const text = new TextDecoder().decode(values[0]).trim();
  if (!/^\d+$/.test(text)) return undefined;
  return Number(text) * 1000;
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

/** Builds the handler; `policy()` gives the rules of the call in progress. */
export function createOutgoingHandler(policy: () => OutgoingPolicy, pacer: Pacer) {
  const encoder = new TextEncoder();

  /** Sends `request` through the shim, with the key injected when there is one. */
  function send(request: ShimOutgoingRequest, options: unknown, secret: OutgoingPolicy["secret"]): ShimFuture {
    if (!secret) return http.outgoingHandler.handle(request as never, options as never) as ShimFuture;
    injecting = { fields: request.headers(), header: secret.header, value: encoder.encode(secret.value) };
    try {
      return http.outgoingHandler.handle(request as never, options as never) as ShimFuture;
    } finally {
      injecting = undefined;
    }
  }

  /** Waits for the budget; `connection-timeout` when the call's deadline or cancellation comes first. */
  function admit(origin: string, current: OutgoingPolicy, priority: Priority): Grant | undefined {
    let grant: Grant | undefined;
    try {
      grant = pacer.acquire(origin, current.rateLimit, priority, {
        deadlineMs: current.deadlineMs ?? Number.POSITIVE_INFINITY,
        cancelled: current.cancelled,
      });
    } catch (error) {
      // The host could not read its own budget: it refuses to send rather than risk the provider's limit.
      throw { tag: "internal-error", val: error instanceof Error ? error.message : String(error) };
    }
    return grant;
  }

  /** The same request again (method, target, the component's headers, the kept body). */
  function repeat(original: ShimOutgoingRequest, copy: BodyCopy | undefined, timeouts: Timeouts, secret: OutgoingPolicy["secret"]): ShimFuture {
    const headers = new HostFields();
    for (const [name, value] of original.headers().entries()) headers.append(name, value);
    const again = new http.types.OutgoingRequest(headers as never);
    again.setMethod(original.method());
    again.setScheme(original.scheme());
    again.setAuthority(original.authority());
    again.setPathWithQuery(original.pathWithQuery());
    const body = again.body();
    const stream = body.write();
    const bytes = copy?.bytes ?? 0;
    let future: ShimFuture | undefined;
    // As for the first send: the whole body is buffered before the head leaves, when it fits.
    if (bytes > Number(stream.checkWrite())) future = send(again, optionsOf(timeouts), secret);
    for (const chunk of copy?.chunks ?? []) {
      for (let at = 0; at < chunk.byteLength; at += 4096) {
        const piece = chunk.subarray(at, at + 4096);
        if (future) stream.blockingWriteAndFlush(piece);
        else stream.write(piece);
      }
    }
    (stream as unknown as Record<symbol, () => void>)[Symbol.dispose]?.();
    http.types.OutgoingBody.finish(body, undefined);
    return future ?? send(again, optionsOf(timeouts), secret);
  }

  return {
    handle(request: ShimOutgoingRequest, options: unknown) {
      const current = policy();
      const target = requestOrigin(request.scheme(), request.authority());
      const allowed = current.allowedOrigin ? normaliseOrigin(current.allowedOrigin) : undefined;
      if (!target || !allowed || target !== allowed) {
        // The typed WASI error; the request never leaves this process.
        throw { tag: "HTTP-request-denied" };
      }
      const headers = request.headers();
      if (current.secret && !hostFields.has(headers)) {
        // A request whose headers did not come from this host cannot carry the key.
        throw { tag: "internal-error", val: "request headers were not created through the host" };
      }
      const limit = current.rateLimit;
      if (!limit) return send(request, options, current.secret);
      const priority: Priority = methodOf(request) === "DELETE" ? "cleanup" : "work";
      const grant = admit(target, current, priority);
      if (!grant) throw { tag: "connection-timeout" };
      const timeouts = timeoutsOf(options);
      let real: ShimFuture | undefined;
      const start = (): ShimFuture => {
        real ??= send(request, optionsOf(timeouts), current.secret);
        return real;
      };
      const copy = bodyOfRequest.get(request);
      // The shim sends the head at once and streams the body as the
      // component writes it; a server that answers 429 before reading the
      // body and closes makes that write fail (EPIPE) and the 429 is lost.
      // So the send waits until the body is complete (or its buffer full),
      // and the head and the whole body leave together.
      if (copy && !copy.finished) copy.release = () => void start();
      else start();
      let answered = false;
      const future = Object.create(ShimFutureClass.prototype) as ShimFuture & Record<symbol, () => void>;
      Object.assign(future, {
        subscribe: () => start().subscribe(),
        get: (): FutureValue => {
          const value = start().get();
          if (value === undefined || answered) return value;
          answered = true;
          // The API counted the request when it arrived, before this.
          grant.settle();
          return afterThrottling(request, value, target, limit, priority, current, timeouts);
        },
      });
      future[Symbol.dispose] = () => {
        grant.settle();
        (real as (ShimFuture & Record<symbol, () => void>) | undefined)?.[Symbol.dispose]();
      };
      return future;
    },
  };

  /**
   * Answers a 429 as information: pauses the origin, then sends the request
   * again while it may be repeated, fits the deadline and the repeats last.
   * Returns the answer the component gets.
   */
  function afterThrottling(
    request: ShimOutgoingRequest,
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
      const pause = Math.min(retryAfterMs(response) ?? limit.windowMs, MAX_THROTTLE_PAUSE_MS);
      try {
        pacer.throttled(origin, pause);
      } catch {
        // Without a working budget the 429 goes to the provider.
        return value;
      }
      const copy = bodyOfRequest.get(request);
      const whole = copy === undefined || (copy.finished && !copy.lost);
      const deadline = current.deadlineMs ?? Number.POSITIVE_INFINITY;
      if (!whole || repeats >= MAX_THROTTLED_REPEATS || Date.now() + pause >= deadline) return value;
      let grant: Grant | undefined;
      try {
        grant = admit(origin, current, priority);
      } catch {
        return value;
      }
      if (!grant) return value;
      let next: FutureValue;
      try {
        const future = repeat(request, copy, timeouts, current.secret);
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
