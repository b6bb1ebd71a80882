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
 * On CUDA the whole step is recorded once per input shape as a CUDA graph and replayed with
 * one launch (see docs/cuda_graphs.md).
 *
 * @module
 */

import { activeRecorder, range } from "../internal/trace.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import { Tensor } from "../ffi/tensor.ts";
import { Event, Stream } from "../ffi/stream.ts";
import { captureRefused, CudaGraph } from "../ffi/graph.ts";
import { CrossEntropyLoss, type LossStats } from "../nn/loss.ts";
import { BatchNorm2d } from "../nn/layers.ts";
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
  /**
   * Record the training step as a CUDA graph per input shape and replay it (default: true on
   * the CUDA backend, false elsewhere). The first step of a shape runs directly (it allocates
   * the model's buffers), the second records the graph; from then on a step is two input
   * copies and one launch. Where recording is refused (no stream-ordered allocator, the CPU
   * backend) the trainer says so in one line on stderr and runs every step directly.
   */
  cudaGraphs?: boolean;
}

/** One input shape's recorded step: the fixed input buffers it reads and what it changes on the host. */
interface Recorded {
  /** One buffer per model input. */
  xs: Tensor[];
  labels: Tensor;
  /** Set once the shape has run directly (its buffers exist). */
  warm: boolean;
  graph: CudaGraph | null;
  /** Samples the step adds to the loss, and training forwards to each batch norm. */
  samples: number;
  tracked: [BatchNorm2d, number][];
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
  /** Whether steps are recorded and replayed as CUDA graphs (the option, as the backend allows). */
  readonly cudaGraphs: boolean;
  /** Completed training steps (queued), including steps the scaler skipped. */
  steps = 0;
  #trainLoss: CrossEntropyLoss;
  #evalLoss: CrossEntropyLoss;
  #graphsRefused: string | null = null;
  #recorded = new Map<string, Recorded>();
  #stream: Stream | null = null;
  #before: Event | null = null;
  #after: Event | null = null;

  /**
   * Creates the trainer and its device loss accumulators.
   *
   * @param model The model, on its device.
   * @param options Optimizer, scaler, scheduler.
   * @throws {TypeError} When the model is not on a device, or when an enabled GradScaler is
   *   given for a bf16 model (bf16 needs no loss scaling).
   */
  constructor(model: Module, options: TrainerOptions) {
    refuseUnknownKeys(options ?? {}, [
      "optimizer",
      "scaler",
      "scheduler",
      "schedulerInterval",
      "revertStatsOnSkip",
      "cudaGraphs",
    ], "create Trainer");
    const graphs = options.cudaGraphs ?? model.device?.kind === "cuda";
    if (typeof graphs !== "boolean") {
      throw new TypeError(`Cannot create a Trainer: cudaGraphs must be a boolean, got ${graphs}`);
    }
    if (!model.device) throw new TypeError("Cannot create a Trainer: the model is not on a device");
    if (model.precision === "bf16" && options.scaler?.enabled) {
      // As torch.autocast(dtype=torch.bfloat16), which runs without a GradScaler: bf16 has
      // fp32's exponent range, so small gradients do not flush to zero and need no scaling.
      throw new TypeError(
        "Cannot create a Trainer: the model computes in bf16, which has fp32's range and needs " +
          "no loss scaling; pass no scaler (or a GradScaler with enabled: false)",
      );
    }
    this.model = model;
    this.optimizer = options.optimizer;
    this.scaler = options.scaler ?? null;
    this.scheduler = options.scheduler ?? null;
    this.schedulerInterval = options.schedulerInterval ?? "batch";
    this.revertStatsOnSkip = options.revertStatsOnSkip ?? true;
    this.cudaGraphs = graphs;
    this.#trainLoss = new CrossEntropyLoss(model.device);
    this.#evalLoss = new CrossEntropyLoss(model.device);
  }

  /**
   * Queues one training step on the batch.
   *
   * @param x The input batch (fp16, or f32 for an fp32 model), or one batch per input of a
   *   model with several inputs ({@linkcode Module.forwardInputs}).
   * @param labels int32 labels [N].
   */
  trainStep(x: Tensor | readonly Tensor[], labels: Tensor): void {
    if (!this.model.training) this.model.train();
    using _step = range("train.step");
    const xs = inputsOf(x, "run a training step");
    // A profiler times each op on its stream: it needs the ops queued one by one.
    if (this.cudaGraphsActive && activeRecorder() === undefined) this.#graphStep(xs, labels);
    else this.#queueStep(xs, labels);
    this.steps++;
    if (this.scheduler && this.schedulerInterval === "batch") this.scheduler.step();
  }

  /**
   * Whether the next training step runs as a CUDA graph: {@linkcode Trainer.cudaGraphs}, unless
   * recording was refused.
   */
  get cudaGraphsActive(): boolean {
    return this.cudaGraphs && this.#graphsRefused === null;
  }

