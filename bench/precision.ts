/**
 * Mixed precision against fp32: training-step time and device memory of the same model, from
 * the same initial weights, in `precision: "fp16"` (fp16 activations, fp32 accumulation and
 * master weights, GradScaler), `precision: "bf16"` (the same in bfloat16, no loss scaling) and
 * `precision: "fp32"` (everything fp32, no loss scaling).
 *
 * Models: the Fashion-MNIST CNN and MLP (examples/fashion_mnist.ts) and the CIFAR-10 network
 * (examples/cifar.ts, with batch norm). Batches are device-resident random tensors (made by
 * randn on the device, so only the step is timed: no input pipeline), labels random.
 * Per row: milliseconds per step (the best of `--repeat` timed runs of `--steps` steps, after
 * warm-up steps), samples/s, the bytes the model holds after `to()` (weights, fp16 copies,
 * gradients) plus the optimizer's momentum ("state"), and the peak device memory of a training
 * step (Device.maxMemoryAllocated: every tensor pinstream allocated, activations included;
 * the input batch is not counted).
 *
 * Prints a table and writes bench/out/precision.json (bench/results/ with --save) with the
 * fp32 / fp16 and bf16 / fp16 ratios per model. `--device cpu|cuda|auto` (default auto: the GPU when there is
 * one). The CUDA emulator measures nothing and is refused.
 *
 * @module
 */

import { Device, type DeviceKind } from "../ffi/device.ts";
import { full, randn } from "../ops/fill.ts";
import { GradScaler, type Module, type Precision, SGD } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { cifarModel, fashionModel } from "../train/models.ts";
import { assertMeasurable, commitStamp, machine, writeResult } from "./_results.ts";
import { parseCli } from "../train/cli.ts";

const CLI = {
  usage: "deno run -A bench/precision.ts [options]",
  summary:
    "Training-step time and device memory in fp16 and bf16 (mixed) against fp32, same model " +
    "and weights; writes bench/out/precision.json (bench/results/ with --save).",
  options: {
    save: { kind: "boolean", help: "write to bench/results/ (tracked) instead of bench/out/" },
    device: { kind: "string", choices: ["auto", "cuda", "cpu"], default: "auto", help: "backend" },
    steps: { kind: "int", min: 1, default: 20, help: "timed steps per repeat" },
    warmup: { kind: "int", min: 0, default: 3, help: "untimed steps first" },
    repeat: { kind: "int", min: 1, default: 3, help: "timed repeats; the fastest is kept" },
    "batch-size": { kind: "int", min: 1, default: 128, help: "batch size" },
    model: {
      kind: "string",
      choices: ["all", "cnn", "mlp", "cifar"],
      default: "all",
      help: "which model",
    },
  },
} as const;

interface ModelCase {
  name: string;
  build: () => Module;
  input: number[];
  classes: number;
}

const MODELS: Record<string, ModelCase> = {
  cnn: {
    name: "Fashion-MNIST CNN",
    build: () => fashionModel("cnn", 0),
    input: [1, 28, 28],
    classes: 10,
  },
  mlp: {
    name: "Fashion-MNIST MLP",
    build: () => fashionModel("mlp", 0),
    input: [1, 28, 28],
    classes: 10,
  },
  cifar: { name: "CIFAR-10 net", build: () => cifarModel(0), input: [3, 32, 32], classes: 10 },
};

/** One measurement. */
export interface PrecisionRow {
  name: string;
  model: string;
  precision: Precision;
  device: string;
  batchSize: number;
  /** Milliseconds per training step (the fastest repeat). */
  msPerStep: number;
  /** Every repeat's milliseconds per step. */
  allMsPerStep: number[];
  samplesPerSecond: number;
  /** Bytes of the weights (with fp16 copies), gradients and momentum, before any step. */
  stateBytes: number;
  /**
   * Peak bytes allocated during the timed steps, the input batch excluded: the state plus
   * every activation, activation gradient and workspace the layers keep.
   */
  peakBytes: number;
  /** 1-minute load average when the row started: the machine may be shared. */
  load: number;
}

