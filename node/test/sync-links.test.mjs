// Issue 26 "sync like tar": a workspace with symlinks (a Python venv's
// `bin/python -> /usr/bin/python3`, a link into a shared cache outside the
// tree, a dangling link) syncs both ways with every link copied as a link,
// its text exactly as it was; nothing is ever read through a link out of
// the mapping; an entry that cannot be carried (a FIFO) is named and
// skipped while the rest goes on; `followSymlinks` still refuses a link out
// of the mapping for the whole operation. Against the real createos-local.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { startBackend } from "./support/backend.mjs";
import { startPlugin, base } from "./support/plugin.mjs";

let backend;
let plugin;
let root;

before(async () => {
  backend = await startBackend();
  plugin = await startPlugin({ poolSize: 1 });
  root = await mkdtemp(path.join(tmpdir(), "sync-links-"));
});

after(async () => {
  await plugin?.stop();
  await rm(root, { recursive: true, force: true });
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const params = (overrides = {}) => base(backend, overrides);

/** A venv-like tree with every kind of link a real workspace has. */
async function venvTree() {
  const top = path.join(root, `ws-${randomUUID()}`);
  const venv = path.join(top, "venv");
  const cache = path.join(top, "shared-cache");
  await mkdir(path.join(venv, "bin"), { recursive: true });
  await mkdir(path.join(venv, "lib/python3.12/site-packages/pkg"), { recursive: true });
  await mkdir(cache, { recursive: true });
  await writeFile(path.join(cache, "secret-wheel.whl"), "outside the mapping\n");
  await writeFile(path.join(venv, "pyvenv.cfg"), "home = /usr/bin\n");
  await writeFile(path.join(venv, "lib/python3.12/site-packages/pkg/__init__.py"), "VALUE = 1\n");
  await writeFile(path.join(venv, "bin/activate"), "# activate\n");
  await symlink("/usr/bin/python3", path.join(venv, "bin/python")); // absolute, out of the mapping
  await symlink("python", path.join(venv, "bin/python3")); // relative, inside
  await symlink("lib", path.join(venv, "lib64")); // a directory link inside
  await symlink("../shared-cache", path.join(venv, "cache")); // out of the mapping, to a real directory
  await symlink("does-not-exist", path.join(venv, "dangling")); // dangling
  await mkdir(path.join(venv, "empty-dir/deeper"), { recursive: true });
  await symlink("../../pyvenv.cfg", path.join(venv, "empty-dir/deeper/cfg")); // a link whose directory holds no file
  execFileSync("mkfifo", [path.join(venv, "bin/control.fifo")]);
  return { top, venv };
}

const LINKS = {
  "bin/python": "/usr/bin/python3",
  "bin/python3": "python",
  lib64: "lib",
  cache: "../shared-cache",
  dangling: "does-not-exist",
  "empty-dir/deeper/cfg": "../../pyvenv.cfg",
};

test("a venv-like tree syncs in and out like tar: links stay links with their exact text, nothing is read through them, a FIFO is named and skipped", async () => {
  const { top, venv } = await venvTree();
  const lease = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  try {
    plugin.harness.logs.length = 0;
    const syncParams = (operations) => ({ ...params(), lease, operations });
    const report = await plugin.hooks.onEnvironmentSyncIn(
      syncParams([{ operationId: "in", files: [{ sourcePath: venv, targetPath: "/paperclip-workspace/venv", kind: "directory" }] }]),
    );
    // 3 regular files and 6 links; the FIFO is skipped.
    assert.deepEqual(report.operations, [{ operationId: "in", filesTransferred: 9, bytesTransferred: 16 + 10 + 11 }]);
    const warnings = plugin.harness.logs.filter((l) => l.level === "warn").map((l) => l.message);
    assert.equal(warnings.length, 1, JSON.stringify(warnings));
    assert.match(warnings[0], /control\.fifo.*FIFO/, "the refusal names the one entry");

    const listing = await plugin.harness.execute({
      ...params(),
      lease,
      command: "sh",
      args: ["-c", "cd /paperclip-workspace/venv && find . -type l -printf '%P -> %l\\n' | sort && find . -type f | sort && test ! -e bin/control.fifo && echo no-fifo"],
    });
    const expectedLinks = Object.entries(LINKS)
      .map(([name, text]) => `${name} -> ${text}`)
      .sort()
      .join("\n");
    assert.equal(listing.exitCode, 0, listing.stderr);
    assert.ok(listing.stdout.startsWith(`${expectedLinks}\n`), listing.stdout);
    assert.match(listing.stdout, /\.\/bin\/activate\n\.\/lib\/python3\.12\/site-packages\/pkg\/__init__\.py\n\.\/pyvenv\.cfg\nno-fifo\n$/);
    assert.doesNotMatch(listing.stdout, /secret-wheel/, "nothing was read through the link out of the mapping");

    // Back out to a fresh host directory, plus a sandbox link to a sandbox file outside the mapping.
    await plugin.harness.execute({ ...params(), lease, command: "sh", args: ["-c", "echo sandbox-only > /paperclip-workspace/outside.txt && ln -s /paperclip-workspace/outside.txt /paperclip-workspace/venv/escape"] });
    const back = path.join(top, "back");
    const out = await plugin.hooks.onEnvironmentSyncOut(
      syncParams([{ operationId: "out", files: [{ sourcePath: "/paperclip-workspace/venv", targetPath: back, kind: "directory" }] }]),
    );
    assert.deepEqual(out.operations, [{ operationId: "out", filesTransferred: 10, bytesTransferred: 16 + 10 + 11 }]);
    for (const [name, text] of Object.entries({ ...LINKS, escape: "/paperclip-workspace/outside.txt" })) {
      assert.ok((await lstat(path.join(back, name))).isSymbolicLink(), `${name} is a link on the host`);
      assert.equal(await readlink(path.join(back, name)), text, `${name}'s text is kept`);
    }
    assert.equal(await readFile(path.join(back, "lib/python3.12/site-packages/pkg/__init__.py"), "utf8"), "VALUE = 1\n");
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

test("followSymlinks copies links inside the mapping as contents and refuses the operation for a link out of it, naming it", async () => {
  const { venv } = await venvTree();
  const lease = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  try {
    const syncParams = (operations) => ({ ...params(), lease, operations });
    await backend.clearRequests();
    const refused = await plugin.hooks
      .onEnvironmentSyncIn(syncParams([{ operationId: "follow", files: [{ sourcePath: venv, targetPath: "/paperclip-workspace/followed", kind: "directory", followSymlinks: true }] }]))
      .then(
        () => null,
        (error) => error,
      );
    assert.ok(refused, "the operation was refused");
    assert.match(refused.message, /symlink .*venv\/bin\/python (points outside its mapping|points to nothing)/);
    assert.equal((await backend.requests()).length, 0, "nothing was uploaded");

    // A tree whose links all stay inside: followed, copied as contents.
    const inside = path.join(root, `inside-${randomUUID()}`);
    await mkdir(path.join(inside, "lib"), { recursive: true });
    await writeFile(path.join(inside, "lib/mod.py"), "X = 2\n");
    await symlink("lib", path.join(inside, "lib64"));
    await symlink("lib/mod.py", path.join(inside, "alias.py"));
    const report = await plugin.hooks.onEnvironmentSyncIn(
      syncParams([{ operationId: "follow-in", files: [{ sourcePath: inside, targetPath: "/paperclip-workspace/inside", kind: "directory", followSymlinks: true }] }]),
    );
    assert.deepEqual(report.operations, [{ operationId: "follow-in", filesTransferred: 3, bytesTransferred: 18 }]);
    const check = await plugin.harness.execute({ ...params(), lease, command: "sh", args: ["-c", "cd /paperclip-workspace/inside && find . -type l | wc -l && cat alias.py lib64/mod.py"] });
    assert.equal(check.stdout, "0\nX = 2\nX = 2\n");
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

/**
 * The host side of "never followed out of the mapping": a host target
 * whose directory is a link out of it (left by an earlier sync, say) is
 * never written through; that one entry is named and skipped, the rest of
 * the operation lands.
 */
test("sync out never writes through a host link out of the mapping: that entry is named and skipped, the rest lands", async () => {
  const lease = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  try {
    const prepared = await plugin.harness.execute({
      ...params(),
      lease,
      command: "sh",
      args: ["-c", "mkdir -p /paperclip-workspace/out/lib && echo inner > /paperclip-workspace/out/lib/mod.py && echo top > /paperclip-workspace/out/top.txt"],
    });
    assert.equal(prepared.exitCode, 0, prepared.stderr);
    const back = path.join(root, `back-${randomUUID()}`);
    const elsewhere = path.join(root, `elsewhere-${randomUUID()}`);
    await mkdir(back, { recursive: true });
    await mkdir(elsewhere);
    await symlink(elsewhere, path.join(back, "lib"));
    plugin.harness.logs.length = 0;
    const out = await plugin.hooks.onEnvironmentSyncOut({
      ...params(),
      lease,
      operations: [{ operationId: "out", files: [{ sourcePath: "/paperclip-workspace/out", targetPath: back, kind: "directory" }] }],
    });
    assert.deepEqual(out.operations, [{ operationId: "out", filesTransferred: 1, bytesTransferred: 4 }]);
    assert.equal(await readFile(path.join(back, "top.txt"), "utf8"), "top\n");
    assert.deepEqual(await readdir(elsewhere), [], "nothing was written through the link");
    const warnings = plugin.harness.logs.filter((l) => l.level === "warn").map((l) => l.message);
    assert.equal(warnings.length, 1, JSON.stringify(warnings));
    assert.match(warnings[0], /lib\/mod\.py.*never written through/);
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});
