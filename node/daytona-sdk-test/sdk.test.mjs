// Daytona's official TypeScript SDK (@daytonaio/sdk, pinned in
// package.json) against createos-local's Daytona face: every step a
// provider or an SDK user relies on must answer as the service does.
// Needs `cargo build -p sandbox-engine` (or CREATEOS_LOCAL_BIN).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Daytona } from "@daytonaio/sdk";
import { startBackend } from "../test/support/backend.mjs";

const poll = async (what, check, timeoutMs = 60_000) => {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
};

test("the official Daytona SDK drives the local Daytona face", async (t) => {
  const backend = await startBackend();
  t.after(async () => {
    const { code, stderr } = await backend.stop();
    assert.equal(code, 0, stderr);
  });
  const daytona = new Daytona({ apiKey: backend.key, apiUrl: `${backend.url}/daytona/api`, target: "local" });

  // create, get, list (paginated)
  const sandbox = await daytona.create({ envVars: { FROM_CREATE: "yes" }, labels: { suite: "sdk" } }, { timeout: 60 });
  assert.equal(sandbox.state, "started");
  const again = await daytona.get(sandbox.id);
  assert.equal(again.id, sandbox.id);
  const listed = [];
  for await (const item of await daytona.list({ labels: { suite: "sdk" } })) listed.push(item.id);
  assert.deepEqual(listed, [sandbox.id]);

  // executeCommand: through a shell, with env, exit code, combined output
  const run = await sandbox.process.executeCommand('echo "$GREETING $FROM_CREATE"; echo oops >&2; exit 3', undefined, {
    GREETING: "hello world",
  });
  assert.equal(run.exitCode, 3);
  // Both streams, in the order printed: one pipe, as the daemon's combined
  // output (the face used two pipes once, and "oops" came first).
  assert.match(run.result, /^hello world yes\noops\n?$/);
  const cwd = await sandbox.process.executeCommand("pwd", "/tmp");
  assert.equal(cwd.result.trim(), "/tmp");

  // sessions: synchronous and asynchronous commands, split logs
  await sandbox.process.createSession("s1");
  const sync = await sandbox.process.executeSessionCommand("s1", { command: "echo out; echo err >&2; exit 4" });
  assert.equal(sync.exitCode, 4);
  assert.equal(sync.stdout, "out\n");
  assert.equal(sync.stderr, "err\n");
  const started = await sandbox.process.executeSessionCommand("s1", {
    command: "echo first; sleep 0.2; echo second >&2",
    runAsync: true,
  });
  const exitCode = await poll("the async command", async () => {
    const command = await sandbox.process.getSessionCommand("s1", started.cmdId);
    return command.exitCode ?? undefined;
  });
  assert.equal(exitCode, 0);
  const logs = await sandbox.process.getSessionCommandLogs("s1", started.cmdId);
  assert.equal(logs.stdout, "first\n");
  assert.equal(logs.stderr, "second\n");
  assert.equal(logs.output, "first\nsecond\n");
  // follow a running command's logs with callbacks (the SDK opens the
  // toolbox's log WebSocket): every piece of each stream, in order, and the
  // call returns once the command has ended
  const followed = await sandbox.process.executeSessionCommand("s1", {
    command: "for i in 1 2 3; do echo out $i; echo err $i >&2; sleep 0.1; done",
    runAsync: true,
  });
  let liveOut = "";
  let liveErr = "";
  await sandbox.process.getSessionCommandLogs(
    "s1",
    followed.cmdId,
    (text) => (liveOut += text),
    (text) => (liveErr += text),
  );
  assert.equal(liveOut, "out 1\nout 2\nout 3\n");
  assert.equal(liveErr, "err 1\nerr 2\nerr 3\n");
  assert.equal((await sandbox.process.getSessionCommand("s1", followed.cmdId)).exitCode, 0);
  const session = await sandbox.process.getSession("s1");
  assert.equal(session.commands.length, 3);
  await sandbox.process.deleteSession("s1");

  // files: upload, download, list, folders, bulk upload
  await sandbox.fs.createFolder("/root/dir", "755");
  await sandbox.fs.uploadFile(Buffer.from("one\n"), "/root/dir/one.txt");
  await sandbox.fs.uploadFiles([
    { source: Buffer.from("two\n"), destination: "/root/dir/two.txt" },
    { source: Buffer.from("three\n"), destination: "/root/dir/sub/three.txt" },
  ]);
  assert.equal((await sandbox.fs.downloadFile("/root/dir/one.txt")).toString(), "one\n");
  assert.equal((await sandbox.fs.downloadFile("/root/dir/sub/three.txt")).toString(), "three\n");
  const files = await sandbox.fs.listFiles("/root/dir");
  assert.deepEqual(files.map((f) => f.name).sort(), ["one.txt", "sub", "two.txt"]);
  const one = files.find((f) => f.name === "one.txt");
  assert.equal(one.isDir, false);
  assert.equal(one.size, 4);
  assert.equal(files.find((f) => f.name === "sub").isDir, true);
  const seen = await sandbox.process.executeCommand("cat /root/dir/two.txt");
  assert.equal(seen.result, "two\n");

  // stop and start: files are kept
  await sandbox.stop();
  assert.equal(sandbox.state, "stopped");
  await sandbox.start();
  assert.equal(sandbox.state, "started");
  assert.equal((await sandbox.fs.downloadFile("/root/dir/one.txt")).toString(), "one\n");

  // snapshots: one taken of the stopped sandbox is listed (paginated) and
  // found by name, and the SDK's delete (by the id it resolves) removes it
  await sandbox.stop();
  const taken = await fetch(`${backend.url}/daytona/api/sandbox/${sandbox.id}/snapshot`, {
    method: "POST",
    headers: { authorization: `Bearer ${backend.key}`, "content-type": "application/json" },
    body: JSON.stringify({ name: "sdk-snap" }),
  });
  assert.equal(taken.status, 200, await taken.text());
  const snapshots = await daytona.snapshot.list();
  assert.deepEqual([snapshots.total, snapshots.page, snapshots.totalPages], [1, 1, 1]);
  assert.equal(snapshots.items[0].name, "sdk-snap");
  assert.equal(snapshots.items[0].state, "active");
  assert.deepEqual((await daytona.snapshot.list(2, 1)).items, []);
  const found = await daytona.snapshot.get("sdk-snap");
  assert.equal(found.id, snapshots.items[0].id);
  assert.notEqual(found.id, "sdk-snap", "an id, as the service's");
  await daytona.snapshot.delete(found);
  assert.equal((await daytona.snapshot.list()).total, 0);

  // delete: gone
  await sandbox.delete();
  await assert.rejects(daytona.get(sandbox.id), /not found|404/i);
});
