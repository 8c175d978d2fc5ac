// A second worker process for the rate-limit suite: a plugin instance of its
// own (its own pool, its own in-process queue) that opens the request pacer's ledger
// file it is given, acquires a lease, runs commands in parallel, destroys
// the lease and prints what it got and its budget counters as one JSON line.
// Usage: node commands-in-process.mjs '{"url","key","ledger","limit","count","tag"}'
import { startPlugin, base } from "./plugin.mjs";

const job = JSON.parse(process.argv[2]);
const plugin = await startPlugin({ poolSize: 2, rateLimit: job.limit, rateLedgerPath: job.ledger });
const params = base({ url: job.url, key: job.key });
try {
  const lease = await plugin.harness.acquireLease({ ...params, runId: `run-${job.tag}` });
  const results = await Promise.all(
    Array.from({ length: job.count }, (_, i) => plugin.harness.execute({ ...params, lease, command: "echo", args: [`${job.tag}-${i}`] })),
  );
  await plugin.harness.destroyLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  const health = (await plugin.hooks.onHealth()).details;
  process.stdout.write(`${JSON.stringify({ outputs: results.map((r) => r.stdout), health })}\n`);
} finally {
  await plugin.stop();
}
