// The packages `npm run build` packs from ./build.sh's components: each
// manifest is generated from its component's describe(), is valid for
// Paperclip's own manifest schema, and carries no secret.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import { pluginManifestV1Schema } from "@paperclipai/shared";
import devManifest from "../dist/manifest.js";
import { ProviderPool } from "../dist/pool.js";
import { buildManifest } from "../dist/manifest-builder.js";

const PACKAGES = ["createos", "daytona"];
const packageDir = (key) => new URL(`../packages/${key}/`, import.meta.url);
const hostPackage = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8"));

async function describePackage(key) {
  const pool = new ProviderPool({ size: 1, componentDir: new URL("dist/component/", packageDir(key)).href });
  try {
    return await pool.call("describe", []).result;
  } finally {
    await pool.close();
  }
}

for (const key of PACKAGES) {
  test(`${key}: the manifest passes Paperclip's pluginManifestV1Schema`, async () => {
    const { default: manifest } = await import(new URL("dist/manifest.js", packageDir(key)).href);
    const parsed = pluginManifestV1Schema.safeParse(manifest);
    assert.equal(parsed.success, true, parsed.success ? "" : JSON.stringify(parsed.error.issues, null, 2));
  });

  test(`${key}: the manifest is exactly what its component's describe() gives (one source of truth)`, async () => {
    const { default: manifest } = await import(new URL("dist/manifest.js", packageDir(key)).href);
    const description = await describePackage(key);
    assert.equal(description.driverKey, key);
    const packed = JSON.parse(await readFile(new URL("dist/component/description.json", packageDir(key)), "utf8"));
    assert.deepEqual(packed, JSON.parse(JSON.stringify(description)), "the description the worker answers initialize from is the component's own (absent options as absent keys)");
    // The plugin's version is its component's: the provider crate's (issue 39 item 5).
    const crate = await readFile(new URL(`../../providers/${key}/Cargo.toml`, import.meta.url), "utf8");
    const crateVersion = /^version\s*=\s*"([^"]+)"/m.exec(crate)[1];
    const { HELD_BACK: heldBackByDriver } = await import("../scripts/packer.mjs");
    assert.deepEqual(manifest, buildManifest(description, { version: crateVersion, author: hostPackage.author, heldBack: heldBackByDriver[key] }));
    const [driver] = manifest.environmentDrivers;
    assert.equal(manifest.id, `sandbox-provider.${key}-wasm`);
    assert.equal(driver.driverKey, description.driverKey);
    assert.equal(driver.kind, "sandbox_provider");
    const componentSchema = JSON.parse(description.configSchema);
    // Plus the host's own `template` field where the component has templates (src/setup-sessions.ts).
    const hostFields = description.capabilities.templates ? ["template"] : [];
    assert.deepEqual(Object.keys(driver.configSchema.properties).sort(), [...Object.keys(componentSchema.properties), ...hostFields].sort());
    // Issue 43 item 4: the custom-image flow's fields only with templates.
    const templates = description.capabilities.templates ?? false;
    assert.equal(driver.supportsInteractiveSetup ?? false, templates);
    assert.equal(driver.supportsTemplateCapture ?? false, templates);
    assert.equal(driver.supportsTemplateDelete ?? false, templates);
    if (templates) {
      assert.deepEqual(driver.interactiveSetupConnectionTypes, [], "no connection (no SSH) is offered");
      assert.equal(driver.templateRefKind, "provider_template");
      assert.deepEqual(driver.templateConfigBinding, { field: "template" });
    }
    for (const secret of description.secrets) {
      const field = driver.configSchema.properties[secret.configField];
      assert.equal(field.format, "secret-ref", `${secret.configField} is a secret-ref`);
      assert.equal("default" in field, false, `${secret.configField} has no default in the manifest`);
    }
    for (const origin of description.originFields) {
      assert.ok(driver.configSchema.properties[origin.configField], `origin field ${origin.configField} is in the form`);
    }
    assert.equal(driver.supportsReusableLeases, description.capabilities.reusableLeases ?? false);
    assert.equal(driver.sandboxCapabilities.nativeSyncIn, description.capabilities.nativeSync ?? false);
    // Issue 43 item 4: overlapping syncs only where the component declares concurrent-sync (test/concurrent-sync.test.mjs overlaps them).
    assert.equal(driver.sandboxCapabilities.concurrentSyncOperations, (description.capabilities.nativeSync ?? false) && (description.capabilities.concurrentSync ?? false));
    // Issue 38 item 5: the login terminal and duplex channel only where the component runs them,
    // less what the packer holds back for the driver (scripts/packer.mjs, HELD_BACK).
    const { HELD_BACK } = await import("../scripts/packer.mjs");
    const held = HELD_BACK[description.driverKey] ?? {};
    assert.equal(driver.supportsLoginPty, (description.capabilities.loginPty ?? false) && held.loginPty === undefined);
    assert.equal(driver.sandboxCapabilities.duplexCommandStream, (description.capabilities.duplexChannels ?? false) && held.duplexChannels === undefined);
    assert.deepEqual([...manifest.capabilities].sort(), ["environment.drivers.register", "plugin.state.read", "plugin.state.write"]);
  });

  test(`${key}: package.json follows Paperclip's provider package convention`, async () => {
    const pkg = JSON.parse(await readFile(new URL("package.json", packageDir(key)), "utf8"));
    const { default: manifest } = await import(new URL("dist/manifest.js", packageDir(key)).href);
    assert.equal(pkg.type, "module");
    assert.equal(pkg.name, `@sandbox-provider/paperclip-${key}-wasm`);
    assert.deepEqual(pkg.paperclipPlugin, { manifest: "./dist/manifest.js", worker: "./dist/worker.js" });
    assert.equal(manifest.entrypoints.worker, pkg.paperclipPlugin.worker);
    for (const name of ["@paperclipai/plugin-sdk", "@bytecodealliance/preview2-shim"]) {
      assert.equal(pkg.dependencies[name], hostPackage.dependencies[name], `${name} pinned as in node/package.json`);
      assert.match(pkg.dependencies[name], /^\d+\.\d+\.\d+$/);
    }
  });

  test(`${key}: the package runs the same host code as every other package`, async () => {
    for (const file of ["plugin.js", "worker.js", "pool.js", "provider-thread.js", "secrets.js", "outgoing-handler.js"]) {
      const packed = await readFile(new URL(`dist/${file}`, packageDir(key)), "utf8");
      const host = await readFile(new URL(`../dist/${file}`, import.meta.url), "utf8");
      assert.equal(packed, host, `${file} is node/dist's`);
    }
  });
}

