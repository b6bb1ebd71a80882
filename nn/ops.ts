/**
 * (About 1,600 lines: one wrapper per `ps_nn_*` function of the ABI, 21 of them, each with the
 * same check-then-queue shape, its options interface, JSDoc and a runnable example; kept in
 * one module so the checks and the argument rule stay uniform.)
 *
 * Typed wrappers over the `ps_nn_*` kernels of kernels/pinstream.h: each checks dtypes,
 * shapes and devices (TypeError / RangeError naming the offending value) and then queues the
 * kernel on `options.stream` (default: the device's default stream). Nothing here waits
 * for the device or reads device memory: results are read with `Tensor.toHost()`.
 *
 * Contract of each op (layout NCHW, fp32 accumulation; "overwrites" unless `accumulate`).
 * "act" is the op's one activation dtype, f16 (mixed precision) or f32 (the fp32 path): its
 * activations, their gradients and the weights of matmul and the convolutions are all f16 or
 * all f32, and a mix is refused naming both tensors.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `matmul(a, b, {out, transA, transB, accumulate})` | a, b f16 or f32 2-D; out f16/f32 [m, n] | out = op(a) @ op(b) (+ out) |
 * | `conv2dForward(x, y, {weight, stride, padding})` | x [N,C,H,W], weight [Co,C,kh,kw], y [N,Co,OH,OW], f16 or f32 | OH = (H + 2p - kh) / s + 1 (floor); any kh, kw |
 * | `conv2dBackwardData(dy, dx, {weight, stride, padding})` | f16 or f32 | overwrites dx; skip it for the first layer |
 * | `conv2dBackwardWeight(dy, dw, {x, stride, padding, accumulate})` | dw f16 or f32 [Co,C,kh,kw] | sum over the batch |
 * | `maxPool2dForward(x, y, {kernel, stride, indices})` | indices i32 like y, or left out | no padding; stride defaults to kernel; NaN wins |
 * | `maxPool2dBackward(dy, dx, {indices})` | | overwrites dx (scatter-add) |
 * | `batchNormForwardTrain(x, y, {gamma, beta, saveMean, saveInvStd, runMean, runVar, momentum, eps})` | x, y f16 or f32 [N,C,…]; the rest f32 [C] | biased batch var for y, unbiased for runVar (PyTorch); runMean/runVar may be left out |
 * | `batchNormForwardEval(x, y, {gamma, beta, runMean, runVar, eps})` | | |
 * | `batchNormBackward(dy, dx, {x, gamma, saveMean, saveInvStd, dgamma, dbeta})` | dgamma, dbeta f32 | overwrites dx, dgamma, dbeta |
 * | `biasAdd(y, bias)` | y f16 or f32 [N,C,…] or [N,F]; bias f16/f32 [C] | in place |
 * | `biasGrad(dy, dbias, {accumulate})` | dbias f16/f32 [C] | |
 * | `reluForward(x, y)`, `reluBackward(dy, dx, {y})` | f16 or f32, same numel | in place allowed; backward uses relu's output |
 * | `crossEntropyForwardBackward(logits, labels, {dlogits, lossSum, correct, scale})` | logits, dlogits f16 or f32 [N,K]; labels i32 [N]; lossSum f32 [1]; correct i32 [1] | lossSum += Σ loss, correct += Σ (argmax == label), dlogits = scale·(softmax − onehot)/N |
 * | `crossEntropyForward(logits, labels, {lossSum, correct})` | | same sums, no gradient |
 * | `cast(src, dst)` | f16/f32, same numel | |
 * | `unscaleAndCheck(grad, foundInf, {scale, invScale, inPlace})` | grad f16/f32; foundInf i32 [1]; scale f32 [1] or null | foundInf = 1 on any inf/NaN (never cleared); inPlace: grad *= 1/scale (or invScale) |
 * | `sgdStep(param, grad, {lr, momentumBuf, paramHalf, momentum, dampening, nesterov, weightDecay, scale, foundInf, stepsDone})` | param, momentumBuf f32; grad f16/f32; paramHalf f16 or null | torch.optim.SGD; grad unscaled by 1/scale in fp32; skipped on the device when foundInf != 0; stepsDone i32 [1] == 0 selects PyTorch's first-step buffer init |
 * | `stepCount(stepsDone, foundInf)` | i32 [1] | stepsDone += 1 unless foundInf != 0; call after the step's sgdSteps |
 * | `scalerUpdate(scale, growthTracker, {foundInf, growthFactor, backoffFactor, growthInterval})` | f32 [1], i32 [1], i32 [1] | torch._amp_update_scale_; foundInf is read, not cleared |
 * | `copyIf(src, dst, {flag})` | src, dst f32, same numel; flag i32 [1] | dst = src when flag != 0 (read on the device): undoes a step the scaler skipped |
 *
 * Every op takes at most two tensors positionally (the operands of `matmul`; otherwise the
 * input and the output, or the incoming and the outgoing gradient, of the data flow) and
 * names the rest in its options object, where a required tensor is a required field: a
 * call with same-typed tensors in the wrong places does not type-check.
 *
 * Unscaling fp16 gradients in place (`inPlace: true`) can flush small values to zero: the
 * loss scale exists to keep them representable. The fused path (`sgdStep` with `scale`)
 * unscales in fp32 and is the one `GradScaler.step` should use.
 *
 * On the CPU backend the kernels run synchronously on the calling thread plus one helper
 * thread per other CPU (`PINSTREAM_NUM_THREADS`, else `OMP_NUM_THREADS`, caps the total),
 * and every result is bit-for-bit reproducible from run to run on both backends, except the
 * CUDA loss sum (atomics) and max-pool gradients where pooling windows overlap.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import type { DType, Tensor } from "../ffi/tensor.ts";
import type { Stream } from "../ffi/stream.ts";
import { activeRecorder, range } from "../internal/trace.ts";

/** Options shared by every op. */
export interface OpOptions {
  /** The stream to queue the kernel on (default: the device's default stream). */
  stream?: Stream;
}

