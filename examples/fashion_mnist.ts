/**
 * Trains an MLP (784-256-10) or a small CNN on Fashion-MNIST with pinstream.
 *
 * ```sh
 * deno task fashion                       # CNN, 3 epochs, /usr/share/datasets/fashion-mnist
 * deno run -A examples/fashion_mnist.ts --model mlp   # MLP 784-256-10, 5 epochs
 * deno run -A examples/fashion_mnist.ts --help
 * ```
 *
 * @module
 */

import { FASHION_MNIST_DEBIAN_ROOT, FashionMNIST } from "../loader/datasets/mnist.ts";
import { FASHION_MEAN, FASHION_STD, fashionModel } from "../train/models.ts";
import {
  type EpochReport,
  firstSamples,
  parseTrainArgs,
  type TrainArgs,
  type TrainDefaults,
  trainImages,
} from "../train/fit.ts";
import { CliError, runMain } from "../train/cli.ts";

/**
 * Runs the example with parsed options.
 *
 * @param args The options (see --help).
 * @returns The per-epoch reports.
 * @throws {CliError} When the data directory lacks Fashion-MNIST (the message names it).
 * @example One quick epoch on 2,048 samples (when Fashion-MNIST is installed)
 * ```ts
 * import { parseFashionArgs, trainFashion } from "./fashion_mnist.ts";
 * import assert from "node:assert";
 * const args = parseFashionArgs(
 *   ["--model", "mlp", "--device", "cpu", "--epochs", "1", "--limit", "2048", "--workers", "0"],
 *   { quiet: true },
 * );
 * const reports = await trainFashion(args).catch((e: Error) => {
 *   assert.match(e.message, /Fashion-MNIST/); // the data is not installed
 *   return [];
 * });
 * for (const r of reports) assert.ok(r.testAcc > 0.3, `test accuracy ${r.testAcc}`);
 * ```
 */
export async function trainFashion(args: TrainArgs): Promise<EpochReport[]> {
  const root = args.data ?? FASHION_MNIST_DEBIAN_ROOT;
  // A missing or broken data directory is the user's to fix: one line naming the path.
  const [train, test] = await Promise.all([
    FashionMNIST.load({ root, train: true }),
    FashionMNIST.load({ root, train: false }),
  ]).catch((e: Error) => {
    throw new CliError(e.message, { cause: e });
  });
  const trainSet = firstSamples(train, args.limit);
  return await trainImages(args, {
    train: trainSet,
    test,
    model: () => fashionModel(args.model, args.seed),
    mean: [FASHION_MEAN],
    std: [FASHION_STD],
    // No augmentation by default; the command line's flags add some (--cutout 6, --flip, ...).
    augment: args.augment,
    intro: `Fashion-MNIST ${trainSet.length}/${test.length} from ${root}, model ${args.model}`,
    dataNote: `Fashion-MNIST from ${root}`,
  });
}

/**
 * Parses the example's command line: the shared options with Fashion-MNIST's defaults and
 * --model mlp|cnn (5 and 3 epochs by default, one-cycle schedule peaking at lr 0.1).
 *
 * @param argv Command-line arguments.
 * @param defaults Defaults to change (e.g. `{ quiet: true }`).
 * @returns The options; prints the help and exits 0 on --help.
 * @throws {UsageError} For an unknown option or a bad value.
 */
export function parseFashionArgs(argv: string[], defaults: TrainDefaults = {}): TrainArgs {
  const args = parseTrainArgs(argv, "fashion_mnist.ts", {
    data: FASHION_MNIST_DEBIAN_ROOT,
    model: "cnn",
    epochs: 3,
    batchSize: 128,
    lr: 0.1,
    ...defaults,
  }, {
    summary: "Trains an MLP or a small CNN on Fashion-MNIST (IDX files, .gz or not).",
    dataHelp: "directory holding the Fashion-MNIST IDX files",
    models: {
      help: "mlp (784-256-10, 5 epochs by default) or cnn (3 epochs by default)",
      choices: ["mlp", "cnn"],
    },
  });
  // Per-model defaults: the runs the issue asks for (MLP 5 epochs, CNN 3 epochs).
  if (args.model === "mlp" && !args.given?.has("epochs")) args.epochs = 5;
  return args;
}

if (import.meta.main) await runMain(() => trainFashion(parseFashionArgs(Deno.args)));
