// Issue 38 item 6 on the Node side: bad input to the login terminal and
// duplex channel hooks, each a clear typed outcome with nothing left
// running unproven. The plugin runs in-process under the SDK's harness
// (Paperclip's own worker manager binds route and session ids itself and
// retires a worker on a frame it did not expect, so a frame from a foreign
// route or a lost open reply is driven here, at the hooks, where the
// plugin must refuse it on its own); the sessions run against
// createos-local's real sandboxes.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createEnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import manifest from "../dist/manifest.js";
import { createPlugin } from "../dist/plugin.js";
import { channelRequest, loginRequest, Session } from "../dist/interactive-sessions.js";
import { startBackend } from "./support/backend.mjs";
import { base, freshLedgerPath } from "./support/plugin.mjs";

let backend;
before(async () => {
  backend = await startBackend();
});
after(async () => {
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function settle(promise) {
  try {
    return { value: await promise };
  } catch (error) {
    return { error };
  }
}

/** The plugin with recording `ctx.loginPty` and `ctx.duplexChannel`. */
async function startPlugin() {
  const plugin = createPlugin({ poolSize: 3, env: {}, rateLedgerPath: freshLedgerPath() });
  const hooks = plugin.definition;
  const harness = createEnvironmentTestHarness({ manifest, environmentDriver: { driverKey: "createos" } });
  const notes = [];
  await hooks.setup({
    ...harness.ctx,
    execution: { log() {} },
    loginPty: {
      output: (hostRouteId, workerSessionId, chunk) => notes.push({ kind: "output", hostRouteId, workerSessionId, chunk }),
      exit: (hostRouteId, workerSessionId, exitCode) => notes.push({ kind: "exit", hostRouteId, workerSessionId, exitCode }),
    },
    duplexChannel: {
      data: (hostRouteId, workerSessionId, chunk) => notes.push({ kind: "data", hostRouteId, workerSessionId, chunk: Buffer.from(chunk) }),
      exit: (hostRouteId, workerSessionId, exitCode, transportClosed) => notes.push({ kind: "exit", hostRouteId, workerSessionId, exitCode, transportClosed }),
    },
  });
  const p = base(backend);
  const lease = await hooks.onEnvironmentAcquireLease({ ...p, runId: `run-${randomUUID()}` });
  const scope = { driverKey: "createos", companyId: p.companyId, environmentId: p.environmentId, providerLeaseId: lease.providerLeaseId };
  const processes = async (pattern) => {
    const result = await hooks.onEnvironmentExecute({
      ...p,
      lease,
      command: "sh",
      args: ["-c", `for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null); case "$c" in *"$1"*) echo "$c";; esac; done | grep -v -e 'for d in' || true`, "sh", pattern],
    });
    return result.stdout.split("\n").filter(Boolean);
  };
  const stop = async () => {
    await hooks.onEnvironmentDestroyLease({ ...p, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    await hooks.onShutdown();
  };
  return { hooks, notes, p, lease, scope, processes, stop };
}

async function standIn(hooks, p, lease) {
  await hooks.onEnvironmentExecute({
    ...p,
    lease,
    command: "sh",
    args: ["-c", `mkdir -p "$HOME/bin" && printf '#!/bin/sh\\nexec bash --norc --noprofile -i\\n' > "$HOME/bin/claude" && chmod +x "$HOME/bin/claude" && echo 'PATH="$HOME/bin:$PATH"' > "$HOME/.profile"`],
  });
}

test("a duplex channel's frames are bound to its route; malformed base64 and input after close are refused by name; the exit is reported once", async () => {
  const { hooks, notes, p, lease, scope, stop } = await startPlugin();
  const route = `route-${randomUUID()}`;
  const opened = await hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["sh", "-c", "cat > /tmp/channel-input"] });
  assert.equal(opened.hostRouteId, route);
  // A second channel on the same lease, and a write that names the first one's session with the second one's route.
  const otherRoute = `route-${randomUUID()}`;
  const other = await hooks.onDuplexChannelOpen({ hostRouteId: otherRoute, ...scope, command: ["cat"] });
  const foreign = await settle(hooks.onDuplexChannelWrite({ hostRouteId: otherRoute, workerSessionId: opened.workerSessionId, data: Buffer.from("intruder\n").toString("base64") }));
  assert.match(foreign.error?.message ?? "", /belongs to another route; this request is refused and nothing was written/);
  const unknown = await settle(hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: randomUUID(), data: "" }));
  assert.match(unknown.error?.message ?? "", /No duplex channel .* is open in this worker/);
  const malformed = await settle(hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: opened.workerSessionId, data: "not base64!" }));
  assert.match(malformed.error?.message ?? "", /not well-formed base64; nothing was written/);
  // A route already in use is refused before anything runs.
  const twice = await settle(hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["cat"] }));
  assert.match(twice.error?.message ?? "", /already has an open session; nothing was opened/);
  const empty = await settle(hooks.onDuplexChannelOpen({ hostRouteId: `route-${randomUUID()}`, ...scope, command: [] }));
  assert.match(empty.error?.message ?? "", /non-empty array of strings/);

  await hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: opened.workerSessionId, data: Buffer.from("owner\n").toString("base64") });
  await sleep(300);
  assert.deepEqual(await hooks.onDuplexChannelClose({ hostRouteId: route }), { hostRouteId: route, workerSessionId: opened.workerSessionId });
  assert.deepEqual(await hooks.onDuplexChannelClose({ hostRouteId: route }), { hostRouteId: route, workerSessionId: opened.workerSessionId }, "a repeated close is acknowledged the same way");
  const written = await hooks.onEnvironmentExecute({ ...p, lease, command: "cat", args: ["/tmp/channel-input"] });
  assert.equal(written.stdout, "owner\n", "only the owner's bytes reached the command");
  const late = await settle(hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: opened.workerSessionId, data: Buffer.from("late").toString("base64") }));
  assert.match(late.error?.message ?? "", /duplex channel .* is closed; nothing more reaches it/);
  const exits = notes.filter((note) => note.kind === "exit" && note.workerSessionId === opened.workerSessionId);
  assert.equal(exits.length, 1, "one exit");
  assert.equal(exits[0].transportClosed, undefined, "ended on request: not a transport loss");
  await hooks.onDuplexChannelClose({ hostRouteId: otherRoute });
  assert.equal(notes.filter((note) => note.kind === "exit" && note.workerSessionId === other.workerSessionId).length, 1);
  await stop();
});

