/**
 * One `worker_threads` thread of the provider pool: it holds one instance of
 * the transpiled component and runs one call at a time on it.
 *
 * The component blocks its thread for a whole call (preview2-shim answers
 * blocking polls with `Atomics.wait`), which is why it never runs on the
 * thread that serves Paperclip's JSON-RPC. Output chunks and results are
 * posted back to the pool as they happen. A call that traps (anything other
 * than a typed `provider-error`) discards the instance; the next call gets a
 * fresh one. The component's `wasi:cli/stdout` and `stderr` both go to this
 * process's stderr (stdout is the JSON-RPC channel); it gets no environment,
 * no arguments and no stdin.
 */
import { parentPort, workerData } from "node:worker_threads";
import { cli, clocks, http, io, random } from "@bytecodealliance/preview2-shim";
import { callExtension, futureDispose, futureSubscribe, inputStreamCreate } from "@bytecodealliance/preview2-shim/io-worker";
import { callBudgetMs, OUTPUT_GRACE_MS, outputWaitMs, requestBudgetMs } from "./call-deadline.js";
import { CALL_FINISHED, CANCEL_REQUESTED } from "./cancel-extension.js";
import { createOutgoingHandler, HostFields, httpErrorCode, type OutgoingPolicy } from "./outgoing-handler.js";
import { checkAskedOrigins, type OriginRoute } from "./secrets.js";
import { HostOutgoingBody, HostOutgoingRequest } from "./request-body.js";
import { Pacer } from "./pacer.js";
import { COMPONENT_NAME } from "./component-name.js";
import { InteractionReceiver, type InteractionWire } from "./interaction-channel.js";
import type { ProviderOperation, WitConfigValidation, WitEnvironmentContext, WitRateLimit } from "./wit-types.js";

/** A call the pool sends to a thread. */
export interface ThreadCall {
  kind: "call";
  id: number;
  operation: ProviderOperation;
  args: unknown[];
  /** Int32 flag: 0 running, 1 cancel requested, 2 finished. */
  cancelFlag: SharedArrayBuffer;
  /** Int32: output characters posted and not yet delivered by the pool (flow control). */
  outputCredit: SharedArrayBuffer;
  /**
   * The API origins the config names (in the provider's `origin-fields`
   * order), each with the secret header its requests carry; the only
   * origins the call may reach (`secrets.ts`).
   */
  routes?: OriginRoute[];
  /** The request budget per origin for this call (none: no limit). */
  rateLimit?: WitRateLimit;
  /** `rateLimit` is the provider's declaration (see `OutgoingPolicy.rateLimitDeclared`). */
  rateLimitDeclared?: boolean;
  /** An `interact` call's input path (`interaction-channel.ts`). */
  interaction?: InteractionWire;
}

/** What a thread posts back. */
export type ThreadMessage =
  | { kind: "ready"; instantiateMs: number }
  /** Live output: the bytes the command printed (a 0.3.0 component's text as UTF-8); `terminal` only from `interact`. */
  | { kind: "output"; id: number; stream: OutputStream; chunk: Uint8Array }
  /** `host.interaction-started`: the interactive process exists and takes events. */
  | { kind: "interaction-started"; id: number }
  /** When a sink that stopped taking output stops being waited for (epoch ms; the command's timeout). */
  | { kind: "output-limit"; id: number; limitMs: number }
  | { kind: "sandbox"; id: number; sandboxId: string }
  | { kind: "done"; id: number; ok: true; value: unknown }
  | { kind: "done"; id: number; ok: false; error: ThreadCallError };

/** Which stream a chunk of live output belongs to. */
export type OutputStream = "stdout" | "stderr" | "terminal";

/** Why a call failed. */
export type ThreadCallError =
  | { kind: "provider"; payload: unknown }
  | { kind: "trap"; message: string };

const port = parentPort;
if (!port) throw new Error("provider-thread.js must run as a worker thread");

/** The transpiled component: `./component/` beside the host code (a packed package), or the pool's choice. */
const componentDir = workerData.componentDir ? new URL(workerData.componentDir as string) : new URL("./component/", import.meta.url);
const cancelExtension = new URL("./cancel-extension.js", import.meta.url);
const doorbellExtension = new URL("./interaction-doorbell.js", import.meta.url);
const pacer = new Pacer(workerData.pacerBuffer as SharedArrayBuffer, workerData.ledgerPath as string);
const trapMarker: string | undefined = workerData.testTrapMarker;

