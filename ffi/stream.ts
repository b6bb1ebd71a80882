/**
 * `Stream` (an ordered queue of device work) and `Event` (a marker in a stream: for waiting,
 * for ordering one stream after another, and for timing).
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { describe } from "./_checks.ts";
import { assertDevice, Resource } from "./resource.ts";
import type { Device } from "./device.ts";
import { Status, unwrap } from "./errors.ts";
import type { Library } from "./symbols.ts";

/** Runs a [wait] call with a message buffer and throws its failure. */
async function waitCall(
  lib: Library,
  action: string,
  call: (msg: Uint8Array, cap: bigint) => Promise<number>,
): Promise<void> {
  // The buffer travels to the worker thread: this frame keeps it referenced until the call
  // returns.
  const msg = new Uint8Array(1024);
  unwrap(lib, await call(msg, BigInt(msg.length)), action, msg);
}

/** Makes the wrapper of a device's default stream (set once, by Stream's static block). */
let wrapDefault: (device: Device) => Stream;

/**
 * Internal: the wrapper of the backend's default (NULL) stream, made once per Device.
 *
 * @param device The device whose default stream to wrap.
 * @returns A Stream whose handle is null and whose dispose does nothing native.
 */
export function createDefaultStream(device: Device): Stream {
  return wrapDefault(device);
}

/** Options of {@linkcode Stream}. */
export interface StreamOptions {
  /** Skip the implicit ordering with the default stream (`cudaStreamNonBlocking`). */
  nonBlocking?: boolean;
}

/**
 * An ordered queue of device work (a CUDA stream; on cpu, work runs at once). Copies and
 * kernels take `{ stream }`; work on one stream runs in order, work on different streams may
 * overlap unless ordered with {@linkcode Stream.waitEvent}. The device's default stream is
 * an ordering point: work queued on it waits for every stream, and every stream waits for
 * it (CUDA's legacy default stream), so default-stream conveniences such as
 * `Tensor.fromHost` are safe to follow with kernels on any stream.
 *
 * @example Waiting for queued work
 * ```ts
 * import { Device, Stream } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using stream = new Stream(dev);
 * await stream.synchronize();
 * assert.strictEqual(stream.query(), true);
 * ```
 */
export class Stream extends Resource {
  /** The device this stream belongs to. */
  readonly device: Device;
  /** The native handle (`cudaStream_t`); null for the default stream. */
  readonly handle: Deno.PointerValue;
  /** Whether this wraps the backend's default stream. */
  readonly isDefault: boolean;

  /** Whether the stream skips the implicit ordering with the default stream. */
  readonly nonBlocking: boolean;

  /**
   * The options object that makes the constructor wrap the default stream instead of
   * creating one: unforgeable outside this class, handed only to `createDefaultStream`.
   */
  static readonly #DEFAULT: StreamOptions = Object.freeze({});
  static {
    wrapDefault = (device) => new Stream(device, Stream.#DEFAULT);
  }

  /**
   * Creates a stream on `device`.
   *
   * @param device The device the stream queues work for.
   * @param options `nonBlocking: true` gives a stream that does not wait for the default
   *   stream nor make it wait (`cudaStreamNonBlocking`): what a copy stream needs to overlap
   *   compute queued on the default stream. Order it with events.
   * @throws {TypeError} When `device` is not a Device or an option has the wrong type.
   * @throws {Error} When the device is disposed.
   * @throws {PinstreamError} When the backend cannot create a stream.
   */
  constructor(device: Device, options: StreamOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["nonBlocking"], "create Stream");
    assertDevice(device, "create a stream");
    const nonBlocking = options.nonBlocking ?? false;
    if (typeof nonBlocking !== "boolean") {
      throw new TypeError(
        `Cannot create a stream: nonBlocking must be a boolean, got ${String(nonBlocking)}`,
      );
    }
    super("Stream", device);
    this.device = device;
    this.nonBlocking = nonBlocking;
    this.isDefault = options === Stream.#DEFAULT;
    if (this.isDefault) {
      this.handle = null;
      return;
    }
    device.makeCurrent();
    const out = new BigUint64Array(1);
    device.check(
      device.lib.symbols.ps_stream_create(nonBlocking ? 1 : 0, out),
      `create a stream on ${device}`,
    );
    const handle = Deno.UnsafePointer.create(out[0])!;
    this.handle = handle;
    this.guard(handle, { device, address: out[0], kind: "stream" });
  }

