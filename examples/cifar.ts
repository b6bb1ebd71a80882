/**
 * Trains a small convolutional network on CIFAR-10 with pinstream: DataLoader workers, fp16
 * compute with fp32 master weights and dynamic loss scaling, random crop + flip.
 *
 * ```sh
 * deno task cifar                                   # download CIFAR-10 (or use --data DIR)
 * deno run -A examples/cifar.ts --data ~/cifar-10-batches-bin --epochs 10 --device cuda
 * deno run -A examples/cifar.ts --synthetic --epochs 1   # generated CIFAR-shaped data
 * ```
 *
 * When the data is neither at --data nor downloadable, it says so and trains on a generated
 * CIFAR-shaped set (learnable class patterns plus noise), so the run still works.
 *
 * @module
 */

import { Device } from "../ffi/device.ts";
import { DataLoader } from "../loader/mod.ts";
import type { Dataset, RingBatch } from "../loader/mod.ts";
import { CIFAR10 } from "../loader/datasets/cifar10.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import {
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  type Module,
  OneCycleLR,
  ReLU,
  Sequential,
  Xoshiro128,
} from "../nn/mod.ts";
import { type EpochReport, parseTrainArgs, runTraining, type TrainArgs } from "./_run.ts";

/** CIFAR-10's per-channel mean (of x / 255 over the training set). */
export const CIFAR_MEAN = [0.4914, 0.4822, 0.4465];
/** CIFAR-10's per-channel standard deviation. */
export const CIFAR_STD = [0.2470, 0.2435, 0.2616];

/**
 * The example's network: three conv-BN-ReLU stages with max pooling, then a linear
 * classifier (160,234 parameters).
 *
 * @param seed Seed of the initial weights.
 * @returns The model (on the host; call `to(device)`).
 * @example
 * ```ts
 * import { cifarModel } from "./cifar.ts";
 * import assert from "node:assert";
 * const n = cifarModel().parameters().reduce((a, p) => a + p.numel, 0);
 * assert.strictEqual(n, 160_234);
 * ```
 */
export function cifarModel(seed = 0): Module {
  const rng = new Xoshiro128(seed);
  const block = (cin: number, cout: number): Module[] => [
    new Conv2d(cin, cout, { kernelSize: 3, padding: 1, bias: false, rng }),
    new BatchNorm2d(cout),
    new ReLU(),
  ];
  return new Sequential([
    ...block(3, 32),
    ...block(32, 32),
    new MaxPool2d(2),
    ...block(32, 64),
    ...block(64, 64),
    new MaxPool2d(2),
    ...block(64, 128),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(128 * 4 * 4, 10, { rng }),
  ]);
}

/**
 * A generated CIFAR-shaped data set: each class is a smooth random colour pattern, each sample
 * that pattern shifted in brightness plus pixel noise. Learnable, so a run on it shows the
 * loss falling.
 *
 * @param n Samples.
 * @param seed Seed (classes use seed 12345 so train and test share patterns).
 * @returns A dataset with `image` u8 [3,32,32] and `label` i32 fields.
 * @example
 * ```ts
 * import { syntheticCifar } from "./cifar.ts";
 * import assert from "node:assert";
 * assert.strictEqual(syntheticCifar(16, 1).length, 16);
 * ```
 */
export function syntheticCifar(n: number, seed: number): TensorDataset {
  const proto = new Xoshiro128(12345);
  const templates: Float32Array[] = [];
  for (let c = 0; c < 10; c++) {
    const t = new Float32Array(3072);
    const f = [1 + 3 * proto.random(), 1 + 3 * proto.random(), 1 + 3 * proto.random()];
    const ph = [6.28 * proto.random(), 6.28 * proto.random(), 6.28 * proto.random()];
    for (let ch = 0; ch < 3; ch++) {
      for (let y = 0; y < 32; y++) {
        for (let x = 0; x < 32; x++) {
          t[ch * 1024 + y * 32 + x] = 128 +
            80 * Math.sin(f[ch] * x / 5 + ph[ch]) * Math.cos(f[(ch + 1) % 3] * y / 5 + ph[ch]);
        }
      }
    }
    templates.push(t);
  }
  const rng = new Xoshiro128(seed);
  const images = new Uint8Array(new SharedArrayBuffer(n * 3072));
  const labels = new Int32Array(new SharedArrayBuffer(n * 4));
  for (let i = 0; i < n; i++) {
    const c = rng.nextU32() % 10;
    labels[i] = c;
    const shift = 40 * (rng.random() - 0.5);
    const t = templates[c];
    for (let j = 0; j < 3072; j++) {
      images[i * 3072 + j] = t[j] + shift + 60 * (rng.random() - 0.5); // clamped by the store
    }
  }
  return new TensorDataset({ image: { data: images, shape: [3, 32, 32] }, label: labels });
}

