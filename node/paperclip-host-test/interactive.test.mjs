// Issue 38 items 5-7 through Paperclip's own worker manager
// (`createPluginWorkerHandle`): the packed CreateOS plugin's login terminal
// (`openLoginPtySession`, the `loginPty*` methods and notifications) and
// duplex channel (`openDuplexChannel`, the `duplexChannel*` ones) against
// createos-local's real sandboxes, and the packed Daytona plugin's duplex
// channel on its Daytona face. A login terminal runs only `claude`,
// `codex` or `grok`: each test installs a stand-in `claude` in the
// sandbox's home (an interactive bash, as a user-installed CLI would be on
// the login shell's PATH) and types into it.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createPluginWorkerHandle } from "./node_modules/@paperclipai/server/dist/services/plugin-worker-manager.js";
import { createHostClientHandlers } from "@paperclipai/plugin-sdk";
import manifest from "../packages/createos/dist/manifest.js";
import daytonaManifest from "../packages/daytona/dist/manifest.js";
import { startBackend } from "../test/support/backend.mjs";

const WORKER = fileURLToPath(new URL("../packages/createos/dist/worker.js", import.meta.url));
const DAYTONA_WORKER = fileURLToPath(new URL("../packages/daytona/dist/worker.js", import.meta.url));
const LEDGERS = mkdtempSync(path.join(tmpdir(), "interactive-rate-budget-"));
const COMPANY = "company-interactive";
const ENVIRONMENT = "environment-interactive";

const store = new Map();
const stateKey = (p) => `${p.scopeKind}|${p.scopeId ?? ""}|${p.namespace ?? "default"}|${p.stateKey}`;
// Paperclip's own gate in front of the store: a `ctx.state` call is served
// only within a call the host made for that company (a session's process
// ends outside any such call).
const hostHandlers = createHostClientHandlers({
  pluginId: manifest.id,
  capabilities: manifest.capabilities,
  services: {
    state: {
      get: async (params) => (store.has(stateKey(params)) ? store.get(stateKey(params)) : null),
      set: async (params) => void store.set(stateKey(params), params.value),
      delete: async (params) => void store.delete(stateKey(params)),
    },
  },
});

let backend;
const handles = [];

before(async () => {
  backend = await startBackend({ toolbox: true });
});

after(async () => {
  for (const handle of handles) await handle.stop().catch(() => {});
  const stopped = await backend?.stop();
  rmSync(LEDGERS, { recursive: true, force: true });
  assert.match(stopped.stderr, /none survived/);
});

/** Each package's worker, manifest and environment config, by driver key. */
const DRIVERS = {
  createos: {
    worker: WORKER,
    manifest,
    config: () => ({ apiUrl: backend.url, apiKey: backend.key, timeoutMs: 120_000 }),
  },
  daytona: {
    worker: DAYTONA_WORKER,
    manifest: daytonaManifest,
    config: () => ({ apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl, apiKey: backend.key, timeoutMs: 120_000 }),
  },
};

async function startWorker({ driver = "createos", worker = DRIVERS[driver].worker, pluginManifest = DRIVERS[driver].manifest } = {}) {
  const handle = createPluginWorkerHandle(pluginManifest.id, {
    entrypointPath: worker,
    manifest: pluginManifest,
    config: {},
    instanceInfo: { instanceId: `test-${randomUUID()}`, hostVersion: "2026.916.1" },
    apiVersion: 1,
    hostHandlers,
    autoRestart: false,
    env: { PAPERCLIP_WASM_THREADS: "3", PAPERCLIP_WASM_RATE_LEDGER: path.join(LEDGERS, "rate-budget.sqlite") },
  });
  handles.push(handle);
  await handle.start();
  return handle;
}

const params = (driver = "createos") => ({
  driverKey: driver,
  companyId: COMPANY,
  environmentId: ENVIRONMENT,
  config: DRIVERS[driver].config(),
});

