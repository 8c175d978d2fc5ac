// Issue 44 item 4: a provider's declared rate budget protects its real
// service. An origin whose answers say they come from our embedded engine
// (`x-sandbox-engine`) does not spend it: it gets the budget the engine
// names (`x-sandbox-engine-rate-limit`, from its `--rate-limit`), or none.
// The first request to an origin is paced (nothing is known yet); an
// operator's own limit is spent everywhere; and a claim only ever concerns
// the origin that made it. The Rust host's rules
// (`sandbox-host/src/network/request_pacer.rs`).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { http } from "@bytecodealliance/preview2-shim";
import { createOutgoingHandler, HostFields } from "../dist/outgoing-handler.js";
import { createPacerBuffer, Pacer, pacerStarted } from "../dist/pacer.js";
import { startBackend, startRecordingServer } from "./support/backend.mjs";
import { startPlugin, base, freshLedgerPath } from "./support/plugin.mjs";

const ENGINE = { "x-sandbox-engine": "createos-local" };
const engine = await startRecordingServer({ answerHeaders: ENGINE });
const limitedEngine = await startRecordingServer({ answerHeaders: { ...ENGINE, "x-sandbox-engine-rate-limit": "50/3600000" } });
const service = await startRecordingServer();
after(() => Promise.all([engine.stop(), limitedEngine.stop(), service.stop()]));

/** One budget unit an hour: a second paced request would wait the hour. */
const HOURLY = { requests: 1, windowMs: 3_600_000 };

/**
 * Sends one GET per origin of `origins` through a handler whose policy
 * allows them all and spends `rateLimit` (declared or the operator's);
 * how many requests the budget let start. A request held back for the
 * budget fails with `connection-timeout` at the short deadline instead of
 * hanging the test.
 */
function starts(origins, rateLimit, rateLimitDeclared) {
  const buffer = createPacerBuffer();
  const pacer = new Pacer(buffer, freshLedgerPath());
  const handler = createOutgoingHandler(
    (target) => ({ allowedOrigin: target, secrets: [], rateLimit, rateLimitDeclared, deadlineMs: Date.now() + 3000 }),
    pacer,
  );
  for (const origin of origins) {
    const url = new URL(origin);
    const outgoing = new http.types.OutgoingRequest(new HostFields());
    outgoing.setScheme({ tag: "HTTP" });
    outgoing.setAuthority(url.host);
    outgoing.setPathWithQuery("/v1/sandboxes");
    const body = outgoing.body();
    let future;
    try {
      future = handler.handle(outgoing, undefined);
    } catch (error) {
      assert.fail(`a request to ${origin} was held for the budget (${JSON.stringify(error)})`);
    }
    http.types.OutgoingBody.finish(body);
    future.subscribe().block();
    const answer = future.get();
    assert.equal(answer.tag, "ok", `${origin} answered`);
    assert.equal(answer.val.tag, "ok", `${origin} answered (${JSON.stringify(answer.val.val)})`);
  }
  return pacerStarted(buffer);
}

test("the declared budget is not spent on an origin that said it is the engine, after its first answer", () => {
  assert.equal(starts([engine.url, engine.url, engine.url, engine.url], HOURLY, true), 1);
});

test("an engine that names its own budget gets that budget instead of the declared one", () => {
  assert.equal(starts([limitedEngine.url, limitedEngine.url, limitedEngine.url], HOURLY, true), 3);
});

test("an operator's limit is spent on the engine too", () => {
  assert.equal(starts([engine.url, engine.url, engine.url], { requests: 10, windowMs: 3_600_000 }, false), 3);
});

test("a claim of one origin never unpaces another: a real service keeps its budget", () => {
  const budget = { requests: 100, windowMs: 3_600_000 };
  // The engine's first request, and every request of the other origin.
  assert.equal(starts([engine.url, service.url, engine.url, service.url, service.url], budget, true), 4);
});

/**
 * The same against the real createos-local: a whole lease (acquire,
 * commands, release) under CreateOS's declared budget spends it on the
 * first request only, since every answer of the engine names it.
 */
test("a lease on createos-local spends the declared budget on its first request only", async () => {
  const backend = await startBackend();
  const plugin = await startPlugin({ poolSize: 1 });
  try {
    const params = base(backend);
    const lease = await plugin.harness.acquireLease({ ...params, runId: "run-engine-budget" });
    for (let i = 0; i < 3; i++) {
      const result = await plugin.harness.execute({ ...params, lease, command: "echo", args: [`e${i}`] });
      assert.equal(result.stdout, `e${i}\n`);
    }
    await plugin.harness.releaseLease({ ...params, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    const requests = (await backend.requests()).length;
    assert.ok(requests >= 8, `acquire, three commands and release made many requests (${requests})`);
    assert.equal((await plugin.hooks.onHealth()).details.rateLimitStarts, 1, "only the first request spent the declared budget");
  } finally {
    await plugin.stop();
    const stopped = await backend.stop();
    assert.match(stopped.stderr, /none survived/);
  }
});
