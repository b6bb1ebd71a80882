/**
 * 2-D convolution (NCHW, cross-correlation, zero padding) and max pooling, forward and backward.
 * "act" is the op's one activation dtype, f16 or f32: the activations, their gradients and the
 * filters are all f16 or all f32, and a mix is refused naming both tensors.
 *
 * Each op checks dtypes, shapes and devices (TypeError / RangeError naming the offending
 * value) and then queues the kernel on `options.stream` (default: the device's default
 * stream) through the device's backend (ops/backend.ts). Nothing here waits for the device or
 * reads device memory: results are read with `Tensor.toHost()`.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `conv2dForward(x, y, {weight, stride, padding})` | x [N,C,H,W], weight [Co,C,kh,kw], y [N,Co,OH,OW], f16 or f32 | OH = (H + 2p - kh) / s + 1 (floor); any kh, kw |
 * | `conv2dBackwardData(dy, dx, {weight, stride, padding})` | f16 or f32 | overwrites dx; skip it for the first layer |
 * | `conv2dBackwardWeight(dy, dw, {x, stride, padding, accumulate})` | dw f16 or f32 [Co,C,kh,kw] | sum over the batch |
 * | `maxPool2dForward(x, y, {kernel, stride, indices})` | indices i32 like y, or left out | no padding; stride defaults to kernel; NaN wins |
 * | `maxPool2dBackward(dy, dx, {indices})` | | overwrites dx (scatter-add) |
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import type { OpOptions } from "./backend.ts";
import {
  ACT,
  activations,
  code,
  int,
  launch,
  queue,
  rank,
  sameDtype,
  shape,
  tensor,
} from "./_launch.ts";

/** Geometry shared by the convolutions. */
export interface Conv2dGeometry extends OpOptions {
  /** Stride in both directions (default 1). */
  stride?: number;
  /** Zero padding on every side (default 0). */
  padding?: number;
}

/**
 * Filter and options of {@linkcode conv2dForward} and {@linkcode conv2dBackwardData}. The
 * filter is named, not positional: x, weight and y are all f16 or f32 [4-D] and would type-check
 * when swapped.
 */
export interface Conv2dOptions extends Conv2dGeometry {
  /** The filter, f16 or f32 [Co, C, kh, kw]. */
  weight: Tensor;
}

/** The forward's input and options of {@linkcode conv2dBackwardWeight}. */
export interface Conv2dBackwardWeightOptions extends Conv2dGeometry {
  /** The forward's input, f16 or f32 [N, C, H, W]. */
  x: Tensor;
  /** Add to `dw` instead of overwriting it. */
  accumulate?: boolean;
}

/** Options of {@linkcode maxPool2dForward}. */
export interface MaxPool2dOptions extends OpOptions {
  /** Window size (square). */
  kernel: number;
  /** Step between windows (default `kernel`). */
  stride?: number;
  /**
   * i32 shaped like `y`, written: each maximum's position iy·W + ix in its input plane, for
   * {@linkcode maxPool2dBackward} (default null: not recorded).
   */
  indices?: Tensor | null;
}

/** Positions and options of {@linkcode maxPool2dBackward}. */
export interface MaxPool2dBackwardOptions extends OpOptions {
  /** i32 [N, C, OH, OW], the positions {@linkcode maxPool2dForward} recorded. */
  indices: Tensor;
}

interface ConvGeometry {
  n: number;
  c: number;
  h: number;
  w: number;
  co: number;
  kh: number;
  kw: number;
  stride: number;
  pad: number;
  oh: number;
  ow: number;
}

function convGeometry(
  x: Tensor,
  w: Tensor,
  y: Tensor,
  options: Conv2dGeometry,
  action: string,
  names: [string, string, string],
): ConvGeometry {
  rank(x, names[0], [4], action);
  rank(w, names[2], [4], action);
  rank(y, names[1], [4], action);
  const stride = int(options.stride ?? 1, "stride", 1, action);
  const pad = int(options.padding ?? 0, "padding", 0, action);
  const [n, c, h, wi] = x.shape;
  const [co, c2, kh, kw] = w.shape;
  if (c2 !== c) {
    throw new RangeError(
      `Cannot ${action}: ${names[2]} [${w.shape}] expects ${c2} input channels, ${
        names[0]
      } has [${x.shape}]`,
    );
  }
  if (kh < 1 || kw < 1 || h + 2 * pad < kh || wi + 2 * pad < kw) {
    throw new RangeError(
      `Cannot ${action}: kernel ${kh}x${kw} does not fit ${h}x${wi} with padding ${pad}`,
    );
  }
  const oh = Math.floor((h + 2 * pad - kh) / stride) + 1;
  const ow = Math.floor((wi + 2 * pad - kw) / stride) + 1;
  shape(y, names[1], [n, co, oh, ow], action);
  return { n, c, h, w: wi, co, kh, kw, stride, pad, oh, ow };
}

