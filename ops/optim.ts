/**
 * The optimizer step and the loss scaler on the device: SGD on fp32 master weights, the
 * inf/NaN check, the step counter and the scale update, none of them needing a host round
 * trip.
 *
 * Unscaling fp16 gradients in place (`inPlace: true`) can flush small values to zero: the
 * loss scale exists to keep them representable. The fused path (`sgdStep` with `scale`)
 * unscales in fp32 and is the one `GradScaler.step` should use.
 *
 * Each op checks dtypes, shapes and devices (TypeError / RangeError naming the offending
 * value) and then queues the kernel on `options.stream` (default: the device's default
 * stream) through the device's backend (ops/backend.ts). Nothing here waits for the device or
 * reads device memory: results are read with `Tensor.toHost()`.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `unscaleAndCheck(grad, foundInf, {scale, invScale, inPlace})` | grad f16/f32; foundInf i32 [1]; scale f32 [1] or null | foundInf = 1 on any inf/NaN (never cleared); inPlace: grad *= 1/scale (or invScale) |
 * | `sgdStep(param, grad, {lr, momentumBuf, paramHalf, momentum, dampening, nesterov, weightDecay, scale, foundInf, stepsDone})` | param, momentumBuf f32; grad f16/f32; paramHalf f16 or null | torch.optim.SGD; grad unscaled by 1/scale in fp32; skipped on the device when foundInf != 0; stepsDone i32 [1] == 0 selects PyTorch's first-step buffer init |
 * | `stepCount(stepsDone, foundInf)` | i32 [1] | stepsDone += 1 unless foundInf != 0; call after the step's sgdSteps |
 * | `scalerUpdate(scale, growthTracker, {foundInf, growthFactor, backoffFactor, growthInterval})` | f32 [1], i32 [1], i32 [1] | torch._amp_update_scale_; foundInf is read, not cleared |
 * | `multiUnscaleAndCheck(list, foundInf, {scale, invScale, inPlace})` | an "sgd" TensorList | unscaleAndCheck over every gradient of the list, one launch |
 * | `multiSgdStep(list, {lr, momentum, dampening, nesterov, weightDecay, scale, foundInf, stepsDone})` | an "sgd" TensorList | sgdStep on every parameter of the list, one launch, the same bits |
 * | `multiCopyIf(list, {flag})` | a "copy" TensorList | copyIf on every entry, one launch (flag null: always) |
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import type { OpOptions } from "./backend.ts";
import {
  ACT,
  code,
  HALF,
  int,
  launch,
  launchOn,
  num,
  queue,
  sameNumel,
  scalar,
  tensor,
} from "./_launch.ts";
import type { TensorList } from "./tensor_list.ts";

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
  /**
   * f32 [2]: lr and momentum read on the device in place of `lr` and `momentum` (momentum
   * applies only with a `momentumBuf`), so a recorded step replays with the values of the
   * moment (default null).
   */
  hyper?: Tensor | null;
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
 * import { unscaleAndCheck } from "./optim.ts";
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
  tensor(grad, "grad", ACT, action);
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
  queue(device, "unscaleCheck", {
    grad,
    grad_dtype: code(grad),
    count: grad.numel,
    scale,
    inv_scale: inv,
    in_place: options.inPlace ? 1 : 0,
    found_inf: foundInf,
    stream,
  }, `${action} [${grad.shape}]`);
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
 * import { sgdStep } from "./optim.ts";
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
  tensor(grad, "grad", ACT, action);
  sameNumel(param, grad, "param and grad", action);
  if (momentumBuf !== null) {
    tensor(momentumBuf, "momentumBuf", ["f32"], action);
    sameNumel(param, momentumBuf, "param and momentumBuf", action);
  }
  if (paramHalf !== null) {
    tensor(paramHalf, "paramHalf", HALF, action);
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
  const hyper = options.hyper ?? null;
  if (hyper !== null) {
    tensor(hyper, "hyper", ["f32"], action);
    if (hyper.numel !== 2) {
      throw new RangeError(`Cannot ${action}: hyper must hold 2 elements, got [${hyper.shape}]`);
    }
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
    hyper,
  );
  const { device, stream } = launched;
  queue(device, "sgdStep", {
    param,
    grad,
    grad_dtype: code(grad),
    momentum_buf: momentumBuf,
    param_half: paramHalf,
    half_dtype: paramHalf === null ? 0 : code(paramHalf),
    count: param.numel,
    lr,
    momentum,
    dampening,
    weight_decay: weightDecay,
    nesterov: options.nesterov ? 1 : 0,
    scale,
    found_inf: foundInf,
    steps_done: stepsDone,
    hyper,
    stream,
  }, `${action} [${param.shape}]`);
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
 * import { stepCount } from "./optim.ts";
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
  queue(device, "stepCount", { steps_done: stepsDone, found_inf: foundInf, stream }, action);
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
 * import { scalerUpdate } from "./optim.ts";
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
  queue(device, "scalerUpdate", {
    scale,
    growth_tracker: growthTracker,
    found_inf: foundInf,
    growth_factor: growth,
    backoff_factor: backoff,
    growth_interval: interval,
    stream,
  }, action);
}

