/**
 * Trains a small convolutional net on a folder of image files (JPEG or PNG, one subfolder
 * per class), decoded by the loader's workers straight into the staging ring at a fixed size.
 *
 * ```sh
 * deno task imagefolder                         # a generated folder of JPEGs (it says so)
 * deno task imagefolder --data ~/imagenette     # train/ and val/ class folders, or classes only
 * deno run -A examples/imagefolder.ts --help
 * ```
 *
 * Without --data it writes a small four-class set of JPEGs (circles, squares, horizontal and
 * vertical stripes on noise, random sizes around 128x96) into the cache directory once, with
 * libjpeg-turbo, and trains on that.
 *
 * @module
 */

import { join } from "node:path";
import { encodeJpeg } from "../decode/mod.ts";
import { ImageFolder } from "../loader/datasets/image_folder.ts";
import { Subset } from "../loader/datasets/subset.ts";
import type { Dataset } from "../loader/dataset.ts";
import {
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  type Module,
  ReLU,
  Sequential,
  Xoshiro128,
} from "../nn/mod.ts";
import {
  type EpochReport,
  parseTrainArgs,
  type TrainArgs,
  type TrainDefaults,
  trainImages,
} from "../train/fit.ts";
import { CliError, runMain, UsageError } from "../train/cli.ts";

/** The generated set's classes. */
export const DEMO_CLASSES = ["circle", "hstripes", "square", "vstripes"] as const;

/**
 * Where the generated set goes when --data is not given.
 *
 * @returns `$XDG_CACHE_HOME/pinstream/datasets/imagefolder-demo`, else under `~/.cache`.
 * @example
 * ```ts
 * import { defaultDemoRoot } from "./imagefolder.ts";
 * import assert from "node:assert";
 * assert.ok(defaultDemoRoot().endsWith("/pinstream/datasets/imagefolder-demo"));
 * ```
 */
export function defaultDemoRoot(): string {
  const home = Deno.env.get("HOME") ?? ".";
  return `${
    Deno.env.get("XDG_CACHE_HOME") ?? `${home}/.cache`
  }/pinstream/datasets/imagefolder-demo`;
}

/** A seeded uniform [0, 1) stream (mulberry32). */
function stream(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * One picture of class `k` of {@linkcode DEMO_CLASSES}: a shape or stripes in one colour on
 * a noisy background of another, at a random size.
 */
function picture(
  k: number,
  rnd: () => number,
): { data: Uint8Array; height: number; width: number } {
  const width = 96 + Math.floor(rnd() * 64), height = 72 + Math.floor(rnd() * 48);
  const fg = [0, 1, 2].map(() => 60 + Math.floor(rnd() * 196));
  const bg = fg.map((v) => (v + 90 + Math.floor(rnd() * 60)) % 256);
  const cx = width * (0.3 + 0.4 * rnd()), cy = height * (0.3 + 0.4 * rnd());
  const r = Math.min(width, height) * (0.2 + 0.15 * rnd());
  const period = 8 + Math.floor(rnd() * 10);
  const data = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const inside = k === 0
        ? (x - cx) ** 2 + (y - cy) ** 2 < r * r
        : k === 2
        ? Math.abs(x - cx) < r && Math.abs(y - cy) < r
        : k === 1
        ? Math.floor(y / period) % 2 === 0
        : Math.floor(x / period) % 2 === 0;
      const c = inside ? fg : bg;
      const o = (y * width + x) * 3;
      for (let ch = 0; ch < 3; ch++) {
        data[o + ch] = Math.max(0, Math.min(255, c[ch] + Math.round((rnd() - 0.5) * 40)));
      }
    }
  }
  return { data, height, width };
}

/**
 * Writes the generated set (train/ and val/ folders of JPEGs, quality 90) unless it is there.
 *
 * @param root where
 * @param perClass training images per class (a fifth as many for validation)
 * @returns the number of files written (0 when the set was there)
 * @example
 * ```ts
 * import { makeDemoFolder } from "./imagefolder.ts";
 * import assert from "node:assert";
 * const root = await Deno.makeTempDir();
 * assert.strictEqual(await makeDemoFolder(root, 5), 4 * 5 + 4 * 1);
 * assert.strictEqual(await makeDemoFolder(root, 5), 0);
 * await Deno.remove(root, { recursive: true });
 * ```
 */
export async function makeDemoFolder(root: string, perClass = 300): Promise<number> {
  const done = join(root, "complete.json");
  try {
    const info = JSON.parse(await Deno.readTextFile(done));
    if (info.perClass === perClass) return 0;
  } catch {
    // Not made yet (or made with other counts): make it.
  }
  let n = 0;
  for (
    const [split, count, seed] of [["train", perClass, 1], [
      "val",
      Math.max(1, perClass / 5),
      2,
    ]] as const
  ) {
    for (const [k, name] of DEMO_CLASSES.entries()) {
      const dir = join(root, split, name);
      await Deno.mkdir(dir, { recursive: true });
      const rnd = stream(seed * 1000 + k);
      for (let i = 0; i < count; i++) {
        const p = picture(k, rnd);
        await Deno.writeFile(join(dir, `${i}.jpg`), encodeJpeg({ ...p, channels: 3 }, 90));
        n++;
      }
    }
  }
  await Deno.writeTextFile(done, JSON.stringify({ perClass }));
  return n;
}

/**
 * The model: three conv3x3-ReLU-maxpool stages (3->16->32->64 channels) and a linear layer,
 * for `size` x `size` inputs.
 *
 * @param classes output classes
 * @param size input side (a multiple of 8)
 * @param seed seed of the initial weights
 * @returns the model (on the host)
 * @example
 * ```ts
 * import { imageFolderModel } from "./imagefolder.ts";
 * import assert from "node:assert";
 * const m = imageFolderModel(4, 64);
 * assert.deepStrictEqual(m.namedParameters().at(-2)![1].shape, [4, 4096]);
 * ```
 */
