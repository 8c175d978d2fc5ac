/**
 * Builds the Paperclip manifest from the component's `describe()`: the one
 * source of truth for the driver key, the display name, the config schema,
 * the secret fields and the capabilities. `scripts/generate-manifest.mjs`
 * runs this at build time and writes `dist/manifest.js`.
 */
import type { PaperclipPluginManifestV1 } from "@paperclipai/shared";
import type { WitProviderDescription } from "./wit-types.js";

/** The package facts the manifest needs besides the description. */
export interface PackageFacts {
  version: string;
  description: string;
  author: string;
}

/** The plugin id Paperclip installs this package under. */
export const PLUGIN_ID = "sandbox-provider.createos-wasm";

/**
 * The config schema Paperclip shows: the component's schema, with every
 * declared secret field marked `format: "secret-ref"` (Paperclip stores a
 * pasted value as a company secret and hands the worker the resolved string).
 */
export function paperclipConfigSchema(description: WitProviderDescription): Record<string, unknown> {
  const schema = JSON.parse(description.configSchema) as Record<string, unknown> & {
    properties?: Record<string, Record<string, unknown>>;
  };
  delete schema.$schema;
  const properties = { ...(schema.properties ?? {}) };
  for (const secret of description.secrets) {
    properties[secret.configField] = {
      ...(properties[secret.configField] ?? {}),
      type: "string",
      format: "secret-ref",
    };
  }
  return { ...schema, properties };
}

/** The whole manifest. */
export function buildManifest(description: WitProviderDescription, facts: PackageFacts): PaperclipPluginManifestV1 {
  const reusable = description.capabilities.reusableLeases;
  const sync = description.capabilities.nativeSync;
  return {
    id: PLUGIN_ID,
    apiVersion: 1,
    version: facts.version,
    displayName: `${description.displayName} (WebAssembly component)`,
    description: facts.description,
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
        description: `${description.displayName} sandboxes through a WebAssembly provider component that never sees the API key.`,
        configSchema: paperclipConfigSchema(description),
        supportsReusableLeases: reusable,
        sandboxCapabilities: {
          reusableLeases: reusable,
          nativeSyncIn: sync,
          nativeSyncOut: sync,
          incrementalSessionOutput: description.capabilities.incrementalOutput,
        },
      },
    ],
  } as PaperclipPluginManifestV1;
}
