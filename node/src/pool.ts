/**
 * The pool of `worker_threads` that run the provider component, as seen
 * from the thread that serves Paperclip's JSON-RPC (which never blocks).
 *
 * Each thread holds one reused component instance and runs one call at a
 * time; calls wait in FIFO order for a free thread. The component's core
 * modules are compiled once per pool (off the main thread, by V8) and
 * shared with every thread; one thread starts with the pool, the others
 * only when calls wait and fewer than `size` threads exist, so a worker's
 * start pays for one instance at most. Every call gets its own
 * cancellation flag, so the plugin can stop a running `execute` (release,
 * destroy, shutdown) through `sandbox:provider/host.cancellation`. A thread
 * whose instance trapped replaces the instance itself; a thread that dies is
 * replaced by the pool.
 */
import { Worker } from "node:worker_threads";
import { readFileSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { cpus } from "node:os";
import { OUTPUT_GRACE_MS } from "./call-deadline.js";
import { CANCEL_REQUESTED } from "./cancel-extension.js";
import { createPacerBuffer, pacerStarted, pacerThrottled, pacerWaits } from "./pacer.js";
import { defaultLedgerPath } from "./rate-ledger.js";
import { InteractionSender } from "./interaction-channel.js";
import type { OutputStream, ThreadCall, ThreadCallError, ThreadMessage } from "./provider-thread.js";
import type { OriginRoute } from "./secrets.js";
import type { ProviderOperation, WitRateLimit } from "./wit-types.js";

/** A call's failure as the pool reports it. */
export class ProviderCallError extends Error {
  constructor(
    readonly failure: ThreadCallError,
    /** Sandboxes the call created and reported (`host.record-sandbox`) before it failed. */
    readonly recordedSandboxes: readonly string[] = [],
  ) {
    super(failure.kind === "trap" ? `the provider component trapped: ${failure.message}` : "provider error");
    this.name = "ProviderCallError";
  }
}

/** Options of one call. */
export interface CallOptions {
  /**
   * Receives live output chunks in order, one at a time: the bytes the
   * command printed (a chunk may end inside a UTF-8 character; decode each
   * stream with a streaming decoder). A returned promise is awaited before
   * the next chunk (and before the call's result). While more than the
   * pool's `outputHighWaterChars` bytes are not yet delivered, the provider
   * thread waits in `emit-output`, so the component stops reading the
   * stream: a slow sink slows the command's output, it never drops it.
   */
  onOutput?: (stream: OutputStream, chunk: Uint8Array) => void | Promise<void>;
  /** The API origins the call may reach, each with its secret header (`splitConfig`). */
  routes?: OriginRoute[];
  /** The request budget per origin, shared by all threads (none: no limit). */
  rateLimit?: WitRateLimit;
  /** `rateLimit` is the provider's declaration: not spent on an origin that answers as our engine. */
  rateLimitDeclared?: boolean;
}

/**
 * A running `interact` call: besides the call, the process's start and
 * the way to send it events (`interaction-channel.ts`).
 */
export interface RunningInteraction<T> extends RunningCall<T> {
  /**
   * Resolves when the component reported the process exists and takes
   * events (`host.interaction-started`); rejects with the call's failure
   * when the call ended before that.
   */
  started: Promise<void>;
  /** Queues an event (input waits while too much is queued); false once the call ended. */
  send: InteractionSender["send"];
}

/** A running call: its result and a way to cancel it. */
export interface RunningCall<T> {
  result: Promise<T>;
  /** Asks the component to stop; it cleans up and raises `cancelled`. */
  cancel(): void;
  /**
   * Bytes of output `onOutput` did not take: a sink that stopped
   * taking output is waited for until the command's timeout (and while it
   * keeps taking chunks), then the call settles without it. Final once
   * `result` settled.
   */
  unconsumedBytes(): number;
  /**
   * Why `onOutput` failed, if it threw or rejected: output that could not
   * be delivered. The call is then cancelled at once (the component stops
   * the command), later chunks are counted as not consumed, and the call
   * is never a clean result.
   */
  sinkFailure(): string | undefined;
}

interface PendingCall {
  id: number;
  message: ThreadCall;
  onOutput?: CallOptions["onOutput"];
  /** An `interact` call: its input path, and the opener waiting for the process to start. */
  interaction?: { sender: InteractionSender; started(): void };
  /** The sandbox ids the component reported during the call. */
  recorded: string[];
  /** Int32: output bytes posted by the thread and not yet delivered to `onOutput`. */
  outputCredit: Int32Array;
  /** Settles when every chunk posted so far was delivered. */
  delivered: Promise<void>;
  /** When a sink that stopped taking output stops being waited for (the command's timeout, epoch ms). */
  outputLimitMs: number;
  /** When the sink last took a chunk (or the call started). */
  progressMs: number;
  /** Bytes posted and not yet taken by the sink. */
  pendingBytes: number;
  /** The call settled without the sink: later chunks are not delivered. */
  abandoned: boolean;
  /** Bytes the sink did not take before the call settled. */
  unconsumedBytes: number;
  /** Bytes the sink failed on, and every byte after its failure. */
  failedBytes: number;
  /** Why the sink failed (it threw or rejected), once it did. */
  sinkFailure: string | undefined;
  /** Asks the component to stop (the call's cancel). */
  cancel(): void;
  resolve(value: unknown): void;
  reject(error: unknown): void;
}

interface PoolThread {
  worker: Worker;
  busy: PendingCall | undefined;
  ready: Promise<number>;
}

/** Counters for diagnostics and benchmarks. */
export interface PoolStats {
  threads: number;
  calls: number;
  traps: number;
  threadRestarts: number;
  /** The most output bytes a call ever had posted and not yet delivered (flow control's bound). */
  outputBacklogMax: number;
}

/**
 * Default bound of undelivered output per call, in bytes (characters before
 * contract 0.4.0 made output bytes; the option keeps its name): beyond it
 * the provider thread waits for the sink.
 */
export const OUTPUT_HIGH_WATER_CHARS = 4 * 1024 * 1024;

export class ProviderPool {
  readonly #threads: PoolThread[] = [];
  readonly #queue: PendingCall[] = [];
  readonly #pacerBuffer: SharedArrayBuffer;
  readonly #ledgerPath: string;
  readonly #size: number;
  readonly #testTrapMarker: string | undefined;
  readonly #componentDir: string | undefined;
  /** The component's core modules, compiled once for every thread of this pool. */
  readonly #modules: Promise<Map<string, WebAssembly.Module>>;
  #nextId = 1;
  #closed = false;
  readonly #outputHighWater: number;
  readonly #interactionChecks = new Int32Array(new SharedArrayBuffer(4));
  readonly stats: PoolStats = { threads: 0, calls: 0, traps: 0, threadRestarts: 0, outputBacklogMax: 0 };

  /** How many API requests of this process had to wait for the rate-limit budget so far. */
  get rateLimitWaits(): number {
    return pacerWaits(this.#pacerBuffer);
  }

  /** How many 429 answers paused the rate-limit budget so far (this process). */
  get rateLimitThrottled(): number {
    return pacerThrottled(this.#pacerBuffer);
  }

  /** How many API requests of this process the rate-limit budget let start. */
  /**
   * How many times components of this pool looked for an interaction
   * event (`host.next-interaction-event`): an idle interactive process
   * barely adds to it; a component spinning on a pollable that stays
   * ready would add thousands a second.
   */
  get interactionChecks(): number {
    return Atomics.load(this.#interactionChecks, 0);
  }

  get rateLimitStarts(): number {
    return pacerStarted(this.#pacerBuffer);
  }

  /** The request pacer's ledger file (shared by every process that names the same file). */
  get ledgerPath(): string {
    return this.#ledgerPath;
  }

  /**
   * `pacerBuffer`: the in-process queue table (default a new one for this
   * pool); `ledgerPath`: the machine-wide budget file (default
   * {@link defaultLedgerPath}).
   */
  constructor(
    options: {
      size?: number;
      testTrapMarker?: string;
      pacerBuffer?: SharedArrayBuffer;
      ledgerPath?: string;
      outputHighWaterChars?: number;
      /** The transpiled component's directory (a `file:` URL ending in `/`); default `./component/` beside this module. */
      componentDir?: string;
    } = {},
  ) {
    this.#outputHighWater = Math.max(1, options.outputHighWaterChars ?? OUTPUT_HIGH_WATER_CHARS);
    this.#pacerBuffer = options.pacerBuffer ?? createPacerBuffer();
    this.#ledgerPath = options.ledgerPath ?? defaultLedgerPath();
    this.#size = Math.max(1, options.size ?? Math.min(4, cpus().length));
    this.#testTrapMarker = options.testTrapMarker;
    this.#componentDir = options.componentDir;
    this.#modules = compileCoreModules(componentDirOf(this.#componentDir));
    // Unhandled here: a thread that needs the modules reports the failure with its call.
    this.#modules.catch(() => {});
    this.#threads.push(this.#spawn());
    this.stats.threads = this.#threads.length;
  }

  /** Resolves when every thread has its first instance (milliseconds each took). */
  ready(): Promise<number[]> {
    return Promise.all(this.#threads.map((thread) => thread.ready));
  }

  #spawn(): PoolThread {
    const worker = new Worker(new URL("./provider-thread.js", import.meta.url), {
      workerData: {
        pacerBuffer: this.#pacerBuffer,
        interactionChecks: this.#interactionChecks.buffer,
        ledgerPath: this.#ledgerPath,
        testTrapMarker: this.#testTrapMarker,
        componentDir: this.#componentDir,
        outputHighWaterChars: this.#outputHighWater,
      },
      // Whatever the thread (or the shim's I/O thread under it) prints goes to
      // this process's stderr: stdout is Paperclip's JSON-RPC channel.
      stdout: true,
      stderr: false,
    });
    worker.stdout.pipe(process.stderr, { end: false });
    worker.unref();
    this.#modules.then(
      (modules) => worker.postMessage({ kind: "modules", modules }),
      (error: unknown) => worker.postMessage({ kind: "modules", error: error instanceof Error ? error.message : String(error) }),
    );
    let markReady: (ms: number) => void = () => {};
    const thread: PoolThread = { worker, busy: undefined, ready: new Promise((resolve) => (markReady = resolve)) };
    worker.on("message", (message: ThreadMessage) => {
      if (message.kind === "ready") {
        markReady(message.instantiateMs);
        return;
      }
      const call = thread.busy;
      if (!call || call.id !== message.id) return;
      if (message.kind === "output-limit") {
        call.outputLimitMs = message.limitMs;
        return;
      }
      if (message.kind === "output") {
        this.stats.outputBacklogMax = Math.max(this.stats.outputBacklogMax, Atomics.load(call.outputCredit, 0));
        const { stream, chunk } = message;
        const bytes = chunk.byteLength;
        call.pendingBytes += bytes;
        // In order, one at a time; the thread may go on once the sink took the chunk.
        call.delivered = call.delivered
          .then(async () => {
            if (call.abandoned) return;
            if (call.sinkFailure !== undefined) {
              call.failedBytes += bytes;
              return;
            }
            try {
              await call.onOutput?.(stream, chunk);
            } catch (error) {
              // Output the sink could not take cannot reach anyone: stop the
              // command now (as a pipeline's writer ends when its reader
              // is gone) and never call the result clean.
              call.sinkFailure = error instanceof Error ? error.message : String(error);
              call.failedBytes += bytes;
              call.cancel();
            }
          })
          .then(() => {
            if (!call.abandoned) {
              call.pendingBytes -= bytes;
              call.progressMs = Date.now();
            }
            Atomics.sub(call.outputCredit, 0, bytes);
            Atomics.notify(call.outputCredit, 0);
          });
        return;
      }
      if (message.kind === "sandbox") {
        call.recorded.push(message.sandboxId);
        return;
      }
      if (message.kind === "interaction-started") {
        call.interaction?.started();
        return;
      }
      thread.busy = undefined;
      // Nothing sent from now on reaches the process.
      call.interaction?.sender.close();
      if (!message.ok && message.error.kind === "trap") this.stats.traps++;
      // The result follows the last output chunk's delivery (or the sink is given up on).
      void settleAfterOutput(call).then(() => {
        if (message.ok) call.resolve(message.value);
        else call.reject(new ProviderCallError(message.error, call.recorded));
      });
      this.#dispatch();
    });
    const lost = (reason: string) => {
      const index = this.#threads.indexOf(thread);
      if (index < 0) return;
      const call = thread.busy;
      thread.busy = undefined;
      if (call) {
        call.interaction?.sender.close();
        // Nothing waits for output any more.
        Atomics.store(call.outputCredit, 0, -(2 ** 30));
        Atomics.notify(call.outputCredit, 0);
        void settleAfterOutput(call).then(() =>
          call.reject(new ProviderCallError({ kind: "trap", message: `the provider thread stopped (${reason})` }, call.recorded)),
        );
      }
      if (this.#closed) {
        this.#threads.splice(index, 1);
        return;
      }
      this.stats.threadRestarts++;
      this.#threads[index] = this.#spawn();
      this.#dispatch();
    };
    worker.on("error", (error) => lost(error.message));
    worker.on("exit", (code) => lost(`exit code ${code}`));
    return thread;
  }

  #dispatch() {
    // Calls wait and every thread is busy: start another, up to `size`.
    if (!this.#closed && this.#threads.length < this.#size && this.#queue.length > this.#threads.filter((t) => !t.busy).length) {
      this.#threads.push(this.#spawn());
      this.stats.threads = this.#threads.length;
    }
    for (const thread of this.#threads) {
      if (thread.busy) continue;
      const call = this.#queue.shift();
      if (!call) return;
      thread.busy = call;
      thread.worker.ref();
      thread.worker.postMessage(call.message, call.message.interaction ? [call.message.interaction.port] : []);
    }
    for (const thread of this.#threads) if (!thread.busy) thread.worker.unref();
  }

  /**
   * Starts one `interact` call (contract 0.6.0): the process opens in the
   * sandbox (`started`), takes the events sent to it while it runs, and
   * its output reaches `onOutput` (a terminal's as `terminal`).
   */
  interact<T>(args: unknown[], options: CallOptions = {}): RunningInteraction<T> {
    const sender = new InteractionSender();
    let markStarted: () => void = () => {};
    const started = new Promise<void>((resolve) => (markStarted = resolve));
    const running = this.call<T>("interact", args, options, { sender, started: () => markStarted() });
    // A call that ends before the process started rejects the opener with its failure.
    const startedOrFailed = Promise.race([started, running.result.then(() => undefined)]);
    startedOrFailed.catch(() => {});
    return { ...running, started: startedOrFailed, send: (event) => sender.send(event) };
  }

  /** Starts one call of a provider operation. */
  call<T>(
    operation: ProviderOperation,
    args: unknown[],
    options: CallOptions = {},
    interaction?: { sender: InteractionSender; started(): void },
  ): RunningCall<T> {
    if (this.#closed) {
      interaction?.sender.close();
      return {
        result: Promise.reject(new Error("the provider pool is shut down")),
        cancel() {},
        unconsumedBytes: () => 0,
        sinkFailure: () => undefined,
      };
    }
    this.stats.calls++;
    const cancelFlag = new SharedArrayBuffer(4);
    const outputCredit = new SharedArrayBuffer(4);
    const id = this.#nextId++;
    let pending: PendingCall | undefined;
    const cancel = () => {
      const flag = new Int32Array(cancelFlag);
      if (Atomics.compareExchange(flag, 0, 0, CANCEL_REQUESTED) === 0) Atomics.notify(flag, 0);
    };
    const result = new Promise<T>((resolve, reject) => {
      pending = {
        id,
        message: {
          kind: "call",
          id,
          operation,
          args,
          cancelFlag,
          outputCredit,
          routes: options.routes,
          rateLimit: options.rateLimit,
          rateLimitDeclared: options.rateLimitDeclared,
          interaction: interaction?.sender.wire,
        },
        onOutput: options.onOutput,
        interaction,
        recorded: [],
        outputCredit: new Int32Array(outputCredit),
        delivered: Promise.resolve(),
        outputLimitMs: Number.POSITIVE_INFINITY,
        progressMs: Date.now(),
        pendingBytes: 0,
        abandoned: false,
        unconsumedBytes: 0,
        failedBytes: 0,
        sinkFailure: undefined,
        cancel,
        resolve: resolve as (value: unknown) => void,
        reject,
      };
      this.#queue.push(pending);
    });
    this.#dispatch();
    return {
      result,
      cancel,
      unconsumedBytes: () => (pending?.unconsumedBytes ?? 0) + (pending?.failedBytes ?? 0),
      sinkFailure: () => pending?.sinkFailure,
    };
  }

  /** Stops every thread; running calls fail. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const call of this.#queue.splice(0)) call.reject(new Error("the provider pool is shut down"));
    await Promise.all(this.#threads.map((thread) => thread.worker.terminate()));
  }
}

/**
 * Resolves once every chunk of `call` reached its sink, or, for a sink that
 * stopped taking output, once the command's timeout has passed and the
 * sink took nothing for {@link OUTPUT_GRACE_MS}: then the call is settled
 * without it (what it did not take is counted, nothing later is delivered).
 */
async function settleAfterOutput(call: PendingCall): Promise<void> {
  let delivered = false;
  const done = call.delivered.then(() => {
    delivered = true;
  });
  for (;;) {
    if (delivered) return;
    const now = Date.now();
    const until = now < call.outputLimitMs ? call.outputLimitMs : call.progressMs + OUTPUT_GRACE_MS;
    if (now >= until) {
      call.abandoned = true;
      call.unconsumedBytes = call.pendingBytes;
      return;
    }
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([done, new Promise((resolve) => (timer = setTimeout(resolve, Math.min(until - now, 2 ** 31 - 1))))]);
    clearTimeout(timer);
  }
}

/** Compiles every core module of the transpiled component in `dir` (V8 compiles off the main thread). */
async function compileCoreModules(dir: URL): Promise<Map<string, WebAssembly.Module>> {
  const names = (await readdir(dir)).filter((name) => name.endsWith(".wasm"));
  const compiled = await Promise.all(names.map(async (name) => [name, await WebAssembly.compile(await readFile(new URL(name, dir)))] as const));
  return new Map(compiled);
}

/** The transpiled component's directory: `option` (a `file:` URL ending in `/`), else `./component/` beside this module. */
export function componentDirOf(option?: string): URL {
  return new URL(option ?? new URL("./component/", import.meta.url).href);
}

/** The name of the file in which the packer stores the component's `describe()` answer, beside the component. */
export const PACKED_DESCRIPTION = "description.json";

/**
 * The `describe()` answer the packer stored with the component, or
 * undefined when there is none (then the component is asked). Lets a
 * worker answer `initialize` before any instance exists.
 */
export async function packedDescription(option?: string): Promise<unknown> {
  try {
    return JSON.parse(await readFile(new URL(PACKED_DESCRIPTION, componentDirOf(option)), "utf8"));
  } catch {
    return undefined;
  }
}

/** {@link packedDescription}, read at once (a worker decides which hooks it defines before it starts). */
export function packedDescriptionSync(option?: string): unknown {
  try {
    return JSON.parse(readFileSync(new URL(PACKED_DESCRIPTION, componentDirOf(option)), "utf8"));
  } catch {
    return undefined;
  }
}
