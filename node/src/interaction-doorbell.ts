/**
 * An extension loaded into preview2-shim's I/O thread: the wake-up of an
 * interactive process's events (see `interaction-channel.ts`). It makes a
 * readable stream that gets one byte each time the sender bumps the shared
 * counter, and ends once the call is over. The provider thread hands the
 * component that stream's pollable as `host.interaction-events`; the shim
 * makes a stream's pollable ready while bytes wait and not ready once they
 * are read, which the provider thread does before it looks for an event.
 */
import { Readable } from "node:stream";
import { SLOT_FINISHED, SLOT_POSTED } from "./interaction-channel.js";

/** The context preview2-shim gives an extension. */
interface ExtensionContext {
  createReadableStream(stream: Readable): number;
}

async function ring(view: Int32Array, stream: Readable) {
  let seen = 0;
  for (;;) {
    if (Atomics.load(view, SLOT_FINISHED) !== 0) {
      stream.push(null);
      return;
    }
    const posted = Atomics.load(view, SLOT_POSTED);
    if (posted !== seen) {
      seen = posted;
      stream.push(Buffer.of(1));
      continue;
    }
    const waiter = Atomics.waitAsync(view, SLOT_POSTED, seen);
    if (waiter.async) await waiter.value;
  }
}

/** The extension entry point preview2-shim calls once per module. */
export default function create(context: ExtensionContext) {
  return (operation: string, args: unknown[]): number => {
    if (operation !== "doorbell" || !(args[0] instanceof SharedArrayBuffer)) {
      throw new Error(`unknown interaction operation ${operation}`);
    }
    const view = new Int32Array(args[0]);
    const stream = new Readable({ read() {} });
    void ring(view, stream);
    return context.createReadableStream(stream);
  };
}
