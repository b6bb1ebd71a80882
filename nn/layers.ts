/**
 * Layers with hand-written backward passes: Linear, Conv2d, BatchNorm2d, ReLU, MaxPool2d,
 * Flatten and Sequential.
 *
 * Activations and their gradients are fp16 under the default mixed precision (NCHW, or [N, F]
 * for Linear); every kernel accumulates in fp32. Weights keep an fp32 master copy (updated by
 * the optimizer) and an fp16 copy the kernels read; biases and batch-norm parameters are read
 * in fp32 directly. All parameter gradients are fp32: they are written by fp32-accumulating
 * kernels anyway, and fp32 keeps small per-element gradients that fp16 would flush to zero.
 * A model moved with `to(device, { precision: "fp32" })` computes everything in fp32: each
 * layer runs in its input's dtype, and Linear and Conv2d refuse an input of the other one. Initializations are
 * PyTorch's defaults, drawn on the host from a seeded generator.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import type { Tensor } from "../ffi/tensor.ts";
import * as ops from "../ops/mod.ts";
import { kaimingUniform, uniform, Xoshiro128 } from "./init.ts";
import { type BackwardOptions, type ExtraStateLoad, Module } from "./module.ts";
import { BufferTensor, Parameter } from "./parameter.ts";
import type { HostTensor } from "./safetensors.ts";

/** The generator layers draw their initial weights from when none is given. */
export const defaultInitRng: Xoshiro128 = new Xoshiro128(0);

function checkPositiveInt(what: string, v: number): void {
  if (!Number.isInteger(v) || v <= 0) {
    throw new RangeError(`Cannot create the layer: ${what} ${v} is not a positive integer`);
  }
}

const PRECISION_OF: Readonly<Record<string, string>> = { f16: "fp16", bf16: "bf16", f32: "fp32" };

/**
 * Refuses an input whose dtype is not the one `weight` is read in: the model's precision
 * (fp16 reads f16 activations, bf16 bf16 ones, fp32 f32 ones).
 */
function checkInputDtype(x: Tensor, weight: Parameter, layer: string): void {
  const want = weight.value.dtype;
  if (x.dtype === want) return;
  const precision = PRECISION_OF[want];
  // bf16 batches are cast on the device from an f32 DevicePrefetcher (the fit loop does so).
  const source = want === "bf16"
    ? `ops.cast of f32 batches into a bf16 tensor`
    : `a DevicePrefetcher with dtype "${want}"`;
  const other = PRECISION_OF[x.dtype] ?? (precision === "fp32" ? "fp16" : "fp32");
  throw new TypeError(
    `Cannot run ${layer}: the input is ${x.dtype} but the layer computes in ${precision}; ` +
      `give it ${want} inputs (${source}), or move the model ` +
      `with to(device, { precision: "${other}" })`,
  );
}

function shapeOf(t: Tensor): number[] {
  return [...t.shape];
}

/** Options of {@linkcode Linear}. */
export interface LinearOptions {
  /** Add a learnable bias (default true). */
  bias?: boolean;
  /** The generator for the initial weights (default {@linkcode defaultInitRng}). */
  rng?: Xoshiro128;
}

/**
 * `nn.Linear`: y = x W^T + b for x of shape [N, inFeatures]. Weight [out, in] initialized with
 * kaiming_uniform_(a = sqrt(5)), bias with U(±1/sqrt(inFeatures)).
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { Linear, Xoshiro128 } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using fc = new Linear(2, 1, { rng: new Xoshiro128(1) }).to(device);
 * fc.weight.write(new Float32Array([1, 2]));
 * fc.bias!.write(new Float32Array([0.5]));
 * using x = Tensor.fromHost(device, new Float16Array([3, 4]), [1, 2]);
 * assert.deepStrictEqual([...await fc.forward(x).toHost()], [11.5]);
 * ```
 */
export class Linear extends Module {
  /** Input features. */
  readonly inFeatures: number;
  /** Output features. */
  readonly outFeatures: number;
  /** Weight [outFeatures, inFeatures]. */
  readonly weight: Parameter;
  /** Bias [outFeatures], or null. */
  readonly bias: Parameter | null;
  #x: Tensor | null = null;

