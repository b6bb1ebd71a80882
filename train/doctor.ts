/**
 * Does training wait for data? The experiments people run by hand to find an input bottleneck,
 * run on your dataset and model in one call:
 *
 * - **synthetic against real**: training steps on one batch that already sits on the device
 *   (no loader at all) against the same steps fed by the DataLoader and the prefetcher; when
 *   the real rate matches the synthetic one, input is not the bottleneck;
 * - **a worker sweep**: `numWorkers` from 0 to the core count;
 * - **prefetch depth** 1 against the default 2, and **pinned against pageable** staging.
 *
 * Then a verdict in words ("input-bound: 38% of each step waits for data; numWorkers 0 → 2 gives
 * 1.7x"), and every measurement as data for a JSON file or a chart (`deno task doctor` writes
 * both).
 *
 * It trains the model (SGD, learning rate 0 by default, so the weights stay as they are, but
 * batch-norm running statistics move): pass a throwaway copy if that matters.
 *
 * @example
 * ```ts
 * import { diagnose, Flatten, Linear, Sequential, TensorDataset } from "@pinstream/pinstream";
 * import { Device } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const n = 512;
 * const images = new Uint8Array(new SharedArrayBuffer(n * 3 * 8 * 8)).fill(7);
 * const labels = new Int32Array(new SharedArrayBuffer(n * 4));
 * using device = Device.open("cpu");
 * using model = new Sequential([new Flatten(), new Linear(3 * 8 * 8, 10)]).to(device);
 * const report = await diagnose({
 *   device,
 *   model,
 *   dataset: new TensorDataset({ image: { data: images, shape: [3, 8, 8] }, label: labels }),
 *   batchSize: 64,
 *   steps: 4,
 *   workers: [0, 1],
 * });
 * assert.ok(report.synthetic.stepsPerSecond > 0);
 * assert.strictEqual(report.sweep.length, 2);
 * assert.match(report.verdict, /input-bound|not input-bound/);
 * ```
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import { DataLoader, type DataLoaderOptions } from "../loader/data_loader.ts";
import type { Dataset } from "../loader/dataset.ts";
import { toDevice, type ToDeviceOptions } from "../pipeline/prefetcher.ts";
import { Bf16Batches } from "./_bf16_batches.ts";
import type { Module } from "../nn/module.ts";
import { SGD } from "../nn/optim.ts";
import { GradScaler } from "../nn/grad_scaler.ts";
import { Trainer } from "./trainer.ts";
import { PinstreamError } from "../internal/errors.ts";
import { DeviceDataset } from "../pipeline/resident.ts";

/** What {@linkcode diagnose} runs on. */
export interface DoctorOptions {
  /** Where the model trains. */
  device: Device;
  /** A zero-copy dataset (with `sharedFields()`, like TensorDataset, CIFAR10, FashionMNIST). */
  dataset: Dataset;
  /** The model; trained with SGD at `lr` (default 0: the weights do not move). */
  model: Module;
  /** Samples per batch (default 128). */
  batchSize?: number;
  /** Training steps per measurement, after 3 warm-up steps (default 30). */
  steps?: number;
  /** The worker counts of the sweep (default 0 to the core count, at most 5 values). */
  workers?: readonly number[];
  /** Other DataLoader options of every run (augment, seed, ...; not batchSize, numWorkers). */
  loader?: DataLoaderOptions;
  /**
   * Prefetcher options of every run (mean, std, padding, dtype, ...; not depth, pin). The dtype
   * defaults to the model's precision: f32 batches for a model moved with precision "fp32".
   */
  prefetcher?: ToDeviceOptions;
  /** Learning rate of the SGD steps (default 0). */
  lr?: number;
  /**
   * Times each measurement runs; the fastest counts (default 2): other processes on the
   * machine only ever slow a run down.
   */
  repeat?: number;
}

