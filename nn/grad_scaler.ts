/**
 * Dynamic loss scaling with the semantics and defaults of `torch.cuda.amp.GradScaler`, kept
 * entirely on the device: the scale, the growth tracker and the found-inf flag are device
 * tensors, the inf/NaN check, the skipped step and the scale update are kernels, and the host
 * reads nothing per step.
 *
 * The loss kernel takes its scale as a host number, so the scaler hands it the last scale the
 * host has seen ({@linkcode GradScaler.lossScale}) and then corrects the loss gradient on the
 * device by (device scale / host scale), a power of two (exactly 1 unless the scale changed
 * since the host last read it), so the gradients are scaled by the device's value exactly.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import * as ops from "../ops/mod.ts";
import type { SGD } from "./optim.ts";
import type { Module } from "./module.ts";

/** Options of {@linkcode GradScaler} (PyTorch's names and defaults). */
export interface GradScalerOptions {
  /** Initial scale (default 65536 = 2^16). */
  initScale?: number;
  /** Multiplier after `growthInterval` finite steps in a row (default 2). */
  growthFactor?: number;
  /** Multiplier after a step with inf/NaN gradients (default 0.5). */
  backoffFactor?: number;
  /** Finite steps in a row before growing (default 2000). */
  growthInterval?: number;
  /** When false every method is a pass-through and the scale is 1 (default true). */
  enabled?: boolean;
}

/** Options of {@linkcode GradScaler.step}. */
export interface GradScalerStepOptions {
  /**
   * The model whose forward produced this step's gradients. When the step is skipped (inf/NaN
   * gradients), its batch-norm running statistics are put back to their values before that
   * forward, on the device ({@linkcode Module.revertRunningStats}). Without it, as in PyTorch,
   * one NaN batch leaves NaN running statistics for good. {@linkcode Trainer} passes its model.
   */
  model?: Module | null;
}

/** The scaler's checkpoint state, with PyTorch's keys. */
export interface GradScalerState {
  /** The current scale. */
  scale: number;
  /** Growth factor. */
  growth_factor: number;
  /** Back-off factor. */
  backoff_factor: number;
  /** Growth interval. */
  growth_interval: number;
  /** Finite steps since the last scale change. */
  _growth_tracker: number;
}

/**
 * The loss scaler. Per step: the loss kernel scales by {@linkcode GradScaler.lossScale} and
 * {@linkcode GradScaler.scale} corrects its output; after backward,
 * {@linkcode GradScaler.step} checks the gradients and runs the optimizer (skipped on the device
 * on inf/NaN), and {@linkcode GradScaler.update} adjusts the scale.
 *
 * For fp16 models. A bf16 model (precision "bf16") needs none, as
 * `torch.autocast(dtype=torch.bfloat16)` runs without one: bf16 has fp32's exponent range, and
 * a Trainer refuses an enabled scaler for such a model.
 *
 * @example A step with an inf gradient is skipped and halves the scale
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { GradScaler, Parameter, SGD } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
 * using opt = new SGD([p], { lr: 0.1 });
 * using scaler = new GradScaler(device);
 * p.grad.buffer.copyFrom(new Float32Array([Infinity]));
 * scaler.step(opt);
 * scaler.update();
 * assert.strictEqual(await scaler.getScale(), 32768);
 * assert.deepStrictEqual([...await p.master.toHost()], [1]);
 * p.dispose();
 * ```
 */
export class GradScaler {
  /** Whether scaling is on. */
  readonly enabled: boolean;
  /** Growth factor. */
  readonly growthFactor: number;
  /** Back-off factor. */
  readonly backoffFactor: number;
  /** Growth interval. */
  readonly growthInterval: number;
  #device: Device;
  #scale: Tensor | null = null;
  #tracker: Tensor | null = null;
  #foundInf: Tensor | null = null;
  #hostScale: number;
  #hostScaleT: Tensor | null = null;
  #ratio: Tensor | null = null;
  #scratchInf: Tensor | null = null;
  #unscaled = new WeakSet<SGD>();
  #disposed = false;