const scope = (lease, driver = "createos") => ({ driverKey: driver, companyId: COMPANY, environmentId: ENVIRONMENT, providerLeaseId: lease.providerLeaseId });
const sessionHome = () => `/tmp/paperclip-adapter-login/${randomUUID()}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function settle(promise) {
  try {
    return { value: await promise };
  } catch (error) {
    return { error };
  }
}

/** A lease whose login shell finds a stand-in `claude`: an interactive bash, with no rc files. */
async function leaseWithStandIn(handle, acquire = {}, driver = "createos") {
  const lease = await handle.call("environmentAcquireLease", { ...params(driver), runId: `run-${randomUUID()}`, ...acquire });
  const setup = await handle.call(
    "environmentExecute",
    {
      ...params(driver),
      lease,
      command: "sh",
      args: ["-c", `mkdir -p "$HOME/bin" && printf '#!/bin/sh\\nexec bash --norc --noprofile -i\\n' > "$HOME/bin/claude" && chmod +x "$HOME/bin/claude" && echo 'PATH="$HOME/bin:$PATH"' > "$HOME/.profile"`],
    },
    60_000,
  );
  assert.equal(setup.exitCode, 0, setup.stderr);
  return lease;
}

/** Everything a session printed, and a way to wait for a text in what comes after a mark. */
function recorder(session, decode = (chunk) => chunk) {
  let text = "";
  session.onData((chunk) => (text += decode(chunk)));
  return {
    get text() {
      return text;
    },
    mark: () => text.length,
    async waitFor(pattern, from = 0, timeoutMs = 20_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const match = pattern.exec(text.slice(from));
        if (match) return match;
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${pattern} in ${JSON.stringify(text.slice(from).slice(-400))}`);
        await sleep(20);
      }
    },
  };
}

/** The processes of the sandbox whose command line matches `pattern` (the check itself excluded). */
async function processesMatching(handle, lease, pattern, driver = "createos") {
  const result = await handle.call(
    "environmentExecute",
    { ...params(driver), lease, command: "sh", args: ["-c", `for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null); case "$c" in *"$1"*) echo "$c";; esac; done | grep -v -e 'for d in' || true`, "sh", pattern] },
    60_000,
  );
  return result.stdout.split("\n").filter(Boolean);
}

/** A duplex channel's end as the host reports it (`transportClosed` absent means false). */
async function channelEnd(channel) {
  const end = await channel.wait();
  return { exitCode: end.exitCode, transportClosed: end.transportClosed === true };
}

/** The processes of this host whose command line matches `pattern` (the engine's sandboxes run here). */
function hostProcessesMatching(pattern) {
  const found = [];
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    try {
      const line = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
      if (line.includes(pattern)) found.push(line);
    } catch {
      // Gone meanwhile.
    }
  }
  return found;
}

