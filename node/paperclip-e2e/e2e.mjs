#!/usr/bin/env node
// Full Paperclip end to end: a real Paperclip server (`paperclipai
// test-drive`, embedded PostgreSQL) installs each packed plugin
// (node/packages/<driver>) from its path and runs `environment
// probe-config` for a `sandbox` environment on each driver against
// createos-local. Paperclip then acquires a lease through the plugin, runs
// a command in it and releases it; no LLM is involved.
//
//   cd node && npm run build && (cd paperclip-host-test && npm install --no-save)
//   npm run e2e                      # from node/
//
// Only loopback traffic: the whole run happens in a network namespace of its
// own with nothing but `lo` (`unshare --net`), so neither Paperclip nor the
// plugin can reach anything else. Embedded PostgreSQL refuses to run as
// root, so as root Paperclip runs as `nobody` (setpriv) with a data
// directory it owns; otherwise as the calling user. As root the run also
// gets a mount namespace of its own, where node/ is bind-mounted inside
// that data directory, so `nobody` reaches the CLI, Node and the packages
// even when the checkout lives under a directory only root may enter.
//
// Needs: node/packages/{createos,daytona} (`npm run build`), `paperclipai`
// in node/paperclip-host-test/node_modules, target/debug/createos-local
// (`cargo build --workspace`; CREATEOS_LOCAL_BIN overrides), util-linux's
// `unshare` and `setpriv`, and iproute2's `ip`.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync } from "node:fs";
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
  const userns = process.getuid() === 0 ? ["--mount"] : ["--user", "--map-current-user"];
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
for (const { driver } of PACKAGES) {
  if (!existsSync(path.join(nodeDir, "packages", driver, "dist", "manifest.js"))) fail(`node/packages/${driver} is missing: run \`npm run build\` in node/ (after ./build.sh)`);
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
/** Whether `dir` is a mount point in this mount namespace (/proc/self/mountinfo, field 5). */
function isMountPoint(dir) {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((line) => line.split(" ")[4] === dir);
}
/** A path under node/ as Paperclip sees it. */
const visible = (file) => (file.startsWith(nodeDir + path.sep) ? path.join(visibleNode, path.relative(nodeDir, file)) : file);
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
    if (visibleNode !== nodeDir) spawnSync("umount", [visibleNode]);
    if (visibleNode !== nodeDir && isMountPoint(visibleNode)) throw new Error(`${visibleNode} is still mounted; not removing the data directory`);
    rmSync(data, { recursive: true, force: true });
  });
  paperclipServer = await startPaperclip();
  console.log(`e2e: Paperclip ready at ${paperclipServer.apiBase} (${elapsed()}), createos-local at ${backend.url}, running as ${asRoot ? "nobody" : "this user"} in a loopback-only network namespace`);
  const [company] = cli(paperclipServer.apiBase, ["company", "list"]);
  if (!company?.id) throw new Error("test-drive created no company");

  for (const { driver, config } of PACKAGES) {
    const packageDir = visible(path.join(nodeDir, "packages", driver));
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
      [bad.ok === false && /HTTP 401/.test(bad.summary ?? ""), `a wrong key is refused (${bad.summary})`],
      [!text.includes(backend.key), "the key is in no answer and not in the installed manifest"],
    ];
    for (const [ok, what] of checks) {
      if (!ok) failures++;
      console.log(`e2e: ${ok ? "ok  " : "FAIL"} ${driver}: ${what}`);
    }
    console.log(`e2e: ${driver}: install + two probes in ${ms} ms`);
  }
} catch (error) {
  failures++;
  console.error(`e2e: FAIL ${error.message}`);
  if (paperclipServer) console.error(`--- last lines of Paperclip's log ---\n${paperclipServer.log().split("\n").slice(-40).join("\n")}`);
} finally {
  await cleanup();
}
console.log(`e2e: ${failures === 0 ? "passed" : `${failures} failure(s)`} in ${elapsed()}`);
process.exit(failures === 0 ? 0 : 1);
