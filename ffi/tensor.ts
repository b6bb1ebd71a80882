/**
 * `Tensor`: a dense, contiguous (row-major) array in device memory with a shape and a dtype.
 * Kernels take tensors; the ops (ops/) check shapes and dtypes before calling them, and
 * ops/fill.ts makes tensors born on the device (`zeros`, `arange`, `randn`, ...).
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { checkCount, describe } from "./_checks.ts";
import type { Device } from "./device.ts";
import { DeviceBuffer, isPinnedMemory } from "./memory.ts";
import type { Stream } from "./stream.ts";

/**
 * Element types: uint8 images, int32 labels, fp16 or bf16 activations, fp32 master weights.
 * JavaScript has no bfloat16 array: a "bf16" tensor reads back ({@linkcode Tensor.toHost}) as
 * a Float32Array, widened exactly, and is made on the device (ops `cast`, `zeros`, ...).
 */
export type DType = "u8" | "i32" | "f16" | "bf16" | "f32";

/** Bytes per element of each dtype. */
export const DTYPE_BYTES: Readonly<Record<DType, number>> = Object.freeze({
  u8: 1,
  i32: 4,
  f16: 2,
  bf16: 2,
  f32: 4,
});

/** The typed array holding each dtype on the host. */
export type HostArray<D extends DType = DType> = {
  u8: Uint8Array;
  i32: Int32Array;
  f16: Float16Array;
  bf16: Float32Array;
  f32: Float32Array;
}[D];

/** Options of {@linkcode Tensor.toHost}. */
export interface ToHostOptions {
  /** The stream the tensor's producers ran on (default: the device's default stream). */
  stream?: Stream;
}

const ARRAYS = {
  u8: Uint8Array,
  i32: Int32Array,
  f16: Float16Array,
  f32: Float32Array,
} as const;

function dtypeOf(data: unknown): DType | undefined {
  if (data instanceof Uint8Array) return "u8";
  if (data instanceof Int32Array) return "i32";
  if (data instanceof Float16Array) return "f16";
  if (data instanceof Float32Array) return "f32";
  return undefined;
}

function checkShape(shape: unknown, action: string): { shape: readonly number[]; numel: number } {
  if (!Array.isArray(shape)) {
    throw new TypeError(
      `Cannot ${action}: shape must be an array of integers, got ${describe(shape)}`,
    );
  }
  let numel = 1;
  for (const d of shape) {
    checkCount(d, "every dimension", action);
    numel *= d;
  }
  if (!Number.isSafeInteger(numel)) {
    throw new RangeError(`Cannot ${action}: shape [${shape.join(", ")}] has too many elements`);
  }
  return { shape: Object.freeze([...shape]), numel };
}

/**
 * A contiguous array in device memory. Owns its {@linkcode DeviceBuffer}: disposing the tensor
 * frees it (and disposing the device disposes the buffer).
 *
 * @example Uploading, reading back
 * ```ts
 * import { Device, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = Tensor.fromHost(dev, new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
 * assert.deepStrictEqual(t.shape, [2, 3]);
 * assert.strictEqual(t.dtype, "f32");
 * const back = await t.toHost();
 * assert.deepStrictEqual([...back], [1, 2, 3, 4, 5, 6]);
 * ```
 */
export class Tensor implements Disposable {
  /** The device holding the data. */
  readonly device: Device;
  /** The element type. */
  readonly dtype: DType;
  /** The dimensions, outermost first (frozen). */
  readonly shape: readonly number[];
  /** The number of elements (product of `shape`; 1 for a scalar `[]`). */
  readonly numel: number;
  /** `numel * DTYPE_BYTES[dtype]`. */
  readonly byteLength: number;
  /** The device memory (exactly `byteLength` bytes). */
  readonly buffer: DeviceBuffer;

  private constructor(buffer: DeviceBuffer, shape: readonly number[], numel: number, dtype: DType) {
    this.device = buffer.device;
    this.buffer = buffer;
    this.shape = shape;
    this.numel = numel;
    this.dtype = dtype;
    this.byteLength = buffer.bytes;
  }

  /**
   * A tensor with unspecified contents.
   *
   * @param device The device.
   * @param shape Dimensions, each a non-negative integer (`[]` is a scalar).
   * @param dtype "u8", "i32", "f16", "bf16" or "f32".
   * @returns The tensor.
   * @throws {TypeError} When `dtype` is unknown or `shape` is not an array of numbers.
   * @throws {RangeError} When a dimension is negative or fractional.
   * @throws {PinstreamError} When the memory cannot be allocated.
   *
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.empty(dev, [8, 3, 32, 32], "f16");
   * assert.strictEqual(t.byteLength, 8 * 3 * 32 * 32 * 2);
   * ```
   */
  static empty(device: Device, shape: readonly number[], dtype: DType): Tensor {
    const action = "create a tensor";
    if (!(dtype in DTYPE_BYTES)) {
      throw new TypeError(
        `Cannot ${action}: dtype must be u8, i32, f16, bf16 or f32, got ${describe(dtype)}`,
      );
    }
    const s = checkShape(shape, action);
    const buffer = DeviceBuffer.alloc(device, s.numel * DTYPE_BYTES[dtype]);
    return new Tensor(buffer, s.shape, s.numel, dtype);
  }