/** One fed measurement. */
export interface DoctorRun {
  /** What was varied, e.g. "numWorkers 2" or "pin none". */
  name: string;
  /** DataLoader workers. */
  numWorkers: number;
  /** Prefetch depth. */
  depth: number;
  /** Staging of the host batches. */
  pin: "register" | "alloc" | "none";
  /** Training steps per second. */
  stepsPerSecond: number;
  /** Samples per second. */
  samplesPerSecond: number;
  /** Share of the step time spent waiting for input (the prefetcher's stats; 0 to 1). */
  inputWaitShare: number;
}

/** What {@linkcode diagnose} found. */
export interface DoctorReport {
  /** The device's name ("cpu:0", "cuda:0"). */
  device: string;
  /** Samples per batch. */
  batchSize: number;
  /** Steps per measurement. */
  steps: number;
  /** Steps on one device-resident batch: the rate with input costing nothing. */
  synthetic: { stepsPerSecond: number; samplesPerSecond: number };
  /** The worker sweep (depth 2, pinned staging). */
  sweep: DoctorRun[];
  /** The best worker count's run with prefetch depth 1. */
  depth1: DoctorRun;
  /** The best worker count's run with pageable staging (pin "none"). */
  pageable: DoctorRun;
  /** The best run of the sweep. */
  best: DoctorRun;
  /**
   * Steps fed by a {@linkcode DeviceDataset} (the data uploaded once, batches made on the
   * device), or undefined when it does not fit in device memory.
   */
  resident?: { stepsPerSecond: number; samplesPerSecond: number };
  /** best.stepsPerSecond / synthetic.stepsPerSecond (1 = input costs nothing). */
  realOverSynthetic: number;
  /**
   * Whether input holds training back: fed steps below 90% of the synthetic rate, and more than
   * 5% of each step spent waiting for data (a gap without waiting is the compute's: real
   * batches can cost more than a synthetic one, on a CPU backend the workers share its cores).
   */
  inputBound: boolean;
  /** The findings in words, one sentence each. */
  verdict: string;
}

const DEFAULT_STEPS = 30;
const WARMUP = 3;

function fmtRate(x: number): string {
  return `${x.toFixed(x < 10 ? 2 : x < 100 ? 1 : 0)}`;
}

/**
 * Runs the experiments and says whether training waits for data.
 *
 * @param options The device, dataset, model and what to vary.
 * @returns The measurements and the verdict.
 * @throws {TypeError} On an unknown option or a dataset without `sharedFields()`.
 * @throws {RangeError} On a non-positive batch size or step count, or a bad worker count.
 *
 * @example
 * ```ts
 * import { Device, diagnose, Flatten, Linear, Sequential, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const images = new Uint8Array(new SharedArrayBuffer(128 * 3 * 4 * 4));
 * const labels = new Int32Array(new SharedArrayBuffer(128 * 4));
 * using device = Device.open("cpu");
 * using model = new Sequential([new Flatten(), new Linear(48, 10)]).to(device);
 * const dataset = new TensorDataset({ image: { data: images, shape: [3, 4, 4] }, label: labels });
 * const r = await diagnose({ device, model, dataset, batchSize: 32, steps: 2, workers: [0], repeat: 1 });
 * console.log(r.verdict);
 * assert.strictEqual(r.sweep[0].numWorkers, 0);
 * ```
 */
