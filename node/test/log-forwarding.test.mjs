// Issue 23 point 5: the Node host forwards every output byte to
// `ctx.execution.log` in order, with backpressure: a slow log sink slows
// the stream (the provider thread waits, the component stops reading),
// it never drops output, and the result comes after the last chunk was
// delivered. Against the real createos-local (default journal); the volume
// stays within one journal so the server's own policy does not decide.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import manifest from "../dist/manifest.js";
import { createPlugin } from "../dist/plugin.js";
import { processesWith, startBackend } from "./support/backend.mjs";
import { base, freshLedgerPath } from "./support/plugin.mjs";

const HIGH_WATER = 64 * 1024;

let backend;

before(async () => {
  backend = await startBackend();
});

after(async () => {
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

/** A plugin whose execution log sink is `sink` (sync or async). */
async function pluginWithSink(sink) {
  const plugin = createPlugin({ poolSize: 1, env: {}, rateLedgerPath: freshLedgerPath(), outputHighWaterChars: HIGH_WATER });
  const hooks = plugin.definition;
  const harness = createEnvironmentTestHarness({ manifest, environmentDriver: { driverKey: "createos" } });
  await hooks.setup({ ...harness.ctx, execution: { log: sink } });
  return hooks;
}

function seq(from, to) {
  let out = "";
  for (let i = from; i <= to; i++) out += `${i}\n`;
  return out;
}

async function runWith(hooks, request) {
  const params = base(backend);
  const lease = await hooks.onEnvironmentAcquireLease({ ...params, runId: `run-${randomUUID()}` });
  try {
    return await hooks.onEnvironmentExecute({ ...params, lease, ...request });
  } finally {
    await hooks.onEnvironmentDestroyLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
}

/**
 * A sink that takes 15 ms per chunk (a slow consumer): chunks are
 * delivered one at a time, in order, every byte; the command's stream
 * waited for it (never more than the high-water mark plus one chunk
 * undelivered); and when execute resolves the sink already has all of it.
 * Before, every chunk was handed over at once without waiting, the
 * result came back while the sink was still behind, and the thread read
 * on at full speed however far behind the sink was.
 */
test("a slow async log sink slows the stream: every byte once, in order, delivered before the result", async () => {
  const delivered = { stdout: "", stderr: "" };
  let inFlight = 0;
  let mostInFlight = 0;
  let calls = 0;
  const hooks = await pluginWithSink(async (stream, chunk) => {
    inFlight += 1;
    calls += 1;
    mostInFlight = Math.max(mostInFlight, inFlight);
    await new Promise((resolve) => setTimeout(resolve, 15));
    delivered[stream] += chunk;
    inFlight -= 1;
  });
  try {
    const result = await runWith(hooks, { command: "sh", args: ["-c", "seq 1 60000; seq 1 20000 >&2"] });
    const atResult = { ...delivered };
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, seq(1, 60000));
    assert.equal(result.stderr, seq(1, 20000));
    assert.equal(atResult.stdout, result.stdout, "the live log had all of stdout, in order, when the result came");
    assert.equal(atResult.stderr, result.stderr, "the live log had all of stderr, in order, when the result came");
    assert.equal(mostInFlight, 1, "one chunk at a time");
    assert.ok(calls >= 3, `the output came in several chunks (${calls})`);
    const backlog = (await hooks.onHealth()).details.outputBacklogMaxChars;
    assert.ok(typeof backlog === "number" && backlog > 0, `backlog measured (${backlog})`);
    assert.ok(backlog <= HIGH_WATER + 256 * 1024, `the stream waited for the sink: at most ${backlog} characters were undelivered`);
    assert.ok(backlog < result.stdout.length, "the thread did not read the whole output ahead of the sink");
  } finally {
    await hooks.onShutdown();
  }
});

/**
 * Contract 0.4.0: the component forwards the bytes the command printed, so
 * a chunk may end inside a UTF-8 character. Each character below is
 * written one byte at a time with a pause (each byte its own chunk), on
 * both streams: the log gets every character whole (each stream decoded
 * with a streaming decoder), the one invalid byte as one U+FFFD, and no
 * other U+FFFD. Decoding each chunk on its own would log U+FFFD for every
 * piece of a cut character.
 */
test("a character split across chunks reaches the log whole, on both streams", async () => {
  const logs = [];
  const hooks = await pluginWithSink((stream, chunk) => logs.push({ stream, chunk }));
  const bytes = ["\\xe2", "\\x82", "\\xac", "\\xf0", "\\x9f", "\\xa6", "\\x80", "\\xc3", "\\xbc", "a\\xffb", "\\n"];
  const writes = (fd) => bytes.map((b) => `printf '${b}' >&${fd}; sleep 0.2; `).join("");
  try {
    const result = await runWith(hooks, { command: "bash", args: ["-c", writes(1) + writes(2)] });
    const expected = "€🦀üa\uFFFDb\n";
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, expected);
    assert.equal(result.stderr, expected);
    for (const stream of ["stdout", "stderr"]) {
      const chunks = logs.filter((l) => l.stream === stream).map((l) => l.chunk);
      assert.ok(chunks.length >= 4, `${stream} came in pieces (${JSON.stringify(chunks)})`);
      assert.equal(chunks.join(""), expected, `${stream}: ${JSON.stringify(chunks)}`);
    }
  } finally {
    await hooks.onShutdown();
  }
});

/**
 * A sink that blocks its thread (like Paperclip's SDK writing to a full
 * stdout pipe): the same bound holds, nothing is lost.
 */
test("a blocking log sink holds the stream back and loses nothing", async () => {
  let delivered = "";
  const hooks = await pluginWithSink((stream, chunk) => {
    const until = Date.now() + 10;
    while (Date.now() < until);
    if (stream === "stdout") delivered += chunk;
  });
  try {
    const result = await runWith(hooks, { command: "seq", args: ["1", "70000"] });
    assert.equal(result.stdout, seq(1, 70000));
    assert.equal(delivered, result.stdout);
    const backlog = (await hooks.onHealth()).details.outputBacklogMaxChars;
    assert.ok(backlog <= HIGH_WATER + 256 * 1024, `at most ${backlog} characters were undelivered`);
  } finally {
    await hooks.onShutdown();
  }
});

/**
 * A command whose output is held back by a slow sink (the provider thread
 * waiting in emit-output) is still cancellable: release cancels it, the
 * thread stops waiting, the component deletes the process tree, and every
 * chunk it had already read still reaches the sink before the result.
 */
test("a command held back by a slow sink is still cancelled by release, its tree deleted, its output so far delivered", async () => {
  let delivered = "";
  let first;
  const firstChunk = new Promise((resolve) => (first = resolve));
  const hooks = await pluginWithSink(async (stream, chunk) => {
    first();
    await new Promise((resolve) => setTimeout(resolve, 250));
    if (stream === "stdout") delivered += chunk;
  });
  const token = `47.${Math.floor(Math.random() * 1e6)}`;
  const params = base(backend);
  try {
    const lease = await hooks.onEnvironmentAcquireLease({ ...params, runId: `run-${randomUUID()}` });
    const running = hooks
      .onEnvironmentExecute({ ...params, lease, command: "sh", args: ["-c", `seq 1 60000; sleep ${token}`] })
      .then(
        () => null,
        (error) => error,
      );
    await firstChunk;
    const receipt = await hooks.onEnvironmentReleaseLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    const error = await running;
    assert.match(error?.message ?? "", /cancelled/);
    assert.match(error.message, /cleanup completed/);
    assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
    assert.deepEqual(await processesWith(`sleep ${token}`), [], "the process tree is gone");
    assert.ok(delivered.length > 0 && seq(1, 60000).startsWith(delivered), "what was delivered is a prefix of the output, in order");
  } finally {
    await hooks.onShutdown();
  }
});

/**
 * Issue 23, "Bad input": a log sink that never resolves (a reader that is
 * never resumed). Before, the provider thread waited for it until the
 * call's host deadline and the result waited for it forever: execute never
 * settled. Now the command's own timeout still ends the command (its tree
 * is gone) and the call fails as output-lost, saying how many bytes the
 * sink did not consume; never a clean result.
 */
async function executeWithStuckSink(request) {
  let called = false;
  const hooks = await pluginWithSink(() => {
    called = true;
    return new Promise(() => {});
  });
  const params = base(backend);
  const lease = await hooks.onEnvironmentAcquireLease({ ...params, runId: `run-${randomUUID()}` });
  let timer;
  try {
    const outcome = await Promise.race([
      hooks.onEnvironmentExecute({ ...params, lease, ...request }).then(
        (result) => ({ result }),
        (error) => ({ error }),
      ),
      new Promise((resolve) => {
        timer = setTimeout(() => resolve({ hung: true }), 120_000);
      }),
    ]);
    assert.ok(!outcome.hung, `execute still pending 120 s after its ${request.timeoutMs} ms timeout (sink called: ${called})`);
    return outcome;
  } finally {
    clearTimeout(timer);
    await hooks.onShutdown();
  }
}

test("a log sink that never resolves does not hold the command past its timeout; the failure counts what it did not consume", async () => {
  const token = `yes-${Math.floor(Math.random() * 1e6)}`;
  const outcome = await executeWithStuckSink({ command: "sh", args: ["-c", `yes ${token}`], timeoutMs: 3_000 });
  assert.equal(outcome.result, undefined, `a clean result although the sink consumed nothing: ${JSON.stringify(outcome.result)?.slice(0, 200)}`);
  const { error } = outcome;
  assert.equal(error?.data?.outputLost?.treeDeleted, true, error?.message);
  assert.ok(error.data.outputLost.lostBytes > 0, error.message);
  assert.match(error.message, /not consumed/);
  assert.match(error.message, /timeout/);
  assert.doesNotMatch(error.message, /dropped/);
  assert.deepEqual(await processesWith(`yes ${token}`), [], "the command's tree is gone");
});

test("a command that exits 0 while the log sink never resolves is not a clean exit", async () => {
  const outcome = await executeWithStuckSink({ command: "echo", args: ["hello"], timeoutMs: 2_000 });
  assert.equal(outcome.result, undefined, `a clean result although the sink consumed nothing: ${JSON.stringify(outcome.result)}`);
  const { error } = outcome;
  assert.equal(error?.data?.outputLost?.lostBytes, 6, error?.message);
  assert.equal(error.data.outputLost.treeDeleted, true, error.message);
  assert.equal(error.data.outputLost.stdout, "hello\n", error.message);
});

/**
 * A log sink that fails (ctx.execution.log throws or rejects): the output
 * cannot reach anyone. Before, the pool swallowed the failure as if the
 * chunk had been delivered: the command ran on (here until its 300 s
 * timeout) and its result came back clean with the live log missing.
 * Now the command is stopped at once and the call is output-lost, saying
 * why the sink failed; its tree is gone.
 */
async function executeWithFailingSink(request) {
  let calls = 0;
  const hooks = await pluginWithSink(async () => {
    calls++;
    throw new Error("the log store is unavailable");
  });
  const params = base(backend);
  const lease = await hooks.onEnvironmentAcquireLease({ ...params, runId: `run-${randomUUID()}` });
  let timer;
  try {
    const outcome = await Promise.race([
      hooks.onEnvironmentExecute({ ...params, lease, ...request }).then(
        (result) => ({ result }),
        (error) => ({ error }),
      ),
      new Promise((resolve) => {
        timer = setTimeout(() => resolve({ hung: true }), 90_000);
      }),
    ]);
    assert.ok(!outcome.hung, `execute still pending 90 s after its log sink failed (sink called ${calls} times)`);
    assert.equal(calls, 1, "the failed sink is not called again");
    return outcome;
  } finally {
    clearTimeout(timer);
    await hooks.onEnvironmentDestroyLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata }).catch(() => {});
    await hooks.onShutdown();
  }
}

