// Secrets and origins from the contract (the Rust host's rules, secrets.rs
// and policy_for): which origin gets which secret, in which header and
// scheme, read from describe(); a config whose origins the component does
// not ask for, or a secret in plain text to a remote host, is refused
// before any request. Then the Daytona package (Bearer key, two origins)
// end to end against createos-local's Daytona face.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import { checkAskedOrigins, parseSecretEnv, parseTrustedOrigins, splitConfig } from "../dist/secrets.js";
import { ProviderPool } from "../dist/pool.js";
import { createPlugin } from "../dist/plugin.js";
import { startBackend, startRecordingServer } from "./support/backend.mjs";
import { freshLedgerPath } from "./support/plugin.mjs";

const daytonaComponent = new URL("../packages/daytona/dist/component/", import.meta.url).href;
const { default: daytonaManifest } = await import("../packages/daytona/dist/manifest.js");

/** A description shaped like a two-origin provider, with names no host code knows. */
const TWO_ORIGINS = {
  driverKey: "acme",
  displayName: "Acme",
  configSchema: "{}",
  capabilities: {},
  secrets: [
    { configField: "token", header: "Authorization", scheme: "Bearer", envVar: "ACME_TOKEN" },
    { configField: "orgSecret", header: "X-Org-Secret" },
  ],
  originFields: [
    { configField: "controlUrl", defaultUrl: "https://control.acme.test", secrets: ["token"] },
    { configField: "dataUrl", defaultUrl: "https://data.acme.test:8443", secrets: ["token"] },
    { configField: "billingUrl", defaultUrl: "https://billing.acme.test", secrets: ["orgSecret"] },
  ],
};

/** The operator of these tests: every default origin of TWO_ORIGINS trusted, no variable named. */
const TRUSTING = { env: {}, trustedOrigins: ["https://control.acme.test", "https://data.acme.test:8443", "https://billing.acme.test"] };

test("each origin gets exactly the secrets its origin field lists, in the declared header and scheme", () => {
  const split = splitConfig({ token: "t0ken-value", orgSecret: "org-value", dataUrl: "https://DATA.acme.test:8443/v1/", other: 1 }, TWO_ORIGINS, TRUSTING);
  assert.deepEqual(split.errors, []);
  assert.deepEqual(split.componentConfig, { dataUrl: "https://DATA.acme.test:8443/v1/", other: 1 }, "secret fields removed, the rest kept");
  assert.deepEqual(
    split.routes.map((r) => [r.field, r.origin, r.namedByConfig, r.secrets]),
    [
      ["controlUrl", "https://control.acme.test", false, [{ header: "Authorization", value: "Bearer t0ken-value" }]],
      ["dataUrl", "https://data.acme.test:8443", true, [{ header: "Authorization", value: "Bearer t0ken-value" }]],
      ["billingUrl", "https://billing.acme.test", false, [{ header: "X-Org-Secret", value: "org-value" }]],
    ],
  );
});

test("a key from the environment: only the variable the operator names, only to origins the operator trusts", () => {
  const operator = { ...TRUSTING, env: { ACME_TOKEN: "named-by-the-provider", OPERATOR_TOKEN: "from-env" }, secretEnv: { token: "OPERATOR_TOKEN" } };
  const defaults = splitConfig({}, TWO_ORIGINS, operator);
  assert.deepEqual(defaults.routes[0].secrets, [{ header: "Authorization", value: "Bearer from-env" }]);
  const custom = splitConfig({ dataUrl: "https://elsewhere.test" }, TWO_ORIGINS, operator);
  assert.deepEqual(custom.routes.map((r) => r.secrets), [[], [], []], "a typed URL never receives the environment's key");
  const unnamed = splitConfig({}, TWO_ORIGINS, { ...TRUSTING, env: { ACME_TOKEN: "named-by-the-provider" } });
  assert.deepEqual(unnamed.routes.map((r) => r.secrets), [[], [], []], "the variable describe() names is never read");
});

test("a secret goes to a default origin only when the operator trusts it; the refusal names the field to set", () => {
  const untrusted = splitConfig({ token: "t0ken-value", controlUrl: "https://control.acme.test" }, TWO_ORIGINS, { env: {} });
  assert.deepEqual(untrusted.errors, [
    "token: the config holds a secret but does not name the API URL in field dataUrl, and the operator does not trust the provider's default https://data.acme.test:8443 with it; set dataUrl in the config (or the operator adds the origin to PAPERCLIP_WASM_TRUSTED_ORIGINS)",
  ]);
  assert.equal(untrusted.errors.join().includes("t0ken-value"), false);
});

