/**
 * Any batch to the device: PyTorch's `pin_memory` + `.to(device, non_blocking=True)` over a
 * DataLoader's batches, whatever they hold. Every typed array of a batch (at any depth of
 * plain objects and arrays) is staged in reused pinned memory, copied on a copy stream, and
 * handed to the compute stream by an event, as the image path does; the consumer gets the same
 * structure with device {@linkcode Tensor}s in place of the arrays.
 *
 * ## Lifetimes
 *
 * - **Host staging** (one pinned buffer per slot, sized by the largest batch seen and grown
 *   when a larger one comes): rewritten by the host only after the copy event of its previous
 *   batch fired.
 * - **Device tensors** of a slot: valid until the next `next()`. The copy that refills them
 *   waits (on the device) for an event recorded on the compute stream at that call, so work
 *   the consumer queued before it still reads the old batch.
 * - **The loader's batch**: free as soon as its bytes are in the staging buffer (a ring batch
 *   goes back to the loader at once).
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { HostBuffer } from "../ffi/memory.ts";
import { Stream } from "../ffi/stream.ts";
import { type DType, Tensor } from "../ffi/tensor.ts";
import type { DataLoader } from "../loader/data_loader.ts";
import { batchSamples } from "../loader/_batch_samples.ts";
import { RingBatch } from "../loader/ring.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import { range } from "../internal/trace.ts";
import type { PipelineStats } from "./prefetcher.ts";
import { type Queued, RingLease, type RingSlot, SlotEpoch, SlotRing } from "./_slot_ring.ts";

/** Options of {@linkcode BatchPrefetcher}. */
export interface BatchPrefetcherOptions {
  /** Batches in flight on the device besides the one the consumer holds (default 2). */
  depth?: number;
  /** The compute stream the batches are handed to (default: the device's default stream). */
  stream?: Stream;
  /** Keep device memory, pinned staging and streams across epochs (default false). */
  persistent?: boolean;
  /**
   * "auto" (default): where device memory is host memory (the CPU backend), each array is
   * copied straight into its tensor, without pinned staging. "always": stage and copy as on
   * a GPU (tests use it to run the GPU path on the CPU backend).
   */
  copy?: "auto" | "always";
}

/**
 * A batch with every typed array moved to the device: what {@linkcode BatchPrefetcher}
 * yields for loader batches of type `B`. A `Uint8Array`, `Int32Array`, `Float16Array` or
 * `Float32Array` (or a `{ data, shape }` pair of one) becomes a {@linkcode Tensor}; a
 * {@linkcode RingBatch} becomes an object of its fields' tensors; plain objects and arrays
 * keep their keys; anything else (numbers, strings) is passed through.
 *
 * @typeParam B the loader's batch type
 */
export type OnDevice<B> = B extends RingBatch<infer F> ? { -readonly [K in keyof F]: Tensor }
  : B extends Uint8Array | Int32Array | Float16Array | Float32Array ? Tensor
  : B extends { data: Uint8Array | Int32Array | Float16Array | Float32Array; shape: number[] }
    ? Tensor
  : B extends ((...args: never[]) => unknown) ? B
  : B extends readonly unknown[] ? { -readonly [K in keyof B]: OnDevice<B[K]> }
  : B extends object ? { -readonly [K in keyof B]: OnDevice<B[K]> }
  : B;

const DEFAULT_DEPTH = 2;
/** Staging offsets of the arrays of a batch: 256-aligned, as DMA engines like. */
const ALIGN = 256;

const OPTION_KEYS: Record<keyof BatchPrefetcherOptions, true> = {
  depth: true,
  stream: true,
  persistent: true,
  copy: true,
};
const OPTION_NAMES = Object.keys(OPTION_KEYS);

/** One typed array of a batch, where it goes. */
interface Leaf {
  path: string;
  bytes: Uint8Array;
  dtype: DType;
  shape: number[];
  /** Byte offset in the slot's staging buffer. */
  at: number;
}

interface Slot extends RingSlot {
  staging: HostBuffer | undefined;
  /** Device tensors by path, dtype and shape; `use` is the fill that last used each. */
  tensors: Map<string, { tensor: Tensor; use: number }>;
  fills: number;
}

interface InFlight extends Queued<Slot> {
  /** The batch's structure, with the arrays to replace. */
  value: unknown;
  tensors: Tensor[];
}