/** Nothing allowed: outside a call, and for calls that send no request. */
const NOTHING: OutgoingPolicy = { allowedOrigin: undefined, secrets: [], rateLimit: undefined };
/** The rules of the call in progress, for a request's target origin. */
let policy: (target: string | undefined) => OutgoingPolicy = () => NOTHING;
/** The input of the current `interact` call: its events and their doorbell stream (whose pollable the component waits on). */
interface CurrentInteraction {
  receiver: InteractionReceiver;
  doorbell: { read(len: bigint): Uint8Array; subscribe(): Disposable; [Symbol.dispose]?(): void };
  /**
   * A pollable of the doorbell of the host's own and one that is always
   * ready: polled together after a drain, they make the shim look at the
   * doorbell again without waiting (a stream's pollable is marked not
   * ready only when polled), so the component's pollable, which shares
   * that state, stops being ready once the doorbell is empty.
   */
  recheck: [Disposable, Disposable];
}

interface Disposable {
  [Symbol.dispose]?(): void;
}
let currentCall:
  | {
      id: number;
      cancelFlag: SharedArrayBuffer;
      interactionFlag: SharedArrayBuffer;
      interaction: CurrentInteraction | undefined;
      outputCredit: Int32Array;
      futures: number[];
      outputLimitMs: number;
      progressMs: number;
      lastBacklog: number;
    }
  | undefined;
/** Beyond this many undelivered output bytes, `emit-output` waits for the sink. */
const outputHighWater: number = workerData.outputHighWaterChars;
/** Shared with the pool: every `next-interaction-event` of this pool's threads (`ProviderPool.interactionChecks`). */
const interactionChecks = new Int32Array(workerData.interactionChecks as SharedArrayBuffer);
/** How often a thread waiting for the sink looks at its call's cancellation and deadline. */
const OUTPUT_WAIT_SLICE_MS = 50;

/** The core modules the pool compiled once for all its threads (posted right after the thread starts). */
let markModules: (modules: Map<string, WebAssembly.Module>) => void = () => {};
let failModules: (reason: Error) => void = () => {};
const compiledModules = new Promise<Map<string, WebAssembly.Module>>((resolve, reject) => {
  markModules = resolve;
  failModules = reject;
});
compiledModules.catch(() => {});
async function coreModule(name: string): Promise<WebAssembly.Module> {
  const module = (await compiledModules).get(name);
  if (!module) throw new Error(`the transpiled component has no core module ${name}`);
  return module;
}

const noStdin = {
  getStdin() {
    throw new Error("the provider component has no stdin");
  },
};

const hostInterface = {
  /**
   * `host.emit-output`: the bytes a command printed (contract 0.4.0, a
   * `Uint8Array`), or a 0.3.0 / 0.2.0 component's text (a string, posted as
   * its UTF-8 bytes). Counted in bytes for backpressure.
   */
  emitOutput(stream: OutputStream, output: Uint8Array | string) {
    if (!currentCall) return;
    const chunk = typeof output === "string" ? new Uint8Array(Buffer.from(output, "utf8")) : output;
    if (trapMarker && Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).includes(trapMarker)) {
      // Test-only fault (see README): a host import failing mid-call is a trap.
      throw new WebAssembly.RuntimeError("test trap requested by output marker");
    }
    const bytes = chunk.byteLength;
    // A chunk that owns its whole buffer (jco copies a lifted list out of
    // the component's memory) moves to the main thread without a copy.
    const owned = chunk.byteOffset === 0 && chunk.buffer.byteLength === bytes && chunk.buffer instanceof ArrayBuffer;
    port!.postMessage({ kind: "output", id: currentCall.id, stream, chunk } satisfies ThreadMessage, owned ? [chunk.buffer as ArrayBuffer] : []);
    // Backpressure: while the sink is behind, the component waits here and
    // stops reading the stream (nothing is dropped). A cancelled call goes
    // on to its cleanup; so does one past the command's timeout whose sink
    // took nothing for a while (a reader that is never resumed), so that
    // the provider ends the command (the pool counts what was not consumed).
    const credit = currentCall.outputCredit;
    const cancelFlag = new Int32Array(currentCall.cancelFlag);
    const call = currentCall;
    if (Atomics.load(credit, 0) < call.lastBacklog) call.progressMs = Date.now();
    let backlog = Atomics.add(credit, 0, bytes) + bytes;
    while (backlog > outputHighWater) {
      if (Atomics.load(cancelFlag, 0) === CANCEL_REQUESTED) break;
      const now = Date.now();
      if (now >= call.outputLimitMs && now >= call.progressMs + OUTPUT_GRACE_MS) break;
      Atomics.wait(credit, 0, backlog, OUTPUT_WAIT_SLICE_MS);
      const left = Atomics.load(credit, 0);
      if (left < backlog) call.progressMs = Date.now();
      backlog = left;
    }
    call.lastBacklog = backlog;
  },
  /**
   * `host.record-sandbox`: the id goes to the main thread at once (before
   * the component goes on), which keeps it with the call, so that an
   * acquire or probe that then fails or traps leaves a record of it.
   */
  recordSandbox(sandboxId: string) {
    if (!currentCall) throw new Error("record-sandbox called outside a provider call");
    port!.postMessage({ kind: "sandbox", id: currentCall.id, sandboxId } satisfies ThreadMessage);
  },
  cancellation() {
    if (!currentCall) throw new Error("cancellation() called outside a provider call");
    const future = callExtension(cancelExtension, "watch", [currentCall.cancelFlag]) as number;
    currentCall.futures.push(future);
    return futureSubscribe(future, hostInterface);
  },
  /**
   * `host.interaction-events` (contract 0.6.0): the pollable of the
   * current `interact` call's doorbell stream, ready while an event may
   * wait (`interaction-channel.ts`). Any other call gets a pollable over a
   * flag of its own that nothing raises: it has no events.
   */
  interactionEvents() {
    if (!currentCall) throw new Error("interaction-events called outside a provider call");
    if (currentCall.interaction) return currentCall.interaction.doorbell.subscribe();
    const future = callExtension(cancelExtension, "watch", [currentCall.interactionFlag]) as number;
    currentCall.futures.push(future);
    return futureSubscribe(future, hostInterface);
  },
  /**
   * `host.next-interaction-event`: the doorbell's bytes are drained first,
   * then the next queued event is taken; the receiver rings again when
   * another one waits behind it (events queued together may have left one
   * byte for all), and an event queued after the drain rings on its own,
   * so the pollable is ready while an event waits and an empty queue
   * leaves it not ready.
   */
  nextInteractionEvent() {
    const interaction = currentCall?.interaction;
    if (!interaction) return undefined;
    Atomics.add(interactionChecks, 0, 1);
    try {
      while (interaction.doorbell.read(4096n).byteLength > 0);
      io.poll.poll(interaction.recheck as never);
    } catch {
      // Closed: the call is over.
    }
    return interaction.receiver.take();
  },
  /** `host.interaction-started`: the pool answers the opener. */
  interactionStarted() {
    if (!currentCall?.interaction) return;
    port!.postMessage({ kind: "interaction-started", id: currentCall.id } satisfies ThreadMessage);
  },
};