  /** The step's device work, queued on the current stream. */
  #queueStep(xs: readonly Tensor[], labels: Tensor): void {
    let logits: Tensor, dlogits: Tensor;
    {
      using _ = range("train.forward");
      logits = this.model.forwardInputs(xs);
    }
    {
      using _ = range("train.loss");
      dlogits = this.#trainLoss.forwardBackward(logits, labels, this.scaler);
    }
    {
      using _ = range("train.backward");
      this.model.backwardInputs(dlogits, { inputGrad: false });
    }
    // The gradients are complete here: the place where dist/ plugs in (see the module doc).
    using _opt = range("train.optimizer");
    if (this.scaler) {
      this.scaler.step(this.optimizer, { model: this.revertStatsOnSkip ? this.model : null });
      this.scaler.update();
    } else {
      this.optimizer.step();
    }
  }

  /**
   * The step on the trainer's own stream (a graph cannot be recorded on the default stream),
   * ordered after the work queued so far on the current stream, which waits for it in turn.
   */
  #graphStep(xs: readonly Tensor[], labels: Tensor): void {
    const device = this.model.device!;
    const current = device.currentStream;
    const stream = this.#stream ??= new Stream(device, { nonBlocking: true });
    const before = this.#before ??= new Event(device);
    const after = this.#after ??= new Event(device);
    before.record(current);
    stream.waitEvent(before);
    {
      using _ = device.useStream(stream);
      this.#recordedStep(xs, labels);
    }
    after.record(stream);
    current.waitEvent(after);
  }

  #recordedStep(xs: readonly Tensor[], labels: Tensor): void {
    const device = this.model.device!;
    const o = this.optimizer;
    const key = [
      xs.map((x) => `${x.dtype}:${x.shape}`).join(";"),
      `${labels.dtype}:${labels.shape}`,
      `${o.momentum !== 0}:${o.dampening}:${o.nesterov}:${o.weightDecay}`,
      `${this.scaler?.enabled ?? false}:${this.revertStatsOnSkip}`,
    ].join("|");
    let r = this.#recorded.get(key);
    if (!r) {
      r = {
        xs: xs.map((x) => Tensor.empty(device, [...x.shape], x.dtype)),
        labels: Tensor.empty(device, [...labels.shape], labels.dtype),
        warm: false,
        graph: null,
        samples: 0,
        tracked: [],
      };
      this.#recorded.set(key, r);
    }
    // What the graph reads and the host decides: the inputs, lr and momentum.
    xs.forEach((x, i) => r.xs[i].buffer.copyFrom(x.buffer, { bytes: x.byteLength }));
    r.labels.buffer.copyFrom(labels.buffer, { bytes: labels.byteLength });
    o.syncHyperParameters();
    if (r.graph) {
      r.graph.launch();
      this.#trainLoss.countSamples(r.samples);
      for (const [bn, n] of r.tracked) bn.numBatchesTracked += n;
      return;
    }
    if (!r.warm) {
      // Directly, once: the model, the loss and the optimizer allocate what they keep for
      // this shape, which a recording cannot do.
      this.#queueStep(r.xs, r.labels);
      r.warm = true;
      return;
    }
    const samples = this.#trainLoss.samplesCounted;
    const norms = this.model.namedModules().map(([, m]) => m).filter((m) =>
      m instanceof BatchNorm2d
    ) as BatchNorm2d[];
    const tracked = norms.map((bn) => bn.numBatchesTracked);
    const rec = r;
    try {
      rec.graph = CudaGraph.capture(
        device.currentStream,
        () => this.#queueStep(rec.xs, rec.labels),
      );
    } catch (err) {
      // Nothing of the recording ran: put back what it counted on the host, then run the step.
      this.#trainLoss.countSamples(samples - this.#trainLoss.samplesCounted);
      norms.forEach((bn, i) => bn.numBatchesTracked = tracked[i]);
      if (!captureRefused(err)) throw err;
      this.#graphsRefused = err instanceof Error ? err.message : String(err);
      console.error(
        `pinstream: training without CUDA graphs (recording the step was refused): ` +
          this.#graphsRefused.split("\n")[0],
      );
      this.#queueStep(rec.xs, rec.labels);
      return;
    }
    rec.samples = this.#trainLoss.samplesCounted - samples;
    rec.tracked = norms.map((bn, i) => [bn, bn.numBatchesTracked - tracked[i]]);
    rec.graph.launch();
  }

  /**
   * Queues one evaluation step (forward only, evaluation mode).
   *
   * @param x The input batch, or one batch per input (as {@linkcode Trainer.trainStep}).
   * @param labels int32 labels [N].
   */
  evalStep(x: Tensor | readonly Tensor[], labels: Tensor): void {
    if (this.model.training) this.model.eval();
    using _ = range("eval.step");
    const xs = inputsOf(x, "run an evaluation step");
    const logits = this.model.forwardInputs(xs);
    this.#evalLoss.forward(logits, labels);
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

  /**
   * Frees the loss accumulators and the recorded steps with their input buffers (the model,
   * optimizer and scaler belong to the caller).
   */
  dispose(): void {
    for (const r of this.#recorded.values()) {
      r.graph?.dispose();
      for (const x of r.xs) x.dispose();
      r.labels.dispose();
    }
    this.#recorded.clear();
    this.#before?.dispose();
    this.#after?.dispose();
    this.#stream?.dispose();
    this.#before = this.#after = this.#stream = null;
    this.#trainLoss.dispose();
    this.#evalLoss.dispose();
  }

  /** Same as {@linkcode Trainer.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** The step's inputs as an array: one tensor, or a non-empty array of them. */
function inputsOf(x: Tensor | readonly Tensor[], action: string): readonly Tensor[] {
  if (!Array.isArray(x)) return [x as Tensor];
  if (x.length === 0) {
    throw new TypeError(`Cannot ${action}: the inputs are an empty array (give one per input)`);
  }
  return x;
}
