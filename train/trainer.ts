/**
 * One training step and one evaluation step, put together the way PyTorch's AMP recipe does:
 * forward, scaled loss gradient, backward, `scaler.step(optimizer)`, `scaler.update()`,
 * scheduler. Everything is queued on the device; loss and accuracy accumulate there and are
 * read by {@linkcode Trainer.readTrain} / {@linkcode Trainer.readEval} once per log interval.
 *
 * Between backward and the optimizer step is the place where dist/ plugs in: data-parallel
 * training averages the gradients across processes there, through a gradient hook of nn/, so
 * neither this step nor the fit loop above it changes for a run on several processes.
 *
 * @module
 */

import { range } from "../internal/trace.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import type { Tensor } from "../ffi/tensor.ts";
import { CrossEntropyLoss, type LossStats } from "../nn/loss.ts";
import type { GradScaler } from "../nn/grad_scaler.ts";
import type { LRScheduler } from "../nn/lr_scheduler.ts";
import type { Module } from "../nn/module.ts";
import type { SGD } from "../nn/optim.ts";

/** Options of {@linkcode Trainer}. */
export interface TrainerOptions {
  /** The optimizer over the model's parameters. */
  optimizer: SGD;
  /** The loss scaler (none: unscaled fp16 gradients). */
  scaler?: GradScaler | null;
  /** The scheduler. */
  scheduler?: LRScheduler | null;
  /** When the scheduler steps: after every batch (default) or on {@linkcode Trainer.endEpoch}. */
  schedulerInterval?: "batch" | "epoch";
  /**
   * On a step the scaler skips (inf/NaN gradients), put the model's batch-norm running
   * statistics back to their values before the step's forward, on the device (default true).
   * false keeps PyTorch's behaviour, where one NaN batch leaves NaN running statistics for good.
   */
  revertStatsOnSkip?: boolean;
}

/**
 * Runs training and evaluation steps of a classifier with cross-entropy loss.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { Linear, SGD, Trainer } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using model = new Linear(2, 2).to(device);
 * using opt = new SGD(model.parameters(), { lr: 0.5 });
 * using trainer = new Trainer(model, { optimizer: opt });
 * using x = Tensor.fromHost(device, new Float16Array([1, 0, 0, 1]), [2, 2]);
 * using y = Tensor.fromHost(device, new Int32Array([0, 1]), [2]);
 * for (let i = 0; i < 20; i++) trainer.trainStep(x, y);
 * trainer.evalStep(x, y);
 * assert.strictEqual((await trainer.readEval()).accuracy, 1);
 * ```
 */
export class Trainer {
  /** The model. */
  readonly model: Module;
  /** The optimizer. */
  readonly optimizer: SGD;
  /** The loss scaler, if any. */
  readonly scaler: GradScaler | null;
  /** The scheduler, if any. */
  readonly scheduler: LRScheduler | null;
  /** When the scheduler steps. */
  readonly schedulerInterval: "batch" | "epoch";
  /** Whether a skipped step undoes the batch-norm running-statistics update. */
  readonly revertStatsOnSkip: boolean;
  /** Completed training steps (queued), including steps the scaler skipped. */
  steps = 0;
  #trainLoss: CrossEntropyLoss;
  #evalLoss: CrossEntropyLoss;

  /**
   * Creates the trainer and its device loss accumulators.
   *
   * @param model The model, on its device.
   * @param options Optimizer, scaler, scheduler.
   * @throws {TypeError} When the model is not on a device.
   */
  constructor(model: Module, options: TrainerOptions) {
    refuseUnknownKeys(options ?? {}, [
      "optimizer",
      "scaler",
      "scheduler",
      "schedulerInterval",
      "revertStatsOnSkip",
    ], "create Trainer");
    if (!model.device) throw new TypeError("Cannot create a Trainer: the model is not on a device");
    this.model = model;
    this.optimizer = options.optimizer;
    this.scaler = options.scaler ?? null;
    this.scheduler = options.scheduler ?? null;
    this.schedulerInterval = options.schedulerInterval ?? "batch";
    this.revertStatsOnSkip = options.revertStatsOnSkip ?? true;
    this.#trainLoss = new CrossEntropyLoss(model.device);
    this.#evalLoss = new CrossEntropyLoss(model.device);
  }

  /**
   * Queues one training step on the batch.
   *
   * @param x The input batch (fp16).
   * @param labels int32 labels [N].
   */
  trainStep(x: Tensor, labels: Tensor): void {
    if (!this.model.training) this.model.train();
    using _step = range("train.step");
    let logits: Tensor, dlogits: Tensor;
    {
      using _ = range("train.forward");
      logits = this.model.forward(x);
    }
    {
      using _ = range("train.loss");
      dlogits = this.#trainLoss.forwardBackward(logits, labels, this.scaler);
    }
    {
      using _ = range("train.backward");
      this.model.backward(dlogits, { inputGrad: false });
    }
    // The gradients are complete here: the place where dist/ plugs in (see the module doc).
    using _opt = range("train.optimizer");
    if (this.scaler) {
      this.scaler.step(this.optimizer, { model: this.revertStatsOnSkip ? this.model : null });
      this.scaler.update();
    } else {
      this.optimizer.step();
    }
    this.steps++;
    if (this.scheduler && this.schedulerInterval === "batch") this.scheduler.step();
  }

  /**
   * Queues one evaluation step (forward only, evaluation mode).
   *
   * @param x The input batch (fp16).
   * @param labels int32 labels [N].
   */
  evalStep(x: Tensor, labels: Tensor): void {
    if (this.model.training) this.model.eval();
    using _ = range("eval.step");
    this.#evalLoss.forward(this.model.forward(x), labels);
  }

  /** Steps an epoch-interval scheduler; call after each epoch. */
  endEpoch(): void {
    if (this.scheduler && this.schedulerInterval === "epoch") this.scheduler.step();
  }

  /**
   * Reads and resets the training loss/accuracy accumulated since the last read.
   *
   * @returns The statistics.
   */
  readTrain(): Promise<LossStats> {
    return this.#trainLoss.read();
  }

  /**
   * Reads and resets the evaluation loss/accuracy accumulated since the last read.
   *
   * @returns The statistics.
   */
  readEval(): Promise<LossStats> {
    return this.#evalLoss.read();
  }

  /** Frees the loss accumulators (the model, optimizer and scaler belong to the caller). */
  dispose(): void {
    this.#trainLoss.dispose();
    this.#evalLoss.dispose();
  }

  /** Same as {@linkcode Trainer.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
