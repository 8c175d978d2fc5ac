/**
 * Secrets and API origins from the contract (`sandbox:provider@0.2.0`),
 * the same rules as the Rust host (`sandbox-host/src/network/secrets.rs`
 * and `runtime/origin_policy.rs`'s `route_policy`): nothing here names a
 * provider, a config field or a header.
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
 * - a secret goes to a provider's default origin (the config leaves the
 *   origin field out) only when the operator trusts that origin
 *   (`trustedOrigins`, the worker's `PAPERCLIP_WASM_TRUSTED_ORIGINS`);
 *   otherwise the config is refused, naming the field to set: the
 *   component declares its defaults, the operator decides where secrets go;
 * - when the config holds no secret, the variable the operator named for
 *   the field (`secretEnv`, the worker's `PAPERCLIP_WASM_SECRET_ENV`) is
 *   read, and used only when every origin that would receive it is one the
 *   operator trusts. The variable a provider names (`env-var`) is
 *   documentation and never read: a component never chooses what the host
 *   reads;
 * - several secrets for one origin are each sent in their own header; two
 *   in the same header of one origin are refused, naming both fields;
 * - an empty or blank secret, or one with a line break or NUL, is refused;
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
  /** The secret headers its requests carry (none when no secret was resolved). */
  secrets: ResolvedSecret[];
}

/**
 * The operator's secret settings (the worker's, never the component's):
 * Rust's `Secrets` (`trust_default_origin`, and the CLI's variables scoped
 * to the trusted origins).
 */
export interface SecretOperator {
  /** Where named variables are read (default `process.env`). */
  env?: NodeJS.ProcessEnv;
  /** Per secret config field, the variable the operator keeps it in. */
  secretEnv?: Readonly<Record<string, string>>;
  /** Origins the operator trusts with secrets: a default origin, and any that receives a key from `secretEnv`. */
  trustedOrigins?: readonly string[];
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
  operator: SecretOperator = {},
): SplitConfig {
  const env = operator.env ?? process.env;
  const trusted = new Set((operator.trustedOrigins ?? []).flatMap((o) => originOf(o) ?? []));
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
    routes.push({ field: field.configField, origin, namedByConfig, secrets: [] });
  }
  /** Per origin route, which field's secret each header carries (to name both of a clash). */
  const headerFields = new Map<OriginRoute, Map<string, string>>();
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
    } else {
      // Only a variable the operator named, and only for origins the operator trusts.
      const variable = operator.secretEnv?.[name];
      if (variable && env[variable] && receivers.length > 0 && receivers.every((r) => trusted.has(r.origin))) resolved = env[variable];
    }
    if (resolved === undefined) continue;
    if (resolved.trim() === "" || /[\r\n\0]/.test(resolved)) {
      errors.push(`${name}: the secret is empty or contains a line break or NUL`);
      continue;
    }
    const headerValue = secretField.scheme ? `${secretField.scheme} ${resolved}` : resolved;
    for (const route of receivers) {
      if (!route.namedByConfig && !trusted.has(route.origin)) {
        errors.push(
          `${name}: the config holds a secret but does not name the API URL in field ${route.field}, and the operator does not trust the provider's default ${route.origin} with it; set ${route.field} in the config (or the operator adds the origin to PAPERCLIP_WASM_TRUSTED_ORIGINS)`,
        );
        continue;
      }
      const problem = secretOriginProblem(route.origin);
      if (problem) {
        errors.push(`${name} (for ${route.field}): ${problem}`);
        continue;
      }
      const header = secretField.header.toLowerCase();
      const fields = headerFields.get(route) ?? new Map<string, string>();
      headerFields.set(route, fields);
      const earlier = fields.get(header);
      if (earlier !== undefined) {
        errors.push(
          `${route.field}: secret fields ${earlier} and ${name} would both be sent in header ${secretField.header} to ${route.origin}; the provider must declare one header per secret for an origin, so neither was sent`,
        );
        continue;
      }
      fields.set(header, name);
      route.secrets.push({ header: secretField.header, value: headerValue });
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

/** The worker setting naming the operator's variable per secret field. */
export const SECRET_ENV_SETTING = "PAPERCLIP_WASM_SECRET_ENV";
/** The worker setting listing the origins the operator trusts with secrets. */
export const TRUSTED_ORIGINS_SETTING = "PAPERCLIP_WASM_TRUSTED_ORIGINS";

/**
 * Parses `PAPERCLIP_WASM_SECRET_ENV`: `field=VARIABLE` pairs separated by
 * commas (for example `token=MY_API_TOKEN`). Throws a message naming
 * the setting and the bad entry.
 */
export function parseSecretEnv(text: string, setting = SECRET_ENV_SETTING): Record<string, string> {
  const named: Record<string, string> = {};
  for (const entry of text.split(",").map((e) => e.trim()).filter((e) => e !== "")) {
    const match = /^([A-Za-z_][A-Za-z0-9_.-]*)=([A-Za-z_][A-Za-z0-9_]*)$/.exec(entry);
    if (!match) throw new Error(`invalid ${setting} entry "${entry}": expected secretField=VARIABLE (for example token=MY_API_TOKEN), separated by commas`);
    if (match[1] in named) throw new Error(`invalid ${setting}: field ${match[1]} is named twice`);
    named[match[1]] = match[2];
  }
  return named;
}

/**
 * Parses `PAPERCLIP_WASM_TRUSTED_ORIGINS`: origins (`https://host[:port]`)
 * separated by commas or spaces. Throws a message naming the setting and
 * the bad entry; a plain-http remote origin is refused here too, since no
 * secret may travel to it.
 */
export function parseTrustedOrigins(text: string, setting = TRUSTED_ORIGINS_SETTING): string[] {
  const origins: string[] = [];
  for (const entry of text.split(/[\s,]+/).filter((e) => e !== "")) {
    const origin = originOf(entry);
    if (!origin) throw new Error(`invalid ${setting} entry "${entry}": expected an origin such as https://api.example.com`);
    const problem = secretOriginProblem(origin);
    if (problem) throw new Error(`invalid ${setting} entry "${entry}": ${problem}`);
    origins.push(origin);
  }
  return origins;
}
