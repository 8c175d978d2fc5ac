/**
 * Builds a Paperclip plugin manifest from a component's `describe()`: the
 * one source of truth for the plugin id, the driver key, the names, the
 * config schema, the secret fields and the capabilities. The packer
 * (`scripts/pack.mjs`) checks the description with {@link descriptionProblems},
 * then writes `dist/manifest.js` of each package from {@link buildManifest}.
 * Nothing here names a provider.
 */
import { offeredToPaperclip, type HeldBack } from "./paperclip-features.js";
import type { PaperclipPluginManifestV1 } from "@paperclipai/shared";
import type { WitProviderDescription } from "./wit-types.js";
import { TEMPLATE_FIELD, TEMPLATE_KIND } from "./setup-sessions.js";

/** The package facts the manifest needs besides the description. */
export interface PackageFacts {
  version: string;
  author: string;
  /** What the packer holds back from Paperclip for this driver, with why. */
  heldBack?: HeldBack;
}

/** What Paperclip accepts as a plugin id (`pluginManifestV1Schema`), and so as a driver key here. */
const ID_PATTERN = /^[a-z0-9][a-z0-9._-]*$/;
/** An HTTP header name (RFC 9110 token). */
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** The plugin id Paperclip installs a provider's package under. */
export function pluginIdFor(driverKey: string): string {
  return `sandbox-provider.${driverKey}-wasm`;
}

/** The npm package name of a provider's package. */
export function packageNameFor(driverKey: string): string {
  return `@sandbox-provider/paperclip-${driverKey}-wasm`;
}

/** The package's one-line description. */
export function packageDescription(description: WitProviderDescription): string {
  return `${description.displayName} sandboxes for Paperclip through its WebAssembly provider component (driver ${description.driverKey}); secrets never enter the component.`;
}

/**
 * Why a description cannot be packed (each problem in words, naming the
 * field), or an empty list. A packer refuses a component with problems.
 */
export function descriptionProblems(description: WitProviderDescription): string[] {
  const problems: string[] = [];
  if (typeof description.driverKey !== "string" || !ID_PATTERN.test(description.driverKey)) {
    problems.push(`driver-key ${JSON.stringify(description.driverKey)} is not usable as a Paperclip driver key and plugin id (lower-case letters, digits, '.', '_', '-', starting with a letter or digit)`);
  }
  if (typeof description.displayName !== "string" || description.displayName.trim() === "") {
    problems.push("display-name is empty");
  }
  let schema: unknown;
  try {
    schema = JSON.parse(description.configSchema);
  } catch {
    problems.push("config-schema is not JSON");
  }
  if (schema !== undefined && (typeof schema !== "object" || schema === null || Array.isArray(schema) || (schema as { type?: unknown }).type !== "object")) {
    problems.push('config-schema is not a JSON Schema of an object (`"type": "object"`)');
  }
  const secretNames = new Set<string>();
  for (const secret of description.secrets) {
    if (!secret.configField) problems.push("a secret field has no config-field");
    if (!TOKEN.test(secret.header)) problems.push(`secret ${secret.configField}: header ${JSON.stringify(secret.header)} is not an HTTP header name`);
    if (secret.scheme !== undefined && !TOKEN.test(secret.scheme)) problems.push(`secret ${secret.configField}: scheme ${JSON.stringify(secret.scheme)} is not a single word`);
    secretNames.add(secret.configField);
  }
  if (description.originFields.length === 0) {
    problems.push("it declares no origin-fields, so a host can allow it no request (contract 0.2.0 needs at least one)");
  }
  for (const origin of description.originFields) {
    for (const name of origin.secrets) {
      if (!secretNames.has(name)) problems.push(`origin field ${origin.configField} carries secret ${name}, which is not among its secrets`);
    }
    if (secretNames.has(origin.configField)) problems.push(`${origin.configField} is both an origin field and a secret field`);
  }
  return problems;
}

/**
 * The config schema Paperclip shows: the component's schema (plus the
 * host's `template` field where templates are offered), with every
 * declared secret field marked `format: "secret-ref"` (Paperclip stores a
 * pasted value as a company secret and hands the worker the resolved
 * string) and stripped of any default or example (no secret in a manifest).
 */
export function paperclipConfigSchema(description: WitProviderDescription, templates = false): Record<string, unknown> {
  const schema = JSON.parse(description.configSchema) as Record<string, unknown> & {
    properties?: Record<string, Record<string, unknown>>;
  };
  delete schema.$schema;
  const properties = { ...(schema.properties ?? {}) };
  for (const secret of description.secrets) {
    const { default: _default, examples: _examples, const: _const, enum: _enum, ...rest } = properties[secret.configField] ?? {};
    properties[secret.configField] = { ...rest, type: "string", format: "secret-ref" };
  }
  if (templates) {
    // The host's own field (setup-sessions.ts): Paperclip writes a captured template's reference here.
    properties[TEMPLATE_FIELD] = {
      type: "string",
      minLength: 1,
      maxLength: 200,
      pattern: "^\\S+$",
      description: "A template captured from a setup sandbox (Paperclip writes it here): new sandboxes start from it instead of an image; a change expires reusable leases.",
    };
  }
  return { ...schema, properties };
}

/** The whole manifest. */
export function buildManifest(description: WitProviderDescription, facts: PackageFacts): PaperclipPluginManifestV1 {
  const reusable = description.capabilities.reusableLeases ?? false;
  const sync = description.capabilities.nativeSync ?? false;
  // Sync-in and sync-out may overlap on one lease only where the component says each stays byte-exact then (the host adds no lock of its own).
  const concurrentSync = sync && (description.capabilities.concurrentSync ?? false);
  // The login terminal and duplex channel hooks exist only where the component runs them (plugin.ts).
  const { loginPty, duplexChannels: duplex, runnerIngress, templates } = offeredToPaperclip(description, facts.heldBack);
  return {
    id: pluginIdFor(description.driverKey),
    apiVersion: 1,
    version: facts.version,
    displayName: `${description.displayName} (WebAssembly component)`,
    description: packageDescription(description),
    author: facts.author,
    categories: ["workspace"],
    // Exactly what the worker uses: the driver, and ctx.state for durable poison.
    capabilities: ["environment.drivers.register", "plugin.state.read", "plugin.state.write"],
    entrypoints: { worker: "./dist/worker.js" },
    environmentDrivers: [
      {
        driverKey: description.driverKey,
        kind: "sandbox_provider",
        displayName: description.displayName,
        description: `${description.displayName} sandboxes through a WebAssembly provider component that never sees a secret.`,
        configSchema: paperclipConfigSchema(description, templates),
        supportsReusableLeases: reusable,
        supportsLoginPty: loginPty,
        // The custom-image flow over the component's templates (setup-sessions.ts): no connection type (no SSH),
        // the captured reference written into the host's `template` field.
        ...(templates
          ? {
              supportsInteractiveSetup: true,
              interactiveSetupConnectionTypes: [],
              supportsTemplateCapture: true,
              templateRefKind: TEMPLATE_KIND,
              templateConfigBinding: { field: TEMPLATE_FIELD },
              supportsTemplateDelete: true,
            }
          : {}),
        sandboxCapabilities: {
          reusableLeases: reusable,
          nativeSyncIn: sync,
          nativeSyncOut: sync,
          incrementalSessionOutput: description.capabilities.incrementalOutput ?? false,
          concurrentSyncOperations: concurrentSync,
          duplexCommandStream: duplex,
          runnerWebSocketIngress: runnerIngress,
        },
      },
    ],
  } as PaperclipPluginManifestV1;
}
