// Worker start and `execute true` under Paperclip's own worker manager
// (`createPluginWorkerHandle` from @paperclipai/server, as the server runs a
// plugin): `npm run bench:manager` after `npm run build` and the host
// suite's install (node/paperclip-host-test). Prints a Markdown table; see
// BENCHMARKS.md ("Paperclip plugin").
//
// 1. worker start: `handle.start()` (fork + the SDK's `initialize`, which
//    runs the plugin's setup) of the packed CreateOS package, against a
//    no-op worker written with the same SDK, importing its index as every
//    Paperclip provider does (Paperclip's own CreateOS provider among them:
//    its package is not on the npm registry, so it cannot run here; a
//    provider that loads the index starts no faster than this worker);
//    median of 10 after one warm-up, alternating.
// 2. first `execute true` on a freshly started worker (what the first
//    command pays for a lazily started component thread).
// 3. `execute true` on a warm worker, median of 30 after 3 warm-ups,
//    against an instant backend (a loopback proxy that answers the process
//    API itself at once, see instant-backend.mjs: only the plugin's cost and
//    its requests remain), against createos-local with `--isolation
//    process-group` (a plain fork/exec of `bash -lc true`), and against
//    createos-local with its bubblewrap sandbox per command.
import { randomUUID } from "node:crypto";
import { cpus, loadavg, tmpdir } from "node:os";
import { mkdtempSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startForkBackend, startInstantBackend } from "./instant-backend.mjs";

const { createPluginWorkerHandle } = await import("../paperclip-host-test/node_modules/@paperclipai/server/dist/services/plugin-worker-manager.js");
const { default: manifest } = await import("../packages/createos/dist/manifest.js");
const release = fileURLToPath(new URL("../../target/release/createos-local", import.meta.url));
const { existsSync } = await import("node:fs");
if (!process.env.CREATEOS_LOCAL_BIN && existsSync(release)) process.env.CREATEOS_LOCAL_BIN = release;
const { startBackend } = await import("../test/support/backend.mjs");

const WORKER = fileURLToPath(new URL("../packages/createos/dist/worker.js", import.meta.url));
const NOOP = fileURLToPath(new URL("./noop-worker.mjs", import.meta.url));
const LEDGER = path.join(mkdtempSync(path.join(tmpdir(), "bench-manager-")), "rate-budget.sqlite");
const store = new Map();
const key = (p) => `${p.scopeKind}|${p.scopeId ?? ""}|${p.namespace ?? ""}|${p.stateKey}`;
const hostHandlers = {
  "state.get": async (p) => store.get(key(p)) ?? null,
  "state.set": async (p) => void store.set(key(p), p.value),
  "state.delete": async (p) => void store.delete(key(p)),
};
const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};
const ms = (value) => `${value.toFixed(1)} ms`;
const now = () => performance.now();
const rows = [];
const row = (n, figure, measured, baseline, ratio) => rows.push(`| ${n} | ${figure} | ${measured} | ${baseline} | ${ratio} |`);

function handleFor(entrypointPath) {
  return createPluginWorkerHandle(manifest.id, {
    entrypointPath,
    manifest,
    config: {},
    instanceInfo: { instanceId: `bench-${randomUUID()}`, hostVersion: "2026.916.1" },
    apiVersion: 1,
    hostHandlers,
    autoRestart: false,
    // No rate limit: the figures compare per-command cost, as the Rust bench does.
    env: { PAPERCLIP_WASM_RATE_LEDGER: LEDGER, PAPERCLIP_WASM_RATE_LIMIT: "1000000/1000" },
  });
}

async function timedStart(entry) {
  const handle = handleFor(entry);
  const t = now();
  await handle.start();
  return { handle, took: now() - t };
}

const params = (backend) => ({
  driverKey: "createos",
  companyId: "bench",
  environmentId: "bench",
  config: { apiUrl: backend.url, apiKey: backend.key },
});

async function section1and2(backend) {
  const ours = [];
  const base = [];
  const first = [];
  for (let i = 0; i < 11; i++) {
    const a = await timedStart(WORKER);
    backend.instant?.(false);
    const lease = await a.handle.call("environmentAcquireLease", { ...params(backend), runId: `bench-${i}` });
    backend.instant?.(true);
    const t = now();
    const result = await a.handle.call("environmentExecute", { ...params(backend), lease, command: "true" }, 60_000);
    const firstTook = now() - t;
    if (result.exitCode !== 0) throw new Error(`true failed: ${JSON.stringify(result)}`);
    backend.instant?.(false);
    await a.handle.call("environmentDestroyLease", { ...params(backend), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    await a.handle.stop();
    const b = await timedStart(NOOP);
    await b.handle.stop();
    if (i > 0) ours.push(a.took), base.push(b.took), first.push(firstTook);
  }
  row(1, "worker start under Paperclip's worker manager (`start()`: fork + `initialize`), median of 10", ms(median(ours)), `no-op SDK worker (imports the SDK's index, as Paperclip's own providers do) ${ms(median(base))}`, `${(median(ours) / median(base)).toFixed(2)}x`);
  row(2, "first `execute true` on a just-started worker, after its acquire (instant backend), median of 10", ms(median(first)), "", "");
}

async function section3(backend, label) {
  const { handle } = await timedStart(WORKER);
  try {
    backend.instant?.(false);
    const lease = await handle.call("environmentAcquireLease", { ...params(backend), runId: "bench-warm" });
    backend.instant?.(true);
    const times = [];
    for (let i = 0; i < 33; i++) {
      const t = now();
      const result = await handle.call("environmentExecute", { ...params(backend), lease, command: "true" }, 60_000);
      if (result.exitCode !== 0) throw new Error(`true failed: ${JSON.stringify(result)}`);
      if (i >= 3) times.push(now() - t);
    }
    backend.instant?.(false);
    await handle.call("environmentDestroyLease", { ...params(backend), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    row(3, `\`execute true\` on a warm worker, ${label}, median of 30 (p90 ${ms([...times].sort((a, b) => a - b)[26])})`, ms(median(times)), "", "");
  } finally {
    await handle.stop();
  }
}

const started = now();
const instant = await startInstantBackend();
try {
  await section1and2(instant);
  await section3(instant, "instant backend");
  if (instant.answered() === 0) throw new Error("the instant backend answered nothing itself");
} finally {
  await instant.stop();
}
const fork = await startForkBackend();
try {
  await section3(fork, "createos-local `--isolation process-group` (fork/exec of `bash -lc true`)");
} finally {
  await fork.stop();
}
const real = await startBackend();
try {
  await section3(real, `createos-local, bubblewrap per command (${process.env.CREATEOS_LOCAL_BIN ? "release" : "debug"} build)`);
} finally {
  await real.stop();
}
console.log(`Node ${process.version}, ${cpus().length} cores (${cpus()[0]?.model}), load average ${loadavg().map((l) => l.toFixed(1)).join(" ")}, ${new Date().toISOString()}; run ${((now() - started) / 1000).toFixed(1)} s\n`);
console.log("| # | figure | measured | baseline | ratio |\n|---|---|---|---|---|");
for (const line of rows) console.log(line);
