/**
 * `SyncBatchNorm`: batch norm whose training statistics are those of the whole batch across
 * the ranks of a process group (PyTorch's `nn.SyncBatchNorm`).
 *
 * @module
 */

import { Tensor } from "../ffi/tensor.ts";
import type { Device } from "../ffi/device.ts";
import * as ops from "../ops/mod.ts";
import { BatchNorm2d, type BatchNorm2dOptions } from "../nn/layers.ts";
import type { BackwardOptions } from "../nn/module.ts";
import type { ProcessGroup } from "./process_group.ts";

function view(t: Tensor): Float32Array | Float16Array {
  if (t.dtype === "bf16") {
    // JavaScript has no bfloat16 array to compute the host reference in.
    throw new TypeError(
      "Cannot run SyncBatchNorm: it computes on the host in fp16 or fp32, not bf16; " +
        'move the model with to(device, { precision: "fp16" }) or "fp32"',
    );
  }
  const bytes = t.numel * (t.dtype === "f16" ? 2 : 4);
  const ab = Deno.UnsafePointerView.getArrayBuffer(t.pointer!, bytes);
  return t.dtype === "f16" ? new Float16Array(ab) : new Float32Array(ab);
}

/** An f32 device tensor's values (a pageable copy: waits for the work queued before it). */
function read(t: Tensor): Float32Array {
  const a = new Float32Array(t.numel);
  t.buffer.copyTo(a);
  return a;
}

/**
 * Batch norm over the batch of every rank: in training, each rank's per-channel sums are
 * all-reduced, so that every rank normalizes with the mean and variance of the combined
 * batch and updates its running statistics with them, and backward all-reduces the sums its
 * input gradient needs. Its state dict, parameters and skipped-step revert are those of
 * {@linkcode BatchNorm2d}; the weight and bias gradients stay per rank, for
 * {@linkcode DataParallel} to average with the others.
 *
 * On the cpu device it computes on the host, in float64 per channel: the reference of
 * synchronized statistics, not a fast path. On a CUDA device the batch-norm kernels do the
 * per-element work: the forward's local mean and variance become per-channel sums, which are
 * all-reduced (on the device over the nccl backend, on the host over mpi) and normalize the
 * output; the backward's local sums are all-reduced likewise and the kernel's input gradient
 * corrected by the per-channel difference between the local and the global means. Each costs
 * one small all-reduce a layer and a wait for it on the host.
 *
 * @example One rank: the statistics are the local ones
 * ```ts
 * import { Device, ProcessGroup, SyncBatchNorm, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using group = ProcessGroup.init();
 * using bn = new SyncBatchNorm(1, group).to(device, { precision: "fp32" });
 * using x = Tensor.fromHost(device, new Float32Array([1, 3]), [2, 1, 1, 1]);
 * const y = await bn.forward(x).toHost();
 * assert.ok(Math.abs(y[0] + 1) < 1e-3 && Math.abs(y[1] - 1) < 1e-3);
 * assert.ok(Math.abs((await bn.runningMean.read())[0] - 0.2) < 1e-6);
 * ```
 */
