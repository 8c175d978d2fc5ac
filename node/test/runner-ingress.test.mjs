// Issue 43 item 4: `onEnvironmentRunnerIngressEndpoint` opens the runner's
// port through the component's `open-port` (capability `ports`) and hands
// it to Paperclip as an authenticated WebSocket. Against the real
// createos-local with `--ingress`: a WebSocket server in the sandbox on the
// runner's port answers a real WebSocket client at the returned URL with
// the returned headers, and refuses one without them. The engine serves
// ports over plain http on loopback, so the URL is `ws://127.0.0.1:…`:
// Paperclip 2026.916.1's server wants `wss:` (environment-runtime.js),
// and we never pretend otherwise.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { startBackend } from "./support/backend.mjs";
import { startPlugin, base } from "./support/plugin.mjs";
import { toRunnerIngress, runnerPath } from "../dist/runner-ingress.js";
import manifest from "../dist/manifest.js";

const RUNNER_PORT = 43127;
let backend;
let plugin;

before(async () => {
  backend = await startBackend({ extraArgs: ["--ingress"] });
  plugin = await startPlugin();
});

after(async () => {
  await plugin?.stop();
  const stopped = await backend?.stop();
  assert.match(stopped.stderr, /none survived/);
});

const params = (overrides = {}) => base(backend, overrides);

/** A WebSocket server for the sandbox (python3's standard library: the sandbox has no node): it greets each connection with the path it was asked for. */
const SERVER = `
import base64, hashlib, socketserver, sys
class Runner(socketserver.StreamRequestHandler):
    def handle(self):
        request = self.rfile.readline().decode().split()
        headers = {}
        while True:
            line = self.rfile.readline().decode().strip()
            if not line: break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        key = headers.get("sec-websocket-key", "")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.wfile.write(("HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: " + accept + "\\r\\n\\r\\n").encode())
        text = ("runner saw " + request[1]).encode()
        self.wfile.write(bytes([0x81, len(text)]) + text)
        self.wfile.flush()
        self.rfile.read(2)
socketserver.TCPServer.allow_reuse_address = True
server = socketserver.ThreadingTCPServer(("127.0.0.1", ${RUNNER_PORT}), Runner)
print("up", flush=True)
server.serve_forever()
`;

test("the manifest declares runnerWebSocketIngress, since the component declares ports", () => {
  assert.equal(manifest.environmentDrivers[0].sandboxCapabilities.runnerWebSocketIngress, true);
  assert.equal(typeof plugin.hooks.onEnvironmentRunnerIngressEndpoint, "function");
});

