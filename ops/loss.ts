/**
 * Softmax cross-entropy with device-side loss and accuracy sums, with or without its gradient.
 *
 * Each op checks dtypes, shapes and devices (TypeError / RangeError naming the offending
 * value) and then queues the kernel on `options.stream` (default: the device's default
 * stream) through the device's backend (ops/backend.ts). Nothing here waits for the device or
 * reads device memory: results are read with `Tensor.toHost()`.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `crossEntropyForwardBackward(logits, labels, {dlogits, lossSum, correct, scale})` | logits, dlogits f16 or f32 [N,K]; labels i32 [N]; lossSum f32 [1]; correct i32 [1] | lossSum += Σ loss, correct += Σ (argmax == label), dlogits = scale·(softmax − onehot)/N |
 * | `crossEntropyForward(logits, labels, {lossSum, correct})` | | same sums, no gradient |
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import type { OpOptions } from "./backend.ts";
import {
  activations,
  launch,
  num,
  queue,
  rank,
  sameDtype,
  scalar,
  shape,
  tensor,
} from "./_launch.ts";

/** Accumulators and options of {@linkcode crossEntropyForward}. */
export interface CrossEntropyForwardOptions extends OpOptions {
  /** f32 [1], added to: the batch's summed loss. */
  lossSum: Tensor;
  /** i32 [1], added to: how many rows' argmax equals their label. */
  correct: Tensor;
}

/** Gradient, accumulators and options of {@linkcode crossEntropyForwardBackward}. */
export interface CrossEntropyOptions extends CrossEntropyForwardOptions {
  /** f16 or f32 [N, K], written: the gradient of the mean loss (times the scale). */
  dlogits: Tensor;
  /** Multiplies the gradient (the loss scale; default 1). */
  scale?: number;
  /**
   * f32 [1] on the device that also multiplies the gradient, read by the kernel (a
   * GradScaler's `scaleTensor`, which the device updates without the host knowing).
   */
  scaleTensor?: Tensor | null;
}

function crossEntropy(
  action: string,
  logits: Tensor,
  labels: Tensor,
  dlogits: Tensor | null,
  options: CrossEntropyForwardOptions & Partial<CrossEntropyOptions>,
): void {
  const lossSum = options?.lossSum, correct = options?.correct;
  const dt = activations(action, [logits, "logits"]);
  tensor(labels, "labels", ["i32"], action);
  tensor(lossSum, "lossSum", ["f32"], action);
  tensor(correct, "correct", ["i32"], action);
  rank(logits, "logits", [2], action);
  const [n, k] = logits.shape;
  shape(labels, "labels", [n], action);
  if (dlogits !== null) {
    sameDtype(dlogits, "dlogits", logits, "logits", action);
    shape(dlogits, "dlogits", logits.shape, action);
  }
  scalar(lossSum, "lossSum", action);
  scalar(correct, "correct", action);
  const scale = num(options.scale ?? 1, "scale", action);
  const scaleTensor = options.scaleTensor ?? null;
  if (scaleTensor !== null) {
    tensor(scaleTensor, "scaleTensor", ["f32"], action);
    scalar(scaleTensor, "scaleTensor", action);
  }
  using launched = launch(
    action,
    options,
    logits,
    labels,
    dlogits,
    lossSum,
    correct,
    scaleTensor,
  );
  const { device, stream } = launched;
  queue(device, "crossEntropy", {
    logits,
    labels,
    dlogits,
    dtype: dt,
    loss_sum: lossSum,
    correct,
    n,
    k,
    scale,
    device_scale: scaleTensor,
    stream,
  }, `${action} logits [${logits.shape}]`);
}

/**
 * Softmax cross-entropy with its gradient: adds the batch's summed loss to `lossSum` and
 * its correct count to `correct` (both stay on the device), and writes
 * `dlogits = scale · (softmax(logits) − onehot(labels)) / N`.
 *
 * @param logits f16 or f32 [N, K].
 * @param labels i32 [N], each in [0, K).
 * @param options dlogits (f16 or f32 [N, K], written), lossSum (f32 [1], added to), correct (i32
 *   [1], added to); scale (the loss scale, default 1) or scaleTensor, stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @throws {PinstreamError} On the CPU backend, when a label is out of range.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { crossEntropyForwardBackward } from "./loss.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using logits = Tensor.fromHost(dev, new Float16Array([0, 0]), [1, 2]);
 * using labels = Tensor.fromHost(dev, new Int32Array([1]));
 * using d = Tensor.empty(dev, [1, 2], "f16");
 * using loss = Tensor.fromHost(dev, new Float32Array([0]));
 * using hits = Tensor.fromHost(dev, new Int32Array([0]));
 * crossEntropyForwardBackward(logits, labels, { dlogits: d, lossSum: loss, correct: hits });
 * assert.ok(Math.abs((await loss.toHost())[0] - Math.LN2) < 1e-6);
 * assert.deepStrictEqual([...await d.toHost()], [0.5, -0.5]);
 * ```
 */
export function crossEntropyForwardBackward(
  logits: Tensor,
  labels: Tensor,
  options: CrossEntropyOptions,
): void {
  // A missing dlogits is undefined, not null: the helper rejects it, naming dlogits.
  crossEntropy("run crossEntropyForwardBackward", logits, labels, options?.dlogits, options);
}

/**
 * Softmax cross-entropy for evaluation: the sums of {@linkcode crossEntropyForwardBackward}
 * without the gradient.
 *
 * @param logits f16 or f32 [N, K].
 * @param labels i32 [N].
 * @param options lossSum (f32 [1], added to), correct (i32 [1], added to), stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes do not agree.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { crossEntropyForward } from "./loss.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using logits = Tensor.fromHost(dev, new Float16Array([3, 1, 0, 2]), [2, 2]);
 * using labels = Tensor.fromHost(dev, new Int32Array([0, 0]));
 * using loss = Tensor.fromHost(dev, new Float32Array([0]));
 * using hits = Tensor.fromHost(dev, new Int32Array([0]));
 * crossEntropyForward(logits, labels, { lossSum: loss, correct: hits });
 * assert.deepStrictEqual([...await hits.toHost()], [1]);
 * ```
 */
export function crossEntropyForward(
  logits: Tensor,
  labels: Tensor,
  options: CrossEntropyForwardOptions,
): void {
  // Only the forward's fields: a stray dlogits or scale in a reused options object must
  // not turn this into the backward.
  const { lossSum, correct, stream } = options ?? {};
  crossEntropy("run crossEntropyForward", logits, labels, null, { lossSum, correct, stream });
}
