/**
 * Trains a small convolutional network on CIFAR-10 with pinstream: DataLoader workers, fp16
 * compute with fp32 master weights and dynamic loss scaling, random crop + flip on the device
 * (more with --cutout, --vflip, --brightness, --contrast, --saturation, --hue; none with
 * --no-augment).
 *
 * ```sh
 * deno task cifar                                   # download CIFAR-10 (or use --data DIR)
 * deno run -A examples/cifar.ts --data ~/cifar-10-batches-bin --epochs 10 --device cuda
 * deno run -A examples/cifar.ts --synthetic          # the generated stand-in, on purpose
 * deno run -A examples/cifar.ts --cutout 12 --brightness 0.2 --contrast 0.2 --hue 0.05
 * deno run -A examples/cifar.ts --no-augment        # no crop, flip or anything else
 * ```
 *
 * Without --data it downloads the official archive into the cache directory. When that fails
 * (offline), it says so and trains on a generated stand-in instead: ten classes of drawn
 * shapes and textures (examples/_shapes.ts), NOT CIFAR-10, sized so a CPU run takes about a
 * minute; its accuracy says nothing about CIFAR-10. A --data directory without the CIFAR-10
 * files is an error.
 *
 * @module
 */

import type { AugmentOptions } from "../augment/options.ts";
import type { Dataset } from "../loader/mod.ts";
import { CIFAR10, CIFAR10_URL } from "../loader/datasets/cifar10.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { CIFAR_LOGIT_SCALE, CIFAR_MEAN, CIFAR_STD, cifarModel } from "../train/models.ts";
import {
  type EpochReport,
  firstSamples,
  parseTrainArgs,
  type TrainArgs,
  trainImages,
} from "../train/fit.ts";
import { CliError, runMain } from "../train/cli.ts";
import { generateShapes, SHAPE_CLASSES } from "./_shapes.ts";

/** The training augmentation unless the command line says otherwise: crop 4 + flip. */
export const CIFAR_AUGMENT: Readonly<AugmentOptions> = { padding: 4, flip: true };

/** Samples of the generated stand-in's training and test sets (see {@linkcode trainCifar}). */
export const SHAPES_TRAIN = 4000;
/** See {@linkcode SHAPES_TRAIN}. */
export const SHAPES_TEST = 1000;
/**
 * What the generated stand-in changes unless given on the command line: sized for about a
 * minute on two CPU cores (4 epochs of batch 64). The peak learning rate is CIFAR-10's 0.1:
 * with the model's logit scale it trains stably from 0.02 to 0.2 in this short schedule
 * (docs/recipe.md).
 */
export const SHAPES_DEFAULTS = { epochs: 4, batchSize: 64, lr: 0.1 } as const;

/**
 * The generated stand-in for CIFAR-10 as datasets (see examples/_shapes.ts): ten classes of
 * drawn shapes, 32x32x3 uint8 in CIFAR's layout, deterministic from the seed.
 *
 * @param n Samples.
 * @param seed Seed (train and test use different seeds; the classes are the same).
 * @returns A dataset with `image` u8 [3,32,32] and `label` i32 fields.
 * @example
 * ```ts
 * import { shapesDataset } from "./cifar.ts";
 * import assert from "node:assert";
 * assert.strictEqual(shapesDataset(16, 1).length, 16);
 * ```
 */
