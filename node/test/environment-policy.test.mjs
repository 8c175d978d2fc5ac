// Issue 43 item 4: the acquire carries the run's adapter and egress grants
// (merged with the environment's base list) into contract 0.7.0's
// acquire request, checked against what the real createos-local made; a
// policy the component cannot enforce is refused before anything is
// created; a changed base list or image expires a reusable lease before
// any request reaches the old sandbox.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { startBackend } from "./support/backend.mjs";
import { startPlugin, base } from "./support/plugin.mjs";
import { baseEgress, checkEgressSupported, mergedEgress, runEgressGrants } from "../dist/environment-policy.js";
import { ProviderFailure } from "../dist/mapping.js";

let backend;
let plugin;

before(async () => {
  backend = await startBackend();
  plugin = await startPlugin();
});

after(async () => {
  await plugin?.stop();
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/, "createos-local saw every process tree exit");
});

const params = (overrides = {}) => base(backend, overrides);
/** What the engine holds of a sandbox (read without the plugin). */
const sandbox = async (id) => {
  const answer = await backend.admin("GET", `/v1/sandboxes/${id}`);
  return answer?.data ?? answer;
};
const grants = (allowFqdns, allowCidrs) => ({ networkEgress: { ...(allowFqdns ? { allowFqdns } : {}), ...(allowCidrs ? { allowCidrs } : {}) } });

test("the merge: base list then grants without repeats; no grants, no policy; a base of everything stays everything", () => {
  assert.equal(mergedEgress({}, null), undefined);
  assert.equal(mergedEgress({ egressAllowlist: ["a.com"] }, {}), undefined, "no grants: the component applies its base list itself");
  assert.equal(mergedEgress({ egressAllowlist: ["a.com"] }, grants([], [])), undefined);
  assert.deepEqual(mergedEgress({}, grants(["api.example.org"])), { tag: "allow", val: ["api.example.org"] });
  assert.deepEqual(mergedEgress({ egressAllowlist: ["a.com", "10.0.0.0/8"] }, grants(["A.com", "b.org"], ["203.0.113.0/24"])), {
    tag: "allow",
    val: ["a.com", "10.0.0.0/8", "b.org", "203.0.113.0/24"],
  });
  assert.deepEqual(mergedEgress({ egressAllowlist: ["*"] }, grants(["b.org"])), { tag: "unrestricted" });
  assert.deepEqual(runEgressGrants(grants(["x.org"], ["198.51.100.0/24"])), ["x.org", "198.51.100.0/24"]);
  assert.throws(() => runEgressGrants({ networkEgress: { allowFqdns: "x.org" } }), /allowFqdns must be a list of strings; nothing was created/);
  assert.throws(() => runEgressGrants({ networkEgress: [] }), /networkEgress must be an object/);
  assert.throws(() => mergedEgress({ egressAllowlist: "a.com" }, grants(["b.org"])), /egressAllowlist must be a list of strings/);
});

test("the base policy a reused lease goes back to", () => {
  assert.deepEqual(baseEgress({}), { tag: "unrestricted" });
  assert.deepEqual(baseEgress({ egressAllowlist: ["*"] }), { tag: "unrestricted" });
  assert.deepEqual(baseEgress({ egressAllowlist: [" a.com "] }), { tag: "allow", val: ["a.com"] });
});

test("a component without egress-policy: grants are refused with a clear message; unrestricted and nothing pass", () => {
  const none = {};
  assert.equal(checkEgressSupported(undefined, none, "Acme"), undefined);
  assert.equal(checkEgressSupported({ tag: "unrestricted" }, none, "Acme"), undefined, "the only policy a host may send without the capability is the default");
  let refusal;
  try {
    checkEgressSupported({ tag: "allow", val: ["b.org"] }, none, "Acme");
  } catch (error) {
    refusal = error;
  }
  assert.ok(refusal instanceof ProviderFailure);
  assert.equal(refusal.kind, "unsupported");
  assert.match(refusal.message, /^Acme cannot enforce an egress policy .* only b\.org; nothing was created\./);
  const policy = { tag: "allow", val: ["b.org"] };
  assert.equal(checkEgressSupported(policy, { egressPolicy: true }, "Acme"), policy);
});

test("acquire sends the merged egress and the run's adapter: the engine's sandbox has exactly them", async () => {
  const config = { egressAllowlist: ["base.example.com"], rootfs: "plain-img", rootfsByAdapter: { claude_local: "claude-img" } };
  const lease = await plugin.harness.acquireLease({
    ...params({ config }),
    runId: `run-${randomUUID()}`,
    adapterType: "claude_local",
    executionWorkspaceSettings: grants(["api.example.org"], ["203.0.113.0/24"]),
  });
  try {
    const made = await sandbox(lease.providerLeaseId);
    assert.deepEqual(made.egress, ["base.example.com", "api.example.org", "203.0.113.0/24"]);
    assert.equal(made.rootfs, "claude-img", "the adapter's image from rootfsByAdapter");
  } finally {
    await plugin.harness.destroyLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }

  // No grants: the base list alone (the component's own reading); another adapter: the config's rootfs.
  const plain = await plugin.harness.acquireLease({ ...params({ config }), runId: `run-${randomUUID()}`, adapterType: "codex_local" });
  try {
    const made = await sandbox(plain.providerLeaseId);
    assert.deepEqual(made.egress, ["base.example.com"]);
    assert.equal(made.rootfs, "plain-img");
  } finally {
    await plugin.harness.destroyLease({ ...params({ config }), providerLeaseId: plain.providerLeaseId, leaseMetadata: plain.metadata });
  }

  // Nothing given: no list at all (the service's default).
  const open = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  try {
    assert.equal((await sandbox(open.providerLeaseId)).egress ?? null, null);
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: open.providerLeaseId, leaseMetadata: open.metadata });
  }
});