/**
 * 2-D convolution (cross-correlation, zero padding), fp16 in and out.
 *
 * @param x f16 or f32 [N, C, H, W].
 * @param y f16 or f32 [N, Co, OH, OW], OH = floor((H + 2·padding − kh) / stride) + 1.
 * @param options weight (f16 or f32 [Co, C, kh, kw]); stride, padding, stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example A 3x3 box filter
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { conv2dForward } from "./conv.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using x = Tensor.fromHost(dev, new Float16Array(9).fill(1), [1, 1, 3, 3]);
 * using w = Tensor.fromHost(dev, new Float16Array(9).fill(1), [1, 1, 3, 3]);
 * using y = Tensor.empty(dev, [1, 1, 3, 3], "f16");
 * conv2dForward(x, y, { weight: w, padding: 1 });
 * assert.deepStrictEqual([...await y.toHost()], [4, 6, 4, 6, 9, 6, 4, 6, 4]);
 * ```
 */
export function conv2dForward(x: Tensor, y: Tensor, options: Conv2dOptions): void {
  const action = "run conv2dForward";
  const w = options?.weight;
  const dt = activations(action, [x, "x"], [w, "weight"], [y, "y"]);
  const g = convGeometry(x, w, y, options, action, ["x", "y", "weight"]);
  using launched = launch(action, options, x, w, y);
  const { device, stream } = launched;
  queue(device, "conv2dForward", {
    x,
    w,
    y,
    dtype: dt,
    n: g.n,
    c: g.c,
    h: g.h,
    w_: g.w,
    co: g.co,
    kh: g.kh,
    kw: g.kw,
    stride: g.stride,
    pad: g.pad,
    stream,
  }, `${action} x [${x.shape}] weight [${w.shape}]`);
}

/**
 * Input gradient of {@linkcode conv2dForward} (overwrites `dx`).
 *
 * @param dy f16 or f32 [N, Co, OH, OW].
 * @param dx f16 or f32 [N, C, H, W], overwritten.
 * @param options weight (f16 or f32 [Co, C, kh, kw]); the forward's stride and padding; stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example The adjoint of a 1x1 convolution
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { conv2dBackwardData } from "./conv.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using dy = Tensor.fromHost(dev, new Float16Array([1, 2]), [1, 2, 1, 1]);
 * using w = Tensor.fromHost(dev, new Float16Array([3, 4]), [2, 1, 1, 1]);
 * using dx = Tensor.empty(dev, [1, 1, 1, 1], "f16");
 * conv2dBackwardData(dy, dx, { weight: w });
 * assert.deepStrictEqual([...await dx.toHost()], [11]);
 * ```
 */
export function conv2dBackwardData(dy: Tensor, dx: Tensor, options: Conv2dOptions): void {
  const action = "run conv2dBackwardData";
  const w = options?.weight;
  const dt = activations(action, [dy, "dy"], [w, "weight"], [dx, "dx"]);
  const g = convGeometry(dx, w, dy, options, action, ["dx", "dy", "weight"]);
  using launched = launch(action, options, dy, w, dx);
  const { device, stream } = launched;
  queue(device, "conv2dBackwardData", {
    dy,
    w,
    dx,
    dtype: dt,
    n: g.n,
    c: g.c,
    h: g.h,
    w_: g.w,
    co: g.co,
    kh: g.kh,
    kw: g.kw,
    stride: g.stride,
    pad: g.pad,
    stream,
  }, `${action} dx [${dx.shape}] weight [${w.shape}]`);
}

/**
 * Weight gradient of {@linkcode conv2dForward}, summed over the batch.
 *
 * @param dy f16 or f32 [N, Co, OH, OW].
 * @param dw f16 or f32 [Co, C, kh, kw], overwritten (added to with `accumulate`).
 * @param options x (the forward's input, f16 or f32 [N, C, H, W]); the forward's stride and
 *   padding; accumulate; stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example A 1x1 convolution's weight gradient
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { conv2dBackwardWeight } from "./conv.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using x = Tensor.fromHost(dev, new Float16Array([1, 2, 3, 4]), [1, 1, 2, 2]);
 * using dy = Tensor.fromHost(dev, new Float16Array([1, 1, 1, 1]), [1, 1, 2, 2]);
 * using dw = Tensor.empty(dev, [1, 1, 1, 1], "f32");
 * conv2dBackwardWeight(dy, dw, { x });
 * assert.deepStrictEqual([...await dw.toHost()], [10]);
 * ```
 */
