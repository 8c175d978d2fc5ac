// The host's wasi:http outgoing-handler: exactly one origin, the key only
// there, never visible to the component; the declared rate limit spent as
// one sliding-window budget shared by all threads.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Worker } from "node:worker_threads";
import { http } from "@bytecodealliance/preview2-shim";
import { createOutgoingHandler, HostFields } from "../dist/outgoing-handler.js";
import { createPacerBuffer, Pacer, pacerQueue, pacerWaits, windowMargin } from "../dist/pacer.js";
import { setTimeout as delay } from "node:timers/promises";
import { startRecordingServer } from "./support/backend.mjs";

const KEY = "canary-key-for-handler-test";
const allowed = await startRecordingServer();
const other = await startRecordingServer();
after(() => Promise.all([allowed.stop(), other.stop()]));

function request(origin, path = "/v1/sandboxes") {
  const url = new URL(origin);
  const headers = new HostFields();
  headers.append("accept", new TextEncoder().encode("application/json"));
  const outgoing = new http.types.OutgoingRequest(headers);
  outgoing.setScheme({ tag: url.protocol === "https:" ? "HTTPS" : "HTTP" });
  outgoing.setAuthority(url.host);
  outgoing.setPathWithQuery(path);
  const body = outgoing.body();
  return { outgoing, headers, finish: () => http.types.OutgoingBody.finish(body) };
}

function send(handler, origin) {
  const { outgoing, headers, finish } = request(origin);
  const future = handler.handle(outgoing, undefined);
  finish();
  future.subscribe().block();
  const response = future.get();
  return { status: response.val.val.status(), headers };
}

const policyFor = (allowedOrigin) => () => ({ allowedOrigin, secret: { header: "X-Api-Key", value: KEY }, rateLimit: undefined });

test("a request to another origin is denied with HTTP-request-denied and never sent", async () => {
  const handler = createOutgoingHandler(policyFor(allowed.url), new Pacer(createPacerBuffer()));
  const { outgoing } = request(other.url);
  assert.throws(() => handler.handle(outgoing, undefined), (error) => error?.tag === "HTTP-request-denied");
  const noPolicy = createOutgoingHandler(() => ({ allowedOrigin: undefined, secret: undefined, rateLimit: undefined }), new Pacer(createPacerBuffer()));
  assert.throws(() => noPolicy.handle(request(allowed.url).outgoing, undefined), (error) => error?.tag === "HTTP-request-denied");
  await other.flush();
  assert.equal(other.seen.length, 0, "the other server saw nothing");
});

test("the key goes only to the allowed origin, and the component never sees it", async () => {
  const handler = createOutgoingHandler(policyFor(allowed.url), new Pacer(createPacerBuffer()));
  const { status, headers } = send(handler, allowed.url);
  assert.equal(status, 404);
  await allowed.flush();
  const seen = allowed.seen.at(-1);
  assert.equal(seen.headers["x-api-key"], KEY);
  const visible = headers.entries().map(([name, value]) => [name, new TextDecoder().decode(value)]);
  assert.deepEqual(visible, [["accept", "application/json"]], "fields.entries() as the component sees them hold no key");
  await other.flush();
  assert.equal(other.seen.length, 0);
});

test("a header of the secret's name set by the component is replaced, not sent twice", async () => {
  const handler = createOutgoingHandler(policyFor(allowed.url), new Pacer(createPacerBuffer()));
  const { outgoing, headers, finish } = (() => {
    const url = new URL(allowed.url);
    const fields = new HostFields();
    fields.append("X-Api-Key", new TextEncoder().encode("guessed"));
    const req = new http.types.OutgoingRequest(fields);
    req.setScheme({ tag: "HTTP" });
    req.setAuthority(url.host);
    req.setPathWithQuery("/v1/x");
    const body = req.body();
    return { outgoing: req, headers: fields, finish: () => http.types.OutgoingBody.finish(body) };
  })();
  const future = handler.handle(outgoing, undefined);
  finish();
  future.subscribe().block();
  await allowed.flush();
  assert.equal(allowed.seen.at(-1).headers["x-api-key"], KEY);
  assert.equal(headers.get("x-api-key").length, 1);
});