async function measure(
  device: Device,
  key: string,
  precision: Precision,
  batch: number,
  steps: number,
  warmup: number,
  repeat: number,
): Promise<PrecisionRow> {
  const c = MODELS[key];
  const load = Deno.loadavg()[0];
  const base = device.memoryAllocated();
  const model = c.build().to(device, { precision });
  const optimizer = new SGD(model.parameters(), { lr: 0.01, momentum: 0.9 });
  // Weights (fp32 masters, fp16 copies), gradients and the optimizer's momentum.
  const stateBytes = device.memoryAllocated() - base;
  const scaler = new GradScaler(device, { enabled: precision === "fp16" });
  const trainer = new Trainer(model, { optimizer, scaler });
  const dtype = precision === "fp16" ? "f16" : precision === "bf16" ? "bf16" : "f32";
  const x = randn(device, [batch, ...c.input], { seed: 1, dtype });
  const labels = full(device, [batch], 0, { dtype: "i32" });
  const inputBytes = device.memoryAllocated() - base - stateBytes;
  try {
    // Labels vary (the loss is not trivially zero): random class per sample, on the host once.
    const l = new Int32Array(batch).map((_, i) => (i * 7919) % c.classes);
    labels.buffer.copyFrom(l);
    for (let i = 0; i < warmup; i++) trainer.trainStep(x, labels);
    await device.synchronize();
    device.resetPeakMemoryStats();
    const all: number[] = [];
    for (let r = 0; r < repeat; r++) {
      const t0 = performance.now();
      for (let i = 0; i < steps; i++) trainer.trainStep(x, labels);
      await device.synchronize();
      all.push((performance.now() - t0) / steps);
    }
    const ms = Math.min(...all);
    return {
      name: `${c.name}, ${precision}`,
      model: key,
      precision,
      device: `${device.kind} (${device.props.name})`,
      batchSize: batch,
      msPerStep: ms,
      allMsPerStep: all,
      samplesPerSecond: batch / (ms / 1000),
      stateBytes,
      peakBytes: device.maxMemoryAllocated() - base - inputBytes,
      load,
    };
  } finally {
    x.dispose();
    labels.dispose();
    trainer.dispose();
    scaler.dispose();
    optimizer.dispose();
    model.dispose();
  }
}

/**
 * Runs the benchmark.
 *
 * @param args Command-line arguments.
 * @returns The rows.
 */
export async function main(args: string[]): Promise<PrecisionRow[]> {
  const cli = parseCli(args, CLI);
  const o = cli;
  using device = Device.open(o.device as DeviceKind);
  assertMeasurable(device);
  const keys: string[] = o.model === "all" ? Object.keys(MODELS) : [o.model!];
  const rows: PrecisionRow[] = [];
  const ratios: Record<
    string,
    { time: number; peakMemory: number; stateMemory: number; bf16Time: number; bf16Peak: number }
  > = {};
  const mb = (b: number) => (b / 2 ** 20).toFixed(1).padStart(8);
  console.log(
    `${"model".padEnd(30)} ${"ms/step".padStart(9)} ${"samples/s".padStart(10)} ` +
      `${"state MiB".padStart(9)} ${"peak MiB".padStart(8)}  (${device.kind}, batch ${
        o["batch-size"]
      })`,
  );
  for (const key of keys) {
    const pair: PrecisionRow[] = [];
    for (const precision of ["fp16", "bf16", "fp32"] as const) {
      const row = await measure(
        device,
        key,
        precision,
        o["batch-size"]!,
        o.steps!,
        o.warmup!,
        o.repeat!,
      );
      pair.push(row);
      rows.push(row);
      console.log(
        `${row.name.padEnd(30)} ${row.msPerStep.toFixed(2).padStart(9)} ` +
          `${Math.round(row.samplesPerSecond).toLocaleString("en-US").padStart(10)} ` +
          `${mb(row.stateBytes)} ${mb(row.peakBytes)}  load ${row.load.toFixed(2)}`,
      );
    }
    const [h, b, f] = pair;
    ratios[key] = {
      time: f.msPerStep / h.msPerStep,
      peakMemory: f.peakBytes / h.peakBytes,
      stateMemory: f.stateBytes / h.stateBytes,
      bf16Time: b.msPerStep / h.msPerStep,
      bf16Peak: b.peakBytes / h.peakBytes,
    };
    console.log(
      `  fp32 / fp16: time ${ratios[key].time.toFixed(2)}x, peak memory ${
        ratios[key].peakMemory.toFixed(2)
      }x, state ${ratios[key].stateMemory.toFixed(2)}x; bf16 / fp16: time ${
        ratios[key].bf16Time.toFixed(2)
      }x, peak memory ${ratios[key].bf16Peak.toFixed(2)}x`,
    );
  }
  await writeResult("precision", {
    benchmark: "precision",
    date: new Date().toISOString(),
    machine: await machine(),
    commit: await commitStamp(),
    loadavg: Deno.loadavg(),
    device: `${device.kind} (${device.props.name})`,
    rows,
    ratios,
  }, o.save === true);
  return rows;
}

if (import.meta.main) await main(Deno.args);
