// Issue 44 item 5: Paperclip runs an agent in `lease.metadata.remoteCwd`
// (else `/tmp`), and before it syncs the workspace in it removes every
// top-level entry of that directory but `.paperclip-runtime` and
// `.paperclip-upload-*`. So a lease names a directory of its own: absolute,
// not `/tmp`, holding nothing of the provider's (CreateOS keeps its lease
// marker at the workspace root), so that Paperclip's wipe leaves the lease
// resumable; and a command's staged stdin never lands in it. Both packed
// providers, against createos-local.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startBackend } from "./support/backend.mjs";
import { startPlugin, COMPANY, ENVIRONMENT } from "./support/plugin.mjs";

let backend;
before(async () => {
  backend = await startBackend({ toolbox: true });
});
after(async () => {
  const stopped = await backend.stop();
  assert.match(stopped.stderr, /none survived/, "createos-local saw every process tree exit");
});

const PROVIDERS = [
  { driverKey: "createos", componentDir: undefined, config: (b) => ({ apiUrl: b.url }) },
  {
    driverKey: "daytona",
    componentDir: new URL("../packages/daytona/dist/component/", import.meta.url).href,
    config: (b) => ({ apiUrl: b.daytonaApiUrl, toolboxUrl: b.toolboxUrl }),
  },
];

/** What Paperclip runs before it extracts the workspace (`remoteCwd`'s top level goes). */
const PAPERCLIP_WIPE = `find . -mindepth 1 -maxdepth 1 ! -name .paperclip-runtime ! -name '.paperclip-upload-*' -exec rm -rf -- {} +`;

for (const { driverKey, componentDir, config } of PROVIDERS) {
  test(`${driverKey}: a lease names a working directory of its own that Paperclip may wipe and still resume`, async () => {
    const plugin = await startPlugin({ poolSize: 1, componentDir });
    const hooks = plugin.hooks;
    const params = {
      driverKey,
      companyId: COMPANY,
      environmentId: ENVIRONMENT,
      config: { ...config(backend), apiKey: backend.key, timeoutMs: 60_000, reuseLease: true },
    };
    const lease = await hooks.onEnvironmentAcquireLease({ ...params, runId: `run-remote-cwd-${driverKey}` });
    try {
      const remoteCwd = lease.metadata?.remoteCwd;
      assert.equal(typeof remoteCwd, "string", `the lease reports remoteCwd (${JSON.stringify(lease.metadata)})`);
      assert.ok(remoteCwd.startsWith("/") && !["/", "/tmp", "/tmp/"].includes(remoteCwd), `remoteCwd ${remoteCwd} is a directory of its own`);
      const run = (command, extra = {}) =>
        hooks.onEnvironmentExecute({ ...params, lease, command: "sh", args: ["-c", command], cwd: remoteCwd, ...extra });
      // Realized where Paperclip will ask (it passes remoteCwd as the remote path).
      const realized = await hooks.onEnvironmentRealizeWorkspace({ ...params, lease, workspace: { remotePath: remoteCwd } });
      assert.equal(realized.cwd, remoteCwd);
      // Nothing of the provider's is in it, not even a staged stdin while a command reads it.
      const listing = await run("ls -A .; cat", { stdin: "stdin-text\n" });
      assert.equal(listing.exitCode, 0, listing.stderr);
      assert.equal(listing.stdout, "stdin-text\n", "the directory was empty while stdin was staged");
      // Paperclip's sync: wipe the top level, then extract the workspace.
      const synced = await run(`echo old > stale.txt && ${PAPERCLIP_WIPE} && echo synced > file.txt && ls -A`);
      assert.equal(synced.stdout, "file.txt\n", synced.stderr);
      const receipt = await hooks.onEnvironmentReleaseLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
      assert.equal(receipt.state, "stopped");
      const resumed = await hooks.onEnvironmentResumeLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
      assert.equal(resumed.providerLeaseId, lease.providerLeaseId, `the wiped lease resumes (${JSON.stringify(resumed.metadata)})`);
      assert.equal(resumed.metadata.remoteCwd, remoteCwd, "a resumed lease names the same directory");
      const kept = await hooks.onEnvironmentExecute({ ...params, lease: resumed, command: "cat", args: ["file.txt"], cwd: remoteCwd });
      assert.equal(kept.stdout, "synced\n");
    } finally {
      await hooks.onEnvironmentDestroyLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
      await plugin.stop();
    }
  });
}