test("a log sink that fails stops the command at once; the call is output-lost with the sink's reason, never clean", async () => {
  const token = `yes-${Math.floor(Math.random() * 1e6)}`;
  const outcome = await executeWithFailingSink({ command: "sh", args: ["-c", `yes ${token}`], timeoutMs: 300_000 });
  assert.equal(outcome.result, undefined, `a clean result although the sink failed: ${JSON.stringify(outcome.result)?.slice(0, 200)}`);
  const { error } = outcome;
  assert.equal(error?.data?.outputLost?.treeDeleted, true, error?.message);
  assert.ok(error.data.outputLost.lostBytes > 0, error.message);
  assert.match(error.message, /the log store is unavailable/);
  assert.match(error.message, /stopped at once/);
  assert.deepEqual(await processesWith(`yes ${token}`), [], "the command's tree is gone");
});

test("a command that exits 0 while its log sink fails is not a clean exit", async () => {
  const outcome = await executeWithFailingSink({ command: "echo", args: ["hello"], timeoutMs: 30_000 });
  assert.equal(outcome.result, undefined, `a clean result although the sink failed: ${JSON.stringify(outcome.result)}`);
  const { error } = outcome;
  assert.equal(error?.data?.outputLost?.lostBytes, 6, error?.message);
  assert.equal(error.data.outputLost.treeDeleted, true, error.message);
  assert.match(error.message, /the log store is unavailable/);
});
