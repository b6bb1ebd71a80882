// Shared driver of the training examples (examples/cifar.ts, examples/fashion_mnist.ts):
// command line, host batches to device tensors, the epoch loop with a progress bar on a
// terminal, one summary line per epoch, checkpoint and resume.
//
// Not part of the public API (leading underscore), but small enough to copy into a script.

import { parseArgs } from "node:util";
import type { Device } from "../ffi/device.ts";
import type { DataLoader, RingBatch } from "../loader/mod.ts";
import { DevicePrefetcher } from "../pipeline/prefetcher.ts";
import {
  GradScaler,
  loadCheckpoint,
  type LRScheduler,
  type Module,
  saveCheckpoint,
  SGD,
  Trainer,
} from "../nn/mod.ts";

/** Command-line options shared by the examples. */
export interface TrainArgs {
  data?: string;
  device: "auto" | "cpu" | "cuda";
  epochs: number;
  batchSize: number;
  workers: number;
  lr: number;
  momentum: number;
  /** Whether a one-cycle schedule may cycle the momentum (false when --momentum was given). */
  cycleMomentum: boolean;
  weightDecay: number;
  fp16: boolean;
  checkpoint?: string;
  resume: boolean;
  seed: number;
  model: string;
  limit: number;
  stopAfter: number;
  quiet: boolean;
  help: boolean;
}

/** Defaults an example may change. */
export type TrainDefaults = Partial<TrainArgs>;

const HELP = (name: string, d: TrainArgs, extra: string) =>
  `Usage: deno run -A examples/${name} [options]

  --data DIR          data set directory${d.data ? ` (default ${d.data})` : ""}${extra}
  --device KIND       auto | cpu | cuda (default ${d.device}; auto falls back to cpu)
  --epochs N          epochs (default ${d.epochs})
  --batch-size N      batch size (default ${d.batchSize})
  --workers N         DataLoader workers (default ${d.workers})
  --lr X              peak learning rate (default ${d.lr})
  --momentum X        SGD momentum (default: cycled 0.95 -> 0.85 -> 0.95 by the one-cycle
                      schedule; a given value is kept constant)
  --weight-decay X    SGD weight decay (default ${d.weightDecay})
  --fp16 / --no-fp16  dynamic loss scaling on/off (default on). The kernels compute in fp16
                      with fp32 accumulation and fp32 master weights either way; --no-fp16
                      turns off the GradScaler (gradients are then not scaled)
  --checkpoint PATH   save weights (safetensors) + training state after every epoch
  --resume            continue from --checkpoint (same next step as an uninterrupted run)
  --limit N           use only the first N training samples (quick runs)
  --stop-after N      stop after epoch N of --epochs (simulates an interruption; the
                      schedule still spans --epochs, so --resume continues it exactly)
  --seed N            seed of initialization and data order (default ${d.seed})
  --quiet             no progress bar
`;

/**
 * Parses the shared options.
 *
 * @param argv Command-line arguments.
 * @param name The example's file name, for --help.
 * @param defaults Example-specific defaults.
 * @param extraHelp Lines added to --help after --data.
 * @returns The options; exits after printing help on --help.
 */