async function destroy(handle, lease, driver = "createos") {
  const receipt = await handle.call("environmentDestroyLease", { ...params(driver), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(receipt.state, "destroyed");
}

test("the packages declare the login terminal and duplex channel exactly as their components can run them", async () => {
  assert.equal(manifest.environmentDrivers[0].supportsLoginPty, true);
  assert.equal(manifest.environmentDrivers[0].sandboxCapabilities.duplexCommandStream, true);
  const handle = await startWorker();
  const health = await handle.call("health", {});
  assert.equal(health.status, "ok");
  // Daytona's component claims both too (terminals and pipes through its session controller), and its package declares both.
  assert.equal(daytonaManifest.environmentDrivers[0].supportsLoginPty, true);
  assert.equal(daytonaManifest.environmentDrivers[0].sandboxCapabilities.duplexCommandStream, true);
  await handle.stop();
});

for (const driver of ["createos", "daytona"]) {
  test(`a ${driver} login terminal: tty names /dev/pts/N, stty size answers the size opened, a Python REPL answers two lines typed apart, ^C ends a sleep, a split UTF-8 character comes out whole, the exit is reported once`, async () => {
    const handle = await startWorker({ driver });
    const lease = await leaseWithStandIn(handle, {}, driver);
    const session = await handle.openLoginPtySession({ ...scope(lease, driver), loginCommandKey: "claude", sessionHome: sessionHome() });
    const out = recorder(session);
    session.write("stty size; tty\n");
    const [, rows, columns, pts] = await out.waitFor(/(\d+) (\d+)\r\n(\/dev\/pts\/\d+)\r\n/);
    assert.deepEqual([Number(columns), Number(rows)], [120, 30], "the size the login terminal is opened with");
    assert.match(pts, /^\/dev\/pts\/\d+$/);

    let mark = out.mark();
    session.write("python3 -q\n");
    await out.waitFor(/>>> $/, mark);
    mark = out.mark();
    session.write("print(6 * 7)\n");
    await out.waitFor(/42\r\n>>> $/, mark);
    await sleep(700);
    mark = out.mark();
    session.write("print('two' * 2)\n");
    await out.waitFor(/twotwo\r\n>>> $/, mark);
    mark = out.mark();
    session.write("exit()\n");
    await out.waitFor(/# $/, mark);

    mark = out.mark();
    session.write("sleep 300\n");
    await sleep(500);
    session.write("\x03");
    session.write("echo status=$?\n");
    await out.waitFor(/status=130\r\n/, mark);

    mark = out.mark();
    session.write("printf '\\342\\202'; sleep 0.4; printf '\\254 end\\n'\n");
    await out.waitFor(/€ end\r\n/, mark);
    assert.equal(out.text.includes("\uFFFD"), false, "no character was cut");

    session.write("exit 5\n");
    assert.deepEqual(await session.wait(), { exitCode: 5 });
    await session.close();
    assert.deepEqual(await processesMatching(handle, lease, "bash --norc", driver), [], "nothing of the terminal is left");
    await destroy(handle, lease, driver);
    await handle.stop();
  });
}

test("a login lease acquired as Paperclip's sign-in acquires it (requestedExpiresAt) carries the engine's attested expiry, at or before the deadline, and its terminal runs; without hardExpiry it is refused", async () => {
  const handle = await startWorker();
  // Paperclip's sign-in (services/setup-token-transport-binding.js) asks for its login deadline and fails
  // closed unless the lease's expiresAt is a time at or before it. createos-local attests a hard expiry
  // (`hardExpiry`); the CreateOS service has none.
  const deadline = Date.now() + 120_000;
  const requestedExpiresAt = new Date(deadline).toISOString();
  const refused = await settle(handle.call("environmentAcquireLease", { ...params(), runId: `run-${randomUUID()}`, requestedExpiresAt }));
  assert.match(refused.error?.message ?? "", /cannot do this.*expiry/s);
  const lease = await leaseWithStandIn(handle, { config: { ...params().config, hardExpiry: true }, requestedExpiresAt });
  const expiresAtMs = Date.parse(lease.expiresAt);
  assert.ok(Number.isFinite(expiresAtMs) && expiresAtMs <= deadline, `expiresAt ${lease.expiresAt} at or before ${requestedExpiresAt}`);
  assert.ok(expiresAtMs > deadline - 2_000, `expiresAt ${lease.expiresAt} is the deadline in whole seconds`);
  const session = await handle.openLoginPtySession({ ...scope(lease), loginCommandKey: "claude", sessionHome: sessionHome() });
  const out = recorder(session);
  session.write("stty size\n");
  await out.waitFor(/30 120\r\n/);
  session.write("exit 3\n");
  assert.deepEqual(await session.wait(), { exitCode: 3 });
  await session.close();
  await destroy(handle, lease);
  await handle.stop();
});

for (const driver of ["createos", "daytona"]) {
  test(`stop ends a ${driver} login terminal's whole tree with proof: no process is left`, async () => {
    const handle = await startWorker({ driver });
    const lease = await leaseWithStandIn(handle, {}, driver);
    const session = await handle.openLoginPtySession({ ...scope(lease, driver), loginCommandKey: "claude", sessionHome: sessionHome() });
    session.write("sleep 301 & sleep 302\n");
    for (let i = 0; (await processesMatching(handle, lease, "sleep 30", driver)).length < 2; i++) {
      assert.ok(i < 100, "the two sleeps started");
      await sleep(50);
    }
    session.kill();
    // Ended by the worker on request, with proof: no exit code of its own.
    assert.deepEqual(await session.wait(), { exitCode: null });
    await session.close();
    assert.deepEqual(await processesMatching(handle, lease, "sleep 30", driver), [], "the background sleep went with the tree");
    assert.deepEqual(await processesMatching(handle, lease, "bash --norc", driver), []);
    await destroy(handle, lease, driver);
    await handle.stop();
  });
}

test("bad login opens are refused before anything runs: a command key outside the map, a home of another shape, an unknown lease", async () => {
  const handle = await startWorker();
  const lease = await leaseWithStandIn(handle);
  const open = (overrides) => settle(handle.call("loginPtyOpen", { hostRouteId: `route-${randomUUID()}`, ...scope(lease), loginCommandKey: "claude", sessionHome: sessionHome(), ...overrides }));
  assert.match((await open({ loginCommandKey: "bash" })).error?.message ?? "", /not one of claude, codex or grok; no terminal was opened/);
  for (const home of ["/tmp/paperclip-adapter-login/../../etc", "/tmp/paperclip-adapter-login/ABC", `/tmp/paperclip-adapter-login/${randomUUID()}/x`, "/root", `/tmp/paperclip-adapter-login/${randomUUID()};reboot`]) {
    assert.match((await open({ sessionHome: home })).error?.message ?? "", /not of the form \/tmp\/paperclip-adapter-login\/<uuid>/, home);
  }
  assert.match((await open({ providerLeaseId: "sb-unknown" })).error?.message ?? "", /not known to this worker/);
  assert.match((await open({ companyId: "another-company" })).error?.message ?? "", /does not belong to this environment/);
  assert.deepEqual(await processesMatching(handle, lease, "bash --norc"), [], "nothing was started");
  await destroy(handle, lease);
  await handle.stop();
});

test("a huge paste into a raw terminal arrives whole", async () => {
  const handle = await startWorker();
  const lease = await leaseWithStandIn(handle);
  const session = await handle.openLoginPtySession({ ...scope(lease), loginCommandKey: "claude", sessionHome: sessionHome() });
  const out = recorder(session);
  const size = 300_000;
  session.write(`stty raw -echo; head -c ${size} | wc -c; stty sane\n`);
  await sleep(500);
  const mark = out.mark();
  session.write("x".repeat(size));
  await out.waitFor(new RegExp(`${size}`), mark, 60_000);
  session.write("exit\n");
  assert.deepEqual(await session.wait(), { exitCode: 0 });
  await session.close();
  await destroy(handle, lease);
  await handle.stop();
});

test("a duplex channel: cat echoes 10 MB of random bytes byte-exact; a process exit is told from a transport loss", async () => {
  const handle = await startWorker();
  const lease = await handle.call("environmentAcquireLease", { ...params(), runId: `run-${randomUUID()}` });
  const channel = await handle.openDuplexChannel({ ...scope(lease), command: ["cat"] });
  const received = [];
  let receivedBytes = 0;
  channel.onData((chunk) => {
    received.push(Buffer.from(chunk));
    receivedBytes += chunk.byteLength;
  });
  const payload = randomBytes(10 * 1024 * 1024);
  const frame = 128 * 1024;
  for (let at = 0; at < payload.length; at += frame) {
    // Paperclip's route holds at most 384 KiB of unanswered writes: keep two frames in flight.
    while (at - receivedBytes > 2 * frame) await sleep(5);
    channel.write(payload.subarray(at, at + frame));
  }
  const deadline = Date.now() + 120_000;
  while (receivedBytes < payload.length && Date.now() < deadline) await sleep(20);
  const echoed = Buffer.concat(received);
  assert.equal(echoed.length, payload.length);
  assert.equal(createHash("sha256").update(echoed).digest("hex"), createHash("sha256").update(payload).digest("hex"), "byte-exact");
  await channel.close();
  assert.deepEqual(await processesMatching(handle, lease, "cat"), [], "close ended cat");

  // A process that exits by itself: its code, and no transport loss.
  const exiting = await handle.openDuplexChannel({ ...scope(lease), command: ["sh", "-c", "printf done; exit 7"] });
  const text = recorder(exiting, (chunk) => Buffer.from(chunk).toString());
  assert.deepEqual(await channelEnd(exiting), { exitCode: 7, transportClosed: false });
  assert.equal(text.text, "done");
  await exiting.close();

  // The output stream breaks for good and its tree's end cannot be proven: a transport loss, and the lease poisoned.
  await backend.addFault({ method: "GET", path: "/v1/sandboxes/*/processes/*/connect", action: { kind: "respond", status: 410, body: "{\"status\":\"fail\",\"data\":{\"error\":\"output_offset_expired\",\"oldest_seq\":5}}" }, times: "always" });
  await backend.addFault({ method: "DELETE", path: "/v1/sandboxes/*/processes/*", action: { kind: "tree_not_exited" }, times: 1 });
  const lost = await handle.openDuplexChannel({ ...scope(lease), command: ["sleep", "30"] });
  assert.deepEqual(await channelEnd(lost), { exitCode: null, transportClosed: true });
  await lost.close();
  await backend.clearFaults();
  const refused = await settle(handle.call("environmentExecute", { ...params(), lease, command: "true" }, 60_000));
  assert.match(refused.error?.message ?? "", /poisoned.*refused until it is destroyed/);
  await destroy(handle, lease);
  await handle.stop();
});

test("a Daytona duplex channel: frames written together all reach the command, cat echoes 10 MB byte-exact while a command runs on the lease, an exit is its code", async () => {
  const handle = await startWorker({ driver: "daytona" });
  const daytona = params("daytona");
  const lease = await handle.call("environmentAcquireLease", { ...daytona, runId: `run-${randomUUID()}` });
  const where = scope(lease, "daytona");
  // `head -n 3` answers nothing before it has all three lines: only the
  // host's events wake the component between them, as Paperclip's HTTP/2
  // frames that the sandbox's gateway does not answer (the e2e's stall).
  const head = await handle.openDuplexChannel({ ...where, command: ["head", "-n", "3"] });
  const headText = recorder(head, (chunk) => Buffer.from(chunk).toString());
  const lines = [0, 1, 2].map((i) => `together-${i}-${randomUUID()}\n`);
  for (const line of lines) head.write(Buffer.from(line));
  await headText.waitFor(new RegExp(lines.join("")), 0, 20_000);
  assert.deepEqual(await channelEnd(head), { exitCode: 0, transportClosed: false });
  assert.equal(headText.text, lines.join(""));
  await head.close();

  const channel = await handle.openDuplexChannel({ ...where, command: ["cat"] });
  const received = [];
  let receivedBytes = 0;
  channel.onData((chunk) => {
    received.push(Buffer.from(chunk));
    receivedBytes += chunk.byteLength;
  });
  const run = handle.call("environmentExecute", { ...daytona, lease, command: "sh", args: ["-c", "echo begin; sleep 1; echo end"] }, 60_000);
  const payload = randomBytes(10 * 1024 * 1024);
  const frame = 64 * 1024;
  for (let at = 0; at < payload.length; at += frame) {
    while (at - receivedBytes > 2 * frame) await sleep(5);
    channel.write(payload.subarray(at, at + frame));
  }
  const deadline = Date.now() + 120_000;
  while (receivedBytes < payload.length && Date.now() < deadline) await sleep(20);
  const echoed = Buffer.concat(received);
  assert.equal(createHash("sha256").update(echoed).digest("hex"), createHash("sha256").update(payload).digest("hex"), "byte-exact");
  assert.equal((await run).stdout, "begin\nend\n");
  await channel.close();

  const exiting = await handle.openDuplexChannel({ ...where, command: ["sh", "-c", "printf done; exit 7"] });
  const text = recorder(exiting, (chunk) => Buffer.from(chunk).toString());
  assert.deepEqual(await channelEnd(exiting), { exitCode: 7, transportClosed: false });
  assert.equal(text.text, "done");
  await exiting.close();
  const receipt = await handle.call("environmentDestroyLease", { ...daytona, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(receipt.state, "destroyed");
  await handle.stop();
});

test("release and shutdown end the sessions they find, with proof; a worker killed with a session open leaves its lease poisoned", async () => {
  let handle = await startWorker();
  const lease = await handle.call("environmentAcquireLease", { ...params(), runId: `run-${randomUUID()}` });
  const released = await handle.openDuplexChannel({ ...scope(lease), command: ["sleep", "304"] });
  const receipt = await handle.call("environmentReleaseLease", { ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(receipt.providerLeaseId, lease.providerLeaseId);
  assert.deepEqual(await channelEnd(released), { exitCode: null, transportClosed: false }, "ended by the release, with proof");
  await released.close();
  await handle.stop();

  handle = await startWorker();
  const stopped = await handle.call("environmentAcquireLease", { ...params(), runId: `run-${randomUUID()}` });
  await handle.openDuplexChannel({ ...scope(stopped), command: ["sleep", "305"] });
  assert.equal((await processesMatching(handle, stopped, "sleep 305")).length, 1);
  await handle.stop();
  // Shutdown ended it with proof (the sandbox's processes are this host's: none is left) ...
  assert.deepEqual(hostProcessesMatching("sleep 305"), []);
  handle = await startWorker();
  // ... but Paperclip lets no shutdown write the plugin's state, so the record of the open
  // session stays and the lease is destroyed at its next use, never reused unproven.
  const afterShutdown = await settle(handle.call("environmentExecute", { ...params(), lease: stopped, command: "true" }, 60_000));
  assert.match(afterShutdown.error?.message ?? "", /poisoned/);
  await destroy(handle, stopped);

  const second = await handle.call("environmentAcquireLease", { ...params(), runId: `run-${randomUUID()}` });
  await handle.openDuplexChannel({ ...scope(second), command: ["sleep", "306"] });
  process.kill(handle.diagnostics().pid, "SIGKILL");
  for (let i = 0; handle.diagnostics().status === "running"; i++) {
    assert.ok(i < 200);
    await sleep(25);
  }
  handle = await startWorker();
  const refused = await settle(handle.call("environmentExecute", { ...params(), lease: second, command: "true" }, 60_000));
  assert.match(refused.error?.message ?? "", /a duplex channel opened on it by a worker that stopped before ending it may still run.*refused until it is destroyed/);
  await destroy(handle, second);
  await handle.stop();
});
