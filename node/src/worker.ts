/**
 * The worker entry point Paperclip forks (`paperclipPlugin.worker`): the
 * plugin defined with Paperclip's SDK, served over stdio by the SDK's own
 * JSON-RPC host (`runWorker`). No protocol code of our own, and nothing of
 * one provider: the component in `./component/` says who it is.
 *
 * Worker settings (environment), each with the earlier CreateOS-only name
 * still read as an alias when the new one is unset:
 * - `PAPERCLIP_WASM_RATE_LIMIT` (`PAPERCLIP_CREATEOS_RATE_LIMIT`): the
 *   operator's account limit instead of the declared one;
 * - `PAPERCLIP_WASM_RATE_LEDGER` (`PAPERCLIP_CREATEOS_RATE_LEDGER`): the
 *   request pacer's ledger file (read in `rate-ledger.ts`);
 * - `PAPERCLIP_WASM_THREADS` (`PAPERCLIP_CREATEOS_WASM_THREADS`): the
 *   most worker threads;
 * - `PAPERCLIP_WASM_TEST_TRAP_MARKER` (`PAPERCLIP_CREATEOS_WASM_TEST_TRAP_MARKER`):
 *   test-only fault.
 *
 * And the operator's secret settings (no alias; see `secrets.ts`):
 * - `PAPERCLIP_WASM_TRUSTED_ORIGINS`: origins trusted with secrets when a
 *   config leaves its origin field out (the provider's default), and the
 *   only ones a key from `PAPERCLIP_WASM_SECRET_ENV` goes to;
 * - `PAPERCLIP_WASM_SECRET_ENV`: `field=VARIABLE` pairs, the variable the
 *   operator keeps a secret in when the config holds none. The variable a
 *   provider names in `describe()` is never read.
 */
import { runWorker } from "./sdk.js";
import { createPlugin } from "./plugin.js";
import { parseRateLimit, RATE_LIMIT_ENV, RATE_LIMIT_ENV_ALIAS } from "./rate-ledger.js";
import { parseSecretEnv, parseTrustedOrigins, SECRET_ENV_SETTING, TRUSTED_ORIGINS_SETTING } from "./secrets.js";

/** A setting by its name, else by its earlier alias. */
function setting(name: string, alias: string): { name: string; value: string } | undefined {
  if (process.env[name]) return { name, value: process.env[name]! };
  if (process.env[alias]) return { name: alias, value: process.env[alias]! };
  return undefined;
}

// The operator's account limit instead of the declared one, like the `sandbox` CLI's `--rate-limit`.
const operatorLimit = setting(RATE_LIMIT_ENV, RATE_LIMIT_ENV_ALIAS);
const threads = setting("PAPERCLIP_WASM_THREADS", "PAPERCLIP_CREATEOS_WASM_THREADS");

const plugin = createPlugin({
  poolSize: threads ? Number(threads.value) : undefined,
  testTrapMarker: setting("PAPERCLIP_WASM_TEST_TRAP_MARKER", "PAPERCLIP_CREATEOS_WASM_TEST_TRAP_MARKER")?.value,
  rateLimit: operatorLimit ? parseRateLimit(operatorLimit.value, operatorLimit.name) : undefined,
  secretEnv: parseSecretEnv(process.env[SECRET_ENV_SETTING] ?? ""),
  trustedOrigins: parseTrustedOrigins(process.env[TRUSTED_ORIGINS_SETTING] ?? ""),
});

export default plugin;

runWorker(plugin, import.meta.url);
