/**
 * `torch.optim.SGD` on the device: fp32 master weights updated from fp32 gradients, the fp16
 * compute copies refreshed in the same kernel, momentum buffers in fp32.
 *
 * The update is PyTorch's, including its first step (the momentum buffer starts as a clone of
 * the gradient): the optimizer keeps its completed-step count on the device, so a step that the
 * {@linkcode GradScaler} skips (inf/NaN gradients) is not counted, exactly as PyTorch's
 * `scaler.step(optimizer)` never calls `optimizer.step()` then, and no host read is needed.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { Tensor } from "../ffi/tensor.ts";
import * as ops from "../ops/mod.ts";
import type { Parameter } from "./parameter.ts";
import { TensorList } from "../ops/tensor_list.ts";

/** Options of {@linkcode SGD} (PyTorch's names and defaults). */
export interface SGDOptions {
  /** Learning rate. */
  lr: number;
  /** Momentum factor (default 0). */
  momentum?: number;
  /** Dampening for momentum (default 0). */
  dampening?: number;
  /** Nesterov momentum (default false; needs momentum > 0 and dampening = 0). */
  nesterov?: boolean;
  /** L2 penalty added to the gradient (default 0). */
  weightDecay?: number;
  /**
   * Update every parameter in one launch over a device list of them (default true; PyTorch's
   * name for its multi-tensor path). false queues one launch per parameter; both give the same
   * bits.
   */
  foreach?: boolean;
}

/** Options of {@linkcode SGD.step}, set by the {@linkcode GradScaler}. */
export interface SGDStepOptions {
  /** Device f32[1] loss scale: gradients are divided by it inside the update. */
  scale?: Tensor | null;
  /** Device i32[1] flag: when non-zero the step is skipped (on the device). */
  foundInf?: Tensor | null;
}

/** The optimizer's state in a checkpoint. */
export interface SGDState {
  /** Hyper-parameters at the time of saving (the lr as the scheduler left it). */
  hyper: Required<Omit<SGDOptions, "foreach">>;
  /** Completed (not skipped) steps. */
  stepsDone: number;
  /** Momentum buffers, one per parameter in order (absent when momentum is 0). */
  momentumBuffers: Float32Array[];
}

/**
 * Stochastic gradient descent with momentum, dampening, Nesterov and weight decay, with the
 * semantics of `torch.optim.SGD` (1.13):
 *
 * ```text
 * g = grad + weightDecay * p
 * buf = first step ? g : momentum * buf + (1 - dampening) * g
 * g = nesterov ? g + momentum * buf : buf
 * p -= lr * g
 * ```
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Parameter, SGD } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
 * p.grad.buffer.copyFrom(new Float32Array([0.5]));
 * using opt = new SGD([p], { lr: 0.1, momentum: 0.9 });
 * opt.step();
 * assert.deepStrictEqual([...await p.master.toHost()], [Math.fround(1 - 0.05)]);
 * p.dispose();
 * ```
 */
export class SGD {
  /** The parameters, in order. */
  readonly params: readonly Parameter[];
  /** Learning rate used by the next step (schedulers write it). */
  lr: number;
  /** Momentum used by the next step (OneCycleLR cycles it). */
  momentum: number;
  /** Dampening. */
  dampening: number;
  /** Nesterov momentum. */
  nesterov: boolean;
  /** Weight decay. */
  weightDecay: number;
  /** One launch for all parameters (see {@linkcode SGDOptions.foreach}). */
  readonly foreach: boolean;
  #buffers: (Tensor | null)[] = [];
  #list: TensorList | null = null;
  #stepsDone: Tensor | null = null;
  // lr and momentum as the step kernels read them, on the device: a scheduler's new values
  // reach a recorded (graph) step without changing its launches.
  #hyper: Tensor | null = null;
  #hyperSent: [number, number] = [NaN, NaN];
  #disposed = false;

  /**
   * Creates the optimizer and its device step counter.
   *
   * @param params The parameters to optimize (already on their device).
   * @param options Hyper-parameters.
   * @throws {RangeError} For invalid hyper-parameters, with PyTorch's checks.
   * @throws {TypeError} When `params` is empty or a parameter is not on a device.
   */
  constructor(params: Parameter[], options: SGDOptions) {
    refuseUnknownKeys(
      options ?? {},
      ["lr", "momentum", "dampening", "nesterov", "weightDecay", "foreach"],
      "create SGD",
    );
    const { lr, momentum = 0, dampening = 0, nesterov = false, weightDecay = 0 } = options;
    if (!(lr >= 0)) throw new RangeError(`Cannot create SGD: invalid learning rate ${lr}`);
    if (!(momentum >= 0)) throw new RangeError(`Cannot create SGD: invalid momentum ${momentum}`);
    if (!(weightDecay >= 0)) {
      throw new RangeError(`Cannot create SGD: invalid weightDecay ${weightDecay}`);
    }
    if (nesterov && (momentum <= 0 || dampening !== 0)) {
      throw new RangeError(
        `Cannot create SGD: Nesterov momentum requires a momentum and zero dampening ` +
          `(momentum ${momentum}, dampening ${dampening})`,
      );
    }
    if (params.length === 0) throw new TypeError("Cannot create SGD: empty parameter list");
    this.params = [...params];
    this.lr = lr;
    this.momentum = momentum;
    this.dampening = dampening;
    this.nesterov = nesterov;
    this.weightDecay = weightDecay;
    this.foreach = options.foreach ?? true;
    const device = params[0].device;
    if (!device || params.some((p) => p.device !== device)) {
      throw new TypeError("Cannot create SGD: every parameter must be on the same device");
    }
    this.#stepsDone = Tensor.fromHost(device, new Int32Array([0]), [1]);
    this.#hyper = Tensor.empty(device, [2], "f32");
  }

