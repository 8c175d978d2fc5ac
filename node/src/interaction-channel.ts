/**
 * The input path of one interactive process (contract 0.6.0,
 * `provider.interact`) between the thread that serves Paperclip and the
 * provider thread that runs the component, which blocks for the whole call.
 *
 * Events (input bytes, resize, close input, signal, end) travel over a
 * `MessagePort` of their own, which the provider thread reads synchronously
 * (`receiveMessageOnPort`) when the component takes one
 * (`host.next-interaction-event`). Their wake-up travels as the
 * cancellation flag does, through a `SharedArrayBuffer` and `Atomics`: the
 * sender bumps a counter; the interaction doorbell (an extension in
 * preview2-shim's I/O thread, `interaction-doorbell.ts`) turns each bump
 * into a byte of a stream whose pollable is the component's
 * `host.interaction-events`, ready while a byte waits and not ready again
 * once the provider thread has drained it (a level, not an edge, so the
 * component never spins on an empty queue). Bumps close together may give
 * one byte for several events, so the receiver rings again after handing
 * out an event while another waits: the pollable is ready exactly while an
 * event waits, as the contract says, for a component that takes one event
 * per wake-up as much as for one that takes all it finds.
 *
 * Input is flow-controlled: a sender waits while more than
 * {@link MAX_QUEUED_INPUT_BYTES} of its input are queued and not yet taken
 * by the component, so a huge paste costs bounded memory.
 */
import { MessageChannel, receiveMessageOnPort, type MessagePort } from "node:worker_threads";
import type { WitInteractionEvent } from "./wit-types.js";

/** Int32 slots of the shared buffer. */
export const SLOT_POSTED = 0;
/** 1 once the call is over: the doorbell ends its stream. */
export const SLOT_FINISHED = 1;
/** Input bytes sent and not yet taken by the component. */
export const SLOT_QUEUED_BYTES = 2;
const SLOTS = 4;

/** Input beyond which a sender waits for the component to take what is queued. */
export const MAX_QUEUED_INPUT_BYTES = 4 * 1024 * 1024;

/** What the pool hands the provider thread with an `interact` call. */
export interface InteractionWire {
  port: MessagePort;
  doorbell: SharedArrayBuffer;
}

/** The sending side, held by the pool for one `interact` call. */
export class InteractionSender {
  readonly #port: MessagePort;
  readonly #view: Int32Array;
  readonly wire: InteractionWire;
  #closed = false;

  constructor() {
    const channel = new MessageChannel();
    const doorbell = new SharedArrayBuffer(SLOTS * 4);
    this.#port = channel.port1;
    this.#view = new Int32Array(doorbell);
    this.wire = { port: channel.port2, doorbell };
  }

  /** Whether the call ended (nothing sent now reaches the process). */
  get closed(): boolean {
    return this.#closed || Atomics.load(this.#view, SLOT_FINISHED) !== 0;
  }

  /**
   * Queues `event`. Input waits first while too much is queued (the
   * component takes input as the process's API accepts it); resolves once
   * queued, false when the call ended first (the event went nowhere).
   */
  async send(event: WitInteractionEvent): Promise<boolean> {
    if (event.tag === "input") {
      const size = event.val.byteLength;
      for (;;) {
        if (this.closed) return false;
        const queued = Atomics.load(this.#view, SLOT_QUEUED_BYTES);
        if (queued === 0 || queued + size <= MAX_QUEUED_INPUT_BYTES) break;
        const waiter = Atomics.waitAsync(this.#view, SLOT_QUEUED_BYTES, queued, 100);
        if (waiter.async) await waiter.value;
      }
      Atomics.add(this.#view, SLOT_QUEUED_BYTES, size);
    }
    if (this.closed) return false;
    this.#port.postMessage(event);
    Atomics.add(this.#view, SLOT_POSTED, 1);
    Atomics.notify(this.#view, SLOT_POSTED);
    return true;
  }

  /** The call is over: wakes waiting senders and the doorbell, closes the port. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    Atomics.store(this.#view, SLOT_FINISHED, 1);
    Atomics.add(this.#view, SLOT_POSTED, 1);
    Atomics.notify(this.#view, SLOT_POSTED);
    Atomics.notify(this.#view, SLOT_QUEUED_BYTES);
    this.#port.close();
  }
}

/** The receiving side, in the provider thread. */
export class InteractionReceiver {
  readonly #port: MessagePort;
  readonly #view: Int32Array;
  /** An event received from the port and not yet handed out (at most one). */
  #ahead: WitInteractionEvent | undefined;

  constructor(wire: InteractionWire) {
    this.#port = wire.port;
    this.#view = new Int32Array(wire.doorbell);
  }

  /**
   * The next queued event, if one is there now (never waits). When another
   * one waits behind it, the doorbell is rung again: the provider thread
   * drains the doorbell before it takes an event, and the sender's rings
   * of events queued together may have left one byte for all of them, so
   * without this the pollable would say nothing waits while events do,
   * and they would wait for the next event the host sends (a component
   * that takes one event per wake-up, as Daytona's does, stalled so).
   */
  take(): WitInteractionEvent | undefined {
    const event = this.#ahead ?? this.#receive();
    this.#ahead = event === undefined ? undefined : this.#receive();
    if (event?.tag === "input") {
      Atomics.sub(this.#view, SLOT_QUEUED_BYTES, event.val.byteLength);
      Atomics.notify(this.#view, SLOT_QUEUED_BYTES);
    }
    if (this.#ahead !== undefined) {
      Atomics.add(this.#view, SLOT_POSTED, 1);
      Atomics.notify(this.#view, SLOT_POSTED);
    }
    return event;
  }

  #receive(): WitInteractionEvent | undefined {
    return receiveMessageOnPort(this.#port)?.message as WitInteractionEvent | undefined;
  }

  /** The call is over: the doorbell stops, waiting senders learn it. */
  finish() {
    Atomics.store(this.#view, SLOT_FINISHED, 1);
    Atomics.add(this.#view, SLOT_POSTED, 1);
    Atomics.notify(this.#view, SLOT_POSTED);
    Atomics.notify(this.#view, SLOT_QUEUED_BYTES);
    this.#port.close();
  }
}