  /**
   * Creates the layer with PyTorch's default initialization (weights on the host).
   *
   * @param inFeatures Input features.
   * @param outFeatures Output features.
   * @param options Bias and generator.
   * @throws {RangeError} When a size is not a positive integer.
   */
  constructor(inFeatures: number, outFeatures: number, options: LinearOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["bias", "rng"], "create Linear");
    super();
    checkPositiveInt("inFeatures", inFeatures);
    checkPositiveInt("outFeatures", outFeatures);
    this.inFeatures = inFeatures;
    this.outFeatures = outFeatures;
    const rng = options.rng ?? defaultInitRng;
    const w = kaimingUniform(new Float32Array(outFeatures * inFeatures), inFeatures, rng);
    this.weight = new Parameter(w, [outFeatures, inFeatures], { gradDtype: "f32" });
    this.params.set("weight", this.weight);
    this.bias = null;
    if (options.bias ?? true) {
      const bound = 1 / Math.sqrt(inFeatures);
      const b = uniform(new Float32Array(outFeatures), -bound, bound, rng);
      this.bias = new Parameter(b, [outFeatures], { computeDtype: "f32" });
      this.params.set("bias", this.bias);
    }
  }

  /**
   * Runs the layer.
   *
   * @param x Input [N, inFeatures], f16 (precision fp16) or f32 (fp32).
   * @returns Output [N, outFeatures], the input's dtype.
   * @throws {RangeError} When the input's shape does not fit.
   */
  forward(x: Tensor): Tensor {
    if (x.shape.length !== 2 || x.shape[1] !== this.inFeatures) {
      throw new RangeError(
        `Cannot run Linear(${this.inFeatures}, ${this.outFeatures}): input shape [${x.shape}]`,
      );
    }
    checkInputDtype(x, this.weight, `Linear(${this.inFeatures}, ${this.outFeatures})`);
    const n = x.shape[0];
    const y = this.workspace("y", [n, this.outFeatures], x.dtype);
    // The bias is added as the product is stored: one call, the bits of matmul + biasAdd.
    ops.matmul(x, this.weight.value, { out: y, transB: true, bias: this.bias?.value });
    this.#x = this.training ? x : null;
    return y;
  }

  /**
   * Back-propagates the output gradient: writes the parameter gradients, returns the input gradient.
   *
   * @param dy Output gradient [N, outFeatures], f16 or f32.
   * @param options Whether to compute the input gradient.
   * @returns Input gradient [N, inFeatures], the same dtype, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    const x = this.#x;
    if (!x) throw new TypeError("Cannot run Linear.backward: no training forward before it");
    ops.matmul(dy, x, { out: this.weight.grad, transA: true });
    if (this.bias) ops.biasGrad(dy, this.bias.grad);
    if (options.inputGrad === false) return null;
    const dx = this.workspace("dx", shapeOf(x), x.dtype);
    ops.matmul(dy, this.weight.value, { out: dx });
    return dx;
  }
}

/** Options of {@linkcode Conv2d}. */
export interface Conv2dOptions {
  /** Square kernel size (default 3). */
  kernelSize?: number;
  /** Stride (default 1). */
  stride?: number;
  /** Zero padding on each side (default 0, as in PyTorch). */
  padding?: number;
  /** Add a learnable bias (default true). */
  bias?: boolean;
  /** The generator for the initial weights. */
  rng?: Xoshiro128;
}

/**
 * `nn.Conv2d` with a square kernel: weight [out, in, k, k] initialized with
 * kaiming_uniform_(a = sqrt(5)), bias U(±1/sqrt(in * k * k)).
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { Conv2d } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using conv = new Conv2d(1, 2, { kernelSize: 3, padding: 1 }).to(device);
 * using x = Tensor.fromHost(device, new Float16Array(16), [1, 1, 4, 4]);
 * assert.deepStrictEqual(conv.forward(x).shape, [1, 2, 4, 4]);
 * ```
 */
export class Conv2d extends Module {
  /** Input channels. */
  readonly inChannels: number;
  /** Output channels. */
  readonly outChannels: number;
  /** Kernel size. */
  readonly kernelSize: number;
  /** Stride. */
  readonly stride: number;
  /** Padding. */
  readonly padding: number;
  /** Weight [out, in, k, k]. */
  readonly weight: Parameter;
  /** Bias [out], or null. */
  readonly bias: Parameter | null;
  #x: Tensor | null = null;

