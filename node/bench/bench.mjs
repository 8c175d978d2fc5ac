// Benchmarks of the Paperclip plugin (`npm run bench` after `npm run build`).
// Prints a Markdown table; nothing is asserted except that each result is
// right (a wrong result throws). See BENCHMARKS.md ("Paperclip plugin").
//
// 1. worker spawn -> first answer: `dist/worker.js` forked like Paperclip
//    does, timed from spawn to the `initialize` answer (which includes the
//    thread pool's first instance and `describe`), against a no-op worker
//    written with the same SDK.
// 2. per-call instance reuse: a call on a warm pool thread (reused instance)
//    against the cost of a fresh instance per call (instantiate, measured
//    inside the thread, plus the same call).
// 3. `execute` of `true` through the plugin's hooks against createos-local,
//    no rate limit (like the Rust bench's section 2), with the number of
//    HTTP requests per command; then the same with CreateOS's declared
//    limit (300 per 60 s) spent through the machine-wide budget.
// 4. the budget's cost per request: one start and its settle in the SQLite
//    ledger (node:sqlite, WAL, no fsync) against a request with no limit.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { cpus, loadavg } from "node:os";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import manifest from "../dist/manifest.js";
import { createPlugin } from "../dist/plugin.js";
import { ProviderPool } from "../dist/pool.js";
import { Worker } from "node:worker_threads";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

const release = fileURLToPath(new URL("../../target/release/createos-local", import.meta.url));
if (!process.env.CREATEOS_LOCAL_BIN && existsSync(release)) process.env.CREATEOS_LOCAL_BIN = release;
const { startBackend } = await import("../test/support/backend.mjs");

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};
const ms = (value) => (value >= 1 ? `${value.toFixed(2)} ms` : `${(value * 1000).toFixed(1)} µs`);
const rows = [];
const row = (n, figure, measured, baseline, ratio) => rows.push(`| ${n} | ${figure} | ${measured} | ${baseline} | ${ratio} |`);
const now = () => performance.now();

async function spawnToAnswer(entry) {
  const t0 = now();
  const child = spawn(process.execPath, [entry], { stdio: ["pipe", "pipe", "inherit"], env: { PATH: process.env.PATH, PAPERCLIP_CREATEOS_WASM_THREADS: "1" } });
  const lines = createInterface({ input: child.stdout });
  const answer = new Promise((resolve) => lines.on("line", (line) => resolve(JSON.parse(line))));
  child.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { manifest, config: {}, instanceInfo: { instanceId: "bench", hostVersion: "2026.916.1" }, apiVersion: 1 } })}\n`);
  const reply = await answer;
  const took = now() - t0;
  if (!reply.result?.ok) throw new Error(`initialize failed: ${JSON.stringify(reply)}`);
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id: 2, method: "shutdown", params: {} })}\n`);
  await exited;
  return took;
}

async function section1() {
  const worker = fileURLToPath(new URL("../dist/worker.js", import.meta.url));
  const noop = fileURLToPath(new URL("./noop-worker.mjs", import.meta.url));
  const ours = [];
  const base = [];
  for (let i = 0; i < 11; i++) {
    const a = await spawnToAnswer(worker);
    const b = await spawnToAnswer(noop);
    if (i > 0) ours.push(a), base.push(b);
  }
  const [o, b] = [median(ours), median(base)];
  row(1, "worker spawn → `initialize` answer (pool of 1, first instance, `describe`; median of 10)", ms(o), `no-op SDK worker: ${ms(b)}`, `${(o / b).toFixed(2)}x`);
  row(1, "cost of the component in the first answer (median difference)", `+${ms(o - b)}`, "", "");
}

async function section2() {
  const pool = new ProviderPool({ size: 1 });
  await pool.ready();
  const config = JSON.stringify({ apiUrl: "http://127.0.0.1:9" });
  const reused = [];
  for (let i = 0; i < 220; i++) {
    const t = now();
    const result = await pool.call("validateConfig", [config]).result;
    if (i >= 20) reused.push(now() - t);
    if (!result.ok) throw new Error("validate failed");
  }
  await pool.close();
  const instantiate = [];
  for (let i = 0; i < 10; i++) {
    const fresh = new ProviderPool({ size: 1 });
    const [took] = await fresh.ready();
    instantiate.push(took);
    await fresh.close();
  }
  const [r, f] = [median(reused), median(instantiate)];
  row(2, "call on a warm thread, instance reused (`validate-config`, median of 200)", ms(r), `fresh instance per call: instantiate ${ms(f)} (median of 10) + the call`, `${((f + r) / r).toFixed(0)}x cheaper`);
}

/**
 * `execute` of `true`: one plugin without a limit and one spending CreateOS's
 * declared limit through its own budget file, commands alternating between
 * the two (so that load changes of the machine hit both alike).
 */
