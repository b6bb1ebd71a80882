/**
 * Softmax cross-entropy whose statistics stay on the device: each call adds the batch's loss
 * sum and correct-prediction count to device accumulators, and {@linkcode CrossEntropyLoss.read}
 * fetches them once per log interval (no per-step `.item()`).
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import * as ops from "../ops/mod.ts";
import type { GradScaler } from "./grad_scaler.ts";

/** What {@linkcode CrossEntropyLoss.read} returns. */
export interface LossStats {
  /** Mean loss per sample since the last reset (NaN when no samples). */
  loss: number;
  /** Share of samples whose argmax equals the label. */
  accuracy: number;
  /** Samples counted. */
  samples: number;
}

/**
 * `nn.CrossEntropyLoss()` (mean reduction) for logits [N, K] fp16 and int32 labels [N].
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { CrossEntropyLoss } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using loss = new CrossEntropyLoss(device);
 * using logits = Tensor.fromHost(device, new Float16Array([0, 0, 5, 0]), [2, 2]);
 * using labels = Tensor.fromHost(device, new Int32Array([1, 0]), [2]);
 * loss.forward(logits, labels);
 * const s = await loss.read();
 * assert.strictEqual(s.samples, 2);
 * assert.strictEqual(s.accuracy, 0.5);
 * assert.ok(Math.abs(s.loss - (Math.log(2) + Math.log(1 + Math.exp(-5))) / 2) < 1e-3);
 * ```
 */
export class CrossEntropyLoss {
  #device: Device;
  #lossSum: Tensor | null;
  #correct: Tensor | null;
  #samples = 0;
  /** Gradient buffers by batch shape (full batches and the last partial one alternate). */
  #dlogits = new Map<string, Tensor>();

  /**
   * Creates the loss with zeroed device accumulators.
   *
   * @param device The device the logits live on.
   */
  constructor(device: Device) {
    this.#device = device;
    this.#lossSum = Tensor.fromHost(device, new Float32Array([0]), [1]);
    this.#correct = Tensor.fromHost(device, new Int32Array([0]), [1]);
  }

  #live(): [Tensor, Tensor] {
    if (!this.#lossSum || !this.#correct) {
      throw new TypeError("Cannot use the loss: it is disposed");
    }
    return [this.#lossSum, this.#correct];
  }

  #checkShapes(logits: Tensor, labels: Tensor): void {
    if (
      logits.shape.length !== 2 || labels.shape.length !== 1 || labels.shape[0] !== logits.shape[0]
    ) {
      throw new RangeError(
        `Cannot compute cross-entropy: logits [${logits.shape}] and labels [${labels.shape}]`,
      );
    }
  }

  /**
   * Adds the batch's loss and correct count to the accumulators and returns the gradient of
   * the mean loss with respect to the logits, scaled by the scaler's current scale.
   *
   * @param logits [N, K] fp16.
   * @param labels [N] int32.
   * @param scaler The loss scaler (none: unscaled gradient).
   * @returns dlogits [N, K] fp16, owned by the loss (reused by the next call).
   * @throws {RangeError} When the shapes do not match.
   */
  forwardBackward(logits: Tensor, labels: Tensor, scaler?: GradScaler | null): Tensor {
    const [lossSum, correct] = this.#live();
    this.#checkShapes(logits, labels);
    const key = `${logits.dtype}:${logits.shape.join("x")}`;
    let d = this.#dlogits.get(key);
    if (!d) {
      d = Tensor.empty(this.#device, [...logits.shape], logits.dtype);
      this.#dlogits.set(key, d);
    }
    // The kernel reads the scaler's scale on the device: the host's copy may be stale (it is
    // read once per log interval), and a gradient computed at a stale, larger scale could
    // overflow fp16 where the device's would not.
    const scaleTensor = scaler?.enabled ? scaler.scaleTensor : null;
    ops.crossEntropyForwardBackward(logits, labels, {
      dlogits: d,
      lossSum,
      correct,
      scaleTensor,
    });
    this.#samples += logits.shape[0];
    return d;
  }

  /**
   * Adds the batch's loss and correct count (evaluation: no gradient).
   *
   * @param logits [N, K] fp16.
   * @param labels [N] int32.
   * @throws {RangeError} When the shapes do not match.
   */
  forward(logits: Tensor, labels: Tensor): void {
    const [lossSum, correct] = this.#live();
    this.#checkShapes(logits, labels);
    ops.crossEntropyForward(logits, labels, { lossSum, correct });
    this.#samples += logits.shape[0];
  }

  /**
   * Samples counted since the last reset.
   *
   * @example
   * ```ts
   * import { CrossEntropyLoss, Device } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using loss = new CrossEntropyLoss(device);
   * assert.strictEqual(loss.samplesCounted, 0);
   * ```
   */
  get samplesCounted(): number {
    return this.#samples;
  }

  /**
   * Counts samples whose loss was added on the device without a call of this object: a
   * replayed recording of {@linkcode CrossEntropyLoss.forwardBackward} (a CUDA graph) adds to
   * the device accumulators, and the host's count must follow.
   *
   * @param n Samples (negative to take back a count whose work never ran).
   * @throws {RangeError} When `n` is not an integer or would make the count negative.
   * @example
   * ```ts
   * import { CrossEntropyLoss, Device } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using loss = new CrossEntropyLoss(device);
   * loss.countSamples(4);
   * assert.strictEqual(loss.samplesCounted, 4);
   * ```
   */
  countSamples(n: number): void {
    if (!Number.isSafeInteger(n) || this.#samples + n < 0) {
      throw new RangeError(`Cannot count ${n} samples: ${this.#samples} counted`);
    }
    this.#samples += n;
  }

  /**
   * Reads the accumulators (one device round trip) and, unless `reset` is false, zeroes them.
   *
   * @param reset Zero the accumulators after reading (default true).
   * @returns Mean loss, accuracy and sample count since the last reset.
   */
  async read(reset = true): Promise<LossStats> {
    const [lossSum, correct] = this.#live();
    const l = (await lossSum.toHost())[0] as number;
    const c = (await correct.toHost())[0] as number;
    const n = this.#samples;
    if (reset) {
      lossSum.buffer.fill(0);
      correct.buffer.fill(0);
      this.#samples = 0;
    }
    return { loss: n ? l / n : NaN, accuracy: n ? c / n : NaN, samples: n };
  }

  /** Frees the device accumulators (idempotent). */
  dispose(): void {
    this.#lossSum?.dispose();
    this.#correct?.dispose();
    for (const d of this.#dlogits.values()) d.dispose();
    this.#dlogits.clear();
    this.#lossSum = this.#correct = null;
  }

  /** Same as {@linkcode CrossEntropyLoss.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