export function parseTrainArgs(
  argv: string[],
  name: string,
  defaults: TrainDefaults,
  extraHelp = "",
): TrainArgs {
  const d: TrainArgs = {
    device: "auto",
    epochs: 5,
    batchSize: 128,
    workers: 2,
    lr: 0.05,
    momentum: 0.9,
    cycleMomentum: true,
    weightDecay: 0,
    fp16: true,
    resume: false,
    seed: 0,
    model: "cnn",
    limit: 0,
    stopAfter: 0,
    quiet: false,
    help: false,
    ...defaults,
  };
  const { values } = parseArgs({
    args: argv,
    options: {
      data: { type: "string" },
      device: { type: "string" },
      epochs: { type: "string" },
      "batch-size": { type: "string" },
      workers: { type: "string" },
      lr: { type: "string" },
      momentum: { type: "string" },
      "weight-decay": { type: "string" },
      fp16: { type: "boolean" },
      "no-fp16": { type: "boolean" },
      model: { type: "string" },
      checkpoint: { type: "string" },
      resume: { type: "boolean" },
      limit: { type: "string" },
      "stop-after": { type: "string" },
      seed: { type: "string" },
      quiet: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  const num = (k: string, v: string | undefined, dflt: number, int = true): number => {
    if (v === undefined) return dflt;
    const x = Number(v);
    if (!Number.isFinite(x) || (int && !Number.isInteger(x)) || x < 0) {
      throw new RangeError(`Cannot parse --${k}: ${v} is not a valid ${int ? "count" : "number"}`);
    }
    return x;
  };
  const device = (values.device ?? d.device) as TrainArgs["device"];
  if (!["auto", "cpu", "cuda"].includes(device)) {
    throw new RangeError(`Cannot parse --device: ${device} (expected auto, cpu or cuda)`);
  }
  const args: TrainArgs = {
    data: values.data ?? d.data,
    device,
    epochs: num("epochs", values.epochs, d.epochs),
    batchSize: num("batch-size", values["batch-size"], d.batchSize),
    workers: num("workers", values.workers, d.workers),
    lr: num("lr", values.lr, d.lr, false),
    momentum: num("momentum", values.momentum, d.momentum, false),
    cycleMomentum: values.momentum === undefined,
    weightDecay: num("weight-decay", values["weight-decay"], d.weightDecay, false),
    fp16: values["no-fp16"] ? false : (values.fp16 ?? d.fp16),
    model: values.model ?? d.model,
    checkpoint: values.checkpoint ?? d.checkpoint,
    resume: values.resume ?? false,
    limit: num("limit", values.limit, d.limit),
    stopAfter: num("stop-after", values["stop-after"], d.stopAfter),
    seed: num("seed", values.seed, d.seed),
    quiet: values.quiet ?? false,
    help: values.help ?? false,
  };
  if (args.help) {
    console.log(HELP(name, d, extraHelp));
    Deno.exit(0);
  }
  if (args.batchSize < 1) throw new RangeError("Cannot parse --batch-size: must be >= 1");
  if (args.resume && !args.checkpoint) {
    throw new TypeError("Cannot resume: --resume needs --checkpoint PATH");
  }
  return args;
}

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
  testLoss: number;
  testAcc: number;
  samplesPerSecond: number;
  inputWaitShare: number;
  seconds: number;
  lossScale: number;
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
}

function fmtNum(x: number): string {
  return Math.round(x).toLocaleString("en-US");
}

/**
 * Trains `model` for `args.epochs` epochs, evaluating after each, printing one line per epoch.
 * Batches reach the device through the pipeline's {@linkcode DevicePrefetcher} (pinned ring,
 * copy stream, fused crop/flip/normalize/cast to fp16 on the device).
 *
 * @returns The per-epoch reports.
 */
export async function runTraining(o: RunOptions): Promise<EpochReport[]> {
  const { args, device, model, trainLoader, testLoader, spec } = o;
  const optimizer = new SGD(model.parameters(), {
    lr: args.lr,
    momentum: args.momentum,
    weightDecay: args.weightDecay,
  });
  const scaler = new GradScaler(device, { enabled: args.fp16 });
  const scheduler = o.scheduler?.(optimizer, trainLoader.length) ?? null;
  const trainer = new Trainer(model, { optimizer, scaler, scheduler });
  const norm = { mean: spec.mean, std: spec.std, layout: spec.layout ?? "nchw", persistent: true };
  const trainFeed = new DevicePrefetcher(trainLoader, device, {
    ...norm,
    padding: spec.padding ?? 0,
  });
  const testFeed = new DevicePrefetcher(testLoader, device, { ...norm, padding: 0 });
  const progress = new Progress(!args.quiet);
  const reports: EpochReport[] = [];
  let startEpoch = 0;
  let step = 0;
  try {
    if (args.resume && args.checkpoint) {
      const p = await loadCheckpoint(args.checkpoint, { model, optimizer, scaler, scheduler });
      startEpoch = p.epoch;
      step = p.step;
      console.log(`resumed from ${args.checkpoint} after epoch ${startEpoch} (step ${step})`);
    }
    for (let epoch = startEpoch; epoch < args.epochs; epoch++) {
      // The data order is a pure function of (seed, epoch): a resumed run sees the same batches.
      if (trainLoader.epoch !== epoch) trainLoader.setEpoch(epoch);
      const total = trainLoader.length;
      const logEvery = Math.max(1, Math.min(50, Math.floor(total / 10)));
      let done = 0, lossSum = 0, correct = 0, seen = 0;
      const t0 = performance.now();
      for await (const b of trainFeed) {
        trainer.trainStep(b.images, b.labels);
        done++;
        step++;
        if (done % logEvery === 0 && progress.enabled) {
          // One device read per log interval (design decision 5), not per step.
          const s = await trainer.readTrain();
          lossSum += s.loss * s.samples;
          correct += s.accuracy * s.samples;
          seen += s.samples;
          progress.update(
            `epoch ${epoch + 1}/${args.epochs}`,
            done,
            total,
            `loss ${(lossSum / seen).toFixed(4)} acc ${(100 * correct / seen).toFixed(1)}%`,
          );
        }
      }
      const tail = await trainer.readTrain();
      if (tail.samples) {
        lossSum += tail.loss * tail.samples;
        correct += tail.accuracy * tail.samples;
        seen += tail.samples;
      }
      await device.synchronize();
      const trainMs = performance.now() - t0;
      const stats = trainFeed.stats;
      progress.clear();
      for await (const b of testFeed) trainer.evalStep(b.images, b.labels);
      const test = await trainer.readEval();
      const lossScale = await scaler.getScale();
      const report: EpochReport = {
        epoch: epoch + 1,
        trainLoss: lossSum / seen,
        trainAcc: correct / seen,
        testLoss: test.loss,
        testAcc: test.accuracy,
        samplesPerSecond: seen / (trainMs / 1000),
        inputWaitShare: stats ? stats.waitMs / trainMs : NaN,
        seconds: trainMs / 1000,
        lossScale,
      };
      reports.push(report);
      console.log(
        `epoch ${report.epoch}/${args.epochs}  train loss ${report.trainLoss.toFixed(4)}  ` +
          `train acc ${(100 * report.trainAcc).toFixed(2)}%  ` +
          `test acc ${(100 * report.testAcc).toFixed(2)}%  ` +
          `${fmtNum(report.samplesPerSecond)} samples/s  ` +
          `input wait ${(100 * report.inputWaitShare).toFixed(1)}%  ` +
          `(${report.seconds.toFixed(1)} s${args.fp16 ? `, loss scale ${lossScale}` : ""})`,
      );
      o.onEpoch?.(report);
      trainer.endEpoch();
      if (args.checkpoint) {
        await saveCheckpoint(args.checkpoint, { model, optimizer, scaler, scheduler }, {
          epoch: epoch + 1,
          step,
          extra: { seed: args.seed, model: args.model },
        });
      }
      if (args.stopAfter > 0 && epoch + 1 >= args.stopAfter) break;
    }
  } finally {
    progress.clear();
    await trainFeed[Symbol.asyncDispose]();
    await testFeed[Symbol.asyncDispose]();
    trainer.dispose();
    scaler.dispose();
    optimizer.dispose();
  }
  return reports;
}
