/**
 * Per-channel ops over [N, C, ...]: batch normalization (training, evaluation, backward) and the
 * bias of linear and convolution layers.
 *
 * Each op checks dtypes, shapes and devices (TypeError / RangeError naming the offending
 * value) and then queues the kernel on `options.stream` (default: the device's default
 * stream) through the device's backend (ops/backend.ts). Nothing here waits for the device or
 * reads device memory: results are read with `Tensor.toHost()`.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `batchNormForwardTrain(x, y, {gamma, beta, saveMean, saveInvStd, runMean, runVar, momentum, eps, relu, runBackup, workspace})` | x, y f16 or f32 [N,C,…]; the rest f32 [C] | biased batch var for y, unbiased for runVar (PyTorch); runMean/runVar may be left out; `relu` fuses a ReLU; a fixed two-phase reduction (the same bits every run) |
 * | `batchNormForwardEval(x, y, {gamma, beta, runMean, runVar, eps})` | | |
 * | `batchNormBackward(dy, dx, {x, gamma, saveMean, saveInvStd, dgamma, dbeta, relu, y, workspace})` | dgamma, dbeta f32 | overwrites dx, dgamma, dbeta; with `relu`, dy is masked by the forward's y first |
 * | `biasAdd(y, bias)` | y f16 or f32 [N,C,…] or [N,F]; bias f16/f32 [C] | in place |
 * | `biasGrad(dy, dbias, {accumulate})` | dbias f16/f32 [C] | |
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import type { OpOptions } from "./backend.ts";
import { ACT, activations, code, launch, num, queue, shape, tail, tensor } from "./_launch.ts";

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
  /** Apply ReLU to the output in the same pass (default false): y = relu(bn(x)). */
  relu?: boolean;
  /**
   * f32 [2C], written before the update (default null): the running mean, then the running
   * variance, as they were, so a skipped step can restore them (ops/optim.ts `multiCopyIf`).
   */
  runBackup?: Tensor | null;
  /**
   * f32, at least {@linkcode batchNormWorkspaceSize} elements: the per-group partial statistics.
   * Without it each call takes scratch memory of its own (a stream-ordered allocation on CUDA).
   */
  workspace?: Tensor | null;
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
  /** The forward ran with `relu`: dy is masked by y > 0 first (default false). */
  relu?: boolean;
  /** The forward's output, f16 or f32 like x: needed with `relu`. */
  y?: Tensor | null;
  /** As {@linkcode BatchNormTrainOptions.workspace}. */
  workspace?: Tensor | null;
}