function importObject() {
  return {
    "sandbox:provider/host": hostInterface,
    "wasi:cli/environment": { getEnvironment: () => [], getArguments: () => [], initialCwd: () => undefined },
    "wasi:cli/exit": {
      exit() {
        throw new Error("the provider component called exit");
      },
    },
    "wasi:cli/stdin": noStdin,
    "wasi:cli/stdout": { getStdout: cli.stderr.getStderr },
    "wasi:cli/stderr": cli.stderr,
    "wasi:cli/terminal-input": cli.terminalInput,
    "wasi:cli/terminal-output": cli.terminalOutput,
    "wasi:cli/terminal-stdin": cli.terminalStdin,
    "wasi:cli/terminal-stdout": cli.terminalStdout,
    "wasi:cli/terminal-stderr": cli.terminalStderr,
    "wasi:clocks/monotonic-clock": clocks.monotonicClock,
    "wasi:clocks/wall-clock": clocks.wallClock,
    "wasi:http/types": { ...http.types, Fields: HostFields, OutgoingRequest: HostOutgoingRequest, OutgoingBody: HostOutgoingBody, httpErrorCode },
    "wasi:http/outgoing-handler": createOutgoingHandler((target) => policy(target), pacer),
    "wasi:io/error": io.error,
    "wasi:io/poll": io.poll,
    "wasi:io/streams": io.streams,
    "wasi:random/random": random.random,
  };
}

type Provider = Record<ProviderOperation, (...args: unknown[]) => unknown>;

async function instantiate(): Promise<Provider> {
  const { instantiate: instantiateComponent } = await import(new URL(`${COMPONENT_NAME}.js`, componentDir).href);
  const root = await instantiateComponent(coreModule, importObject());
  return root.provider as Provider;
}

/** A new instance; its failure is reported to the call that awaits it. */
function fresh(): Promise<Provider> {
  const next = instantiate();
  next.catch(() => {});
  return next;
}

let provider: Promise<Provider> = fresh();

function contextOf(operation: ProviderOperation, args: unknown[]): WitEnvironmentContext | undefined {
  if (operation === "describe" || operation === "validateConfig") return undefined;
  return args[0] as WitEnvironmentContext;
}

