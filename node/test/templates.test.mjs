// Issue 43 item 4: Paperclip's custom-image flow over the component's
// templates (both CreateOS and Daytona declare `templates`), against the
// real createos-local: a setup session is a lease; what the user put in it
// is captured as a template; the reference, written into the config's
// `template` field as Paperclip's binding does, makes the next lease start
// with those files; a paused lease from before the template is expired
// before any request; cancel destroys the setup sandbox; delete removes
// the template. The Daytona package runs the same flow on the engine's
// Daytona face (a template is a snapshot of the stopped setup sandbox).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { startBackend } from "./support/backend.mjs";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import { startPlugin, base, freshLedgerPath, COMPANY } from "./support/plugin.mjs";
import { createPlugin } from "../dist/plugin.js";
import { templateName, takeTemplate } from "../dist/setup-sessions.js";
import manifest from "../dist/manifest.js";

const daytonaComponent = new URL("../packages/daytona/dist/component/", import.meta.url).href;
const { default: daytonaManifest } = await import("../packages/daytona/dist/manifest.js");

let backend;
let plugin;

before(async () => {
  // With the Daytona face's toolbox too (the Daytona package's flow).
  backend = await startBackend({ toolbox: true });
  plugin = await startPlugin();
});

after(async () => {
  await plugin?.stop();
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const params = (overrides = {}) => base(backend, overrides);
const SETUP = (id) => ({ scopeKind: "company", scopeId: COMPANY, namespace: "setup-leases", stateKey: id });
const run = async (lease, script, config) => {
  const result = await plugin.harness.execute({ ...params({ config }), lease, command: "sh", args: ["-c", script] });
  assert.equal(result.exitCode, 0, result.stderr);
  return result.stdout;
};

test("names and the host's template field: a name the contract takes, a field the component never sees", () => {
  const name = templateName(`paperclip-${randomUUID()}-1a2b3c4d`, 1_700_000_000_000);
  assert.match(name, /^paperclip-1a2b3c4d-[0-9a-z]+$/);
  assert.ok(name.length <= 47);
  assert.match(templateName(null), /^paperclip-setup-/);
  assert.deepEqual(takeTemplate({ a: 1, template: "t.x" }), { config: { a: 1 }, template: "t.x" });
  assert.deepEqual(takeTemplate({ a: 1, template: "" }), { config: { a: 1 }, template: undefined });
  assert.throws(() => takeTemplate({ template: "a b" }), (error) => error.kind === "invalid-config");
  assert.equal(manifest.environmentDrivers[0].configSchema.properties.template.type, "string");
});

test("setup, customise, capture, run from the template, cancel, delete", async () => {
  const sessionId = randomUUID();
  const session = await plugin.hooks.onEnvironmentStartInteractiveSetup({ ...params(), sessionId, sourceTemplateRef: null });
  assert.equal(session.status, "waiting_for_user");
  assert.equal(session.connectionSummary, null, "no SSH connection is offered");
  const setupId = session.providerLeaseId;
  const record = plugin.harness.getState(SETUP(setupId));
  assert.equal(record.sessionId, sessionId);
  assert.equal(JSON.stringify(record).includes(backend.key), false, "the record holds no key");
  const got = await plugin.hooks.onEnvironmentGetInteractiveSetup({ ...params(), providerLeaseId: setupId, setupMetadata: {} });
  assert.equal(got.status, "waiting_for_user");

  // The user's customisation, through the setup lease.
  const setupLease = { providerLeaseId: setupId, metadata: record.leaseMetadata };
  await run(setupLease, "mkdir -p /paperclip-workspace/tools && echo customised-$0 > /paperclip-workspace/tools/marker", undefined);
  const captured = await plugin.hooks.onEnvironmentCaptureTemplate({
    ...params(),
    providerLeaseId: setupId,
    setupMetadata: {},
    templateLabel: `paperclip-${randomUUID()}-${sessionId.slice(0, 8)}`,
  });
  assert.equal(captured.templateKind, "provider_template");
  assert.match(captured.metadata.templateName, new RegExp(`^paperclip-${sessionId.slice(0, 8).replace(/-/g, "")}`));

  // Paperclip cancels the session after promoting the template: the setup sandbox goes.
  const cancelled = await plugin.hooks.onEnvironmentCancelInteractiveSetup({ ...params(), providerLeaseId: setupId, setupMetadata: {}, reason: "promoted" });
  assert.equal(cancelled.status, "cancelled");
  assert.equal(plugin.harness.getState(SETUP(setupId)) ?? null, null);
  await assert.rejects(backend.admin("GET", `/v1/sandboxes/${setupId}`), /404/);
  assert.equal((await plugin.hooks.onEnvironmentCancelInteractiveSetup({ ...params(), providerLeaseId: setupId, setupMetadata: {} })).status, "missing");
  assert.equal((await plugin.hooks.onEnvironmentGetInteractiveSetup({ ...params(), providerLeaseId: setupId })).status, "missing");

  // The binding writes the reference into `template`: a run's lease starts with the user's files.
  const config = { template: captured.templateRef, reuseLease: true };
  const validated = await plugin.harness.validateConfig({ driverKey: "createos", config: { ...params({ config }).config } });
  assert.equal(validated.ok, true, JSON.stringify(validated.errors));
  assert.equal(validated.normalizedConfig.template, captured.templateRef, "the host's field survives validation");
  const lease = await plugin.harness.acquireLease({ ...params({ config }), runId: `run-${randomUUID()}` });
  try {
    assert.equal((await run(lease, "cat /paperclip-workspace/tools/marker", config)).trim(), "customised-sh");
    assert.equal(lease.metadata.template, captured.templateRef);
  } finally {
    await plugin.harness.destroyLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }

  // A paused lease from before the template (none) is expired under the new config, with no request.
  const plainConfig = { reuseLease: true };
  const old = await plugin.harness.acquireLease({ ...params({ config: plainConfig }), runId: `run-${randomUUID()}` });
  await plugin.harness.releaseLease({ ...params({ config: plainConfig }), providerLeaseId: old.providerLeaseId, leaseMetadata: old.metadata });
  await backend.clearRequests();
  const resumed = await plugin.harness.resumeLease({ ...params({ config }), providerLeaseId: old.providerLeaseId, leaseMetadata: old.metadata });
  assert.deepEqual(resumed, { providerLeaseId: null, metadata: { expired: true, reason: "the environment's template changed since the lease was acquired" } });
  assert.deepEqual(await backend.requests(), [], "the old sandbox was not woken");
  const same = await plugin.harness.resumeLease({ ...params({ config: plainConfig }), providerLeaseId: old.providerLeaseId, leaseMetadata: old.metadata });
  assert.equal(same.providerLeaseId, old.providerLeaseId, "the unchanged config resumes it");
  await plugin.harness.destroyLease({ ...params({ config: plainConfig }), providerLeaseId: old.providerLeaseId, leaseMetadata: same.metadata });

  // Delete: the template is gone, and a lease can no longer start from it.
  const deleted = await plugin.hooks.onEnvironmentDeleteTemplate({ ...params(), templateRef: captured.templateRef, templateKind: "provider_template" });
  assert.deepEqual(deleted, { deleted: true, metadata: { outcome: "deleted" } });
  const again = await plugin.hooks.onEnvironmentDeleteTemplate({ ...params(), templateRef: captured.templateRef });
  assert.deepEqual(again, { deleted: true, metadata: { outcome: "already-gone" } });
  await assert.rejects(plugin.harness.acquireLease({ ...params({ config }), runId: `run-${randomUUID()}` }));
});

test("a template of another environment is refused before any request; capture of an unknown session sends nothing", async () => {
  await backend.clearRequests();
  await assert.rejects(
    plugin.hooks.onEnvironmentDeleteTemplate({ ...params({ environmentId: "environment-2" }), templateRef: "0123456789abcdef.x" }),
    (error) => error.kind === "invalid-request",
  );
  await assert.rejects(
    plugin.hooks.onEnvironmentCaptureTemplate({ ...params(), providerLeaseId: "sb-unknown", setupMetadata: {} }),
    (error) => error.kind === "invalid-request" && /Start a new setup session/.test(error.message),
  );
  assert.deepEqual(await backend.requests(), []);
});

test("the Daytona package: setup, customise, capture a snapshot, run from it, cancel, delete leaves the run's sandbox alone", async () => {
  const plugin = createPlugin({ poolSize: 2, env: {}, rateLedgerPath: freshLedgerPath(), componentDir: daytonaComponent });
  const hooks = plugin.definition;
  const harness = createEnvironmentTestHarness({ manifest: daytonaManifest, environmentDriver: { driverKey: "daytona" } });
  await hooks.setup({ ...harness.ctx, execution: { log: () => {} } });
  const params = (config = {}) => ({
    driverKey: "daytona",
    companyId: COMPANY,
    environmentId: "environment-d",
    config: { apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl, apiKey: backend.key, timeoutMs: 120_000, ...config },
  });
  const daytona = async (path) => {
    const response = await fetch(`${backend.daytonaApiUrl}${path}`, { headers: { authorization: `Bearer ${backend.key}` } });
    return { status: response.status, body: await response.json() };
  };
  const snapshotNames = async () => (await daytona("/snapshots")).body.items.map((s) => s.name);
  const run = async (lease, script, config) => {
    const result = await hooks.onEnvironmentExecute({ ...params(config), lease, command: "sh", args: ["-c", script], timeoutMs: 60_000 });
    assert.equal(result.exitCode, 0, result.stderr);
    return result.stdout;
  };
  let lease;
  let config;
  try {
    const sessionId = randomUUID();
    const session = await hooks.onEnvironmentStartInteractiveSetup({ ...params(), sessionId, sourceTemplateRef: null });
    assert.equal(session.status, "waiting_for_user");
    const setupId = session.providerLeaseId;
    const record = harness.getState(SETUP(setupId));
    assert.equal(record.sessionId, sessionId);
    assert.equal(JSON.stringify(record).includes(backend.key), false, "the record holds no key");

    // The user's customisation, through the setup lease; then the capture (the provider stops the sandbox first).
    await run({ providerLeaseId: setupId, metadata: record.leaseMetadata }, "mkdir -p /paperclip-workspace/tools && echo customised > /paperclip-workspace/tools/marker");
    const captured = await hooks.onEnvironmentCaptureTemplate({
      ...params(),
      providerLeaseId: setupId,
      setupMetadata: {},
      templateLabel: `paperclip-${randomUUID()}-${sessionId.slice(0, 8)}`,
    });
    assert.equal(captured.templateKind, "provider_template");
    assert.ok((await snapshotNames()).includes(captured.templateRef), "the engine keeps the snapshot");

    // Cancel after promotion: the setup sandbox goes, the snapshot stays.
    const cancelled = await hooks.onEnvironmentCancelInteractiveSetup({ ...params(), providerLeaseId: setupId, setupMetadata: {}, reason: "promoted" });
    assert.equal(cancelled.status, "cancelled");
    assert.equal((await daytona(`/sandbox/${setupId}`)).status, 404);
    assert.ok((await snapshotNames()).includes(captured.templateRef));

    // The binding's `template` field: a run's sandbox starts from the snapshot, with the user's files.
    config = { template: captured.templateRef };
    lease = await hooks.onEnvironmentAcquireLease({ ...params(config), runId: `run-${randomUUID()}` });
    assert.equal(lease.metadata.template, captured.templateRef);
    assert.equal((await daytona(`/sandbox/${lease.providerLeaseId}`)).body.snapshot, captured.templateRef);
    assert.equal((await run(lease, "cat /paperclip-workspace/tools/marker", config)).trim(), "customised");

    // Delete: the snapshot goes, the run's sandbox keeps its files.
    const deleted = await hooks.onEnvironmentDeleteTemplate({ ...params(), templateRef: captured.templateRef, templateKind: "provider_template" });
    assert.deepEqual(deleted, { deleted: true, metadata: { outcome: "deleted" } });
    assert.equal((await snapshotNames()).includes(captured.templateRef), false);
    assert.equal((await run(lease, "cat /paperclip-workspace/tools/marker", config)).trim(), "customised");
    const again = await hooks.onEnvironmentDeleteTemplate({ ...params(), templateRef: captured.templateRef });
    assert.deepEqual(again, { deleted: true, metadata: { outcome: "already-gone" } });
  } finally {
    if (lease) await hooks.onEnvironmentDestroyLease({ ...params(config), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    await hooks.onShutdown();
  }
});
