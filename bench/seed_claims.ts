/**
 * The seeds' headline claims, measured in one run: the same Fashion-MNIST CNN (train/models.ts)
 * trained on Fashion-MNIST (a generated set of its shapes with `--synthetic`, or where the set
 * is not installed) for `--epochs` epochs under each input configuration, same batch size, optimizer
 * (SGD momentum 0.9, lr 0.05), model seed and sample order.
 *
 * Configurations (`--only` picks one, for timing each as its own process):
 * - `torch-default`: what a plain PyTorch DataLoader does, written with pinstream's parts: no
 *   workers (`numWorkers: 0`), pageable memory, the normalize on the host into a pageable
 *   fp16 batch, a synchronous copy to the device tensors, and a host read of the step's loss
 *   every step (`loss.item()`; here `await trainer.readTrain()`, which waits for the device).
 * - `pinstream`: pinstream's defaults: 2 workers, `pinMemory`, `persistentWorkers`, the
 *   DevicePrefetcher (uint8 bytes to the device, the normalize fused there, copies on a side
 *   stream) and no host read until the epoch ends.
 * - `augment-on`: `pinstream` with every augmentation of the loader on (crop padding 2, flip,
 *   vertical flip, cutout 8, brightness 0.2, contrast 0.2); its peer is `pinstream`
 *   (augmentation off), seed 003's ablation.
 * - `pageable`: `pinstream` with the ring left pageable (`pinMemory: false`, prefetcher
 *   `pin: "none"`); its peer is `pinstream` (pinned), seed 004's comparison.
 *
 * On the CPU backend device memory is host memory and streams run synchronously, so pinning
 * and the side stream change little there; `--device cuda` (bench/gpu_run.sh) measures what
 * they buy on a GPU.
 *
 * Prints a table (seconds per epoch, the ratios) and writes bench/out/seed_claims.json
 * (bench/results/ with --save): date, machine, commit, load averages, command, rows.
 * `--repeat N` runs the configurations N times, interleaved, and keeps each one's fastest
 * total (the machine is shared; the minimum is the least disturbed run).
 *
 * @module
 */

import { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import { DataLoader, type Dataset, type RingBatch } from "../loader/mod.ts";
import { FASHION_MNIST_DEBIAN_ROOT, FashionMNIST } from "../loader/datasets/mnist.ts";
import { Subset } from "../loader/datasets/subset.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import type { AugmentOptions } from "../augment/options.ts";
import { DevicePrefetcher } from "../pipeline/prefetcher.ts";
import { GradScaler, SGD, Xoshiro128 } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { FASHION_MEAN, FASHION_STD, fashionModel } from "../train/models.ts";
import { parseCli } from "../train/cli.ts";
import { assertMeasurable, commitStamp, machine, writeResult } from "./_results.ts";

const CONFIGS = ["torch-default", "pinstream", "augment-on", "pageable"] as const;
type Config = typeof CONFIGS[number];

const CLI = {
  usage: "deno run -A bench/seed_claims.ts [options]",
  summary: "The seeds' claims: a PyTorch-default input pipeline against pinstream's defaults, " +
    "augmentation on against off, pinned against pageable; writes bench/out/seed_claims.json " +
    "(bench/results/ with --save).",
  options: {
    device: { kind: "string", default: "cpu", choices: ["cpu", "cuda"], help: "backend" },
    epochs: { kind: "int", min: 1, default: 2, help: "epochs per configuration" },
    limit: { kind: "int", min: 0, default: 8192, help: "training samples (0: all 60,000)" },
    "batch-size": { kind: "int", min: 1, default: 128, help: "batch size" },
    repeat: {
      kind: "int",
      min: 1,
      default: 1,
      help: "run the configurations N times, interleaved, and keep each one's fastest",
    },
    only: { kind: "string", choices: [...CONFIGS], help: "run this configuration alone" },
    synthetic: { kind: "boolean", help: "generated 28x28 data instead of Fashion-MNIST" },
    save: { kind: "boolean", help: "write to bench/results/ (tracked) instead of bench/out/" },
  },
} as const;

const LR = 0.05;
const MOMENTUM = 0.9;
const WORKERS = 2;
const AUGMENT_ALL: AugmentOptions = {
  padding: 2,
  flip: true,
  vflip: true,
  cutout: 8,
  brightness: 0.2,
  contrast: 0.2,
};

interface Row {
  config: Config;
  /** Seconds of each epoch, the first including worker start-up. */
  epochSeconds: number[];
  seconds: number;
  /** 1-minute load average when the row started. */
  load: number;
  /** Training accuracy over the last epoch. */
  trainAcc: number;
  /** Every repetition's total seconds, when `--repeat` > 1. */
  allSeconds?: number[];
}

type Data = Dataset<unknown>;

/** `n` Fashion-MNIST-shaped samples: seeded bytes, a label from the first byte. */
function synthetic(n: number): Data {
  const rng = new Xoshiro128(7);
  const image = new Uint8Array(n * 784);
  for (let i = 0; i < image.length; i += 4) {
    const v = rng.nextU32();
    image[i] = v;
    image[i + 1] = v >>> 8;
    image[i + 2] = v >>> 16;
    image[i + 3] = v >>> 24;
  }
  const label = Int32Array.from({ length: n }, (_, i) => image[i * 784] % 10);
  return new TensorDataset({ image: { data: image, shape: [1, 28, 28] }, label });
}

function setup(device: Device) {
  const model = fashionModel("cnn", 0).to(device);
  const optimizer = new SGD(model.parameters(), { lr: LR, momentum: MOMENTUM });
  const scaler = new GradScaler(device);
  const trainer = new Trainer(model, { optimizer, scaler });
  return {
    trainer,
    [Symbol.dispose]() {
      trainer.dispose();
      scaler.dispose();
      optimizer.dispose();
      model.dispose();
    },
  };
}

/** No workers, pageable memory, host normalize, synchronous copies, a host read per step. */
async function torchDefault(
  device: Device,
  data: Data,
  epochs: number,
  batch: number,
): Promise<Row> {
  const load = Deno.loadavg()[0];
  using run = setup(device);
  const { trainer } = run;
  await using loader = new DataLoader<RingBatch>(data, {
    batchSize: batch,
    shuffle: true,
    seed: 0,
    numWorkers: 0,
    pinMemory: false,
  });
  const hx = new Float16Array(batch * 784);
  const scale = 1 / (255 * FASHION_STD), bias = -FASHION_MEAN / FASHION_STD;
  const tensors = new Map<number, [Tensor, Tensor]>();
  const epochSeconds: number[] = [];
  let correct = 0, seen = 0;
  try {
    for (let e = 0; e < epochs; e++) {
      correct = seen = 0;
      const t0 = performance.now();
      for await (const b of loader) {
        const n = b.size;
        let t = tensors.get(n);
        if (!t) {
          t = [Tensor.empty(device, [n, 1, 28, 28], "f16"), Tensor.empty(device, [n], "i32")];
          tensors.set(n, t);
        }
        const image = b.fields.image as Uint8Array;
        for (let i = 0; i < n * 784; i++) hx[i] = image[i] * scale + bias;
        t[0].buffer.copyFrom(hx.subarray(0, n * 784));
        t[1].buffer.copyFrom(b.fields.label as Int32Array);
        trainer.trainStep(t[0], t[1]);
        // loss.item(): the host waits for the step.
        const s = await trainer.readTrain();
        correct += s.accuracy * s.samples;
        seen += s.samples;
      }
      epochSeconds.push((performance.now() - t0) / 1000);
    }
  } finally {
    for (const [x, y] of tensors.values()) {
      x.dispose();
      y.dispose();
    }
  }
  const seconds = epochSeconds.reduce((a, b) => a + b, 0);
  return { config: "torch-default", epochSeconds, seconds, load, trainAcc: correct / seen };
}

/** pinstream's defaults, with the augmentation or the pinning of `config`. */
async function pinstream(
  config: Exclude<Config, "torch-default">,
  device: Device,
  data: Data,
  epochs: number,
  batch: number,
): Promise<Row> {
  const load = Deno.loadavg()[0];
  using run = setup(device);
  const { trainer } = run;
  const pinned = config !== "pageable";
  await using loader = new DataLoader<RingBatch>(data, {
    batchSize: batch,
    shuffle: true,
    seed: 0,
    numWorkers: WORKERS,
    pinMemory: pinned,
    persistentWorkers: true,
    autoRelease: false,
    augment: config === "augment-on" ? AUGMENT_ALL : undefined,
  });
  await using feed = new DevicePrefetcher(loader, device, {
    mean: [FASHION_MEAN],
    std: [FASHION_STD],
    persistent: true,
    pin: pinned ? "register" : "none",
  });
  const epochSeconds: number[] = [];
  let acc = 0;
  for (let e = 0; e < epochs; e++) {
    const t0 = performance.now();
    for await (const b of feed) trainer.trainStep(b.images, b.labels);
    acc = (await trainer.readTrain()).accuracy;
    epochSeconds.push((performance.now() - t0) / 1000);
  }
  const seconds = epochSeconds.reduce((a, b) => a + b, 0);
  return { config, epochSeconds, seconds, load, trainAcc: acc };
}

const LABELS: Record<Config, string> = {
  "torch-default": "PyTorch defaults (0 workers, pageable, sync copy, .item() per step)",
  "pinstream": `pinstream defaults (${WORKERS} workers, pinned, prefetcher, persistent)`,
  "augment-on": "pinstream defaults + every augmentation",
  "pageable": "pinstream defaults, pageable ring",
};

/** The ratios the seeds claim: `num` seconds over `den` seconds, when both ran. */
function ratio(rows: Row[], num: Config, den: Config): number | null {
  const a = rows.find((r) => r.config === num), b = rows.find((r) => r.config === den);
  return a && b ? a.seconds / b.seconds : null;
}

/**
 * Runs the benchmark; see the module documentation.
 *
 * @param args Command-line flags.
 */
export async function main(args: string[] = Deno.args): Promise<void> {
  const cli = parseCli(args, CLI);
  let full: Data;
  let dataset = "Fashion-MNIST";
  try {
    if (cli.synthetic) throw new Error("--synthetic");
    full = await FashionMNIST.load({ root: FASHION_MNIST_DEBIAN_ROOT, train: true });
  } catch (e) {
    // Where the set is not installed (a GPU machine generates its data): the same shapes,
    // generated; the timings do not depend on the pixels.
    dataset = `generated 28x28 set (${(e as Error).message})`;
    full = synthetic(60_000);
  }
  const n = Math.min(full.length, cli.limit || full.length);
  const data: Data = n === full.length
    ? full
    : new Subset<unknown>(full, Int32Array.from({ length: n }, (_, i) => i));
  const epochs = cli.epochs!, batch = cli["batch-size"]!;
  using device = Device.open(cli.device as "cpu" | "cuda");
  assertMeasurable(device);
  const configs: Config[] = cli.only ? [cli.only as Config] : [...CONFIGS];
  const loadBefore = Deno.loadavg();
  const runs = new Map<Config, Row[]>(configs.map((c) => [c, []]));
  for (let r = 0; r < cli.repeat!; r++) {
    for (const c of configs) {
      const row = c === "torch-default"
        ? await torchDefault(device, data, epochs, batch)
        : await pinstream(c, device, data, epochs, batch);
      runs.get(c)!.push(row);
    }
  }
  const rows = [...runs.values()].map((rs) => {
    const best = rs.reduce((a, b) => (b.seconds < a.seconds ? b : a));
    return rs.length > 1 ? { ...best, allSeconds: rs.map((r) => r.seconds) } : best;
  });
  const loadAfter = Deno.loadavg();
  console.log(
    `\n${dataset}, CNN, ${n} samples x ${epochs} epochs, batch ${batch}, ${device.kind} ` +
      `backend; load average ${loadBefore.map((x) => x.toFixed(2)).join(" ")} before, ` +
      `${loadAfter.map((x) => x.toFixed(2)).join(" ")} after`,
  );
  const head = epochs > 1 ? Array.from({ length: epochs }, (_, e) => `epoch ${e} s`) : [];
  console.log(
    `| configuration | ${[...head, "total s", "train acc", "load"].join(" | ")} |\n` +
      `|---|${[...head, "", "", ""].map(() => "---:").join("|")}|`,
  );
  for (const r of rows) {
    const cells = epochs > 1 ? r.epochSeconds.map((s) => s.toFixed(2)) : [];
    console.log(
      `| ${LABELS[r.config]} | ${
        [...cells, r.seconds.toFixed(2), `${(100 * r.trainAcc).toFixed(1)}%`, r.load.toFixed(2)]
          .join(" | ")
      } |`,
    );
  }
  const ratios = {
    torchDefaultOverPinstream: ratio(rows, "torch-default", "pinstream"),
    augmentOnOverOff: ratio(rows, "augment-on", "pinstream"),
    pageableOverPinned: ratio(rows, "pageable", "pinstream"),
  };
  const say = (what: string, v: number | null) => {
    if (v !== null) console.log(`${what}: ${v.toFixed(2)}x`);
  };
  say("PyTorch defaults / pinstream defaults, time", ratios.torchDefaultOverPinstream);
  say("every augmentation on / off, time", ratios.augmentOnOverOff);
  say("pageable / pinned, time", ratios.pageableOverPinned);
  const result = {
    benchmark: "seed_claims",
    date: new Date().toISOString(),
    machine: await machine(),
    device: device.props.name,
    loadAverage: { before: loadBefore, after: loadAfter },
    commit: await commitStamp(["loader", "pipeline", "nn", "kernels", "bench/seed_claims.ts"]),
    command: "deno run -A bench/seed_claims.ts " + args.join(" "),
    config: {
      samples: n,
      epochs,
      batchSize: batch,
      lr: LR,
      momentum: MOMENTUM,
      augment: AUGMENT_ALL,
    },
    rows,
    ratios,
  };
  await writeResult("seed_claims", result, cli.save ?? false);
}

if (import.meta.main) await main();
