#!/usr/bin/env node
// Full Paperclip end to end: a real Paperclip server (`paperclipai
// test-drive`, embedded PostgreSQL) installs each packed plugin
// (node/packages/<driver>) from its path and runs `environment
// probe-config` for a `sandbox` environment on each driver against
// createos-local. Paperclip then acquires a lease through the plugin, runs
// a command in it and releases it; no LLM is involved. Then one whole agent
// run per driver (issue 44 item 6): an agent with Paperclip's `claude_local`
// adapter whose `command` is our stand-in (`agent-standin.sh`, which speaks
// the adapter's stream-json and does real shell work), in a sandbox
// environment of that plugin, woken once; the run record, its log, the file
// the stand-in wrote (back on the host) and the lease's release are checked.
// The same run on Paperclip's local environment (on the host) is the
// baseline the run times are printed beside. Then Paperclip's custom-image
// flow on the CreateOS environment (issue 43 item 4): a setup session
// finished into a template, an agent run from it, the template deleted.
//
//   cd node && npm run build && (cd paperclip-host-test && npm install --no-save)
//   npm run e2e                      # from node/
//   npm run e2e -- --plugins DIR     # or PAPERCLIP_E2E_PLUGINS=DIR: the plugins
//                                    # in DIR/createos and DIR/daytona instead
//
// DIR is how CI's release check runs it (issue 39 item 6): each package
// `npm pack`ed, unpacked outside the checkout and installed there with
// `npm ci --omit=dev`, so Paperclip runs the tarball's plugin, with only
// the packages its npm-shrinkwrap.json pins. As root, DIR is bind-mounted
// into the data directory like node/ (its own contents must be readable
// by others).
//
// Only loopback traffic: the whole run happens in a network namespace of its
// own with nothing but `lo` (`unshare --net`), so neither Paperclip nor the
// plugin can reach anything else. Embedded PostgreSQL refuses to run as
// root, so as root Paperclip runs as `nobody` (setpriv) with a data
// directory it owns; otherwise as the calling user. As root the run also
// gets a mount namespace of its own, where node/ is bind-mounted inside
// that data directory, so `nobody` reaches the CLI, Node and the packages
// even when the checkout lives under a directory only root may enter. The
// stand-in must exist in the sandbox before Paperclip syncs anything (the
// adapter looks for its command first), so it is put in a tmpfs mounted over
// /opt in the run's own mount namespace (every sandbox sees the host's /opt
// read-only); the host's /opt is untouched.
//
// Needs: node/packages/{createos,daytona} (`npm run build`) or DIR, `paperclipai`
// in node/paperclip-host-test/node_modules, target/debug/createos-local
// (`cargo build --workspace`; CREATEOS_LOCAL_BIN overrides), util-linux's
// `unshare` and `setpriv`, and iproute2's `ip`.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeDir = realpathSync(path.resolve(here, ".."));
const paperclipCli = path.join(nodeDir, "paperclip-host-test", "node_modules", "paperclipai", "dist", "index.js");
const backendBinary = process.env.CREATEOS_LOCAL_BIN ?? path.resolve(nodeDir, "..", "target", "debug", "createos-local");
const NOBODY = 65534;
const started = performance.now();
const elapsed = () => `${((performance.now() - started) / 1000).toFixed(1)} s`;

function fail(message) {
  console.error(`e2e: ${message}`);
  process.exit(1);
}

