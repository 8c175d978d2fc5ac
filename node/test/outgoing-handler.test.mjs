// The host's wasi:http outgoing-handler: exactly one origin, the key only
// there, never visible to the component; the declared rate limit spent as
// one sliding-window budget per machine (every thread and process that opens
// the same ledger file), cleanup first, waiters that give up leaving the queue.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Worker } from "node:worker_threads";
import { http } from "@bytecodealliance/preview2-shim";
import { createOutgoingHandler, HostFields } from "../dist/outgoing-handler.js";
import { spawn } from "node:child_process";
import { createPacerBuffer, Pacer, pacerQueue, pacerWaits } from "../dist/pacer.js";
import { parseRateLimit, windowMargin, waitFor } from "../dist/rate-ledger.js";
import { setTimeout as delay } from "node:timers/promises";
import { startRecordingServer } from "./support/backend.mjs";
import { freshLedgerPath } from "./support/plugin.mjs";

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

const newPacer = () => new Pacer(createPacerBuffer(), freshLedgerPath());
const policyFor = (allowedOrigin, secrets = [{ header: "X-Api-Key", value: KEY }]) => () => ({ allowedOrigin, secrets, rateLimit: undefined });

test("a request to another origin is denied with HTTP-request-denied and never sent", async () => {
  const handler = createOutgoingHandler(policyFor(allowed.url), newPacer());
  const { outgoing } = request(other.url);
  assert.throws(() => handler.handle(outgoing, undefined), (error) => error?.tag === "HTTP-request-denied");
  const noPolicy = createOutgoingHandler(() => ({ allowedOrigin: undefined, secrets: [], rateLimit: undefined }), newPacer());
  assert.throws(() => noPolicy.handle(request(allowed.url).outgoing, undefined), (error) => error?.tag === "HTTP-request-denied");
  await other.flush();
  assert.equal(other.seen.length, 0, "the other server saw nothing");
});

test("the key goes only to the allowed origin, and the component never sees it", async () => {
  const handler = createOutgoingHandler(policyFor(allowed.url), newPacer());
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
  const handler = createOutgoingHandler(policyFor(allowed.url), newPacer());
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

test("two secrets for one origin go out in their own headers, both invisible to the component", async () => {
  const ORG = "canary-org-for-handler-test";
  const handler = createOutgoingHandler(policyFor(allowed.url, [{ header: "X-Api-Key", value: KEY }, { header: "X-Org-Id", value: ORG }]), newPacer());
  const { status, headers } = send(handler, allowed.url);
  assert.equal(status, 404);
  await allowed.flush();
  const seen = allowed.seen.at(-1);
  assert.equal(seen.headers["x-api-key"], KEY);
  assert.equal(seen.headers["x-org-id"], ORG);
  const visible = headers.entries().map(([name, value]) => [name, new TextDecoder().decode(value)]);
  assert.deepEqual(visible, [["accept", "application/json"]], "fields.entries() as the component sees them hold neither secret");
});

const ORIGIN = "http://127.0.0.1:1";
const pacerUrl = new URL("../dist/pacer.js", import.meta.url).href;

/**
 * Source of a thread or process that takes `count` turns of one budget
 * (`workerData` or argv JSON: buffer (threads only), ledger, origin, limit,
 * priority, count, deadlineMs) and reports the epoch ms of each grant.
 */
const TAKER = `
  const { workerData, parentPort } = require("node:worker_threads");
  const data = workerData ?? JSON.parse(process.argv[1]);
  import(data.pacerUrl).then(({ Pacer, createPacerBuffer }) => {
    const pacer = new Pacer(data.buffer ?? createPacerBuffer(), data.ledger);
    const grants = [];
    for (let i = 0; i < data.count; i++) {
      const cancelFlag = data.cancel ? new Int32Array(data.cancel) : undefined;
      const cancelled = cancelFlag ? () => Atomics.load(cancelFlag, 0) === 1 : undefined;
      const grant = pacer.acquire(data.origin, data.limit, data.priority ?? "work", { deadlineMs: data.deadlineMs ?? Infinity, cancelled });
      grants.push(grant ? Date.now() : null);
      grant?.settle();
    }
    if (parentPort) parentPort.postMessage(grants);
    else process.stdout.write(JSON.stringify(grants));
  });`;

function takeInThread(data) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(TAKER, { eval: true, workerData: { pacerUrl, origin: ORIGIN, ...data } });
    worker.once("message", resolve);
    worker.once("error", reject);
  });
}

