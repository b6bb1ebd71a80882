/**
 * Tensors born on the device: {@linkcode zeros}, {@linkcode ones}, {@linkcode full},
 * {@linkcode arange}, {@linkcode rand} and {@linkcode randn} (PyTorch's factories) allocate a
 * tensor and fill it with one kernel (ps_tensor_fill) through the device's backend
 * (ops/backend.ts); nothing is built on the host. Element i depends only on the mode, its
 * numbers, the seed and i, so both native backends give the same bits.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import type { Device } from "../ffi/device.ts";
import type { Stream } from "../ffi/stream.ts";
import { type DType, DTYPE_BYTES, Tensor } from "../ffi/tensor.ts";
import { queue, streamOn } from "./_launch.ts";

/** Options of {@linkcode zeros}, {@linkcode ones} and {@linkcode full}. */
export interface TensorFillOptions {
  /** "f32" (default), "f16", "bf16" or "i32". */
  dtype?: "f32" | "f16" | "bf16" | "i32";
  /** The stream to fill on (default: the device's default stream). */
  stream?: Stream;
}

/** Options of {@linkcode arange}. */
export interface ArangeOptions extends TensorFillOptions {
  /** The first value (default 0). */
  start?: number;
  /** The spacing (default 1; not 0). */
  step?: number;
}

/** Options of {@linkcode rand}. */
export interface RandOptions {
  /** The generator's seed: a safe integer >= 0 or a bigint below 2^64. */
  seed: number | bigint;
  /** Lower bound, inclusive (default 0). */
  low?: number;
  /** Upper bound, exclusive (default 1). */
  high?: number;
  /** "f32" (default), "f16" or "bf16". */
  dtype?: "f32" | "f16" | "bf16";
  /** The stream to fill on (default: the device's default stream). */
  stream?: Stream;
}

/** Options of {@linkcode randn}. */
export interface RandnOptions {
  /** The generator's seed: a safe integer >= 0 or a bigint below 2^64. */
  seed: number | bigint;
  /** Mean (default 0). */
  mean?: number;
  /** Standard deviation (default 1). */
  std?: number;
  /** "f32" (default), "f16" or "bf16". */
  dtype?: "f32" | "f16" | "bf16";
  /** The stream to fill on (default: the device's default stream). */
  stream?: Stream;
}

/** A short description of a value for error messages. */
function describe(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "object") return value.constructor?.name ?? "object";
  if (typeof value === "string") return JSON.stringify(value);
  return `${typeof value} ${String(value)}`;
}

const FILL_DTYPES = { f32: 0, f16: 1, i32: 2, bf16: 3 } as const;

function seedOf(seed: unknown, action: string): bigint {
  if (typeof seed === "bigint" && seed >= 0n && seed < 1n << 64n) return seed;
  if (typeof seed === "number" && Number.isSafeInteger(seed) && seed >= 0) return BigInt(seed);
  throw new TypeError(
    `Cannot ${action}: seed must be a safe integer >= 0 or a bigint below 2^64 (random tensors ` +
      `are reproducible by construction), got ${describe(seed)}`,
  );
}

