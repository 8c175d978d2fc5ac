// Issue 43 item 4: the environment-policy config fields (the base egress
// list, the image per adapter, the idle window) reach Paperclip's form as
// JSON Schema in each packed manifest (built from the component's
// describe()), and that schema accepts and refuses exactly what the
// component's own validate-config does (Daytona's refuses an egress entry
// with a port, which its allow-lists cannot carry). The schema is read with zod's
// JSON Schema reader (zod is what Paperclip's SDK and shared package use).
import { test } from "node:test";
import assert from "node:assert/strict";
import { fromJSONSchema } from "zod";
import { ProviderPool } from "../dist/pool.js";

const packageDir = (key) => new URL(`../packages/${key}/`, import.meta.url);

/** Per package: the fields it must carry, and configs with whether they are valid. */
const CASES = {
  createos: {
    fields: ["egressAllowlist", "rootfsByAdapter", "autoPauseAfterSeconds"],
    configs: [
      [{}, true],
      [{ egressAllowlist: ["a.com", "*.b.org:443", "10.0.0.0/8"] }, true],
      [{ egressAllowlist: ["*"] }, true],
      [{ egressAllowlist: [] }, false],
      [{ egressAllowlist: [""] }, false],
      [{ egressAllowlist: "a.com" }, false],
      [{ rootfsByAdapter: { claude_local: "claude-img", "codex-local": "codex" } }, true],
      [{ rootfsByAdapter: { "bad key": "x" } }, false],
      [{ rootfsByAdapter: { claude_local: "" } }, false],
      [{ rootfsByAdapter: ["x"] }, false],
      [{ autoPauseAfterSeconds: 60 }, true],
      [{ autoPauseAfterSeconds: 86400 }, true],
      [{ autoPauseAfterSeconds: 59 }, false],
      [{ autoPauseAfterSeconds: 86401 }, false],
      [{ autoPauseAfterSeconds: 90.5 }, false],
      [{ autoPauseAfterSeconds: "60" }, false],
    ],
  },
  daytona: {
    fields: ["egressAllowlist", "snapshotByAdapter"],
    configs: [
      [{}, true],
      [{ egressAllowlist: ["a.com", "10.0.0.0/8"] }, true],
      [{ egressAllowlist: ["*.a.com", "10.1.2.3", "::1", "2001:db8::7", "2001:db8::/32"] }, true],
      [{ egressAllowlist: ["*"] }, true],
      // Daytona's allow-lists hold no port: an entry with one is refused by both.
      [{ egressAllowlist: ["a.com:443"] }, false],
      [{ egressAllowlist: ["a.com", "*.b.org:443"] }, false],
      [{ egressAllowlist: ["10.1.2.3:8080"] }, false],
      [{ egressAllowlist: ["[2001:db8::7]:443"] }, false],
      [{ egressAllowlist: [] }, false],
      [{ egressAllowlist: [""] }, false],
      [{ snapshotByAdapter: { claude_local: "snap" } }, true],
      [{ snapshotByAdapter: { "bad key": "snap" } }, false],
      [{ snapshotByAdapter: { claude_local: "" } }, false],
    ],
  },
};

for (const [key, { fields, configs }] of Object.entries(CASES)) {
  test(`${key}: the manifest's config schema carries the policy fields and validates them as the component does`, async () => {
    const { default: manifest } = await import(new URL("dist/manifest.js", packageDir(key)).href);
    const schema = manifest.environmentDrivers[0].configSchema;
    for (const field of fields) assert.ok(schema.properties[field], `${field} is in ${key}'s form`);
    const reader = fromJSONSchema(schema);
    const pool = new ProviderPool({ size: 1, componentDir: new URL("dist/component/", packageDir(key)).href });
    try {
      for (const [config, valid] of configs) {
        assert.equal(reader.safeParse(config).success, valid, `the schema on ${JSON.stringify(config)}`);
        const validation = await pool.call("validateConfig", [JSON.stringify(config)]).result;
        assert.equal(validation.ok, valid, `the component on ${JSON.stringify(config)}: ${validation.errors.join("; ")}`);
      }
    } finally {
      await pool.close();
    }
  });
}
