// The plugin under Paperclip's SDK test harness (createEnvironmentTestHarness),
// with a recording execute log sink (the harness's own sink is a no-op).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import manifest from "../../dist/manifest.js";
import { createPlugin } from "../../dist/plugin.js";

export const COMPANY = "company-a";
export const ENVIRONMENT = "environment-1";

/** This test process's budget files, removed when it exits. */
let ledgers;

/** A fresh request pacer ledger file, so that tests do not share budgets unless they mean to. */
export function freshLedgerPath() {
  if (!ledgers) {
    ledgers = mkdtempSync(path.join(tmpdir(), "createos-rate-budget-"));
    const dir = ledgers;
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
  }
  return path.join(mkdtempSync(path.join(ledgers, "budget-")), "rate-budget.sqlite");
}

/**
 * Starts a plugin instance in-process; `logs` records ctx.execution.log calls.
 * Each gets its own request pacer ledger file unless `rateLedgerPath` names one.
 */
export async function startPlugin(options = {}) {
  const plugin = createPlugin({ poolSize: 2, env: {}, rateLedgerPath: freshLedgerPath(), ...options });
  const hooks = plugin.definition;
  const harness = createEnvironmentTestHarness({
    manifest,
    environmentDriver: {
      driverKey: "createos",
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
  return { plugin, hooks, harness, logs, stop: () => hooks.onShutdown() };
}

/** Base params for a config pointing at `backend`. */
export function base(backend, overrides = {}) {
  const { config, ...rest } = overrides;
  return {
    driverKey: "createos",
    companyId: COMPANY,
    environmentId: ENVIRONMENT,
    config: { apiUrl: backend.url, apiKey: backend.key, timeoutMs: 60_000, ...(config ?? {}) },
    ...rest,
  };
}