export async function diagnose(options: DoctorOptions): Promise<DoctorReport> {
  refuseUnknownKeys(options, [
    "device",
    "dataset",
    "model",
    "batchSize",
    "steps",
    "workers",
    "loader",
    "prefetcher",
    "lr",
    "repeat",
  ], "diagnose");
  const { device, dataset, model } = options;
  if (typeof dataset?.sharedFields !== "function") {
    throw new TypeError(
      "Cannot diagnose: dataset must be a zero-copy dataset (with sharedFields(), e.g. " +
        "TensorDataset, CIFAR10, FashionMNIST)",
    );
  }
  const batchSize = options.batchSize ?? 128;
  const steps = options.steps ?? DEFAULT_STEPS;
  const repeat = options.repeat ?? 2;
  for (
    const [name, v] of [["batchSize", batchSize], ["steps", steps], ["repeat", repeat]] as const
  ) {
    if (!Number.isInteger(v) || v < 1) {
      throw new RangeError(`Cannot diagnose: ${name} must be a positive integer, got ${v}`);
    }
  }
  const cores = Math.max(1, navigator.hardwareConcurrency || 1);
  const workers = options.workers ?? defaultWorkers(cores);
  if (workers.length === 0 || workers.some((w) => !Number.isInteger(w) || w < 0)) {
    throw new RangeError(
      `Cannot diagnose: workers must be non-negative integers, got [${workers.join(", ")}]`,
    );
  }
  // Batches in the model's precision unless the caller says otherwise; loss scaling as the
  // examples do it (fp16 only).
  // (bf16: f32 batches, cast on the device per step, as the fit loop does.)
  const dtype = model.precision === "fp16" ? "f16" : "f32";
  options = { ...options, prefetcher: { dtype, ...options.prefetcher } };
  const opt = new SGD(model.parameters(), { lr: options.lr ?? 0 });
  const scaler = new GradScaler(device, { enabled: model.precision === "fp16" });
  const trainer = new Trainer(model, { optimizer: opt, scaler });
  try {
    const fed = (name: string, numWorkers: number, depth: number, pin: DoctorRun["pin"]) =>
      fastest(
        repeat,
        () => fedRun(trainer, { ...options, batchSize, steps }, { name, numWorkers, depth, pin }),
      );
    const synthetic = await fastest(
      repeat,
      () => syntheticRun(trainer, options, batchSize, steps),
    );
    const sweep: DoctorRun[] = [];
    for (const w of workers) sweep.push(await fed(`numWorkers ${w}`, w, 2, "register"));
    const best = sweep.reduce((a, b) => (b.stepsPerSecond > a.stepsPerSecond ? b : a));
    const depth1 = await fed(
      `numWorkers ${best.numWorkers}, depth 1`,
      best.numWorkers,
      1,
      "register",
    );
    const pageable = await fed(
      `numWorkers ${best.numWorkers}, pin none`,
      best.numWorkers,
      2,
      "none",
    );
    const resident = await fastest(
      repeat,
      () => residentRun(trainer, { ...options, batchSize, steps }),
    );
    const ratio = best.stepsPerSecond / synthetic.stepsPerSecond;
    const report: DoctorReport = {
      device: String(device),
      batchSize,
      steps,
      synthetic,
      sweep,
      depth1,
      pageable,
      best,
      resident,
      realOverSynthetic: ratio,
      inputBound: ratio < 0.9 && best.inputWaitShare > 0.05,
      verdict: "",
    };
    report.verdict = doctorVerdict(report);
    return report;
  } finally {
    trainer.dispose();
    scaler.dispose();
    opt.dispose();
  }
}

/** The fastest of `n` runs of a measurement (undefined when it cannot run). */
async function fastest<T extends { stepsPerSecond: number } | undefined>(
  n: number,
  run: () => Promise<T>,
): Promise<T> {
  let best = await run();
  for (let i = 1; i < n && best !== undefined; i++) {
    const r = await run();
    if (r !== undefined && r.stepsPerSecond > best!.stepsPerSecond) best = r;
  }
  return best;
}

function defaultWorkers(cores: number): number[] {
  const all = Array.from({ length: cores + 1 }, (_, i) => i);
  if (all.length <= 5) return all;
  const step = cores / 4;
  return [...new Set([0, 1, ...[1, 2, 3, 4].map((k) => Math.round(k * step))])].sort((a, b) =>
    a - b
  );
}