export function shapesDataset(n: number, seed: number): TensorDataset {
  const { images, labels } = generateShapes(n, seed);
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

/**
 * Where the example saves its checkpoint when --checkpoint is not given.
 *
 * @param data "cifar10" or "shapes" (the generated stand-in): separate files, so a run on
 *   one never resumes from the other.
 * @returns `<cache>/pinstream/checkpoints/cifar-<data>.safetensors`.
 */
export function defaultCheckpoint(data: "cifar10" | "shapes"): string {
  const home = Deno.env.get("HOME") ?? ".";
  const cache = Deno.env.get("XDG_CACHE_HOME") ?? `${home}/.cache`;
  return `${cache}/pinstream/checkpoints/cifar-${data}.safetensors`;
}

/** The data a run trains on. */
interface RunData {
  train: Dataset;
  test: Dataset;
  /** What the data is, for the first line and the summary. */
  source: string;
  /** Whether it is the generated stand-in. */
  generated: boolean;
}

/** Reads CIFAR-10 from --data; a path that does not exist or holds no CIFAR-10 is an error. */
async function loadFromDir(dir: string): Promise<RunData> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(dir);
  } catch (e) {
    const why = e instanceof Deno.errors.NotFound ? "no such directory" : (e as Error).message;
    throw new CliError(`Cannot load CIFAR-10 from --data ${dir}: ${why}`);
  }
  if (!info.isDirectory) {
    throw new CliError(`Cannot load CIFAR-10 from --data ${dir}: not a directory`);
  }
  try {
    const train = await CIFAR10.load({ root: dir, train: true });
    const test = await CIFAR10.load({ root: dir, train: false });
    return { train, test, source: `CIFAR-10 from ${dir}`, generated: false };
  } catch (e) {
    const msg = (e as Error).message;
    throw new CliError(
      msg.includes("not found in")
        ? `Cannot load CIFAR-10 from --data ${dir}: no CIFAR-10 files there (looked for ` +
          `data_batch_1.bin and test_batch.bin in ${dir} and ${dir}/cifar-10-batches-bin; ` +
          `extract ${CIFAR10_URL} there, or leave out --data to download it)`
        : `Cannot load CIFAR-10 from --data ${dir}: ${msg}`,
    );
  }
}

function generatedData(args: TrainArgs): RunData {
  const t0 = performance.now();
  const n = args.limit || SHAPES_TRAIN;
  const train = shapesDataset(n, args.seed + 1);
  const test = shapesDataset(SHAPES_TEST, args.seed + 2);
  const ms = performance.now() - t0;
  console.log(
    `generated ${n} + ${SHAPES_TEST} images of 10 drawn shape classes (${
      SHAPE_CLASSES.join(", ")
    })` +
      ` in ${(ms / 1000).toFixed(1)} s`,
  );
  return { train, test, source: "the generated shapes set (NOT CIFAR-10)", generated: true };
}

async function loadData(args: TrainArgs, synthetic: boolean): Promise<RunData> {
  if (synthetic) return generatedData(args);
  if (args.data !== undefined) return await loadFromDir(args.data);
  const root = defaultCifarRoot();
  try {
    await Deno.mkdir(root, { recursive: true });
    const train = await CIFAR10.load({ root, train: true, download: true });
    const test = await CIFAR10.load({ root, train: false });
    return { train, test, source: `CIFAR-10 from ${root}`, generated: false };
  } catch (e) {
    console.log(`${(e as Error).message}`);
    console.log(
      "CIFAR-10 is not available, so this run trains on a GENERATED stand-in: ten classes of " +
        "drawn shapes, not CIFAR-10. Its accuracy says nothing about CIFAR-10; it shows the " +
        "pipeline and the network learning. Pass --data DIR with the extracted CIFAR-10 to " +
        "train on the real thing.",
    );
    return generatedData(args);
  }
}

/** Options of {@linkcode trainCifar}. */
export interface TrainCifarOptions {
  /** Train on the generated stand-in without looking for CIFAR-10 (default false). */
  synthetic?: boolean;
  /**
   * Save a checkpoint to {@linkcode defaultCheckpoint} when `args.checkpoint` is not set
   * (default false; the command line sets it).
   */
  checkpointByDefault?: boolean;
  /** The factor on the model's logits (default {@linkcode CIFAR_LOGIT_SCALE}; 1: none). */
  logitScale?: number;
}

