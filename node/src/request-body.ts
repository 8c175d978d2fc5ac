/**
 * Request bodies kept in this host, as the Rust host keeps them: the
 * component's `outgoing-request` is {@link HostOutgoingRequest}, whose
 * body's output stream writes into a {@link BodyCopy} instead of the
 * shim's stream, and `outgoing-body.finish` ({@link HostOutgoingBody})
 * completes the copy and lets the request go (the outgoing handler then
 * sends the head and the whole body together, and can send them again
 * after a 429).
 */
import { clocks, http } from "@bytecodealliance/preview2-shim";

type ShimFields = InstanceType<typeof http.types.Fields>;
type ShimOutgoingRequest = InstanceType<typeof http.types.OutgoingRequest>;
type ShimOutgoingBody = (typeof http.types.OutgoingBody)["prototype"];

/**
 * The body the component writes for one request, kept whole in this host
 * (as the Rust host keeps it): the request leaves only when the body is
 * complete, head and body together, and a throttled request can be sent
 * again with the same bytes.
 */
export interface BodyCopy {
  chunks: Uint8Array[];
  bytes: number;
  /** `outgoing-body.finish` was called: the copy is the whole body. */
  finished: boolean;
  /** The send waiting for the body (set by the handler), run by `finish`. */
  onFinish?: () => void;
}

const bodyOfRequest = new WeakMap<object, BodyCopy>();
const bodyOfOutgoingBody = new WeakMap<object, BodyCopy>();

/** What `check-write` answers on a kept body: the component may always write this much more. */
const KEPT_BODY_WRITE_ALLOWANCE = 1024n * 1024n;

function keep(copy: BodyCopy, bytes: Uint8Array) {
  if (copy.finished) throw { tag: "closed" };
  copy.chunks.push(bytes.slice());
  copy.bytes += bytes.byteLength;
}

/**
 * The `outgoing-request` class the component constructs. The output stream
 * of its body writes into a {@link BodyCopy} instead of the shim's stream
 * (instance methods: the shim's classes are unchanged, jco calls methods on
 * the instance, and the objects stay the shim's own). The shim would send
 * the head at once and stream the body as it is written; a server that
 * answers (a 429, say) before reading the body and closes the connection
 * then fails the write (EPIPE), or leaves the component waiting for buffer
 * space that never comes, and its answer is lost. Writing never waits:
 * `check-write` always allows more and `subscribe` is always ready.
 */
export class HostOutgoingRequest extends (http.types.OutgoingRequest as unknown as new (headers: ShimFields) => ShimOutgoingRequest) {
  override body(): ShimOutgoingBody {
    const body = super.body();
    const copy: BodyCopy = { chunks: [], bytes: 0, finished: false };
    bodyOfRequest.set(this, copy);
    bodyOfOutgoingBody.set(body, copy);
    const openStream = body.write.bind(body);
    (body as { write: () => unknown }).write = () => {
      const stream = openStream() as unknown as Record<string, unknown>;
      Object.assign(stream, {
        checkWrite: () => KEPT_BODY_WRITE_ALLOWANCE,
        write: (bytes: Uint8Array) => keep(copy, bytes),
        blockingWriteAndFlush: (bytes: Uint8Array) => keep(copy, bytes),
        writeZeroes: (length: bigint) => keep(copy, new Uint8Array(Number(length))),
        blockingWriteZeroesAndFlush: (length: bigint) => keep(copy, new Uint8Array(Number(length))),
        flush: () => {},
        blockingFlush: () => {},
        subscribe: () => clocks.monotonicClock.subscribeDuration(0n),
        splice: () => {
          throw new Error("splicing into a request body is not supported by this host");
        },
        blockingSplice: () => {
          throw new Error("splicing into a request body is not supported by this host");
        },
      });
      return stream;
    };
    return body;
  }
}

const ShimOutgoingBodyClass = http.types.OutgoingBody as unknown as {
  prototype: object;
  finish(body: ShimOutgoingBody, trailers: unknown): void;
};

/**
 * The `outgoing-body` class: `finish` of a kept body completes the copy and
 * lets its request go; other bodies go to the shim. Accepts every shim body.
 */
export class HostOutgoingBody extends (http.types.OutgoingBody as unknown as new () => ShimOutgoingBody) {
  static [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === "object" && value !== null && Object.prototype.isPrototypeOf.call(ShimOutgoingBodyClass.prototype, value);
  }

  static finish(body: ShimOutgoingBody, trailers: unknown): void {
    const copy = bodyOfOutgoingBody.get(body);
    if (!copy) return ShimOutgoingBodyClass.finish(body, trailers);
    if (trailers) throw { tag: "internal-error", val: "trailers unsupported" };
    if (copy.finished) throw { tag: "internal-error", val: "the body was already finished" };
    copy.finished = true;
    copy.onFinish?.();
  }
}

/** The kept body of a request the component built through this host (none: built elsewhere, or no body taken yet). */
export function keptBody(request: object): BodyCopy | undefined {
  return bodyOfRequest.get(request);
}