async function syntheticRun(
  trainer: Trainer,
  options: DoctorOptions,
  batchSize: number,
  steps: number,
): Promise<{ stepsPerSecond: number; samplesPerSecond: number }> {
  const fields = options.dataset.sharedFields!();
  const image = fields.find((f) => f.shape.length >= 2) ?? fields[0];
  const shape = [batchSize, ...image.shape];
  const count = shape.reduce((a, b) => a * b, 1);
  const pixels = new Float16Array(count);
  for (let i = 0; i < count; i++) pixels[i] = ((i * 2654435761) >>> 0) % 1000 / 1000 - 0.5;
  const dtype = options.prefetcher?.dtype ?? "f16";
  using x = dtype === "f32"
    ? Tensor.fromHost(options.device, Float32Array.from(pixels), shape)
    : Tensor.fromHost(options.device, pixels, shape);
  using y = Tensor.fromHost(
    options.device,
    Int32Array.from({ length: batchSize }, (_, i) => i % 10),
    [batchSize],
  );
  using bf16 = new Bf16Batches(trainer.model.precision === "bf16");
  const input = bf16.of(x);
  for (let i = 0; i < WARMUP; i++) trainer.trainStep(input, y);
  await options.device.synchronize();
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) trainer.trainStep(input, y);
  await options.device.synchronize();
  const s = (performance.now() - t0) / 1000;
  return { stepsPerSecond: steps / s, samplesPerSecond: steps * batchSize / s };
}

async function residentRun(
  trainer: Trainer,
  options: DoctorOptions & { batchSize: number; steps: number },
): Promise<{ stepsPerSecond: number; samplesPerSecond: number } | undefined> {
  const { device, batchSize, steps } = options;
  let resident: DeviceDataset;
  try {
    resident = new DeviceDataset(device, options.dataset, {
      imageField: options.prefetcher?.imageField,
      labelField: options.prefetcher?.labelField,
      layout: options.prefetcher?.layout,
    });
  } catch (err) {
    if (err instanceof PinstreamError && err.code === "OUT_OF_MEMORY") return undefined;
    throw err;
  }
  try {
    const p = options.prefetcher ?? {};
    await using loader = resident.loader({
      batchSize,
      shuffle: true,
      seed: options.loader?.seed,
      augment: options.loader?.augment,
      mean: p.mean,
      std: p.std,
      dtype: p.dtype,
    });
    const { ms } = await timedSteps(trainer, device, loader, steps);
    return {
      stepsPerSecond: steps / (ms / 1000),
      samplesPerSecond: steps * batchSize / (ms / 1000),
    };
  } finally {
    resident[Symbol.dispose]();
  }
}

/**
 * Trains on `source`'s batches (epoch after epoch, as many as it takes): WARMUP steps, then
 * `steps` timed ones. Returns their milliseconds, and how much of `waited()` grew meanwhile.
 */
async function timedSteps(
  trainer: Trainer,
  device: Device,
  source: AsyncIterable<{ images: Tensor; labels: Tensor }>,
  steps: number,
  waited: () => number = () => 0,
): Promise<{ ms: number; waitMs: number }> {
  let done = 0, t0 = 0, wait0 = 0;
  const need = WARMUP + steps;
  using bf16 = new Bf16Batches(trainer.model.precision === "bf16");
  while (done < need) {
    for await (const b of source) {
      if (done === WARMUP) {
        await device.synchronize();
        t0 = performance.now();
        wait0 = waited();
      }
      trainer.trainStep(bf16.of(b.images), b.labels);
      if (++done >= need) break;
    }
  }
  await device.synchronize();
  return { ms: performance.now() - t0, waitMs: waited() - wait0 };
}

async function fedRun(
  trainer: Trainer,
  options: DoctorOptions & { batchSize: number; steps: number },
  run: { name: string; numWorkers: number; depth: number; pin: DoctorRun["pin"] },
): Promise<DoctorRun> {
  const { device, dataset, batchSize, steps } = options;
  await using loader = new DataLoader(dataset, {
    shuffle: true,
    ...options.loader,
    batchSize,
    numWorkers: run.numWorkers,
    persistentWorkers: run.numWorkers > 0,
    autoRelease: false,
  });
  await using feed = toDevice(loader, device, {
    ...options.prefetcher,
    depth: run.depth,
    pin: run.pin,
  });
  const { ms, waitMs } = await timedSteps(
    trainer,
    device,
    feed,
    steps,
    () => feed.stats?.waitMs ?? 0,
  );
  return {
    ...run,
    stepsPerSecond: steps / (ms / 1000),
    samplesPerSecond: steps * batchSize / (ms / 1000),
    inputWaitShare: Math.max(0, Math.min(1, waitMs / ms)),
  };
}