/** Output and options of {@linkcode matmul}. */
export interface MatmulOptions extends OpOptions {
  /** f16 or f32 [m, n], written (added to with `accumulate`). */
  out: Tensor;
  /** Use `a` transposed (a is [k, m]). */
  transA?: boolean;
  /** Use `b` transposed (b is [n, k]). */
  transB?: boolean;
  /** Add the product to `out` instead of overwriting it. */
  accumulate?: boolean;
}

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

/** The forward's output and options of {@linkcode reluBackward}. */
export interface ReluBackwardOptions extends OpOptions {
  /** f16, relu's output (its sign decides where the gradient passes). */
  y: Tensor;
}

/**
 * Tensors and options of {@linkcode batchNormForwardTrain}. The per-channel tensors are
 * named, not positional: eight same-typed tensors in a row would type-check when swapped.
 */
export interface BatchNormTrainOptions extends OpOptions {
  /** Scale, f32 [C]. */
  gamma: Tensor;
  /** Shift, f32 [C]. */
  beta: Tensor;
  /** f32 [C], written: the batch mean, for the backward. */
  saveMean: Tensor;
  /** f32 [C], written: 1 / sqrt(biased var + eps), for the backward. */
  saveInvStd: Tensor;
  /** f32 [C], updated (default null: not tracked). */
  runMean?: Tensor | null;
  /** f32 [C], updated with the unbiased variance (default null: not tracked). */
  runVar?: Tensor | null;
  /** Running-statistics momentum (default 0.1, PyTorch's). */
  momentum?: number;
  /** Added to the variance (default 1e-5). */
  eps?: number;
}

/** Tensors and options of {@linkcode batchNormForwardEval}. */
export interface BatchNormEvalOptions extends OpOptions {
  /** Scale, f32 [C]. */
  gamma: Tensor;
  /** Shift, f32 [C]. */
  beta: Tensor;
  /** Running mean, f32 [C]. */
  runMean: Tensor;
  /** Running variance, f32 [C]. */
  runVar: Tensor;
  /** Added to the variance (default 1e-5). */
  eps?: number;
}

/** Tensors and options of {@linkcode batchNormBackward}. */
export interface BatchNormBackwardOptions extends OpOptions {
  /** The forward's input, f16 or f32 [N, C, ...]. */
  x: Tensor;
  /** Scale, f32 [C]. */
  gamma: Tensor;
  /** f32 [C], from the forward. */
  saveMean: Tensor;
  /** f32 [C], from the forward. */
  saveInvStd: Tensor;
  /** f32 [C], overwritten. */
  dgamma: Tensor;
  /** f32 [C], overwritten. */
  dbeta: Tensor;
}

/** Options of {@linkcode biasGrad}. */
export interface BiasGradOptions extends OpOptions {
  /** Add to `dbias` instead of overwriting it. */
  accumulate?: boolean;
}

/** Accumulators and options of {@linkcode crossEntropyForward}. */
export interface CrossEntropyForwardOptions extends OpOptions {
  /** f32 [1], added to: the batch's summed loss. */
  lossSum: Tensor;
  /** i32 [1], added to: how many rows' argmax equals their label. */
  correct: Tensor;
}

/** Gradient, accumulators and options of {@linkcode crossEntropyForwardBackward}. */
export interface CrossEntropyOptions extends CrossEntropyForwardOptions {
  /** f16 or f32 [N, K], written: the gradient of the mean loss (times the scale). */
  dlogits: Tensor;
  /** Multiplies the gradient (the loss scale; default 1). */
  scale?: number;
  /**
   * f32 [1] on the device that also multiplies the gradient, read by the kernel (a
   * GradScaler's `scaleTensor`, which the device updates without the host knowing).
   */
  scaleTensor?: Tensor | null;
}

/** Options of {@linkcode unscaleAndCheck}. */
export interface UnscaleOptions extends OpOptions {
  /** f32 [1] holding the loss scale; the kernel uses 1 / scale. Null: use `invScale`. */
  scale?: Tensor | null;
  /** The inverse scale when `scale` is null (default 1). */
  invScale?: number;
  /** Multiply the gradient by the inverse scale (default false: only check). */
  inPlace?: boolean;
}

/** Options of {@linkcode sgdStep} (PyTorch's SGD hyper-parameters plus loss scaling). */
export interface SgdStepOptions extends OpOptions {
  /** Learning rate. */
  lr: number;
  /**
   * f32 like `param` (zero-initialized by the caller), updated; required when momentum is
   * non-zero (default null).
   */
  momentumBuf?: Tensor | null;
  /** f16 like `param`, written after the update: the copy the forward uses (default null). */
  paramHalf?: Tensor | null;
  /** Momentum factor (default 0). */
  momentum?: number;
  /** Dampening for momentum (default 0). */
  dampening?: number;
  /** Nesterov momentum (default false; needs momentum > 0 and dampening 0). */
  nesterov?: boolean;
  /** L2 penalty (default 0). */
  weightDecay?: number;
  /** f32 [1]: the gradient is multiplied by 1 / scale (in fp32) before use. */
  scale?: Tensor | null;
  /** i32 [1]: the step is skipped on the device when it is non-zero. */
  foundInf?: Tensor | null;
  /** i32 [1]: completed steps; 0 makes the momentum buffer a copy of the gradient. */
  stepsDone?: Tensor | null;
}

/** The found-inf flag and options of {@linkcode scalerUpdate} (PyTorch GradScaler's defaults). */
export interface ScalerUpdateOptions extends OpOptions {
  /** i32 [1], read (not cleared): non-zero when the step saw an inf or NaN. */
  foundInf: Tensor;
  /** Scale multiplier after `growthInterval` finite steps (default 2). */
  growthFactor?: number;
  /** Scale multiplier after a step with inf/NaN (default 0.5). */
  backoffFactor?: number;
  /** Finite steps in a row before growing (default 2000). */
  growthInterval?: number;
}