/**
 * Moves any DataLoader's batches to a device, `depth` batches ahead: the DataPrefetcher of
 * PyTorch training scripts (pinned memory, non-blocking copies on a side stream, the compute
 * stream waiting on an event). Iterate it once per epoch (`for await`); each iteration starts
 * an epoch of the loader.
 *
 * Accepted batches: a {@linkcode RingBatch} (the zero-copy path: one tensor per dataset field,
 * `[size, ...field shape]`), or any value built of plain objects and arrays whose leaves are
 * `Uint8Array`, `Int32Array`, `Float16Array` or `Float32Array` (the generic path with
 * `collate`). A `Float64Array`, what the default collate makes of numbers, arrives as f32: each
 * value rounded to the nearest float32 (`Math.fround`; past float32's range, ±Infinity), as
 * PyTorch code calls `.float()` on a collated float64 tensor. A collated array is flat, so its tensor gets the shape `[n]` (one element per
 * sample) or `[n, length / n]`, `n` being the batch's sample count; a collate that returns
 * `{ data, shape }` in place of an array sets the tensor's shape itself. Other leaves (numbers,
 * strings, booleans, null) pass through. Other typed arrays are refused, naming their path:
 * there is no device dtype for them (collate those values into one of the four).
 *
 * The tensors of a batch stay valid until the next `next()`; do not dispose them (the
 * prefetcher reuses and frees them).
 *
 * @typeParam B the loader's batch type
 *
 * @example Audio frames, a label and a mask, collated by the loader
 * ```ts
 * import { BatchPrefetcher, DataLoader, Device } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * using device = Device.open("cpu");
 * const dataset = {
 *   length: 5,
 *   get: (i: number) => ({
 *     audio: new Float32Array(16).fill(i),
 *     label: new Int32Array([i % 2]),
 *     mask: new Uint8Array(4).fill(1),
 *     name: `clip${i}`,
 *   }),
 * };
 * await using loader = new DataLoader(dataset, { batchSize: 2 });
 * await using prefetcher = new BatchPrefetcher(loader, device);
 * const shapes = [];
 * for await (const batch of prefetcher) {
 *   shapes.push(batch.audio.shape);
 *   assert.strictEqual(batch.label.dtype, "i32");
 *   assert.deepStrictEqual(batch.name.length, batch.label.shape[0]);
 * }
 * assert.deepStrictEqual(shapes, [[2, 16], [2, 16], [1, 16]]);
 * assert.strictEqual(prefetcher.stats?.samples, 5);
 * ```
 */
export class BatchPrefetcher<B = unknown> implements AsyncIterable<OnDevice<B>>, AsyncDisposable {
  /** The loader batches come from. */
  readonly loader: DataLoader<B>;
  /** The device batches go to. */
  readonly device: Device;
  /** Batches in flight besides the one the consumer holds. */
  readonly depth: number;
  /** Whether batches are always staged and copied, or copied straight where the backend allows. */
  readonly copy: "auto" | "always";
  /** Every finished epoch's stats, oldest first. */
  readonly history: PipelineStats[] = [];
  #userStream: Stream | undefined;
  #persistent: boolean;
  readonly #lease = new RingLease<SlotRing<Slot>, EpochRun<B>>(this.history);
  #disposed = false;

  /**
   * Checks the options; nothing native is allocated until the first epoch starts.
   *
   * @param loader Any DataLoader.
   * @param device The target device.
   * @param options See {@linkcode BatchPrefetcherOptions}.
   * @throws {TypeError} When an option key is unknown or an option has the wrong type.
   * @throws {RangeError} When `depth` or `copy` is out of range.
   */
  constructor(loader: DataLoader<B>, device: Device, options: BatchPrefetcherOptions = {}) {
    const action = "create a BatchPrefetcher";
    if (options === null || typeof options !== "object") {
      throw new TypeError(`Cannot ${action}: options must be an object, got ${String(options)}`);
    }
    refuseUnknownKeys(options, OPTION_NAMES, action);
    this.loader = loader;
    this.device = device;
    const depth = options.depth ?? DEFAULT_DEPTH;
    if (!Number.isInteger(depth) || depth < 1 || depth > 64) {
      throw new RangeError(`Cannot ${action}: depth must be an integer in 1..64, got ${depth}`);
    }
    this.depth = depth;
    const copy = options.copy ?? "auto";
    if (copy !== "auto" && copy !== "always") {
      throw new RangeError(`Cannot ${action}: copy must be one of auto, always, got ${copy}`);
    }
    this.copy = copy;
    if (options.stream !== undefined && !(options.stream instanceof Stream)) {
      throw new TypeError(`Cannot ${action}: stream must be a Stream, got ${options.stream}`);
    }
    this.#userStream = options.stream;
    if (options.persistent !== undefined && typeof options.persistent !== "boolean") {
      throw new TypeError(
        `Cannot ${action}: persistent must be a boolean, got ${options.persistent}`,
      );
    }
    this.#persistent = options.persistent ?? false;
  }

