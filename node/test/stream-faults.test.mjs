// Issue 26 ("stream failures are transport errors"): a response body that
// breaks off in the Node host reaches the component as a `wasi:http` error
// code, never as a plain Error, so the component reconnects (or cleans up)
// exactly as it does under wasmtime. Against the real createos-local with
// its fault rules (`reset_after_frames`: /connect sends some frames, then
// the connection is aborted mid-body).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { startBackend } from "./support/backend.mjs";
import { startPlugin, base, COMPANY } from "./support/plugin.mjs";
import { isErrorCode, streamFailureCode } from "../dist/outgoing-handler.js";

const SCENARIOS = Object.fromEntries(
  JSON.parse(readFileSync(new URL("./scenarios/local-backend-faults.json", import.meta.url), "utf8")).scenarios.map((s) => [s.name, s]),
);
const POISON = (id) => ({ scopeKind: "company", scopeId: COMPANY, namespace: "poisoned-leases", stateKey: id });

let backend;
let plugin;

before(async () => {
  backend = await startBackend();
  plugin = await startPlugin({ poolSize: 1 });
});

after(async () => {
  await plugin?.stop();
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/, "createos-local saw every process tree exit");
});

const params = (overrides = {}) => base(backend, overrides);

async function withFaults(rules, body) {
  await backend.clearFaults();
  for (const rule of rules) await backend.addFault(rule);
  try {
    return await body();
  } finally {
    await backend.clearFaults();
  }
}

/**
 * Pins issue 26 point 1: the server aborts /connect after two frames (a
 * reconnect the protocol expects). Before, the shim's plain `Error:
 * aborted` reached jco as an `ErrorCode`, the component trapped and the
 * lease was poisoned. Now the component reconnects from its cursor: the
 * command completes, every line arrives once (result and live log alike),
 * nothing is poisoned and the lease keeps working.
 */
test("a /connect aborted mid-stream is reconnected: the command completes, no output is doubled, nothing is poisoned", async () => {
  const scenario = SCENARIOS["execute-connect-reset"];
  const lease = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  try {
    await backend.clearRequests();
    plugin.logs.length = 0;
    const result = await withFaults(scenario.faults, () => plugin.harness.execute({ ...params(), lease, ...scenario.command }));
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, scenario.expect.stdout, "every line once, in order");
    const live = plugin.logs.filter((l) => l.stream === "stdout").map((l) => l.chunk).join("");
    assert.equal(live, scenario.expect.stdout, "the live log has every line once, in order");
    const connects = (await backend.requests()).filter((r) => r.method === "GET" && /\/connect$/.test(r.path));
    assert.ok(connects.length >= 2, `the component reconnected (${connects.length} /connect requests)`);
    assert.equal(plugin.harness.getState(POISON(lease.providerLeaseId)), undefined, "the lease is not poisoned");
    const after = await plugin.harness.execute({ ...params(), lease, command: "echo", args: ["still here"] });
    assert.equal(after.stdout, "still here\n", "the lease still works");
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

/**
 * Every /connect aborted: the component gives up after its reconnect
 * budget with a typed error (not a trap), cleans up the process tree, and
 * the lease is not poisoned when the cleanup was confirmed.
 */
test("a /connect that always breaks off ends in a typed error with the process cleaned up, not a trap", async () => {
  const lease = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  try {
    const rules = [{ method: "GET", path: "/v1/sandboxes/*/processes/*/connect", action: { kind: "reset_after_frames", frames: 0 }, times: "always" }];
    const error = await withFaults(rules, () =>
      plugin.harness.execute({ ...params(), lease, command: "sh", args: ["-c", "echo start; sleep 30"], timeoutMs: 20_000 }).then(
        () => null,
        (e) => e,
      ),
    );
    assert.ok(error, "the command failed");
    assert.doesNotMatch(error.message, /trapped|failed during execute|instance was replaced|invalid variant/, error.message);
    const poison = plugin.harness.getState(POISON(lease.providerLeaseId));
    if (poison) assert.match(error.message, /unconfirmed/, "poisoned only when cleanup is unconfirmed");
    else {
      const after = await plugin.harness.execute({ ...params(), lease, command: "echo", args: ["ok"] });
      assert.equal(after.stdout, "ok\n");
    }
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

/** The mapping itself: whatever the shim caught, the component gets an `error-code` jco can lower. */
test("every stream failure the shim can report maps to a wasi:http error code", () => {
  const failures = [
    new Error("aborted"),
    Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }),
    Object.assign(new Error("write EPIPE"), { code: "EPIPE" }),
    { code: "ETIMEDOUT", message: "timed out" },
    { code: "HPE_INVALID_CHUNK_SIZE" },
    undefined,
    null,
    "text",
    42,
  ];
  for (const failure of failures) assert.ok(isErrorCode(streamFailureCode(failure)), String(failure));
  assert.deepEqual(streamFailureCode(new Error("aborted")), { tag: "HTTP-response-incomplete" });
  assert.deepEqual(streamFailureCode(Object.assign(new Error("x"), { code: "ECONNRESET" })), { tag: "connection-terminated" });
  assert.deepEqual(streamFailureCode({ code: "ETIMEDOUT" }), { tag: "connection-read-timeout" });
  const typed = { tag: "HTTP-response-body-size", val: 5n };
  assert.equal(streamFailureCode(typed), typed, "a real error code passes through unchanged");
});