  /**
   * Creates the layer with PyTorch's default initialization (weights on the host).
   *
   * @param inChannels Input channels.
   * @param outChannels Output channels.
   * @param options Kernel size, stride, padding, bias, generator.
   * @throws {RangeError} When a size is invalid.
   */
  constructor(inChannels: number, outChannels: number, options: Conv2dOptions = {}) {
    super();
    refuseUnknownKeys(
      options ?? {},
      ["kernelSize", "stride", "padding", "bias", "rng"],
      "create Conv2d",
    );
    checkPositiveInt("inChannels", inChannels);
    checkPositiveInt("outChannels", outChannels);
    this.inChannels = inChannels;
    this.outChannels = outChannels;
    this.kernelSize = options.kernelSize ?? 3;
    this.stride = options.stride ?? 1;
    this.padding = options.padding ?? 0;
    checkPositiveInt("kernelSize", this.kernelSize);
    checkPositiveInt("stride", this.stride);
    if (!Number.isInteger(this.padding) || this.padding < 0) {
      throw new RangeError(`Cannot create the layer: padding ${this.padding} is invalid`);
    }
    const rng = options.rng ?? defaultInitRng;
    const k = this.kernelSize;
    const fanIn = inChannels * k * k;
    const w = kaimingUniform(new Float32Array(outChannels * fanIn), fanIn, rng);
    this.weight = new Parameter(w, [outChannels, inChannels, k, k], { gradDtype: "f32" });
    this.params.set("weight", this.weight);
    this.bias = null;
    if (options.bias ?? true) {
      const bound = 1 / Math.sqrt(fanIn);
      const b = uniform(new Float32Array(outChannels), -bound, bound, rng);
      this.bias = new Parameter(b, [outChannels], { computeDtype: "f32" });
      this.params.set("bias", this.bias);
    }
  }

  /**
   * The output shape for an input shape.
   *
   * @param shape [N, C, H, W].
   * @returns [N, outChannels, OH, OW].
   */
  outputShape(shape: readonly number[]): number[] {
    const [n, , h, w] = shape;
    const k = this.kernelSize, s = this.stride, p = this.padding;
    return [
      n,
      this.outChannels,
      Math.floor((h + 2 * p - k) / s) + 1,
      Math.floor((w + 2 * p - k) / s) + 1,
    ];
  }

  /**
   * Runs the layer.
   *
   * @param x Input [N, inChannels, H, W], f16 (precision fp16) or f32 (fp32).
   * @returns Output [N, outChannels, OH, OW], the input's dtype.
   * @throws {RangeError} When the input's shape does not fit.
   */
  forward(x: Tensor): Tensor {
    if (x.shape.length !== 4 || x.shape[1] !== this.inChannels) {
      throw new RangeError(
        `Cannot run Conv2d(${this.inChannels}, ${this.outChannels}): input shape [${x.shape}]`,
      );
    }
    checkInputDtype(x, this.weight, `Conv2d(${this.inChannels}, ${this.outChannels})`);
    const y = this.workspace("y", this.outputShape(x.shape), x.dtype);
    ops.conv2dForward(x, y, {
      weight: this.weight.value,
      stride: this.stride,
      padding: this.padding,
    });
    if (this.bias) ops.biasAdd(y, this.bias.value);
    this.#x = this.training ? x : null;
    return y;
  }

