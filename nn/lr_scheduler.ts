/**
 * Learning-rate schedulers with PyTorch's (1.13) formulas, step for step.
 *
 * Each scheduler follows `torch.optim.lr_scheduler`: construction performs the initial step
 * (`lastEpoch` becomes 0 and the optimizer's lr is set for step 0), and every `step()` advances
 * `lastEpoch` by one and writes the new lr (computed recursively from the current lr where
 * PyTorch does so, so the values agree to the last bits). Call `step()` once per epoch or once
 * per batch, as the schedule was specified.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";

/** What a scheduler drives: an optimizer with a settable learning rate (and momentum). */
export interface ScheduledOptimizer {
  /** The learning rate used by the next `step()`. */
  lr: number;
  /** The momentum used by the next `step()` (cycled by {@linkcode OneCycleLR}). */
  momentum?: number;
}

/** A scheduler's state, as saved in a checkpoint. */
export interface LRSchedulerState {
  /** PyTorch's `last_epoch`: the number of `step()` calls after the initial one. */
  lastEpoch: number;
  /** PyTorch's `_step_count`. */
  stepCount: number;
  /** The lr at construction (`initial_lr`). */
  baseLr: number;
  /** The lr the last step wrote. */
  lastLr: number;
  /** The momentum the last step wrote, for schedules that cycle it. */
  lastMomentum?: number;
}

/**
 * The base class: holds `lastEpoch`, the base lr, and the step protocol.
 *
 * @example A constant schedule
 * ```ts
 * import { LRScheduler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * class Constant extends LRScheduler {
 *   constructor(opt: { lr: number }) {
 *     super(opt);
 *     this.initialStep(); // subclasses finish their constructor with the initial step
 *   }
 *   protected computeLr(): number {
 *     return this.baseLr;
 *   }
 * }
 * const opt = { lr: 0.1 };
 * const s = new Constant(opt);
 * s.step();
 * assert.strictEqual(opt.lr, 0.1);
 * assert.strictEqual(s.lastEpoch, 1);
 * ```
 */
export abstract class LRScheduler {
  /** The optimizer whose lr is set. */
  readonly optimizer: ScheduledOptimizer;
  /** The lr the schedule starts from (PyTorch's `base_lrs[0]`). */
  baseLr: number;
  /** PyTorch's `last_epoch`. */
  lastEpoch: number = -1;
  /** PyTorch's `_step_count`. */
  stepCount: number = 0;
  #lastLr = NaN;

  /**
   * Binds the scheduler to an optimizer and performs the initial step.
   *
   * @param optimizer The optimizer (its current lr becomes the base lr).
   * @param baseLr Overrides the base lr (used by schedules that define their own).
   */
  constructor(optimizer: ScheduledOptimizer, baseLr?: number) {
    this.optimizer = optimizer;
    this.baseLr = baseLr ?? optimizer.lr;
    if (baseLr !== undefined) optimizer.lr = baseLr;
    if (!Number.isFinite(this.baseLr) || this.baseLr < 0) {
      throw new RangeError(`Cannot create a scheduler: invalid base lr ${this.baseLr}`);
    }
  }

  /** Call at the end of a subclass constructor: PyTorch's `_initial_step`. */
  protected initialStep(): void {
    this.step();
  }

  /** PyTorch's `get_lr()`: the lr for `lastEpoch`, possibly from the current `optimizer.lr`. */
  protected abstract computeLr(): number;

  /**
   * Advances the schedule by one step and writes the new lr into the optimizer.
   *
   * @example
   * ```ts
   * import { StepLR } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const opt = { lr: 1 };
   * const s = new StepLR(opt, { stepSize: 1, gamma: 0.5 });
   * s.step();
   * assert.strictEqual(opt.lr, 0.5);
   * ```
   */
  step(): void {
    this.stepCount++;
    this.lastEpoch++;
    this.optimizer.lr = this.computeLr();
    this.#lastLr = this.optimizer.lr;
  }