test("an adapter type the contract does not allow is refused before any request", async () => {
  await backend.clearRequests();
  await assert.rejects(
    plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}`, adapterType: "bad adapter!" }),
    (error) => error.kind === "invalid-request" && /refused before any API call/.test(error.message),
  );
  assert.deepEqual((await backend.requests()).filter((r) => r.method === "POST"), [], "no sandbox was created");
});

for (const [what, change] of [
  ["the base egress list", { egressAllowlist: ["other.example.com"] }],
  ["the adapter's image", { rootfsByAdapter: { claude_local: "claude-img-2" } }],
]) {
  test(`a change of ${what} expires a reusable lease before any request to the old sandbox`, async () => {
    const config = { reuseLease: true, egressAllowlist: ["base.example.com"], rootfsByAdapter: { claude_local: "claude-img" } };
    const lease = await plugin.harness.acquireLease({
      ...params({ config }),
      runId: `run-${randomUUID()}`,
      adapterType: "claude_local",
      executionWorkspaceSettings: grants(["api.example.org"]),
    });
    const receipt = await plugin.harness.releaseLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    assert.equal(receipt.state, "stopped", "paused for reuse");
    const changed = { ...config, ...change };
    await backend.clearRequests();
    const resumed = await plugin.harness.resumeLease({ ...params({ config: changed }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    assert.equal(resumed.providerLeaseId, null);
    assert.equal(resumed.metadata?.expired, true);
    const touched = (await backend.requests()).filter((r) => r.path.includes(lease.providerLeaseId));
    assert.deepEqual(touched, [], "the old sandbox got no request (not woken)");
    // The same config resumes it; the acquiring run's grants (task-scoped) do not outlive it: back to the base list.
    assert.deepEqual((await sandbox(lease.providerLeaseId)).egress, ["base.example.com", "api.example.org"]);
    assert.equal(lease.metadata.runEgressGrants, true);
    const again = await plugin.harness.resumeLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    assert.equal(again.providerLeaseId, lease.providerLeaseId);
    assert.deepEqual((await sandbox(lease.providerLeaseId)).egress, ["base.example.com"]);
    assert.equal(again.metadata.runEgressGrants, undefined);
    await plugin.harness.destroyLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: again.metadata });
  });
}

test("a reused lease whose environment has no base list goes back to the service's default", async () => {
  const config = { reuseLease: true };
  const lease = await plugin.harness.acquireLease({ ...params({ config }), runId: `run-${randomUUID()}`, executionWorkspaceSettings: grants(["api.example.org"]) });
  assert.deepEqual((await sandbox(lease.providerLeaseId)).egress, ["api.example.org"], "the run got exactly its grants");
  await plugin.harness.releaseLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  const again = await plugin.harness.resumeLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(again.providerLeaseId, lease.providerLeaseId);
  const egress = (await sandbox(lease.providerLeaseId)).egress ?? [];
  assert.deepEqual(egress, [], "no list: the service's default");
  await plugin.harness.destroyLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: again.metadata });
});

test("autoPauseAfterSeconds: a released reusable lease is left to the service's idle pause, and resumes", async () => {
  const config = { reuseLease: true, autoPauseAfterSeconds: 60 };
  const lease = await plugin.harness.acquireLease({ ...params({ config }), runId: `run-${randomUUID()}` });
  assert.equal((await sandbox(lease.providerLeaseId)).auto_pause_after_seconds, 60);
  // A service the run left in the background: it runs on after the release.
  const started = await plugin.harness.execute({ ...params({ config }), lease, command: "sh", args: ["-c", "nohup sleep 612 >/dev/null 2>&1 &"] });
  assert.equal(started.exitCode, 0);
  const receipt = await plugin.harness.releaseLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  // Paperclip reads a receipt as "execution has ended" (and lets the run
  // continue on it): none is given while the background sleep may run.
  assert.equal(receipt, undefined, "no termination receipt for a sandbox left running");
  assert.equal((await sandbox(lease.providerLeaseId)).status, "running", "left running until idle");
  const again = await plugin.harness.resumeLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(again.providerLeaseId, lease.providerLeaseId);
  const ran = await plugin.harness.execute({ ...params({ config }), lease: again, command: "sh", args: ["-c", "pgrep -f '^sleep 612$' >/dev/null && echo still here"] });
  assert.equal(ran.stdout, "still here\n", "the background sleep ran on through the release");
  await plugin.harness.destroyLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: again.metadata });
});
