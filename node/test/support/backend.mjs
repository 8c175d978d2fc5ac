// Starts the real createos-local backend (random port, random key) and a
// second local HTTP server that records every request it gets (it must never
// see the key).
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const defaultBinary = fileURLToPath(new URL("../../../target/debug/createos-local", import.meta.url));

/** The createos-local binary (`cargo build -p sandbox-engine`). */
export function backendBinary() {
  const binary = process.env.CREATEOS_LOCAL_BIN ?? defaultBinary;
  if (!existsSync(binary)) {
    throw new Error(`createos-local is missing at ${binary}: run \`cargo build -p sandbox-engine\` at the repository root (or set CREATEOS_LOCAL_BIN).`);
  }
  return binary;
}

/**
 * A running createos-local with its key and admin helpers. `rateLimit`
 * (`"REQUESTS/WINDOW_MS"`) makes it answer 429 (with `Retry-After`) to a
 * `/v1` request beyond that many in any sliding window; `info()` gives its
 * counters (`rate_limit.admitted`, `rate_limit.refused`).
 */
export async function startBackend({ rateLimit, toolbox = false, extraArgs = [] } = {}) {
  const key = `test-key-${randomBytes(12).toString("hex")}`;
  const args = ["--port", "0", "--api-key", key, ...(rateLimit ? ["--rate-limit", rateLimit] : []), ...(toolbox ? ["--toolbox-port", "0"] : []), ...extraArgs];
  const child = spawn(backendBinary(), args, { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const lines = createInterface({ input: child.stdout });
  // The first stdout line names the server; with `toolbox`, a second one the
  // Daytona toolbox's loopback origin. Both are read by one listener (readline
  // may emit them in one go).
  const [url, toolboxUrl] = await new Promise((resolve, reject) => {
    const wanted = toolbox ? 2 : 1;
    const seen = [];
    const onLine = (line) => {
      const match = seen.length === 0 ? /listening on (http:\/\/\S+)/.exec(line) : /toolbox on (http:\/\/\S+)/.exec(line);
      if (!match) {
        lines.off("line", onLine);
        reject(new Error(`unexpected createos-local output: ${line}`));
        return;
      }
      seen.push(seen.length === 0 ? match[1] : `${match[1]}/toolbox`);
      if (seen.length === wanted) {
        lines.off("line", onLine);
        resolve([seen[0], seen[1]]);
      }
    };
    lines.on("line", onLine);
    child.once("exit", (code) => reject(new Error(`createos-local exited with ${code}: ${stderr}`)));
  });
  const admin = async (method, path, body) => {
    const response = await fetch(`${url}${path}`, {
      method,
      headers: { "X-Api-Key": key, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await response.text();
    if (!response.ok) throw new Error(`${method} ${path}: HTTP ${response.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
  return {
    url,
    key,
    /** The Daytona face: its API base URL and (with `toolbox`) its toolbox URL. */
    daytonaApiUrl: `${url}/daytona/api`,
    toolboxUrl,
    admin,
    addFault: (rule) => admin("POST", "/_admin/faults", rule),
    clearFaults: () => admin("DELETE", "/_admin/faults"),
    requests: async () => {
      const answer = await admin("GET", "/_admin/requests");
      const list = answer?.data?.requests ?? answer?.requests ?? answer?.data ?? answer;
      if (!Array.isArray(list)) throw new Error(`unexpected /_admin/requests answer: ${JSON.stringify(answer).slice(0, 200)}`);
      return list;
    },
    clearRequests: () => admin("DELETE", "/_admin/requests"),
    info: async () => {
      const answer = await admin("GET", "/_admin/info");
      return answer?.data ?? answer;
    },
    async stop() {
      if (child.exitCode !== null) return { code: child.exitCode, stderr };
      const exited = new Promise((resolve) => child.once("exit", (code) => resolve(code)));
      child.kill("SIGTERM");
      const code = await exited;
      return { code, stderr };
    },
  };
}

/**
 * A second server, in its own process (so a test thread that blocks on a
 * WASI poll cannot stall it), that records each request (method, url,
 * headers) and answers 404 (with `answerHeaders`). `flush()` waits until every earlier request is
 * in `seen`.
 */
export async function startRecordingServer({ answerHeaders = {} } = {}) {
  const source = `
    const http = require("node:http");
    const extra = ${JSON.stringify(JSON.stringify(answerHeaders))};
    const server = http.createServer((request, response) => {
      process.stdout.write(JSON.stringify({ method: request.method, url: request.url, headers: request.headers }) + "\\n");
      request.resume();
      response.writeHead(404, { "content-type": "application/json", ...JSON.parse(extra) });
      response.end('{"error":"not here"}');
    });
    server.listen(0, "127.0.0.1", () => process.stdout.write("listening http://127.0.0.1:" + server.address().port + "\\n"));
  `;
  const child = spawn(process.execPath, ["-e", source], { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout });
  const seen = [];
  let flushWaiters = [];
  const url = await new Promise((resolve) => {
    lines.on("line", (line) => {
      if (line.startsWith("listening ")) return resolve(line.slice("listening ".length));
      const record = JSON.parse(line);
      if (record.url.startsWith("/__flush/")) {
        const token = record.url.slice("/__flush/".length);
        flushWaiters = flushWaiters.filter(([t, done]) => (t === token ? (done(), false) : true));
        return;
      }
      seen.push(record);
    });
  });
  return {
    url,
    seen,
    async flush() {
      const token = randomBytes(6).toString("hex");
      const arrived = new Promise((resolve) => flushWaiters.push([token, resolve]));
      await fetch(`${url}/__flush/${token}`).then((r) => r.text());
      await arrived;
    },
    stop: () => new Promise((resolve) => (child.once("exit", resolve), child.kill("SIGTERM"))),
  };
}

/**
 * A forwarding proxy in front of `target`, in its own process (so the test's
 * event loop cannot delay its clock), that records when each request arrived
 * (and whether it carried `X-Api-Key`), to observe the request spacing from
 * outside the plugin. Arrival times are epoch milliseconds.
 */
export async function startTimingProxy(target) {
  const source = `
    const http = require("node:http");
    const upstream = new URL(process.argv[1]);
    const server = http.createServer((request, response) => {
      const at = performance.timeOrigin + performance.now();
      process.stdout.write(JSON.stringify({ at, method: request.method, path: request.url, key: request.headers["x-api-key"] }) + "\\n");
      const forward = http.request({ host: upstream.hostname, port: upstream.port, method: request.method, path: request.url, headers: { ...request.headers, host: upstream.host } }, (answer) => {
        response.writeHead(answer.statusCode, answer.headers);
        answer.pipe(response);
      });
      forward.on("error", () => response.destroy());
      request.pipe(forward);
    });
    server.listen(0, "127.0.0.1", () => process.stdout.write("listening http://127.0.0.1:" + server.address().port + "\\n"));
  `;
  const child = spawn(process.execPath, ["-e", source, target], { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout });
  const arrivals = [];
  const url = await new Promise((resolve) => {
    lines.on("line", (line) => {
      if (line.startsWith("listening ")) return resolve(line.slice("listening ".length));
      arrivals.push(JSON.parse(line));
    });
  });
  return { url, arrivals, stop: () => new Promise((resolve) => (child.once("exit", resolve), child.kill("SIGTERM"))) };
}

/** Processes on this machine whose command line contains `token`. */
export async function processesWith(token) {
  const { readdir, readFile } = await import("node:fs/promises");
  const found = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmdline = (await readFile(`/proc/${entry}/cmdline`, "utf8")).split("\0").join(" ");
      if (cmdline.includes(token)) found.push({ pid: Number(entry), cmdline });
    } catch {
      // The process ended while scanning.
    }
  }
  return found;
}
