// Issue 41 item 4: a packed plugin's worker loads Paperclip's SDK without
// its index (zod and the schemas of @paperclipai/shared, the test harness,
// the dev server: most of a worker's start), and what it runs is still
// the SDK's own `definePlugin` and `runWorker`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";

const PACKAGES = ["createos", "daytona"];

// Run in a fresh Node: records every module loaded while the worker's SDK
// module loads (resolving the index to find its files loads nothing), then
// compares its pieces with the SDK index's.
const probe = (sdkModule) => `
import { registerHooks } from "node:module";
const seen = [];
registerHooks({
  load(url, context, next) {
    seen.push(url);
    return next(url, context);
  },
});
const pieces = await import(${JSON.stringify(sdkModule)});
const before = [...seen];
const index = await import("@paperclipai/plugin-sdk");
console.log(JSON.stringify({
  before,
  same: pieces.definePlugin === index.definePlugin && pieces.runWorker === index.runWorker,
}));
`;

for (const key of PACKAGES) {
  test(`${key}: the worker's SDK pieces are the SDK's own, loaded without its index, zod or @paperclipai/shared`, () => {
    const sdkModule = new URL(`../packages/${key}/dist/sdk.js`, import.meta.url).href;
    const run = spawnSync(process.execPath, ["--input-type=module", "-e", probe(sdkModule)], {
      cwd: new URL("../", import.meta.url),
      encoding: "utf8",
    });
    assert.equal(run.status, 0, run.stderr);
    const { before, same } = JSON.parse(run.stdout.trim().split("\n").pop());
    assert.equal(same, true, "definePlugin and runWorker must be the SDK index's own functions");
    assert.ok(before.some((url) => url.endsWith("/worker-rpc-host.js")), before.join("\n"));
    const heavy = before.filter((url) =>
      /\/plugin-sdk\/dist\/index\.js$|\/node_modules\/zod\/|\/node_modules\/@paperclipai\/shared\//.test(url));
    assert.deepEqual(heavy, [], "loaded at the worker's start");
  });
}
