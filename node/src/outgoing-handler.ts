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
 * - the provider's declared rate limit, spent through the shared {@link Pacer}.
 *
 * The shim locks a request's headers when the request is built, so the key
 * cannot be added by mutation. Instead, the component's `fields` resource is
 * a subclass of the shim's whose `entries()` includes the key only while this
 * handler is inside the shim's synchronous `handle` for that one request.
 */
import { http } from "@bytecodealliance/preview2-shim";
import type { Pacer } from "./pacer.js";
import type { WitRateLimit } from "./wit-types.js";

/** What the handler allows and injects during one provider call. */
export interface OutgoingPolicy {
  /** The only origin requests may go to (`scheme://host[:port]`), if any. */
  allowedOrigin: string | undefined;
  /** The secret header for that origin, if a secret was resolved. */
  secret: { header: string; value: string } | undefined;
  /** The request budget per origin (none: no limit). */
  rateLimit: WitRateLimit | undefined;
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

/** Normalises an allowed origin the same way as {@link requestOrigin}. */
export function normaliseOrigin(origin: string): string | undefined {
  try {
    const url = new URL(origin);
    return url.protocol === "http:" || url.protocol === "https:" ? url.origin : undefined;
  } catch {
    return undefined;
  }
}

/** Builds the handler; `policy()` gives the rules of the call in progress. */
export function createOutgoingHandler(policy: () => OutgoingPolicy, pacer: Pacer) {
  const encoder = new TextEncoder();
  return {
    handle(request: any, options: unknown) {
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
      pacer.waitForTurn(target, current.rateLimit);
      if (!current.secret) return http.outgoingHandler.handle(request, options as never);
      injecting = { fields: headers, header: current.secret.header, value: encoder.encode(current.secret.value) };
      try {
        return http.outgoingHandler.handle(request, options as never);
      } finally {
        injecting = undefined;
      }
    },
  };
}
