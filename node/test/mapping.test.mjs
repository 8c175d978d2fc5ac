// Table-driven test of src/mapping.ts: every provider-error case, every
// receipt action and the resume outcomes, as Paperclip receives them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PLUGIN_RPC_ERROR_CODES } from "@paperclipai/plugin-sdk";
import {
  COMPONENT_LEASE_KEY,
  toExecuteRequest,
  toExecuteResult,
  toFailure,
  toPaperclipLease,
  toReceipt,
  toResumeResult,
  toWitLease,
} from "../dist/mapping.js";

const KEY = "canary-key-0123456789";
const partial = { stdout: "abc", stderr: "de", timedOut: true, outputTruncated: false };

/** [name, provider-error, operation, expected message pattern, consequence, data] */
const ERROR_CASES = [
  ["invalid-config", { tag: "invalid-config", val: ["shape: must not be empty", "timeoutMs: must be positive"] }, "validate", /config is invalid: shape: must not be empty; timeoutMs/, "none"],
  ["invalid-request", { tag: "invalid-request", val: "env name 1X is invalid" }, "execute", /refused before any API call: env name 1X/, "none"],
  ["foreign-lease", { tag: "foreign-lease", val: "the lease belongs to another environment" }, "execute", /does not belong to this environment/, "none"],
  ["unsupported", { tag: "unsupported", val: "requested-expires-at" }, "acquire", /cannot do this: requested-expires-at/, "none"],
  ["api-rejected", { tag: "api-rejected", val: { operation: "create-sandbox", status: 401 } }, "acquire", /rejected create-sandbox with HTTP 401; nothing is left running/, "none"],
  ["transport denied", { tag: "transport-failed", val: { operation: "get-sandbox", kind: "denied", detail: "HTTP-request-denied" } }, "resume", /host refused the request \(only the configured API origin.*never left this machine; nothing was created\.$/, "none"],
  ["transport connection", { tag: "transport-failed", val: { operation: "get-sandbox", kind: "connection", detail: "connection refused" } }, "resume", /connection failure: connection refused; nothing is left running/, "none"],
  ["transport deadline", { tag: "transport-failed", val: { operation: "pause", kind: "deadline", detail: "" } }, "release", /deadline passed/, "none"],
  ["invalid-response", { tag: "invalid-response", val: { operation: "connect", reason: "sequence gap" } }, "execute", /answered connect with something invalid: sequence gap/, "none"],
  ["cancelled", { tag: "cancelled", val: undefined }, "execute", /execute was cancelled; its cleanup completed\.$/, "none"],
  ["cancelled with partial output", { tag: "cancelled", val: partial }, "execute", /execute was cancelled; its cleanup completed\. The command printed 3 characters of stdout and 2 of stderr.*reached its timeout/, "none"],
  ["transport unreachable", { tag: "transport-failed", val: { operation: "create-sandbox", kind: "unreachable", detail: "connection refused" } }, "acquire", /could not be reached \(connection refused\), so the request never got there; nothing was created\.$/, "none"],
  ["api-rejected with partial output", { tag: "api-rejected", val: { operation: "connect", status: 500, partial } }, "execute", /rejected connect with HTTP 500; nothing is left running\. The command printed 3 characters of stdout/, "none"],
  ["transport connection with partial output", { tag: "transport-failed", val: { operation: "connect", kind: "connection", detail: "reset", partial } }, "execute", /connection failure: reset; nothing is left running\. The command printed 3 characters/, "none"],
  ["invalid-response with partial output", { tag: "invalid-response", val: { operation: "connect", reason: "sequence gap", partial } }, "execute", /something invalid: sequence gap\. The command printed 3 characters of stdout/, "none"],
  [
    "cleanup-failed termination",
    { tag: "cleanup-failed", val: { sandboxId: "sb-1", processId: "proc-2", phase: "process-termination", cause: { tag: "tree-still-running" }, partial } },
    "execute",
    /Cleanup is unconfirmed for sandbox sb-1, process proc-2: terminating the process tree could not be confirmed \(the API did not confirm that the process tree exited\).*poisoned.*3 characters of stdout/,
    "poison-lease",
    { providerLeaseId: "sb-1", processId: "proc-2" },
  ],
  [
    "cleanup-failed creation",
    { tag: "cleanup-failed", val: { sandboxId: "sb-1", phase: "process-creation", cause: { tag: "http-status", val: 502 } } },
    "execute",
    /creating the process could not be confirmed \(the API answered HTTP 502\)/,
    "poison-lease",
    { providerLeaseId: "sb-1", processId: undefined },
  ],
  [
    "cleanup-failed deletion on release",
    { tag: "cleanup-failed", val: { sandboxId: "sb-1", phase: "sandbox-deletion", cause: { tag: "deadline" } } },
    "release",
    /deleting the sandbox could not be confirmed \(the request did not finish before its deadline\)/,
    "poison-lease",
    { providerLeaseId: "sb-1", processId: undefined },
  ],
  [
    "acquire cleanup-failed with id",
    { tag: "cleanup-failed", val: { sandboxId: "sb-9", phase: "lease-setup", cause: { tag: "transport", val: "connection reset" } } },
    "acquire",
    /CreateOS setup failed and cleanup is unconfirmed for sandbox sb-9: .*providerLeaseId sb-9/,
    "none",
    { providerLeaseId: "sb-9", processId: undefined },
  ],
  [
    "acquire cleanup-failed without id",
    { tag: "cleanup-failed", val: { phase: "lease-setup", cause: { tag: "invalid-response", val: "no id" } } },
    "acquire",
    /setup failed and cleanup is unconfirmed: .*sandbox id is unknown/,
    "none",
    { providerLeaseId: undefined, processId: undefined },
  ],
  ["key redacted", { tag: "invalid-request", val: `header value ${KEY} rejected` }, "execute", /header value \[redacted\] rejected/, "none"],
  [
    "output-lost, tree deleted (contract 0.3.0)",
    { tag: "output-lost", val: { operation: "connect", processId: "proc-2", lostBytes: undefined, lostChunks: 4n, treeDeleted: true, partial } },
    "execute",
    /CreateOS dropped 4 chunks of the command's output before it was read \(connect found the loss\), so the output is incomplete; what arrived before the loss is kept; process proc-2 was stopped and all of its processes are confirmed gone\. The command printed 3 characters of stdout/,
    "none",
    { processId: "proc-2", outputLost: { lostBytes: null, lostChunks: 4, treeDeleted: true, stdout: "abc", stderr: "de" } },
  ],
  [
    "output-lost, deletion unconfirmed",
    { tag: "output-lost", val: { operation: "logs", processId: "cmd-1", lostBytes: 1234n, lostChunks: undefined, treeDeleted: false, partial } },
    "execute",
    /dropped 1234 bytes of the command's output.*stopping process cmd-1 was not confirmed, so part of it may still run\. The lease is poisoned/,
    "poison-lease",
    { processId: "cmd-1", outputLost: { lostBytes: 1234, lostChunks: null, treeDeleted: false, stdout: "abc", stderr: "de" } },
  ],
  [
    "output-lost, amount unknown",
    { tag: "output-lost", val: { operation: "connect", processId: undefined, lostBytes: undefined, lostChunks: undefined, treeDeleted: true, partial } },
    "execute",
    /dropped part of the command's output \(the server did not say how much\).*the command was stopped/,
    "none",
  ],
];

for (const [name, error, operation, pattern, consequence, data] of ERROR_CASES) {
  test(`provider-error ${name} -> Paperclip error`, () => {
    const failure = toFailure(error, operation, [KEY], "CreateOS");
    assert.match(failure.message, pattern);
    assert.equal(failure.message.includes(KEY), false, "the key never appears");
    assert.equal(failure.kind, error.tag);
    assert.equal(failure.code, PLUGIN_RPC_ERROR_CODES.WORKER_ERROR);
    assert.equal(failure.consequence, consequence);
    if (data) assert.deepEqual(failure.data, data);
    assert.doesNotMatch(failure.message, /\{|\}|Debug|undefined/, "readable text, no raw structures");
  });
}

const RECEIPTS = [
  [{ sandboxId: "sb-1", action: "paused" }, { providerLeaseId: "sb-1", state: "stopped" }],
  [{ sandboxId: "sb-1", action: "deleted" }, { providerLeaseId: "sb-1", state: "destroyed" }],
  [{ sandboxId: "sb-1", action: "already-gone" }, { providerLeaseId: "sb-1", state: "destroyed" }],
  // Left running until the service pauses it: no proof that execution ended.
  [{ sandboxId: "sb-1", action: "idle-pause" }, undefined],
];
for (const [receipt, expected] of RECEIPTS) {
  test(`receipt ${receipt.action} -> ${expected ? `lease state ${expected.state}` : "no receipt"}`, () => {
    assert.deepEqual(toReceipt(receipt), expected);
  });
}

test("resume outcomes: resumed keeps the lease, expired becomes a null lease id", () => {
  const lease = { providerLeaseId: "sb-1", metadata: JSON.stringify({ provider: "createos", environmentId: "e", cwd: "/w" }) };
  const resumed = toResumeResult({ tag: "resumed", val: lease }, "company-a");
  assert.equal(resumed.providerLeaseId, "sb-1");
  assert.equal(resumed.metadata.companyId, "company-a");
  assert.equal(resumed.metadata[COMPONENT_LEASE_KEY], lease.metadata);
  assert.deepEqual(toResumeResult({ tag: "expired", val: "the sandbox is gone" }, "company-a"), {
    providerLeaseId: null,
    metadata: { expired: true, reason: "the sandbox is gone" },
  });
});

test("leases round-trip: Paperclip metadata (even wrapped by the host) gives back the component's lease", () => {
  const lease = { providerLeaseId: "sb-1", metadata: '{"provider":"createos"}' };
  const paperclip = toPaperclipLease(lease, "company-a");
  const wrapped = { driver: "plugin", pluginId: "x", ...paperclip.metadata };
  assert.deepEqual(toWitLease("sb-1", wrapped), { providerLeaseId: "sb-1", metadata: '{"provider":"createos"}', expiresAt: undefined });
  assert.deepEqual(toWitLease("sb-1", null), { providerLeaseId: "sb-1", metadata: "{}", expiresAt: undefined });
});

test("execute request and result map every field", () => {
  const request = toExecuteRequest({ command: "sh", args: ["-c", "x"], cwd: "/w", env: { A: "1" }, stdin: "é", timeoutMs: 1500 });
  // resultChars unset: Paperclip's result carries the output's text (the provider's default 4 Mi characters).
  assert.deepEqual(request, { command: "sh", args: ["-c", "x"], cwd: "/w", env: [["A", "1"]], stdin: new TextEncoder().encode("é"), timeoutMs: 1500n, resultChars: undefined });
  assert.equal(toExecuteRequest({ command: "x", timeoutMs: 1.5 }).timeoutMs, undefined, "a fractional timeout is left to the config");
  assert.deepEqual(
    toExecuteResult({ exitCode: undefined, signal: "SIGKILL", timedOut: true, stdout: "a", stderr: "b", processId: "p", outputTruncated: true }),
    { exitCode: null, signal: "SIGKILL", timedOut: true, stdout: "a", stderr: "b", metadata: { processId: "p", outputTruncated: true } },
  );
});

test("live output chunks above Paperclip's per-chunk limit are split, never inside a surrogate pair", async () => {
  const { logPieces } = await import("../dist/plugin.js");
  const big = "a".repeat(256 * 1024 - 1) + "😀" + "b".repeat(300_000);
  const pieces = logPieces(big);
  assert.equal(pieces.join(""), big);
  assert.ok(pieces.every((piece) => piece.length <= 256 * 1024));
  assert.ok(pieces.every((piece) => !/[\uD800-\uDBFF]$/.test(piece)), "no piece ends with a lone high surrogate");
  assert.deepEqual(logPieces("small"), ["small"]);
});