test("the runner's port is opened as an authenticated WebSocket that reaches the sandbox's port", async () => {
  const config = { ingress: true };
  const lease = await plugin.harness.acquireLease({ ...params({ config }), runId: `run-${randomUUID()}` });
  let running;
  try {
    // The runner stand-in runs as the lease's command while the test talks to it (a command's background children end with it).
    plugin.logs.length = 0;
    running = plugin.harness.execute({ ...params({ config }), lease, command: "python3", args: ["-c", SERVER], timeoutMs: 120_000 }).catch((error) => error);
    for (let i = 0; i < 200 && !plugin.logs.some((l) => l.chunk.includes("up")); i++) await new Promise((r) => setTimeout(r, 25));
    assert.ok(plugin.logs.some((l) => l.chunk.includes("up")), "the server in the sandbox is listening");
    const path = `/api/runner/v1/connect/run-${randomUUID()}`;
    const endpoint = await plugin.hooks.onEnvironmentRunnerIngressEndpoint({ ...params({ config }), lease, port: RUNNER_PORT, path });
    assert.equal(endpoint.kind, "authenticated_websocket");
    // Plainly: the engine's port listener is http on loopback, so ws (not wss).
    assert.match(endpoint.websocketUrl, /^ws:\/\/127\.0\.0\.1:\d+\/api\/runner\/v1\/connect\/run-/);
    assert.equal(new URL(endpoint.websocketUrl).pathname, path);
    assert.deepEqual(endpoint.secretHeaders.map((h) => h.name.toLowerCase()), ["x-sandbox-preview-token"]);
    assert.match(endpoint.generation, /^[0-9a-f]{32}$/);
    assert.equal(JSON.stringify(endpoint).includes(backend.key), false, "the API key is not among the secret headers");

    const headers = Object.fromEntries(endpoint.secretHeaders.map((h) => [h.name, h.value]));
    const greeting = await new Promise((resolve, reject) => {
      const socket = new WebSocket(endpoint.websocketUrl, { headers });
      socket.onmessage = (event) => (resolve(String(event.data)), socket.close());
      socket.onerror = (event) => reject(new Error(`websocket failed: ${event.message ?? event.type}`));
    });
    assert.equal(greeting, `runner saw ${path}`);
    // Without the secret header nothing reaches the sandbox.
    const refused = await new Promise((resolve) => {
      const socket = new WebSocket(endpoint.websocketUrl);
      socket.onopen = () => (resolve("opened"), socket.close());
      socket.onerror = () => resolve("refused");
    });
    assert.equal(refused, "refused");

    // Asking again gives the same endpoint (the engine answers the same URL and token).
    const again = await plugin.hooks.onEnvironmentRunnerIngressEndpoint({ ...params({ config }), lease, port: RUNNER_PORT, path });
    assert.equal(again.generation, endpoint.generation);
  } finally {
    await plugin.harness.destroyLease({ ...params({ config }), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    // Destroy cancelled the stand-in, its tree proven gone.
    const ended = await running;
    assert.match(String(ended?.message ?? ended?.exitCode), /cancelled|^-?\d+$/);
  }
});

test("bad ports and paths are refused before any request; a config without ingress gets the component's reason", async () => {
  const lease = await plugin.harness.acquireLease({ ...params(), runId: `run-${randomUUID()}` });
  try {
    await backend.clearRequests();
    for (const [port, path] of [[0, "/a"], [70000, "/a"], [1.5, "/a"], [RUNNER_PORT, "a"], [RUNNER_PORT, "/a?b=1"], [RUNNER_PORT, "/a/../b"], [RUNNER_PORT, "//evil.example/a"], [RUNNER_PORT, "/a b"]]) {
      await assert.rejects(plugin.hooks.onEnvironmentRunnerIngressEndpoint({ ...params(), lease, port, path }), (error) => error.kind === "invalid-request" && /nothing was opened/.test(error.message), `${port} ${path}`);
    }
    assert.deepEqual(await backend.requests(), []);
    await assert.rejects(
      plugin.hooks.onEnvironmentRunnerIngressEndpoint({ ...params(), lease, port: RUNNER_PORT, path: "/api/runner/v1/connect/x" }),
      (error) => error.kind === "unsupported" && /ingress/.test(error.message),
    );
  } finally {
    await plugin.harness.destroyLease({ ...params(), providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
  }
});

test("the shape: https becomes wss, http becomes ws, a URL with a path, query or user info is refused, never bent", () => {
  const endpoint = (url) => ({ port: 43127, url, headers: [["X-Token", "t0ken"]] });
  const path = "/api/runner/v1/connect/r1";
  assert.equal(toRunnerIngress(endpoint("https://43127-abc.proxy.example.com"), path, "P").websocketUrl, `wss://43127-abc.proxy.example.com${path}`);
  assert.equal(toRunnerIngress(endpoint("http://127.0.0.1:4000/"), path, "P").websocketUrl, `ws://127.0.0.1:4000${path}`);
  assert.deepEqual(toRunnerIngress(endpoint("https://h.example"), path, "P").secretHeaders, [{ name: "X-Token", value: "t0ken" }]);
  for (const url of ["https://h.example/base", "https://u:p@h.example", "https://h.example/?q=1", "ftp://h.example", "not a url"]) {
    assert.throws(() => toRunnerIngress(endpoint(url), path, "P"), (error) => error.kind === "invalid-response", url);
  }
  assert.notEqual(
    toRunnerIngress({ ...endpoint("https://h.example"), headers: [["X-Token", "other"]] }, path, "P").generation,
    toRunnerIngress(endpoint("https://h.example"), path, "P").generation,
    "a new token is a new generation",
  );
  for (const headers of [[["bad name", "v"]], [["X-Token", ""]]]) {
    assert.throws(() => toRunnerIngress({ ...endpoint("https://h.example"), headers }, path, "P"), (error) => error.kind === "invalid-response");
  }
  assert.equal(runnerPath(path), path);
});