test("secrets travel only over https or loopback http; bad values are refused by field, never echoed", () => {
  const plain = splitConfig({ token: "s3cret-abc", controlUrl: "http://control.acme.test" }, TWO_ORIGINS, TRUSTING);
  assert.match(plain.errors.join(), /token \(for controlUrl\): the secret would be sent to http:\/\/control\.acme\.test in plain text/);
  for (const url of ["http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"]) {
    assert.deepEqual(splitConfig({ token: "s3cret-abc", controlUrl: url }, TWO_ORIGINS, TRUSTING).errors, [], url);
  }
  const bad = splitConfig({ token: "a\r\nInjected: 1", controlUrl: "ftp://x", dataUrl: "https://user:pw@data.test", billingUrl: 5 }, TWO_ORIGINS, TRUSTING);
  assert.match(bad.errors.join("\n"), /controlUrl: must be an http or https URL without user name or password/);
  assert.match(bad.errors.join("\n"), /dataUrl: must be an http or https URL without user name or password/);
  assert.match(bad.errors.join("\n"), /billingUrl: must be a URL string/);
  assert.match(bad.errors.join("\n"), /token: the secret is empty or contains a line break or NUL/);
  assert.equal(bad.errors.join().includes("Injected"), false);
});

test("the origins validate-config asks for must be the config's, in order", () => {
  const routes = splitConfig({}, TWO_ORIGINS, { env: {} }).routes;
  assert.equal(checkAskedOrigins(["https://control.acme.test/", "https://data.acme.test:8443", "https://billing.acme.test:443"], routes), undefined);
  assert.match(
    checkAskedOrigins(["https://control.acme.test", "https://evil.test", "https://billing.acme.test"], routes),
    /asks to send its requests to https:\/\/evil\.test, but the config names https:\/\/data\.acme\.test:8443 \(field dataUrl\).*nothing was sent/,
  );
  assert.match(checkAskedOrigins(["https://control.acme.test"], routes), /asks for 1 API origin\(s\).*declares 3 origin field\(s\)/);
});

let backend;
let stranger;
before(async () => {
  backend = await startBackend({ toolbox: true });
  stranger = await startRecordingServer();
});
after(async () => {
  await stranger?.stop();
  await backend?.stop();
});

test("a call whose config names origins the component does not ask for is refused before any request (real component)", async () => {
  const pool = new ProviderPool({ size: 1, componentDir: daytonaComponent, ledgerPath: freshLedgerPath() });
  try {
    await backend.clearRequests();
    const config = JSON.stringify({ apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl });
    const ctx = { driverKey: "daytona", companyId: "c", environmentId: "e", config };
    // The routes the host built name the stranger for the API field: the component asks for createos-local.
    const routes = [
      { field: "apiUrl", origin: new URL(stranger.url).origin, namedByConfig: true, secrets: [{ header: "Authorization", value: `Bearer ${backend.key}` }] },
      { field: "toolboxUrl", origin: new URL(backend.toolboxUrl).origin, namedByConfig: true, secrets: [] },
    ];
    await assert.rejects(pool.call("probe", [ctx], { routes }).result, (error) => {
      assert.equal(error.failure.kind, "provider");
      assert.equal(error.failure.payload.tag, "invalid-config");
      assert.match(error.failure.payload.val[0], /asks to send its requests to http:\/\/127\.0\.0\.1:\d+, but the config names http:\/\/127\.0\.0\.1:\d+ \(field apiUrl\)/);
      return true;
    });
    assert.deepEqual(await backend.requests(), [], "createos-local saw no request");
    await stranger.flush();
    assert.equal(stranger.seen.length, 0, "nor did the other server");
  } finally {
    await pool.close();
  }
});

/** The Daytona package's plugin under Paperclip's SDK test harness. */
async function startDaytona() {
  const plugin = createPlugin({ poolSize: 2, env: {}, rateLedgerPath: freshLedgerPath(), componentDir: daytonaComponent });
  const hooks = plugin.definition;
  const harness = createEnvironmentTestHarness({
    manifest: daytonaManifest,
    environmentDriver: {
      driverKey: "daytona",
      onValidateConfig: (params) => hooks.onEnvironmentValidateConfig(params),
      onProbe: (params) => hooks.onEnvironmentProbe(params),
      onAcquireLease: (params) => hooks.onEnvironmentAcquireLease(params),
      onResumeLease: (params) => hooks.onEnvironmentResumeLease(params),
      onReleaseLease: (params) => hooks.onEnvironmentReleaseLease(params),
      onDestroyLease: (params) => hooks.onEnvironmentDestroyLease(params),
      onRealizeWorkspace: (params) => hooks.onEnvironmentRealizeWorkspace(params),
      onExecute: (params) => hooks.onEnvironmentExecute(params),
    },
  });
  const logs = [];
  await hooks.setup({ ...harness.ctx, execution: { log: (stream, chunk) => logs.push({ stream, chunk }) } });
  return { hooks, harness, logs };
}

