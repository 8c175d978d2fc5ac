// Issue 39 item 5: `npm pack` of each packed plugin (node/packages/createos,
// node/packages/daytona) is a self-contained package. Its tarball carries
// the component, the transpiled code, description.json, exact pins for
// every package it installs (npm-shrinkwrap.json) and nothing of the
// repository; its version is the component's (the provider crate's
// version); unpacked in a directory outside the repository and installed
// with `npm ci --omit=dev`, its worker starts with no help from node/ and
// probes a sandbox on createos-local.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, realpathSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";
import { startBackend } from "./support/backend.mjs";

const run = promisify(execFile);
const nodeDir = realpathSync(fileURLToPath(new URL("..", import.meta.url)));
const repoRoot = path.dirname(nodeDir);
const work = realpathSync(mkdtempSync(path.join(tmpdir(), "tarball-test-")));
after(() => rmSync(work, { recursive: true, force: true }));

const EXACT = /^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/;
const DRIVERS = {
  createos: (b) => ({ apiUrl: b.url, apiKey: b.key, timeoutMs: 60_000 }),
  daytona: (b) => ({ apiUrl: `${b.url}/daytona/api`, toolboxUrl: b.toolboxUrl, apiKey: b.key, timeoutMs: 60_000 }),
};

/** `version` of `[package]` in the provider crate's Cargo.toml. */
function crateVersion(driver) {
  const toml = readFileSync(path.join(repoRoot, "providers", driver, "Cargo.toml"), "utf8");
  const section = toml.split(/^\[/m).find((s) => s.startsWith("package]"));
  return /^version\s*=\s*"([^"]+)"/m.exec(section ?? "")?.[1];
}

/** npm as the running `npm test` uses it (its CLI under this Node), else the one on PATH. */
function npm(args, cwd) {
  const [file, pre] = process.env.npm_execpath ? [process.execPath, [process.env.npm_execpath]] : ["npm", []];
  return run(file, [...pre, ...args], { cwd, timeout: 300_000, maxBuffer: 64 << 20, env: { ...process.env, npm_config_loglevel: "error" } });
}

/** Every file under `dir` (relative paths). */
function filesUnder(dir) {
  return readdirSync(dir, { recursive: true }).filter((f) => statSync(path.join(dir, f)).isFile());
}

