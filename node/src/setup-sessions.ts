/**
 * Paperclip's custom-image flow (interactive setup and template capture)
 * over contract 0.7.0's templates, for components that declare
 * `templates`:
 * - a setup session is a lease acquired for it (started from the
 *   environment's template, if it has one); its lease is kept in
 *   `ctx.state` by its sandbox id, since Paperclip hands the later calls
 *   only that id and a metadata record it redacts (any key naming a lease,
 *   host, URL or token, any value holding an IPv4 address);
 * - capture keeps the sandbox's files as a template (`capture-template`),
 *   whose reference Paperclip writes into the config's `template` field
 *   (`templateConfigBinding`); a lease acquired with that config starts
 *   from it, and a paused reusable lease made from another template is
 *   expired on resume before any request;
 * - cancel (Paperclip also calls it after a promotion) destroys the setup
 *   lease; delete removes a template (`delete-template`).
 * There is no connection to hand the user (no SSH into the sandbox): a
 * session reports none, and the manifest declares no connection type.
 */
import type { PluginContext } from "@paperclipai/plugin-sdk";
import { ProviderFailure } from "./mapping.js";

/** The config field Paperclip writes a captured template's reference into (host-owned: the component never sees it). */
export const TEMPLATE_FIELD = "template";

/** What a captured template is to Paperclip: the provider's own template (its reference is ours to read, bound to the company and environment). */
export const TEMPLATE_KIND = "provider_template";

/** The state namespace setup leases live in. */
export const SETUP_NAMESPACE = "setup-leases";

/** What is kept of a setup session's lease. */
export interface SetupRecord {
  providerLeaseId: string;
  sessionId: string;
  environmentId: string;
  /** Paperclip's lease metadata as the acquire returned it. */
  leaseMetadata: Record<string, unknown>;
  expiresAt: string | null;
  startedAt: string;
}

type StateClient = PluginContext["state"];

function key(companyId: string, providerLeaseId: string) {
  return { scopeKind: "company" as const, scopeId: companyId, namespace: SETUP_NAMESPACE, stateKey: providerLeaseId };
}

/** Setup leases in `ctx.state`. */
export class SetupStore {
  constructor(private readonly state: () => StateClient) {}

  async get(companyId: string, providerLeaseId: string): Promise<SetupRecord | null> {
    const value = await this.state().get(key(companyId, providerLeaseId));
    return value && typeof value === "object" ? (value as SetupRecord) : null;
  }

  async record(companyId: string, record: SetupRecord): Promise<void> {
    await this.state().set(key(companyId, record.providerLeaseId), record);
  }

  async clear(companyId: string, providerLeaseId: string): Promise<void> {
    await this.state().delete(key(companyId, providerLeaseId));
  }
}

/**
 * The config without the host's `template` field, and that field's value:
 * none, or a non-empty string (else a typed refusal before any request).
 */
export function takeTemplate(config: Record<string, unknown> | null | undefined): { config: Record<string, unknown>; template: string | undefined } {
  const { [TEMPLATE_FIELD]: value, ...rest } = config ?? {};
  if (value === undefined || value === null || value === "") return { config: rest, template: undefined };
  if (typeof value !== "string" || value.length > 200 || /[\s\u0000-\u001f\u007f]/.test(value)) {
    throw new ProviderFailure(`The config's ${TEMPLATE_FIELD} must be a template reference (1-200 characters, no whitespace); nothing was sent.`, "invalid-config", "none");
  }
  return { config: rest, template: value };
}

/**
 * The template name to capture under: 1-47 of letters, digits, `.`, `_`,
 * `-` (the contract's rule), from Paperclip's label
 * (`paperclip-<environment>-<session>`, too long as it is): `paperclip-`,
 * the label's last part (the session), and the time, so that each capture
 * of a session gets a name of its own.
 */
export function templateName(label: string | null | undefined, now = Date.now()): string {
  const last = (label ?? "").split("-").at(-1) ?? "";
  const session = last.replace(/[^A-Za-z0-9]/g, "").slice(0, 12) || "setup";
  return `paperclip-${session}-${now.toString(36)}`;
}