  /**
   * The lr written by the last step (PyTorch's `get_last_lr()[0]`).
   *
   * @returns The lr.
   * @example
   * ```ts
   * import { StepLR } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * assert.strictEqual(new StepLR({ lr: 0.3 }, { stepSize: 2 }).getLastLr(), 0.3);
   * ```
   */
  getLastLr(): number {
    return this.#lastLr;
  }

  /**
   * The state to save in a checkpoint.
   *
   * @returns The state.
   * @example
   * ```ts
   * import { StepLR } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const a = new StepLR({ lr: 1 }, { stepSize: 1, gamma: 0.1 });
   * a.step();
   * const opt = { lr: 1 };
   * const b = new StepLR(opt, { stepSize: 1, gamma: 0.1 });
   * b.loadStateDict(a.stateDict());
   * b.step();
   * a.step();
   * assert.strictEqual(b.getLastLr(), a.getLastLr());
   * ```
   */
  stateDict(): LRSchedulerState {
    const s: LRSchedulerState = {
      lastEpoch: this.lastEpoch,
      stepCount: this.stepCount,
      baseLr: this.baseLr,
      lastLr: this.#lastLr,
    };
    if (this.optimizer.momentum !== undefined) s.lastMomentum = this.optimizer.momentum;
    return s;
  }

  /**
   * Restores a state from {@linkcode LRScheduler.stateDict} and writes its lr into the optimizer,
   * so the next `step()` continues the saved schedule.
   *
   * @param state The saved state.
   * @throws {TypeError} When the state is malformed.
   * @example
   * ```ts
   * import { StepLR } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const opt = { lr: 1 };
   * const s = new StepLR(opt, { stepSize: 1 });
   * s.loadStateDict({ lastEpoch: 3, stepCount: 4, baseLr: 1, lastLr: 0.001 });
   * assert.strictEqual(opt.lr, 0.001);
   * ```
   */
  loadStateDict(state: LRSchedulerState): void {
    for (const k of ["lastEpoch", "stepCount", "baseLr", "lastLr"] as const) {
      if (typeof state?.[k] !== "number") {
        throw new TypeError(`Cannot load scheduler state: ${k} is ${String(state?.[k])}`);
      }
    }
    this.lastEpoch = state.lastEpoch;
    this.stepCount = state.stepCount;
    this.baseLr = state.baseLr;
    this.#lastLr = state.lastLr;
    this.optimizer.lr = state.lastLr;
    if (state.lastMomentum !== undefined && this.optimizer.momentum !== undefined) {
      this.optimizer.momentum = state.lastMomentum;
    }
  }
}

/** Options of {@linkcode StepLR}. */
export interface StepLROptions {
  /** Decay the lr every `stepSize` steps. */
  stepSize: number;
  /** The decay factor (PyTorch's default 0.1). */
  gamma?: number;
}

/**
 * `torch.optim.lr_scheduler.StepLR`: multiplies the lr by `gamma` every `stepSize` steps.
 *
 * @example
 * ```ts
 * import { StepLR } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const opt = { lr: 1 };
 * const s = new StepLR(opt, { stepSize: 2, gamma: 0.1 });
 * s.step();
 * assert.strictEqual(opt.lr, 1);
 * s.step();
 * assert.ok(Math.abs(opt.lr - 0.1) < 1e-15);
 * ```
 */
export class StepLR extends LRScheduler {
  /** Steps between decays. */
  readonly stepSize: number;
  /** The decay factor. */
  readonly gamma: number;

  /**
   * Binds the schedule to the optimizer and performs the initial step.
   *
   * @param optimizer The optimizer.
   * @param options Step size and gamma.
   * @throws {RangeError} When `stepSize` is not a positive integer.
   */
  constructor(optimizer: ScheduledOptimizer, options: StepLROptions) {
    refuseUnknownKeys(options ?? {}, ["stepSize", "gamma"], "create StepLR");
    super(optimizer);
    if (!Number.isInteger(options.stepSize) || options.stepSize <= 0) {
      throw new RangeError(`Cannot create StepLR: stepSize ${options.stepSize} must be >= 1`);
    }
    this.stepSize = options.stepSize;
    this.gamma = options.gamma ?? 0.1;
    this.initialStep();
  }