test("the Daytona package end to end: Bearer key on both origins, lease, live output, release; the key nowhere", async () => {
  const { hooks, harness, logs } = await startDaytona();
  const observed = [];
  try {
    const base = {
      driverKey: "daytona",
      companyId: "company-a",
      environmentId: "environment-d",
      config: { apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl, apiKey: backend.key, timeoutMs: 60_000 },
    };
    const validation = await hooks.onEnvironmentValidateConfig(base);
    assert.equal(validation.ok, true, JSON.stringify(validation));
    assert.equal(validation.normalizedConfig.apiKey, backend.key, "the secret-ref goes back exactly as Paperclip gave it");

    const probe = await hooks.onEnvironmentProbe(base);
    observed.push(probe);
    assert.equal(probe.ok, true, JSON.stringify(probe));

    const lease = await harness.acquireLease({ ...base, runId: `run-${randomUUID()}` });
    observed.push(lease);
    const result = await harness.execute({ ...base, lease, command: "sh", args: ["-c", "echo hello-daytona; echo oops >&2; exit 3"] });
    observed.push(result);
    assert.equal(result.exitCode, 3);
    assert.equal(result.stdout, "hello-daytona\n");
    assert.equal(result.stderr, "oops\n");
    assert.ok(logs.some((l) => l.stream === "stdout" && l.chunk.includes("hello-daytona")), "live output");
    const receipt = await harness.destroyLease({ ...base, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    observed.push(receipt);
    assert.equal(receipt.state, "destroyed");

    const seen = await backend.requests();
    assert.ok(seen.some((r) => r.path.startsWith("/daytona/api/")), "API origin reached");
    assert.ok(seen.some((r) => r.path.startsWith("/toolbox/")), "toolbox origin reached (a second origin)");
    assert.equal(seen.filter((r) => r.status === 401).length, 0, "createos-local's Daytona face accepted the Bearer key on both origins");

    // A wrong key: both origins answer 401, and the key is not in the message.
    const wrong = await hooks.onEnvironmentProbe({ ...base, config: { ...base.config, apiKey: "wrong-key-123456" } });
    observed.push(wrong);
    assert.equal(wrong.ok, false);
    assert.match(wrong.summary, /Daytona rejected .* with HTTP 401/);
    assert.equal(wrong.summary.includes("wrong-key-123456"), false);

    // Plain http to a remote host with the key: refused before any request.
    await backend.clearRequests();
    await assert.rejects(
      hooks.onEnvironmentProbe({ ...base, config: { ...base.config, toolboxUrl: "http://toolbox.example.test" } }),
      /The Daytona config is invalid: apiKey \(for toolboxUrl\): the secret would be sent to http:\/\/toolbox\.example\.test in plain text.*nothing was sent/,
    );
    assert.deepEqual(await backend.requests(), []);
  } finally {
    await hooks.onShutdown();
  }
  const text = JSON.stringify(observed) + JSON.stringify(logs);
  assert.equal(text.includes(backend.key), false, "the key appears in no result, error or log");
});

test("the operator's worker settings parse, and bad entries are named", () => {
  assert.deepEqual(parseSecretEnv(" apiKey=CREATEOS_API_KEY, token=MY_TOKEN "), { apiKey: "CREATEOS_API_KEY", token: "MY_TOKEN" });
  assert.deepEqual(parseSecretEnv(""), {});
  assert.throws(() => parseSecretEnv("apiKey"), /invalid PAPERCLIP_WASM_SECRET_ENV entry "apiKey": expected secretField=VARIABLE/);
  assert.throws(() => parseSecretEnv("apiKey=A,apiKey=B"), /field apiKey is named twice/);
  assert.deepEqual(parseTrustedOrigins("https://api.sb.createos.sh/, https://App.Daytona.io http://127.0.0.1:8080"), [
    "https://api.sb.createos.sh",
    "https://app.daytona.io",
    "http://127.0.0.1:8080",
  ]);
  assert.throws(() => parseTrustedOrigins("api.example.com"), /invalid PAPERCLIP_WASM_TRUSTED_ORIGINS entry "api.example.com"/);
  assert.throws(() => parseTrustedOrigins("http://api.example.com"), /in plain text/);
});
