/**
 * The two pieces of Paperclip's SDK the worker runs (`definePlugin`, and
 * `runWorker`, its JSON-RPC host over stdio), loaded from their own files
 * instead of the SDK's index. The index also loads the SDK's test harness,
 * dev server and bundler presets, and with them `zod` and every schema of
 * `@paperclipai/shared`: 300-450 ms of each worker's start on 2 cores
 * (importing the index alone), against about 40 ms for these two files
 * and the protocol module they share with `@paperclipai/plugin-sdk/protocol`
 * (BENCHMARKS.md, "Worker start under Paperclip's worker manager", issue 41
 * item 4). Same SDK, same code: only what is never called is not loaded.
 *
 * The two files are not in the SDK's `exports` map, so they are found
 * beside the index (`import.meta.resolve`, which loads nothing); the
 * package pins the SDK's version (npm-shrinkwrap.json), and a layout without
 * them falls back to the index, so a change there costs start time, never
 * the worker.
 */
import type * as Sdk from "@paperclipai/plugin-sdk";

interface Pieces {
  definePlugin: typeof Sdk.definePlugin;
  runWorker: typeof Sdk.runWorker;
}

async function load(): Promise<Pieces> {
  const index = import.meta.resolve("@paperclipai/plugin-sdk");
  try {
    const [{ definePlugin }, { runWorker }] = await Promise.all([
      import(new URL("./define-plugin.js", index).href),
      import(new URL("./worker-rpc-host.js", index).href),
    ]);
    if (typeof definePlugin === "function" && typeof runWorker === "function") {
      return { definePlugin, runWorker };
    }
  } catch {
    // Another layout of the SDK: its index has both.
  }
  const sdk = await import("@paperclipai/plugin-sdk");
  return { definePlugin: sdk.definePlugin, runWorker: sdk.runWorker };
}

export const { definePlugin, runWorker } = await load();