test("an idle session costs nothing: the component waits on the events pollable instead of spinning on it", async () => {
  const { hooks, notes, scope, stop } = await startPlugin();
  const route = `route-${randomUUID()}`;
  const opened = await hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["cat"] });
  await hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: opened.workerSessionId, data: Buffer.from("ping\n").toString("base64") });
  for (let i = 0; !notes.some((n) => n.kind === "data" && n.chunk.toString() === "ping\n"); i++) {
    assert.ok(i < 400, "cat echoed");
    await sleep(25);
  }
  const before = (await hooks.onHealth()).details.interactionChecks;
  await sleep(1000);
  const after = (await hooks.onHealth()).details.interactionChecks;
  // A pollable left ready with nothing to take made the CreateOS component look for an event
  // tens of thousands of times a second (a core spent on an idle channel).
  assert.ok(after - before < 50, `${after - before} looks for an event in an idle second`);
  await hooks.onDuplexChannelClose({ hostRouteId: route });
  await stop();
});

test("a process that exits at once, silent, still reports its exit once, after the open reply", async () => {
  const { hooks, notes, scope, stop } = await startPlugin();
  for (let round = 0; round < 5; round++) {
    const route = `route-${randomUUID()}`;
    const opened = await hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["sh", "-c", "exit 7"] });
    for (let i = 0; !notes.some((n) => n.kind === "exit" && n.workerSessionId === opened.workerSessionId); i++) {
      assert.ok(i < 400, "the exit was reported");
      await sleep(25);
    }
    const exits = notes.filter((n) => n.kind === "exit" && n.workerSessionId === opened.workerSessionId);
    assert.deepEqual(exits.map((n) => [n.hostRouteId, n.exitCode, n.transportClosed]), [[route, 7, undefined]]);
    await hooks.onDuplexChannelClose({ hostRouteId: route });
  }
  await stop();
});