  /**
   * Back-propagates the output gradient: writes the parameter gradients, returns the input gradient.
   *
   * @param dy Output gradient, f16 or f32.
   * @param options Whether to compute the input gradient.
   * @returns Input gradient, the same dtype, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    const x = this.#x;
    if (!x) throw new TypeError("Cannot run Conv2d.backward: no training forward before it");
    const opts = { stride: this.stride, padding: this.padding };
    ops.conv2dBackwardWeight(dy, this.weight.grad, { ...opts, x });
    if (this.bias) ops.biasGrad(dy, this.bias.grad);
    if (options.inputGrad === false) return null;
    const dx = this.workspace("dx", shapeOf(x), x.dtype);
    ops.conv2dBackwardData(dy, dx, { ...opts, weight: this.weight.value });
    return dx;
  }
}

/** Options of {@linkcode BatchNorm2d}. */
export interface BatchNorm2dOptions {
  /** Added to the variance (default 1e-5). */
  eps?: number;
  /** Running-statistics momentum (default 0.1). */
  momentum?: number;
  /**
   * Apply ReLU to the output in the same kernels, forward and backward (default false): the
   * layer is then BatchNorm2d followed by ReLU, with the same bits as the two layers. A
   * {@linkcode Sequential} fuses a BatchNorm2d followed by a ReLU in training on its own.
   */
  relu?: boolean;
}

/**
 * `nn.BatchNorm2d` (affine, tracking running statistics): gamma = 1, beta = 0, running mean 0,
 * running variance 1. Training normalizes with the batch statistics and updates the running
 * ones (unbiased variance, as PyTorch); evaluation uses the running ones. Unlike PyTorch, a
 * step that the {@linkcode GradScaler} skips for inf/NaN gradients also undoes that batch's
 * running-statistics update (see {@linkcode Module.revertRunningStats}); `numBatchesTracked`
 * still counts every training forward.
 *
 * @example
 * ```ts
 * import { BatchNorm2d } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const bn = new BatchNorm2d(3);
 * assert.deepStrictEqual(
 *   bn.namedParameters().map(([n]) => n).concat(bn.namedBuffers().map(([n]) => n)),
 *   ["weight", "bias", "running_mean", "running_var"],
 * );
 * ```
 */
export class BatchNorm2d extends Module {
  /** Channels. */
  readonly numFeatures: number;
  /** Epsilon. */
  readonly eps: number;
  /** Running-statistics momentum. */
  readonly momentum: number;
  /** Whether ReLU follows in the same kernels. */
  readonly relu: boolean;
  /** gamma [C], fp32. */
  readonly weight: Parameter;
  /** beta [C], fp32. */
  readonly bias: Parameter;
  /** Running mean [C]. */
  readonly runningMean: BufferTensor;
  /** Running variance [C]. */
  readonly runningVar: BufferTensor;
  /** Training forwards run (PyTorch's `num_batches_tracked`). */
  numBatchesTracked = 0;
  #x: Tensor | null = null;
  #y: Tensor | null = null;
  #reluRan = false;
  #statsSaved = false;

  /**
   * Creates the layer: gamma 1, beta 0, running mean 0, running variance 1.
   *
   * @param numFeatures Channels.
   * @param options eps and momentum.
   * @throws {RangeError} When `numFeatures` is not a positive integer.
   */
  constructor(numFeatures: number, options: BatchNorm2dOptions = {}) {
    super();
    refuseUnknownKeys(options ?? {}, ["eps", "momentum", "relu"], "create BatchNorm2d");
    checkPositiveInt("numFeatures", numFeatures);
    this.numFeatures = numFeatures;
    this.eps = options.eps ?? 1e-5;
    this.momentum = options.momentum ?? 0.1;
    this.relu = options.relu ?? false;
    const c = numFeatures;
    const f32 = { computeDtype: "f32" } as const;
    this.weight = new Parameter(new Float32Array(c).fill(1), [c], f32);
    this.bias = new Parameter(new Float32Array(c), [c], f32);
    this.params.set("weight", this.weight);
    this.params.set("bias", this.bias);
    this.runningMean = new BufferTensor(new Float32Array(c), [c]);
    this.runningVar = new BufferTensor(new Float32Array(c).fill(1), [c]);
    this.buffers.set("running_mean", this.runningMean);
    this.buffers.set("running_var", this.runningVar);
  }

  /** `num_batches_tracked` as an I64 scalar, as PyTorch saves it. */
  protected override extraState(): Map<string, HostTensor> {
    return new Map([["num_batches_tracked", {
      dtype: "I64",
      shape: [],
      data: new BigInt64Array([BigInt(this.numBatchesTracked)]),
    }]]);
  }

  /** Validates `num_batches_tracked` (an integer scalar, as PyTorch saves it) for restoring. */
  protected override loadExtraState(
    state: Map<string, HostTensor>,
    prefix: string,
    source: string,
  ): ExtraStateLoad {
    const key = prefix + "num_batches_tracked";
    const t = state.get(key);
    if (!t) return { keys: [], apply: () => {} };
    const n = t.data.length === 1 ? Number(t.data[0]) : NaN;
    if (t.shape.length > 1 || !Number.isSafeInteger(n) || n < 0) {
      throw new RangeError(
        `Cannot load "${key}" from ${source}: expected a non-negative integer scalar, got ` +
          `${t.dtype} [${t.shape}]`,
      );
    }
    return { keys: [key], apply: () => void (this.numBatchesTracked = n) };
  }

  /**
   * Runs the layer.
   *
   * @param x Input [N, C, H, W], f16 or f32.
   * @returns Output, same shape, the same dtype.
   * @throws {RangeError} When the channel count does not match.
   */
  forward(x: Tensor): Tensor {
    return this.forwardFused(x, this.relu);
  }

