// Components built for older contracts still run under this host: 0.4.0
// (without `execute-request.result-chars`), 0.3.0 (live output as text;
// 0.4.0 made it bytes) and 0.2.0 (also without
// `provider-error.output-lost`). The fixtures are the Rust host's own
// (`sandbox-host/tests/fixtures/contract-v0-{4,3,2}`), built here with
// cargo for wasm32-wasip2, transpiled with jco like any packed component,
// and called through the provider pool: a 0.4.0 component's live bytes
// reach the sink exactly, and an older one's live text as its UTF-8 bytes
// (what a 0.4.0 component's bytes are), in order.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { ProviderPool } from "../dist/pool.js";
import { LiveText } from "../dist/plugin.js";
import { transpile, contractVersionOf, CONTRACT_VERSION, SERVED_VERSIONS } from "../scripts/packer.mjs";

const root = fileURLToPath(new URL("../..", import.meta.url));
const work = mkdtempSync(path.join(tmpdir(), "contract-versions-"));
after(() => rmSync(work, { recursive: true, force: true }));

/** Builds the Rust host's fixture `name` (as its tests do) and returns its component. */
function fixture(name) {
  const targetDir = path.join(root, "target", "sandbox-host-fixtures");
  const env = { ...process.env };
  delete env.RUSTFLAGS;
  delete env.CARGO_ENCODED_RUSTFLAGS;
  execFileSync(
    process.env.CARGO ?? "cargo",
    ["build", "--release", "--target", "wasm32-wasip2", "--manifest-path", path.join(root, "sandbox-host", "tests", "fixtures", name, "Cargo.toml"), "--target-dir", targetDir],
    { stdio: ["ignore", "ignore", "pipe"], env },
  );
  return path.join(targetDir, "wasm32-wasip2", "release", `${name.replaceAll("-", "_")}.wasm`);
}

const ctx = { driverKey: "old", companyId: "company", environmentId: "env", issueId: undefined, config: "{}" };
const lease = { providerLeaseId: "sb-1", metadata: "{}", expiresAt: undefined };
const request = { command: "echo", args: ["a b"], cwd: undefined, env: [], stdin: undefined, timeoutMs: undefined };
/** The origin the fixtures' config names (they send no request). */
const routes = [{ origin: "https://api.example.test", secrets: [] }];

const utf8 = (text) => Buffer.from(text, "utf8");
for (const [name, version, driver, live] of [
  ["contract-v0-4", "0.4.0", "old-0-4", [["stderr", utf8("live")], ["stdout", utf8("héllo ")], ["stdout", Buffer.from("w\xf6rld\n", "latin1")]]],
  ["contract-v0-3", "0.3.0", "old-0-3", [["stderr", utf8("live")], ["stdout", utf8("héllo ")], ["stdout", utf8("wörld\uFFFD\n")]]],
  ["contract-v0-2", "0.2.0", "old-0-2", [["stderr", utf8("live")]]],
]) {
  test(`a component built for contract ${version} still runs: its live output arrives as bytes, in order`, async () => {
    const wasm = fixture(name);
    assert.equal(await contractVersionOf(readFileSync(wasm), name), version);
    const dir = path.join(work, name);
    await transpile(wasm, dir);
    const pool = new ProviderPool({ size: 1, componentDir: pathToFileURL(dir + path.sep).href, ledgerPath: path.join(work, `${name}.sqlite`) });
    try {
      const description = await pool.call("describe", []).result;
      assert.equal(description.driverKey, driver);
      const chunks = [];
      const result = await pool.call("execute", [ctx, lease, request], { routes, onOutput: (stream, chunk) => chunks.push([stream, chunk]) }).result;
      assert.equal(result.exitCode, 3);
      assert.match(result.stdout, /^echo a b /);
      for (const [, chunk] of chunks) assert.ok(chunk instanceof Uint8Array, "the sink gets bytes");
      assert.deepEqual(
        chunks.map(([stream, chunk]) => [stream, Buffer.from(chunk).toString("hex")]),
        live.map(([stream, bytes]) => [stream, bytes.toString("hex")]),
      );
      if (version === "0.4.0" || version === "0.3.0") {
        // 0.3.0 added output-lost; its partial output crosses as it is.
        await assert.rejects(pool.call("execute", [ctx, lease, { ...request, command: "lose-output" }], { routes }).result, (error) => {
          assert.equal(error.failure?.payload?.tag, "output-lost");
          assert.equal(error.failure.payload.val.partial.stdout, "héllo wörld\uFFFD\n");
          return true;
        });
      }
    } finally {
      await pool.close();
    }
  });
}

