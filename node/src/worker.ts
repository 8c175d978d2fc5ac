/**
 * The worker entry point Paperclip forks (`paperclipPlugin.worker`): the
 * plugin defined with Paperclip's SDK, served over stdio by the SDK's own
 * JSON-RPC host (`runWorker`). No protocol code of our own.
 */
import { runWorker } from "@paperclipai/plugin-sdk";
import { createPlugin } from "./plugin.js";
import { parseRateLimit, RATE_LIMIT_ENV } from "./rate-ledger.js";

// The operator's account limit instead of the declared one, like the `sandbox` CLI's `--rate-limit`.
const operatorLimit = process.env[RATE_LIMIT_ENV];

const plugin = createPlugin({
  poolSize: process.env.PAPERCLIP_CREATEOS_WASM_THREADS ? Number(process.env.PAPERCLIP_CREATEOS_WASM_THREADS) : undefined,
  testTrapMarker: process.env.PAPERCLIP_CREATEOS_WASM_TEST_TRAP_MARKER || undefined,
  rateLimit: operatorLimit ? parseRateLimit(operatorLimit) : undefined,
});

export default plugin;

runWorker(plugin, import.meta.url);