  /**
   * Writes {@linkcode SGD.lr} and {@linkcode SGD.momentum} to the device scalars the update
   * kernels read, when they changed since the last write (two one-element fills on the current
   * stream). {@linkcode SGD.step} calls it; a caller that replays a recorded step calls it
   * before each replay.
   *
   * @throws {TypeError} When disposed.
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Parameter, SGD } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
   * using opt = new SGD([p], { lr: 0.5 });
   * opt.lr = 0.25;
   * opt.syncHyperParameters();
   * assert.strictEqual(opt.hyperParameters.numel, 2);
   * assert.deepStrictEqual([...await opt.hyperParameters.toHost()], [0.25, 0]);
   * p.dispose();
   * ```
   */
  syncHyperParameters(): void {
    const hyper = this.hyperParameters;
    const values = [this.lr, this.momentum];
    for (let i = 0; i < 2; i++) {
      if (Object.is(values[i], this.#hyperSent[i])) continue;
      // Rounded to f32 as a kernel argument would be.
      ops.fillInPlace(hyper, values[i], { start: i, count: 1 });
      this.#hyperSent[i] = values[i];
    }
  }

  /** The device f32 [2] scalars lr and momentum the update kernels read. */
  get hyperParameters(): Tensor {
    if (this.#disposed || !this.#hyper) throw new TypeError("Cannot use SGD: disposed");
    return this.#hyper;
  }

  #buffer(i: number): Tensor {
    let b = this.#buffers[i];
    if (!b) {
      const p = this.params[i];
      // Zero-filled: PyTorch's first step overwrites it with the gradient (stepsDone == 0).
      b = Tensor.empty(p.device!, p.shape, "f32");
      b.buffer.fill(0);
      this.#buffers[i] = b;
    }
    return b;
  }

  /**
   * The parameters as a device list for the multi-tensor kernels (master weights, gradients,
   * momentum buffers when momentum is not 0, fp16 copies), refreshed from the parameters: it is
   * uploaded again only when one of them changed.
   *
   * @returns The list (owned by the optimizer).
   */
  tensorList(): TensorList {
    const device = this.stepsDone.device;
    this.#list ??= new TensorList(device, "sgd");
    this.#list.setSgd(this.params.map((p, i) => ({
      param: p.master,
      grad: p.grad,
      momentumBuf: this.momentum !== 0 ? this.#buffer(i) : null,
      paramHalf: p.half,
    })));
    return this.#list;
  }

  /** The device i32[1] count of completed steps. */
  get stepsDone(): Tensor {
    if (this.#disposed || !this.#stepsDone) throw new TypeError("Cannot use SGD: disposed");
    return this.#stepsDone;
  }

  /**
   * Updates every parameter from its gradient (queued on the device; nothing is read back).
   *
   * @param options The scaler's device scale and found-inf flag, if any.
   * @throws {TypeError} When disposed.
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Parameter, SGD } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
   * p.grad.buffer.copyFrom(new Float32Array([1]));
   * using opt = new SGD([p], { lr: 0.5 });
   * opt.step();
   * opt.step();
   * assert.deepStrictEqual([...await p.master.toHost()], [0]);
   * p.dispose();
   * ```
   */
  step(options: SGDStepOptions = {}): void {
    refuseUnknownKeys(options ?? {}, ["scale", "foundInf"], "take an SGD step");
    const stepsDone = this.stepsDone;
    this.syncHyperParameters();
    const hyper = this.hyperParameters;
    if (this.foreach) {
      ops.multiSgdStep(this.tensorList(), {
        lr: this.lr,
        momentum: this.momentum,
        dampening: this.dampening,
        nesterov: this.nesterov,
        weightDecay: this.weightDecay,
        scale: options.scale ?? null,
        foundInf: options.foundInf ?? null,
        stepsDone,
        hyper,
      });
      ops.stepCount(stepsDone, options.foundInf ?? null);
      return;
    }
    for (let i = 0; i < this.params.length; i++) {
      const p = this.params[i];
      ops.sgdStep(p.master, p.grad, {
        lr: this.lr,
        momentumBuf: this.momentum !== 0 ? this.#buffer(i) : null,
        paramHalf: p.half,
        momentum: this.momentum,
        dampening: this.dampening,
        nesterov: this.nesterov,
        weightDecay: this.weightDecay,
        scale: options.scale ?? null,
        foundInf: options.foundInf ?? null,
        stepsDone,
        hyper,
      });
    }
    ops.stepCount(stepsDone, options.foundInf ?? null);
  }

  /**
   * The state to checkpoint (reads the device once).
   *
   * @returns Hyper-parameters, step count and momentum buffers.
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Parameter, SGD } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
   * using opt = new SGD([p], { lr: 0.1, momentum: 0.9 });
   * opt.step();
   * const s = await opt.stateDict();
   * assert.strictEqual(s.stepsDone, 1);
   * assert.strictEqual(s.momentumBuffers.length, 1);
   * p.dispose();
   * ```
   */
  async stateDict(): Promise<SGDState> {
    const stepsDone = (await this.stepsDone.toHost())[0] as number;
    const momentumBuffers: Float32Array[] = [];
    if (this.momentum !== 0 || this.#buffers.some((b) => b)) {
      for (let i = 0; i < this.params.length; i++) {
        momentumBuffers.push((await this.#buffer(i).toHost()) as Float32Array);
      }
    }
    return {
      hyper: {
        lr: this.lr,
        momentum: this.momentum,
        dampening: this.dampening,
        nesterov: this.nesterov,
        weightDecay: this.weightDecay,
      },
      stepsDone,
      momentumBuffers,
    };
  }

  /**
   * Restores {@linkcode SGD.stateDict}'s result.
   *
   * @param state The saved state.
   * @throws {RangeError} When the state is malformed or its buffers do not match the
   *   parameters; nothing is changed then.
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Parameter, SGD } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
   * using opt = new SGD([p], { lr: 0.1 });
   * opt.loadStateDict({
   *   hyper: { lr: 0.5, momentum: 0, dampening: 0, nesterov: false, weightDecay: 0 },
   *   stepsDone: 3,
   *   momentumBuffers: [],
   * });
   * assert.strictEqual(opt.lr, 0.5);
   * p.dispose();
   * ```
   */
  loadStateDict(state: SGDState): void {
    // Everything is checked before anything is written: a refused state leaves the optimizer
    // as it was.
    const hyper = state?.hyper;
    if (hyper === null || typeof hyper !== "object") {
      throw new RangeError(`Cannot load SGD state: hyper is ${JSON.stringify(hyper)}`);
    }
    for (const k of ["lr", "momentum", "dampening", "weightDecay"] as const) {
      const v = hyper[k];
      if (typeof v !== "number" || !Number.isFinite(v) || (k !== "dampening" && v < 0)) {
        throw new RangeError(`Cannot load SGD state: hyper.${k} is ${JSON.stringify(v)}`);
      }
    }
    if (typeof hyper.nesterov !== "boolean") {
      throw new RangeError(
        `Cannot load SGD state: hyper.nesterov is ${JSON.stringify(hyper.nesterov)}`,
      );
    }
    const steps = state.stepsDone;
    if (!Number.isInteger(steps) || steps < 0 || steps > 0x7fffffff) {
      // The device counter is an int32.
      throw new RangeError(`Cannot load SGD state: stepsDone is ${JSON.stringify(steps)}`);
    }
    const bufs = state.momentumBuffers;
    if (!Array.isArray(bufs)) {
      throw new RangeError("Cannot load SGD state: momentumBuffers is not an array");
    }
    if (bufs.length !== 0 && bufs.length !== this.params.length) {
      throw new RangeError(
        `Cannot load SGD state: ${bufs.length} momentum buffers for ${this.params.length} parameters`,
      );
    }
    bufs.forEach((b, i) => {
      if (!(b instanceof Float32Array) || b.length !== this.params[i].numel) {
        throw new RangeError(
          `Cannot load SGD state: momentum buffer ${i} has ${describe(b)}, parameter ` +
            `${i} needs ${this.params[i].numel} f32 values`,
        );
      }
    });
    bufs.forEach((b, i) => this.#buffer(i).buffer.copyFrom(b));
    this.lr = hyper.lr;
    this.momentum = hyper.momentum;
    this.dampening = hyper.dampening;
    this.nesterov = hyper.nesterov;
    this.weightDecay = hyper.weightDecay;
    this.stepsDone.buffer.copyFrom(new Int32Array([steps]));
  }

  /** Frees the momentum buffers and the step counter (idempotent). */
  dispose(): void {
    for (const b of this.#buffers) b?.dispose();
    this.#buffers = [];
    this.#list?.dispose();
    this.#list = null;
    this.#stepsDone?.dispose();
    this.#stepsDone = null;
    this.#hyper?.dispose();
    this.#hyper = null;
    this.#disposed = true;
  }

  /** Same as {@linkcode SGD.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

function describe(b: unknown): string {
  if (ArrayBuffer.isView(b)) return `${(b as Float32Array).length} ${b.constructor.name} values`;
  return JSON.stringify(b) ?? String(b);
}