/**
 * Where the example downloads CIFAR-10 when --data is not given.
 *
 * @returns `$XDG_CACHE_HOME/pinstream/datasets`, else `~/.cache/pinstream/datasets`.
 * @example
 * ```ts
 * import { defaultCifarRoot } from "./cifar.ts";
 * import assert from "node:assert";
 * assert.ok(defaultCifarRoot().endsWith("/pinstream/datasets"));
 * ```
 */
export function defaultCifarRoot(): string {
  const home = Deno.env.get("HOME") ?? ".";
  return `${Deno.env.get("XDG_CACHE_HOME") ?? `${home}/.cache`}/pinstream/datasets`;
}

async function loadData(
  args: TrainArgs,
  synthetic: boolean,
): Promise<{ train: Dataset; test: Dataset; source: string }> {
  if (!synthetic) {
    const root = args.data ?? defaultCifarRoot();
    try {
      if (!args.data) await Deno.mkdir(root, { recursive: true });
      const train = await CIFAR10.load({ root, train: true, download: !args.data });
      const test = await CIFAR10.load({ root, train: false });
      return { train, test, source: `CIFAR-10 from ${root}` };
    } catch (e) {
      console.log(`${(e as Error).message}`);
      console.log("CIFAR-10 is not available: training on a generated CIFAR-shaped set instead.");
    }
  }
  return {
    train: syntheticCifar(args.limit || 10000, args.seed + 1),
    test: syntheticCifar(2000, args.seed + 2),
    source: "generated CIFAR-shaped data",
  };
}

/**
 * Runs the example with parsed options.
 *
 * @param args The options (see --help).
 * @param synthetic Use generated data without trying CIFAR-10.
 * @returns The per-epoch reports.
 * @example One quick epoch on generated data
 * ```ts
 * import { trainCifar } from "./cifar.ts";
 * import { parseTrainArgs } from "./_run.ts";
 * import assert from "node:assert";
 * const args = parseTrainArgs(
 *   ["--device", "cpu", "--epochs", "1", "--limit", "64", "--batch-size", "32", "--workers", "0"],
 *   "cifar.ts",
 *   { quiet: true },
 * );
 * const [report] = await trainCifar(args, true);
 * assert.ok(Number.isFinite(report.trainLoss));
 * ```
 */
export async function trainCifar(args: TrainArgs, synthetic = false): Promise<EpochReport[]> {
  let { train, test, source } = await loadData(args, synthetic);
  if (args.limit > 0 && train instanceof CIFAR10 && args.limit < train.length) {
    train = new TensorDataset({
      image: { data: train.images.subarray(0, args.limit * 3072), shape: [3, 32, 32] },
      label: train.labels.subarray(0, args.limit),
    });
  }
  using device = Device.open(args.device);
  const model = cifarModel(args.seed).to(device);
  const common = {
    batchSize: args.batchSize,
    numWorkers: args.workers,
    seed: args.seed,
    // Slots go back to the loader only once their copy to the device has fired.
    autoRelease: false,
  };
  const workers = args.workers > 0 ? { persistentWorkers: true } : {};
  await using trainLoader = new DataLoader<RingBatch>(train, {
    ...common,
    ...workers,
    shuffle: true,
    augment: { padding: 4, flip: true },
  });
  await using testLoader = new DataLoader<RingBatch>(test, { ...common, ...workers });
  console.log(
    `${source}: ${train.length}/${test.length}, device ${device.kind} (${device.props.name}), ` +
      `batch ${args.batchSize}, ${args.workers} workers, ` +
      `fp16 ${args.fp16 ? "with loss scaling" : "without loss scaling"}`,
  );
  try {
    return await runTraining({
      args,
      device,
      model,
      trainLoader,
      testLoader,
      spec: { mean: CIFAR_MEAN, std: CIFAR_STD, padding: 4 },
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

if (import.meta.main) {
  const synthetic = Deno.args.includes("--synthetic");
  const args = parseTrainArgs(
    Deno.args.filter((a) => a !== "--synthetic"),
    "cifar.ts",
    { epochs: 10, batchSize: 128, lr: 0.1, weightDecay: 5e-4, model: "cnn" },
    `
                      (default: download the official archive into ${defaultCifarRoot()})
  --synthetic         train on generated CIFAR-shaped data without looking for CIFAR-10`,
  );
  await trainCifar(args, synthetic);
}