// Contract 0.6.0 (the one before 0.7.0, which changed no import) added `provider.interact` and three host
// imports. This host does not call `interact` yet (Paperclip's hooks come
// later) but must load such a component: it provides the imports, and an
// `interact` call sees no event (its pollable never becomes ready, so the
// fixture waits until the call is cancelled) and its terminal's output
// reaches the sink.
test("a component built for contract 0.6.0 runs: interact takes the host's events in order, each once, then its end", async () => {
  const wasm = fixture("contract-v0-6");
  const version = await contractVersionOf(readFileSync(wasm), "contract-v0-6");
  assert.equal(version, "0.6.0");
  assert.equal(CONTRACT_VERSION, "0.7.0");
  assert.ok(SERVED_VERSIONS.includes("0.6.0"), "0.6.0 components are still served");
  assert.ok(SERVED_VERSIONS.includes("0.5.0"), "0.5.0 components are still served");
  const dir = path.join(work, "contract-v0-6");
  await transpile(wasm, dir);
  const pool = new ProviderPool({ size: 1, componentDir: pathToFileURL(dir + path.sep).href, ledgerPath: path.join(work, "contract-v0-6.sqlite") });
  try {
    const description = await pool.call("describe", []).result;
    assert.equal(description.driverKey, "interactive-0-6");
    const chunks = [];
    const text = () => chunks.map(([, chunk]) => chunk).join("");
    const until = async (wanted) => {
      for (let i = 0; i < 1000 && !text().includes(wanted); i++) await new Promise((resolve) => setTimeout(resolve, 10));
      assert.ok(text().includes(wanted), `${JSON.stringify(wanted)} in ${JSON.stringify(text())}`);
    };
    const interaction = (terminal) => ({ command: "sh", args: [], cwd: undefined, env: [], terminal, timeoutMs: undefined, resultChars: undefined });
    // The fixture names no API origin (it sends no request); it echoes what it takes.
    const onOutput = (stream, chunk) => chunks.push([stream, Buffer.from(chunk).toString()]);
    const terminal = pool.interact([ctx, lease, interaction({ columns: 80, rows: 24 })], { routes, onOutput });
    await terminal.started;
    await until("size 80x24\n");
    // Events sent one by one with pauses: between them the fixture waits on `host.interaction-events`.
    assert.equal(await terminal.send({ tag: "input", val: new TextEncoder().encode("hé") }), true);
    await until("hé");
    await new Promise((resolve) => setTimeout(resolve, 100));
    await terminal.send({ tag: "resize", val: { columns: 100, rows: 20 } });
    await until("resize 100x20\n");
    await terminal.send({ tag: "end" });
    const ended = await terminal.result;
    assert.equal(ended.signal, "SIGTERM");
    assert.ok(chunks.every(([stream]) => stream === "terminal"), "a terminal's output is its own stream");
    assert.equal(await terminal.send({ tag: "input", val: new Uint8Array([1]) }), false, "nothing reaches an ended call");

    chunks.length = 0;
    const pipes = pool.interact([ctx, lease, interaction(undefined)], { routes, onOutput });
    await pipes.started;
    await pipes.send({ tag: "input", val: new TextEncoder().encode("piped") });
    await pipes.send({ tag: "close-input" });
    const closed = await pipes.result;
    assert.equal(closed.exitCode, 0);
    assert.deepEqual(chunks, [["stdout", "piped"]]);

    // Cancellation still reaches an interactive call.
    const cancelled = pool.interact([ctx, lease, interaction({ columns: 80, rows: 24 })], { routes, onOutput });
    await cancelled.started;
    cancelled.cancel();
    await assert.rejects(cancelled.result, (error) => {
      assert.equal(error.failure?.payload?.tag, "cancelled");
      return true;
    });
  } finally {
    await pool.close();
  }
});

/** The decoder the plugin logs with: any cut of any bytes gives what decoding them whole gives. */
test("LiveText decodes each stream across chunks like a decoding of the whole stream", () => {
  const utf8 = (text) => Buffer.from(text, "utf8");
  const pieces = [utf8("ab"), utf8("é"), utf8("€"), utf8("🦀"), Buffer.from([0x80]), Buffer.from([0xff]), Buffer.from([0xe2, 0x82]), Buffer.from([0xf0, 0x9f])];
  let seed = 0x2545f491;
  const next = (n) => {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return (seed >>> 0) % n;
  };
  for (let round = 0; round < 500; round++) {
    const streams = { stdout: [], stderr: [] };
    for (let i = next(30); i > 0; i--) streams[next(2) ? "stdout" : "stderr"].push(pieces[next(pieces.length)]);
    const whole = { stdout: Buffer.concat(streams.stdout), stderr: Buffer.concat(streams.stderr) };
    const text = new LiveText();
    const got = { stdout: "", stderr: "" };
    const rest = { stdout: whole.stdout, stderr: whole.stderr };
    while (rest.stdout.length || rest.stderr.length) {
      const stream = rest.stdout.length && (!rest.stderr.length || next(2)) ? "stdout" : "stderr";
      const cut = 1 + next(Math.min(rest[stream].length, 5));
      got[stream] += text.push(stream, new Uint8Array(rest[stream].subarray(0, cut)));
      rest[stream] = rest[stream].subarray(cut);
    }
    for (const [stream, tail] of text.finish()) got[stream] += tail;
    for (const stream of ["stdout", "stderr"]) assert.equal(got[stream], new TextDecoder().decode(whole[stream]), `${stream} of round ${round}`);
  }
});