/**
 * The verdict of a report in words, one finding per clause: input-bound or not (real against
 * synthetic rate, input-wait share), what the worker count buys, prefetch depth and staging.
 *
 * @param r The measurements (`verdict` is not read).
 * @returns The verdict.
 *
 * @example
 * ```ts
 * import { doctorVerdict, type DoctorRun } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const run = (numWorkers: number, sps: number, wait: number): DoctorRun => ({
 *   name: `numWorkers ${numWorkers}`, numWorkers, depth: 2, pin: "register",
 *   stepsPerSecond: sps, samplesPerSecond: sps * 128, inputWaitShare: wait,
 * });
 * const sweep = [run(0, 10, 0.6), run(2, 17, 0.38)];
 * const v = doctorVerdict({
 *   device: "cuda:0", batchSize: 128, steps: 30, synthetic: { stepsPerSecond: 40, samplesPerSecond: 5120 },
 *   sweep, best: sweep[1], depth1: run(2, 15, 0.4), pageable: run(2, 12, 0.5),
 *   realOverSynthetic: 17 / 40, inputBound: true, verdict: "",
 * });
 * assert.match(v, /^input-bound: 38% of each step waits for data/);
 * assert.match(v, /numWorkers 0 → 2 gives 1\.70x/);
 * ```
 */
export function doctorVerdict(r: DoctorReport): string {
  const pct = (x: number) => `${Math.round(100 * x)}%`;
  const out: string[] = [];
  const slowest = r.sweep.reduce((a, b) => (b.stepsPerSecond < a.stepsPerSecond ? b : a));
  if (r.inputBound) {
    out.push(
      `input-bound: ${pct(r.best.inputWaitShare)} of each step waits for data at the best ` +
        `setting, and training runs at ${pct(r.realOverSynthetic)} of its rate on a ` +
        `device-resident batch`,
    );
  } else if (r.realOverSynthetic < 0.9) {
    out.push(
      `not input-bound: only ${pct(r.best.inputWaitShare)} of each step waits for data, yet ` +
        `fed steps run at ${pct(r.realOverSynthetic)} of the rate on a device-resident batch: ` +
        "the gap is in the step itself (real batches cost more than the synthetic one, or the " +
        "loader's workers take cores the compute needs)",
    );
  } else {
    out.push(
      `not input-bound: fed by the loader, training runs at ${pct(r.realOverSynthetic)} of its ` +
        `rate on a device-resident batch (${
          pct(r.best.inputWaitShare)
        } of each step waits for data)`,
    );
  }
  if (slowest !== r.best) {
    out.push(
      `numWorkers ${slowest.numWorkers} → ${r.best.numWorkers} gives ` +
        `${(r.best.stepsPerSecond / slowest.stepsPerSecond).toFixed(2)}x ` +
        `(${fmtRate(slowest.stepsPerSecond)} → ${fmtRate(r.best.stepsPerSecond)} steps/s)`,
    );
  }
  const depthGain = r.best.stepsPerSecond / r.depth1.stepsPerSecond;
  out.push(
    `prefetch depth 2 against 1: ${depthGain.toFixed(2)}x; pinned against pageable staging: ` +
      `${(r.best.stepsPerSecond / r.pageable.stepsPerSecond).toFixed(2)}x`,
  );
  if (r.resident) {
    out.push(
      `the data resident on the device: ${fmtRate(r.resident.stepsPerSecond)} steps/s, ` +
        `${(r.resident.stepsPerSecond / r.best.stepsPerSecond).toFixed(2)}x the best streamed run`,
    );
  }
  return out.join("; ") + ".";
}