/** The flag of {@linkcode copyIf}. */
export interface CopyIfOptions extends OpOptions {
  /** i32 [1], read on the device: the copy happens when it is non-zero. */
  flag: Tensor;
}

const F32 = 0;
const F16 = 1;

function code(t: Tensor): number {
  return t.dtype === "f16" ? F16 : F32;
}

/** The dtypes an op's activations take: f16 (mixed precision) or f32 (the fp32 path). */
const ACT: readonly DType[] = ["f16", "f32"];

/**
 * Checks an op's activation tensors (with the weights of matmul and the convolutions): the
 * first f16 or f32, every other of its dtype, in the order given.
 *
 * @returns The kernels' code of that one dtype.
 */
function activations(action: string, ...named: [unknown, string][]): number {
  const [first, firstName] = named[0];
  const ref = tensor(first, firstName, ACT, action);
  for (const [t, name] of named.slice(1)) sameDtype(t, name, ref, firstName, action);
  return code(ref);
}

/**
 * Checks that `t` is a Tensor of `ref`'s dtype: an op's activations, their gradients and the
 * weights of matmul and the convolutions share one dtype.
 */
function sameDtype(t: unknown, name: string, ref: Tensor, refName: string, action: string): void {
  tensor(t, name, ACT, action);
  if ((t as Tensor).dtype !== ref.dtype) {
    throw new TypeError(
      `Cannot ${action}: ${name} is ${(t as Tensor).dtype} but ${refName} is ${ref.dtype} ` +
        `(the op computes in one dtype: give every activation and weight f16, or every one f32)`,
    );
  }
}

function isTensor(t: unknown): t is Tensor {
  return typeof t === "object" && t !== null && "dtype" in t && "shape" in t && "device" in t;
}

function tensor(
  t: unknown,
  name: string,
  dtypes: readonly DType[],
  action: string,
): Tensor {
  if (!isTensor(t)) throw new TypeError(`Cannot ${action}: ${name} must be a Tensor, got ${t}`);
  if (!dtypes.includes(t.dtype)) {
    throw new TypeError(
      `Cannot ${action}: ${name} must be ${dtypes.join(" or ")}, got ${t.dtype}`,
    );
  }
  return t;
}

function shape(t: Tensor, name: string, expected: readonly number[], action: string): void {
  if (t.shape.length !== expected.length || t.shape.some((d, i) => d !== expected[i])) {
    throw new RangeError(
      `Cannot ${action}: ${name} must have shape [${expected}], got [${t.shape}]`,
    );
  }
}

function rank(t: Tensor, name: string, ranks: readonly number[], action: string): void {
  if (!ranks.includes(t.shape.length)) {
    throw new RangeError(
      `Cannot ${action}: ${name} must have ${ranks.join(" or ")} dimensions, got [${t.shape}]`,
    );
  }
}

function scalar(t: Tensor, name: string, action: string): void {
  if (t.numel !== 1) {
    throw new RangeError(`Cannot ${action}: ${name} must hold one element, got [${t.shape}]`);
  }
}

function int(v: unknown, name: string, min: number, action: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min) {
    throw new RangeError(`Cannot ${action}: ${name} must be an integer >= ${min}, got ${v}`);
  }
  return v;
}

function num(v: unknown, name: string, action: string): number {
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw new RangeError(`Cannot ${action}: ${name} must be a finite number, got ${v}`);
  }
  return v;
}

/** An op about to run: its device (made current), the stream handle, and its profiler range. */
interface Launched extends Disposable {
  device: Device;
  stream: Deno.PointerValue;
}

/**
 * The common device of the tensors (made current) and the stream handle to queue on; with a
 * profiler active (ffi/profiler.ts), the op is a range named after it, timed on the host and on
 * its stream until the returned object is disposed (`using`).
 */
function launch(
  action: string,
  options: OpOptions,
  ...ts: (Tensor | null | undefined)[]
): Launched {
  let device: Device | undefined;
  for (const t of ts) {
    if (!t) continue;
    if (device === undefined) device = t.device;
    else if (t.device !== device) {
      throw new TypeError(
        `Cannot ${action}: tensors on different devices (${device}, ${t.device})`,
      );
    }
  }
  if (device === undefined) throw new TypeError(`Cannot ${action}: no tensors`);
  const stream = options.stream;
  if (stream !== undefined && stream.device !== device) {
    throw new TypeError(`Cannot ${action}: the stream belongs to ${stream.device}, not ${device}`);
  }
  device.makeCurrent();
  const timed = activeRecorder() === undefined ? undefined : range(
    `nn.${action.replace(/^run /, "")}`,
    { stream: stream ?? device.defaultStream },
  );
  return {
    device,
    stream: stream?.handle ?? null,
    [Symbol.dispose]: () => timed?.[Symbol.dispose](),
  };
}

function ptr(t: Tensor | null | undefined): Deno.PointerValue {
  return t ? t.pointer : null;
}

/** The product of the dimensions from `from` on. */
function tail(s: readonly number[], from: number): number {
  let n = 1;
  for (let i = from; i < s.length; i++) n *= s[i];
  return n;
}

/**
 * Matrix product `out = op(a) @ op(b)` (`+ out` when accumulating): f16 or f32 inputs, fp32
 * accumulation, fp16 or fp32 output.
 *
 * @param a f16 or f32 [m, k] ([k, m] with `transA`).
 * @param b f16 or f32 [k, n] ([n, k] with `transB`).
 * @param options out (f16 or f32 [m, n]); transA, transB, accumulate, stream.
 * @throws {TypeError} On a wrong dtype or tensors on different devices.
 * @throws {RangeError} When the shapes do not agree.
 * @example A 2x3 by 3x2 product
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { matmul } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float16Array([1, 2, 3, 4, 5, 6]), [2, 3]);
 * using b = Tensor.fromHost(dev, new Float16Array([1, 0, 0, 1, 1, 1]), [3, 2]);
 * using c = Tensor.empty(dev, [2, 2], "f32");
 * matmul(a, b, { out: c });
 * assert.deepStrictEqual([...await c.toHost()], [4, 5, 10, 11]);
 * ```
 */