function takeInProcess(data) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["-e", TAKER, JSON.stringify({ pacerUrl, origin: ORIGIN, ...data })], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (chunk) => (out += chunk));
    child.once("exit", (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`taker exited with ${code}`))));
  });
}

/** The most starts inside any window of `windowMs` (each start opens one). */
function mostInAnyWindow(starts, windowMs) {
  let most = 0;
  for (let i = 0; i < starts.length; i++) most = Math.max(most, starts.filter((s) => s >= starts[i] && s < starts[i] + windowMs).length);
  return most;
}

test("the decision rule: a start waits only when the window is full, a 429 pause holds every start, the per-second cap binds", () => {
  const limit = { requests: 10, windowMs: 1000 };
  const counted = 1000 + windowMargin(1000);
  assert.equal(windowMargin(1000), 25, "1% of the window, at least 25 ms");
  assert.equal(waitFor(Array.from({ length: 9 }, (_, i) => 1000 + i), 0, limit, counted, 1010), undefined);
  const full = Array.from({ length: 10 }, (_, i) => 1000 + i);
  assert.equal(waitFor(full, 0, limit, counted, 1500), 525, "until the oldest start leaves the counted window");
  assert.equal(waitFor(full, 0, limit, counted, 2025), undefined);
  assert.equal(waitFor([], 5000, limit, counted, 4000), 1000, "a 429 pause holds even an empty window");
  const capped = { requests: 100, windowMs: 60_000, perSecond: 2 };
  assert.equal(waitFor([1000], 0, capped, 60_600, 1100), undefined);
  assert.equal(waitFor([1000, 1050], 0, capped, 60_600, 1100), 925);
});

test("an operator's limit parses like the sandbox CLI's --rate-limit; bad ones are clear errors naming the setting", () => {
  assert.deepEqual(parseRateLimit("300/60000"), { requests: 300, windowMs: 60_000, perSecond: undefined });
  assert.deepEqual(parseRateLimit("20/2000/5"), { requests: 20, windowMs: 2000, perSecond: 5 });
  for (const bad of ["", "300", "0/100", "x/100", "1/2/3/4", "-1/5", "1.5/100"]) {
    assert.throws(() => parseRateLimit(bad), (error) => /invalid PAPERCLIP_WASM_RATE_LIMIT/.test(error.message), bad);
  }
});

/**
 * Pins issue 18: the budget is one sliding window for every thread (the old
 * pacer was a fixed gap); 12 starts at 3 per 500 ms never put more than 3 in
 * any window, counted with the margin the budget adds.
 */
test("the budget never lets more than the limit start in any window, across threads", async () => {
  const limit = { requests: 3, windowMs: 500 };
  const buffer = createPacerBuffer();
  const ledger = freshLedgerPath();
  const starts = (await Promise.all([1, 2, 3].map(() => takeInThread({ buffer, ledger, limit, count: 4 })))).flat().sort((a, b) => a - b);
  assert.equal(starts.length, 12);
  assert.ok(pacerWaits(buffer) > 0, "starts beyond the budget waited");
  assert.equal(mostInAnyWindow(starts, 500), 3);
});

/**
 * Pins issue 18 (one budget per origin per machine): two processes that
 * open the same ledger file share one budget. Before, each process had its
 * own pacer and both spent the whole limit, 12 starts at once here.
 */