async function run(call: ThreadCall): Promise<ThreadMessage> {
  const instance = await provider.catch((error: unknown) => {
    // A failed instantiation is retried by the next call.
    provider = fresh();
    throw error;
  });
  currentCall = {
    id: call.id,
    cancelFlag: call.cancelFlag,
    interactionFlag: new SharedArrayBuffer(4),
    interaction: call.interaction ? openInteraction(call.interaction) : undefined,
    outputCredit: new Int32Array(call.outputCredit),
    futures: [],
    outputLimitMs: Number.POSITIVE_INFINITY,
    progressMs: Date.now(),
    lastBacklog: 0,
  };
  try {
    const ctx = contextOf(call.operation, call.args);
    const routes = call.routes ?? [];
    let budget: WitConfigValidation["budget"];
    if (ctx) {
      const validation = instance.validateConfig(ctx.config) as WitConfigValidation;
      budget = validation.budget;
      const problem = validation.ok ? checkAskedOrigins(validation.apiOrigins, routes) : undefined;
      if (problem) {
        // Refused before the operation runs: no request was made.
        return { kind: "done", id: call.id, ok: false, error: { kind: "provider", payload: { tag: "invalid-config", val: [problem] } } };
      }
    }
    const cancelFlag = new Int32Array(call.cancelFlag);
    currentCall.outputLimitMs = Date.now() + outputWaitMs(call.operation, budget, call.args);
    port!.postMessage({ kind: "output-limit", id: call.id, limitMs: currentCall.outputLimitMs } satisfies ThreadMessage);
    const common = {
      rateLimit: call.rateLimit,
      rateLimitDeclared: call.rateLimitDeclared,
      deadlineMs: Date.now() + callBudgetMs(call.operation, budget, call.args),
      cancelled: () => Atomics.load(cancelFlag, 0) === CANCEL_REQUESTED,
      maxThrottleWaitMs: ctx ? requestBudgetMs(budget) : undefined,
    };
    const allowed = ctx ? routes : [];
    policy = (target) => {
      const route = target === undefined ? undefined : allowed.find((r) => r.origin === target);
      return { ...common, allowedOrigin: route?.origin, secrets: route?.secrets ?? [] };
    };
    const value = instance[call.operation](...call.args);
    return { kind: "done", id: call.id, ok: true, value };
  } catch (error) {
    const payload = (error as { payload?: unknown } | null)?.payload;
    if (error instanceof Error && error.constructor.name === "ComponentError" && payload !== undefined) {
      return { kind: "done", id: call.id, ok: false, error: { kind: "provider", payload } };
    }
    // Anything else unwound through the component: the instance is unusable.
    provider = fresh();
    const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    return { kind: "done", id: call.id, ok: false, error: { kind: "trap", message } };
  } finally {
    policy = () => NOTHING;
    for (const buffer of [call.cancelFlag, currentCall.interactionFlag]) {
      const flag = new Int32Array(buffer);
      Atomics.compareExchange(flag, 0, 0, CALL_FINISHED);
      Atomics.notify(flag, 0);
    }
    if (currentCall.interaction) closeInteraction(currentCall.interaction);
    for (const future of currentCall.futures) {
      try {
        futureDispose(future);
      } catch {
        // The component still holds a pollable of it; the shim frees it with the pollable.
      }
    }
    currentCall = undefined;
  }
}

function openInteraction(wire: InteractionWire): CurrentInteraction {
  const streamId = callExtension(doorbellExtension, "doorbell", [wire.doorbell]) as number;
  const doorbell = inputStreamCreate(streamId) as unknown as CurrentInteraction["doorbell"];
  const alwaysReady = clocks.monotonicClock.subscribeDuration(0n) as Disposable;
  return { receiver: new InteractionReceiver(wire), doorbell, recheck: [doorbell.subscribe(), alwaysReady] };
}

/** Events not taken are dropped (the process ended); senders learn the call is over. */
function closeInteraction(interaction: CurrentInteraction) {
  interaction.receiver.finish();
  for (const pollable of interaction.recheck) pollable[Symbol.dispose]?.();
  try {
    interaction.doorbell[Symbol.dispose]?.();
  } catch {
    // The component still holds a pollable of it; the shim frees the stream with it.
  }
}

port.on("message", (message: ThreadCall | { kind: "modules"; modules?: Map<string, WebAssembly.Module>; error?: string }) => {
  if (message.kind === "modules") {
    if (message.modules) markModules(message.modules);
    else failModules(new Error(`the component could not be compiled: ${message.error}`));
    return;
  }
  const call = message;
  run(call).then(
    (message) => port.postMessage(message),
    (error) =>
      port.postMessage({
        kind: "done",
        id: call.id,
        ok: false,
        error: { kind: "trap", message: error instanceof Error ? error.message : String(error) },
      } satisfies ThreadMessage),
  );
});

const started = performance.now();
provider.then(
  () => port.postMessage({ kind: "ready", instantiateMs: performance.now() - started } satisfies ThreadMessage),
  (error) => {
    process.stderr.write(`provider component failed to instantiate: ${error instanceof Error ? error.message : error}\n`);
  },
);