/**
 * {@linkcode unscaleAndCheck} over every gradient of an "sgd" {@linkcode TensorList}, in one
 * launch: sets `foundInf` to 1 when any element of any gradient is inf or NaN.
 *
 * @param list The parameters (their gradients are checked).
 * @param foundInf i32 [1].
 * @param options scale (f32 [1]; the kernel uses 1 / scale) or invScale, inPlace, stream.
 * @throws {TypeError} On a wrong dtype, list kind or device.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { multiUnscaleAndCheck } from "./optim.ts";
 * import { TensorList } from "./tensor_list.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using p = Tensor.fromHost(dev, new Float32Array([1]));
 * using g = Tensor.fromHost(dev, new Float16Array([Infinity]));
 * using flag = Tensor.fromHost(dev, new Int32Array([0]));
 * using list = new TensorList(dev, "sgd");
 * list.setSgd([{ param: p, grad: g, momentumBuf: null, paramHalf: null }]);
 * multiUnscaleAndCheck(list, flag);
 * assert.deepStrictEqual([...await flag.toHost()], [1]);
 * ```
 */
export function multiUnscaleAndCheck(
  list: TensorList,
  foundInf: Tensor,
  options: UnscaleOptions = {},
): void {
  const action = "run multiUnscaleAndCheck";
  listOf(list, "sgd", action);
  tensor(foundInf, "foundInf", ["i32"], action);
  scalar(foundInf, "foundInf", action);
  const scale = options.scale ?? null;
  if (scale !== null) {
    tensor(scale, "scale", ["f32"], action);
    scalar(scale, "scale", action);
  }
  const inv = num(options.invScale ?? 1, "invScale", action);
  using launched = launchOn(list.device, action, options, foundInf, scale);
  const { device, stream } = launched;
  queue(device, "multiUnscaleCheck", {
    list: list.pointer,
    n: list.length,
    max_count: list.maxCount,
    scale,
    inv_scale: inv,
    in_place: options.inPlace ? 1 : 0,
    found_inf: foundInf,
    stream,
  }, `${action} (${list.length} tensors)`);
}

/** Hyper-parameters and device scalars of {@linkcode multiSgdStep}. */
export type MultiSgdStepOptions = Omit<SgdStepOptions, "momentumBuf" | "paramHalf">;

/**
 * {@linkcode sgdStep} on every parameter of an "sgd" {@linkcode TensorList}, in one launch,
 * with the same hyper-parameters: the same bits as one call per parameter. Each entry needs a
 * momentum buffer when momentum is not 0 (the list's builder checks; the CUDA kernel cannot).
 *
 * @param list The parameters, gradients, momentum buffers and fp16 copies.
 * @param options lr; momentum, dampening, nesterov, weightDecay, scale, foundInf, stepsDone,
 *   stream.
 * @throws {TypeError} On a wrong dtype, list kind or device.
 * @throws {RangeError} On a bad hyper-parameter.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { multiSgdStep } from "./optim.ts";
 * import { TensorList } from "./tensor_list.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float32Array([1]));
 * using b = Tensor.fromHost(dev, new Float32Array([2, 3]));
 * using ga = Tensor.fromHost(dev, new Float16Array([1]));
 * using gb = Tensor.fromHost(dev, new Float16Array([2, -2]));
 * using list = new TensorList(dev, "sgd");
 * list.setSgd([
 *   { param: a, grad: ga, momentumBuf: null, paramHalf: null },
 *   { param: b, grad: gb, momentumBuf: null, paramHalf: null },
 * ]);
 * multiSgdStep(list, { lr: 0.5 });
 * assert.deepStrictEqual([...await a.toHost()], [0.5]);
 * assert.deepStrictEqual([...await b.toHost()], [1, 4]);
 * ```
 */
