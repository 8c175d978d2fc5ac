/**
 * An extension loaded into preview2-shim's I/O worker (the thread that
 * answers the component's blocking `wasi:io/poll` calls). It turns a shared
 * cancellation flag into a shim future, so `sandbox:provider/host.cancellation`
 * can hand the component a real pollable that becomes ready when the pool
 * sets the flag, without blocking any thread.
 *
 * Flag values (an `Int32Array` of length 1 over a `SharedArrayBuffer`):
 * 0 = running, 1 = cancel requested, 2 = the call is over (releases waiters).
 */

/** The context preview2-shim gives an extension. */
interface ExtensionContext {
  createFuture(promise: Promise<unknown>): number;
}

/** The flag value that asks the running operation to stop. */
export const CANCEL_REQUESTED = 1;
/** The flag value that marks a call as finished. */
export const CALL_FINISHED = 2;

async function flagRaised(view: Int32Array): Promise<number> {
  for (;;) {
    const value = Atomics.load(view, 0);
    if (value !== 0) return value;
    const waiter = Atomics.waitAsync(view, 0, 0);
    if (waiter.async) await waiter.value;
  }
}

/** The extension entry point preview2-shim calls once per module. */
export default function create(context: ExtensionContext) {
  return (operation: string, args: unknown[]): number => {
    if (operation !== "watch" || !(args[0] instanceof SharedArrayBuffer)) {
      throw new Error(`unknown cancellation operation ${operation}`);
    }
    const view = new Int32Array(args[0]);
    return context.createFuture(
      flagRaised(view).then((value) => {
        if (value !== CANCEL_REQUESTED) throw new Error("call finished");
        return value;
      }),
    );
  };
}
