// Issue 43 item 4: the manifest declares `concurrentSyncOperations` only
// because this holds: a sync-in and a sync-out of several MiB each, run at
// the same time on one lease, both arrive byte-exact. Against the real
// createos-local, with two provider threads so the two calls really run at
// once (a timing proxy in front of the engine sees their file requests
// arrive interleaved).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { startBackend, startTimingProxy } from "./support/backend.mjs";
import { startPlugin, base } from "./support/plugin.mjs";
import manifest from "../dist/manifest.js";

const FILES = 6;
const FILE_BYTES = 1024 * 1024 + 17;

let backend;
let proxy;
let plugin;
let root;

before(async () => {
  backend = await startBackend();
  // Arrival times of the requests, seen from outside the plugin.
  proxy = await startTimingProxy(backend.url);
  plugin = await startPlugin({ poolSize: 2 });
  root = await mkdtemp(path.join(tmpdir(), "concurrent-sync-"));
});

after(async () => {
  await plugin?.stop();
  await proxy?.stop();
  await rm(root, { recursive: true, force: true });
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const params = (overrides = {}) => base({ ...backend, url: proxy.url }, overrides);

/** A directory of `FILES` random files; their bytes by name. */
async function randomTree(name) {
  const dir = path.join(root, name);
  await mkdir(dir, { recursive: true });
  const contents = {};
  for (let i = 0; i < FILES; i++) {
    const bytes = randomBytes(FILE_BYTES);
    contents[`f${i}.bin`] = bytes;
    await writeFile(path.join(dir, `f${i}.bin`), bytes);
  }
  return { dir, contents };
}

async function sameTree(dir, contents) {
  assert.deepEqual((await readdir(dir)).sort(), Object.keys(contents).sort());
  for (const [name, bytes] of Object.entries(contents)) {
    const got = await readFile(path.join(dir, name));
    assert.ok(got.equals(bytes), `${name}: ${got.length} bytes, byte-exact`);
  }
}

test("the CreateOS component declares concurrent-sync, so the manifest declares concurrentSyncOperations", () => {
  assert.equal(manifest.environmentDrivers[0].sandboxCapabilities.concurrentSyncOperations, true);
});

test("a sync-in and a sync-out of several MiB overlap on one lease, both byte-exact", async () => {
  const incoming = await randomTree("in");
  const outgoing = await randomTree("out-src");
  const lease = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  const sandboxId = lease.providerLeaseId;
  try {
    const sync = (hook, operations) => plugin.hooks[hook]({ ...params(), lease, operations });
    // What the sync-out will read, put there first.
    await sync("onEnvironmentSyncIn", [{ operationId: "seed", files: [{ sourcePath: outgoing.dir, targetPath: "/paperclip-workspace/out", kind: "directory" }] }]);
    // Both provider threads running before the overlap.
    await Promise.all([1, 2].map(() => plugin.harness.execute({ ...params(), lease, command: "true" })));
    const started = performance.timeOrigin + performance.now();
    const back = path.join(root, "out-back");
    const [syncedIn, syncedOut] = await Promise.all([
      sync("onEnvironmentSyncIn", [{ operationId: "in", files: [{ sourcePath: incoming.dir, targetPath: "/paperclip-workspace/in", kind: "directory" }] }]),
      sync("onEnvironmentSyncOut", [{ operationId: "out", files: [{ sourcePath: "/paperclip-workspace/out", targetPath: back, kind: "directory" }] }]),
    ]);
    assert.deepEqual(syncedIn.operations, [{ operationId: "in", filesTransferred: FILES, bytesTransferred: FILES * FILE_BYTES }]);
    assert.equal(syncedOut.operations[0].filesTransferred, FILES);
    assert.equal(syncedOut.operations[0].bytesTransferred, FILES * FILE_BYTES);

    // They did overlap: a sync-out read arrived between the sync-in's first and last upload, or the other way round.
    const files = proxy.arrivals.filter((r) => r.path.startsWith(`/v1/sandboxes/${sandboxId}/files`) && r.at >= started);
    const puts = files.filter((r) => r.method === "PUT").map((r) => r.at);
    const gets = files.filter((r) => r.method === "GET").map((r) => r.at);
    assert.ok(puts.length >= FILES && gets.length >= FILES, JSON.stringify(files.map((r) => r.method)));
    const within = (times, [first, last]) => times.some((at) => at > first && at < last);
    const interleaved = within(gets, [Math.min(...puts), Math.max(...puts)]) || within(puts, [Math.min(...gets), Math.max(...gets)]);
    assert.ok(interleaved, `the file requests interleave: ${files.map((r) => `${r.method}@${Math.round(r.at - started)}`).join(" ")}`);

    // Byte-exact both ways: the sync-out on the host, the sync-in read back from the sandbox.
    await sameTree(back, outgoing.contents);
    const readBack = path.join(root, "in-back");
    await sync("onEnvironmentSyncOut", [{ operationId: "check", files: [{ sourcePath: "/paperclip-workspace/in", targetPath: readBack, kind: "directory" }] }]);
    await sameTree(readBack, incoming.contents);
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: sandboxId, leaseMetadata: lease.metadata });
  }
});