/** Runs `perThread` starts on each of `threads` worker threads sharing one pacer buffer; returns every start (epoch ms), sorted. */
async function startsAcrossThreads(buffer, threads, perThread, limit) {
  const source = `
    const { workerData, parentPort } = require("node:worker_threads");
    import(workerData.pacerUrl).then(({ Pacer }) => {
      const pacer = new Pacer(workerData.buffer);
      const starts = [];
      for (let i = 0; i < workerData.perThread; i++) starts.push(Number(pacer.waitForTurn("http://127.0.0.1:1", workerData.limit)) / 1000);
      parentPort.postMessage(starts);
    });`;
  const pacerUrl = new URL("../dist/pacer.js", import.meta.url).href;
  const runs = await Promise.all(
    Array.from(
      { length: threads },
      () =>
        new Promise((resolve, reject) => {
          const worker = new Worker(source, { eval: true, workerData: { buffer, pacerUrl, perThread, limit } });
          worker.once("message", resolve);
          worker.once("error", reject);
        }),
    ),
  );
  return runs.flat().sort((a, b) => a - b);
}

/** The most starts inside any window of `windowMs` (each start opens one). */
function mostInAnyWindow(starts, windowMs) {
  let most = 0;
  for (let i = 0; i < starts.length; i++) most = Math.max(most, starts.filter((s) => s >= starts[i] && s < starts[i] + windowMs).length);
  return most;
}

/**
 * Pins issue 18: the budget is one sliding window for every thread (the old
 * pacer was a fixed gap); 12 starts at 3 per 500 ms never put more than 3 in
 * any window, counted with the margin the pacer adds.
 */
test("the pacer never lets more than the limit start in any window, across threads (one shared budget)", async () => {
  const limit = { requests: 3, windowMs: 500, perSecond: undefined };
  const buffer = createPacerBuffer();
  const starts = await startsAcrossThreads(buffer, 3, 4, limit);
  assert.equal(starts.length, 12);
  assert.ok(pacerWaits(buffer) > 0, "starts beyond the budget waited");
  assert.equal(windowMargin(500), 25, "1% of the window, at least 25 ms");
  assert.equal(mostInAnyWindow(starts, 500 + windowMargin(500)), 3);
});

test("the pacer also holds the per-second cap", async () => {
  const limit = { requests: 100, windowMs: 60_000, perSecond: 2 };
  const starts = await startsAcrossThreads(createPacerBuffer(), 2, 3, limit);
  assert.equal(mostInAnyWindow(starts, 1000 + windowMargin(1000)), 2);
});

/**
 * Pins issue 18: a burst the budget allows starts at once (the old pacer
 * spaced every start): 10 starts of a 10 per minute budget are all inside
 * one window, which they could not be had any of them waited for one.
 */
test("a burst within the budget does not wait; no limit records nothing", async () => {
  const buffer = createPacerBuffer();
  const pacer = new Pacer(buffer);
  for (let i = 0; i < 100; i++) pacer.waitForTurn("http://127.0.0.1:1", undefined);
  const limit = { requests: 10, windowMs: 60_000, perSecond: undefined };
  const starts = await startsAcrossThreads(buffer, 2, 5, limit);
  assert.equal(starts.length, 10);
  assert.equal(pacerWaits(buffer), 0, "no start waited for the budget");
  assert.ok(starts.at(-1) - starts[0] < 60_000, "all starts are inside one window");
});

/**
 * Pins issue 18's FIFO rule: with the budget spent, the thread that queued
 * first starts first (each thread is started only after the previous one
 * has taken its turn number).
 */
test("waiters start in the order they queued", async () => {
  const buffer = createPacerBuffer();
  const origin = "http://127.0.0.1:1";
  const limit = { requests: 1, windowMs: 300, perSecond: undefined };
  new Pacer(buffer).waitForTurn(origin, limit);
  const source = `
    const { workerData, parentPort } = require("node:worker_threads");
    import(workerData.pacerUrl).then(({ Pacer }) => {
      parentPort.postMessage(Number(new Pacer(workerData.buffer).waitForTurn(workerData.origin, workerData.limit)));
    });`;
  const pacerUrl = new URL("../dist/pacer.js", import.meta.url).href;
  const starts = [];
  for (let i = 0; i < 3; i++) {
    const taken = pacerQueue(buffer, origin).taken;
    const worker = new Worker(source, { eval: true, workerData: { buffer, pacerUrl, origin, limit } });
    starts.push(new Promise((resolve, reject) => (worker.once("message", resolve), worker.once("error", reject))));
    while (pacerQueue(buffer, origin).taken === taken) await delay(5);
  }
  const granted = await Promise.all(starts);
  assert.deepEqual([...granted].sort((a, b) => a - b), granted, "granted in queue order");
  assert.deepEqual(pacerQueue(buffer, origin), { taken: 4, served: 4 });
});
