// Layer 2: the packed plugins driven by Paperclip's own worker manager
// (`createPluginWorkerHandle` from @paperclipai/server): it forks a
// package's dist/worker.js (../packages/createos, and ../packages/daytona
// at the end) and speaks JSON-RPC over stdio with it. The `state.*`
// host handlers are served from a store that outlives each worker, as
// Paperclip's database does.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { createPluginWorkerHandle } from "./node_modules/@paperclipai/server/dist/services/plugin-worker-manager.js";
import { PLUGIN_RPC_ERROR_CODES, JSONRPC_ERROR_CODES } from "@paperclipai/plugin-sdk";
import manifest from "../packages/createos/dist/manifest.js";
import daytonaManifest from "../packages/daytona/dist/manifest.js";
import { startBackend, startRecordingServer } from "../test/support/backend.mjs";

const WORKER = fileURLToPath(new URL("../packages/createos/dist/worker.js", import.meta.url));
const DAYTONA_WORKER = fileURLToPath(new URL("../packages/daytona/dist/worker.js", import.meta.url));
const SCENARIOS = Object.fromEntries(
  JSON.parse(readFileSync(new URL("../test/scenarios/local-backend-faults.json", import.meta.url), "utf8")).scenarios.map((s) => [s.name, s]),
);
/** This suite's rate budget file, handed to every worker through the environment Paperclip passes. */
const LEDGERS = mkdtempSync(path.join(tmpdir(), "host-rate-budget-"));
const LEDGER = path.join(LEDGERS, "rate-budget.sqlite");
const COMPANY = "company-host";
const ENVIRONMENT = "environment-host";

/** Paperclip keeps plugin state in its database; this map outlives every worker. */
const store = new Map();
const stateKey = (p) => `${p.scopeKind}|${p.scopeId ?? ""}|${p.namespace ?? "default"}|${p.stateKey}`;
const hostHandlers = {
  "state.get": async (params) => (store.has(stateKey(params)) ? store.get(stateKey(params)) : null),
  "state.set": async (params) => void store.set(stateKey(params), params.value),
  "state.delete": async (params) => void store.delete(stateKey(params)),
};

let backend;
let stranger;
const handles = [];

before(async () => {
  backend = await startBackend({ toolbox: true });
  stranger = await startRecordingServer();
});

after(async () => {
  for (const handle of handles) await handle.stop().catch(() => {});
  await stranger?.stop();
  const stopped = await backend?.stop();
  rmSync(LEDGERS, { recursive: true, force: true });
  assert.match(stopped.stderr, /none survived/);
});

async function startWorker(env = {}, { worker = WORKER, pluginManifest = manifest } = {}) {
  const handle = createPluginWorkerHandle(pluginManifest.id, {
    entrypointPath: worker,
    manifest: pluginManifest,
    config: {},
    instanceInfo: { instanceId: `test-${randomUUID()}`, hostVersion: "2026.916.1" },
    apiVersion: 1,
    hostHandlers,
    autoRestart: false,
    env: { PAPERCLIP_WASM_THREADS: "2", PAPERCLIP_WASM_RATE_LEDGER: LEDGER, ...env },
  });
  handles.push(handle);
  await handle.start();
  return handle;
}

const params = (overrides = {}) => {
  const { config, ...rest } = overrides;
  return {
    driverKey: "createos",
    companyId: COMPANY,
    environmentId: ENVIRONMENT,
    config: { apiUrl: backend.url, apiKey: backend.key, timeoutMs: 60_000, ...(config ?? {}) },
    ...rest,
  };
};

async function settle(promise) {
  try {
    return { value: await promise };
  } catch (error) {
    return { error };
  }
}

test("Paperclip's worker manager forks the built worker; health answers", async () => {
  const handle = await startWorker();
  const health = await handle.call("health", {});
  assert.equal(health.status, "ok");
  assert.equal(handle.diagnostics().status, "running");
  await handle.stop();
});