test("two processes opening the same ledger share one budget", async () => {
  const limit = { requests: 3, windowMs: 500 };
  const ledger = freshLedgerPath();
  const runs = await Promise.all([takeInProcess({ ledger, limit, count: 6 }), takeInProcess({ ledger, limit, count: 6 })]);
  const starts = runs.flat().sort((a, b) => a - b);
  assert.equal(starts.length, 12);
  assert.equal(mostInAnyWindow(starts, 500), 3, "never more than 3 starts of both processes in any window");
});

test("the budget also holds the per-second cap", async () => {
  const limit = { requests: 100, windowMs: 60_000, perSecond: 2 };
  const buffer = createPacerBuffer();
  const ledger = freshLedgerPath();
  const starts = (await Promise.all([1, 2].map(() => takeInThread({ buffer, ledger, limit, count: 3 })))).flat().sort((a, b) => a - b);
  assert.equal(mostInAnyWindow(starts, 1000), 2);
});

/**
 * Pins issue 18: a burst the budget allows starts at once (the old pacer
 * spaced every start): 10 starts of a 10 per minute budget never wait.
 */
test("a burst within the budget does not wait; no limit records nothing", async () => {
  const buffer = createPacerBuffer();
  const ledger = freshLedgerPath();
  const pacer = new Pacer(buffer, ledger);
  for (let i = 0; i < 100; i++) pacer.acquire(ORIGIN, undefined, "work", { deadlineMs: Infinity }).settle();
  const limit = { requests: 10, windowMs: 60_000 };
  const starts = (await Promise.all([1, 2].map(() => takeInThread({ buffer, ledger, limit, count: 5 })))).flat();
  assert.equal(starts.length, 10);
  assert.equal(pacerWaits(buffer), 0, "no start waited for the budget");
  assert.equal(pacer.ledger().recorded(ORIGIN).length, 10, "only the limited starts are in the ledger");
});

/**
 * Starts a thread that queues for a turn and resolves once it holds its
 * ticket, with `{ grants }`: the promise of its grant times (wrapped, so
 * that awaiting the queueing does not await the grant).
 */
async function queueThread(buffer, data, lane = data.priority ?? "work") {
  const taken = pacerQueue(buffer, ORIGIN, lane).taken;
  const grants = takeInThread({ buffer, count: 1, ...data });
  while (pacerQueue(buffer, ORIGIN, lane).taken === taken) await delay(5);
  return { grants };
}

/**
 * Pins issue 18's FIFO rule: with the budget spent, the thread that queued
 * first starts first (each thread is started only after the previous one
 * has taken its turn number).
 */
test("waiters start in the order they queued", async () => {
  const buffer = createPacerBuffer();
  const ledger = freshLedgerPath();
  const limit = { requests: 1, windowMs: 300 };
  new Pacer(buffer, ledger).acquire(ORIGIN, limit, "work", { deadlineMs: Infinity }).settle();
  const waiting = [];
  for (let i = 0; i < 3; i++) waiting.push((await queueThread(buffer, { ledger, limit })).grants);
  const granted = (await Promise.all(waiting)).flat();
  assert.deepEqual([...granted].sort((a, b) => a - b), granted, "granted in queue order");
  assert.deepEqual(pacerQueue(buffer, ORIGIN), { taken: 4, served: 4 });
});

/**
 * Pins issue 18: cleanup requests (process and sandbox DELETE) go ahead of
 * new work when the budget is short. The work thread queued first and
 * waits for the spent budget; the cleanup thread queued later starts first.
 */
test("a cleanup request goes ahead of work waiting for the budget", async () => {
  const buffer = createPacerBuffer();
  const ledger = freshLedgerPath();
  // A window long enough that the work is still waiting when the cleanup thread has started.
  const limit = { requests: 1, windowMs: 3000 };
  new Pacer(buffer, ledger).acquire(ORIGIN, limit, "work", { deadlineMs: Infinity }).settle();
  const { grants: work } = await queueThread(buffer, { ledger, limit });
  const { grants: cleanup } = await queueThread(buffer, { ledger, limit, priority: "cleanup" });
  assert.equal(pacerQueue(buffer, ORIGIN).served, 1, "precondition: the work was still waiting when the cleanup queued");
  const [[workAt], [cleanupAt]] = await Promise.all([work, cleanup]);
  assert.ok(cleanupAt < workAt, `cleanup started first (${cleanupAt} vs ${workAt})`);
  assert.deepEqual(pacerQueue(buffer, ORIGIN, "cleanup"), { taken: 1, served: 1 });
});