/**
 * Runs the example with parsed options. On the generated stand-in, the options not given
 * default to {@linkcode SHAPES_DEFAULTS} and the training set has {@linkcode SHAPES_TRAIN}
 * samples (--limit N sets it), sized for about a minute on two CPU cores.
 *
 * @param args The options (see --help).
 * @param options synthetic, checkpointByDefault
 * @returns The per-epoch reports.
 * @throws {CliError} For a --data path that does not exist or holds no CIFAR-10.
 * @example One quick epoch on generated data
 * ```ts
 * import { trainCifar } from "./cifar.ts";
 * import { parseTrainArgs } from "../train/fit.ts";
 * import assert from "node:assert";
 * const args = parseTrainArgs(
 *   ["--device", "cpu", "--epochs", "1", "--limit", "64", "--batch-size", "32", "--workers", "0"],
 *   "cifar.ts",
 *   { quiet: true },
 * );
 * const [report] = await trainCifar(args, { synthetic: true });
 * assert.ok(Number.isFinite(report.trainLoss));
 * ```
 */
export async function trainCifar(
  args: TrainArgs,
  options: TrainCifarOptions = {},
): Promise<EpochReport[]> {
  const data = await loadData(args, options.synthetic ?? false);
  let { train } = data;
  const { test, source, generated } = data;
  if (generated) {
    const given = args.given ?? new Set();
    args = {
      ...args,
      epochs: given.has("epochs") ? args.epochs : SHAPES_DEFAULTS.epochs,
      batchSize: given.has("batch-size") ? args.batchSize : SHAPES_DEFAULTS.batchSize,
      lr: given.has("lr") ? args.lr : SHAPES_DEFAULTS.lr,
    };
  }
  if (options.checkpointByDefault && args.checkpoint === undefined) {
    args = { ...args, checkpoint: defaultCheckpoint(generated ? "shapes" : "cifar10") };
  }
  if (args.checkpoint) {
    const dir = args.checkpoint.replace(/[\\/][^\\/]*$/, "");
    if (dir !== args.checkpoint) await Deno.mkdir(dir, { recursive: true });
  }
  train = firstSamples(train, args.limit);
  const augment = args.augment === undefined ? CIFAR_AUGMENT : args.augment;
  return await trainImages(args, {
    train,
    test,
    model: () => cifarModel(args.seed, { logitScale: options.logitScale }),
    mean: CIFAR_MEAN,
    std: CIFAR_STD,
    augment,
    intro: `training on ${source}: ${train.length} train / ${test.length} test samples, ` +
      `${args.epochs} epochs`,
    dataNote: source,
  });
}

if (import.meta.main) {
  await runMain(async () => {
    const args = parseTrainArgs(
      Deno.args,
      "cifar.ts",
      {
        epochs: 10,
        batchSize: 128,
        lr: 0.1,
        weightDecay: 5e-4,
        model: "cnn",
        augment: CIFAR_AUGMENT,
      },
      {
        summary: "Trains a small CNN on CIFAR-10 (conv-BN-ReLU x5, max pooling, linear; " +
          "160,234 parameters).",
        dataHelp: "directory holding the extracted CIFAR-10 (cifar-10-batches-bin/ or\n" +
          "its .bin files); an error if they are not there (default: download\n" +
          "the official archive into $XDG_CACHE_HOME/pinstream/datasets or\n" +
          "~/.cache/pinstream/datasets, and without network fall back to the\n" +
          "generated shapes set, saying so)",
        checkpointHelp: "save weights (safetensors) + training state after every epoch\n" +
          "(default ~/.cache/pinstream/checkpoints/cifar-cifar10.safetensors,\n" +
          "or cifar-shapes.safetensors on the generated set)",
        options: {
          "logit-scale": {
            kind: "number",
            min: 0,
            exclusiveMin: true,
            help: "factor on the classifier's logits; 1: none (see docs/recipe.md)",
            default: CIFAR_LOGIT_SCALE,
          },
          synthetic: {
            kind: "boolean",
            help: `train on the generated shapes set (NOT CIFAR-10) without looking for\n` +
              `CIFAR-10: ${SHAPES_TRAIN} train / ${SHAPES_TEST} test samples, ` +
              `${SHAPES_DEFAULTS.epochs} epochs,\nbatch ${SHAPES_DEFAULTS.batchSize}, ` +
              `lr ${SHAPES_DEFAULTS.lr} unless given`,
          },
        },
      },
    );
    await trainCifar(args, {
      synthetic: args.extra?.synthetic === true,
      logitScale: args.extra?.["logit-scale"] as number,
      checkpointByDefault: true,
    });
  });
}