test("the operator's secret settings in the real worker: the variable the operator names reaches the origin it trusts; the one the component names is never read", async () => {
  // docs/secret-routing.md: the config holds no key; CREATEOS_API_KEY (the component's env-var) holds the right key, which no host reads.
  const probeWithoutKey = (handle) =>
    handle.call("environmentProbe", { driverKey: "createos", companyId: COMPANY, environmentId: ENVIRONMENT, config: { apiUrl: backend.url, timeoutMs: 60_000 } });
  const unnamed = await startWorker({ CREATEOS_API_KEY: backend.key, PAPERCLIP_WASM_TRUSTED_ORIGINS: backend.url });
  const refused = await probeWithoutKey(unnamed);
  assert.equal(refused.ok, false, "no key was sent: createos-local refused the probe");
  assert.equal(JSON.stringify(refused).includes(backend.key), false);
  await unnamed.stop();
  const operated = await startWorker({
    CREATEOS_API_KEY: "a-wrong-key-the-component-names",
    OPERATOR_NAMED_KEY: backend.key,
    PAPERCLIP_WASM_SECRET_ENV: "apiKey=OPERATOR_NAMED_KEY",
    PAPERCLIP_WASM_TRUSTED_ORIGINS: backend.url,
  });
  const probed = await probeWithoutKey(operated);
  assert.equal(probed.ok, true, JSON.stringify(probed));
  assert.equal(JSON.stringify(probed).includes(backend.key), false);
  // The same variable, but the config names an origin the operator does not trust: the key stays home.
  const untrusted = await startRecordingServer();
  try {
    const elsewhere = await operated.call("environmentProbe", {
      driverKey: "createos",
      companyId: COMPANY,
      environmentId: ENVIRONMENT,
      config: { apiUrl: untrusted.url, timeoutMs: 60_000 },
    });
    assert.equal(elsewhere.ok, false);
    await untrusted.flush();
    assert.ok(untrusted.seen.length > 0, "the probe reached the untrusted origin");
    assert.equal(JSON.stringify(untrusted.seen).includes(backend.key), false, "the untrusted origin never received the key");
  } finally {
    await untrusted.stop();
  }
  await operated.stop();
});