  /**
   * Waits, without blocking the event loop, until all work queued on this stream is done.
   *
   * @returns A promise resolved when the stream is idle.
   * @throws {Error} When the stream is disposed.
   * @throws {PinstreamError} When queued work failed.
   */
  synchronize(): Promise<void> {
    const action = "synchronize a stream", { lib, index } = this.device;
    const wait = (msg: Uint8Array, cap: bigint) =>
      lib.symbols.ps_stream_synchronize(index, this.handle, msg, cap);
    return this.whileInFlight(action, () => waitCall(lib, action, wait));
  }

  /**
   * Makes work queued on this stream after this call wait (on the device, not the host) until
   * `event` has completed.
   *
   * @param event A recorded (or never recorded: no wait) event of the same backend.
   * @throws {TypeError} When `event` is not an Event of this device's backend.
   * @throws {Error} When the stream or the event is disposed.
   * @throws {PinstreamError} On a backend failure.
   *
   * @example Ordering a consumer stream after a producer stream
   * ```ts
   * import { Device, Event, Stream } from "@pinstream/pinstream";
   * using dev = Device.open("cpu");
   * using copy = new Stream(dev), compute = new Stream(dev);
   * using ready = new Event(dev);
   * ready.record(copy);        // after the copies queued on `copy`
   * compute.waitEvent(ready);  // kernels queued on `compute` from now on run after them
   * await compute.synchronize();
   * ```
   */
  waitEvent(event: Event): void {
    this.assertLive("wait for an event");
    assertSameLib(event, this.device, "wait for an event");
    event.assertUsable("wait for an event");
    this.device.makeCurrent(); // the default stream is the current device's
    this.device.check(
      this.device.lib.symbols.ps_stream_wait_event(this.handle, event.handle),
      "make a stream wait for an event",
    );
  }

  /**
   * Whether all work queued on this stream is done (does not wait).
   *
   * @returns true when idle.
   * @throws {Error} When the stream is disposed.
   * @throws {PinstreamError} When queued work failed.
   */
  query(): boolean {
    this.assertLive("query a stream");
    this.device.makeCurrent(); // the default stream is the current device's
    const status = this.device.lib.symbols.ps_stream_query(this.handle);
    if (status === Status.NOT_READY) return false;
    this.device.check(status, "query a stream");
    return true;
  }

  /** Internal: throws unless the stream is live and belongs to `device`. */
  assertUsableOn(device: Device, action: string): void {
    if (this.device !== device) {
      throw new TypeError(`Cannot ${action}: the stream belongs to ${this.device}, not ${device}`);
    }
    this.assertLive(action);
  }

  /** Destroys the native stream (nothing for the default stream). */
  protected release(): void {
    if (this.handle === null) return;
    this.device.check(this.device.lib.symbols.ps_stream_destroy(this.handle), "destroy a stream");
  }
}

/** Options of {@linkcode Event}. */
export interface EventOptions {
  /**
   * Record timestamps so {@linkcode Event.elapsedMs} works (default false: an event without
   * timing is cheaper to record and to wait on, as in PyTorch's `enable_timing=False`).
   */
  timing?: boolean;
  /**
   * Make {@linkcode Event.synchronize} sleep until the event fires instead of spinning a CPU
   * core (default false, as PyTorch's `blocking=False`). For host waits that run beside
   * other host work (loader workers, the training loop); costs some wake-up latency.
   */
  blocking?: boolean;
}

/**
 * A marker in a stream. Record it after some work, then wait for it on the host
 * ({@linkcode Event.synchronize}), on another stream ({@linkcode Stream.waitEvent}), or time
 * the work between two events ({@linkcode Event.elapsedMs}).
 *
 * @example Timing queued work
 * ```ts
 * import { Device, Event } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using start = new Event(dev, { timing: true }), end = new Event(dev, { timing: true });
 * start.record();
 * end.record();
 * await end.synchronize();
 * assert.ok(start.elapsedMs(end) >= 0);
 * ```
 */
export class Event extends Resource {
  /** The device this event belongs to. */
  readonly device: Device;
  /** The native handle (`cudaEvent_t`). */
  readonly handle: Deno.PointerObject;
  /** Whether the event records timestamps. */
  readonly timing: boolean;
  /** Whether host waits on the event sleep rather than spin. */
  readonly blocking: boolean;

