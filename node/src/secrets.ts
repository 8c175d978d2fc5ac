/**
 * Secrets and API origins from the contract (`sandbox:provider@0.2.0`),
 * the same rules as the Rust host (`sandbox-host/src/network/secrets.rs`
 * and `runtime.rs`'s `policy_for`): nothing here names a provider, a
 * config field or a header.
 *
 * - `describe().origin-fields` says which config fields name the API
 *   origins (each with its default URL) and which secret fields the
 *   requests to each origin carry;
 * - `describe().secrets` says which config fields hold secrets, the header
 *   that carries each one and its `scheme` (`Bearer` gives
 *   `Authorization: Bearer <key>`; none gives the bare secret);
 * - a secret field is taken out of the config the component sees;
 *   Paperclip resolved its `secret-ref` before the worker was called, so
 *   it holds the secret itself;
 * - a secret goes only to the origins whose origin field lists it, and
 *   only over `https:` (plain `http:` only to a loopback host);
 * - when the config holds no secret, the variable the provider names
 *   (`env-var`) is read from the worker's environment, and used only when
 *   every origin that would receive it is one of the provider's own
 *   default origins (left out of the config, or named in it as the same
 *   origin): a key from the environment never goes to another URL someone
 *   typed into a config;
 * - the origins `validate-config` asks for must be exactly the ones the
 *   config names, field by field (checked by {@link checkAskedOrigins}
 *   before the component's operation runs): otherwise nothing is sent.
 */
import type { WitProviderDescription } from "./wit-types.js";

/** A resolved secret header for one origin. Never printed. */
export interface ResolvedSecret {
  header: string;
  value: string;
}

/** One API origin of a config: where it came from and what its requests carry. */
export interface OriginRoute {
  /** The config field that names it. */
  field: string;
  /** `scheme://host[:port]`, normalised like `URL.origin`. */
  origin: string;
  /** True when the config named it; false for the provider's default. */
  namedByConfig: boolean;
  /** The secret header its requests carry, if a secret was resolved. */
  secret?: ResolvedSecret;
}

/** The result of splitting a config. */
export interface SplitConfig {
  /** The config without secret fields, for the component. */
  componentConfig: Record<string, unknown>;
  /** The config's API origins, in the provider's `origin-fields` order. */
  routes: OriginRoute[];
  /** Problems, each naming the field (never a secret). */
  errors: string[];
}

/** Whether `host` (from a URL) is a loopback host. */
function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "").toLowerCase();
  return bare === "localhost" || bare === "::1" || /^127\.\d+\.\d+\.\d+$/.test(bare);
}

/** The origin of an http(s) URL without user info, normalised; undefined otherwise. */
export function originOf(url: string): string | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return undefined;
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return undefined;
  if (parsed.username || parsed.password || !parsed.hostname) return undefined;
  return parsed.origin;
}

/** Why a secret may not travel to `origin`, or undefined when it may (https, or http on loopback). */
export function secretOriginProblem(origin: string): string | undefined {
  const url = new URL(origin);
  if (url.protocol === "https:") return undefined;
  if (url.protocol === "http:" && isLoopback(url.hostname)) return undefined;
  return `the secret would be sent to ${origin} in plain text; use an https URL (plain http is allowed only for localhost, 127.0.0.1 or [::1])`;
}

/** Splits `config` (a JSON object from Paperclip) for the component. */
export function splitConfig(
  config: Record<string, unknown> | null | undefined,
  description: WitProviderDescription,
  env: NodeJS.ProcessEnv = process.env,
): SplitConfig {
  const componentConfig: Record<string, unknown> = { ...(config ?? {}) };
  const errors: string[] = [];
  const routes: OriginRoute[] = [];
  for (const field of description.originFields) {
    const value = componentConfig[field.configField];
    let url: string;
    let namedByConfig: boolean;
    if (value === undefined || value === null) {
      if (field.defaultUrl === undefined) {
        errors.push(`${field.configField}: required (the API URL to use)`);
        continue;
      }
      url = field.defaultUrl;
      namedByConfig = false;
    } else if (typeof value === "string") {
      url = value;
      namedByConfig = true;
    } else {
      errors.push(`${field.configField}: must be a URL string`);
      continue;
    }
    const origin = originOf(url);
    if (!origin) {
      errors.push(
        namedByConfig
          ? `${field.configField}: must be an http or https URL without user name or password`
          : `${field.configField}: the provider's default URL is not an http or https URL`,
      );
      continue;
    }
    routes.push({ field: field.configField, origin, namedByConfig });
  }
  const defaultOrigins = new Set(
    description.originFields.flatMap((field) => {
      const origin = field.defaultUrl === undefined ? undefined : originOf(field.defaultUrl);
      return origin === undefined ? [] : [origin];
    }),
  );
  for (const secretField of description.secrets) {
    const name = secretField.configField;
    const value = componentConfig[name];
    delete componentConfig[name];
    const receivers = routes.filter((route) =>
      description.originFields.some((o) => o.configField === route.field && o.secrets.includes(name)),
    );
    let resolved: string | undefined;
    if (value !== undefined && value !== null) {
      if (typeof value !== "string") {
        errors.push(`${name}: must be a secret reference resolved to a string`);
        continue;
      }
      resolved = value;
    } else if (secretField.envVar && env[secretField.envVar] && receivers.length > 0 && receivers.every((r) => defaultOrigins.has(r.origin))) {
      // Only the provider's own default origins receive a key from the
      // environment, whether the config leaves the field out or names the
      // same origin (as the Rust host's trusted defaults).
      resolved = env[secretField.envVar];
    }
    if (resolved === undefined) continue;
    if (resolved.trim() === "" || /[\r\n\0]/.test(resolved)) {
      errors.push(`${name}: the secret is empty or contains a line break or NUL`);
      continue;
    }
    const headerValue = secretField.scheme ? `${secretField.scheme} ${resolved}` : resolved;
    for (const route of receivers) {
      const problem = secretOriginProblem(route.origin);
      if (problem) {
        errors.push(`${name} (for ${route.field}): ${problem}`);
        continue;
      }
      if (route.secret && route.secret.header.toLowerCase() !== secretField.header.toLowerCase()) {
        errors.push(
          `${route.field}: the provider sends two secrets (${route.secret.header}, ${secretField.header}) to one origin; this host injects one secret header per origin`,
        );
        continue;
      }
      route.secret = { header: secretField.header, value: headerValue };
    }
  }
  return { componentConfig, routes, errors };
}

/**
 * Why the origins a component's `validate-config` asks for cannot be
 * allowed, or undefined when they are exactly the config's (`routes`), in
 * order. Checked before any request of the call.
 */
export function checkAskedOrigins(asked: readonly string[], routes: readonly OriginRoute[]): string | undefined {
  if (asked.length !== routes.length) {
    return `the provider asks for ${asked.length} API origin(s) (${asked.join(", ") || "none"}) but declares ${routes.length} origin field(s) (${routes.map((r) => r.field).join(", ") || "none"}); nothing was sent`;
  }
  for (let i = 0; i < asked.length; i++) {
    const origin = originOf(asked[i]);
    if (origin !== routes[i].origin) {
      return `the provider asks to send its requests to ${asked[i]}, but the config names ${routes[i].origin} (field ${routes[i].field}); the host sends requests (and secrets) only to the origins the config names, and nothing was sent`;
    }
  }
  return undefined;
}