export function multiSgdStep(list: TensorList, options: MultiSgdStepOptions): void {
  const action = "run multiSgdStep";
  listOf(list, "sgd", action);
  const lr = num(options?.lr, "lr", action);
  const momentum = num(options.momentum ?? 0, "momentum", action);
  const dampening = num(options.dampening ?? 0, "dampening", action);
  const weightDecay = num(options.weightDecay ?? 0, "weightDecay", action);
  if (momentum < 0) {
    throw new RangeError(`Cannot ${action}: momentum must be >= 0, got ${momentum}`);
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
  const hyper = options.hyper ?? null;
  if (hyper !== null) {
    tensor(hyper, "hyper", ["f32"], action);
    if (hyper.numel !== 2) {
      throw new RangeError(`Cannot ${action}: hyper must hold 2 elements, got [${hyper.shape}]`);
    }
  }
  using launched = launchOn(list.device, action, options, scale, foundInf, stepsDone, hyper);
  const { device, stream } = launched;
  queue(device, "multiSgdStep", {
    list: list.pointer,
    n: list.length,
    max_count: list.maxCount,
    lr,
    momentum,
    dampening,
    weight_decay: weightDecay,
    nesterov: options.nesterov ? 1 : 0,
    scale,
    found_inf: foundInf,
    steps_done: stepsDone,
    hyper,
    stream,
  }, `${action} (${list.length} tensors)`);
}

/**
 * {@linkcode copyIf} on every entry of a "copy" {@linkcode TensorList}, in one launch: the
 * copies happen when the device flag is non-zero (always when `flag` is null).
 *
 * @param list The copies.
 * @param options flag (i32 [1] or null), stream.
 * @throws {TypeError} On a wrong dtype, list kind or device.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { multiCopyIf } from "./optim.ts";
 * import { TensorList } from "./tensor_list.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using saved = Tensor.fromHost(dev, new Float32Array([1, 2]));
 * using x = Tensor.fromHost(dev, new Float32Array([NaN, NaN]));
 * using set = Tensor.fromHost(dev, new Int32Array([1]));
 * using list = new TensorList(dev, "copy");
 * list.setCopies([{ dst: x, src: saved }]);
 * multiCopyIf(list, { flag: set });
 * assert.deepStrictEqual([...await x.toHost()], [1, 2]);
 * ```
 */
export function multiCopyIf(list: TensorList, options: MultiCopyIfOptions): void {
  const action = "run multiCopyIf";
  listOf(list, "copy", action);
  const flag = options?.flag ?? null;
  if (flag !== null) {
    tensor(flag, "flag", ["i32"], action);
    scalar(flag, "flag", action);
  }
  using launched = launchOn(list.device, action, options, flag);
  const { device, stream } = launched;
  queue(device, "multiCopyIf", {
    list: list.pointer,
    n: list.length,
    max_count: list.maxCount,
    flag,
    stream,
  }, `${action} (${list.length} tensors)`);
}

/** Options of {@linkcode multiCopyIf}. */
export interface MultiCopyIfOptions extends OpOptions {
  /** i32 [1]: copy when non-zero (null: always). */
  flag: Tensor | null;
}

function listOf(list: TensorList, kind: "sgd" | "copy", action: string): void {
  if (list?.kind !== kind) {
    throw new TypeError(`Cannot ${action}: expected a "${kind}" TensorList, got ${list?.kind}`);
  }
}