test("a lost open reply: the route alone closes the session and nothing is left running", async () => {
  const { hooks, scope, processes, stop } = await startPlugin();
  const route = `route-${randomUUID()}`;
  // The open went through; its reply never reached the host, which closes by the route it minted.
  await hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["sleep", "307"] });
  // The open resolves once the process exists; it shows its own command
  // line once its launcher has joined the machine and run it.
  for (let i = 0; (await processes("sleep 307")).length !== 1; i++) {
    assert.ok(i < 100, "the channel's command runs");
    await sleep(50);
  }
  const closed = await hooks.onDuplexChannelClose({ hostRouteId: route });
  assert.equal(closed.hostRouteId, route);
  assert.deepEqual(await processes("sleep 307"), []);
  // A close for a route that never opened is acknowledged too (nothing to end).
  assert.deepEqual(await hooks.onDuplexChannelClose({ hostRouteId: "route-never-opened" }), { hostRouteId: "route-never-opened" });
  await stop();
});

test("a login terminal refuses input after its close, and its output is bound to its open reply", async () => {
  const { hooks, notes, p, lease, scope, processes, stop } = await startPlugin();
  await standIn(hooks, p, lease);
  const route = `route-${randomUUID()}`;
  const opened = await hooks.onLoginPtyOpen({ hostRouteId: route, ...scope, loginCommandKey: "claude", sessionHome: `/tmp/paperclip-adapter-login/${randomUUID()}` });
  await hooks.onLoginPtyInput({ workerSessionId: opened.workerSessionId, data: "echo $CLAUDE_CONFIG_DIR; stty size\n" });
  for (let i = 0; !notes.some((n) => n.kind === "output" && /30 120/.test(n.chunk)); i++) {
    assert.ok(i < 200, "the terminal answered");
    await sleep(25);
  }
  assert.ok(notes.filter((n) => n.kind === "output").every((n) => n.hostRouteId === route && n.workerSessionId === opened.workerSessionId));
  assert.match(notes.map((n) => n.chunk ?? "").join(""), /\/tmp\/paperclip-adapter-login\/[0-9a-f-]{36}\r\n/, "the session home reached the command as its variable");
  assert.deepEqual(await hooks.onLoginPtyClose({ hostRouteId: route }), { hostRouteId: route });
  const late = await settle(hooks.onLoginPtyInput({ workerSessionId: opened.workerSessionId, data: "echo late\n" }));
  assert.match(late.error?.message ?? "", /login terminal .* is closed; nothing more reaches it/);
  const stray = await settle(hooks.onLoginPtyInput({ workerSessionId: randomUUID(), data: "x" }));
  assert.match(stray.error?.message ?? "", /No login terminal .* is open in this worker/);
  const notText = await settle(hooks.onLoginPtyInput({ workerSessionId: opened.workerSessionId, data: 42 }));
  assert.match(notText.error?.message ?? "", /must be a string/);
  assert.equal(notes.filter((n) => n.kind === "exit").length, 1, "the exit is reported once");
  assert.deepEqual(await processes("bash --norc"), []);
  await stop();
});

