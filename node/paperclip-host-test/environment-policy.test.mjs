// Issue 43 items 4 and 7: the contract 0.7.0 hooks of the packed CreateOS
// plugin driven by Paperclip's own worker manager (createPluginWorkerHandle
// from @paperclipai/server) over JSON-RPC, against the real createos-local:
// the methods the worker reports, an acquire with the run's adapter and
// egress grants, a sync-in and a sync-out in flight at once on one lease
// (byte-exact), the runner ingress, and the custom-image flow; then the
// same for the packed Daytona plugin against the engine's Daytona face
// (no concurrent sync: Daytona does not claim it).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createPluginWorkerHandle } from "./node_modules/@paperclipai/server/dist/services/plugin-worker-manager.js";
import { INTERACTIVE_SETUP_WORKER_METHODS, TEMPLATE_CAPTURE_WORKER_METHODS, TEMPLATE_DELETE_WORKER_METHODS } from "./node_modules/@paperclipai/server/dist/services/plugin-environment-driver.js";
import manifest from "../packages/createos/dist/manifest.js";
import daytonaManifest from "../packages/daytona/dist/manifest.js";
import { startBackend } from "../test/support/backend.mjs";

const WORKER = fileURLToPath(new URL("../packages/createos/dist/worker.js", import.meta.url));
const DAYTONA_WORKER = fileURLToPath(new URL("../packages/daytona/dist/worker.js", import.meta.url));
const ROOT = mkdtempSync(path.join(tmpdir(), "host-policy-"));
const LEDGER = path.join(ROOT, "rate-budget.sqlite");
const COMPANY = "company-host";
const ENVIRONMENT = "environment-host";

const store = new Map();
const stateKey = (p) => `${p.scopeKind}|${p.scopeId ?? ""}|${p.namespace ?? "default"}|${p.stateKey}`;
const hostHandlers = {
  "state.get": async (params) => (store.has(stateKey(params)) ? store.get(stateKey(params)) : null),
  "state.set": async (params) => void store.set(stateKey(params), params.value),
  "state.delete": async (params) => void store.delete(stateKey(params)),
};

let backend;
let handle;
let daytonaHandle;

const startWorker = async (pluginManifest, entrypointPath, ledger) => {
  const worker = createPluginWorkerHandle(pluginManifest.id, {
    entrypointPath,
    manifest: pluginManifest,
    config: {},
    instanceInfo: { instanceId: `test-${randomUUID()}`, hostVersion: "2026.916.1" },
    apiVersion: 1,
    hostHandlers,
    autoRestart: false,
    env: { PAPERCLIP_WASM_THREADS: "2", PAPERCLIP_WASM_RATE_LEDGER: ledger },
  });
  await worker.start();
  return worker;
};

before(async () => {
  backend = await startBackend({ toolbox: true, extraArgs: ["--ingress"] });
  handle = await startWorker(manifest, WORKER, LEDGER);
  daytonaHandle = await startWorker(daytonaManifest, DAYTONA_WORKER, path.join(ROOT, "daytona-rate-budget.sqlite"));
});