  /**
   * Creates the scaler with its state on `device`.
   *
   * @param device The device the model trains on.
   * @param options PyTorch's options.
   * @throws {RangeError} For invalid factors, as PyTorch checks.
   */
  constructor(device: Device, options: GradScalerOptions = {}) {
    refuseUnknownKeys(options ?? {}, [
      "initScale",
      "growthFactor",
      "backoffFactor",
      "growthInterval",
      "enabled",
    ], "create GradScaler");
    this.enabled = options.enabled ?? true;
    this.growthFactor = options.growthFactor ?? 2;
    this.backoffFactor = options.backoffFactor ?? 0.5;
    this.growthInterval = options.growthInterval ?? 2000;
    const initScale = options.initScale ?? 65536;
    if (!(this.growthFactor > 1)) {
      throw new RangeError(`Cannot create GradScaler: growthFactor ${this.growthFactor} <= 1`);
    }
    if (!(this.backoffFactor < 1 && this.backoffFactor > 0)) {
      throw new RangeError(
        `Cannot create GradScaler: backoffFactor ${this.backoffFactor} not in (0, 1)`,
      );
    }
    if (!Number.isInteger(this.growthInterval) || this.growthInterval <= 0) {
      throw new RangeError(
        `Cannot create GradScaler: growthInterval ${this.growthInterval} is not a positive integer`,
      );
    }
    if (!(initScale > 0 && Number.isFinite(initScale))) {
      throw new RangeError(`Cannot create GradScaler: initScale ${initScale} is invalid`);
    }
    this.#device = device;
    this.#hostScale = this.enabled ? initScale : 1;
    if (this.enabled) {
      this.#scale = Tensor.fromHost(device, new Float32Array([initScale]), [1]);
      this.#tracker = Tensor.fromHost(device, new Int32Array([0]), [1]);
      this.#foundInf = Tensor.fromHost(device, new Int32Array([0]), [1]);
      this.#hostScaleT = Tensor.fromHost(device, new Float32Array([initScale]), [1]);
      this.#ratio = Tensor.empty(device, [1], "f32");
      this.#scratchInf = Tensor.fromHost(device, new Int32Array([0]), [1]);
    }
  }

  #check(): void {
    if (this.#disposed) throw new TypeError("Cannot use the GradScaler: it is disposed");
  }

  /** The device f32[1] scale (null when disabled). */
  get scaleTensor(): Tensor | null {
    this.#check();
    return this.#scale;
  }

  /** The device i32[1] found-inf flag of the current step (null when disabled). */
  get foundInf(): Tensor | null {
    this.#check();
    return this.#foundInf;
  }

  /**
   * The scale to hand the loss kernel: the last value the host has read (1 when disabled).
   * Follow the loss kernel with {@linkcode GradScaler.scale}.
   *
   * @returns The host-side scale.
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { GradScaler } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using s = new GradScaler(device, { enabled: false });
   * assert.strictEqual(s.lossScale(), 1);
   * ```
   */
  lossScale(): number {
    this.#check();
    return this.#hostScale;
  }