  /** PyTorch's `get_lr()` for this schedule. */
  protected computeLr(): number {
    const lr = this.optimizer.lr;
    if (this.lastEpoch === 0 || this.lastEpoch % this.stepSize !== 0) return lr;
    return lr * this.gamma;
  }
}

/** Options of {@linkcode CosineAnnealingLR}. */
export interface CosineAnnealingLROptions {
  /** Half the period, in steps (PyTorch's `T_max`). */
  tMax: number;
  /** The minimum lr (PyTorch's `eta_min`, default 0). */
  etaMin?: number;
}

/**
 * `torch.optim.lr_scheduler.CosineAnnealingLR`, with PyTorch's recursive update.
 *
 * @example
 * ```ts
 * import { CosineAnnealingLR } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const opt = { lr: 1 };
 * const s = new CosineAnnealingLR(opt, { tMax: 2 });
 * s.step();
 * assert.ok(Math.abs(opt.lr - 0.5) < 1e-12);
 * s.step();
 * assert.ok(Math.abs(opt.lr) < 1e-12);
 * ```
 */
export class CosineAnnealingLR extends LRScheduler {
  /** Half period in steps. */
  readonly tMax: number;
  /** The minimum lr. */
  readonly etaMin: number;

  /**
   * Binds the schedule to the optimizer and performs the initial step.
   *
   * @param optimizer The optimizer.
   * @param options `tMax` and `etaMin`.
   * @throws {RangeError} When `tMax` is not a positive integer.
   */
  constructor(optimizer: ScheduledOptimizer, options: CosineAnnealingLROptions) {
    refuseUnknownKeys(options ?? {}, ["tMax", "etaMin"], "create CosineAnnealingLR");
    super(optimizer);
    if (!Number.isInteger(options.tMax) || options.tMax <= 0) {
      throw new RangeError(`Cannot create CosineAnnealingLR: tMax ${options.tMax} must be >= 1`);
    }
    this.tMax = options.tMax;
    this.etaMin = options.etaMin ?? 0;
    this.initialStep();
  }

  /** PyTorch's `get_lr()` for this schedule. */
  protected computeLr(): number {
    const { lastEpoch: e, tMax: T, etaMin: m, baseLr: b } = this;
    const lr = this.optimizer.lr;
    if (e === 0) return lr;
    if (this.stepCount === 1 && e > 0) return m + (b - m) * (1 + Math.cos(e * Math.PI / T)) / 2;
    if ((e - 1 - T) % (2 * T) === 0) return lr + (b - m) * (1 - Math.cos(Math.PI / T)) / 2;
    return (1 + Math.cos(Math.PI * e / T)) / (1 + Math.cos(Math.PI * (e - 1) / T)) * (lr - m) + m;
  }
}

/** Options of {@linkcode LinearLR}. */
export interface LinearLROptions {
  /** The factor at step 0 (PyTorch's default 1/3), in (0, 1]. */
  startFactor?: number;
  /** The factor from `totalIters` on (default 1), in [0, 1]. */
  endFactor?: number;
  /** Steps to go from start to end factor (default 5). */
  totalIters?: number;
}

/**
 * `torch.optim.lr_scheduler.LinearLR`: linear warm-up (or decay) of a factor applied to the lr.
 *
 * @example Warm-up over 4 steps
 * ```ts
 * import { LinearLR } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const opt = { lr: 1 };
 * const s = new LinearLR(opt, { startFactor: 0.25, totalIters: 4 });
 * assert.strictEqual(opt.lr, 0.25);
 * for (let i = 0; i < 4; i++) s.step();
 * assert.ok(Math.abs(opt.lr - 1) < 1e-12);
 * ```
 */