export function matmul(a: Tensor, b: Tensor, options: MatmulOptions): void {
  const action = "run matmul";
  const out = options?.out;
  const dt = activations(action, [a, "a"], [b, "b"]);
  tensor(out, "out", ["f16", "f32"], action);
  rank(a, "a", [2], action);
  rank(b, "b", [2], action);
  const [m, k] = options.transA ? [a.shape[1], a.shape[0]] : [a.shape[0], a.shape[1]];
  const [k2, n] = options.transB ? [b.shape[1], b.shape[0]] : [b.shape[0], b.shape[1]];
  if (k !== k2) {
    throw new RangeError(
      `Cannot ${action}: inner dimensions differ (a [${a.shape}], b [${b.shape}], ` +
        `transA=${!!options.transA}, transB=${!!options.transB})`,
    );
  }
  shape(out, "out", [m, n], action);
  using launched = launch(action, options, a, b, out);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_matmul(
      a.pointer,
      b.pointer,
      dt,
      out.pointer,
      code(out),
      BigInt(m),
      BigInt(n),
      BigInt(k),
      options.transA ? 1 : 0,
      options.transB ? 1 : 0,
      options.accumulate ? 1 : 0,
      stream,
    ),
    `${action} [${m}x${k}]x[${k}x${n}]`,
  );
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

function convArgs(g: ConvGeometry): [bigint, bigint, bigint, bigint, bigint, number, number] {
  return [BigInt(g.n), BigInt(g.c), BigInt(g.h), BigInt(g.w), BigInt(g.co), g.kh, g.kw];
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
 * import { conv2dForward } from "./ops.ts";
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
  device.check(
    device.lib.symbols.ps_nn_conv2d_forward(
      x.pointer,
      w.pointer,
      y.pointer,
      dt,
      ...convArgs(g),
      g.stride,
      g.pad,
      stream,
    ),
    `${action} x [${x.shape}] weight [${w.shape}]`,
  );
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
 * import { conv2dBackwardData } from "./ops.ts";
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
  device.check(
    device.lib.symbols.ps_nn_conv2d_backward_data(
      dy.pointer,
      w.pointer,
      dx.pointer,
      dt,
      ...convArgs(g),
      g.stride,
      g.pad,
      stream,
    ),
    `${action} dx [${dx.shape}] weight [${w.shape}]`,
  );
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
 * import { conv2dBackwardWeight } from "./ops.ts";
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
  tensor(dw, "dw", ["f16", "f32"], action);
  const g = convGeometry(x, dw, dy, options, action, ["x", "dy", "dw"]);
  using launched = launch(action, options, x, dy, dw);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_conv2d_backward_weight(
      x.pointer,
      dy.pointer,
      dt,
      dw.pointer,
      code(dw),
      ...convArgs(g),
      g.stride,
      g.pad,
      options.accumulate ? 1 : 0,
      stream,
    ),
    `${action} x [${x.shape}] dw [${dw.shape}]`,
  );
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
 * import { maxPool2dForward } from "./ops.ts";
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
  device.check(
    device.lib.symbols.ps_nn_maxpool2d_forward(
      x.pointer,
      y.pointer,
      dt,
      ptr(indices),
      BigInt(n),
      BigInt(c),
      BigInt(h),
      BigInt(w),
      kernel,
      stride,
      stream,
    ),
    `${action} x [${x.shape}]`,
  );
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
 * import { maxPool2dBackward } from "./ops.ts";
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
  device.check(
    device.lib.symbols.ps_nn_maxpool2d_backward(
      dy.pointer,
      indices.pointer,
      dx.pointer,
      dt,
      BigInt(n),
      BigInt(c),
      BigInt(h),
      BigInt(w),
      BigInt(oh),
      BigInt(ow),
      stream,
    ),
    `${action} dy [${dy.shape}]`,
  );
}

function bnShape(x: Tensor, action: string): { n: number; c: number; hw: number } {
  if (x.shape.length < 2) {
    throw new RangeError(`Cannot ${action}: x must be [N, C, ...], got [${x.shape}]`);
  }
  return { n: x.shape[0], c: x.shape[1], hw: tail(x.shape, 2) };
}

function params(ts: [Tensor | null, string][], c: number, action: string): void {
  for (const [t, name] of ts) {
    if (t === null) continue;
    tensor(t, name, ["f32"], action);
    shape(t, name, [c], action);
  }
}

/**
 * Batch normalization in training mode: normalizes with the batch statistics, saves them
 * for the backward and updates the running statistics (PyTorch's momentum convention).
 *
 * @param x f16 or f32 [N, C, ...].
 * @param y f16 or f32 like x.
 * @param options gamma, beta, saveMean, saveInvStd (f32 [C]); runMean, runVar (f32 [C] or
 *   null); momentum (0.1), eps (1e-5), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree or N·spatial < 2.
 * @example Normalizing one channel
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { batchNormForwardTrain } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using x = Tensor.fromHost(dev, new Float16Array([1, 3]), [2, 1]);
 * using g = Tensor.fromHost(dev, new Float32Array([1]));
 * using b = Tensor.fromHost(dev, new Float32Array([0]));
 * using y = Tensor.empty(dev, [2, 1], "f16");
 * using m = Tensor.empty(dev, [1], "f32");
 * using s = Tensor.empty(dev, [1], "f32");
 * batchNormForwardTrain(x, y, { gamma: g, beta: b, saveMean: m, saveInvStd: s, eps: 0 });
 * assert.deepStrictEqual([...await y.toHost()], [-1, 1]);
 * assert.deepStrictEqual([...await m.toHost()], [2]);
 * ```
 */
