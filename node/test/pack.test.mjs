// The packer (`npm run pack -- --component X.wasm`): any sandbox-provider
// component becomes a Paperclip plugin package; anything else is refused
// with the reason, and nothing is written.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { parse } from "@bytecodealliance/jco-transpile/wasm-tools";
import { pluginManifestV1Schema } from "@paperclipai/shared";
import { descriptionProblems } from "../dist/manifest-builder.js";

const run = promisify(execFile);
const packScript = fileURLToPath(new URL("../scripts/pack.mjs", import.meta.url));
const release = fileURLToPath(new URL("../../target/wasm32-wasip2/release/", import.meta.url));
const work = mkdtempSync(path.join(tmpdir(), "pack-test-"));
after(() => rmSync(work, { recursive: true, force: true }));

/** Runs the packer; `{code, stdout, stderr}`. */
async function packer(...args) {
  try {
    const { stdout, stderr } = await run(process.execPath, [packScript, ...args], { timeout: 120_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    return { code: error.code, stdout: error.stdout, stderr: error.stderr };
  }
}

async function file(name, bytes) {
  const target = path.join(work, name);
  writeFileSync(target, bytes);
  return target;
}

/** A component exporting `sandbox:provider/provider@VERSION` with a `describe` whose core function is `body`. */
function providerWat(version, { result = "u32", body = "i32.const 7" } = {}) {
  return `(component
    (core module $m (func (export "f") (result i32) ${body}))
    (core instance $i (instantiate $m))
    (func $f (result ${result}) (canon lift (core func $i "f")))
    (instance $p (export "describe" (func $f)))
    (export "sandbox:provider/provider@${version}" (instance $p)))`;
}

/** Every file under `dir`, as text. */
function allText(dir) {
  let text = "";
  for (const entry of readdirSync(dir, { recursive: true })) {
    const full = path.join(dir, entry);
    if (statSync(full).isFile()) text += readFileSync(full, "latin1");
  }
  return text;
}

test("a provider component becomes a package whose manifest Paperclip accepts (Daytona: Bearer, two origins)", async () => {
  const out = path.join(work, "daytona-package");
  const { code, stdout, stderr } = await packer("--component", path.join(release, "daytona_provider.wasm"), "--out", out);
  assert.equal(code, 0, stderr);
  assert.match(stdout, /driver daytona, plugin sandbox-provider\.daytona-wasm/);
  assert.match(stdout, /apiKey -> Authorization \(Bearer\)/);
  assert.match(stdout, /origins apiUrl, toolboxUrl/);
  const { default: manifest } = await import(path.join(out, "dist", "manifest.js"));
  assert.equal(pluginManifestV1Schema.safeParse(manifest).success, true);
  assert.equal(manifest.environmentDrivers[0].driverKey, "daytona");
  assert.equal(manifest.environmentDrivers[0].configSchema.properties.apiKey.format, "secret-ref");
  const pkg = JSON.parse(readFileSync(path.join(out, "package.json"), "utf8"));
  assert.deepEqual(pkg.paperclipPlugin, { manifest: "./dist/manifest.js", worker: "./dist/worker.js" });
  for (const needed of ["worker.js", "plugin.js", "provider-thread.js", "component/provider.js"]) {
    assert.ok(existsSync(path.join(out, "dist", needed)), `dist/${needed}`);
  }
});

test("a file that is not WebAssembly is refused by name, nothing written", async () => {
  const out = path.join(work, "not-wasm");
  const { code, stderr } = await packer("--component", await file("notes.wasm", "not a component"), "--out", out);
  assert.equal(code, 2);
  assert.match(stderr, /^pack: notes\.wasm is not a WebAssembly file\.$/m);
  assert.equal(existsSync(out), false);
});

test("a core module is refused: it is not a component", async () => {
  const { code, stderr } = await packer("--component", await file("core.wasm", await parse(`(module (func (export "describe")))`)), "--out", path.join(work, "core"));
  assert.equal(code, 2);
  assert.match(stderr, /core\.wasm is a core WebAssembly module, not a component/);
});

test("a component without the provider interface has no describe() to pack from", async () => {
  const wat = `(component
    (core module $m (func (export "f")))
    (core instance $i (instantiate $m))
    (func $f (canon lift (core func $i "f")))
    (export "run" (func $f)))`;
  const { code, stderr } = await packer("--component", await file("other.wasm", await parse(wat)), "--out", path.join(work, "other"));
  assert.equal(code, 2);
  assert.match(stderr, /other\.wasm does not export sandbox:provider\/provider \(it exports run: func\(\)\), so it has no describe\(\) to pack from/);
});

test("a component built for another contract version is refused, naming both versions", async () => {
  const { code, stderr } = await packer("--component", await file("old.wasm", await parse(providerWat("0.1.0"))), "--out", path.join(work, "old"));
  assert.equal(code, 2);
  assert.match(stderr, /old\.wasm is built for the sandbox-provider contract 0\.1\.0; this host speaks 0\.7\.0, 0\.6\.0, 0\.5\.0, 0\.4\.0, 0\.3\.0 and 0\.2\.0 only/);
});

test("a describe() that traps is refused with the reason", async () => {
  const wasm = await file("trap.wasm", await parse(providerWat("0.2.0", { body: "unreachable" })));
  const { code, stderr } = await packer("--component", wasm, "--out", path.join(work, "trap"));
  assert.equal(code, 2);
  assert.match(stderr, /describe\(\) of trap\.wasm failed \(.*unreachable.*\)/i);
  assert.equal(existsSync(path.join(work, "trap")), false);
});

test("a describe() that answers something other than a provider-description is refused", async () => {
  const wasm = await file("number.wasm", await parse(providerWat("0.2.0")));
  const { code, stderr } = await packer("--component", wasm, "--out", path.join(work, "number"));
  assert.equal(code, 2);
  assert.match(stderr, /describe\(\) of number\.wasm is not usable:\n\s+- it answered 7, not a provider-description/);
});

test("unusable descriptions: every problem named", () => {
  const good = {
    driverKey: "acme",
    displayName: "Acme",
    configSchema: JSON.stringify({ type: "object", properties: { apiUrl: { type: "string" }, apiKey: {} } }),
    capabilities: {},
    secrets: [{ configField: "apiKey", header: "Authorization", scheme: "Bearer" }],
    originFields: [{ configField: "apiUrl", defaultUrl: "https://api.acme.test", secrets: ["apiKey"] }],
  };
  assert.deepEqual(descriptionProblems(good), []);
  const problems = descriptionProblems({
    ...good,
    driverKey: "Acme Cloud",
    displayName: " ",
    configSchema: "[1]",
    secrets: [{ configField: "apiKey", header: "X Key", scheme: "Bearer token" }],
    originFields: [{ configField: "apiUrl", secrets: ["token"] }],
  });
  assert.equal(problems.length, 6, problems.join("\n"));
  assert.match(problems.join("\n"), /driver-key "Acme Cloud" is not usable/);
  assert.match(problems.join("\n"), /display-name is empty/);
  assert.match(problems.join("\n"), /config-schema is not a JSON Schema of an object/);
  assert.match(problems.join("\n"), /header "X Key" is not an HTTP header name/);
  assert.match(problems.join("\n"), /scheme "Bearer token" is not a single word/);
  assert.match(problems.join("\n"), /origin field apiUrl carries secret token, which is not among its secrets/);
  assert.match(descriptionProblems({ ...good, originFields: [] }).join(), /declares no origin-fields/);
});

test("no secret in a packed package: a schema default on a secret field is dropped", async () => {
  const { paperclipConfigSchema } = await import("../dist/manifest-builder.js");
  const canary = "sk-canary-0123456789";
  const schema = paperclipConfigSchema({
    configSchema: JSON.stringify({ type: "object", properties: { apiKey: { type: "string", default: canary, examples: [canary] } } }),
    secrets: [{ configField: "apiKey", header: "X-Key" }],
  });
  assert.equal(JSON.stringify(schema).includes(canary), false);
  assert.deepEqual(schema.properties.apiKey, { type: "string", format: "secret-ref" });
  // And the bundled packages carry no key of any kind (the test backend's key prefix, a Bearer value).
  for (const key of ["createos", "daytona"]) {
    const text = allText(fileURLToPath(new URL(`../packages/${key}/dist/`, import.meta.url)));
    assert.equal(/test-key-[0-9a-f]{8}|Bearer [A-Za-z0-9]{8}/.test(text), false, key);
  }
});

test("the package's version is the component's: its crate's, --version, or (a component from elsewhere) the host's, said so", async () => {
  const crate = readFileSync(fileURLToPath(new URL("../../providers/daytona/Cargo.toml", import.meta.url)), "utf8");
  const crateVersion = /^version\s*=\s*"([^"]+)"/m.exec(crate)[1];
  const versionOf = (out) => [JSON.parse(readFileSync(path.join(out, "package.json"), "utf8")).version, JSON.parse(readFileSync(path.join(out, "npm-shrinkwrap.json"), "utf8")).version];
  const built = await packer("--component", path.join(release, "daytona_provider.wasm"), "--out", path.join(work, "v-crate"));
  assert.equal(built.code, 0, built.stderr);
  assert.deepEqual(versionOf(path.join(work, "v-crate")), [crateVersion, crateVersion]);
  assert.match(built.stdout, new RegExp(`@${crateVersion.replaceAll(".", "\\.")} \\(version its crate's\\)`));

  const elsewhere = await file("acme.wasm", readFileSync(path.join(release, "daytona_provider.wasm")));
  const named = await packer("--component", elsewhere, "--out", path.join(work, "v-named"), "--version", "3.1.4");
  assert.equal(named.code, 0, named.stderr);
  assert.deepEqual(versionOf(path.join(work, "v-named")), ["3.1.4", "3.1.4"]);
  const { default: manifest } = await import(path.join(work, "v-named", "dist", "manifest.js"));
  assert.equal(manifest.version, "3.1.4");

  const hostVersion = JSON.parse(readFileSync(fileURLToPath(new URL("../package.json", import.meta.url)), "utf8")).version;
  const unnamed = await packer("--component", elsewhere, "--out", path.join(work, "v-host"));
  assert.equal(unnamed.code, 0, unnamed.stderr);
  assert.deepEqual(versionOf(path.join(work, "v-host")), [hostVersion, hostVersion]);
  assert.match(unnamed.stdout, /the host's: pass --version to name the component's/);

  const bad = await packer("--component", elsewhere, "--out", path.join(work, "v-bad"), "--version", "latest");
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /^pack: --version latest is not a version \(MAJOR\.MINOR\.PATCH\)\.$/m);
  assert.equal(existsSync(path.join(work, "v-bad")), false);
});
