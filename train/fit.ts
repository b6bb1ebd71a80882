// The fit loop of the training examples (examples/cifar.ts, examples/fashion_mnist.ts) and
// the training benchmarks: host batches to device tensors, the epoch loop with a progress bar
// on a terminal, one summary line per epoch, checkpoint and resume, and the loss curves (drawn
// by train/_chart.ts, loaded only when asked for).
//
// Not exported from mod.ts, but small enough to copy into a script. The command line lives in
// train/args.ts, re-exported here.

import { MetricsLog } from "./metrics.ts";
import { TensorBoardWriter } from "./tfevents.ts";
import { gpuLine, GpuSampler, openNvml } from "../ffi/nvml.ts";
import { UsageError } from "./cli.ts";
import { augmentNote, precisionLine, type TrainArgs } from "./args.ts";
import { Device } from "../ffi/device.ts";
import {
  type AugmentOptions,
  DataLoader,
  type Dataset,
  LabeledImages,
  type RingBatch,
} from "../loader/mod.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { DevicePrefetcher } from "../pipeline/prefetcher.ts";
import { Bf16Batches } from "./_bf16_batches.ts";
import {
  GradScaler,
  loadCheckpoint,
  type LRScheduler,
  type Module,
  OneCycleLR,
  saveCheckpoint,
  SGD,
} from "../nn/mod.ts";
import { Trainer } from "./trainer.ts";
import { statePathFor } from "../nn/checkpoint.ts";
import { DataParallel } from "../dist/data_parallel.ts";
import type { ProcessGroup } from "../dist/process_group.ts";
import { joinJob, shardOptions, sumOverRanks } from "./distributed.ts";

/** The chart module, loaded only when a chart is drawn: its npm packages are fetched then, and
 * a run that draws none needs no network (a literal specifier would be fetched up front). */
const CHARTS: string = new URL("./_chart.ts", import.meta.url).href;

export {
  augmentNote,
  parseTrainArgs,
  precisionLine,
  type TrainArgs,
  type TrainCliExtra,
  type TrainDefaults,
  trainSpec,
} from "./args.ts";

/** How the loader's uint8 image batches become normalized fp16 device batches. */
export interface ImageSpec {
  /** Per-channel mean in [0, 1] units. */
  mean: number[];
  /** Per-channel std in [0, 1] units. */
  std: number[];
  /** Memory order of the dataset's image records (default "nchw"). */
  layout?: "nchw" | "nhwc";
  /** The random-crop padding the training loader's `augment` was built with (default 0). */
  padding?: number;
}

/** A progress bar on a terminal, redrawn at most every 100 ms; silent otherwise. */
export class Progress {
  /** Whether the bar is drawn (stdout is a terminal and not --quiet). */
  readonly enabled: boolean;
  #last = 0;
  #enc = new TextEncoder();
  #shown = false;

  constructor(enabled: boolean) {
    this.enabled = enabled && Deno.stdout.isTerminal();
  }

