/**
 * Paperclip's runner ingress (`onEnvironmentRunnerIngressEndpoint`) from a
 * component's `open-port` (capability `ports`): the URL of the sandbox's
 * port as a WebSocket URL with the exact path Paperclip asked for, and the
 * headers that guard it as Paperclip's `secretHeaders`.
 *
 * Schemes, plainly: Paperclip 2026.916.1 accepts only `wss:` here (its
 * server checks the kind, the `wss:` scheme, no user info, query or
 * fragment, a path equal to the one it asked for, a generation, and each
 * secret header's name as an HTTP token with a non-empty value). A service that serves its ports over TLS (`https:`) gives
 * `wss:`. Our local engine (`createos-local --ingress`) serves each opened
 * port on a loopback listener over plain `http:`, so what this returns for
 * it is `ws://127.0.0.1:…`, which that Paperclip refuses: it is never
 * rewritten to a `wss:` URL nothing serves.
 */
import { createHmac, randomBytes } from "node:crypto";
import { ProviderFailure } from "./mapping.js";
import type { WitPortEndpoint } from "./wit-types.js";

/** Paperclip's `PluginEnvironmentRunnerIngressEndpoint`. */
export interface RunnerIngressEndpoint {
  kind: "authenticated_websocket";
  websocketUrl: string;
  secretHeaders: Array<{ name: string; value: string }>;
  generation: string;
}

/** An HTTP header name (RFC 9110 token). */
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** Keys the generation (below) for this worker process only. */
const GENERATION_KEY = randomBytes(32);

/** The port Paperclip asks for, or a typed refusal before any request. */
export function runnerPort(port: unknown): number {
  if (typeof port !== "number" || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new ProviderFailure(`The runner ingress port must be an integer from 1 to 65535, not ${JSON.stringify(port)}; nothing was opened.`, "invalid-request", "none");
  }
  return port;
}

/** The path Paperclip asks for: absolute, with no query, fragment, `..` or anything a URL would rewrite. */
export function runnerPath(path: unknown): string {
  const usable =
    typeof path === "string" &&
    path.startsWith("/") &&
    !path.startsWith("//") &&
    path.length <= 2048 &&
    !/[?#\s\\]/.test(path) &&
    // eslint-disable-next-line no-control-regex
    !/[\u0000-\u001f\u007f]/.test(path) &&
    new URL(path, "http://host.invalid").pathname === path;
  if (!usable) {
    throw new ProviderFailure(`The runner ingress path ${JSON.stringify(path)} is not an absolute URL path without query or fragment; nothing was opened.`, "invalid-request", "none");
  }
  return path;
}

/**
 * The endpoint in Paperclip's shape: `https:` becomes `wss:` and `http:`
 * becomes `ws:` (the same address, as the contract says a WebSocket client
 * uses it), with `path` as its whole path. A URL that has user info, a
 * query, a fragment or a path of its own cannot carry Paperclip's exact
 * path, and is refused rather than bent. `generation` names this URL and
 * these headers (a keyed hash: it changes when the provider hands out a new
 * address or token, and shows neither).
 */
export function toRunnerIngress(endpoint: WitPortEndpoint, path: string, provider: string): RunnerIngressEndpoint {
  let url: URL;
  try {
    url = new URL(endpoint.url);
  } catch {
    throw new ProviderFailure(`${provider} answered open-port with a URL that does not parse; nothing else was done.`, "invalid-response", "none");
  }
  const scheme = url.protocol === "https:" ? "wss:" : url.protocol === "http:" ? "ws:" : undefined;
  if (scheme === undefined || url.username || url.password || url.search || url.hash || (url.pathname !== "/" && url.pathname !== "")) {
    throw new ProviderFailure(
      `${provider} opened port ${endpoint.port} at a URL that cannot carry the runner's path (it must be an http or https origin without user info, query or path); nothing else was done.`,
      "invalid-response",
      "none",
    );
  }
  const websocketUrl = `${scheme}//${url.host}${path}`;
  if (endpoint.headers.some(([name, value]) => !TOKEN.test(name) || value === "")) {
    throw new ProviderFailure(`${provider} opened port ${endpoint.port} with a guard header that is not a header name and value; nothing else was done.`, "invalid-response", "none");
  }
  const secretHeaders = endpoint.headers.map(([name, value]) => ({ name, value }));
  const generation = createHmac("sha256", GENERATION_KEY).update(JSON.stringify([websocketUrl, endpoint.headers])).digest("hex").slice(0, 32);
  return { kind: "authenticated_websocket", websocketUrl, secretHeaders, generation };
}