for (const driver of Object.keys(DRIVERS)) {
  const packageDir = path.join(nodeDir, "packages", driver);

  test(`${driver}: the packed package pins every dependency exactly, lists its files and carries the component's version`, async () => {
    const pkg = JSON.parse(readFileSync(path.join(packageDir, "package.json"), "utf8"));
    const version = crateVersion(driver);
    assert.ok(version, `providers/${driver}/Cargo.toml names a version`);
    assert.equal(pkg.version, version, `the plugin's version is the component's (providers/${driver}/Cargo.toml)`);
    const { default: manifest } = await import(pathToFileURL(path.join(packageDir, "dist", "manifest.js")).href);
    assert.equal(manifest.version, version, "the manifest's version is the component's");
    assert.ok(Array.isArray(pkg.files) && pkg.files.includes("dist"), "a files list naming dist");
    for (const [name, spec] of Object.entries(pkg.dependencies ?? {})) assert.match(spec, EXACT, `${name} is pinned exactly`);
    assert.equal(pkg.devDependencies, undefined, "no dev dependencies");

    const wrapFile = path.join(packageDir, "npm-shrinkwrap.json");
    let wrap;
    assert.doesNotThrow(() => (wrap = JSON.parse(readFileSync(wrapFile, "utf8"))), "npm-shrinkwrap.json pins what the dependencies install");
    assert.equal(wrap.lockfileVersion, 3);
    assert.equal(wrap.name, pkg.name);
    assert.equal(wrap.version, pkg.version);
    assert.deepEqual(wrap.packages[""].dependencies, pkg.dependencies);
    const entries = Object.entries(wrap.packages).filter(([key]) => key !== "");
    assert.ok(entries.length >= Object.keys(pkg.dependencies).length);
    for (const [key, entry] of entries) {
      assert.match(entry.version, EXACT, `${key} is pinned exactly`);
      assert.match(entry.integrity ?? "", /^sha512-/, `${key} carries its integrity`);
      assert.equal(entry.dev, undefined, `${key} is no dev dependency`);
    }
    // Every dependency of every pinned package is pinned too (npm's lookup: nearest node_modules up the tree).
    const resolves = (from, name) => {
      for (let base = from; ; ) {
        if (wrap.packages[`${base ? `${base}/` : ""}node_modules/${name}`]) return true;
        if (!base) return false;
        base = base.slice(0, base.lastIndexOf("node_modules/")).replace(/\/$/, "");
      }
    };
    for (const [key, entry] of Object.entries(wrap.packages)) {
      for (const name of Object.keys({ ...entry.dependencies })) assert.ok(resolves(key, name), `${name} (needed by ${key || pkg.name}) is pinned`);
    }
  });

  test(`${driver}: npm pack gives a tarball that installs and probes a sandbox from outside the repository`, async () => {
    const { stdout } = await npm(["pack", "--json", "--pack-destination", work], packageDir);
    const [packed] = JSON.parse(stdout);
    const listed = packed.files.map((f) => f.path);
    for (const needed of [
      "package.json",
      "npm-shrinkwrap.json",
      "dist/worker.js",
      "dist/plugin.js",
      "dist/manifest.js",
      "dist/component/provider.js",
      "dist/component/provider.core.wasm",
      "dist/component/description.json",
    ]) {
      assert.ok(listed.includes(needed), `the tarball carries ${needed}`);
    }
    assert.deepEqual(listed.filter((f) => f.startsWith("node_modules/")), [], "no node_modules in the tarball");

    const unpacked = path.join(work, `${driver}-unpacked`);
    await run("mkdir", ["-p", unpacked]);
    await run("tar", ["-xzf", path.join(work, packed.filename), "-C", unpacked, "--strip-components=1"]);
    assert.ok(!unpacked.startsWith(repoRoot + path.sep), "unpacked outside the repository");
    for (const file of filesUnder(unpacked)) {
      const text = readFileSync(path.join(unpacked, file), "latin1");
      assert.equal(text.includes(repoRoot), false, `${file} names no path into the repository (${repoRoot})`);
    }

    await npm(["ci", "--omit=dev", "--prefer-offline", "--no-audit", "--no-fund"], unpacked);
    const backend = await startBackend({ toolbox: true });
    const worker = spawn(process.execPath, [path.join(unpacked, "dist", "worker.js")], {
      cwd: unpacked,
      stdio: ["pipe", "pipe", "pipe"],
      // Only what Paperclip's worker manager passes: no NODE_PATH into node/.
      env: { PATH: process.env.PATH, PAPERCLIP_WASM_RATE_LEDGER: path.join(work, `${driver}-ledger.sqlite`), PAPERCLIP_WASM_THREADS: "1" },
    });
    let stderr = "";
    worker.stderr.on("data", (chunk) => (stderr += chunk));
    const waiting = new Map();
    let nextId = 1;
    createInterface({ input: worker.stdout }).on("line", (line) => {
      let message;
      try {
        message = JSON.parse(line);
      } catch {
        return;
      }
      if (message.method && message.id !== undefined) {
        // A call from the worker to its host (state, logs): answered empty, as a host with no records would.
        worker.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id: message.id, result: null })}\n`);
      } else if (message.id !== undefined && waiting.has(message.id)) {
        const { resolve, reject } = waiting.get(message.id);
        waiting.delete(message.id);
        if (message.error) reject(new Error(`${message.error.message} (stderr: ${stderr})`));
        else resolve(message.result);
      }
    });
    const exited = new Promise((resolve) => worker.once("exit", resolve));
    const call = (method, params) =>
      new Promise((resolve, reject) => {
        const id = nextId++;
        waiting.set(id, { resolve, reject });
        worker.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id, method, params })}\n`);
        exited.then((code) => reject(new Error(`the worker exited (${code}) before answering ${method}: ${stderr}`)));
      });
    try {
      const { default: manifest } = await import(pathToFileURL(path.join(unpacked, "dist", "manifest.js")).href);
      await call("initialize", { manifest, config: {}, instanceInfo: { instanceId: `tarball-${driver}`, hostVersion: "2026.916.1" }, apiVersion: 1 });
      const probe = await call("environmentProbe", { driverKey: driver, companyId: "company-tarball", environmentId: `environment-${driver}`, config: DRIVERS[driver](backend) });
      assert.equal(probe.ok, true, JSON.stringify(probe));
      assert.equal(JSON.stringify(probe).includes(backend.key), false, "the key is in no answer");
      assert.equal(stderr.includes(backend.key), false, "the key is in no log");
    } finally {
      worker.kill();
      await exited;
      await backend.stop();
    }
  });
}