export function imageFolderModel(classes: number, size: number, seed = 0): Module {
  const rng = new Xoshiro128(seed);
  return new Sequential([
    new Conv2d(3, 16, { kernelSize: 3, padding: 1, rng }),
    new ReLU(),
    new MaxPool2d(2),
    new Conv2d(16, 32, { kernelSize: 3, padding: 1, rng }),
    new ReLU(),
    new MaxPool2d(2),
    new Conv2d(32, 64, { kernelSize: 3, padding: 1, rng }),
    new ReLU(),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(64 * (size / 8) ** 2, classes, { rng }),
  ]);
}

/** Every `len / limit`-th sample (so every class stays), or the set itself. */
function spread(set: ImageFolder, limit: number): Dataset {
  if (limit <= 0 || limit >= set.length) return set;
  const step = set.length / limit;
  return new Subset(set, Array.from({ length: limit }, (_, i) => Math.floor(i * step)));
}

/**
 * Runs the example with parsed options.
 *
 * @param args the options (see --help)
 * @returns the per-epoch reports
 * @throws {CliError} when the folder cannot be read (the message names it)
 * @example Four quick epochs on a small generated set, on the CPU (chance is 25%)
 * ```ts
 * import { makeDemoFolder, parseImageFolderArgs, trainImageFolder } from "./imagefolder.ts";
 * import assert from "node:assert";
 * const root = await Deno.makeTempDir();
 * await makeDemoFolder(root, 60);
 * const args = parseImageFolderArgs(
 *   ["--data", root, "--device", "cpu", "--epochs", "4", "--batch-size", "32", "--size", "32"],
 *   { quiet: true },
 * );
 * const reports = await trainImageFolder(args);
 * assert.strictEqual(reports.length, 4);
 * assert.ok(reports[3].testAcc > 0.5, `test accuracy ${reports[3].testAcc}`);
 * await Deno.remove(root, { recursive: true });
 * ```
 */
export async function trainImageFolder(args: TrainArgs): Promise<EpochReport[]> {
  const size = Number(args.extra?.size ?? 64);
  let root = args.data;
  let note: string;
  if (root === undefined) {
    root = defaultDemoRoot();
    const written = await makeDemoFolder(root);
    note = `no --data given: training on a generated folder of JPEGs (${
      DEMO_CLASSES.join(", ")
    }) at ${root}${written ? ` (${written} files written now)` : ""}`;
  } else note = `folder ${root}`;
  const options = { size: [size, size] as [number, number], verbose: !args.quiet };
  let train: ImageFolder, val: Dataset;
  try {
    const hasSplits = ["train", "val"].every((d) => {
      try {
        return Deno.statSync(join(root!, d)).isDirectory;
      } catch {
        return false;
      }
    });
    if (hasSplits) {
      train = new ImageFolder(join(root, "train"), options);
      // The decoder line once: from the training set's loader.
      val = new ImageFolder(join(root, "val"), { ...options, verbose: false });
    } else {
      // Classes only: every tenth image is held out.
      const all = new ImageFolder(root, options);
      const idx = Array.from({ length: all.length }, (_, i) => i);
      train = all;
      val = new Subset(all, idx.filter((i) => i % 10 === 9));
      const rest = new Subset(all, idx.filter((i) => i % 10 !== 9));
      return await run(args, all, rest, val, size, note);
    }
  } catch (e) {
    throw new CliError((e as Error).message, { cause: e });
  }
  return await run(args, train, spread(train, args.limit), val, size, note);
}

async function run(
  args: TrainArgs,
  folder: ImageFolder,
  train: Dataset,
  val: Dataset,
  size: number,
  note: string,
): Promise<EpochReport[]> {
  if (!args.quiet) console.log(note);
  return await trainImages(args, {
    train,
    test: val,
    model: () => imageFolderModel(folder.classes.length, size, args.seed),
    // Mid-grey and a wide spread: a folder's own statistics are not known in advance.
    mean: [0.5, 0.5, 0.5],
    std: [0.25, 0.25, 0.25],
    augment: args.augment ?? { flip: true },
    layout: "nhwc",
    intro:
      `${folder.classes.length} classes, ${train.length}/${val.length} images at ${size}x${size}`,
    dataNote: note,
  });
}

/**
 * Parses the example's command line: the shared options and --size (the decode size).
 *
 * @param argv command-line arguments
 * @param defaults defaults to change (e.g. `{ quiet: true }`)
 * @returns the options; prints the help and exits 0 on --help
 * @throws {UsageError} for an unknown option or a bad value
 */
export function parseImageFolderArgs(argv: string[], defaults: TrainDefaults = {}): TrainArgs {
  const args = parseTrainArgs(argv, "imagefolder.ts", {
    model: "cnn",
    epochs: 4,
    batchSize: 64,
    lr: 0.05,
    ...defaults,
  }, {
    summary: "Trains a small CNN on a folder of JPEG/PNG files, one subfolder per class.",
    dataHelp: "folder with train/ and val/ class folders, or class folders only\n" +
      "(every tenth image held out); default: a generated set of JPEGs",
    options: {
      size: { kind: "int", min: 8, help: "decode size (square, a multiple of 8)", default: 64 },
    },
  });
  const size = Number(args.extra?.size ?? 64);
  if (size % 8 !== 0) throw new UsageError(`option --size should be a multiple of 8, got ${size}`);
  return args;
}

if (import.meta.main) await runMain(() => trainImageFolder(parseImageFolderArgs(Deno.args)));