async function section3() {
  const backend = await startBackend();
  const params = { driverKey: "createos", companyId: "bench", environmentId: "bench", config: { apiUrl: backend.url, apiKey: backend.key } };
  const make = async (limited) => {
    const ledger = path.join(mkdtempSync(path.join(tmpdir(), "bench-budget-")), "rate-budget.sqlite");
    const hooks = createPlugin({ poolSize: 2, env: {}, rateLimit: limited ? undefined : null, rateLedgerPath: ledger }).definition;
    const harness = createEnvironmentTestHarness({ manifest, environmentDriver: { driverKey: "createos" } });
    await hooks.setup(harness.ctx);
    const lease = await hooks.onEnvironmentAcquireLease({ ...params, runId: "bench" });
    return { hooks, lease, times: [] };
  };
  const free = await make(false);
  const limited = await make(true);
  try {
    let requests = 0;
    for (let i = 0; i < 33; i++) {
      for (const plugin of i % 2 ? [free, limited] : [limited, free]) {
        await backend.clearRequests();
        const t = now();
        const result = await plugin.hooks.onEnvironmentExecute({ ...params, lease: plugin.lease, command: "true" });
        const took = now() - t;
        if (result.exitCode !== 0) throw new Error(`true failed: ${JSON.stringify(result)}`);
        if (i < 3) continue;
        plugin.times.push(took);
        if (plugin === free) requests += (await backend.requests()).length;
      }
    }
    const waits = (await limited.hooks.onHealth()).details.rateLimitWaits;
    const [a, b] = [median(free.times), median(limited.times)];
    row(3, "`execute` of `true` through the plugin (worker thread, jco), median of 30, no rate limit", ms(a), "Rust host: see BENCHMARKS.md", "");
    row(3, "HTTP requests per command", (requests / free.times.length).toFixed(1), "", "");
    row(3, `the same, CreateOS's declared limit (300 per 60 s) through the shared budget, commands alternating with the row above (requests that waited: ${waits})`, ms(b), `no limit ${ms(a)}`, `${(b / a).toFixed(2)}x`);
    return { median: a, backend: process.env.CREATEOS_LOCAL_BIN ?? "target/debug/createos-local" };
  } finally {
    for (const plugin of [free, limited]) {
      await plugin.hooks.onEnvironmentDestroyLease({ ...params, providerLeaseId: plugin.lease.providerLeaseId, leaseMetadata: plugin.lease.metadata });
      await plugin.hooks.onShutdown();
    }
    await backend.stop();
  }
}

/** Per-request cost of the budget, timed inside a worker thread (the budget blocks with Atomics.wait). */
async function section4() {
  const source = `
    const { workerData, parentPort } = require("node:worker_threads");
    import(workerData.pacerUrl).then(({ Pacer, createPacerBuffer }) => {
      const limit = { requests: 300, windowMs: 60000 };
      const rounds = [];
      for (let round = 0; round < 7; round++) {
        const pacer = new Pacer(createPacerBuffer(), workerData.dir + "/round-" + round + ".sqlite");
        pacer.acquire("http://bench", limit, "work", { deadlineMs: Infinity }).settle();
        const t = performance.now();
        for (let i = 0; i < 250; i++) pacer.acquire("http://bench", limit, "work", { deadlineMs: Infinity }).settle();
        const limited = (performance.now() - t) / 250;
        const u = performance.now();
        for (let i = 0; i < 250; i++) pacer.acquire("http://bench", undefined, "work", { deadlineMs: Infinity }).settle();
        rounds.push([limited, (performance.now() - u) / 250]);
      }
      parentPort.postMessage(rounds);
    });`;
  const dir = mkdtempSync(path.join(tmpdir(), "bench-ledger-"));
  const rounds = await new Promise((resolve, reject) => {
    const worker = new Worker(source, { eval: true, workerData: { pacerUrl: new URL("../dist/pacer.js", import.meta.url).href, dir } });
    worker.once("message", resolve);
    worker.once("error", reject);
  });
  const limited = median(rounds.map(([l]) => l));
  const free = median(rounds.map(([, f]) => f));
  row(4, "budget cost per request: start + settle in the SQLite ledger (median of 7 rounds of 250, window filling up to 251)", ms(limited), `no limit: ${ms(free)}`, `+${ms(limited - free)} per request`);
}

const started = now();
await section1();
await section2();
const execute = await section3();
await section4();
console.log(`Node ${process.version}, ${cpus().length} cores (${cpus()[0]?.model}), load average ${loadavg().map((l) => l.toFixed(1)).join(" ")}, ${new Date().toISOString()}; backend ${execute.backend}; run ${((now() - started) / 1000).toFixed(1)} s\n`);
console.log("| # | figure | measured | baseline | ratio |\n|---|---|---|---|---|");
for (const line of rows) console.log(line);