  /**
   * A tensor holding a copy of `data` (dtype from the array type). The copy is queued on the
   * default stream and the array may be reused as soon as this returns.
   *
   * @param device The device.
   * @param data A Uint8Array, Int32Array, Float16Array or Float32Array.
   * @param shape Dimensions (default `[data.length]`); their product must be `data.length`.
   * @returns The tensor.
   * @throws {TypeError} When `data` is another kind of array.
   * @throws {RangeError} When `shape` does not match `data.length`.
   */
  static fromHost(device: Device, data: HostArray, shape?: readonly number[]): Tensor {
    const action = "create a tensor from host data";
    const dtype = dtypeOf(data);
    if (dtype === undefined) {
      throw new TypeError(
        `Cannot ${action}: expected a Uint8Array, Int32Array, Float16Array or Float32Array, got ${
          describe(data)
        }`,
      );
    }
    const s = checkShape(shape ?? [data.length], action);
    if (s.numel !== data.length) {
      throw new RangeError(
        `Cannot ${action}: shape [${
          s.shape.join(", ")
        }] holds ${s.numel} elements, data has ${data.length}`,
      );
    }
    const t = Tensor.empty(device, s.shape, dtype);
    try {
      // A view of pinned memory would be copied asynchronously: copy it out first, so that
      // the caller may reuse `data` at once, as with any other array.
      t.buffer.copyFrom(isPinnedMemory(data.buffer) ? data.slice() : data);
    } catch (err) {
      t.dispose();
      throw err;
    }
    return t;
  }

  /**
   * Elements `start` to `start + length` of dimension 0, as a tensor over the same memory
   * (PyTorch's `narrow` along the outermost dimension, where a slice stays contiguous). Writes
   * through either are seen by the other. Disposing the result frees nothing; disposing this
   * tensor disposes it.
   *
   * @param dim 0 (other dimensions would not be contiguous).
   * @param start The first index along dimension 0.
   * @param length How many.
   * @returns The view, shaped `[length, ...shape.slice(1)]`.
   * @throws {RangeError} When `dim` is not 0, the tensor is a scalar or the range does not fit.
   * @throws {Error} When the tensor is disposed.
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.fromHost(dev, new Int32Array([1, 2, 3, 4, 5, 6]), [3, 2]);
   * const mid = t.narrow(0, 1, 1);
   * assert.deepStrictEqual(mid.shape, [1, 2]);
   * assert.deepStrictEqual([...await mid.toHost()], [3, 4]);
   * ```
   */
  narrow(dim: number, start: number, length: number): Tensor {
    const action = "narrow a tensor";
    if (dim !== 0) {
      throw new RangeError(`Cannot ${action}: only dimension 0 stays contiguous, got ${dim}`);
    }
    if (this.shape.length === 0) throw new RangeError(`Cannot ${action}: it is a scalar`);
    checkCount(start, "start", action);
    checkCount(length, "length", action);
    if (start + length > this.shape[0]) {
      throw new RangeError(
        `Cannot ${action}: [${start}, ${start + length}) is outside dimension 0 of [${this.shape}]`,
      );
    }
    const row = this.shape.slice(1).reduce((a, b) => a * b, 1), size = DTYPE_BYTES[this.dtype];
    const buffer = this.buffer.view(start * row * size, length * row * size);
    return new Tensor(
      buffer,
      Object.freeze([length, ...this.shape.slice(1)]),
      length * row,
      this.dtype,
    );
  }

  /** The device address of the first element, for kernels. @throws {Error} When disposed. */
  get pointer(): Deno.PointerValue {
    return this.buffer.pointerAt(0, "use a tensor");
  }

  /** Whether the tensor (its buffer) was disposed. */
  get disposed(): boolean {
    return this.buffer.disposed;
  }

  /**
   * Copies the tensor to a new host array once the work queued on `stream` is done, without
   * blocking the event loop while waiting.
   *
   * @param options `stream`: where the tensor's producers ran (default: the default stream).
   * @returns A Uint8Array, Int32Array, Float16Array or Float32Array by dtype (bf16: a
   *   Float32Array of the exact values).
   * @throws {Error} When the tensor is disposed.
   * @throws {PinstreamError} When queued work failed.
   */
  async toHost(options: ToHostOptions = {}): Promise<HostArray> {
    refuseUnknownKeys(options ?? {}, ["stream"], "copy a tensor to the host");
    const stream = options.stream ?? this.device.currentStream;
    this.buffer.pointerAt(0, "copy a tensor to the host");
    // Wait first (off-thread), so the copy below never blocks the JS thread behind queued
    // work: on CUDA a copy into pageable memory returns only once it is done.
    await stream.synchronize();
    if (this.dtype === "bf16") {
      const bits = new Uint16Array(this.numel);
      this.buffer.copyTo(bits, { stream });
      await stream.synchronize();
      const wide = new Uint32Array(this.numel);
      for (let i = 0; i < bits.length; i++) wide[i] = bits[i] << 16;
      return new Float32Array(wide.buffer);
    }
    const out = new ARRAYS[this.dtype](this.numel);
    this.buffer.copyTo(out, { stream });
    await stream.synchronize();
    return out;
  }

  /** Frees the device memory. Idempotent. */
  dispose(): void {
    this.buffer.dispose();
  }

  /** Same as `dispose()`. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