export class LinearLR extends LRScheduler {
  /** Factor at step 0. */
  readonly startFactor: number;
  /** Factor at the end. */
  readonly endFactor: number;
  /** Steps of the ramp. */
  readonly totalIters: number;

  /**
   * Binds the schedule to the optimizer and performs the initial step (lr * startFactor).
   *
   * @param optimizer The optimizer.
   * @param options The factors and length of the ramp.
   * @throws {RangeError} When a factor is out of range, as PyTorch checks.
   */
  constructor(optimizer: ScheduledOptimizer, options: LinearLROptions = {}) {
    refuseUnknownKeys(options ?? {}, ["startFactor", "endFactor", "totalIters"], "create LinearLR");
    super(optimizer);
    this.startFactor = options.startFactor ?? 1 / 3;
    this.endFactor = options.endFactor ?? 1;
    this.totalIters = options.totalIters ?? 5;
    if (!(this.startFactor > 0 && this.startFactor <= 1)) {
      throw new RangeError(
        `Cannot create LinearLR: startFactor ${this.startFactor} must be in (0, 1]`,
      );
    }
    if (!(this.endFactor >= 0 && this.endFactor <= 1)) {
      throw new RangeError(`Cannot create LinearLR: endFactor ${this.endFactor} must be in [0, 1]`);
    }
    if (!Number.isInteger(this.totalIters) || this.totalIters < 0) {
      throw new RangeError(`Cannot create LinearLR: totalIters ${this.totalIters} must be >= 0`);
    }
    this.initialStep();
  }

  /** PyTorch's `get_lr()` for this schedule. */
  protected computeLr(): number {
    const lr = this.optimizer.lr;
    const { startFactor: s, endFactor: f, totalIters: n, lastEpoch: e } = this;
    if (e === 0) return lr * s;
    if (e > n) return lr;
    return lr * (1 + (f - s) / (n * s + (e - 1) * (f - s)));
  }
}

/** Options of {@linkcode OneCycleLR}. */
export interface OneCycleLROptions {
  /** The peak lr. */
  maxLr: number;
  /** The schedule's length in steps (or give `epochs` and `stepsPerEpoch`). */
  totalSteps?: number;
  /** Epochs, with `stepsPerEpoch`, when `totalSteps` is not given. */
  epochs?: number;
  /** Steps per epoch, with `epochs`. */
  stepsPerEpoch?: number;
  /** Share of the cycle spent increasing the lr (default 0.3). */
  pctStart?: number;
  /** "cos" (default) or "linear". */
  annealStrategy?: "cos" | "linear";
  /** Cycle momentum inversely to the lr (default true). */
  cycleMomentum?: boolean;
  /** Momentum at the lr peak (default 0.85). */
  baseMomentum?: number;
  /** Momentum at the start and end (default 0.95). */
  maxMomentum?: number;
  /** initial lr = maxLr / divFactor (default 25). */
  divFactor?: number;
  /** min lr = initial lr / finalDivFactor (default 1e4). */
  finalDivFactor?: number;
  /** Use PyTorch's three-phase variant (default false). */
  threePhase?: boolean;
}

interface Phase {
  end: number;
  lr: [number, number];
  mom: [number, number];
}

/**
 * `torch.optim.lr_scheduler.OneCycleLR` (Smith's 1cycle policy), stepped once per batch.
 * With `cycleMomentum` (the default) it also writes `optimizer.momentum`.
 *
 * @example
 * ```ts
 * import { OneCycleLR } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const opt = { lr: 0, momentum: 0.9 };
 * const s = new OneCycleLR(opt, { maxLr: 1, totalSteps: 10 });
 * assert.ok(Math.abs(opt.lr - 1 / 25) < 1e-12);
 * assert.strictEqual(opt.momentum, 0.95);
 * for (let i = 0; i < 2; i++) s.step();
 * assert.ok(Math.abs(opt.lr - 1) < 1e-12); // the peak at step pctStart * 10 - 1 = 2
 * ```
 */