  /**
   * {@linkcode BatchNorm2d.forward} with ReLU fused in or not for this call (training only;
   * evaluation applies it after the affine kernel). {@linkcode Sequential} uses it for a
   * BatchNorm2d that a ReLU follows; the matching backward masks its gradient the same way.
   *
   * @param x Input [N, C, H, W], f16 or f32.
   * @param relu Apply ReLU to the output.
   * @returns Output, same shape, the same dtype.
   * @throws {RangeError} When the channel count does not match.
   */
  forwardFused(x: Tensor, relu: boolean): Tensor {
    if (x.shape.length !== 4 || x.shape[1] !== this.numFeatures) {
      throw new RangeError(
        `Cannot run BatchNorm2d(${this.numFeatures}): input shape [${x.shape}]`,
      );
    }
    const y = this.workspace("y", shapeOf(x), x.dtype);
    if (this.training) {
      const c = this.numFeatures;
      // The kernel saves the running statistics before this batch's update, for
      // revertRunningStats: whether the step is skipped is known only on the device, after
      // backward.
      this.#statsSaved = true;
      ops.batchNormForwardTrain(x, y, {
        gamma: this.weight.value,
        beta: this.bias.value,
        saveMean: this.workspace("mean", [c], "f32"),
        saveInvStd: this.workspace("invstd", [c], "f32"),
        runMean: this.runningMean.tensor,
        runVar: this.runningVar.tensor,
        momentum: this.momentum,
        eps: this.eps,
        relu,
        workspace: this.#work(x),
        runBackup: this.workspace("runBackup", [2 * c], "f32"),
      });
      this.numBatchesTracked++;
      this.#x = x;
      this.#y = y;
      this.#reluRan = relu;
    } else {
      ops.batchNormForwardEval(x, y, {
        gamma: this.weight.value,
        beta: this.bias.value,
        runMean: this.runningMean.tensor,
        runVar: this.runningVar.tensor,
        eps: this.eps,
      });
      if (relu) ops.reluForward(y, y);
      this.#x = null;
      this.#y = null;
    }
    return y;
  }

  /** The workspace of the two-phase reduction for x's shape (kept, like the other workspaces). */
  #work(x: Tensor): Tensor {
    return this.workspace("work", [ops.batchNormWorkspaceSize(x.shape)], "f32");
  }

  /** The running statistics saved by the last training forward, and where they go back. */
  protected override runningStatsBackup(): ops.CopyEntry[] {
    if (!this.#statsSaved) return [];
    const c = this.numFeatures, saved = this.workspace("runBackup", [2 * c], "f32");
    this.#statsSaved = false;
    return [
      { dst: this.runningMean.tensor, src: saved, count: c },
      { dst: this.runningVar.tensor, src: saved, srcOffset: c, count: c },
    ];
  }

  /**
   * Back-propagates the output gradient: writes the parameter gradients, returns the input gradient.
   *
   * @param dy Output gradient, f16 or f32.
   * @param options Whether to compute the input gradient (batch norm computes it anyway).
   * @returns Input gradient, the same dtype, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    const x = this.#x;
    if (!x) throw new TypeError("Cannot run BatchNorm2d.backward: no training forward before it");
    const dx = this.kernelBackward(x, dy, this.#reluRan, this.#y);
    return options.inputGrad === false ? null : dx;
  }

  /**
   * The batch-norm kernel's backward of the training forward on `x` with this layer's saved
   * statistics: writes the weight and bias gradients, returns the input gradient (the "dx"
   * workspace).
   *
   * @param x The forward's input.
   * @param dy The output's gradient.
   * @param relu Whether a ReLU was fused into the forward.
   * @param y The forward's output, where the ReLU was fused (its gradient is masked by it).
   * @returns The input gradient.
   */
  protected kernelBackward(x: Tensor, dy: Tensor, relu: boolean, y: Tensor | null): Tensor {
    const c = this.numFeatures;
    const dx = this.workspace("dx", shapeOf(x), x.dtype);
    ops.batchNormBackward(dy, dx, {
      x,
      gamma: this.weight.value,
      saveMean: this.workspace("mean", [c], "f32"),
      saveInvStd: this.workspace("invstd", [c], "f32"),
      dgamma: this.weight.grad,
      dbeta: this.bias.grad,
      relu,
      y,
      workspace: this.#work(x),
    });
    return dx;
  }
}

/**
 * `nn.ReLU`.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { ReLU } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using relu = new ReLU().to(device);
 * using x = Tensor.fromHost(device, new Float16Array([-1, 2]), [1, 2]);
 * assert.deepStrictEqual([...await relu.forward(x).toHost()], [0, 2]);
 * ```
 */
export class ReLU extends Module {
  #y: Tensor | null = null;