export function batchNormForwardTrain(
  x: Tensor,
  y: Tensor,
  options: BatchNormTrainOptions,
): void {
  const action = "run batchNormForwardTrain";
  const { gamma, beta, saveMean, saveInvStd } = options;
  const runMean = options.runMean ?? null, runVar = options.runVar ?? null;
  const dt = activations(action, [x, "x"], [y, "y"]);
  const { n, c, hw } = bnShape(x, action);
  shape(y, "y", x.shape, action);
  params(
    [[gamma, "gamma"], [beta, "beta"], [saveMean, "saveMean"], [saveInvStd, "saveInvStd"], [
      runMean,
      "runMean",
    ], [runVar, "runVar"]],
    c,
    action,
  );
  if (n * hw < 2) {
    throw new RangeError(
      `Cannot ${action}: need more than one value per channel, got x [${x.shape}]`,
    );
  }
  const momentum = num(options.momentum ?? 0.1, "momentum", action);
  const eps = num(options.eps ?? 1e-5, "eps", action);
  using launched = launch(
    action,
    options,
    x,
    gamma,
    beta,
    y,
    saveMean,
    saveInvStd,
    runMean,
    runVar,
  );
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_batchnorm_forward_train(
      x.pointer,
      gamma.pointer,
      beta.pointer,
      y.pointer,
      dt,
      saveMean.pointer,
      saveInvStd.pointer,
      ptr(runMean),
      ptr(runVar),
      BigInt(n),
      BigInt(c),
      BigInt(hw),
      momentum,
      eps,
      stream,
    ),
    `${action} x [${x.shape}]`,
  );
}

/**
 * Batch normalization in evaluation mode (running statistics).
 *
 * @param x f16 or f32 [N, C, ...].
 * @param y f16 or f32 like x.
 * @param options gamma, beta, runMean, runVar (f32 [C]); eps (1e-5), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example Using the running statistics
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { batchNormForwardEval } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using x = Tensor.fromHost(dev, new Float16Array([3]), [1, 1]);
 * using g = Tensor.fromHost(dev, new Float32Array([2]));
 * using b = Tensor.fromHost(dev, new Float32Array([1]));
 * using rm = Tensor.fromHost(dev, new Float32Array([1]));
 * using rv = Tensor.fromHost(dev, new Float32Array([4]));
 * using y = Tensor.empty(dev, [1, 1], "f16");
 * batchNormForwardEval(x, y, { gamma: g, beta: b, runMean: rm, runVar: rv, eps: 0 });
 * assert.deepStrictEqual([...await y.toHost()], [3]);
 * ```
 */
export function batchNormForwardEval(x: Tensor, y: Tensor, options: BatchNormEvalOptions): void {
  const action = "run batchNormForwardEval";
  const { gamma, beta, runMean, runVar } = options;
  const dt = activations(action, [x, "x"], [y, "y"]);
  const { n, c, hw } = bnShape(x, action);
  shape(y, "y", x.shape, action);
  params([[gamma, "gamma"], [beta, "beta"], [runMean, "runMean"], [runVar, "runVar"]], c, action);
  const eps = num(options.eps ?? 1e-5, "eps", action);
  using launched = launch(action, options, x, gamma, beta, runMean, runVar, y);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_batchnorm_forward_eval(
      x.pointer,
      gamma.pointer,
      beta.pointer,
      runMean.pointer,
      runVar.pointer,
      y.pointer,
      dt,
      BigInt(n),
      BigInt(c),
      BigInt(hw),
      eps,
      stream,
    ),
    `${action} x [${x.shape}]`,
  );
}

/**
 * Gradients of {@linkcode batchNormForwardTrain}: overwrites dx, dgamma and dbeta.
 *
 * @param dy f16 or f32 like x.
 * @param dx f16 or f32 like x, overwritten.
 * @param options x (the forward's input, f16 or f32 [N, C, ...]); gamma, saveMean, saveInvStd,
 *   dgamma, dbeta (f32 [C]); stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example dbeta is the sum of dy
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { batchNormBackward } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using dy = Tensor.fromHost(dev, new Float16Array([1, 2]), [2, 1]);
 * using x = Tensor.fromHost(dev, new Float16Array([1, 3]), [2, 1]);
 * using g = Tensor.fromHost(dev, new Float32Array([1]));
 * using m = Tensor.fromHost(dev, new Float32Array([2]));
 * using s = Tensor.fromHost(dev, new Float32Array([1]));
 * using dx = Tensor.empty(dev, [2, 1], "f16");
 * using dg = Tensor.empty(dev, [1], "f32");
 * using db = Tensor.empty(dev, [1], "f32");
 * batchNormBackward(dy, dx, { x, gamma: g, saveMean: m, saveInvStd: s, dgamma: dg, dbeta: db });
 * assert.deepStrictEqual([...await db.toHost()], [3]);
 * assert.deepStrictEqual([...await dg.toHost()], [1]);
 * ```
 */
export function batchNormBackward(dy: Tensor, dx: Tensor, options: BatchNormBackwardOptions): void {
  const action = "run batchNormBackward";
  const { x, gamma, saveMean, saveInvStd, dgamma, dbeta } = options;
  const dt = activations(action, [dy, "dy"], [x, "x"], [dx, "dx"]);
  const { n, c, hw } = bnShape(x, action);
  shape(dy, "dy", x.shape, action);
  shape(dx, "dx", x.shape, action);
  params(
    [[gamma, "gamma"], [saveMean, "saveMean"], [saveInvStd, "saveInvStd"], [
      dgamma,
      "dgamma",
    ], [dbeta, "dbeta"]],
    c,
    action,
  );
  using launched = launch(
    action,
    options,
    dy,
    x,
    gamma,
    saveMean,
    saveInvStd,
    dx,
    dgamma,
    dbeta,
  );
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_batchnorm_backward(
      dy.pointer,
      x.pointer,
      gamma.pointer,
      saveMean.pointer,
      saveInvStd.pointer,
      dx.pointer,
      dt,
      dgamma.pointer,
      dbeta.pointer,
      BigInt(n),
      BigInt(c),
      BigInt(hw),
      stream,
    ),
    `${action} x [${x.shape}]`,
  );
}