test("a huge write (24 MiB in one frame) reaches the command whole, queued a bounded piece at a time", async () => {
  const { hooks, notes, scope, stop } = await startPlugin();
  const route = `route-${randomUUID()}`;
  const size = 24 * 1024 * 1024;
  const opened = await hooks.onDuplexChannelOpen({ hostRouteId: route, ...scope, command: ["sh", "-c", `sleep 1; head -c ${size} | wc -c`] });
  await hooks.onDuplexChannelWrite({ hostRouteId: route, workerSessionId: opened.workerSessionId, data: Buffer.alloc(size, 0x61).toString("base64") });
  for (let i = 0; !notes.some((n) => n.kind === "exit" && n.workerSessionId === opened.workerSessionId); i++) {
    assert.ok(i < 2400, "the command read everything and exited");
    await sleep(25);
  }
  const echoed = Buffer.concat(notes.filter((n) => n.kind === "data" && n.workerSessionId === opened.workerSessionId).map((n) => n.chunk)).toString();
  assert.equal(echoed.trim(), String(size));
  assert.equal(notes.find((n) => n.kind === "exit" && n.workerSessionId === opened.workerSessionId).exitCode, 0);
  await hooks.onDuplexChannelClose({ hostRouteId: route });
  await stop();
});

test("a resize of a pipe, a resize a provider cannot do, close-input on a terminal and input after close-input are refused by name, nothing sent", async () => {
  const sent = [];
  const running = { send: async (event) => (sent.push(event), true), cancel() {} };
  const pipes = new Session("duplex-channel", "r1", "sb-1", "c", "e", undefined, true);
  pipes.attach(running);
  await assert.rejects(pipes.resize({ columns: 80, rows: 24 }), /runs with pipes, which have no window size to change/);
  await pipes.closeInput();
  await assert.rejects(pipes.write(new Uint8Array([1])), /its input was closed; input after close is refused/);
  const fixed = new Session("login-pty", "r2", "sb-1", "c", "e", { columns: 120, rows: 30 }, false);
  fixed.attach(running);
  await assert.rejects(fixed.resize({ columns: 100, rows: 40 }), /keeps a terminal at the size it was opened with \(no terminal-resize\)/);
  await assert.rejects(fixed.closeInput(), /a terminal has no separate input to close/);
  const resizable = new Session("login-pty", "r3", "sb-1", "c", "e", { columns: 120, rows: 30 }, true);
  resizable.attach(running);
  await assert.rejects(resizable.resize({ columns: 0, rows: 40 }), /whole columns and rows from 1 to 65535/);
  await resizable.resize({ columns: 100, rows: 40 });
  await resizable.end();
  await assert.rejects(resizable.write(new Uint8Array([1])), /it is ending/);
  assert.deepEqual(sent, [{ tag: "close-input" }, { tag: "resize", val: { columns: 100, rows: 40 } }, { tag: "end" }]);
});

test("the login command map is closed and the session home exact", () => {
  const home = `/tmp/paperclip-adapter-login/${randomUUID()}`;
  for (const key of ["claude", "codex", "grok"]) {
    const request = loginRequest(key, home);
    assert.equal(request.command, "/bin/sh");
    assert.ok(!request.args.join(" ").includes(home), "the home reaches the script only as a variable");
    assert.deepEqual(request.terminal, { columns: 120, rows: 30 });
    assert.ok(request.env.some(([name, value]) => name === "LOGIN_HOME" && value === home));
  }
  assert.match(loginRequest("claude", home).args[1], /exec claude setup-token$/);
  assert.match(loginRequest("codex", home).args[1], /exec codex .*login --device-auth$/);
  assert.match(loginRequest("grok", home).args[1], /exec grok login --device-auth$/);
  for (const key of ["bash", "", "constructor", "__proto__", undefined, 1]) assert.throws(() => loginRequest(key, home), /not one of claude, codex or grok/);
  for (const bad of ["", "/tmp/paperclip-adapter-login/", `/tmp/paperclip-adapter-login/${randomUUID().toUpperCase()}`, `/tmp/paperclip-adapter-login/${randomUUID()}\n`, `/tmp/paperclip-adapter-login//${randomUUID()}`, null]) {
    assert.throws(() => loginRequest("claude", bad), /not of the form/);
  }
  assert.deepEqual(channelRequest(["printf", "%s", "a b;c"]).args, ["%s", "a b;c"], "argv passed verbatim");
  assert.equal(channelRequest(["cat"]).terminal, undefined);
  for (const bad of [[], [""], "cat", [1], null]) assert.throws(() => channelRequest(bad));
});