/** Options of {@linkcode biasGrad}. */
export interface BiasGradOptions extends OpOptions {
  /** Add to `dbias` instead of overwriting it. */
  accumulate?: boolean;
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

function channels(y: Tensor, name: string, action: string): { n: number; c: number; hw: number } {
  if (y.shape.length < 2) {
    throw new RangeError(`Cannot ${action}: ${name} must be [N, C, ...], got [${y.shape}]`);
  }
  return { n: y.shape[0], c: y.shape[1], hw: tail(y.shape, 2) };
}

/** PS_BN_RELU of kernels/pinstream.h. */
const BN_RELU = 1;

function workspaceOf(w: Tensor | null | undefined, action: string): Tensor | null {
  if (!w) return null;
  tensor(w, "workspace", ["f32"], action);
  return w;
}

/**
 * The f32 elements of workspace that batch norm over `shape` takes: three per (group, channel)
 * of its fixed two-phase reduction (kernels/rules.h `ps_bn_groups`, `ps_bn_work_floats`;
 * `ps_nn_batchnorm_workspace` answers the same in C, and the kernels refuse a smaller one).
 * Allocate it once and pass it as `workspace` to {@linkcode batchNormForwardTrain} and
 * {@linkcode batchNormBackward}.
 *
 * @param shape x's shape, [N, C, ...] with N >= 1.
 * @returns The element count.
 * @throws {RangeError} When the shape is not [N, C, ...].
 * @example
 * ```ts
 * import { batchNormWorkspaceSize } from "./norm.ts";
 * import assert from "node:assert";
 * // 32 channels of 128 x 32 x 32 values: 32 groups of 4 samples each
 * assert.strictEqual(batchNormWorkspaceSize([128, 32, 32, 32]), 3 * 32 * 32);
 * ```
 */
export function batchNormWorkspaceSize(shape: readonly number[]): number {
  if (shape.length < 2 || !shape.every((d) => Number.isInteger(d) && d >= 1)) {
    throw new RangeError(
      `Cannot size a batch-norm workspace: shape must be [N, C, ...], got [${shape}]`,
    );
  }
  const n = shape[0], c = shape[1], hw = tail(shape, 2);
  let g = Math.ceil(1024 / c);
  g = Math.min(g, Math.floor((n * hw) / 2048), n, 1024);
  return 3 * c * Math.max(1, g);
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
 * import { batchNormForwardTrain } from "./norm.ts";
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
  const work = workspaceOf(options.workspace, action);
  const runBackup = options.runBackup ?? null;
  if (runBackup) {
    tensor(runBackup, "runBackup", ["f32"], action);
    shape(runBackup, "runBackup", [2 * c], action);
  }
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
    runBackup,
    work,
  );
  const { device, stream } = launched;
  queue(device, "batchNormForwardTrain", {
    x,
    gamma,
    beta,
    y,
    dtype: dt,
    save_mean: saveMean,
    save_invstd: saveInvStd,
    run_mean: runMean,
    run_var: runVar,
    run_backup: runBackup,
    work,
    work_floats: work?.numel ?? 0,
    n,
    c,
    hw,
    momentum,
    eps,
    act: options.relu ? BN_RELU : 0,
    stream,
  }, `${action} x [${x.shape}]`);
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
 * import { batchNormForwardEval } from "./norm.ts";
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
  queue(device, "batchNormForwardEval", {
    x,
    gamma,
    beta,
    run_mean: runMean,
    run_var: runVar,
    y,
    dtype: dt,
    n,
    c,
    hw,
    eps,
    stream,
  }, `${action} x [${x.shape}]`);
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
 * import { batchNormBackward } from "./norm.ts";
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
  const relu = options.relu ?? false;
  const y = options.y ?? null;
  if (relu) {
    if (!y) throw new TypeError(`Cannot ${action}: relu needs the forward's output y`);
    activations(action, [y, "y"], [x, "x"]);
    shape(y, "y", x.shape, action);
  }
  const work = workspaceOf(options.workspace, action);
  using launched = launch(
    action,
    options,
    dy,
    x,
    relu ? y : null,
    gamma,
    saveMean,
    saveInvStd,
    dx,
    dgamma,
    dbeta,
    work,
  );
  const { device, stream } = launched;
  queue(device, "batchNormBackward", {
    dy,
    x,
    y: relu ? y : null,
    gamma,
    save_mean: saveMean,
    save_invstd: saveInvStd,
    dx,
    dtype: dt,
    dgamma,
    dbeta,
    work,
    work_floats: work?.numel ?? 0,
    n,
    c,
    hw,
    act: relu ? BN_RELU : 0,
    stream,
  }, `${action} x [${x.shape}]`);
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
 * import { biasAdd } from "./norm.ts";
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
  tensor(bias, "bias", ACT, action);
  const { n, c, hw } = channels(y, "y", action);
  shape(bias, "bias", [c], action);
  using launched = launch(action, options, y, bias);
  const { device, stream } = launched;
  queue(
    device,
    "biasAdd",
    { y, dtype: dt, bias, bias_dtype: code(bias), n, c, hw, stream },
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
 * import { biasGrad } from "./norm.ts";
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
  tensor(dbias, "dbias", ACT, action);
  const { n, c, hw } = channels(dy, "dy", action);
  shape(dbias, "dbias", [c], action);
  using launched = launch(action, options, dy, dbias);
  const { device, stream } = launched;
  queue(device, "biasGrad", {
    dy,
    dtype: dt,
    dbias,
    dbias_dtype: code(dbias),
    n,
    c,
    hw,
    accumulate: options.accumulate ? 1 : 0,
    stream,
  }, `${action} dy [${dy.shape}]`);
}
