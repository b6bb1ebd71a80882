/**
 * `Tensor`: a dense, contiguous (row-major) array in device memory with a shape and a dtype.
 * Kernels take tensors; the TS wrappers check shapes and dtypes before calling.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { checkCount, describe } from "./_checks.ts";
import type { Device } from "./device.ts";
import { DeviceBuffer, isPinnedMemory } from "./memory.ts";
import type { Stream } from "./stream.ts";

/** Element types: uint8 images, int32 labels, fp16 activations, fp32 master weights. */
export type DType = "u8" | "i32" | "f16" | "f32";

/** Bytes per element of each dtype. */
export const DTYPE_BYTES: Readonly<Record<DType, number>> = Object.freeze({
  u8: 1,
  i32: 4,
  f16: 2,
  f32: 4,
});

/** The typed array holding each dtype on the host. */
export type HostArray<D extends DType = DType> = {
  u8: Uint8Array;
  i32: Int32Array;
  f16: Float16Array;
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

/** Options of {@linkcode Tensor.zeros}, {@linkcode Tensor.ones} and {@linkcode Tensor.full}. */
export interface TensorFillOptions {
  /** "f32" (default), "f16" or "i32". */
  dtype?: "f32" | "f16" | "i32";
  /** The stream to fill on (default: the device's default stream). */
  stream?: Stream;
}

/** Options of {@linkcode Tensor.arange}. */
export interface ArangeOptions extends TensorFillOptions {
  /** The first value (default 0). */
  start?: number;
  /** The spacing (default 1; not 0). */
  step?: number;
}

/** Options of {@linkcode Tensor.rand}. */
export interface RandOptions {
  /** The generator's seed: a safe integer >= 0 or a bigint below 2^64. */
  seed: number | bigint;
  /** Lower bound, inclusive (default 0). */
  low?: number;
  /** Upper bound, exclusive (default 1). */
  high?: number;
  /** "f32" (default) or "f16". */
  dtype?: "f32" | "f16";
  /** The stream to fill on (default: the device's default stream). */
  stream?: Stream;
}

/** Options of {@linkcode Tensor.randn}. */
export interface RandnOptions {
  /** The generator's seed: a safe integer >= 0 or a bigint below 2^64. */
  seed: number | bigint;
  /** Mean (default 0). */
  mean?: number;
  /** Standard deviation (default 1). */
  std?: number;
  /** "f32" (default) or "f16". */
  dtype?: "f32" | "f16";
  /** The stream to fill on (default: the device's default stream). */
  stream?: Stream;
}

const FILL_DTYPES = { f32: 0, f16: 1, i32: 2 } as const;

function seedOf(seed: unknown, action: string): bigint {
  if (typeof seed === "bigint" && seed >= 0n && seed < 1n << 64n) return seed;
  if (typeof seed === "number" && Number.isSafeInteger(seed) && seed >= 0) return BigInt(seed);
  throw new TypeError(
    `Cannot ${action}: seed must be a safe integer >= 0 or a bigint below 2^64 (random tensors ` +
      `are reproducible by construction), got ${describe(seed)}`,
  );
}

/** Allocates a tensor and fills it on the device with ps_tensor_fill. */
function fill(
  device: Device,
  shape: readonly number[],
  options: { dtype?: string; stream?: Stream },
  mode: number,
  a: number,
  b: number,
  seed: bigint,
  action: string,
): Tensor {
  const dtype = options.dtype ?? "f32";
  const code = FILL_DTYPES[dtype as keyof typeof FILL_DTYPES];
  if (code === undefined || (mode >= 2 && dtype === "i32")) {
    throw new TypeError(
      `Cannot ${action}: dtype must be ${mode >= 2 ? "f32 or f16" : "f32, f16 or i32"}, got ${
        describe(dtype)
      }`,
    );
  }
  const stream = options.stream;
  if (stream !== undefined && stream.device !== device) {
    throw new TypeError(`Cannot ${action}: the stream belongs to ${stream.device}, not ${device}`);
  }
  const t = Tensor.empty(device, shape, dtype as DType);
  try {
    device.makeCurrent();
    device.check(
      device.lib.symbols.ps_tensor_fill(
        t.numel === 0 ? null : t.pointer,
        code,
        BigInt(t.numel),
        mode,
        a,
        b,
        seed,
        0n,
        stream?.handle ?? null,
      ),
      `${action} [${t.shape.join(", ")}] ${dtype}`,
    );
  } catch (err) {
    t.dispose();
    throw err;
  }
  return t;
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
   * @param dtype "u8", "i32", "f16" or "f32".
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
        `Cannot ${action}: dtype must be u8, i32, f16 or f32, got ${describe(dtype)}`,
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
   * A tensor of zeros, written on the device (nothing is built on the host).
   *
   * @param device The device.
   * @param shape Dimensions.
   * @param options `dtype` ("f32" default, "f16" or "i32"), `stream`.
   * @returns The tensor.
   *
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.zeros(dev, [2, 3], { dtype: "f16" });
   * assert.deepStrictEqual([...await t.toHost()], [0, 0, 0, 0, 0, 0]);
   * ```
   */
  static zeros(device: Device, shape: readonly number[], options: TensorFillOptions = {}): Tensor {
    return Tensor.full(device, shape, 0, options);
  }

  /**
   * A tensor of ones, written on the device.
   *
   * @param device The device.
   * @param shape Dimensions.
   * @param options `dtype` ("f32" default, "f16" or "i32"), `stream`.
   * @returns The tensor.
   *
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.ones(dev, [4], { dtype: "i32" });
   * assert.deepStrictEqual([...await t.toHost()], [1, 1, 1, 1]);
   * ```
   */
  static ones(device: Device, shape: readonly number[], options: TensorFillOptions = {}): Tensor {
    return Tensor.full(device, shape, 1, options);
  }

  /**
   * A tensor filled with `value` (rounded to the dtype; int32 truncates toward zero), written on
   * the device.
   *
   * @param device The device.
   * @param shape Dimensions.
   * @param value The value.
   * @param options `dtype` ("f32" default, "f16" or "i32"), `stream`.
   * @returns The tensor.
   * @throws {TypeError} On a non-number value, an unknown option or dtype.
   *
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.full(dev, [3], 0.1, { dtype: "f32" });
   * assert.deepStrictEqual([...await t.toHost()], [...new Float32Array([0.1, 0.1, 0.1])]);
   * ```
   */
  static full(
    device: Device,
    shape: readonly number[],
    value: number,
    options: TensorFillOptions = {},
  ): Tensor {
    const action = "create a filled tensor";
    refuseUnknownKeys(options ?? {}, ["dtype", "stream"], action);
    if (typeof value !== "number") {
      throw new TypeError(`Cannot ${action}: value must be a number, got ${describe(value)}`);
    }
    return fill(device, shape, options, 0, value, 0, 0n, action);
  }

  /**
   * `[start, start + step, ...]` below `end` (like `torch.arange`), written on the device;
   * `Tensor.arange(dev, 5)` is `[0, 1, 2, 3, 4]`. Each element is `start + i * step` computed
   * in double precision, then rounded to the dtype.
   *
   * @param device The device.
   * @param end The end (exclusive), or with `start` in options.
   * @param options `start` (0), `step` (1, non-zero), `dtype` ("f32" default, "f16" or "i32"),
   * `stream`.
   * @returns A 1-D tensor of `ceil((end - start) / step)` elements (0 when negative).
   * @throws {RangeError} When `step` is 0 or a bound is not finite.
   *
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.arange(dev, 10, { start: 1, step: 3, dtype: "i32" });
   * assert.deepStrictEqual([...await t.toHost()], [1, 4, 7]);
   * ```
   */
  static arange(device: Device, end: number, options: ArangeOptions = {}): Tensor {
    const action = "create an arange tensor";
    refuseUnknownKeys(options ?? {}, ["start", "step", "dtype", "stream"], action);
    const start = options.start ?? 0, step = options.step ?? 1;
    for (const [name, v] of [["end", end], ["start", start], ["step", step]] as const) {
      if (typeof v !== "number" || !Number.isFinite(v)) {
        throw new RangeError(
          `Cannot ${action}: ${name} must be a finite number, got ${describe(v)}`,
        );
      }
    }
    if (step === 0) throw new RangeError(`Cannot ${action}: step must not be 0`);
    const n = Math.max(0, Math.ceil((end - start) / step));
    return fill(device, [n], options, 1, start, step, 0n, action);
  }

  /**
   * Uniform random numbers in `[low, high)` (like `torch.rand`), drawn on the device from a
   * counter-based generator: element `i` depends only on `seed` and `i`, and both backends give
   * the same bits.
   *
   * @param device The device.
   * @param shape Dimensions.
   * @param options `seed` (required: reproducible by construction), `low` (0), `high` (1),
   * `dtype` ("f32" default or "f16"), `stream`.
   * @returns The tensor.
   *
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.rand(dev, [1000], { seed: 7 });
   * const x = Array.from(await t.toHost());
   * assert.ok(x.every((v) => v >= 0 && v < 1));
   * ```
   */
  static rand(device: Device, shape: readonly number[], options: RandOptions): Tensor {
    const action = "create a random tensor";
    refuseUnknownKeys(options ?? {}, ["seed", "low", "high", "dtype", "stream"], action);
    const low = options.low ?? 0, high = options.high ?? 1;
    if (!Number.isFinite(low) || !Number.isFinite(high) || !(low <= high)) {
      throw new RangeError(
        `Cannot ${action}: low and high must be finite with low <= high, got ${low} and ${high}`,
      );
    }
    return fill(device, shape, options, 2, low, high, seedOf(options?.seed, action), action);
  }

  /**
   * Normal random numbers with `mean` and `std` (like `torch.randn`), drawn on the device
   * (Box-Muller on the counter-based generator of {@linkcode Tensor.rand}); the same bits on
   * both backends.
   *
   * @param device The device.
   * @param shape Dimensions.
   * @param options `seed` (required), `mean` (0), `std` (1, >= 0), `dtype` ("f32" default or
   * "f16"), `stream`.
   * @returns The tensor.
   *
   * @example
   * ```ts
   * import { Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using t = Tensor.randn(dev, [4096], { seed: 1, mean: 2, std: 0.5 });
   * const x = Array.from(await t.toHost());
   * const mean = x.reduce((a, b) => a + b, 0) / x.length;
   * assert.ok(Math.abs(mean - 2) < 0.05);
   * ```
   */
  static randn(device: Device, shape: readonly number[], options: RandnOptions): Tensor {
    const action = "create a normal random tensor";
    refuseUnknownKeys(options ?? {}, ["seed", "mean", "std", "dtype", "stream"], action);
    const mean = options.mean ?? 0, std = options.std ?? 1;
    if (!Number.isFinite(mean) || !Number.isFinite(std) || std < 0) {
      throw new RangeError(
        `Cannot ${action}: mean must be finite and std finite and >= 0, got ${mean} and ${std}`,
      );
    }
    return fill(device, shape, options, 3, mean, std, seedOf(options?.seed, action), action);
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
   * @returns A Uint8Array, Int32Array, Float16Array or Float32Array by dtype.
   * @throws {Error} When the tensor is disposed.
   * @throws {PinstreamError} When queued work failed.
   */
  async toHost(options: ToHostOptions = {}): Promise<HostArray> {
    refuseUnknownKeys(options ?? {}, ["stream"], "copy a tensor to the host");
    const stream = options.stream ?? this.device.defaultStream;
    this.buffer.pointerAt(0, "copy a tensor to the host");
    // Wait first (off-thread), so the copy below never blocks the JS thread behind queued
    // work: on CUDA a copy into pageable memory returns only once it is done.
    await stream.synchronize();
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