  /**
   * Runs the layer.
   *
   * @param x Input, f16 or f32, any shape.
   * @returns max(x, 0), the same dtype.
   */
  forward(x: Tensor): Tensor {
    const y = this.workspace("y", shapeOf(x), x.dtype);
    ops.reluForward(x, y);
    this.#y = this.training ? y : null;
    return y;
  }

  /**
   * Back-propagates the output gradient: writes the parameter gradients, returns the input gradient.
   *
   * @param dy Output gradient.
   * @param options Whether to compute the input gradient.
   * @returns Input gradient, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    const y = this.#y;
    if (!y) throw new TypeError("Cannot run ReLU.backward: no training forward before it");
    if (options.inputGrad === false) return null;
    const dx = this.workspace("dx", shapeOf(dy), dy.dtype);
    ops.reluBackward(dy, dx, { y });
    return dx;
  }
}

/** Options of {@linkcode MaxPool2d}. */
export interface MaxPool2dOptions {
  /** Stride (default: the kernel size, as in PyTorch). */
  stride?: number;
}

/**
 * `nn.MaxPool2d` (no padding).
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { MaxPool2d } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using pool = new MaxPool2d(2).to(device);
 * using x = Tensor.fromHost(device, new Float16Array([1, 5, 3, 2]), [1, 1, 2, 2]);
 * assert.deepStrictEqual([...await pool.forward(x).toHost()], [5]);
 * ```
 */
export class MaxPool2d extends Module {
  /** Window size. */
  readonly kernelSize: number;
  /** Stride. */
  readonly stride: number;
  #xShape: number[] | null = null;

  /**
   * Creates the layer.
   *
   * @param kernelSize Window size.
   * @param options Stride.
   * @throws {RangeError} When a size is not a positive integer.
   */
  constructor(kernelSize: number, options: MaxPool2dOptions = {}) {
    super();
    refuseUnknownKeys(options ?? {}, ["stride"], "create MaxPool2d");
    checkPositiveInt("kernelSize", kernelSize);
    this.kernelSize = kernelSize;
    this.stride = options.stride ?? kernelSize;
    checkPositiveInt("stride", this.stride);
  }

  /**
   * Runs the layer.
   *
   * @param x Input [N, C, H, W], f16 or f32.
   * @returns Output [N, C, OH, OW], the same dtype.
   * @throws {RangeError} When the input is not 4-D or smaller than the window.
   */
  forward(x: Tensor): Tensor {
    const [n, c, h, w] = x.shape;
    if (x.shape.length !== 4 || h < this.kernelSize || w < this.kernelSize) {
      throw new RangeError(`Cannot run MaxPool2d(${this.kernelSize}): input shape [${x.shape}]`);
    }
    const oh = Math.floor((h - this.kernelSize) / this.stride) + 1;
    const ow = Math.floor((w - this.kernelSize) / this.stride) + 1;
    const y = this.workspace("y", [n, c, oh, ow], x.dtype);
    const indices = this.training ? this.workspace("idx", [n, c, oh, ow], "i32") : null;
    ops.maxPool2dForward(x, y, { kernel: this.kernelSize, stride: this.stride, indices });
    this.#xShape = this.training ? shapeOf(x) : null;
    return y;
  }

  /**
   * Back-propagates the output gradient: writes the parameter gradients, returns the input gradient.
   *
   * @param dy Output gradient.
   * @param options Whether to compute the input gradient.
   * @returns Input gradient, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    const xs = this.#xShape;
    if (!xs) throw new TypeError("Cannot run MaxPool2d.backward: no training forward before it");
    if (options.inputGrad === false) return null;
    const dx = this.workspace("dx", xs, dy.dtype);
    ops.maxPool2dBackward(dy, dx, { indices: this.workspace("idx", shapeOf(dy), "i32") });
    return dx;
  }
}

/**
 * `nn.Flatten()`: [N, ...] to [N, prod(...)].
 *
 * The ffi Tensor has no views yet, so this copies (device to device; one activation-sized
 * memcpy per step, small next to the convolutions around it).
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { Flatten } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using flat = new Flatten().to(device);
 * using x = Tensor.fromHost(device, new Float16Array([1, 2, 3, 4, 5, 6]), [2, 3, 1, 1]);
 * const y = flat.forward(x);
 * assert.deepStrictEqual(y.shape, [2, 3]);
 * assert.deepStrictEqual([...await y.toHost()], [1, 2, 3, 4, 5, 6]);
 * ```
 */
export class Flatten extends Module {
  #inShape: number[] | null = null;