export function conv2dBackwardWeight(
  dy: Tensor,
  dw: Tensor,
  options: Conv2dBackwardWeightOptions,
): void {
  const action = "run conv2dBackwardWeight";
  const x = options?.x;
  const dt = activations(action, [x, "x"], [dy, "dy"]);
  tensor(dw, "dw", ACT, action);
  const g = convGeometry(x, dw, dy, options, action, ["x", "dy", "dw"]);
  using launched = launch(action, options, x, dy, dw);
  const { device, stream } = launched;
  queue(device, "conv2dBackwardWeight", {
    x,
    dy,
    dtype: dt,
    dw,
    dw_dtype: code(dw),
    n: g.n,
    c: g.c,
    h: g.h,
    w_: g.w,
    co: g.co,
    kh: g.kh,
    kw: g.kw,
    stride: g.stride,
    pad: g.pad,
    accumulate: options.accumulate ? 1 : 0,
    stream,
  }, `${action} x [${x.shape}] dw [${dw.shape}]`);
}

/**
 * Max pooling (no padding, floor mode), optionally recording each maximum's position.
 *
 * @param x f16 or f32 [N, C, H, W].
 * @param y f16 or f32 [N, C, OH, OW], OH = floor((H − kernel) / stride) + 1.
 * @param options kernel, stride (default kernel); indices (i32 shaped like `y`: position
 *   iy·W + ix in the input plane; default null), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example 2x2 pooling
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { maxPool2dForward } from "./conv.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using x = Tensor.fromHost(dev, new Float16Array([1, 5, 3, 2]), [1, 1, 2, 2]);
 * using y = Tensor.empty(dev, [1, 1, 1, 1], "f16");
 * using idx = Tensor.empty(dev, [1, 1, 1, 1], "i32");
 * maxPool2dForward(x, y, { kernel: 2, indices: idx });
 * assert.deepStrictEqual([...await y.toHost()], [5]);
 * assert.deepStrictEqual([...await idx.toHost()], [1]);
 * ```
 */
export function maxPool2dForward(x: Tensor, y: Tensor, options: MaxPool2dOptions): void {
  const action = "run maxPool2dForward";
  const indices = options?.indices ?? null;
  const dt = activations(action, [x, "x"], [y, "y"]);
  if (indices !== null) tensor(indices, "indices", ["i32"], action);
  rank(x, "x", [4], action);
  const kernel = int(options?.kernel, "kernel", 1, action);
  const stride = int(options.stride ?? kernel, "stride", 1, action);
  const [n, c, h, w] = x.shape;
  if (kernel > h || kernel > w) {
    throw new RangeError(`Cannot ${action}: kernel ${kernel} larger than the input [${x.shape}]`);
  }
  const oh = Math.floor((h - kernel) / stride) + 1, ow = Math.floor((w - kernel) / stride) + 1;
  shape(y, "y", [n, c, oh, ow], action);
  if (indices) shape(indices, "indices", [n, c, oh, ow], action);
  using launched = launch(action, options, x, y, indices);
  const { device, stream } = launched;
  queue(device, "maxPool2dForward", {
    x,
    y,
    dtype: dt,
    indices,
    n,
    c,
    h,
    w_: w,
    kernel,
    stride,
    stream,
  }, `${action} x [${x.shape}]`);
}

/**
 * Input gradient of {@linkcode maxPool2dForward}: `dy` added at the recorded positions;
 * overwrites `dx`.
 *
 * @param dy f16 or f32 [N, C, OH, OW].
 * @param dx f16 or f32 [N, C, H, W], overwritten.
 * @param options indices (i32 [N, C, OH, OW] from the forward), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example Routing the gradient to the maximum
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { maxPool2dBackward } from "./conv.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using dy = Tensor.fromHost(dev, new Float16Array([7]), [1, 1, 1, 1]);
 * using idx = Tensor.fromHost(dev, new Int32Array([2]), [1, 1, 1, 1]);
 * using dx = Tensor.empty(dev, [1, 1, 2, 2], "f16");
 * maxPool2dBackward(dy, dx, { indices: idx });
 * assert.deepStrictEqual([...await dx.toHost()], [0, 0, 7, 0]);
 * ```
 */
export function maxPool2dBackward(
  dy: Tensor,
  dx: Tensor,
  options: MaxPool2dBackwardOptions,
): void {
  const action = "run maxPool2dBackward";
  const indices = options?.indices;
  const dt = activations(action, [dy, "dy"]);
  tensor(indices, "indices", ["i32"], action);
  sameDtype(dx, "dx", dy, "dy", action);
  rank(dy, "dy", [4], action);
  rank(dx, "dx", [4], action);
  shape(indices, "indices", dy.shape, action);
  const [n, c, oh, ow] = dy.shape;
  const [, , h, w] = dx.shape;
  shape(dx, "dx", [n, c, h, w], action);
  using launched = launch(action, options, dy, indices, dx);
  const { device, stream } = launched;
  queue(
    device,
    "maxPool2dBackward",
    { dy, indices, dx, dtype: dt, n, c, h, w_: w, oh, ow, stream },
    `${action} dy [${dy.shape}]`,
  );
}
