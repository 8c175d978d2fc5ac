// Issue 38: the Daytona package's duplex channel under the Node host
// (in-process, Paperclip's SDK harness), against createos-local's Daytona
// face. Paperclip's agent API bridge rides such a channel as HTTP/2: its
// server writes several frames at once (a SETTINGS ACK, a WINDOW_UPDATE,
// an answer), some of which the command answers with nothing, and later a
// PING, while the agent's own command runs on the same lease. Each frame
// must reach the command without waiting for a later write: in the e2e's
// Daytona run, the answer to the agent's request waited in the host's
// queue until Paperclip's next PING, and its watchdog ended the session.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import { createPlugin } from "../dist/plugin.js";
import { startBackend } from "./support/backend.mjs";
import { freshLedgerPath } from "./support/plugin.mjs";

const daytonaComponent = new URL("../packages/daytona/dist/component/", import.meta.url).href;
const { default: daytonaManifest } = await import("../packages/daytona/dist/manifest.js");

let backend;
before(async () => {
  backend = await startBackend({ toolbox: true });
});
after(async () => {
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The Daytona plugin in-process, recording what reaches `ctx.duplexChannel`. */
async function startDaytona() {
  const plugin = createPlugin({ poolSize: 3, env: {}, rateLedgerPath: freshLedgerPath(), componentDir: daytonaComponent });
  const hooks = plugin.definition;
  const harness = createEnvironmentTestHarness({ manifest: daytonaManifest, environmentDriver: { driverKey: "daytona" } });
  const notes = [];
  const logs = [];
  await hooks.setup({
    ...harness.ctx,
    execution: { log: (stream, chunk) => logs.push({ stream, chunk, at: Date.now() }) },
    loginPty: { output() {}, exit() {} },
    duplexChannel: {
      data: (hostRouteId, workerSessionId, chunk) => notes.push({ kind: "data", hostRouteId, workerSessionId, chunk: Buffer.from(chunk), at: Date.now() }),
      exit: (hostRouteId, workerSessionId, exitCode, transportClosed) => notes.push({ kind: "exit", hostRouteId, workerSessionId, exitCode, transportClosed }),
    },
  });
  const p = {
    driverKey: "daytona",
    companyId: "company-a",
    environmentId: "environment-d",
    config: { apiUrl: backend.daytonaApiUrl, toolboxUrl: backend.toolboxUrl, apiKey: backend.key, timeoutMs: 120_000 },
  };
  const lease = await hooks.onEnvironmentAcquireLease({ ...p, runId: `run-${randomUUID()}` });
  const scope = { driverKey: "daytona", companyId: p.companyId, environmentId: p.environmentId, providerLeaseId: lease.providerLeaseId };
  const stop = async () => {
    await hooks.onEnvironmentDestroyLease({ ...p, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    await hooks.onShutdown();
  };
  return { hooks, notes, logs, p, lease, scope, stop };
}

/** The channel's stdout so far. */
function received(notes, session) {
  return Buffer.concat(notes.filter((n) => n.kind === "data" && n.workerSessionId === session).map((n) => n.chunk)).toString();
}

/** Waits until the channel's stdout holds `text` (at most `ms`); how long it took, or undefined. */
async function echoed(notes, session, text, ms) {
  const start = Date.now();
  while (Date.now() - start < ms) {
    if (received(notes, session).includes(text)) return Date.now() - start;
    await sleep(10);
  }
  return undefined;
}

test("writes queued together all reach a Daytona channel's command, none waiting for a later write (Paperclip's HTTP/2 frames)", async () => {
  const { hooks, notes, scope, stop } = await startDaytona();
  try {
    const route = `route-${randomUUID()}`;
    // `head -n 3` answers nothing until it has read all three lines: no output
    // wakes the component between them, only the host's events do.
    const opened = await hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["head", "-n", "3"] });
    const session = opened.workerSessionId;
    // Three frames in one go, as Paperclip's HTTP/2 server writes a SETTINGS
    // ACK, a WINDOW_UPDATE and an answer within a millisecond (the e2e's
    // Daytona run): each is its own write, and none may wait for a later one.
    const lines = [0, 1, 2].map((i) => `together-${i}-${randomUUID()}\n`);
    await Promise.all(lines.map((line) => hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: session, data: Buffer.from(line).toString("base64") })));
    const took = await echoed(notes, session, lines.join(""), 15_000);
    assert.notEqual(took, undefined, `the three lines reached the command with no further write (it answered ${JSON.stringify(received(notes, session))})`);
    for (let i = 0; i < 500 && !notes.some((n) => n.kind === "exit" && n.workerSessionId === session); i++) await sleep(20);
    const exits = notes.filter((n) => n.kind === "exit" && n.workerSessionId === session);
    assert.deepEqual(exits.map((n) => [n.exitCode, n.transportClosed]), [[0, undefined]], "head exited by itself, once");
    await hooks.onDuplexChannelClose({ hostRouteId: route });
  } finally {
    await stop();
  }
});

test("a Daytona duplex channel keeps answering while another command runs and ends on the same lease", async () => {
  const { hooks, notes, p, lease, scope, stop } = await startDaytona();
  try {
    const route = `route-${randomUUID()}`;
    const opened = await hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["cat"] });
    const session = opened.workerSessionId;
    const first = `first-${randomUUID()}\n`;
    await hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: session, data: Buffer.from(first).toString("base64") });
    assert.notEqual(await echoed(notes, session, first, 15_000), undefined, "the first echo");
    // The agent's command: prints, waits a little, prints again and exits.
    const run = hooks.onEnvironmentExecute({ ...p, lease, command: "sh", args: ["-c", "echo begin; sleep 1; echo end"] });
    await sleep(500);
    const waits = [];
    for (const [i, pause] of [0, 1500, 3000].entries()) {
      await sleep(pause);
      const line = `ping-${i}-${randomUUID()}\n`;
      await hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: session, data: Buffer.from(line).toString("base64") });
      const took = await echoed(notes, session, line, 15_000);
      waits.push({ i, took });
      assert.notEqual(took, undefined, `ping ${i}: no echo; ${JSON.stringify(waits)}`);
    }
    const result = await run;
    assert.equal(result.stdout, "begin\nend\n");
    await hooks.onDuplexChannelClose({ hostRouteId: route });
  } finally {
    await stop();
  }
});
