/**
 * `CudaGraph`: device work recorded once and replayed with one call (a CUDA graph), so a
 * training step of a hundred kernels costs the host one enqueue.
 *
 * @module
 */

import { PinstreamError } from "./errors.ts";
import { Resource } from "./resource.ts";
import type { Device } from "./device.ts";
import type { Stream } from "./stream.ts";

/**
 * A recording of the work queued on a stream, replayed by {@linkcode CudaGraph.launch} with
 * the same pointers and kernel arguments: what changes between replays must live in device
 * memory that the recorded kernels read (inputs copied into fixed buffers, a learning rate in
 * a device scalar). Only the CUDA backend records; {@linkcode CudaGraph.capture} fails with
 * code `UNSUPPORTED` on the CPU backend, and on CUDA when the recorded work holds a call a
 * graph cannot (an allocation, a synchronize, a copy from pageable memory), so callers run
 * the work directly then.
 *
 * @example Recording is refused on the CPU backend
 * ```ts
 * import { CudaGraph, Device, PinstreamError, Stream } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using stream = new Stream(dev);
 * assert.throws(
 *   () => CudaGraph.capture(stream, () => {}),
 *   (err) => err instanceof PinstreamError && err.code === "UNSUPPORTED",
 * );
 * ```
 */
export class CudaGraph extends Resource {
  /** The stream the work was recorded on. */
  readonly stream: Stream;
  /** The native handle (`cudaGraphExec_t`). */
  readonly handle: Deno.PointerObject;

  private constructor(stream: Stream, handle: Deno.PointerObject, address: bigint) {
    super("CudaGraph", stream.device);
    this.stream = stream;
    this.handle = handle;
    this.guard(handle, { device: stream.device, address, kind: "graph" });
  }

  /**
   * Records the device work `fn` queues while `stream` is the device's current stream
   * ({@linkcode Device.useStream}): nothing of it runs now. The capture is thread-local:
   * waits on other threads (a loader's) go on meanwhile.
   *
   * @param stream A stream created on the device (the default stream cannot record).
   * @param fn Queues the work, on the current stream (ops given no `{ stream }` use it).
   * @returns The graph; launch it to run the work.
   * @throws {TypeError} When `stream` is the default stream.
   * @throws {PinstreamError} With code `UNSUPPORTED` when the backend cannot record (the CPU
   *   backend) or the work holds a call a graph cannot; whatever `fn` throws, after the
   *   recording has been ended and dropped.
   */
  static capture(stream: Stream, fn: () => void): CudaGraph {
    const action = "capture a graph";
    stream.assertUsableOn(stream.device, action);
    if (stream.isDefault) {
      throw new TypeError(`Cannot ${action}: the default stream cannot record; use a new Stream`);
    }
    const device = stream.device;
    device.makeCurrent();
    device.check(device.lib.symbols.ps_graph_capture_begin(stream.handle), action);
    const out = new BigUint64Array(1);
    let failure: unknown;
    try {
      using _ = device.useStream(stream);
      fn();
    } catch (err) {
      failure = err;
    }
    // Always ended, so the stream records nothing more; a failure of `fn` explains a failed
    // end better than the end's own message (the capture it invalidated).
    const status = device.lib.symbols.ps_graph_capture_end(stream.handle, out);
    if (failure !== undefined) {
      if (status === 0) device.lib.symbols.ps_graph_destroy(Deno.UnsafePointer.create(out[0]));
      throw failure;
    }
    device.check(status, action);
    return new CudaGraph(stream, Deno.UnsafePointer.create(out[0])!, out[0]);
  }

  /**
   * How many graphs are alive on the device's backend (the leak tests read it).
   *
   * @param device The device.
   * @returns The count (always 0 on the CPU backend, which records none).
   * @example
   * ```ts
   * import { CudaGraph, Device } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * assert.strictEqual(CudaGraph.live(dev), 0);
   * ```
   */
  static live(device: Device): number {
    const out = new BigInt64Array(1);
    device.check(device.lib.symbols.ps_graph_live(out), "count the live graphs");
    return Number(out[0]);
  }

  /**
   * Queues the recorded work (after this graph's previous launch).
   *
   * @param stream Where to queue it (default: the stream it was recorded on).
   * @throws {Error} When the graph or the stream is disposed.
   * @throws {PinstreamError} On a backend failure.
   */
  launch(stream: Stream = this.stream): void {
    this.assertLive("launch a graph");
    stream.assertUsableOn(this.stream.device, "launch a graph");
    const device = this.stream.device;
    device.makeCurrent();
    device.check(device.lib.symbols.ps_graph_launch(this.handle, stream.handle), "launch a graph");
  }

  /** Frees the graph (launches already queued still run). */
  protected release(): void {
    const device = this.stream.device;
    device.check(device.lib.symbols.ps_graph_destroy(this.handle), "destroy a graph");
  }
}

/**
 * Whether an error means that recording was refused (the backend cannot record, or the work
 * held a call a graph cannot), so the work should run directly instead.
 *
 * @param err What {@linkcode CudaGraph.capture} threw.
 * @returns true for a `PinstreamError` with code `UNSUPPORTED`.
 * @example
 * ```ts
 * import { captureRefused, PinstreamError } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(captureRefused(new Error("x")), false);
 * ```
 */
export function captureRefused(err: unknown): boolean {
  return err instanceof PinstreamError && err.code === "UNSUPPORTED";
}