  /**
   * PyTorch's `scale(loss)`, applied where backward starts: the loss kernel already multiplied
   * its gradient by {@linkcode GradScaler.lossScale}; this makes it exactly the device's current
   * scale: grad *= deviceScale / lossScale() (a no-op when disabled, and a multiplication by 1
   * unless the scale changed since the host last read it). For losses computed at
   * {@linkcode GradScaler.lossScale}; {@linkcode CrossEntropyLoss} reads the device scale itself.
   *
   * @param grad The loss gradient (fp16 or f32), modified in place.
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Tensor } from "@pinstream/pinstream";
   * import { GradScaler } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using scaler = new GradScaler(device, { initScale: 4 });
   * using g = Tensor.fromHost(device, new Float16Array([0.5 * scaler.lossScale()]));
   * scaler.scale(g); // host and device agree: unchanged
   * assert.deepStrictEqual([...await g.toHost()], [2]);
   * ```
   */
  scale(grad: Tensor): void {
    this.#check();
    if (!this.enabled) return;
    // ratio = hostScale / deviceScale (the unscale kernel divides by *scale), then
    // grad /= ratio. Both factors are powers of two times each other: exact in fp16/fp32.
    ops.cast(this.#hostScaleT!, this.#ratio!);
    ops.unscaleAndCheck(this.#ratio!, this.#scratchInf!, { scale: this.#scale!, inPlace: true });
    ops.unscaleAndCheck(grad, this.#scratchInf!, { scale: this.#ratio!, inPlace: true });
  }

  /**
   * PyTorch's `unscale_(optimizer)`: divides the optimizer's gradients by the scale in place
   * and records inf/NaN in the found-inf flag (for clipping or inspecting gradients before
   * `step`). At most once per step.
   *
   * @param optimizer The optimizer whose gradients to unscale.
   * @throws {TypeError} When called twice in one step.
   */
  unscale_(optimizer: SGD): void {
    this.#check();
    if (!this.enabled) return;
    if (this.#unscaled.has(optimizer)) {
      throw new TypeError("Cannot unscale: unscale_() was already called since the last update()");
    }
    if (optimizer.foreach) {
      ops.multiUnscaleAndCheck(optimizer.tensorList(), this.#foundInf!, {
        scale: this.#scale!,
        inPlace: true,
      });
    } else {
      for (const p of optimizer.params) {
        ops.unscaleAndCheck(p.grad, this.#foundInf!, { scale: this.#scale!, inPlace: true });
      }
    }
    this.#unscaled.add(optimizer);
  }

  /**
   * PyTorch's `step(optimizer)`: checks the gradients for inf/NaN (unless `unscale_` already
   * did) and runs the optimizer, which skips the update on the device when any was found. The
   * unscale is fused into the optimizer's kernel. With `model`, a skipped step also undoes the
   * model's batch-norm running-statistics update (still on the device: no host read).
   *
   * @param optimizer The optimizer.
   * @param options The model whose running statistics a skipped step restores.
   * @example A NaN batch leaves the weights and the running statistics as they were
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Tensor } from "@pinstream/pinstream";
   * import { BatchNorm2d, GradScaler, SGD } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using bn = new BatchNorm2d(1).to(device);
   * using opt = new SGD(bn.parameters(), { lr: 0.1 });
   * using scaler = new GradScaler(device);
   * using x = Tensor.fromHost(device, new Float16Array([NaN, 1]), [2, 1, 1, 1]);
   * bn.backward(bn.forward(x));
   * scaler.step(opt, { model: bn });
   * scaler.update();
   * assert.deepStrictEqual([...await bn.runningMean.read()], [0]);
   * assert.deepStrictEqual([...await bn.weight.read()], [1]);
   * ```
   */
  step(optimizer: SGD, options: GradScalerStepOptions = {}): void {
    refuseUnknownKeys(options ?? {}, ["model"], "step the GradScaler");
    this.#check();
    if (!this.enabled) {
      optimizer.step();
      return;
    }
    if (this.#unscaled.has(optimizer)) {
      optimizer.step({ foundInf: this.#foundInf });
    } else {
      if (optimizer.foreach) {
        ops.multiUnscaleAndCheck(optimizer.tensorList(), this.#foundInf!, { inPlace: false });
      } else {
        for (const p of optimizer.params) {
          ops.unscaleAndCheck(p.grad, this.#foundInf!, { scale: null, inPlace: false });
        }
      }
      optimizer.step({ scale: this.#scale, foundInf: this.#foundInf });
    }
    options.model?.revertRunningStats(this.#foundInf!);
  }

  /**
   * PyTorch's `update()`: halves the scale after a step with inf/NaN, doubles it after
   * `growthInterval` finite steps in a row; then clears the found-inf flag for the next step.
   */
  update(): void {
    this.#check();
    this.#unscaled = new WeakSet();
    if (!this.enabled) return;
    ops.scalerUpdate(this.#scale!, this.#tracker!, {
      foundInf: this.#foundInf!,
      growthFactor: this.growthFactor,
      backoffFactor: this.backoffFactor,
      growthInterval: this.growthInterval,
    });
    this.#foundInf!.buffer.fill(0);
  }

  /**
   * Reads the current scale from the device (once per log interval, not per step) and makes it
   * the host's {@linkcode GradScaler.lossScale}.
   *
   * @returns The scale (1 when disabled).
   */
  async getScale(): Promise<number> {
    this.#check();
    if (!this.enabled) return 1;
    const s = (await this.#scale!.toHost())[0] as number;
    if (s !== this.#hostScale) {
      this.#hostScale = s;
      this.#hostScaleT!.buffer.copyFrom(new Float32Array([s]));
    }
    return s;
  }

  /**
   * The checkpoint state (PyTorch's keys).
   *
   * @returns The state.
   */
  async stateDict(): Promise<GradScalerState> {
    const scale = await this.getScale();
    const tracker = this.enabled ? (await this.#tracker!.toHost())[0] as number : 0;
    return {
      scale,
      growth_factor: this.growthFactor,
      backoff_factor: this.backoffFactor,
      growth_interval: this.growthInterval,
      _growth_tracker: tracker,
    };
  }

  /**
   * Restores the scale and growth tracker.
   *
   * @param state A state from {@linkcode GradScaler.stateDict} (or PyTorch's `state_dict()`).
   * @throws {TypeError} When the state is malformed.
   * @throws {RangeError} When the scale is not a positive finite number or the tracker not a
   *   non-negative integer (nothing is changed then).
   */
  loadStateDict(state: GradScalerState): void {
    this.#check();
    if (typeof state?.scale !== "number" || typeof state._growth_tracker !== "number") {
      throw new TypeError("Cannot load GradScaler state: scale or _growth_tracker missing");
    }
    if (!(state.scale > 0 && Number.isFinite(state.scale))) {
      throw new RangeError(`Cannot load GradScaler state: scale ${state.scale} is invalid`);
    }
    if (!Number.isInteger(state._growth_tracker) || state._growth_tracker < 0) {
      throw new RangeError(
        `Cannot load GradScaler state: _growth_tracker ${state._growth_tracker} is invalid`,
      );
    }
    if (!this.enabled) return;
    this.#scale!.buffer.copyFrom(new Float32Array([state.scale]));
    this.#tracker!.buffer.copyFrom(new Int32Array([state._growth_tracker]));
    this.#hostScale = state.scale;
    this.#hostScaleT!.buffer.copyFrom(new Float32Array([state.scale]));
  }

  /** The device the scaler lives on. */
  get device(): Device {
    return this.#device;
  }

  /** Frees the device state (idempotent). */
  dispose(): void {
    for (const t of [this.#scale, this.#tracker, this.#foundInf, this.#hostScaleT, this.#ratio]) {
      t?.dispose();
    }
    this.#scratchInf?.dispose();
    this.#scale =
      this.#tracker =
      this.#foundInf =
      this.#hostScaleT =
      this.#ratio =
        null;
    this.#scratchInf = null;
    this.#disposed = true;
  }

  /** Same as {@linkcode GradScaler.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
