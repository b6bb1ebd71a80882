/**
 * What CIFAR10 and MNIST / FashionMNIST share: uint8 images of one fixed shape and int32
 * labels, held in shared memory, served as `{ image, label }` samples (views, no copies) and
 * as the zero-copy fields `image` u8 and `label` i32, rebuilt in workers from their state.
 * A base for datasets of that kind (subclass it with the image shape and a `workerSpec`).
 *
 * @module
 */

import type { Dataset, SharedField } from "../dataset.ts";

/** What a worker needs to rebuild a labeled image set (the memory is shared, not copied). */
export interface LabeledImagesState {
  /** Images in shared memory. */
  images: SharedArrayBuffer;
  /** Labels in shared memory. */
  labels: SharedArrayBuffer;
  /** Sample count. */
  length: number;
  /** Whether this is the training set. */
  train: boolean;
}

/**
 * A set of uint8 images of one shape with int32 labels, in shared memory: the base of CIFAR10
 * and MNIST / FashionMNIST.
 *
 * @example
 * ```ts
 * import { LabeledImages, type LabeledImagesState } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * class Tiny extends LabeledImages {
 *   constructor(state: LabeledImagesState) {
 *     super(state, [1, 2, 2]);
 *   }
 * }
 * const images = new SharedArrayBuffer(3 * 4), labels = new SharedArrayBuffer(3 * 4);
 * new Int32Array(labels).set([7, 8, 9]);
 * const ds = new Tiny({ images, labels, length: 3, train: true });
 * assert.strictEqual(ds.get(2).label, 9);
 * assert.deepStrictEqual(ds.sharedFields()[0].shape, [1, 2, 2]);
 * ```
 */
export abstract class LabeledImages implements Dataset<{ image: Uint8Array; label: number }> {
  /** Sample count. */
  readonly length: number;
  /** Whether this is the training set. */
  readonly train: boolean;
  /** Images, N x the image shape, bytes in shared memory. */
  readonly images: Uint8Array;
  /** Labels, in shared memory. */
  readonly labels: Int32Array;
  readonly #shape: readonly number[];
  readonly #bytes: number;

  /**
   * Views the shared memory of `state`.
   *
   * @param state The memory and the sample count.
   * @param shape The shape of one image (e.g. [3, 32, 32]).
   */
  protected constructor(state: LabeledImagesState, shape: readonly number[]) {
    this.#shape = shape;
    this.#bytes = shape.reduce((a, b) => a * b, 1);
    this.length = state.length;
    this.train = state.train;
    this.images = new Uint8Array(state.images, 0, state.length * this.#bytes);
    this.labels = new Int32Array(state.labels, 0, state.length);
  }

  /**
   * Sample `index`.
   *
   * @param index sample index
   * @returns `{ image, label }`, image a view into shared memory
   * @throws {RangeError} for an index out of range
   */
  get(index: number): { image: Uint8Array; label: number } {
    if (!(index >= 0 && index < this.length) || !Number.isInteger(index)) {
      throw new RangeError(
        `Cannot get sample ${index}: index out of range for a dataset of length ${this.length}`,
      );
    }
    const b = this.#bytes;
    return { image: this.images.subarray(index * b, index * b + b), label: this.labels[index] };
  }

  /**
   * The zero-copy layout: the fields in shared memory.
   *
   * @returns `image` u8 of the image shape and `label` i32 [] in shared memory
   */
  sharedFields(): readonly [SharedField<"image", "u8">, SharedField<"label", "i32">] {
    return [
      {
        name: "image",
        dtype: "u8",
        shape: this.#shape,
        buffer: this.images.buffer as SharedArrayBuffer,
      },
      { name: "label", dtype: "i32", shape: [], buffer: this.labels.buffer as SharedArrayBuffer },
    ];
  }

  /** The worker state of this set. */
  protected state(): LabeledImagesState {
    return {
      images: this.images.buffer as SharedArrayBuffer,
      labels: this.labels.buffer as SharedArrayBuffer,
      length: this.length,
      train: this.train,
    };
  }
}