after(async () => {
  await handle?.stop().catch(() => {});
  await daytonaHandle?.stop().catch(() => {});
  rmSync(ROOT, { recursive: true, force: true });
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const params = (config = {}) => ({
  driverKey: "createos",
  companyId: COMPANY,
  environmentId: ENVIRONMENT,
  config: { apiUrl: backend.url, apiKey: backend.key, timeoutMs: 60_000, ...config },
});
const sandbox = async (id) => {
  const answer = await backend.admin("GET", `/v1/sandboxes/${id}`);
  return answer?.data ?? answer;
};

test("the worker reports every method Paperclip's gates ask for, as the manifest declares them", () => {
  const methods = new Set(handle.supportedMethods);
  const [driver] = manifest.environmentDrivers;
  assert.equal(driver.sandboxCapabilities.concurrentSyncOperations, true);
  assert.equal(driver.sandboxCapabilities.runnerWebSocketIngress, true);
  assert.ok(methods.has("environmentSyncIn") && methods.has("environmentSyncOut"));
  assert.ok(methods.has("environmentRunnerIngressEndpoint"));
  for (const method of [...INTERACTIVE_SETUP_WORKER_METHODS, ...TEMPLATE_CAPTURE_WORKER_METHODS, ...TEMPLATE_DELETE_WORKER_METHODS]) {
    assert.ok(methods.has(method), method);
  }
});

test("acquire over JSON-RPC: the run's adapter and egress grants reach the sandbox; overlapping syncs stay byte-exact", async () => {
  const config = { egressAllowlist: ["base.example.com"], rootfsByAdapter: { claude_local: "claude-img" } };
  const lease = await handle.call("environmentAcquireLease", {
    ...params(config),
    runId: `run-${randomUUID()}`,
    adapterType: "claude_local",
    executionWorkspaceSettings: { networkEgress: { allowFqdns: ["api.example.org"], allowCidrs: ["203.0.113.0/24"] } },
  });
  try {
    const made = await sandbox(lease.providerLeaseId);
    assert.deepEqual(made.egress, ["base.example.com", "api.example.org", "203.0.113.0/24"]);
    assert.equal(made.rootfs, "claude-img");

    const up = path.join(ROOT, "up");
    const down = path.join(ROOT, "down-src");
    mkdirSync(up);
    mkdirSync(down);
    const upBytes = randomBytes(4 * 1024 * 1024 + 3);
    const downBytes = randomBytes(4 * 1024 * 1024 + 5);
    writeFileSync(path.join(up, "a.bin"), upBytes);
    writeFileSync(path.join(down, "b.bin"), downBytes);
    const sync = (method, operations) => handle.call(method, { ...params(config), lease, operations });
    await sync("environmentSyncIn", [{ operationId: "seed", files: [{ sourcePath: down, targetPath: "/paperclip-workspace/down", kind: "directory" }] }]);
    const back = path.join(ROOT, "down-back");
    await Promise.all([
      sync("environmentSyncIn", [{ operationId: "in", files: [{ sourcePath: up, targetPath: "/paperclip-workspace/up", kind: "directory" }] }]),
      sync("environmentSyncOut", [{ operationId: "out", files: [{ sourcePath: "/paperclip-workspace/down", targetPath: back, kind: "directory" }] }]),
    ]);
    assert.ok(readFileSync(path.join(back, "b.bin")).equals(downBytes));
    const check = path.join(ROOT, "up-back");
    await sync("environmentSyncOut", [{ operationId: "check", files: [{ sourcePath: "/paperclip-workspace/up", targetPath: check, kind: "directory" }] }]);
    assert.ok(readFileSync(path.join(check, "a.bin")).equals(upBytes));
  } finally {
    await handle.call("environmentDestroyLease", { ...params(config), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

test("runner ingress over JSON-RPC: the engine's port URL as ws (Paperclip's server wants wss and would refuse it)", async () => {
  const config = { ingress: true };
  const lease = await handle.call("environmentAcquireLease", { ...params(config), runId: `run-${randomUUID()}` });
  try {
    const path = "/api/runner/v1/connect/run-1";
    const endpoint = await handle.call("environmentRunnerIngressEndpoint", { ...params(config), lease, port: 43127, path });
    assert.equal(endpoint.kind, "authenticated_websocket");
    const url = new URL(endpoint.websocketUrl);
    assert.equal(url.protocol, "ws:", "the engine serves ports over plain http on loopback");
    assert.equal(url.pathname, path);
    assert.equal(endpoint.secretHeaders.length, 1);
    assert.ok(endpoint.generation);
  } finally {
    await handle.call("environmentDestroyLease", { ...params(config), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

test("the custom-image flow over JSON-RPC: start, capture, cancel, a lease from the template, delete", async () => {
  const sessionId = randomUUID();
  const session = await handle.call("environmentStartInteractiveSetup", { ...params(), sessionId, sourceTemplateRef: null });
  assert.equal(session.status, "waiting_for_user");
  const captured = await handle.call("environmentCaptureTemplate", {
    ...params(),
    providerLeaseId: session.providerLeaseId,
    setupMetadata: {},
    templateLabel: `paperclip-${ENVIRONMENT}-${sessionId.slice(0, 8)}`,
  });
  assert.equal(captured.templateKind, "provider_template");
  assert.equal((await handle.call("environmentCancelInteractiveSetup", { ...params(), providerLeaseId: session.providerLeaseId, reason: "promoted" })).status, "cancelled");
  const lease = await handle.call("environmentAcquireLease", { ...params({ template: captured.templateRef }), runId: `run-${randomUUID()}` });
  assert.equal(lease.metadata.template, captured.templateRef);
  await handle.call("environmentDestroyLease", { ...params({ template: captured.templateRef }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal((await handle.call("environmentDeleteTemplate", { ...params(), templateRef: captured.templateRef })).deleted, true);
});

const daytonaParams = (config = {}) => ({
  driverKey: "daytona",
  companyId: COMPANY,
  environmentId: ENVIRONMENT,
  config: { apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl, apiKey: backend.key, timeoutMs: 120_000, ...config },
});
const daytonaSandbox = async (id) => {
  const response = await fetch(`${backend.daytonaApiUrl}/sandbox/${id}`, { headers: { authorization: `Bearer ${backend.key}` } });
  assert.equal(response.status, 200, `GET sandbox ${id}`);
  return response.json();
};

test("Daytona: the worker reports the methods Paperclip's gates ask for, as its manifest declares them", () => {
  const methods = new Set(daytonaHandle.supportedMethods);
  const [driver] = daytonaManifest.environmentDrivers;
  assert.equal(driver.sandboxCapabilities.runnerWebSocketIngress, true);
  assert.equal(driver.supportsTemplateCapture, true);
  assert.ok(methods.has("environmentRunnerIngressEndpoint"));
  for (const method of [...INTERACTIVE_SETUP_WORKER_METHODS, ...TEMPLATE_CAPTURE_WORKER_METHODS, ...TEMPLATE_DELETE_WORKER_METHODS]) {
    assert.ok(methods.has(method), method);
  }
});

test("Daytona acquire over JSON-RPC: the run's adapter picks the snapshot, its egress grants join the base list", async () => {
  const config = { snapshot: "plain-snap", snapshotByAdapter: { claude_local: "claude-snap" }, egressAllowlist: ["base.example.com"] };
  const lease = await daytonaHandle.call("environmentAcquireLease", {
    ...daytonaParams(config),
    runId: `run-${randomUUID()}`,
    adapterType: "claude_local",
    executionWorkspaceSettings: { networkEgress: { allowFqdns: ["api.example.org"], allowCidrs: ["203.0.113.0/24"] } },
  });
  try {
    const made = await daytonaSandbox(lease.providerLeaseId);
    assert.equal(made.snapshot, "claude-snap");
    assert.deepEqual(made.domainAllowList?.split(",").sort(), ["api.example.org", "base.example.com"]);
    assert.equal(made.networkAllowList, "203.0.113.0/24");
  } finally {
    await daytonaHandle.call("environmentDestroyLease", { ...daytonaParams(config), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

test("Daytona runner ingress over JSON-RPC: the port's preview URL as ws, with its token header", async () => {
  const lease = await daytonaHandle.call("environmentAcquireLease", { ...daytonaParams(), runId: `run-${randomUUID()}` });
  try {
    const path = "/api/runner/v1/connect/run-1";
    const endpoint = await daytonaHandle.call("environmentRunnerIngressEndpoint", { ...daytonaParams(), lease, port: 43127, path });
    assert.equal(endpoint.kind, "authenticated_websocket");
    const url = new URL(endpoint.websocketUrl);
    assert.equal(url.protocol, "ws:", "the engine serves preview URLs over plain http on loopback");
    assert.equal(url.pathname, path);
    assert.deepEqual(endpoint.secretHeaders.map((h) => h.name.toLowerCase()), ["x-daytona-preview-token"]);
  } finally {
    await daytonaHandle.call("environmentDestroyLease", { ...daytonaParams(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

test("the Daytona custom-image flow over JSON-RPC: a setup file reaches a lease made from the captured snapshot, deleting the template leaves that lease alone", async () => {
  const sessionId = randomUUID();
  const session = await daytonaHandle.call("environmentStartInteractiveSetup", { ...daytonaParams(), sessionId, sourceTemplateRef: null });
  assert.equal(session.status, "waiting_for_user");
  // The setup lease's metadata, as the worker kept it in Paperclip's state store.
  const record = store.get(stateKey({ scopeKind: "company", scopeId: COMPANY, namespace: "setup-leases", stateKey: session.providerLeaseId }));
  assert.ok(record?.leaseMetadata, "the worker recorded the setup lease");
  const setupLease = { providerLeaseId: session.providerLeaseId, metadata: record.leaseMetadata };
  const wrote = await daytonaHandle.call("environmentExecute", { ...daytonaParams(), lease: setupLease, command: "sh", args: ["-c", "mkdir -p /paperclip-workspace/tools && echo from-setup > /paperclip-workspace/tools/marker"] }, 60_000);
  assert.equal(wrote.exitCode, 0, JSON.stringify(wrote));
  const captured = await daytonaHandle.call("environmentCaptureTemplate", {
    ...daytonaParams(),
    providerLeaseId: session.providerLeaseId,
    setupMetadata: {},
    templateLabel: `paperclip-${ENVIRONMENT}-${sessionId.slice(0, 8)}`,
  });
  assert.equal(captured.templateKind, "provider_template");
  assert.equal((await daytonaHandle.call("environmentCancelInteractiveSetup", { ...daytonaParams(), providerLeaseId: session.providerLeaseId, reason: "promoted" })).status, "cancelled");
  const config = { template: captured.templateRef };
  const lease = await daytonaHandle.call("environmentAcquireLease", { ...daytonaParams(config), runId: `run-${randomUUID()}` });
  try {
    assert.equal(lease.metadata.template, captured.templateRef);
    const read = async () => (await daytonaHandle.call("environmentExecute", { ...daytonaParams(config), lease, command: "cat", args: ["/paperclip-workspace/tools/marker"] }, 60_000)).stdout;
    assert.equal(await read(), "from-setup\n");
    assert.equal((await daytonaHandle.call("environmentDeleteTemplate", { ...daytonaParams(), templateRef: captured.templateRef })).deleted, true);
    assert.equal(await read(), "from-setup\n", "the lease keeps its copy");
  } finally {
    await daytonaHandle.call("environmentDestroyLease", { ...daytonaParams(config), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});
