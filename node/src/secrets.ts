/**
 * Splits a Paperclip config into what the component may see and the secrets
 * the host keeps, following the component's `describe().secrets`.
 *
 * Paperclip resolves a `format: "secret-ref"` field before the worker is
 * called, so `config.apiKey` holds the key itself. It is removed from the
 * config the component gets; the outgoing handler adds it as the declared
 * header, only to the allowed origin. When the config holds no key, the
 * declared environment variable (`CREATEOS_API_KEY`) is used, and only for
 * the provider's official endpoint (the schema's default `apiUrl`), never
 * for a custom URL.
 */
import type { WitProviderDescription } from "./wit-types.js";

/** A resolved secret and the header it travels in. */
export interface ResolvedSecret {
  header: string;
  value: string;
}

/** The result of splitting a config. */
export interface SplitConfig {
  /** The config without secret fields, as JSON for the component. */
  componentConfig: Record<string, unknown>;
  /** The secret for the config's origin, if one was found. */
  secret: ResolvedSecret | undefined;
  /** Problems with secret fields, each naming the field. */
  errors: string[];
}

/** The official API URL: the config schema's default `apiUrl`. */
export function officialApiUrl(description: WitProviderDescription): string | undefined {
  try {
    const schema = JSON.parse(description.configSchema) as { properties?: { apiUrl?: { default?: unknown } } };
    const value = schema.properties?.apiUrl?.default;
    return typeof value === "string" ? value : undefined;
  } catch {
    return undefined;
  }
}

function sameOrigin(a: unknown, b: string | undefined): boolean {
  if (b === undefined) return false;
  if (a === undefined || a === null) return true; // no apiUrl means the default
  if (typeof a !== "string") return false;
  try {
    return new URL(a).origin === new URL(b).origin;
  } catch {
    return false;
  }
}

/** Splits `config` (a JSON object from Paperclip) for the component. */
export function splitConfig(
  config: Record<string, unknown> | null | undefined,
  description: WitProviderDescription,
  env: NodeJS.ProcessEnv = process.env,
): SplitConfig {
  const componentConfig: Record<string, unknown> = { ...(config ?? {}) };
  const errors: string[] = [];
  let secret: ResolvedSecret | undefined;
  for (const field of description.secrets) {
    const value = componentConfig[field.configField];
    delete componentConfig[field.configField];
    let resolved: string | undefined;
    if (value !== undefined && value !== null) {
      if (typeof value !== "string") {
        errors.push(`${field.configField}: must be a secret reference resolved to a string`);
        continue;
      }
      resolved = value;
    } else if (field.envVar && env[field.envVar] && sameOrigin(componentConfig.apiUrl, officialApiUrl(description))) {
      resolved = env[field.envVar];
    }
    if (resolved === undefined) continue;
    if (resolved.trim() === "" || /[\r\n\0]/.test(resolved)) {
      errors.push(`${field.configField}: the key is empty or contains a line break or NUL`);
      continue;
    }
    secret = { header: field.header, value: resolved };
  }
  return { componentConfig, secret, errors };
}
