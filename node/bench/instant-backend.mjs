// The benches' backends for `execute true`:
//
// - `startInstantBackend()`: an instant backend. A loopback proxy in front
//   of createos-local that, once `instant(true)` is called, answers the
//   process API itself at once (`POST .../processes` gives a process id,
//   its `/connect` the exit frame `{"exit_code":0,"type":"exit"}`, its
//   `DELETE` success): no process runs, so what remains of an `execute` is
//   the plugin's own cost and its loopback requests. Everything else (the
//   lease's sandbox, its workspace) goes to createos-local.
// - `startForkBackend()`: createos-local with `--isolation process-group`,
//   so a command is a plain fork/exec of `bash -lc` (no bubblewrap): the
//   cheapest real backend.
import http from "node:http";
import { startBackend } from "../test/support/backend.mjs";

export function startForkBackend() {
  return startBackend({ extraArgs: ["--isolation", "process-group"] });
}

export async function startInstantBackend() {
  const real = await startBackend({ extraArgs: ["--isolation", "process-group"] });
  const upstream = new URL(real.url);
  let instant = false;
  let next = 0;
  let answered = 0;
  const json = (response, status, body) => {
    const text = JSON.stringify(body);
    response.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
    response.end(text);
  };
  const server = http.createServer((request, response) => {
    const path = request.url ?? "/";
    if (instant && request.headers["x-api-key"] === real.key) {
      if (request.method === "POST" && /^\/v1\/sandboxes\/[^/]+\/processes$/.test(path)) {
        request.resume();
        answered++;
        return json(response, 201, { status: "success", data: { process_id: `proc-instant-${++next}`, state: "running", kind: "process" } });
      }
      if (request.method === "GET" && /\/processes\/proc-instant-\d+\/connect/.test(path)) {
        answered++;
        const frame = '{"exit_code":0,"type":"exit"}\n';
        response.writeHead(200, { "content-type": "application/x-ndjson", "content-length": Buffer.byteLength(frame) });
        return response.end(frame);
      }
      if (/\/processes\/proc-instant-\d+/.test(path)) {
        request.resume();
        answered++;
        return json(response, 200, { status: "success", data: { state: "exited", tree_exited: true } });
      }
    }
    const forward = http.request(
      { host: upstream.hostname, port: upstream.port, method: request.method, path, headers: request.headers },
      (answer) => {
        response.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(response);
      },
    );
    forward.on("error", () => response.destroy());
    request.pipe(forward);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    key: real.key,
    /** From now on, answer the process API at once (after the lease exists). */
    instant(on) {
      instant = on;
    },
    /** How many process API requests the proxy answered itself. */
    answered: () => answered,
    async stop() {
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(resolve));
      return real.stop();
    },
  };
}