  /**
   * Runs the layer.
   *
   * @param x Input [N, ...].
   * @returns A copy of shape [N, prod(...)].
   */
  forward(x: Tensor): Tensor {
    const n = x.shape[0];
    this.#inShape = shapeOf(x);
    const y = this.workspace("y", [n, x.numel / n], x.dtype);
    y.buffer.copyFrom(x.buffer);
    return y;
  }

  /**
   * Back-propagates the output gradient: writes the parameter gradients, returns the input gradient.
   *
   * @param dy Output gradient [N, F].
   * @param options Whether to compute the input gradient.
   * @returns dy with the input's shape, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    if (!this.#inShape) throw new TypeError("Cannot run Flatten.backward: no forward before it");
    if (options.inputGrad === false) return null;
    const dx = this.workspace("dx", this.#inShape, dy.dtype);
    dx.buffer.copyFrom(dy.buffer);
    return dx;
  }
}

/**
 * `nn.Sequential`: runs its layers in order; children are named "0", "1", ... as in PyTorch.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { Linear, ReLU, Sequential } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using model = new Sequential([new Linear(4, 8), new ReLU(), new Linear(8, 3)]).to(device);
 * using x = Tensor.fromHost(device, new Float16Array(8), [2, 4]);
 * const y = model.forward(x);
 * assert.deepStrictEqual(y.shape, [2, 3]);
 * using dy = Tensor.fromHost(device, new Float16Array(6).fill(1), [2, 3]);
 * assert.strictEqual(model.backward(dy, { inputGrad: false }), null);
 * ```
 */
export class Sequential extends Module {
  /** The layers, in order. */
  readonly layers: readonly Module[];
  /** Indices of the ReLUs the last forward ran inside the batch norm before them. */
  #fused = new Set<number>();

  /**
   * Creates the container; the layers become children "0", "1", ...
   *
   * @param layers The layers.
   */
  constructor(layers: Module[]) {
    super();
    this.layers = [...layers];
    this.layers.forEach((m, i) => this.children.set(String(i), m));
  }

  /**
   * Runs the layer.
   *
   * @param x The first layer's input.
   * @returns The last layer's output.
   */
  forward(x: Tensor): Tensor {
    let h = x;
    this.#fused.clear();
    const ls = this.layers;
    for (let i = 0; i < ls.length; i++) {
      const m = ls[i], next = ls[i + 1];
      // A BatchNorm2d followed by a ReLU runs as one layer in training: the ReLU is applied
      // in the batch norm's kernels, forward and backward, with the same bits.
      if (m instanceof BatchNorm2d && next instanceof ReLU && m.training && !m.relu) {
        h = m.forwardFused(h, true);
        this.#fused.add(i + 1);
        i++;
      } else {
        h = m.forward(h);
      }
    }
    return h;
  }

  /**
   * Back-propagates the output gradient: writes the parameter gradients, returns the input gradient.
   *
   * @param dy The last layer's output gradient.
   * @param options Whether the first layer's input gradient is needed (default true).
   * @returns The input gradient, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    // A layer's input gradient is needed only when a layer before it has parameters (or the
    // caller asked for the model's): a Flatten in front of the first Linear must not make that
    // Linear compute dX, a third of an MLP's matmul work (PyTorch skips it the same way, the
    // input not requiring grad).
    const wanted = options.inputGrad !== false;
    const first = wanted ? 0 : this.layers.findIndex((m) => m.parameters().length > 0);
    let g: Tensor | null = dy;
    for (let i = this.layers.length - 1; i >= 0 && g; i--) {
      if (this.#fused.has(i)) continue; // its gradient is in the batch norm's backward
      g = this.layers[i].backward(g, { inputGrad: wanted || i > first });
      this.gradReady(this.layers[i]);
    }
    return g;
  }
}
