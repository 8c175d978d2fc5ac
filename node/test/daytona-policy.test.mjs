// Issue 43 item 4 for the Daytona package, against createos-local's
// Daytona face: the run's adapter picks the snapshot (`snapshotByAdapter`),
// the run's egress grants merged with the base list become the sandbox's
// network settings, a base entry with a port (which Daytona cannot carry)
// is refused by the config's validation before anything is created, and
// the runner ingress is the port's preview URL (as `ws:`: the engine serves
// it over plain http), whose address reaches the sandbox's port with the
// returned headers and only with them. Daytona declares templates (snapshots of a stopped
// sandbox): the package has the custom-image hooks, whose flow runs in
// test/templates.test.mjs.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import { createPlugin } from "../dist/plugin.js";
import { startBackend } from "./support/backend.mjs";
import { freshLedgerPath } from "./support/plugin.mjs";

const daytonaComponent = new URL("../packages/daytona/dist/component/", import.meta.url).href;
const { default: daytonaManifest } = await import("../packages/daytona/dist/manifest.js");
const RUNNER_PORT = 43127;

let backend;
let hooks;
let logs;
before(async () => {
  backend = await startBackend({ toolbox: true, extraArgs: ["--ingress"] });
  const plugin = createPlugin({ poolSize: 2, env: {}, rateLedgerPath: freshLedgerPath(), componentDir: daytonaComponent });
  hooks = plugin.definition;
  const harness = createEnvironmentTestHarness({ manifest: daytonaManifest, environmentDriver: { driverKey: "daytona" } });
  logs = [];
  await hooks.setup({ ...harness.ctx, execution: { log: (stream, chunk) => logs.push({ stream, chunk }) } });
});
after(async () => {
  await hooks?.onShutdown();
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const params = (config = {}) => ({
  driverKey: "daytona",
  companyId: "company-a",
  environmentId: "environment-d",
  config: { apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl, apiKey: backend.key, timeoutMs: 120_000, ...config },
});
const sandbox = async (id) => backend.admin("GET", `/daytona/api/sandbox/${id}`).catch(async () => {
  // The Daytona face's key form is a bearer token.
  const response = await fetch(`${backend.daytonaApiUrl}/sandbox/${id}`, { headers: { authorization: `Bearer ${backend.key}` } });
  return response.json();
});

test("the manifest: runner ingress (ports), the custom-image flow (templates)", () => {
  const [driver] = daytonaManifest.environmentDrivers;
  assert.equal(driver.sandboxCapabilities.runnerWebSocketIngress, true);
  assert.equal(driver.supportsInteractiveSetup, true);
  assert.deepEqual(driver.interactiveSetupConnectionTypes, [], "no SSH connection is offered");
  assert.equal(driver.supportsTemplateCapture, true);
  assert.equal(driver.supportsTemplateDelete, true);
  assert.deepEqual(driver.templateConfigBinding, { field: "template" });
  assert.equal(driver.configSchema.properties.template.type, "string");
  assert.equal(typeof hooks.onEnvironmentRunnerIngressEndpoint, "function");
  for (const hook of ["onEnvironmentStartInteractiveSetup", "onEnvironmentGetInteractiveSetup", "onEnvironmentCaptureTemplate", "onEnvironmentCancelInteractiveSetup", "onEnvironmentDeleteTemplate"]) {
    assert.equal(typeof hooks[hook], "function", hook);
  }
});

test("acquire: the adapter's snapshot and the merged egress become the sandbox's", async () => {
  const config = { snapshot: "plain-snap", snapshotByAdapter: { claude_local: "claude-snap" }, egressAllowlist: ["base.example.com"] };
  const lease = await hooks.onEnvironmentAcquireLease({
    ...params(config),
    runId: `run-${randomUUID()}`,
    adapterType: "claude_local",
    executionWorkspaceSettings: { networkEgress: { allowFqdns: ["api.example.org"], allowCidrs: ["203.0.113.0/24"] } },
  });
  try {
    const made = await sandbox(lease.providerLeaseId);
    assert.equal(made.snapshot, "claude-snap");
    assert.deepEqual(made.domainAllowList?.split(",").sort(), ["api.example.org", "base.example.com"]);
    assert.equal(made.networkAllowList, "203.0.113.0/24");
  } finally {
    await hooks.onEnvironmentDestroyLease({ ...params(config), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

test("a base entry with a port, which Daytona cannot enforce, is refused by validation before anything is created", async () => {
  await backend.clearRequests();
  await assert.rejects(
    hooks.onEnvironmentAcquireLease({
      ...params({ egressAllowlist: ["base.example.com:443"] }),
      runId: `run-${randomUUID()}`,
      executionWorkspaceSettings: { networkEgress: { allowFqdns: ["api.example.org"] } },
    }),
    (error) => {
      assert.equal(error.kind, "invalid-config", error.message);
      assert.match(error.message, /entry 'base\.example\.com:443' names a port/);
      return true;
    },
  );
  const creates = (await backend.requests()).filter((r) => r.method === "POST" && /\/sandbox$/.test(r.path));
  assert.deepEqual(creates, [], "no sandbox was created");
});

test("the runner ingress is the port's preview URL: a request with the returned headers reaches the sandbox's port, one without is refused", async () => {
  const lease = await hooks.onEnvironmentAcquireLease({ ...params(), runId: `run-${randomUUID()}` });
  let running;
  try {
    // A plain HTTP server in the sandbox (python3) that answers with the path it was asked for.
    const server = `import http.server\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        body = ("runner saw " + self.path).encode()\n        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)\nprint("up", flush=True)\nhttp.server.HTTPServer(("127.0.0.1", ${RUNNER_PORT}), H).serve_forever()\n`;
    logs.length = 0;
    running = hooks.onEnvironmentExecute({ ...params(), lease, command: "python3", args: ["-c", server], timeoutMs: 120_000 }).catch((error) => error);
    for (let i = 0; i < 400 && !logs.some((l) => l.chunk.includes("up")); i++) await new Promise((r) => setTimeout(r, 25));
    assert.ok(logs.some((l) => l.chunk.includes("up")), JSON.stringify(logs));
    const path = `/api/runner/v1/connect/run-${randomUUID()}`;
    const endpoint = await hooks.onEnvironmentRunnerIngressEndpoint({ ...params(), lease, port: RUNNER_PORT, path });
    assert.match(endpoint.websocketUrl, /^ws:\/\/127\.0\.0\.1:\d+\/api\/runner\/v1\/connect\/run-/);
    assert.equal(new URL(endpoint.websocketUrl).pathname, path);
    const headers = Object.fromEntries(endpoint.secretHeaders.map((h) => [h.name, h.value]));
    assert.deepEqual(Object.keys(headers).map((n) => n.toLowerCase()), ["x-daytona-preview-token"]);
    // The same address over http reaches the server in the sandbox, and only with the header.
    const http = endpoint.websocketUrl.replace(/^ws:/, "http:");
    const answer = await fetch(http, { headers });
    assert.equal(await answer.text(), `runner saw ${path}`);
    assert.equal((await fetch(http)).status, 401);
  } finally {
    await hooks.onEnvironmentDestroyLease({ ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    await running;
  }
});