  update(label: string, done: number, total: number, extra = ""): void {
    if (!this.enabled) return;
    const now = performance.now();
    if (now - this.#last < 100 && done < total) return;
    this.#last = now;
    const width = 30;
    const filled = Math.round(width * done / Math.max(1, total));
    const bar = "#".repeat(filled) + ".".repeat(width - filled);
    const line = `\r${label} [${bar}] ${done}/${total} ${extra}`;
    Deno.stdout.writeSync(this.#enc.encode(line.padEnd(100)));
    this.#shown = true;
  }

  clear(): void {
    if (!this.#shown) return;
    Deno.stdout.writeSync(this.#enc.encode("\r" + " ".repeat(100) + "\r"));
    this.#shown = false;
  }
}

/** What a training run reports per epoch. */
export interface EpochReport {
  epoch: number;
  trainLoss: number;
  trainAcc: number;
  /** NaN for an epoch without evaluation (--eval-every). */
  testLoss: number;
  /** NaN for an epoch without evaluation (--eval-every). */
  testAcc: number;
  samplesPerSecond: number;
  inputWaitShare: number;
  seconds: number;
  lossScale: number;
}

/** One evaluation on the test set: after an epoch, or within one (--eval-every-steps). */
export interface EvalReport {
  /** The epoch it ran in (1-based). */
  epoch: number;
  /** Training steps done before it, over the whole run. */
  step: number;
  testLoss: number;
  testAcc: number;
}

/** Everything {@linkcode runTraining} needs. */
export interface RunOptions {
  args: TrainArgs;
  device: Device;
  model: Module;
  trainLoader: DataLoader<RingBatch>;
  testLoader: DataLoader<RingBatch>;
  spec: ImageSpec;
  /** Builds the scheduler for the optimizer (stepped per batch). */
  scheduler?: (opt: SGD, stepsPerEpoch: number) => LRScheduler;
  /** Called with each epoch's report (the line is printed already). */
  onEpoch?: (r: EpochReport) => void;
  /** Called with each evaluation's report. */
  onEval?: (r: EvalReport) => void;
  /**
   * Sample GPU utilisation through NVML while training, for the summary (default: on a CUDA
   * device). Where NVML is absent the summary says so in one line.
   */
  gpuStats?: boolean;
  /** What the data is, for the closing summary (e.g. "CIFAR-10 from DIR"). */
  dataNote?: string;
  /** Data-parallel ranks (sharded loaders; only rank 0 prints, logs and saves). */
  group?: ProcessGroup | null;
}

/**
 * The closing summary of a run: what it trained on, speed, input-wait share, test accuracy
 * per epoch, and where the checkpoint is.
 *
 * @param reports The run's epochs.
 * @param o What the summary names: device kind, data, checkpoint path.
 * @returns The lines, joined by newlines.
 * @example
 * ```ts
 * import { summaryText } from "./fit.ts";
 * import assert from "node:assert";
 * const r = { epoch: 1, trainLoss: 1, trainAcc: 0.5, testLoss: 1, testAcc: 0.42,
 *   samplesPerSecond: 100, inputWaitShare: 0.1, seconds: 2, lossScale: 1 };
 * assert.match(summaryText([r], { device: "cpu" }), /test accuracy +42\.00%/);
 * ```
 */
export function summaryText(
  reports: readonly EpochReport[],
  o: {
    device: string;
    data?: string;
    checkpoint?: string;
    metrics?: string;
    /** Peak bytes of device memory and of pinned host memory during the run. */
    memory?: { device: number; pinned: number };
    /** GPU utilisation during the run (gpuLine), or why there is none. */
    gpu?: string;
  },
): string {
  if (reports.length === 0) return "summary: no epoch ran";
  const evaluated = reports.filter((r) => Number.isFinite(r.testAcc));
  const seconds = reports.reduce((a, r) => a + r.seconds, 0);
  const samples = reports.reduce((a, r) => a + r.samplesPerSecond * r.seconds, 0);
  const wait = reports.reduce((a, r) => a + r.inputWaitShare * r.seconds, 0) / seconds;
  const last = evaluated[evaluated.length - 1];
  const pct = (x: number) => `${(100 * x).toFixed(2)}%`;
  const lines = [
    `summary: ${reports.length} epoch${reports.length > 1 ? "s" : ""} on ${o.device}` +
    `${o.data ? `, ${o.data}` : ""}`,
    `  training speed  ${fmtNum(samples / seconds)} samples/s (${
      seconds.toFixed(1)
    } s of training)`,
    `  input wait      ${(100 * wait).toFixed(1)}% of the training step time`,
    last === undefined
      ? `  test accuracy   not evaluated`
      : `  test accuracy   ${pct(last.testAcc)} after epoch ${last.epoch}` +
        (evaluated.length > 1
          ? ` (by epoch: ${
            evaluated.map((r) =>
              evaluated.length === reports.length ? pct(r.testAcc) : `${r.epoch}: ${pct(r.testAcc)}`
            ).join(", ")
          })`
          : ""),
    `  checkpoint      ${
      o.checkpoint
        ? `${o.checkpoint} (+ ${statePathFor(o.checkpoint)})`
        : "not saved (pass --checkpoint PATH)"
    }`,
    ...(o.memory
      ? [
        `  memory peak     ${mib(o.memory.device)} on the device, ${
          mib(o.memory.pinned)
        } of pinned host memory`,
      ]
      : []),
    ...(o.gpu ? [`  gpu             ${o.gpu}`] : []),
    ...(o.metrics ? [`  metrics         ${o.metrics}`] : []),
  ];
  return lines.join("\n");
}

/**
 * Draws the log's loss and accuracy curves to `<log>.svg` (Vega-Lite, train/_chart.ts).
 * Returns " (+ curves: PATH)", or why none was drawn: the chart library comes from npm, and a
 * machine that cannot reach it still trains.
 */
async function drawCurves(logPath: string): Promise<string> {
  try {
    const { curvesSvg } = await import(CHARTS);
    const svg = await curvesSvg(await MetricsLog.read(logPath));
    await Deno.writeTextFile(`${logPath}.svg`, svg);
    return ` (+ curves: ${logPath}.svg)`;
  } catch (err) {
    const first = (err as Error).message.split("\n")[0];
    // Offline, Deno's own message names a transitive package of the chart library: say what
    // is missing and how to prepare the machine instead.
    if (/Failed caching npm package|error sending request|dns error/i.test(first)) {
      return " (no curves drawn: the chart package npm:vega-lite is not in the Deno cache and " +
        "the npm registry cannot be reached; `deno task cache` prepares a cache, see " +
        "docs/offline.md)";
    }
    return ` (no curves drawn: ${first})`;
  }
}

function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

function fmtNum(x: number): string {
  return Math.round(x).toLocaleString("en-US");
}

/**
 * Trains `model` for `args.epochs` epochs, evaluating after every `args.evalEvery`-th (and
 * the last) and every `args.evalEverySteps` steps, printing one line per epoch and per
 * evaluation within an epoch.
 * Batches reach the device through the pipeline's {@linkcode DevicePrefetcher} (pinned ring,
 * copy stream, the loader's augmentation, normalize and cast to the model's precision fused on
 * the device). The model must be on `device` with `args.precision`.
 *
 * @returns The per-epoch reports.
 */
export async function runTraining(o: RunOptions): Promise<EpochReport[]> {
  const { args, device, model, trainLoader, testLoader, spec } = o;
  if (args.resume && !args.checkpoint) {
    throw new UsageError("option --resume needs --checkpoint PATH; see --help");
  }
  const optimizer = new SGD(model.parameters(), {
    lr: args.lr,
    momentum: args.momentum,
    weightDecay: args.weightDecay,
  });
  if (model.precision !== args.precision) {
    throw new TypeError(
      `Cannot train: the model computes in ${model.precision} but --precision is ` +
        `${args.precision} (move it with model.to(device, { precision: "${args.precision}" }))`,
    );
  }
  const scaler = new GradScaler(device, { enabled: args.lossScaling });
  const scheduler = o.scheduler?.(optimizer, trainLoader.length) ?? null;
  const group = o.group ?? null;
  const lead = group === null || group.rank === 0;
  const say = lead ? (line: string) => console.log(line) : () => {};
  const net = group ? new DataParallel(model, group) : model;
  const trainer = new Trainer(net, {
    optimizer,
    scaler,
    scheduler,
    cudaGraphs: (args.cudaGraphs ?? true) && device.kind === "cuda",
  });
  const overRanks = (lossSum: number, correct: number, seen: number) =>
    sumOverRanks(group, lossSum, correct, seen);
  const norm = {
    mean: spec.mean,
    std: spec.std,
    layout: spec.layout ?? "nchw",
    persistent: true,
    // bf16 batches: the prefetcher delivers f32 and one cast on the device rounds them
    // (Bf16Batches), as torch.autocast casts its inputs.
    dtype: args.precision === "fp16" ? "f16" as const : "f32" as const,
  };
  const bf16 = new Bf16Batches(args.precision === "bf16");
  const trainFeed = new DevicePrefetcher(trainLoader, device, {
    ...norm,
    padding: spec.padding ?? 0,
  });
  const testFeed = new DevicePrefetcher(testLoader, device, { ...norm, padding: 0 });
  const progress = new Progress(!args.quiet && lead);
  const reports: EpochReport[] = [];
  device.resetPeakMemoryStats();
  const logPath = args.log ??
    (args.checkpoint
      ? `${args.checkpoint.replace(/\.safetensors$/, "")}.metrics.jsonl`
      : undefined);
  const evalEvery = args.evalEvery ?? 1;
  const evalEverySteps = args.evalEverySteps ?? 0;
  if (!Number.isSafeInteger(evalEvery) || evalEvery < 1) {
    throw new UsageError(`option --eval-every takes a whole number >= 1, got ${evalEvery}`);
  }
  if (!Number.isSafeInteger(evalEverySteps) || evalEverySteps < 0) {
    throw new UsageError(
      `option --eval-every-steps takes a whole number >= 0, got ${evalEverySteps}`,
    );
  }
  // A resumed run goes on appending; a new one starts the log afresh.
  const log = logPath && lead ? await MetricsLog.open(logPath, { append: args.resume }) : undefined;
  let tb: TensorBoardWriter | undefined;
  const nvml = lead && (o.gpuStats ?? device.kind === "cuda") ? openNvml() : undefined;
  const sampler = nvml === undefined || typeof nvml === "string" ? undefined : new GpuSampler(nvml);
  let gpu = typeof nvml === "string" ? nvml : undefined;
  let startEpoch = 0;
  let step = 0;
  /** Runs the test set; the model goes back to training mode at the next trainStep. */
  const evaluate = async (epoch: number): Promise<EvalReport> => {
    for await (const b of testFeed) trainer.evalStep(bf16.of(b.images), b.labels);
    const l = await trainer.readEval();
    // Every rank evaluates its shard at the same steps; the figures are over all of them.
    const t = overRanks(l.loss * l.samples, l.accuracy * l.samples, l.samples);
    const r = { epoch, step, testLoss: t.lossSum / t.seen, testAcc: t.correct / t.seen };
    tb?.addScalars({ "test/loss": r.testLoss, "test/accuracy": r.testAcc }, step);
    o.onEval?.(r);
    return r;
  };
  try {
    // One event file per run: rank 0's.
    tb = args.tensorboard === undefined || !lead
      ? undefined
      : TensorBoardWriter.open(args.tensorboard);
    if (args.resume && args.checkpoint) {
      const p = await loadCheckpoint(args.checkpoint, { model, optimizer, scaler, scheduler });
      startEpoch = p.epoch;
      step = p.step;
      say(`resumed from ${args.checkpoint} after epoch ${startEpoch} (step ${step})`);
    }
    for (let epoch = startEpoch; epoch < args.epochs; epoch++) {
      // The data order is a pure function of (seed, epoch): a resumed run sees the same batches.
      if (trainLoader.epoch !== epoch) trainLoader.setEpoch(epoch);
      const total = trainLoader.length;
      const logEvery = Math.max(1, Math.min(50, Math.floor(total / 10)));
      let done = 0, lossSum = 0, correct = 0, seen = 0, evalMs = 0;
      let lastEval: EvalReport | undefined;
      const t0 = performance.now();
      for await (const b of trainFeed) {
        trainer.trainStep(bf16.of(b.images), b.labels);
        done++;
        step++;
        if (done % logEvery === 0 && (progress.enabled || tb !== undefined)) {
          // One device read per log interval (design decision 5), not per step.
          const s = await trainer.readTrain();
          lossSum += s.loss * s.samples;
          correct += s.accuracy * s.samples;
          seen += s.samples;
          tb?.addScalars(
            { "train/loss": s.loss, "train/accuracy": s.accuracy, "train/lr": optimizer.lr },
            step,
          );
          progress.update(
            `epoch ${epoch + 1}/${args.epochs}`,
            done,
            total,
            `loss ${(lossSum / seen).toFixed(4)} acc ${(100 * correct / seen).toFixed(1)}%`,
          );
        }
        if (evalEverySteps > 0 && step % evalEverySteps === 0) {
          const e0 = performance.now();
          progress.clear();
          lastEval = await evaluate(epoch + 1);
          say(
            `step ${step} (epoch ${epoch + 1}, batch ${done}/${total})  ` +
              `test loss ${lastEval.testLoss.toFixed(4)}  ` +
              `test acc ${(100 * lastEval.testAcc).toFixed(2)}%`,
          );
          // Evaluation time is not training time: samples/s stays comparable.
          evalMs += performance.now() - e0;
        }
      }
      const tail = await trainer.readTrain();
      if (tail.samples) {
        lossSum += tail.loss * tail.samples;
        correct += tail.accuracy * tail.samples;
        seen += tail.samples;
      }
      ({ lossSum, correct, seen } = overRanks(lossSum, correct, seen));
      await device.synchronize();
      const trainMs = performance.now() - t0 - evalMs;
      const stats = trainFeed.stats;
      progress.clear();
      const stopping = epoch + 1 >= args.epochs ||
        (args.stopAfter > 0 && epoch + 1 >= args.stopAfter);
      const due = (epoch + 1) % evalEvery === 0 || stopping;
      // An evaluation by steps that fell on the epoch's last step stands for the epoch's.
      const test = !due
        ? undefined
        : lastEval?.step === step
        ? lastEval
        : await evaluate(epoch + 1);
      const lossScale = await scaler.getScale();
      const report: EpochReport = {
        epoch: epoch + 1,
        trainLoss: lossSum / seen,
        trainAcc: correct / seen,
        testLoss: test?.testLoss ?? NaN,
        testAcc: test?.testAcc ?? NaN,
        samplesPerSecond: seen / (trainMs / 1000),
        inputWaitShare: stats ? stats.waitMs / trainMs : NaN,
        seconds: trainMs / 1000,
        lossScale,
      };
      reports.push(report);
      // What --workers auto / --prefetch-factor auto ran this epoch.
      const tuned = trainLoader.autotune ? trainLoader.stats : undefined;
      say(
        `epoch ${report.epoch}/${args.epochs}  train loss ${report.trainLoss.toFixed(4)}  ` +
          `train acc ${(100 * report.trainAcc).toFixed(2)}%  ` +
          `test acc ${test ? `${(100 * report.testAcc).toFixed(2)}%` : "-"}  ` +
          `${fmtNum(report.samplesPerSecond)} samples/s  ` +
          `input wait ${(100 * report.inputWaitShare).toFixed(1)}%  ` +
          `(${report.seconds.toFixed(1)} s${args.lossScaling ? `, loss scale ${lossScale}` : ""}` +
          `${tuned ? `, ${tuned.numWorkers} workers x prefetch ${tuned.prefetchFactor}` : ""})`,
      );
      o.onEpoch?.(report);
      await log?.append({
        ...report,
        testLoss: test ? report.testLoss : null,
        testAcc: test ? report.testAcc : null,
        step,
        ...(tuned ? { workers: tuned.numWorkers, prefetchFactor: tuned.prefetchFactor } : {}),
        lr: optimizer.lr,
        data: o.dataNote ?? null,
      });
      tb?.addScalars({
        "epoch/train_loss": report.trainLoss,
        "epoch/train_accuracy": report.trainAcc,
        "epoch/samples_per_second": report.samplesPerSecond,
        "epoch/input_wait_share": report.inputWaitShare,
        "epoch/epoch": report.epoch,
      }, step);
      trainer.endEpoch();
      if (args.checkpoint && lead) {
        await saveCheckpoint(args.checkpoint, { model, optimizer, scaler, scheduler }, {
          epoch: epoch + 1,
          step,
          extra: { seed: args.seed, model: args.model },
        });
      }
      if (args.stopAfter > 0 && epoch + 1 >= args.stopAfter) break;
    }
  } finally {
    log?.[Symbol.dispose]();
    tb?.dispose();
    if (sampler) gpu = gpuLine(sampler.stop());
    if (nvml !== undefined && typeof nvml !== "string") nvml.dispose();
    progress.clear();
    await trainFeed[Symbol.asyncDispose]();
    await testFeed[Symbol.asyncDispose]();
    trainer.dispose();
    bf16.dispose();
    if (net !== model) net.dispose();
    scaler.dispose();
    optimizer.dispose();
  }
  if (!lead) return reports;
  const metrics = [
    ...(logPath ? [`${logPath}${await drawCurves(logPath)}`] : []),
    ...(args.tensorboard ? [`TensorBoard: tensorboard --logdir ${args.tensorboard}`] : []),
  ].join("; ") || undefined;
  console.log(
    summaryText(reports, {
      device: device.kind,
      data: o.dataNote,
      checkpoint: args.checkpoint,
      metrics,
      memory: { device: device.maxMemoryAllocated(), pinned: device.maxPinnedMemoryAllocated() },
      gpu,
    }),
  );
  return reports;
}

/**
 * The first `limit` samples of a labeled image set held in memory (--limit), as a
 * TensorDataset over the same memory; any other set, or a limit of 0 or not below the set's
 * length, gives the set itself.
 *
 * @param set The training set.
 * @param limit The sample count to keep (0: all).
 * @returns The set, or its first `limit` samples.
 */
export function firstSamples(set: Dataset, limit: number): Dataset {
  if (!(set instanceof LabeledImages) || limit <= 0 || limit >= set.length) return set;
  const shape = set.sharedFields()[0].shape;
  const bytes = shape.reduce((a, b) => a * b, 1);
  return new TensorDataset({
    image: { data: set.images.subarray(0, limit * bytes), shape: [...shape] },
    label: set.labels.subarray(0, limit),
  });
}

/** What {@linkcode trainImages} trains on, and how it says so. */
export interface ImageRun {
  /** The training set. */
  train: Dataset;
  /** The test set. */
  test: Dataset;
  /** Builds the model on the host (called once the device is open). */
  model: () => Module;
  /** Per-channel mean and standard deviation of the data (of x / 255). */
  mean: number[];
  /** See `mean`. */
  std: number[];
  /** The training augmentation (null or undefined: none). */
  augment: AugmentOptions | null | undefined;
  /** The start of the start-up line, before the device (e.g. "training on ..."). */
  intro: string;
  /** What the data is, for the closing summary. */
  dataNote: string;
  /** Memory order of the image records (default "nchw"; decoded image files are "nhwc"). */
  layout?: "nchw" | "nhwc";
}

/**
 * Trains an image example: opens `args.device`, builds the model there in `args.precision`,
 * loads batches with the loader's workers (shuffled and augmented for training), prints the
 * start-up line and runs {@linkcode runTraining} with a one-cycle schedule peaking at
 * `args.lr`.
 *
 * @param args The options (see --help).
 * @param run The data, the model and the start-up line.
 * @returns The per-epoch reports.
 */
export async function trainImages(args: TrainArgs, run: ImageRun): Promise<EpochReport[]> {
  const { train, test, augment } = run;
  // The mpi backend reduces cpu-device memory: a distributed run on "auto" takes the CPU.
  using group = joinJob(args.distributed ?? false);
  using device = Device.open(group && args.device === "auto" ? "cpu" : args.device);
  const model = run.model().to(device, { precision: args.precision });
  const common = {
    batchSize: args.batchSize,
    numWorkers: args.workers,
    ...(args.prefetchFactor !== undefined && args.workers !== 0
      ? { prefetchFactor: args.prefetchFactor }
      : {}),
    seed: args.seed,
    // Slots go back to the loader only once their copy to the device has fired.
    autoRelease: false,
  };
  const workers = args.workers !== 0 ? { persistentWorkers: true } : {};

  await using trainLoader = new DataLoader<RingBatch>(train, {
    ...common,
    ...workers,
    ...shardOptions(train, group, true, args.seed),
    ...(augment ? { augment } : {}),
  });
  await using testLoader = new DataLoader<RingBatch>(test, {
    ...common,
    ...workers,
    ...(group ? shardOptions(test, group, false, args.seed) : {}),
  });
  if (group === null || group.rank === 0) {
    console.log(
      `${run.intro}, device ${device.kind} (${device.props.name}), batch ${args.batchSize}` +
        `${group ? ` per rank x ${group.size} ranks (${group.mpi ?? "one process"})` : ""}, ` +
        `${args.workers} workers${
          args.prefetchFactor !== undefined && args.workers !== 0
            ? ` (prefetch ${args.prefetchFactor})`
            : ""
        }, ${precisionLine(args)}, ${augmentNote(augment)}`,
    );
  }
  try {
    return await runTraining({
      args,
      device,
      model,
      trainLoader,
      testLoader,
      dataNote: run.dataNote,
      group,
      spec: {
        mean: run.mean,
        std: run.std,
        padding: augment?.padding ?? 0,
        layout: run.layout,
      },
      scheduler: (opt, steps) =>
        new OneCycleLR(opt, {
          maxLr: args.lr,
          totalSteps: args.epochs * steps,
          cycleMomentum: args.cycleMomentum,
        }),
    });
  } finally {
    model.dispose();
  }
}
