// The shared scenario table (`scenarios/local-backend-faults.json`, issue 26
// "one policy, two hosts"), run generically: every `execute` scenario, with
// its host rate limit (the operator's limit both hosts are given), the
// server's own limit, config overrides and fault rules, against a fresh
// real createos-local. The Rust host runs the same table in
// `providers/createos/tests/shared_scenarios.rs` with the same expectations, so a rate, 429 or
// deadline decision cannot differ between the hosts without one suite
// failing. (Other operations of the table are run by harness.test.mjs and
// rate-limit.test.mjs.)
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { startBackend } from "./support/backend.mjs";
import { startPlugin, base, COMPANY } from "./support/plugin.mjs";

const TABLE = JSON.parse(readFileSync(new URL("./scenarios/local-backend-faults.json", import.meta.url), "utf8")).scenarios;
const POISON = (id) => ({ scopeKind: "company", scopeId: COMPANY, namespace: "poisoned-leases", stateKey: id });
/** The operator's limit when a scenario names none (the Rust suite's default too). */
const DEFAULT_HOST_LIMIT = { requests: 100, windowMs: 500 };
const PATTERNS = {
  processes: /^\/v1\/sandboxes\/[^/]+\/processes$/,
  connect: /^\/v1\/sandboxes\/[^/]+\/processes\/[^/]+\/connect$/,
  files: /^\/v1\/sandboxes\/[^/]+\/files$/,
};

function statuses(requests, key) {
  const [method, what] = key.split(" ");
  const pattern = PATTERNS[what];
  assert.ok(pattern, `unknown request kind ${what}`);
  return requests.filter((r) => r.method === method && pattern.test(r.path)).map((r) => r.status);
}

/** A provider error's tag from the plugin's thrown error (`kind`, or the cleanup wording). */
function errorTag(error) {
  if (/Cleanup is unconfirmed/.test(error.message)) return "cleanup-failed";
  return error.kind;
}

async function runScenario(scenario) {
  const server = scenario.serverRateLimit ? `${scenario.serverRateLimit.requests}/${scenario.serverRateLimit.windowMs}` : undefined;
  const backend = await startBackend({ rateLimit: server });
  const plugin = await startPlugin({ poolSize: 1, rateLimit: scenario.hostRateLimit ?? DEFAULT_HOST_LIMIT });
  const expect = scenario.expect;
  const params = base(backend, { config: { timeoutMs: 30_000, requestTimeoutMs: 10_000, ...(scenario.config ?? {}) } });
  let lease;
  try {
    lease = await plugin.harness.acquireLease({ ...params, runId: `shared-${scenario.name}` });
    await backend.clearRequests();
    for (const rule of scenario.faults) await backend.addFault(rule);
    const runs = scenario.runs ?? 1;
    for (let i = 0; i < runs; i++) {
      const outcome = await plugin.harness.execute({ ...params, lease, command: "true", ...scenario.command }).then(
        (value) => ({ value }),
        (error) => ({ error }),
      );
      if (expect.ok) {
        assert.ok(!outcome.error, `${scenario.name}: ${outcome.error?.message}`);
        assert.equal(outcome.value.exitCode, 0, scenario.name);
        if (expect.stdout !== undefined) assert.equal(outcome.value.stdout, expect.stdout, `${scenario.name}: stdout`);
      } else {
        assert.ok(outcome.error, `${scenario.name}: expected an error, got ${JSON.stringify(outcome.value)}`);
        if (expect.error) assert.equal(errorTag(outcome.error), expect.error, `${scenario.name}: ${outcome.error.message}`);
        if (expect.treeDeleted !== undefined) assert.equal(outcome.error.data?.outputLost?.treeDeleted, expect.treeDeleted, `${scenario.name}: treeDeleted`);
        if (expect.lostChunks !== undefined) assert.equal(outcome.error.data?.outputLost?.lostChunks, expect.lostChunks, `${scenario.name}: lostChunks`);
        if (expect.partialStdout !== undefined) assert.equal(outcome.error.data?.outputLost?.stdout, expect.partialStdout, `${scenario.name}: output kept`);
        if (expect.error === "output-lost") {
          assert.match(outcome.error.message, /output is incomplete/, scenario.name);
          assert.equal(/may still run/.test(outcome.error.message), !expect.treeDeleted, `${scenario.name}: ${outcome.error.message}`);
        }
        if (expect.phase) assert.match(outcome.error.message, new RegExp(expect.phase === "process-termination" ? "terminating the process tree" : "creating the process"));
      }
    }
    await backend.clearFaults();
    const poisoned = Boolean(plugin.harness.getState(POISON(lease.providerLeaseId)));
    if (expect.poisoned !== undefined) assert.equal(poisoned, expect.poisoned, `${scenario.name}: poisoned`);
    const requests = await backend.requests();
    for (const [key, wanted] of Object.entries(expect.statuses ?? {})) assert.deepEqual(statuses(requests, key), wanted, `${scenario.name}: ${key}`);
    if (expect.throttled !== undefined) assert.equal(requests.filter((r) => r.status === 429).length, expect.throttled, `${scenario.name}: 429s`);
    if (expect.created !== undefined) {
      assert.equal(statuses(requests, "POST processes").filter((s) => s >= 200 && s < 300).length, expect.created, `${scenario.name}: processes created`);
    }
  } finally {
    await plugin.stop();
    if (lease) {
      // Destroyed through a plugin with no budget: a 429's pause in the scenario's budget would hold the DELETE.
      const cleaner = await startPlugin({ poolSize: 1, rateLimit: null });
      await cleaner.harness.destroyLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata }).catch(() => {});
      await cleaner.stop();
    }
    const stopped = await backend.stop();
    assert.match(stopped.stderr, /none survived/, `${scenario.name}: createos-local saw every process tree exit`);
  }
}

for (const scenario of TABLE.filter((s) => s.operation === "execute")) {
  test(`shared scenario ${scenario.name}`, () => runScenario(scenario));
}