function channels(y: Tensor, name: string, action: string): { n: number; c: number; hw: number } {
  if (y.shape.length < 2) {
    throw new RangeError(`Cannot ${action}: ${name} must be [N, C, ...], got [${y.shape}]`);
  }
  return { n: y.shape[0], c: y.shape[1], hw: tail(y.shape, 2) };
}

/**
 * Adds a per-channel bias in place: `y[n, c, ...] += bias[c]` ([N, F] for linear layers).
 *
 * @param y f16 or f32 (f16 or f32) [N, C, ...].
 * @param bias f16 or f32 [C].
 * @param options stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { biasAdd } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using y = Tensor.fromHost(dev, new Float16Array([1, 2, 3, 4]), [2, 2]);
 * using b = Tensor.fromHost(dev, new Float32Array([10, 20]));
 * biasAdd(y, b);
 * assert.deepStrictEqual([...await y.toHost()], [11, 22, 13, 24]);
 * ```
 */
export function biasAdd(y: Tensor, bias: Tensor, options: OpOptions = {}): void {
  const action = "run biasAdd";
  const dt = activations(action, [y, "y"]);
  tensor(bias, "bias", ["f16", "f32"], action);
  const { n, c, hw } = channels(y, "y", action);
  shape(bias, "bias", [c], action);
  using launched = launch(action, options, y, bias);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_bias_add(
      y.pointer,
      dt,
      bias.pointer,
      code(bias),
      BigInt(n),
      BigInt(c),
      BigInt(hw),
      stream,
    ),
    `${action} y [${y.shape}]`,
  );
}

/**
 * Bias gradient: `dbias[c] = Σ dy[n, c, ...]` (added when accumulating).
 *
 * @param dy f16 or f32 [N, C, ...].
 * @param dbias f16 or f32 [C].
 * @param options accumulate, stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { biasGrad } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using dy = Tensor.fromHost(dev, new Float16Array([1, 2, 3, 4]), [2, 2]);
 * using db = Tensor.empty(dev, [2], "f32");
 * biasGrad(dy, db);
 * assert.deepStrictEqual([...await db.toHost()], [4, 6]);
 * ```
 */
export function biasGrad(dy: Tensor, dbias: Tensor, options: BiasGradOptions = {}): void {
  const action = "run biasGrad";
  const dt = activations(action, [dy, "dy"]);
  tensor(dbias, "dbias", ["f16", "f32"], action);
  const { n, c, hw } = channels(dy, "dy", action);
  shape(dbias, "dbias", [c], action);
  using launched = launch(action, options, dy, dbias);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_bias_grad(
      dy.pointer,
      dt,
      dbias.pointer,
      code(dbias),
      BigInt(n),
      BigInt(c),
      BigInt(hw),
      options.accumulate ? 1 : 0,
      stream,
    ),
    `${action} dy [${dy.shape}]`,
  );
}

function sameNumel(a: Tensor, b: Tensor, names: string, action: string): void {
  if (a.numel !== b.numel) {
    throw new RangeError(
      `Cannot ${action}: ${names} differ in size ([${a.shape}] and [${b.shape}])`,
    );
  }
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
 * import { reluForward } from "./ops.ts";
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
  device.check(
    device.lib.symbols.ps_nn_relu_forward(x.pointer, y.pointer, dt, BigInt(x.numel), stream),
    action,
  );
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
 * import { reluBackward } from "./ops.ts";
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
  device.check(
    device.lib.symbols.ps_nn_relu_backward(
      dy.pointer,
      y.pointer,
      dx.pointer,
      dt,
      BigInt(dy.numel),
      stream,
    ),
    action,
  );
}

function crossEntropy(
  action: string,
  logits: Tensor,
  labels: Tensor,
  dlogits: Tensor | null,
  options: CrossEntropyForwardOptions & Partial<CrossEntropyOptions>,
): void {
  const lossSum = options?.lossSum, correct = options?.correct;
  const dt = activations(action, [logits, "logits"]);
  tensor(labels, "labels", ["i32"], action);
  tensor(lossSum, "lossSum", ["f32"], action);
  tensor(correct, "correct", ["i32"], action);
  rank(logits, "logits", [2], action);
  const [n, k] = logits.shape;
  shape(labels, "labels", [n], action);
  if (dlogits !== null) {
    sameDtype(dlogits, "dlogits", logits, "logits", action);
    shape(dlogits, "dlogits", logits.shape, action);
  }
  scalar(lossSum, "lossSum", action);
  scalar(correct, "correct", action);
  const scale = num(options.scale ?? 1, "scale", action);
  const scaleTensor = options.scaleTensor ?? null;
  if (scaleTensor !== null) {
    tensor(scaleTensor, "scaleTensor", ["f32"], action);
    scalar(scaleTensor, "scaleTensor", action);
  }
  using launched = launch(
    action,
    options,
    logits,
    labels,
    dlogits,
    lossSum,
    correct,
    scaleTensor,
  );
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_cross_entropy(
      logits.pointer,
      labels.pointer,
      ptr(dlogits),
      dt,
      lossSum.pointer,
      correct.pointer,
      BigInt(n),
      BigInt(k),
      scale,
      ptr(scaleTensor),
      stream,
    ),
    `${action} logits [${logits.shape}]`,
  );
}

/**
 * Softmax cross-entropy with its gradient: adds the batch's summed loss to `lossSum` and
 * its correct count to `correct` (both stay on the device), and writes
 * `dlogits = scale · (softmax(logits) − onehot(labels)) / N`.
 *
 * @param logits f16 or f32 [N, K].
 * @param labels i32 [N], each in [0, K).
 * @param options dlogits (f16 or f32 [N, K], written), lossSum (f32 [1], added to), correct (i32
 *   [1], added to); scale (the loss scale, default 1) or scaleTensor, stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @throws {PinstreamError} On the CPU backend, when a label is out of range.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { crossEntropyForwardBackward } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using logits = Tensor.fromHost(dev, new Float16Array([0, 0]), [1, 2]);
 * using labels = Tensor.fromHost(dev, new Int32Array([1]));
 * using d = Tensor.empty(dev, [1, 2], "f16");
 * using loss = Tensor.fromHost(dev, new Float32Array([0]));
 * using hits = Tensor.fromHost(dev, new Int32Array([0]));
 * crossEntropyForwardBackward(logits, labels, { dlogits: d, lossSum: loss, correct: hits });
 * assert.ok(Math.abs((await loss.toHost())[0] - Math.LN2) < 1e-6);
 * assert.deepStrictEqual([...await d.toHost()], [0.5, -0.5]);
 * ```
 */