/**
 * Pins issue 18: a waiter that gives up (its call's deadline) leaves the
 * queue without holding up the ones behind it. Before, a waiter could not
 * leave before its turn.
 */
test("a waiter whose deadline passes leaves the queue and the next one is served", async () => {
  const buffer = createPacerBuffer();
  const ledger = freshLedgerPath();
  const limit = { requests: 1, windowMs: 3000 };
  new Pacer(buffer, ledger).acquire(ORIGIN, limit, "work", { deadlineMs: Infinity }).settle();
  // The window is full for 3 s: the one in the middle gives up first, then
  // the head, while the last one waits.
  const { grants: first } = await queueThread(buffer, { ledger, limit, deadlineMs: Date.now() + 1000 });
  const { grants: middle } = await queueThread(buffer, { ledger, limit, deadlineMs: Date.now() + 500 });
  const { grants: last } = await queueThread(buffer, { ledger, limit });
  assert.deepEqual(await middle, [null], "the waiter in the middle gave up at its deadline");
  assert.deepEqual(await first, [null], "so did the head");
  const [lastAt] = await last;
  assert.equal(typeof lastAt, "number", "the last waiter was served");
  assert.deepEqual(pacerQueue(buffer, ORIGIN), { taken: 4, served: 4 }, "the queue moved past both");
});

/**
 * Pins issue 18: a cancelled waiter leaves the queue without holding others
 * up; a cleanup request is not given up for a cancellation (the cleanup of
 * a cancelled command must still run).
 */
test("a cancelled work waiter leaves the queue; a cleanup waiter stays until served", async () => {
  const buffer = createPacerBuffer();
  const ledger = freshLedgerPath();
  const limit = { requests: 1, windowMs: 2000 };
  new Pacer(buffer, ledger).acquire(ORIGIN, limit, "work", { deadlineMs: Infinity }).settle();
  const cancel = new SharedArrayBuffer(4);
  const { grants: cancelledWork } = await queueThread(buffer, { ledger, limit, cancel });
  const { grants: cleanup } = await queueThread(buffer, { ledger, limit, cancel, priority: "cleanup" });
  const { grants: work } = await queueThread(buffer, { ledger, limit });
  Atomics.store(new Int32Array(cancel), 0, 1);
  assert.deepEqual(await cancelledWork, [null], "the cancelled work request gave up");
  const [cleanupAt] = await cleanup;
  const [workAt] = await work;
  assert.equal(typeof cleanupAt, "number", "the cleanup request was served despite the cancellation");
  assert.ok(workAt > cleanupAt, "then the work queued behind the cancelled one");
  assert.deepEqual(pacerQueue(buffer, ORIGIN), { taken: 3, served: 3 });
});

/**
 * Pins issue 18 (429 is information): a 429 pauses the origin in the
 * ledger, for every process that opens it: a start in another process
 * waits for the pause to end even though its window is empty.
 */
test("a 429 pause recorded by one process holds the starts of another", async () => {
  const ledger = freshLedgerPath();
  const limit = { requests: 100, windowMs: 1000 };
  const pacer = new Pacer(createPacerBuffer(), ledger);
  pacer.throttled(ORIGIN, 400);
  const pausedUntil = pacer.ledger().pausedUntil(ORIGIN);
  const [startedAt] = await takeInProcess({ ledger, limit, count: 1 });
  assert.ok(startedAt >= pausedUntil, `the start (${startedAt}) came after the pause ended (${pausedUntil})`);
  assert.equal(pacer.ledger().recorded(ORIGIN).length, 1);
});
