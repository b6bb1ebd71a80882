/**
 * Elementwise ops: ReLU forward and backward, dtype casts, and the flagged copy that undoes a
 * skipped step.
 *
 * Each op checks dtypes, shapes and devices (TypeError / RangeError naming the offending
 * value) and then queues the kernel on `options.stream` (default: the device's default
 * stream) through the device's backend (ops/backend.ts). Nothing here waits for the device or
 * reads device memory: results are read with `Tensor.toHost()`.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `reluForward(x, y)`, `reluBackward(dy, dx, {y})` | f16 or f32, same numel | in place allowed; backward uses relu's output |
 * | `cast(src, dst)` | f16/f32, same numel | |
 * | `copyIf(src, dst, {flag})` | src, dst f32, same numel; flag i32 [1] | dst = src when flag != 0 (read on the device): undoes a step the scaler skipped |
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import type { OpOptions } from "./backend.ts";
import { ACT, activations, code, launch, queue, sameNumel, scalar, tensor } from "./_launch.ts";

/** The forward's output and options of {@linkcode reluBackward}. */
export interface ReluBackwardOptions extends OpOptions {
  /** f16, relu's output (its sign decides where the gradient passes). */
  y: Tensor;
}

/** The flag of {@linkcode copyIf}. */
export interface CopyIfOptions extends OpOptions {
  /** i32 [1], read on the device: the copy happens when it is non-zero. */
  flag: Tensor;
}

/**
 * `y = max(x, 0)` elementwise (in place when `y` is `x`).
 *
 * @param x f16 or f32.
 * @param y f16 or f32, same number of elements.
 * @param options stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the sizes differ.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { reluForward } from "./elementwise.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using x = Tensor.fromHost(dev, new Float16Array([-1, 2]));
 * reluForward(x, x);
 * assert.deepStrictEqual([...await x.toHost()], [0, 2]);
 * ```
 */
export function reluForward(x: Tensor, y: Tensor, options: OpOptions = {}): void {
  const action = "run reluForward";
  const dt = activations(action, [x, "x"], [y, "y"]);
  sameNumel(x, y, "x and y", action);
  using launched = launch(action, options, x, y);
  const { device, stream } = launched;
  queue(device, "reluForward", { x, y, dtype: dt, count: x.numel, stream }, action);
}

/**
 * `dx = y > 0 ? dy : 0` from relu's output `y` (in place when `dx` is `dy`).
 *
 * @param dy f16 or f32.
 * @param dx f16 or f32, same number of elements (may be `dy`).
 * @param options y (f16, the forward's output), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the sizes differ.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { reluBackward } from "./elementwise.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using dy = Tensor.fromHost(dev, new Float16Array([5, 6]));
 * using y = Tensor.fromHost(dev, new Float16Array([0, 2]));
 * reluBackward(dy, dy, { y });
 * assert.deepStrictEqual([...await dy.toHost()], [0, 6]);
 * ```
 */
export function reluBackward(dy: Tensor, dx: Tensor, options: ReluBackwardOptions): void {
  const action = "run reluBackward";
  const y = options?.y;
  const dt = activations(action, [dy, "dy"], [y, "y"], [dx, "dx"]);
  sameNumel(dy, y, "dy and y", action);
  sameNumel(dy, dx, "dy and dx", action);
  using launched = launch(action, options, dy, y, dx);
  const { device, stream } = launched;
  queue(device, "reluBackward", { dy, y, dx, dtype: dt, count: dy.numel, stream }, action);
}

/**
 * Converts between f16 and f32 (or copies when the dtypes match), rounding to nearest even.
 *
 * @param src f16 or f32.
 * @param dst f16 or f32, same number of elements.
 * @param options stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the sizes differ.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { cast } from "./elementwise.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float32Array([1.5, 70000]));
 * using b = Tensor.empty(dev, [2], "f16");
 * cast(a, b);
 * assert.deepStrictEqual([...await b.toHost()], [1.5, Infinity]);
 * ```
 */
export function cast(src: Tensor, dst: Tensor, options: OpOptions = {}): void {
  const action = "run cast";
  tensor(src, "src", ACT, action);
  tensor(dst, "dst", ACT, action);
  sameNumel(src, dst, "src and dst", action);
  using launched = launch(action, options, src, dst);
  const { device, stream } = launched;
  queue(device, "cast", {
    src,
    src_dtype: code(src),
    dst,
    dst_dtype: code(dst),
    count: src.numel,
    stream,
  }, `${action} ${src.dtype} -> ${dst.dtype}`);
}

/**
 * Copies `src` into `dst` when the device flag is non-zero, and does nothing otherwise; the
 * flag is read by the kernel, so no host round trip decides it. With a GradScaler's found-inf
 * flag it undoes a side effect of a step the scaler skips (batch norm's running statistics).
 *
 * @param src f32, the values to restore.
 * @param dst f32, same number of elements.
 * @param options flag (i32 [1]), stream.
 * @throws {TypeError} On a wrong dtype or tensors on different devices.
 * @throws {RangeError} When the sizes differ or the flag is not one element.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { copyIf } from "./elementwise.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using saved = Tensor.fromHost(dev, new Float32Array([1, 2]));
 * using x = Tensor.fromHost(dev, new Float32Array([NaN, NaN]));
 * using clear = Tensor.fromHost(dev, new Int32Array([0]));
 * using set = Tensor.fromHost(dev, new Int32Array([1]));
 * copyIf(saved, x, { flag: clear });
 * assert.ok((await x.toHost()).every(Number.isNaN));
 * copyIf(saved, x, { flag: set });
 * assert.deepStrictEqual([...await x.toHost()], [1, 2]);
 * ```
 */
export function copyIf(src: Tensor, dst: Tensor, options: CopyIfOptions): void {
  const action = "run copyIf";
  const flag = options?.flag;
  tensor(src, "src", ["f32"], action);
  tensor(dst, "dst", ["f32"], action);
  tensor(flag, "flag", ["i32"], action);
  sameNumel(src, dst, "src and dst", action);
  scalar(flag, "flag", action);
  using launched = launch(action, options, src, dst, flag);
  const { device, stream } = launched;
  queue(device, "copyIf", { dst, src, count: dst.numel, flag, stream }, `${action} [${dst.shape}]`);
}