export function crossEntropyForwardBackward(
  logits: Tensor,
  labels: Tensor,
  options: CrossEntropyOptions,
): void {
  // A missing dlogits is undefined, not null: the helper rejects it, naming dlogits.
  crossEntropy("run crossEntropyForwardBackward", logits, labels, options?.dlogits, options);
}

/**
 * Softmax cross-entropy for evaluation: the sums of {@linkcode crossEntropyForwardBackward}
 * without the gradient.
 *
 * @param logits f16 or f32 [N, K].
 * @param labels i32 [N].
 * @param options lossSum (f32 [1], added to), correct (i32 [1], added to), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { crossEntropyForward } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using logits = Tensor.fromHost(dev, new Float16Array([3, 1, 0, 2]), [2, 2]);
 * using labels = Tensor.fromHost(dev, new Int32Array([0, 0]));
 * using loss = Tensor.fromHost(dev, new Float32Array([0]));
 * using hits = Tensor.fromHost(dev, new Int32Array([0]));
 * crossEntropyForward(logits, labels, { lossSum: loss, correct: hits });
 * assert.deepStrictEqual([...await hits.toHost()], [1]);
 * ```
 */
export function crossEntropyForward(
  logits: Tensor,
  labels: Tensor,
  options: CrossEntropyForwardOptions,
): void {
  // Only the forward's fields: a stray dlogits or scale in a reused options object must
  // not turn this into the backward.
  const { lossSum, correct, stream } = options ?? {};
  crossEntropy("run crossEntropyForward", logits, labels, null, { lossSum, correct, stream });
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
 * import { cast } from "./ops.ts";
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
  tensor(src, "src", ["f16", "f32"], action);
  tensor(dst, "dst", ["f16", "f32"], action);
  sameNumel(src, dst, "src and dst", action);
  using launched = launch(action, options, src, dst);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_cast(
      src.pointer,
      code(src),
      dst.pointer,
      code(dst),
      BigInt(src.numel),
      stream,
    ),
    `${action} ${src.dtype} -> ${dst.dtype}`,
  );
}

/**
 * GradScaler's inf/NaN check (and optional in-place unscale) of one gradient: sets
 * `foundInf` to 1 when any element is inf or NaN; never clears it.
 *
 * @param grad f16 or f32.
 * @param foundInf i32 [1].
 * @param options scale (f32 [1]; the kernel uses 1 / scale) or invScale, inPlace, stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When a scalar has the wrong size.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { unscaleAndCheck } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using g = Tensor.fromHost(dev, new Float32Array([4, Infinity]));
 * using flag = Tensor.fromHost(dev, new Int32Array([0]));
 * unscaleAndCheck(g, flag, { invScale: 0.5, inPlace: true });
 * assert.deepStrictEqual([...await flag.toHost()], [1]);
 * assert.deepStrictEqual([...await g.toHost()], [2, Infinity]);
 * ```
 */
export function unscaleAndCheck(
  grad: Tensor,
  foundInf: Tensor,
  options: UnscaleOptions = {},
): void {
  const action = "run unscaleAndCheck";
  tensor(grad, "grad", ["f16", "f32"], action);
  tensor(foundInf, "foundInf", ["i32"], action);
  scalar(foundInf, "foundInf", action);
  const scale = options.scale ?? null;
  if (scale !== null) {
    tensor(scale, "scale", ["f32"], action);
    scalar(scale, "scale", action);
  }
  const inv = num(options.invScale ?? 1, "invScale", action);
  using launched = launch(action, options, grad, foundInf, scale);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_unscale_check(
      grad.pointer,
      code(grad),
      BigInt(grad.numel),
      ptr(scale),
      inv,
      options.inPlace ? 1 : 0,
      foundInf.pointer,
      stream,
    ),
    `${action} [${grad.shape}]`,
  );
}

/**
 * One torch.optim.SGD update of a parameter on its fp32 master copy, from an fp16 (or
 * fp32) gradient; refreshes the fp16 copy the forward uses. With `foundInf` the update is
 * skipped on the device when the flag is set (no host round trip).
 *
 * @param param f32 master weights, updated.
 * @param grad f16 or f32, same number of elements.
 * @param options lr; momentumBuf (f32, zero-initialized by the caller; needed when momentum
 *   is not 0), paramHalf (f16 copy written after the update); momentum, dampening,
 *   nesterov, weightDecay, scale, foundInf, stepsDone, stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When sizes differ, or on a bad hyper-parameter.
 * @example Plain SGD
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { sgdStep } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using p = Tensor.fromHost(dev, new Float32Array([1, 2]));
 * using g = Tensor.fromHost(dev, new Float16Array([1, -1]));
 * using h = Tensor.empty(dev, [2], "f16");
 * sgdStep(p, g, { lr: 0.5, paramHalf: h });
 * assert.deepStrictEqual([...await p.toHost()], [0.5, 2.5]);
 * assert.deepStrictEqual([...await h.toHost()], [0.5, 2.5]);
 * ```
 */