  /** The epoch in progress, else the last finished one (undefined before any). */
  get stats(): PipelineStats | undefined {
    return this.#lease.stats();
  }

  /**
   * Starts an epoch of the loader and yields its batches on the device. Leaving the loop
   * early (break, throw) stops the loader's epoch and frees every pinned and device buffer
   * once the copies in flight have completed.
   *
   * @returns An async iterator over device batches.
   * @throws {Error} When disposed, or when another epoch of this prefetcher is running.
   */
  [Symbol.asyncIterator](): AsyncIterableIterator<OnDevice<B>> {
    if (this.#disposed) throw new Error("Cannot iterate: the BatchPrefetcher is disposed");
    if (this.#lease.active !== undefined) {
      throw new Error("Cannot iterate: an epoch of this BatchPrefetcher is still running");
    }
    this.#lease.ring ??= openRing(this.device, this.depth, this.#userStream);
    const run = new EpochRun<B>(this, this.#lease.ring);
    this.#lease.active = run;
    return run;
  }

  /** Frees every native resource (after the copies in flight) and stops a running epoch. */
  async dispose(): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    await this.#lease.active?.return();
    await this._freeResources();
  }

  /** Same as `dispose()`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.dispose();
  }

  /** @internal Whether arrays are copied straight into their tensors (no staging). */
  _direct(): boolean {
    return this.device.kind === "cpu" && this.copy === "auto";
  }

  /** @internal Called by an epoch when it ends. */
  async _epochEnded(run: EpochRun<B>, stats: PipelineStats, early: boolean): Promise<void> {
    await this.#lease.ended(run, stats, early || !this.#persistent || this.#disposed);
  }

  /** @internal */
  async _freeResources(): Promise<void> {
    await this.#lease.free();
  }
}

/** The native side: streams and slots, each slot's staging made at its first fill. */
function openRing(device: Device, depth: number, userStream: Stream | undefined): SlotRing<Slot> {
  return new SlotRing<Slot>(device, depth, userStream, {
    slot: (_keep, events) => ({ ...events, staging: undefined, tensors: new Map(), fills: 0 }),
    release: (s, dispose) => {
      for (const { tensor } of s.tensors.values()) dispose(tensor);
      s.tensors.clear();
      dispose(s.staging);
    },
    freeMessage: "Cannot free buffers",
  });
}

const DEVICE_DTYPES: ReadonlyArray<[abstract new (...args: never[]) => unknown, DType]> = [
  [Uint8Array, "u8"],
  [Int32Array, "i32"],
  [Float16Array, "f16"],
  [Float32Array, "f32"],
];

function deviceDtype(v: ArrayBufferView): DType | undefined {
  for (const [ctor, dtype] of DEVICE_DTYPES) if (v.constructor === ctor) return dtype;
  return undefined;
}

function isPlainObject(v: object): boolean {
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

/** A collate's `{ data, shape }`: exactly those keys, a typed array and a plain array. */
function isShaped(v: object): v is { data: ArrayBufferView; shape: unknown[] } {
  if (!isPlainObject(v)) return false;
  const keys = Object.keys(v);
  const o = v as { data?: unknown; shape?: unknown };
  return keys.length === 2 && ArrayBuffer.isView(o.data) && Array.isArray(o.shape);
}

function refuse(path: string, what: string): never {
  throw new TypeError(
    `Cannot move ${path} to the device: ${what} has no device dtype (u8, i32, f16, f32); ` +
      `collate it into a Uint8Array, Int32Array, Float16Array or Float32Array`,
  );
}

/**
 * The typed arrays of a batch, in walk order, with their tensor shapes. `n` is the batch's
 * sample count (undefined without batching: shapes are then `[length]`).
 */
function batchLeaves(batch: unknown, n: number | undefined): Leaf[] {
  const out: Leaf[] = [];
  const ancestors = new Set<object>();
  const add = (path: string, v: ArrayBufferView, shape: number[] | undefined) => {
    // The default collate makes numbers a Float64Array; the device has no f64.
    if (v instanceof Float64Array) v = new Float32Array(v);
    const dtype = deviceDtype(v);
    if (dtype === undefined) refuse(path, `a ${v.constructor.name}`);
    const length = (v as Uint8Array).length;
    if (shape === undefined) {
      if (n === undefined || length === n) shape = [length];
      else if (n > 0 && length % n === 0) shape = [n, length / n];
      else {
        throw new RangeError(
          `Cannot move ${path} to the device: its ${length} elements are not a multiple of ` +
            `the batch's ${n} samples; have collate return { data, shape } to give its shape`,
        );
      }
    }
    out.push({
      path,
      bytes: new Uint8Array(v.buffer, v.byteOffset, v.byteLength),
      dtype,
      shape,
      at: 0,
    });
  };
  const walk = (v: unknown, path: string) => {
    if (typeof v !== "object" || v === null) return;
    if (ArrayBuffer.isView(v)) return add(path, v, undefined);
    if (v instanceof ArrayBuffer || v instanceof SharedArrayBuffer) {
      refuse(path, `an untyped ${v.constructor.name}`);
    }
    if (!Array.isArray(v) && !isPlainObject(v)) return;
    if (ancestors.has(v)) {
      throw new TypeError(`Cannot move ${path} to the device: the batch contains itself there`);
    }
    if (isShaped(v)) {
      const shape = v.shape;
      const length = (v.data as Uint8Array).length;
      if (
        !shape.every((d) => Number.isSafeInteger(d) && (d as number) >= 0) ||
        shape.reduce((a: number, d) => a * (d as number), 1) !== length
      ) {
        throw new RangeError(
          `Cannot move ${path} to the device: shape [${shape.join(", ")}] does not hold its ` +
            `${length} elements`,
        );
      }
      return add(`${path}.data`, v.data, shape as number[]);
    }
    ancestors.add(v);
    if (Array.isArray(v)) v.forEach((x, i) => walk(x, `${path}[${i}]`));
    else for (const [k, x] of Object.entries(v)) walk(x, `${path}.${k}`);
    ancestors.delete(v);
  };
  walk(batch, "batch");
  return out;
}

/** `batch` with its leaves (in {@linkcode batchLeaves}'s order) replaced by `tensors`. */
function rebuild(batch: unknown, tensors: readonly Tensor[]): unknown {
  let k = 0;
  const walk = (v: unknown): unknown => {
    if (typeof v !== "object" || v === null) return v;
    if (ArrayBuffer.isView(v)) return tensors[k++];
    if (!Array.isArray(v) && !isPlainObject(v)) return v;
    if (isShaped(v)) return tensors[k++];
    if (Array.isArray(v)) return v.map(walk);
    const out: Record<string, unknown> = {};
    for (const [key, x] of Object.entries(v)) out[key] = walk(x);
    return out;
  };
  return walk(batch);
}

/** One epoch: the async iterator handed to `for await`. */
class EpochRun<B> extends SlotEpoch<Slot, InFlight, OnDevice<B>> {
  readonly #p: BatchPrefetcher<B>;

  constructor(p: BatchPrefetcher<B>, r: SlotRing<Slot>) {
    super(r, p.depth, p.loader.epoch, p.loader[Symbol.asyncIterator]());
    this.#p = p;
  }

  protected deliver(b: InFlight): OnDevice<B> {
    this.ring.compute.waitEvent(b.slot.copyDone);
    return rebuild(b.value, b.tensors) as OnDevice<B>;
  }

  protected ended(stats: PipelineStats, early: boolean): Promise<void> {
    return this.#p._epochEnded(this, stats, early);
  }

  /** Pulls one loader batch and queues its copy into the next slot; false at the end. */
  protected async submit(): Promise<boolean> {
    const th = performance.now();
    const r = await this.source.next();
    this.hostWaitMs += performance.now() - th;
    if (r.done) {
      this.exhausted = true;
      return false;
    }
    let value: unknown = r.value, samples: number | undefined, ring: RingBatch | undefined;
    try {
      if (value instanceof RingBatch) {
        ring = value;
        samples = ring.size;
        // One tensor per dataset field, [size, ...field shape] (the ring knows the shapes).
        const fields: Record<string, unknown> = {};
        for (const [name, data] of Object.entries(ring.fields)) {
          fields[name] = { data, shape: [ring.size, ...ring.ring.field(name).sampleShape] };
        }
        value = fields;
      } else {
        samples = batchSamples(value);
      }
      // The loader's own rule: no batching only for batchSize null with a sampler (a
      // batchSampler batches with batchSize null).
      const loader = this.#p.loader;
      const batching = !(loader.batchSize === null && loader.sampler !== undefined);
      const leaves = batchLeaves(value, batching ? samples : undefined);
      const slot = await this.#claim(leaves);
      const tensors = this.#fill(slot, leaves);
      this.queue.push({ slot, value, tensors, size: samples ?? 1 });
      return true;
    } finally {
      // The bytes are staged (or the batch is refused): the ring slot is free.
      ring?.release();
    }
  }

  /**
   * The next slot in ring order, its staging buffer large enough and its tensors shaped for
   * `leaves`, ordered after every use of its previous batch.
   */
  async #claim(leaves: Leaf[]): Promise<Slot> {
    const p = this.#p;
    const slot = this.nextSlot();
    // The host rewrites the staging buffer: its previous copy must be done.
    await this.accountCopy(slot, true);
    let bytes = 0;
    for (const leaf of leaves) {
      leaf.at = bytes;
      bytes = Math.ceil((bytes + leaf.bytes.byteLength) / ALIGN) * ALIGN;
    }
    if (!p._direct() && (slot.staging?.bytes ?? 0) < bytes) {
      // The previous copy out of it is done (above); nothing else reads it.
      slot.staging?.dispose();
      slot.staging = undefined;
      slot.staging = HostBuffer.alloc(p.device, bytes);
    }
    const fill = ++slot.fills;
    const missing = leaves.filter((l) => !slot.tensors.has(key(l)));
    if (missing.length > 0) {
      // Tensors of the last two fills stay (a short last batch does not evict the full
      // ones); older ones go, after the consumer's work on the slot is done.
      const stale = [...slot.tensors].filter(([, t]) => t.use < fill - 1);
      if (stale.length > 0) {
        if (slot.freeRecorded) await this.waitForDevice(slot.free.synchronize());
        for (const [k, t] of stale) {
          slot.tensors.delete(k);
          t.tensor.dispose();
        }
      }
      for (const l of missing) {
        slot.tensors.set(key(l), { tensor: Tensor.empty(p.device, l.shape, l.dtype), use: fill });
      }
    }
    this.orderAfterFree(slot);
    return slot;
  }

  /** Stages the arrays and queues their copies on the copy stream. */
  #fill(slot: Slot, leaves: Leaf[]): Tensor[] {
    const copy = this.ring.copyStream, fill = slot.fills, direct = this.#p._direct();
    const tensors = leaves.map((l) => {
      const t = slot.tensors.get(key(l))!;
      t.use = fill;
      return t.tensor;
    });
    if (!direct) {
      using _ = range("pipeline.stage");
      const u8 = slot.staging!.u8;
      for (const l of leaves) u8.set(l.bytes, l.at);
    }
    using _ = range("pipeline.copy", { stream: copy });
    slot.copyStart.record(copy);
    leaves.forEach((l, i) => {
      const bytes = l.bytes.byteLength;
      if (bytes === 0) return;
      // Direct (the CPU backend): its streams run synchronously, the array is read now.
      if (direct) tensors[i].buffer.copyFrom(l.bytes, { stream: copy, bytes });
      else tensors[i].buffer.copyFrom(slot.staging!, { stream: copy, srcOffset: l.at, bytes });
      this.copyBytes += bytes;
    });
    slot.copyDone.record(copy);
    slot.copyAccounted = false;
    return tensors;
  }
}

function key(l: Leaf): string {
  return `${l.path}|${l.dtype}|${l.shape.join(",")}`;
}
