/**
 * The small reference models that the examples train and the benchmarks time, with the
 * normalization constants of their data sets, so both build the same networks.
 *
 * @module
 */

import {
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  type Module,
  ReLU,
  Scale,
  Sequential,
  Xoshiro128,
} from "../nn/mod.ts";
import { refuseUnknownKeys } from "../internal/options.ts";

/** The factor on {@linkcode cifarModel}'s logits (as in fast CIFAR-10 recipes). */
export const CIFAR_LOGIT_SCALE = 0.125;

/** Options of {@linkcode cifarModel}. */
export interface CifarModelOptions {
  /** The factor on the logits (default {@linkcode CIFAR_LOGIT_SCALE}; 1: no Scale layer). */
  logitScale?: number;
}

/** CIFAR-10's per-channel mean (of x / 255 over the training set). */
export const CIFAR_MEAN = [0.4914, 0.4822, 0.4465];
/** CIFAR-10's per-channel standard deviation. */
export const CIFAR_STD = [0.2470, 0.2435, 0.2616];
/**
 * The CIFAR-10 network of `deno task cifar` and the benchmarks: three conv-BN-ReLU stages with max pooling, then a linear
 * classifier (160,234 parameters) whose logits are scaled by {@linkcode CIFAR_LOGIT_SCALE}
 * (see {@linkcode Scale} and docs/recipe.md: without it, peak learning rates of 0.02 and more
 * blow the loss up in the first epoch of short schedules).
 *
 * @param seed Seed of the initial weights.
 * @param options `logitScale`: the factor on the logits (default
 *   {@linkcode CIFAR_LOGIT_SCALE}; 1 leaves the classifier's output as it is, with no Scale
 *   layer).
 * @returns The model (on the host; call `to(device)`).
 * @example
 * ```ts
 * import { cifarModel } from "./models.ts";
 * import assert from "node:assert";
 * const n = cifarModel().parameters().reduce((a, p) => a + p.numel, 0);
 * assert.strictEqual(n, 160_234);
 * ```
 */
export function cifarModel(seed = 0, options: CifarModelOptions = {}): Module {
  refuseUnknownKeys(options ?? {}, ["logitScale"], "create cifarModel");
  const logitScale = options.logitScale ?? CIFAR_LOGIT_SCALE;
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
    ...(logitScale === 1 ? [] : [new Scale(logitScale)]),
  ]);
}

/** Fashion-MNIST's pixel mean and standard deviation (of x / 255 over the training set). */
export const FASHION_MEAN = 0.2860;
/** See {@linkcode FASHION_MEAN}. */
export const FASHION_STD = 0.3530;

/**
 * The Fashion-MNIST models of `deno task fashion` and the benchmarks, with PyTorch's layer
 * names.
 *
 * @param name "mlp" (784-256-10) or "cnn" (conv3x3 1->32, ReLU, maxpool 2, conv3x3 32->64,
 * ReLU, maxpool 2, linear 3136->10; padding 1).
 * @param seed Seed of the initial weights.
 * @returns The model (on the host; call `to(device)`).
 * @throws {RangeError} For an unknown name.
 * @example
 * ```ts
 * import { fashionModel } from "./models.ts";
 * import assert from "node:assert";
 * assert.deepStrictEqual(
 *   fashionModel("mlp").namedParameters().map(([n, p]) => `${n} [${p.shape}]`),
 *   ["1.weight [256,784]", "1.bias [256]", "3.weight [10,256]", "3.bias [10]"],
 * );
 * ```
 */
export function fashionModel(name: string, seed = 0): Module {
  const rng = new Xoshiro128(seed);
  if (name === "mlp") {
    return new Sequential([
      new Flatten(),
      new Linear(784, 256, { rng }),
      new ReLU(),
      new Linear(256, 10, { rng }),
    ]);
  }
  if (name === "cnn") {
    return new Sequential([
      new Conv2d(1, 32, { kernelSize: 3, padding: 1, rng }),
      new ReLU(),
      new MaxPool2d(2),
      new Conv2d(32, 64, { kernelSize: 3, padding: 1, rng }),
      new ReLU(),
      new MaxPool2d(2),
      new Flatten(),
      new Linear(3136, 10, { rng }),
    ]);
  }
  throw new RangeError(`Cannot build the model: unknown --model ${name} (expected mlp or cnn)`);
}