// 1. A network namespace of our own, with only loopback up.
if (process.env.PAPERCLIP_E2E_IN_NETNS !== "1") {
  const userns = process.getuid() === 0 ? ["--mount"] : ["--user", "--map-current-user", "--mount"];
  const child = spawnSync(
    "unshare",
    [...userns, "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', process.execPath, fileURLToPath(import.meta.url), ...process.argv.slice(2)],
    { stdio: "inherit", env: { ...process.env, PAPERCLIP_E2E_IN_NETNS: "1" } },
  );
  if (child.error) fail(`cannot create a network namespace (${child.error.message}); util-linux's unshare is needed`);
  process.exit(child.status ?? 1);
}

const PACKAGES = [
  {
    driver: "createos",
    config: (b) => ({ apiUrl: b.url }),
  },
  {
    driver: "daytona",
    config: (b) => ({ apiUrl: `${b.url}/daytona/api`, toolboxUrl: b.toolboxUrl }),
  },
];
/** Where the plugins are: --plugins DIR, else PAPERCLIP_E2E_PLUGINS, else node/packages. */
const pluginsArg = process.argv.indexOf("--plugins");
if (pluginsArg >= 0 && !process.argv[pluginsArg + 1]) fail("--plugins needs a directory holding createos/ and daytona/");
const pluginsGiven = path.resolve(pluginsArg >= 0 ? process.argv[pluginsArg + 1] : process.env.PAPERCLIP_E2E_PLUGINS || path.join(nodeDir, "packages"));
if (!existsSync(pluginsGiven)) fail(`the plugins' directory ${pluginsGiven} does not exist: it holds createos/ and daytona/ (\`npm run build\` makes node/packages)`);
const pluginsDir = realpathSync(pluginsGiven);
const pluginsInNode = pluginsDir === nodeDir || pluginsDir.startsWith(nodeDir + path.sep);
for (const { driver } of PACKAGES) {
  const dir = path.join(pluginsDir, driver);
  if (!existsSync(path.join(dir, "dist", "manifest.js"))) {
    fail(pluginsInNode ? `${dir} holds no packed plugin: run \`npm run build\` in node/ (after ./build.sh)` : `${dir} holds no packed plugin (no dist/manifest.js): unpack the plugin's npm pack tarball there`);
  }
  if (!pluginsInNode && !existsSync(path.join(dir, "node_modules", "@paperclipai", "plugin-sdk"))) {
    fail(`${dir} has no dependencies installed: run \`npm ci --omit=dev\` in it first (Paperclip runs a local plugin in place)`);
  }
}
if (!existsSync(paperclipCli)) fail("paperclipai is not installed: run `npm install --no-save` in node/paperclip-host-test");
if (!existsSync(backendBinary)) fail(`createos-local is missing at ${backendBinary}: run \`cargo build --workspace\` at the repository root`);

const asRoot = process.getuid() === 0;
const data = mkdtempSync(path.join(tmpdir(), "paperclip-e2e-"));
/** node/ as Paperclip sees it: bind-mounted into the data directory when Paperclip runs as nobody. */
let visibleNode = nodeDir;
if (asRoot) {
  chownSync(data, NOBODY, NOBODY);
  chmodSync(data, 0o700);
  visibleNode = path.join(data, "node");
  mkdirSync(visibleNode);
  const mounted = spawnSync("mount", ["--bind", nodeDir, visibleNode], { encoding: "utf8" });
  if (mounted.status !== 0) fail(`cannot bind-mount node/ for the unprivileged Paperclip: ${mounted.stderr.trim()}`);
}
/** The plugins' directory as Paperclip sees it: bind-mounted too when it lies outside node/ and Paperclip runs as nobody. */
let visiblePlugins = pluginsDir;
if (asRoot && !pluginsInNode) {
  for (const { driver } of PACKAGES) {
    for (const dir of [pluginsDir, path.join(pluginsDir, driver)]) {
      if ((statSync(dir).mode & 0o005) !== 0o005) fail(`${dir} is not readable by others, so Paperclip (running as nobody) cannot load the plugin: chmod a+rX it`);
    }
  }
  visiblePlugins = path.join(data, "plugins");
  mkdirSync(visiblePlugins);
  const mounted = spawnSync("mount", ["--bind", pluginsDir, visiblePlugins], { encoding: "utf8" });
  if (mounted.status !== 0) fail(`cannot bind-mount ${pluginsDir} for the unprivileged Paperclip: ${mounted.stderr.trim()}`);
}
/** Where the stand-in agent lives, in a tmpfs over /opt of this mount namespace only. */
const STANDIN = "/opt/paperclip-e2e/agent-standin";
{
  const mounted = spawnSync("mount", ["-t", "tmpfs", "-o", "mode=755,size=1m", "paperclip-e2e", "/opt"], { encoding: "utf8" });
  if (mounted.status !== 0) fail(`cannot mount a tmpfs over /opt in the run's mount namespace: ${mounted.stderr.trim()}`);
  mkdirSync(path.dirname(STANDIN), { mode: 0o755 });
  copyFileSync(path.join(here, "agent-standin.sh"), STANDIN);
  chmodSync(STANDIN, 0o755);
}
/** Whether `dir` is a mount point in this mount namespace (/proc/self/mountinfo, field 5). */
function isMountPoint(dir) {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((line) => line.split(" ")[4] === dir);
}
/** A path under node/ as Paperclip sees it. */
const visible = (file) =>
  file.startsWith(nodeDir + path.sep)
    ? path.join(visibleNode, path.relative(nodeDir, file))
    : file.startsWith(pluginsDir + path.sep)
      ? path.join(visiblePlugins, path.relative(pluginsDir, file))
      : file;
/** Paperclip's own environment: nothing of ours but what it needs; no telemetry. */
const paperclipEnv = {
  PATH: process.env.PATH ?? "/usr/bin:/bin",
  HOME: data,
  PAPERCLIP_TELEMETRY_DISABLED: "1",
  DO_NOT_TRACK: "1",
  // test-drive stores an agent credential as a company secret; nothing calls the LLM.
  ANTHROPIC_API_KEY: "e2e-no-llm-is-called",
};
/** argv to run `paperclipai ARGS` (as nobody when we are root). */
const paperclip = (args) =>
  asRoot
    ? ["setpriv", ["--reuid", String(NOBODY), "--regid", String(NOBODY), "--clear-groups", visible(process.execPath), visible(paperclipCli), ...args]]
    : [process.execPath, [paperclipCli, ...args]];

const cleanups = [];
async function cleanup() {
  for (const step of cleanups.reverse()) await step().catch((error) => console.error(`e2e: cleanup: ${error.message}`));
}

/** Starts createos-local with a random key and its Daytona toolbox on a second port. */
async function startBackend() {
  const key = `e2e-key-${randomBytes(12).toString("hex")}`;
  const child = spawn(backendBinary, ["--port", "0", "--toolbox-port", "0", "--api-key", key], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const lines = createInterface({ input: child.stdout });
  const [url, toolbox] = await new Promise((resolve, reject) => {
    const seen = [];
    lines.on("line", (line) => {
      const match = /(?:listening|toolbox) on (http:\/\/\S+)/.exec(line);
      if (match) seen.push(match[1]);
      if (seen.length === 2) resolve(seen);
    });
    child.once("exit", (code) => reject(new Error(`createos-local exited with ${code}: ${stderr}`)));
  });
  const stop = async () => {
    if (child.exitCode !== null) return stderr;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    await exited;
    return stderr;
  };
  return { url, toolboxUrl: `${toolbox}/toolbox`, key, stop };
}

/** Starts `paperclipai test-drive`; resolves with its API base once it says it is ready. */
async function startPaperclip() {
  const [file, args] = paperclip(["test-drive", "--data-dir", path.join(data, "instance"), "--no-browser"]);
  const child = spawn(file, args, { cwd: data, env: paperclipEnv, stdio: ["ignore", "pipe", "pipe"], detached: true });
  let log = "";
  const record = (chunk) => {
    log += chunk;
    if (log.length > 2_000_000) log = log.slice(-1_000_000);
  };
  child.stdout.on("data", record);
  child.stderr.on("data", record);
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    process.kill(-child.pid, "SIGTERM");
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
    }, 20_000);
    await exited;
    clearTimeout(timer);
  };
  // Stopped (with its PostgreSQL) however the run ends, even if it never became ready.
  cleanups.push(stop);
  const apiBase = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("Paperclip did not become ready within 180 s")), 180_000);
    const check = () => {
      // eslint-disable-next-line no-control-regex
      const plain = log.replace(/\u001b\[[0-9;]*m/g, "");
      const match = /Paperclip is ready at (http:\/\/127\.0\.0\.1:\d+)/.exec(plain);
      if (match) {
        clearTimeout(timer);
        resolve(`${match[1]}`);
      }
    };
    child.stdout.on("data", check);
    child.stderr.on("data", check);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`paperclipai test-drive exited with ${code}`));
    });
  });
  return { apiBase, stop, log: () => log };
}