test("the login terminal and duplex channel are declared, and their hooks defined, only as the component's capabilities say", async () => {
  const { createPlugin } = await import("../dist/plugin.js");
  const { mkdtemp, writeFile, rm } = await import("node:fs/promises");
  const { tmpdir } = await import("node:os");
  const path = await import("node:path");
  const { pathToFileURL } = await import("node:url");
  const packed = JSON.parse(await readFile(new URL("dist/component/description.json", packageDir("createos")), "utf8"));
  const hooks = ["onLoginPtyOpen", "onLoginPtyInput", "onLoginPtyStop", "onLoginPtyClose"];
  const channelHooks = ["onDuplexChannelOpen", "onDuplexChannelWrite", "onDuplexChannelStop", "onDuplexChannelClose"];
  for (const [loginPty, duplexChannels] of [[false, false], [true, false], [false, true], [true, true]]) {
    const description = { ...packed, capabilities: { ...packed.capabilities, loginPty, duplexChannels } };
    const manifest = buildManifest(description, { version: "1.0.0", author: "test" });
    const [driver] = manifest.environmentDrivers;
    assert.equal(driver.supportsLoginPty, loginPty);
    assert.equal(driver.sandboxCapabilities.duplexCommandStream, duplexChannels);
    assert.equal(pluginManifestV1Schema.safeParse(manifest).success, true);
    // The worker reads the same packed description before Paperclip's initialize.
    const dir = await mkdtemp(path.join(tmpdir(), "caps-"));
    try {
      await writeFile(path.join(dir, "description.json"), JSON.stringify(description));
      const plugin = createPlugin({ componentDir: `${pathToFileURL(dir).href}/` });
      for (const hook of hooks) assert.equal(typeof plugin.definition[hook], loginPty ? "function" : "undefined", `${hook} with login-pty ${loginPty}`);
      for (const hook of channelHooks) assert.equal(typeof plugin.definition[hook], duplexChannels ? "function" : "undefined", `${hook} with duplex-channels ${duplexChannels}`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
});

test("the runner ingress and the custom-image hooks are declared, and defined, only as ports and templates say", async () => {
  const { createPlugin } = await import("../dist/plugin.js");
  const { mkdtemp, writeFile, rm } = await import("node:fs/promises");
  const { tmpdir } = await import("node:os");
  const path = await import("node:path");
  const { pathToFileURL } = await import("node:url");
  const packed = JSON.parse(await readFile(new URL("dist/component/description.json", packageDir("createos")), "utf8"));
  const setupHooks = ["onEnvironmentStartInteractiveSetup", "onEnvironmentGetInteractiveSetup", "onEnvironmentCaptureTemplate", "onEnvironmentCancelInteractiveSetup", "onEnvironmentDeleteTemplate"];
  for (const [ports, templates] of [[false, false], [true, false], [false, true], [true, true]]) {
    const description = { ...packed, capabilities: { ...packed.capabilities, ports, templates } };
    const manifest = buildManifest(description, { version: "1.0.0", author: "test" });
    const [driver] = manifest.environmentDrivers;
    assert.equal(driver.sandboxCapabilities.runnerWebSocketIngress, ports);
    assert.equal(driver.supportsInteractiveSetup ?? false, templates);
    assert.equal("template" in driver.configSchema.properties, templates);
    assert.equal(pluginManifestV1Schema.safeParse(manifest).success, true);
    const dir = await mkdtemp(path.join(tmpdir(), "caps-"));
    try {
      await writeFile(path.join(dir, "description.json"), JSON.stringify(description));
      const plugin = createPlugin({ componentDir: `${pathToFileURL(dir).href}/` });
      assert.equal(typeof plugin.definition.onEnvironmentRunnerIngressEndpoint, ports ? "function" : "undefined");
      for (const hook of setupHooks) assert.equal(typeof plugin.definition[hook], templates ? "function" : "undefined", `${hook} with templates ${templates}`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
});

test("the host code names no provider, config field or header", async () => {
  const files = (await readdir(new URL("../dist/", import.meta.url))).filter((f) => f.endsWith(".js") && f !== "manifest.js");
  assert.ok(files.length >= 15, files.join());
  for (const file of files) {
    const text = await readFile(new URL(`../dist/${file}`, import.meta.url), "utf8");
    const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
    for (const word of [/createos/i, /daytona/i, /apiUrl/, /toolboxUrl/, /X-Api-Key/i, /Bearer/]) {
      // Earlier CreateOS-only setting names are read as documented aliases (worker.ts, rate-ledger.ts).
      const hits = code.split("\n").filter((line) => word.test(line) && !/PAPERCLIP_CREATEOS_/.test(line));
      assert.deepEqual(hits, [], `${file} names ${word}`);
    }
  }
});

test("node/dist's development copy is the CreateOS package's manifest", async () => {
  const { default: manifest } = await import(new URL("dist/manifest.js", packageDir("createos")).href);
  assert.deepEqual(devManifest, manifest);
  assert.equal(hostPackage.paperclipPlugin, undefined, "node/ itself is the packer and host code, not a plugin");
});