  /**
   * Creates an event on `device`.
   *
   * @param device The device.
   * @param options `timing`: record timestamps (default false); `blocking`: host waits
   * sleep instead of spinning (default false).
   * @throws {TypeError} When `device` is not a Device or `timing` or `blocking` is not a
   * boolean.
   * @throws {Error} When the device is disposed.
   * @throws {PinstreamError} When the backend cannot create an event.
   */
  constructor(device: Device, options: EventOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["timing", "blocking"], "create Event");
    assertDevice(device, "create an event");
    const timing = options.timing ?? false;
    const blocking = options.blocking ?? false;
    for (const [name, v] of [["timing", timing], ["blocking", blocking]] as const) {
      if (typeof v !== "boolean") {
        throw new TypeError(
          `Cannot create an event: ${name} must be a boolean, got ${describe(v)}`,
        );
      }
    }
    super("Event", device);
    this.device = device;
    this.timing = timing;
    this.blocking = blocking;
    device.makeCurrent();
    const out = new BigUint64Array(1);
    // PS_EVENT_DISABLE_TIMING = 1, PS_EVENT_BLOCKING_SYNC = 2
    device.check(
      device.lib.symbols.ps_event_create((timing ? 0 : 1) | (blocking ? 2 : 0), out),
      `create an event on ${device}`,
    );
    this.handle = Deno.UnsafePointer.create(out[0])!;
    this.guard(this.handle, { device, address: out[0], kind: "event" });
  }

  /**
   * Records the event after the work queued so far on `stream`.
   *
   * @param stream The stream (default: the device's current stream).
   * @throws {TypeError} When `stream` belongs to another device.
   * @throws {Error} When the event or the stream is disposed.
   * @throws {PinstreamError} On a backend failure.
   */
  record(stream: Stream = this.device.currentStream): void {
    this.assertLive("record an event");
    assertStream(stream, this.device, "record an event");
    this.device.makeCurrent();
    this.device.check(
      this.device.lib.symbols.ps_event_record(this.handle, stream.handle),
      "record an event",
    );
  }

  /**
   * Whether the work before the last record is done (true for a never-recorded event).
   *
   * @returns true when complete.
   * @throws {Error} When the event is disposed.
   * @throws {PinstreamError} When the recorded work failed.
   */
  query(): boolean {
    this.assertLive("query an event");
    const status = this.device.lib.symbols.ps_event_query(this.handle);
    if (status === Status.NOT_READY) return false;
    this.device.check(status, "query an event");
    return true;
  }

  /**
   * Waits, without blocking the event loop, until the work before the last record is done.
   *
   * @returns A promise resolved when the event has completed.
   * @throws {Error} When the event is disposed.
   * @throws {PinstreamError} When the recorded work failed.
   */
  synchronize(): Promise<void> {
    const action = "synchronize an event", { lib } = this.device;
    const wait = (msg: Uint8Array, cap: bigint) =>
      lib.symbols.ps_event_synchronize(this.handle, msg, cap);
    return this.whileInFlight(action, () => waitCall(lib, action, wait));
  }

  /**
   * Milliseconds between this event and `end`; both recorded with timing, both completed.
   *
   * @param end The later event.
   * @returns The elapsed time in milliseconds.
   * @throws {TypeError} When `end` is not an Event of this device.
   * @throws {Error} When either event is disposed or lacks timing.
   * @throws {PinstreamError} When an event was not recorded or has not completed.
   */
  elapsedMs(end: Event): number {
    this.assertLive("measure elapsed time");
    assertSameLib(end, this.device, "measure elapsed time");
    end.assertUsable("measure elapsed time");
    if (!this.timing || !end.timing) {
      throw new Error("Cannot measure elapsed time: both events need { timing: true }");
    }
    const out = new Float32Array(1);
    this.device.check(
      this.device.lib.symbols.ps_event_elapsed_ms(this.handle, end.handle, out),
      "measure elapsed time",
    );
    return out[0];
  }

  /** Internal: throws when disposed. */
  assertUsable(action: string): void {
    this.assertLive(action);
  }

  /** Destroys the native event. */
  protected release(): void {
    this.device.check(this.device.lib.symbols.ps_event_destroy(this.handle), "destroy an event");
  }
}

function assertSameLib(event: unknown, device: Device, action: string): void {
  if (!(event instanceof Event)) {
    throw new TypeError(`Cannot ${action}: expected an Event, got ${describe(event)}`);
  }
  if (event.device.lib !== device.lib) {
    throw new TypeError(
      `Cannot ${action}: the event belongs to ${event.device}, the stream to ${device}`,
    );
  }
}

/**
 * Internal: throws unless `stream` is a live Stream of `device`.
 *
 * @param stream The value passed as a stream.
 * @param device The device the operation runs on.
 * @param action What was being done, for the message.
 */
export function assertStream(
  stream: unknown,
  device: Device,
  action: string,
): asserts stream is Stream {
  if (!(stream instanceof Stream)) {
    throw new TypeError(`Cannot ${action}: expected a Stream, got ${describe(stream)}`);
  }
  stream.assertUsableOn(device, action);
}