/** Runs a `paperclipai` CLI command against the server; its parsed JSON output. */
function cli(apiBase, args) {
  const [file, argv] = paperclip([...args, "--api-base", apiBase, "--data-dir", path.join(data, "instance"), "--json"]);
  const result = spawnSync(file, argv, { cwd: data, env: paperclipEnv, encoding: "utf8", timeout: 180_000 });
  if (result.status !== 0) throw new Error(`paperclipai ${args.slice(0, 2).join(" ")} failed (${result.status}): ${(result.stderr || result.stdout).trim().slice(0, 2000)}`);
  try {
    return JSON.parse(result.stdout);
  } catch {
    throw new Error(`paperclipai ${args.slice(0, 2).join(" ")} printed no JSON: ${result.stdout.slice(0, 500)}`);
  }
}

/** Paperclip's HTTP API (test-drive is `local_trusted`: loopback calls need no auth); the parsed answer. */
async function api(apiBase, method, route, body) {
  const response = await fetch(`${apiBase}${route}`, {
    method,
    headers: body ? { "content-type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${route} answered HTTP ${response.status}: ${text.slice(0, 1000)}`);
  return text ? JSON.parse(text) : null;
}

/** A run's whole log, as Paperclip stored it: NDJSON records `{stream, chunk}`. */
async function runLog(apiBase, runId) {
  const records = [];
  for (let offset = 0; ; ) {
    const page = await api(apiBase, "GET", `/api/heartbeat-runs/${runId}/log?offset=${offset}&limitBytes=262144`);
    const content = page?.content ?? "";
    for (const line of content.split("\n")) {
      if (!line.trim()) continue;
      try {
        records.push(JSON.parse(line));
      } catch {
        // A line Paperclip did not write as JSON is not a stream record.
      }
    }
    const next = typeof page?.nextOffset === "number" ? page.nextOffset : offset + Buffer.byteLength(content);
    if (!content || next <= offset) return records;
    offset = next;
  }
}

const TERMINAL = new Set(["succeeded", "failed", "cancelled", "timed_out"]);
/** How long one agent run may take before the e2e gives up on it (a bound on waiting, not a measurement). */
const RUN_LIMIT_MS = 150_000;

/**
 * One agent run: a workspace on the host holding `e2e-input.txt`, an agent
 * with the `claude_local` adapter whose command is the stand-in (in the
 * environment `environmentId`, else Paperclip's local one), one wakeup,
 * waited for until it ends. Returns what the checks need and the run's
 * time from the wakeup to its end.
 */
async function agentRun(apiBase, companyId, label, environmentId) {
  const workspace = path.join(data, `agent-${label}`);
  mkdirSync(workspace);
  const input = `input for ${label} ${randomBytes(4).toString("hex")}`;
  writeFileSync(path.join(workspace, "e2e-input.txt"), `${input}\n`);
  if (asRoot) {
    chownSync(workspace, NOBODY, NOBODY);
    chownSync(path.join(workspace, "e2e-input.txt"), NOBODY, NOBODY);
  }
  const name = `e2e-${label}`;
  const agent = cli(apiBase, [
    "agent",
    "create",
    "-C",
    companyId,
    "--payload-json",
    JSON.stringify({
      name,
      adapterType: "claude_local",
      adapterConfig: { command: STANDIN, cwd: workspace, engine: "cli" },
      ...(environmentId ? { defaultEnvironmentId: environmentId } : {}),
    }),
  ]);
  const t0 = performance.now();
  const woken = await api(apiBase, "POST", `/api/agents/${agent.id}/wakeup`, { source: "on_demand", triggerDetail: "manual" });
  if (!woken?.id) throw new Error(`the wakeup of ${name} started no run: ${JSON.stringify(woken).slice(0, 500)}`);
  let run = woken;
  const giveUp = Date.now() + RUN_LIMIT_MS;
  while (!TERMINAL.has(run.status)) {
    if (Date.now() > giveUp) throw new Error(`the run of ${name} did not end within ${RUN_LIMIT_MS / 1000} s (status ${run.status})`);
    await new Promise((resolve) => setTimeout(resolve, 200));
    run = await api(apiBase, "GET", `/api/heartbeat-runs/${woken.id}`);
  }
  const ms = Math.round(performance.now() - t0);
  const log = await runLog(apiBase, run.id);
  const text = (stream) => log.filter((r) => r.stream === stream).map((r) => r.chunk).join("");
  return { name, agent, run, ms, log, stdout: text("stdout"), stderr: text("stderr"), system: text("system"), workspace, input };
}

/** The environment's leases once none is active any more (Paperclip releases a run's lease after the run ends). */
async function settledLeases(apiBase, environmentId) {
  const giveUp = Date.now() + 60_000;
  for (;;) {
    const leases = await api(apiBase, "GET", `/api/environments/${environmentId}/leases`);
    if (!leases.some((lease) => lease.status === "active") || Date.now() > giveUp) return leases;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** The checks of one agent run (`leases`: the environment's leases, for a sandbox run). */
function agentRunChecks(result, leases) {
  const { name, run, stdout, stderr, workspace, input } = result;
  const written = path.join(workspace, "e2e-output.txt");
  const back = existsSync(written) ? readFileSync(written, "utf8") : undefined;
  const checks = [
    [run.status === "succeeded", `the run succeeded (status ${run.status}${run.error ? `: ${String(run.error).slice(0, 300)}` : ""})`],
    [stdout.includes(`stand-in: read the synced file: ${input}\n`), "stdout shows the synced file read in the run's directory"],
    [stdout.includes("stand-in: the subcommand exited with 7\n"), "stdout shows the failing subcommand's exit code 7"],
    [stdout.includes(`stand-in: Paperclip says I am ${name}\n`), "the call back into Paperclip answered with the agent's name"],
    [stdout.includes('"type":"result","subtype":"success"'), "stdout holds the stream-json result line as printed"],
    [stderr.includes("stand-in: a line on stderr\n") && stderr.includes("stand-in: this subcommand fails on purpose\n"), "stderr holds both lines printed there"],
    [!stdout.includes("stand-in: a line on stderr"), "no stderr line was logged as stdout"],
    [back === `written by the stand-in after reading: ${input}\n`, `the file the stand-in wrote is back on the host (${back === undefined ? "missing" : JSON.stringify(back.slice(0, 100))})`],
  ];
  if (leases) {
    const lease = leases.find((l) => l.heartbeatRunId === run.id) ?? leases.at(-1);
    checks.push([
      lease?.status === "released" && lease?.cleanupStatus === "success",
      `the run's lease was released with a confirmed cleanup (status ${lease?.status}, cleanup ${lease?.cleanupStatus})`,
    ]);
    const remoteCwd = /"remoteCwd":"([^"]*)"/.exec(JSON.stringify(lease?.metadata ?? {}))?.[1];
    checks.push([remoteCwd !== undefined && remoteCwd.endsWith("/workspace"), `the agent worked in the lease's own directory (remoteCwd ${remoteCwd})`]);
  }
  return checks;
}

/**
 * The engine's own word on a released lease's sandbox: gone (404) or
 * deleted, so nothing of the run can still execute there.
 */
async function sandboxGone(backend, driver, lease) {
  const id = lease?.providerLeaseId;
  if (!id) return [false, "the lease names no sandbox"];
  const [url, headers] =
    driver === "createos"
      ? [`${backend.url}/v1/sandboxes/${encodeURIComponent(id)}`, { "x-api-key": backend.key }]
      : [`${backend.url}/daytona/api/sandbox/${encodeURIComponent(id)}`, { authorization: `Bearer ${backend.key}` }];
  const response = await fetch(url, { headers });
  const body = await response.text();
  if (response.status === 404) return [true, `sandbox ${id} is gone at the engine (404)`];
  const state = /"(?:status|state)":"([^"]+)"/.exec(body)?.[1];
  return [/destroy|delet/.test(state ?? ""), `sandbox ${id} at the engine: HTTP ${response.status}, state ${state}`];
}

let paperclipServer;
let failures = 0;
try {
  const backend = await startBackend();
  cleanups.push(async () => {
    const stderr = await backend.stop();
    if (!/none survived/.test(stderr)) {
      failures++;
      console.error(`e2e: FAIL createos-local did not report every process tree gone:\n${stderr.slice(-1000)}`);
    }
  });
  cleanups.push(async () => {
    // The bind mount goes first (it is node/ itself), then the data directory.
    // Paperclip's plugin workers and PostgreSQL may still be exiting (they run
    // from node/), so a busy mount is tried again for a while.
    for (const [mounted, source] of [
      [visiblePlugins, pluginsDir],
      [visibleNode, nodeDir],
    ]) {
      let busy = "";
      for (let attempt = 0; mounted !== source && attempt < 60; attempt++) {
        const unmounted = spawnSync("umount", [mounted], { encoding: "utf8" });
        if (unmounted.status === 0 || !isMountPoint(mounted)) break;
        busy = unmounted.stderr.trim();
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      if (mounted !== source && isMountPoint(mounted)) throw new Error(`${mounted} is still mounted (${busy}); not removing the data directory`);
    }
    rmSync(data, { recursive: true, force: true });
  });
  paperclipServer = await startPaperclip();
  console.log(`e2e: Paperclip ready at ${paperclipServer.apiBase} (${elapsed()}), createos-local at ${backend.url}, running as ${asRoot ? "nobody" : "this user"} in a loopback-only network namespace; plugins from ${pluginsDir}`);
  const [company] = cli(paperclipServer.apiBase, ["company", "list"]);
  /** Each driver's declared `duplexCommandStream` (its installed manifest). */
  const declaredDuplex = {};
  if (!company?.id) throw new Error("test-drive created no company");

  for (const { driver, config } of PACKAGES) {
    const packageDir = visible(path.join(pluginsDir, driver));
    const packageVersion = JSON.parse(readFileSync(path.join(pluginsDir, driver, "package.json"), "utf8")).version;
    const t0 = performance.now();
    cli(paperclipServer.apiBase, ["plugin", "install", "--local", packageDir]);
    const installed = cli(paperclipServer.apiBase, ["plugin", "list"]).find((p) => p.manifestJson?.environmentDrivers?.some((d) => d.driverKey === driver));
    if (!installed) throw new Error(`after installing ${packageDir}, Paperclip lists no plugin with driver ${driver}`);
    const probe = (apiKey) =>
      cli(paperclipServer.apiBase, [
        "environment",
        "probe-config",
        "-C",
        company.id,
        "--payload-json",
        JSON.stringify({ driver: "sandbox", config: { provider: driver, ...config(backend), apiKey } }),
      ]);
    const good = probe(backend.key);
    const bad = probe(`wrong-${randomBytes(8).toString("hex")}`);
    const ms = Math.round(performance.now() - t0);
    const text = JSON.stringify([good, bad, installed]);
    const checks = [
      [good.ok === true, `probe-config ok (${good.summary})`],
      [/created, ran and deleted a sandbox/.test(good.summary ?? ""), "the probe created, ran and deleted a sandbox"],
      [good.details?.pluginKey === `sandbox-provider.${driver}-wasm`, `served by plugin ${good.details?.pluginKey}`],
      [installed.manifestJson?.version === packageVersion, `installed version ${installed.manifestJson?.version} is the package's (${packageVersion})`],
      [bad.ok === false && /HTTP 401/.test(bad.summary ?? ""), `a wrong key is refused (${bad.summary})`],
      [!text.includes(backend.key), "the key is in no answer and not in the installed manifest"],
    ];
    // Issue 38 item 5: Paperclip lists the login terminal for the driver exactly as its package declares it (from its component's capabilities).
    const declared = installed.manifestJson?.environmentDrivers?.find((d) => d.driverKey === driver) ?? {};
    declaredDuplex[driver] = declared.sandboxCapabilities?.duplexCommandStream === true;
    const capabilities = await api(paperclipServer.apiBase, "GET", `/api/companies/${company.id}/environments/capabilities`);
    const listed = capabilities?.sandboxProviders?.[driver]?.supportsLoginPty;
    checks.push([listed === (declared.supportsLoginPty === true), `Paperclip lists supportsLoginPty ${listed} for the driver, as its package declares (${declared.supportsLoginPty === true})`]);
    // Both packages offer both (Daytona's duplex channel was held back until its agent run stopped stalling).
    checks.push([listed === true && declaredDuplex[driver], "the package offers the login terminal and the duplex command stream"]);
    for (const [ok, what] of checks) {
      if (!ok) failures++;
      console.log(`e2e: ${ok ? "ok  " : "FAIL"} ${driver}: ${what}`);
    }
    console.log(`e2e: ${driver}: install + two probes in ${ms} ms`);
  }

  // Issue 38 item 5: with the instance's duplex bridge on, a run in an
  // environment whose driver has the duplex command stream effective
  // carries the agent's calls back to Paperclip as HTTP/2 over one duplex
  // channel of the plugin (instead of polling a request directory).
  await api(paperclipServer.apiBase, "PATCH", "/api/instance/settings/experimental", { enableSandboxDuplexBridge: true });

  // Issue 44 item 6: one whole agent run per driver, and the same run on
  // Paperclip's local environment as the baseline.
  const times = {};
  /** Each driver's sandbox environment of the agent runs. */
  const environments = {};
  for (const { driver, config } of [...PACKAGES, { driver: "local" }]) {
    let environmentId;
    if (config) {
      const environment = cli(paperclipServer.apiBase, [
        "environment",
        "create",
        "-C",
        company.id,
        "--payload-json",
        JSON.stringify({ name: `e2e ${driver} sandbox`, driver: "sandbox", config: { provider: driver, ...config(backend), apiKey: backend.key } }),
      ]);
      environmentId = environment.id;
      environments[driver] = environmentId;
    }
    const admin = (method, route) => fetch(`${backend.url}/_admin/${route}`, { method, headers: { "x-api-key": backend.key } });
    await admin("DELETE", "requests");
    const result = await agentRun(paperclipServer.apiBase, company.id, driver, environmentId);
    const recorded = await (await admin("GET", "requests")).json();
    const engineRequests = (recorded?.data?.requests ?? recorded?.requests ?? recorded?.data ?? []).length;
    const leases = environmentId ? await settledLeases(paperclipServer.apiBase, environmentId) : undefined;
    const checks = agentRunChecks(result, leases);
    if (config) {
      const log = `${result.system}${result.stdout}${result.stderr}`;
      const overDuplex = /Sandbox HTTP\/2 transport ready/.test(log);
      checks.push(
        declaredDuplex[driver]
          ? [overDuplex && !/Using the file bridge/.test(log), "the agent's calls back to Paperclip went over the plugin's duplex channel (HTTP/2 transport ready, no file bridge)"]
          : [!overDuplex, "no duplex channel without the capability (the file bridge)"],
      );
    }
    if (leases) checks.push(await sandboxGone(backend, driver, leases.find((l) => l.heartbeatRunId === result.run.id) ?? leases.at(-1)));
    checks.push([!JSON.stringify([result.run, result.stdout, result.stderr, result.system, leases]).includes(backend.key), "the key is in no run record, log or lease"]);
    for (const [ok, what] of checks) {
      if (!ok) failures++;
      console.log(`e2e: ${ok ? "ok  " : "FAIL"} ${driver} agent run: ${what}`);
    }
    if (checks.some(([ok]) => !ok)) {
      const workerLines = paperclipServer.log().split("\n").filter((line) => /duplex|retir|worker (process|status)|loginPty|plugin-worker/i.test(line));
      console.error(`--- ${driver} agent run: Paperclip's plugin worker lines ---\n${workerLines.slice(-30).join("\n")}`);
      console.error(`--- ${driver} agent run: Paperclip's log of the run ---\n${result.system.slice(-4000)}\n--- stdout ---\n${result.stdout.slice(-2000)}\n--- stderr ---\n${result.stderr.slice(-2000)}`);
    }
    if (process.env.PAPERCLIP_E2E_TIMELINE === "1") {
      // Where a run's time goes: each log record's time after the wakeup (BENCHMARKS.md).
      const start = Date.parse(result.run.createdAt ?? result.run.startedAt ?? "") || Date.parse(result.log[0]?.ts ?? "");
      for (const record of result.log) {
        const at = Date.parse(record.ts ?? "");
        const line = String(record.chunk).split("\n")[0].slice(0, 140);
        console.log(`e2e: ${driver} timeline +${Number.isFinite(at - start) ? at - start : "?"} ms [${record.stream}] ${line}`);
      }
    }
    times[driver] = environmentId ? `${result.ms} ms, ${engineRequests} requests to the engine` : `${result.ms} ms`;
    times[`${driver}Ms`] = result.ms;
  }
  // Issue 43 item 4: Paperclip's custom-image flow through the CreateOS
  // plugin (its component has templates): a setup session (a setup lease),
  // finished (the template captured and written into the environment's
  // config, the setup sandbox cancelled), an agent run whose lease starts
  // from that template, then the template disabled and deleted at the
  // provider.
  {
    const environmentId = environments.createos;
    const q = `?companyId=${company.id}`;
    const templates = async () => {
      const answer = await (await fetch(`${backend.url}/v1/templates`, { headers: { "x-api-key": backend.key } })).json();
      return answer?.data?.templates ?? answer?.data ?? answer?.templates ?? answer;
    };
    const before = (await templates()).length;
    const started = await api(paperclipServer.apiBase, "POST", `/api/environments/${environmentId}/custom-image-setup-sessions${q}`, {});
    const sessionId = started.session.id;
    const finished = await api(paperclipServer.apiBase, "POST", `/api/environment-custom-image-setup-sessions/${sessionId}/finish${q}`, {});
    const overview = await api(paperclipServer.apiBase, "GET", `/api/environments/${environmentId}/custom-image-template${q}`);
    const afterCapture = await templates();
    const run = await agentRun(paperclipServer.apiBase, company.id, "createos from its template", environmentId);
    const leases = await settledLeases(paperclipServer.apiBase, environmentId);
    const lease = leases.find((l) => l.heartbeatRunId === run.run.id) ?? leases.at(-1);
    const disabled = await api(paperclipServer.apiBase, "DELETE", `/api/environments/${environmentId}/custom-image-template${q}&deleteProviderTemplate=true`);
    const afterDelete = await templates();
    const checks = [
      [started.session.status === "waiting_for_user", `the setup session waits for the user (${started.session.status})`],
      [finished.session?.status === "promoted" && finished.template?.status === "active", `finish promoted a template (${finished.session?.status}, ${finished.template?.status})`],
      [afterCapture.length === before + 1, `the engine holds the captured template (${before} -> ${afterCapture.length})`],
      [JSON.stringify(overview).includes("active"), "Paperclip shows the environment's active template"],
      [run.run.status === "succeeded", `an agent run in the environment succeeds from the template (${run.run.status})`],
      [typeof afterCapture[0]?.name === "string" && JSON.stringify(lease?.metadata ?? {}).includes(afterCapture[0].name), `the run's lease records the template it started from (${afterCapture[0]?.name})`],
      [afterDelete.length === before, `disabling with deleteProviderTemplate deleted it at the engine (${afterCapture.length} -> ${afterDelete.length}, ${disabled?.status})`],
      [!JSON.stringify([started, finished, overview, run.run, leases]).includes(backend.key), "the key is in no answer"],
    ];
    for (const [ok, what] of checks) {
      if (!ok) failures++;
      console.log(`e2e: ${ok ? "ok  " : "FAIL"} createos custom image: ${what}`);
    }
  }

  console.log(
    `e2e: agent run, wakeup to end: local ${times.local}; createos ${times.createos} (${(times.createosMs / times.localMs).toFixed(1)}x); daytona ${times.daytona} (${(times.daytonaMs / times.localMs).toFixed(1)}x)`,
  );
} catch (error) {
  failures++;
  console.error(`e2e: FAIL ${error.message}`);
  if (paperclipServer) console.error(`--- last lines of Paperclip's log ---\n${paperclipServer.log().split("\n").slice(-40).join("\n")}`);
} finally {
  await cleanup();
}
console.log(`e2e: ${failures === 0 ? "passed" : `${failures} failure(s)`} in ${elapsed()}`);
process.exit(failures === 0 ? 0 : 1);