export class SyncBatchNorm extends BatchNorm2d {
  /** The ranks whose batches are combined. */
  readonly group: ProcessGroup;
  /**
   * What the last training forward leaves for backward: its input, its output when a ReLU was
   * fused in (the gradient is masked where it is 0), the combined batch's statistics and size.
   */
  #saved: {
    x: Tensor;
    reluY: Tensor | null;
    mean: Float64Array;
    invstd: Float64Array;
    count: number;
  } | null = null;

  /**
   * Creates the layer (as {@linkcode BatchNorm2d}) over the ranks of `group`.
   *
   * @param numFeatures Channels.
   * @param group The ranks.
   * @param options eps and momentum.
   */
  constructor(numFeatures: number, group: ProcessGroup, options: BatchNorm2dOptions = {}) {
    super(numFeatures, options);
    this.group = group;
  }

  /**
   * Runs the layer, with a ReLU fused in when `relu` (as {@linkcode Sequential} asks for a
   * batch norm a ReLU follows); in training with the combined batch's statistics.
   *
   * @param x Input [N, C, H, W] on a cpu or CUDA device, f16 or f32.
   * @param relu Apply ReLU to the output.
   * @returns Output, same shape and dtype.
   */
  override forwardFused(x: Tensor, relu: boolean): Tensor {
    // The base class validates, backs up the running statistics for a skipped step's revert
    // and counts the batch; its local statistics are then replaced by the global ones below.
    const y = super.forwardFused(x, this.training ? false : relu);
    if (!this.training) {
      this.#saved = null;
      return y;
    }
    if (x.device.kind === "cuda") return this.#forwardDevice(x, y, relu);
    if (x.device.kind !== "cpu") {
      throw new TypeError(`Cannot run SyncBatchNorm: the input is on ${x.device}; cpu or cuda`);
    }
    const [n, c, h, w] = x.shape;
    const hw = h * w;
    const xs = view(x);
    const sums = new Float32Array(2 * c + 1);
    for (let ch = 0; ch < c; ch++) {
      let s = 0, s2 = 0;
      for (let b = 0; b < n; b++) {
        const o = (b * c + ch) * hw;
        for (let i = 0; i < hw; i++) {
          const v = xs[o + i];
          s += v;
          s2 += v * v;
        }
      }
      sums[ch] = s;
      sums[c + ch] = s2;
    }
    sums[2 * c] = n * hw;
    this.group.allReduce(sums, { op: "sum" });
    const count = sums[2 * c];
    const mean = new Float64Array(c), invstd = new Float64Array(c);
    const gamma = view(this.weight.value), beta = view(this.bias.value);
    const rm = view(this.runningMean.tensor), rv = view(this.runningVar.tensor);
    // The statistics before this batch, which the kernel backed up (mean, then variance).
    const backup = view(this.workspace("runBackup", [2 * c], "f32"));
    const prevMean = backup.subarray(0, c), prevVar = backup.subarray(c);
    const ys = view(y);
    const m = this.momentum;
    for (let ch = 0; ch < c; ch++) {
      const mu = sums[ch] / count;
      const variance = Math.max(sums[c + ch] / count - mu * mu, 0);
      mean[ch] = mu;
      invstd[ch] = 1 / Math.sqrt(variance + this.eps);
      // Running statistics as PyTorch: the unbiased variance of the combined batch.
      rm[ch] = (1 - m) * prevMean[ch] + m * mu;
      rv[ch] = (1 - m) * prevVar[ch] + m * variance * count / Math.max(count - 1, 1);
      const scale = gamma[ch] * invstd[ch], shift = beta[ch] - mu * scale;
      for (let b = 0; b < n; b++) {
        const o = (b * c + ch) * hw;
        if (relu) {
          for (let i = 0; i < hw; i++) ys[o + i] = Math.max(xs[o + i] * scale + shift, 0);
        } else {
          for (let i = 0; i < hw; i++) ys[o + i] = xs[o + i] * scale + shift;
        }
      }
    }
    this.#saved = { x, reluY: relu ? y : null, mean, invstd, count };
    return y;
  }

  /** Sums `sums` over the ranks: on the device where the group is nccl, else on the host. */
  #allReduce(sums: Float32Array, device: Device): void {
    if (this.group.size === 1) return;
    if (this.group.backend !== "nccl") {
      this.group.allReduce(sums, { op: "sum" });
      return;
    }
    using t = Tensor.fromHost(device, sums, [sums.length]);
    this.group.allReduce(t, { op: "sum" });
    t.buffer.copyTo(sums);
  }

  /**
   * The training forward on a CUDA device: the base class's kernel ran with the local batch
   * and saved its mean and inverse deviation; they are combined across ranks, written back in
   * their place (for the backward) and the output normalized again with them.
   */
  #forwardDevice(x: Tensor, y: Tensor, relu: boolean): Tensor {
    const c = this.numFeatures;
    const [n, , h, w] = x.shape;
    const local = n * h * w;
    const meanT = this.workspace("mean", [c], "f32"), invT = this.workspace("invstd", [c], "f32");
    const lm = read(meanT), li = read(invT);
    const sums = new Float32Array(2 * c + 1);
    for (let ch = 0; ch < c; ch++) {
      sums[ch] = local * lm[ch];
      // The kernel saved 1 / sqrt(var + eps) of the biased variance.
      sums[c + ch] = local * (1 / (li[ch] * li[ch]) - this.eps + lm[ch] * lm[ch]);
    }
    sums[2 * c] = local;
    this.#allReduce(sums, x.device);
    const count = sums[2 * c];
    const mean = new Float64Array(c), invstd = new Float64Array(c);
    const gMean = new Float32Array(c), gVar = new Float32Array(c), gInv = new Float32Array(c);
    const backup = read(this.workspace("runBackup", [2 * c], "f32"));
    const rm = new Float32Array(c), rv = new Float32Array(c);
    const m = this.momentum;
    for (let ch = 0; ch < c; ch++) {
      const mu = sums[ch] / count;
      const variance = Math.max(sums[c + ch] / count - mu * mu, 0);
      mean[ch] = gMean[ch] = mu;
      gVar[ch] = variance;
      invstd[ch] = gInv[ch] = 1 / Math.sqrt(variance + this.eps);
      rm[ch] = (1 - m) * backup[ch] + m * mu;
      rv[ch] = (1 - m) * backup[c + ch] + m * variance * count / Math.max(count - 1, 1);
    }
    this.runningMean.tensor.buffer.copyFrom(rm);
    this.runningVar.tensor.buffer.copyFrom(rv);
    meanT.buffer.copyFrom(gMean);
    invT.buffer.copyFrom(gInv);
    const varT = this.workspace("syncVar", [c], "f32");
    varT.buffer.copyFrom(gVar);
    ops.batchNormForwardEval(x, y, {
      gamma: this.weight.value,
      beta: this.bias.value,
      runMean: meanT,
      runVar: varT,
      eps: this.eps,
    });
    if (relu) ops.reluForward(y, y);
    this.#saved = { x, reluY: relu ? y : null, mean, invstd, count };
    return y;
  }

  /**
   * The backward on a CUDA device: the kernel's input gradient uses this rank's means of dy
   * and dy * x-hat; it is corrected by `a + b * x` per channel, the difference to the means of
   * the combined batch.
   */
  #backwardDevice(x: Tensor, dy: Tensor, options: BackwardOptions): Tensor | null {
    const c = this.numFeatures;
    const [n, , h, w] = x.shape;
    const local = n * h * w;
    const { reluY, mean, invstd, count } = this.#saved!;
    const dx = this.kernelBackward(x, dy, reluY !== null, reluY);
    const dbeta = read(this.bias.grad), dgamma = read(this.weight.grad);
    const sums = new Float32Array(2 * c);
    sums.set(dbeta, 0);
    sums.set(dgamma, c);
    this.#allReduce(sums, x.device);
    const gamma = read(this.weight.value);
    const a = new Float32Array(c), b = new Float32Array(c);
    const total = count;
    for (let ch = 0; ch < c; ch++) {
      const mu = mean[ch], is = invstd[ch], k = gamma[ch] * is;
      b[ch] = k * is * (dgamma[ch] / local - sums[c + ch] / total);
      a[ch] = k * (dbeta[ch] / local - sums[ch] / total) - b[ch] * mu;
    }
    const aT = this.workspace("corrBias", [c], "f32"), bT = this.workspace("corrScale", [c], "f32");
    const zero = this.workspace("corrZero", [c], "f32"),
      one = this.workspace("corrOne", [c], "f32");
    aT.buffer.copyFrom(a);
    bT.buffer.copyFrom(b);
    zero.buffer.copyFrom(new Float32Array(c));
    one.buffer.copyFrom(new Float32Array(c).fill(1));
    const corr = this.workspace("corr", [...x.shape], x.dtype);
    // With mean 0, variance 1 and eps 0 the eval kernel is the per-channel affine b * x + a.
    ops.batchNormForwardEval(x, corr, { gamma: bT, beta: aT, runMean: zero, runVar: one, eps: 0 });
    ops.add(dx, corr, dx);
    return options.inputGrad === false ? null : dx;
  }

  /**
   * Back-propagates with the combined batch's sums: writes this rank's weight and bias
   * gradients, returns the input gradient.
   *
   * @param dy Output gradient.
   * @param options Whether the input gradient is returned (it is computed anyway).
   * @returns Input gradient, or null.
   */
  override backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    if (!this.#saved) {
      throw new TypeError("Cannot run SyncBatchNorm.backward: no training forward before it");
    }
    const { x, reluY, mean, invstd, count } = this.#saved;
    if (x.device.kind === "cuda") return this.#backwardDevice(x, dy, options);
    const [n, c, h, w] = x.shape;
    const hw = h * w;
    const xs = view(x);
    let dys = view(dy);
    if (reluY) {
      // The fused ReLU's gradient: zero where the output was clamped.
      const ys = view(reluY), masked = new Float32Array(dys.length);
      for (let i = 0; i < masked.length; i++) masked[i] = ys[i] > 0 ? dys[i] : 0;
      dys = masked;
    }
    const sums = new Float32Array(2 * c);
    for (let ch = 0; ch < c; ch++) {
      let sdy = 0, sdyx = 0;
      const mu = mean[ch], is = invstd[ch];
      for (let b = 0; b < n; b++) {
        const o = (b * c + ch) * hw;
        for (let i = 0; i < hw; i++) {
          sdy += dys[o + i];
          sdyx += dys[o + i] * (xs[o + i] - mu) * is;
        }
      }
      sums[ch] = sdy;
      sums[c + ch] = sdyx;
    }
    const dgamma = view(this.weight.grad), dbeta = view(this.bias.grad);
    for (let ch = 0; ch < c; ch++) {
      dgamma[ch] = sums[c + ch];
      dbeta[ch] = sums[ch];
    }
    this.group.allReduce(sums, { op: "sum" });
    const dx = this.workspace("dx", [...x.shape], x.dtype);
    const dxs = view(dx), gamma = view(this.weight.value);
    const total = count;
    for (let ch = 0; ch < c; ch++) {
      const mu = mean[ch], is = invstd[ch];
      const k = gamma[ch] * is, mdy = sums[ch] / total, mdyx = sums[c + ch] / total;
      for (let b = 0; b < n; b++) {
        const o = (b * c + ch) * hw;
        for (let i = 0; i < hw; i++) {
          dxs[o + i] = k * (dys[o + i] - mdy - (xs[o + i] - mu) * is * mdyx);
        }
      }
    }
    return options.inputGrad === false ? null : dx;
  }
}