/** Allocates a tensor and fills it on the device (`tensorFill`, ps_tensor_fill). */
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
      `Cannot ${action}: dtype must be ${
        mode >= 2 ? "f32, f16 or bf16" : "f32, f16, bf16 or i32"
      }, got ${describe(dtype)}`,
    );
  }
  const stream = streamOn(options, device, action);
  const t = Tensor.empty(device, shape, dtype as DType);
  try {
    queue(device, "tensorFill", {
      dst: t,
      dtype: code,
      count: t.numel,
      mode,
      a,
      b,
      seed,
      offset: 0n,
      stream,
    }, `${action} [${t.shape.join(", ")}] ${dtype}`);
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
 * @param options `dtype` ("f32" default, "f16", "bf16" or "i32"), `stream`.
 * @returns The tensor.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { zeros } from "./fill.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = zeros(dev, [2, 3], { dtype: "f16" });
 * assert.deepStrictEqual([...await t.toHost()], [0, 0, 0, 0, 0, 0]);
 * ```
 */
export function zeros(
  device: Device,
  shape: readonly number[],
  options: TensorFillOptions = {},
): Tensor {
  return full(device, shape, 0, options);
}

/**
 * A tensor of ones, written on the device.
 *
 * @param device The device.
 * @param shape Dimensions.
 * @param options `dtype` ("f32" default, "f16", "bf16" or "i32"), `stream`.
 * @returns The tensor.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { ones } from "./fill.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = ones(dev, [4], { dtype: "i32" });
 * assert.deepStrictEqual([...await t.toHost()], [1, 1, 1, 1]);
 * ```
 */
export function ones(
  device: Device,
  shape: readonly number[],
  options: TensorFillOptions = {},
): Tensor {
  return full(device, shape, 1, options);
}

/**
 * A tensor filled with `value` (rounded to the dtype; int32 truncates toward zero), written on
 * the device.
 *
 * @param device The device.
 * @param shape Dimensions.
 * @param value The value.
 * @param options `dtype` ("f32" default, "f16", "bf16" or "i32"), `stream`.
 * @returns The tensor.
 * @throws {TypeError} On a non-number value, an unknown option or dtype.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { full } from "./fill.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = full(dev, [3], 0.1, { dtype: "f32" });
 * assert.deepStrictEqual([...await t.toHost()], [...new Float32Array([0.1, 0.1, 0.1])]);
 * ```
 */
export function full(
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

/** Options of {@linkcode fillInPlace}. */
export interface FillInPlaceOptions {
  /** The first element to write (default 0). */
  start?: number;
  /** How many elements to write (default: the rest of the tensor). */
  count?: number;
  /** The stream to fill on (default: the device's current stream). */
  stream?: Stream;
}

/**
 * Writes `value` (rounded to the dtype; int32 truncates toward zero) into elements
 * `[start, start + count)` of an existing tensor on the device, like PyTorch's `fill_` on a
 * slice: one kernel, nothing read back, so it can be queued inside a recorded step.
 *
 * @param t An f32, f16 or i32 tensor, written.
 * @param value The value.
 * @param options `start` (0), `count` (the rest), `stream`.
 * @throws {TypeError} On another dtype, a non-number value or an unknown option.
 * @throws {RangeError} When the range is not inside the tensor.
 *
 * @example
 * ```ts
 * import { Device, Tensor } from "@pinstream/pinstream";
 * import { fillInPlace } from "./fill.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = Tensor.fromHost(dev, new Float32Array([1, 2, 3, 4]));
 * fillInPlace(t, 0.5, { start: 1, count: 2 });
 * assert.deepStrictEqual([...await t.toHost()], [1, 0.5, 0.5, 4]);
 * ```
 */
export function fillInPlace(t: Tensor, value: number, options: FillInPlaceOptions = {}): void {
  const action = "fill a tensor";
  refuseUnknownKeys(options ?? {}, ["start", "count", "stream"], action);
  if (!(t instanceof Tensor)) {
    throw new TypeError(`Cannot ${action}: t must be a Tensor, got ${describe(t)}`);
  }
  const code = FILL_DTYPES[t.dtype as keyof typeof FILL_DTYPES];
  if (code === undefined) {
    throw new TypeError(`Cannot ${action}: t must be f32, f16, bf16 or i32, got ${t.dtype}`);
  }
  if (typeof value !== "number") {
    throw new TypeError(`Cannot ${action}: value must be a number, got ${describe(value)}`);
  }
  const start = options.start ?? 0;
  const count = options.count ?? t.numel - start;
  for (const [name, v] of [["start", start], ["count", count]] as const) {
    if (!Number.isSafeInteger(v) || v < 0) {
      throw new RangeError(`Cannot ${action}: ${name} must be an integer >= 0, got ${v}`);
    }
  }
  if (start + count > t.numel) {
    throw new RangeError(
      `Cannot ${action}: elements [${start}, ${start + count}) are not inside [${t.shape}]`,
    );
  }
  const stream = streamOn(options, t.device, action);
  if (count === 0) return;
  queue(t.device, "tensorFill", {
    dst: { memory: t.buffer, offset: start * DTYPE_BYTES[t.dtype] },
    dtype: code,
    count,
    mode: 0,
    a: value,
    b: 0,
    seed: 0n,
    offset: 0n,
    stream,
  }, `${action} [${t.shape}] at ${start}, ${count} of ${t.dtype}`);
}

/**
 * `[start, start + step, ...]` below `end` (like `torch.arange`), written on the device;
 * `arange(dev, 5)` is `[0, 1, 2, 3, 4]`. Each element is `start + i * step` computed
 * in double precision, then rounded to the dtype.
 *
 * @param device The device.
 * @param end The end (exclusive), or with `start` in options.
 * @param options `start` (0), `step` (1, non-zero), `dtype` ("f32" default, "f16", "bf16" or "i32"),
 * `stream`.
 * @returns A 1-D tensor of `ceil((end - start) / step)` elements (0 when negative).
 * @throws {RangeError} When `step` is 0 or a bound is not finite.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { arange } from "./fill.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = arange(dev, 10, { start: 1, step: 3, dtype: "i32" });
 * assert.deepStrictEqual([...await t.toHost()], [1, 4, 7]);
 * ```
 */
export function arange(device: Device, end: number, options: ArangeOptions = {}): Tensor {
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
 * `dtype` ("f32" default, "f16" or "bf16"), `stream`.
 * @returns The tensor.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { rand } from "./fill.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = rand(dev, [1000], { seed: 7 });
 * const x = Array.from(await t.toHost());
 * assert.ok(x.every((v) => v >= 0 && v < 1));
 * ```
 */
export function rand(device: Device, shape: readonly number[], options: RandOptions): Tensor {
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
 * (Box-Muller on the counter-based generator of {@linkcode rand}); the same bits on
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
 * import { Device } from "@pinstream/pinstream";
 * import { randn } from "./fill.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = randn(dev, [4096], { seed: 1, mean: 2, std: 0.5 });
 * const x = Array.from(await t.toHost());
 * const mean = x.reduce((a, b) => a + b, 0) / x.length;
 * assert.ok(Math.abs(mean - 2) < 0.05);
 * ```
 */
export function randn(device: Device, shape: readonly number[], options: RandnOptions): Tensor {
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
