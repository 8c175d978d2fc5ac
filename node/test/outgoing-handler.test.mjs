// The host's wasi:http outgoing-handler: exactly one origin, the key only
// there, never visible to the component; the declared spacing shared by all
// threads.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Worker } from "node:worker_threads";
import { http } from "@bytecodealliance/preview2-shim";
import { createOutgoingHandler, HostFields } from "../dist/outgoing-handler.js";
import { createPacerBuffer, Pacer } from "../dist/pacer.js";
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

const policyFor = (allowedOrigin) => () => ({ allowedOrigin, secret: { header: "X-Api-Key", value: KEY }, spacingMs: 0 });

test("a request to another origin is denied with HTTP-request-denied and never sent", async () => {
  const handler = createOutgoingHandler(policyFor(allowed.url), new Pacer(createPacerBuffer()));
  const { outgoing } = request(other.url);
  assert.throws(() => handler.handle(outgoing, undefined), (error) => error?.tag === "HTTP-request-denied");
  const noPolicy = createOutgoingHandler(() => ({ allowedOrigin: undefined, secret: undefined, spacingMs: 0 }), new Pacer(createPacerBuffer()));
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

test("the pacer spaces the starts it grants to one origin across threads (one shared budget)", async () => {
  const buffer = createPacerBuffer();
  const source = `
    const { workerData, parentPort } = require("node:worker_threads");
    import(workerData.pacerUrl).then(({ Pacer }) => {
      const pacer = new Pacer(workerData.buffer);
      const starts = [];
      for (let i = 0; i < 3; i++) starts.push(Number(pacer.waitForTurn("http://127.0.0.1:1", 100)) / 1000);
      parentPort.postMessage(starts);
    });`;
  const pacerUrl = new URL("../dist/pacer.js", import.meta.url).href;
  const runs = await Promise.all(
    [0, 1, 2].map(
      () =>
        new Promise((resolve, reject) => {
          const worker = new Worker(source, { eval: true, workerData: { buffer, pacerUrl } });
          worker.once("message", resolve);
          worker.once("error", reject);
        }),
    ),
  );
  const starts = runs.flat().sort((a, b) => a - b);
  assert.equal(starts.length, 9);
  for (let i = 1; i < starts.length; i++) {
    assert.ok(starts[i] - starts[i - 1] >= 100, `gap ${i} is ${starts[i] - starts[i - 1]} ms, at least the 100 ms spacing`);
  }
});