export class OneCycleLR extends LRScheduler {
  /** The schedule's length in steps. */
  readonly totalSteps: number;
  readonly #phases: Phase[];
  readonly #anneal: (a: number, b: number, pct: number) => number;
  readonly #cycleMomentum: boolean;

  /**
   * Binds the schedule to the optimizer and performs the initial step (lr = maxLr / divFactor).
   *
   * @param optimizer The optimizer (its lr is replaced by `maxLr / divFactor`).
   * @param options The cycle's parameters, PyTorch's defaults otherwise.
   * @throws {RangeError} When the length or `pctStart` is invalid.
   * @throws {TypeError} When `cycleMomentum` is set and the optimizer has no momentum.
   */
  constructor(optimizer: ScheduledOptimizer, options: OneCycleLROptions) {
    refuseUnknownKeys(options ?? {}, [
      "maxLr",
      "totalSteps",
      "epochs",
      "stepsPerEpoch",
      "pctStart",
      "annealStrategy",
      "cycleMomentum",
      "baseMomentum",
      "maxMomentum",
      "divFactor",
      "finalDivFactor",
      "threePhase",
    ], "create OneCycleLR");
    const divFactor = options.divFactor ?? 25;
    const initialLr = options.maxLr / divFactor;
    super(optimizer, initialLr);
    const total = options.totalSteps ??
      ((options.epochs ?? NaN) * (options.stepsPerEpoch ?? NaN));
    if (!Number.isInteger(total) || total <= 0) {
      throw new RangeError(
        `Cannot create OneCycleLR: total steps ${total} must be a positive integer ` +
          `(give totalSteps, or epochs and stepsPerEpoch)`,
      );
    }
    const pct = options.pctStart ?? 0.3;
    if (!(pct >= 0 && pct <= 1)) {
      throw new RangeError(`Cannot create OneCycleLR: pctStart ${pct} must be in [0, 1]`);
    }
    this.totalSteps = total;
    const maxLr = options.maxLr;
    const minLr = initialLr / (options.finalDivFactor ?? 1e4);
    const bm = options.baseMomentum ?? 0.85;
    const mm = options.maxMomentum ?? 0.95;
    this.#phases = options.threePhase
      ? [
        { end: pct * total - 1, lr: [initialLr, maxLr], mom: [mm, bm] },
        { end: 2 * pct * total - 2, lr: [maxLr, initialLr], mom: [bm, mm] },
        { end: total - 1, lr: [initialLr, minLr], mom: [mm, mm] },
      ]
      : [
        { end: pct * total - 1, lr: [initialLr, maxLr], mom: [mm, bm] },
        { end: total - 1, lr: [maxLr, minLr], mom: [bm, mm] },
      ];
    this.#anneal = (options.annealStrategy ?? "cos") === "cos"
      ? (a, b, p) => b + (a - b) / 2 * (Math.cos(Math.PI * p) + 1)
      : (a, b, p) => (b - a) * p + a;
    this.#cycleMomentum = options.cycleMomentum ?? true;
    if (this.#cycleMomentum) {
      if (optimizer.momentum === undefined) {
        throw new TypeError("Cannot create OneCycleLR: optimizer has no momentum to cycle");
      }
      optimizer.momentum = mm;
    }
    this.initialStep();
  }

  /** PyTorch's `get_lr()` for this schedule. */
  protected computeLr(): number {
    const step = this.lastEpoch;
    if (step > this.totalSteps) {
      throw new RangeError(
        `Cannot step OneCycleLR: tried to step ${
          step + 1
        } times, total steps is ${this.totalSteps}`,
      );
    }
    let start = 0;
    for (let i = 0; i < this.#phases.length; i++) {
      const ph = this.#phases[i];
      if (step <= ph.end || i === this.#phases.length - 1) {
        const pct = (step - start) / (ph.end - start);
        if (this.#cycleMomentum) this.optimizer.momentum = this.#anneal(ph.mom[0], ph.mom[1], pct);
        return this.#anneal(ph.lr[0], ph.lr[1], pct);
      }
      start = ph.end;
    }
    return this.optimizer.lr;
  }
}