test("acquire -> execute with live log -> release -> resume -> destroy through Paperclip's host", async () => {
  const handle = await startWorker();
  const reuse = { config: { reuseLease: true } };
  const lease = await handle.call("environmentAcquireLease", { ...params(reuse), runId: "run-host-1" });
  assert.match(lease.providerLeaseId, /^sb-/);
  assert.equal(JSON.stringify(lease).includes(backend.key), false);

  const chunks = [];
  const result = await handle.call(
    "environmentExecute",
    { ...params(reuse), lease, command: "sh", args: ["-c", "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three"] },
    60_000,
    (stream, chunk) => chunks.push({ stream, chunk }),
  );
  assert.equal(result.exitCode, 0);
  assert.equal(result.stdout, "one\nthree\n");
  assert.equal(result.stderr, "two\n");
  const lines = chunks.flatMap((c) => c.chunk.split("\n").filter(Boolean).map((line) => `${c.stream}:${line}`));
  assert.deepEqual(lines, ["stdout:one", "stderr:two", "stdout:three"], "the host's execute route got the live log in order");

  const receipt = await handle.call("environmentReleaseLease", { ...params(reuse), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "stopped" });
  const resumed = await handle.call("environmentResumeLease", { ...params(reuse), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(resumed.providerLeaseId, lease.providerLeaseId);
  const destroyed = await handle.call("environmentDestroyLease", { ...params(reuse), providerLeaseId: lease.providerLeaseId, leaseMetadata: resumed.metadata });
  assert.deepEqual(destroyed, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
  await handle.stop();
});

test("a poisoned lease survives a worker restart (ctx.state through the host's state handlers)", async () => {
  const scenario = SCENARIOS["execute-termination-unconfirmed"];
  let handle = await startWorker();
  const lease = await handle.call("environmentAcquireLease", { ...params(), runId: "run-host-poison" });
  for (const rule of scenario.faults) await backend.addFault(rule);
  const failed = await settle(handle.call("environmentExecute", { ...params(), lease, ...scenario.command }, 60_000));
  await backend.clearFaults();
  assert.equal(failed.error?.code, PLUGIN_RPC_ERROR_CODES.WORKER_ERROR);
  assert.match(failed.error.message, /Cleanup is unconfirmed .*poisoned/);
  assert.ok([...store.keys()].some((key) => key.includes(lease.providerLeaseId)), "the poison is in the host's store");

  await handle.stop();
  handle = await startWorker();
  await backend.clearRequests();
  const refused = await settle(handle.call("environmentExecute", { ...params(), lease, command: "true" }, 60_000));
  assert.match(refused.error?.message ?? "", /poisoned.*refused until it is destroyed/);
  const resumed = await settle(handle.call("environmentResumeLease", { ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata }));
  assert.match(resumed.error?.message ?? "", /poisoned/);
  assert.deepEqual(await backend.requests(), [], "the restarted worker refused without a request");
  const destroyed = await handle.call("environmentDestroyLease", { ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(destroyed.state, "destroyed");
  assert.equal([...store.keys()].some((key) => key.includes(lease.providerLeaseId)), false, "destroy cleared it");
  await handle.stop();
});

/**
 * Pins issue 17 through Paperclip's own host: the SDK sends only the
 * message of a thrown error, so the host never gets the id of a sandbox a
 * failed acquire could not delete. The plugin's own record in the host's
 * state store does; it survives a worker restart, and the environment's
 * next acquire deletes the sandbox and the record.
 */
test("a sandbox a failed acquire left behind is deleted by the next acquire, after a worker restart", async () => {
  const scenario = SCENARIOS["acquire-setup-and-delete-fail"];
  let handle = await startWorker();
  for (const rule of scenario.faults) await backend.addFault(rule);
  const failed = await settle(handle.call("environmentAcquireLease", { ...params(), runId: "run-host-orphan" }));
  await backend.clearFaults();
  assert.equal(failed.error?.code, PLUGIN_RPC_ERROR_CODES.WORKER_ERROR);
  assert.equal(failed.error.data?.providerLeaseId, undefined, "the host got no structured sandbox id");
  const sandboxId = /for sandbox (\S+):/i.exec(failed.error.message)?.[1];
  assert.ok(sandboxId, failed.error.message);
  const orphans = stateKey({ scopeKind: "company", scopeId: COMPANY, namespace: "orphaned-sandboxes", stateKey: ENVIRONMENT });
  assert.deepEqual(store.get(orphans)?.sandboxes.map((o) => o.providerLeaseId), [sandboxId], "recorded in the host's store");

  await handle.stop();
  handle = await startWorker();
  await backend.clearRequests();
  const lease = await handle.call("environmentAcquireLease", { ...params(), runId: "run-host-after-orphan" });
  const deletes = (await backend.requests()).filter((r) => r.method === "DELETE" && r.path === `/v1/sandboxes/${sandboxId}`);
  assert.deepEqual(deletes.map((r) => r.status < 300), [true], "the restarted worker's next acquire deleted it");
  assert.deepEqual(store.get(orphans)?.sandboxes, []);
  assert.equal([...store.keys()].some((key) => key.includes(sandboxId)), false, "its poison went too");
  await handle.call("environmentDestroyLease", { ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  await handle.stop();
});

/**
 * Pins issue 18 through Paperclip's own host: two workers forked by
 * Paperclip's worker manager (two processes, each with its own pool) run
 * commands at once against a server that allows 10 requests per 2 s (far
 * below what four threads ask for, so the budget binds); the operator's
 * limit (the same 10 per 2 s) is one budget in the ledger file both
 * open, so the server refuses nothing. The settings are given by their
 * earlier names (`PAPERCLIP_CREATEOS_RATE_LIMIT`, `..._RATE_LEDGER`), which
 * the worker still reads as aliases of `PAPERCLIP_WASM_RATE_LIMIT` and
 * `PAPERCLIP_WASM_RATE_LEDGER`.
 */
test("two Paperclip workers share one rate budget: the rate-limited server never answers 429", async () => {
  const limited = await startBackend({ rateLimit: "10/2000" });
  const env = { PAPERCLIP_CREATEOS_RATE_LIMIT: "10/2000", PAPERCLIP_CREATEOS_RATE_LEDGER: path.join(LEDGERS, "shared.sqlite") };
  const workers = [await startWorker(env), await startWorker(env)];
  try {
    const on = (overrides = {}) => ({ ...params(overrides), config: { apiUrl: limited.url, apiKey: limited.key, timeoutMs: 60_000 } });
    const runs = await Promise.all(
      workers.map(async (handle, w) => {
        const lease = await handle.call("environmentAcquireLease", { ...on(), runId: `run-host-shared-${w}` });
        const results = await Promise.all(
          Array.from({ length: 6 }, (_, i) => handle.call("environmentExecute", { ...on(), lease, command: "echo", args: [`w${w}-${i}`] }, 120_000)),
        );
        await handle.call("environmentDestroyLease", { ...on(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata }, 120_000);
        return { outputs: results.map((r) => r.stdout), health: (await handle.call("health", {})).details };
      }),
    );
    runs.forEach((run, w) => assert.deepEqual(run.outputs, Array.from({ length: 6 }, (_, i) => `w${w}-${i}\n`)));
    const counters = (await limited.info()).rate_limit;
    assert.equal(counters.refused, 0, "the server refused nothing");
    assert.equal(counters.admitted, runs[0].health.rateLimitStarts + runs[1].health.rateLimitStarts, "every request went through the shared budget");
    assert.ok(counters.admitted > 10, "together they needed more than one window");
    assert.ok(runs[0].health.rateLimitWaits + runs[1].health.rateLimitWaits > 0, "the shared budget made requests wait");
  } finally {
    for (const handle of workers) await handle.stop().catch(() => {});
    await limited.stop();
  }
});

test("unknown methods and wrong param types through Paperclip's host are JSON-RPC errors; the worker stays up", async () => {
  const handle = await startWorker();
  const pid = handle.diagnostics().pid;
  const unknown = await settle(handle.call("environmentTeleport", { companyId: COMPANY }));
  assert.equal(unknown.error?.code, JSONRPC_ERROR_CODES.METHOD_NOT_FOUND);
  const wrongTypes = await settle(handle.call("environmentExecute", { ...params(), lease: 42, command: ["not", "a", "string"] }));
  assert.equal(wrongTypes.error?.code, PLUGIN_RPC_ERROR_CODES.WORKER_ERROR);
  assert.match(wrongTypes.error.message, /no provider lease id/);
  const badConfig = await handle.call("environmentValidateConfig", { driverKey: "createos", config: { apiUrl: "ftp://example.com", apiKey: backend.key } });
  assert.equal(badConfig.ok, false);
  assert.match(badConfig.errors.join(" "), /apiUrl/);
  const health = await handle.call("health", {});
  assert.equal(health.status, "ok");
  assert.equal(handle.diagnostics().pid, pid, "the same worker process answered");
  assert.equal(handle.diagnostics().status, "running");
  await handle.stop();
});

test("raw lines that are not JSON-RPC get JSON-RPC errors on the worker's stdout, and the worker keeps serving", async () => {
  // Paperclip's handle never writes a malformed line itself, so this drives the
  // same built worker over its stdio directly.
  const child = spawn(process.execPath, [WORKER], { stdio: ["pipe", "pipe", "inherit"], env: { PATH: process.env.PATH, PAPERCLIP_WASM_THREADS: "1" } });
  const answers = [];
  const lines = createInterface({ input: child.stdout });
  lines.on("line", (line) => answers.push(JSON.parse(line)));
  const waitFor = async (predicate) => {
    while (!answers.some(predicate)) await new Promise((resolve) => setTimeout(resolve, 20));
    return answers.find(predicate);
  };
  const send = (value) => child.stdin.write(typeof value === "string" ? `${value}\n` : `${JSON.stringify(value)}\n`);
  send("{this is not json");
  const parseError = await waitFor((a) => a.error && a.id === null);
  assert.equal(parseError.error.code, JSONRPC_ERROR_CODES.PARSE_ERROR);
  send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { manifest, config: {}, instanceInfo: { instanceId: "raw", hostVersion: "2026.916.1" }, apiVersion: 1 } });
  const initialized = await waitFor((a) => a.id === 1);
  assert.equal(initialized.result.ok, true);
  assert.ok(initialized.result.supportedMethods.includes("environmentSyncIn"));
  send({ jsonrpc: "2.0", id: 2, method: 42 });
  send({ jsonrpc: "2.0", id: 3, method: "noSuchMethod", params: {} });
  send({ jsonrpc: "2.0", id: 4, method: "health", params: {} });
  assert.ok((await waitFor((a) => a.id === 3)).error, "unknown method answered with an error");
  assert.equal((await waitFor((a) => a.id === 4)).result.status, "ok", "the worker still serves");
  assert.ok(answers.filter((a) => a.error).length >= 2);
  const exited = new Promise((resolve) => child.once("exit", resolve));
  send({ jsonrpc: "2.0", id: 5, method: "shutdown", params: {} });
  assert.equal(await exited, 0);
});

test("a component trap fails that call, replaces the instance and poisons the lease; the worker stays up", async () => {
  const marker = `TRAP-${randomUUID()}`;
  const handle = await startWorker({ PAPERCLIP_WASM_TEST_TRAP_MARKER: marker, PAPERCLIP_WASM_THREADS: "1" });
  const pid = handle.diagnostics().pid;
  const lease = await handle.call("environmentAcquireLease", { ...params(), runId: "run-host-trap" });
  const trapped = await settle(handle.call("environmentExecute", { ...params(), lease, command: "echo", args: [marker] }, 60_000));
  assert.equal(trapped.error?.code, PLUGIN_RPC_ERROR_CODES.WORKER_ERROR);
  assert.match(trapped.error.message, /component failed during execute .*instance was replaced/);
  const health = await handle.call("health", {});
  assert.equal(health.details.traps, 1);
  assert.equal(handle.diagnostics().pid, pid);
  const fresh = await handle.call("environmentAcquireLease", { ...params(), runId: "run-host-after-trap" });
  const ok = await handle.call("environmentExecute", { ...params(), lease: fresh, command: "echo", args: ["after"] }, 60_000);
  assert.equal(ok.stdout, "after\n", "the single thread runs a fresh instance");
  const refused = await settle(handle.call("environmentExecute", { ...params(), lease, command: "true" }, 60_000));
  assert.match(refused.error?.message ?? "", /poisoned/);
  for (const done of [lease, fresh]) {
    await handle.call("environmentDestroyLease", { ...params(), providerLeaseId: done.providerLeaseId, leaseMetadata: done.metadata });
  }
  await handle.stop();
});

test("stopping the worker (Paperclip's shutdown) cancels a running command first", async () => {
  const handle = await startWorker();
  const lease = await handle.call("environmentAcquireLease", { ...params(), runId: "run-host-stop" });
  const chunks = [];
  const running = settle(handle.call("environmentExecute", { ...params(), lease, command: "sh", args: ["-c", "echo started; sleep 45.25"] }, 120_000, (stream, chunk) => chunks.push({ stream, chunk })));
  while (!chunks.some((c) => c.chunk.includes("started"))) await new Promise((resolve) => setTimeout(resolve, 20));
  await backend.clearRequests();
  await handle.stop();
  const { error } = await running;
  assert.ok(error, "the execute call did not succeed");
  const requests = await backend.requests();
  assert.ok(requests.some((r) => r.method === "DELETE" && r.path.includes("/processes/")), "the process tree was deleted before the worker exited");
  const cleaner = await startWorker();
  await cleaner.call("environmentDestroyLease", { ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  await cleaner.stop();
});

test("the Daytona package under the same worker manager: same host code, Bearer key on two origins", async () => {
  const handle = await startWorker({}, { worker: DAYTONA_WORKER, pluginManifest: daytonaManifest });
  const daytona = {
    driverKey: "daytona",
    companyId: COMPANY,
    environmentId: "environment-daytona",
    config: { apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl, apiKey: backend.key, timeoutMs: 60_000 },
  };
  const health = await handle.call("health", {});
  assert.match(health.message, /^Daytona provider component ready/);
  const lease = await handle.call("environmentAcquireLease", { ...daytona, runId: "run-host-daytona" });
  const chunks = [];
  const result = await handle.call(
    "environmentExecute",
    { ...daytona, lease, command: "sh", args: ["-c", "echo from-daytona; echo err >&2"] },
    60_000,
    (stream, chunk) => chunks.push({ stream, chunk }),
  );
  assert.equal(result.exitCode, 0);
  assert.equal(result.stdout, "from-daytona\n");
  assert.ok(chunks.some((c) => c.stream === "stdout" && c.chunk.includes("from-daytona")), "live log");
  const receipt = await handle.call("environmentDestroyLease", { ...daytona, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  assert.equal(receipt.state, "destroyed");
  assert.equal(JSON.stringify([lease, result, receipt, chunks]).includes(backend.key), false);
  await handle.stop();
});

test("the key never reached the second server", async () => {
  await stranger.flush();
  assert.deepEqual(stranger.seen, []);
});