export function sgdStep(param: Tensor, grad: Tensor, options: SgdStepOptions): void {
  const action = "run sgdStep";
  const momentumBuf = options?.momentumBuf ?? null;
  const paramHalf = options?.paramHalf ?? null;
  tensor(param, "param", ["f32"], action);
  tensor(grad, "grad", ["f16", "f32"], action);
  sameNumel(param, grad, "param and grad", action);
  if (momentumBuf !== null) {
    tensor(momentumBuf, "momentumBuf", ["f32"], action);
    sameNumel(param, momentumBuf, "param and momentumBuf", action);
  }
  if (paramHalf !== null) {
    tensor(paramHalf, "paramHalf", ["f16"], action);
    sameNumel(param, paramHalf, "param and paramHalf", action);
  }
  const lr = num(options?.lr, "lr", action);
  const momentum = num(options.momentum ?? 0, "momentum", action);
  const dampening = num(options.dampening ?? 0, "dampening", action);
  const weightDecay = num(options.weightDecay ?? 0, "weightDecay", action);
  if (momentum < 0) {
    throw new RangeError(`Cannot ${action}: momentum must be >= 0, got ${momentum}`);
  }
  if (momentum !== 0 && momentumBuf === null) {
    throw new TypeError(`Cannot ${action}: momentum ${momentum} needs a momentum buffer`);
  }
  if (options.nesterov && (momentum <= 0 || dampening !== 0)) {
    throw new RangeError(
      `Cannot ${action}: Nesterov momentum requires a momentum and zero dampening ` +
        `(momentum ${momentum}, dampening ${dampening})`,
    );
  }
  const scale = options.scale ?? null;
  const foundInf = options.foundInf ?? null;
  const stepsDone = options.stepsDone ?? null;
  for (
    const [t, name, dt] of [[scale, "scale", "f32"], [foundInf, "foundInf", "i32"], [
      stepsDone,
      "stepsDone",
      "i32",
    ]] as const
  ) {
    if (t === null) continue;
    tensor(t, name, [dt], action);
    scalar(t, name, action);
  }
  using launched = launch(
    action,
    options,
    param,
    grad,
    momentumBuf,
    paramHalf,
    scale,
    foundInf,
    stepsDone,
  );
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_sgd_step(
      param.pointer,
      grad.pointer,
      code(grad),
      ptr(momentumBuf),
      ptr(paramHalf),
      BigInt(param.numel),
      lr,
      momentum,
      dampening,
      weightDecay,
      options.nesterov ? 1 : 0,
      ptr(scale),
      ptr(foundInf),
      ptr(stepsDone),
      stream,
    ),
    `${action} [${param.shape}]`,
  );
}

/**
 * Counts a completed optimizer step on the device: `stepsDone += 1` unless `foundInf` is
 * set. Queue it after the step's {@linkcode sgdStep} calls.
 *
 * @param stepsDone i32 [1].
 * @param foundInf i32 [1] or null.
 * @param options stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When a scalar has the wrong size.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { stepCount } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using steps = Tensor.fromHost(dev, new Int32Array([0]));
 * using flag = Tensor.fromHost(dev, new Int32Array([1]));
 * stepCount(steps, null);
 * stepCount(steps, flag);
 * assert.deepStrictEqual([...await steps.toHost()], [1]);
 * ```
 */
export function stepCount(
  stepsDone: Tensor,
  foundInf: Tensor | null,
  options: OpOptions = {},
): void {
  const action = "run stepCount";
  tensor(stepsDone, "stepsDone", ["i32"], action);
  scalar(stepsDone, "stepsDone", action);
  if (foundInf !== null) {
    tensor(foundInf, "foundInf", ["i32"], action);
    scalar(foundInf, "foundInf", action);
  }
  using launched = launch(action, options, stepsDone, foundInf);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_step_count(stepsDone.pointer, ptr(foundInf), stream),
    action,
  );
}

/**
 * GradScaler's update on the device (torch._amp_update_scale_): after a step with inf/NaN
 * the scale is multiplied by `backoffFactor` and the tracker reset; otherwise the tracker
 * counts up and at `growthInterval` the scale grows by `growthFactor` (if still finite).
 *
 * @param scale f32 [1].
 * @param growthTracker i32 [1].
 * @param options foundInf (i32 [1], read only); growthFactor (2), backoffFactor (0.5),
 *   growthInterval (2000), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When a scalar has the wrong size or an option is invalid.
 * @example Back-off on an inf
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { scalerUpdate } from "./ops.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using scale = Tensor.fromHost(dev, new Float32Array([65536]));
 * using tracker = Tensor.fromHost(dev, new Int32Array([7]));
 * using flag = Tensor.fromHost(dev, new Int32Array([1]));
 * scalerUpdate(scale, tracker, { foundInf: flag });
 * assert.deepStrictEqual([...await scale.toHost()], [32768]);
 * assert.deepStrictEqual([...await tracker.toHost()], [0]);
 * ```
 */
export function scalerUpdate(
  scale: Tensor,
  growthTracker: Tensor,
  options: ScalerUpdateOptions,
): void {
  const action = "run scalerUpdate";
  const foundInf = options?.foundInf;
  tensor(scale, "scale", ["f32"], action);
  tensor(growthTracker, "growthTracker", ["i32"], action);
  tensor(foundInf, "foundInf", ["i32"], action);
  scalar(scale, "scale", action);
  scalar(growthTracker, "growthTracker", action);
  scalar(foundInf, "foundInf", action);
  const growth = num(options.growthFactor ?? 2, "growthFactor", action);
  const backoff = num(options.backoffFactor ?? 0.5, "backoffFactor", action);
  const interval = int(options.growthInterval ?? 2000, "growthInterval", 1, action);
  using launched = launch(action, options, scale, growthTracker, foundInf);
  const { device, stream } = launched;
  device.check(
    device.lib.symbols.ps_nn_scaler_update(
      scale.pointer,
      growthTracker.pointer,
      foundInf.pointer,
      growth,
      backoff,
      interval,
      stream,
    ),
    action,
  );
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
 * import { copyIf } from "./ops.ts";
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
  device.check(
    device.lib.symbols.ps_nn_copy_if(
      dst.pointer,
      src.pointer,
      BigInt(dst.numel),
      flag.pointer,
      stream,
    ),
    `${action} [${dst.shape}]`,
  );
}
