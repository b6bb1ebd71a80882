/**
 * A dataset that lives in device memory (the FFCV / airbench way, for sets that fit: CIFAR-10 is
 * 150 MB of uint8): uploaded once, then every batch is gathered, cropped, flipped, normalized
 * and cast on the device from the shuffled indices, with nothing but the indices and
 * augmentation records (40 bytes a sample) crossing from the host per step.
 *
 * {@linkcode DeviceDataset.loader} gives the same batches, bit for bit, as a DataLoader with the
 * same `seed`, `shuffle`, `dropLast` and `augment` feeding a {@linkcode DevicePrefetcher} with
 * the same normalization: the order and the crop/flip draws come from the same
 * {@linkcode EpochOrder}, and the same augment kernel runs. So the
 * doctor, or you, can swap one for the other and compare.
 *
 * @example
 * ```ts
 * import { Device, DeviceDataset, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const n = 100;
 * const images = new Uint8Array(new SharedArrayBuffer(n * 3 * 8 * 8)).map((_, i) => i % 251);
 * const labels = new Int32Array(new SharedArrayBuffer(n * 4)).map((_, i) => i % 10);
 * using device = Device.open("cpu");
 * using resident = new DeviceDataset(device,
 *   new TensorDataset({ image: { data: images, shape: [3, 8, 8] }, label: labels }));
 * await using loader = resident.loader({
 *   batchSize: 32, shuffle: true, seed: 1, augment: { padding: 2, flip: true },
 *   mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25],
 * });
 * let samples = 0;
 * for await (const b of loader) samples += b.size; // b.images: f16 [32, 3, 8, 8] on the device
 * assert.strictEqual(samples, n);
 * ```
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { DeviceBuffer } from "../ffi/memory.ts";
import { range } from "../internal/trace.ts";
import type { Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import { type Dataset, recordBytes, type SharedField } from "../loader/dataset.ts";
import { EpochOrder } from "../loader/order.ts";
import { DistributedSampler } from "../loader/sampler.ts";
import type { AugmentOptions } from "../augment/options.ts";
import { AUGMENT_RECORD_LENGTH } from "../augment/record.ts";
import {
  type ImageDtype,
  type ImageLayout,
  imageShape,
  type NormalizeAffine,
  normalizeAffine,
} from "../augment/image.ts";
import { imageAugment } from "../ops/image.ts";
import type { DeviceBatch } from "./prefetcher.ts";

/** Options of a {@linkcode DeviceDataset}. */
export interface DeviceDatasetOptions {
  /** The image field (u8; default "image"). */
  imageField?: string;
  /** The label field (u8, u16 or i32 scalar; default "label"). */
  labelField?: string;
  /** How the image field is laid out per sample (default "nchw": [C, H, W]; "nhwc": [H, W, C]). */
  layout?: ImageLayout;
}

/** Options of {@linkcode DeviceDataset.loader}: the DataLoader's and the prefetcher's. */
export interface DeviceLoaderOptions {
  /** Samples per batch (default 1, as the DataLoader). */
  batchSize?: number;
  /** Shuffle every epoch (default false). */
  shuffle?: boolean;
  /** Seed of the order and the augmentation draws (default: random, as the DataLoader). */
  seed?: number;
  /** Drop the last short batch (default false). */
  dropLast?: boolean;
  /** Crop padding, flips, cutout and colour jitter, drawn per sample as the DataLoader draws them. */
  augment?: AugmentOptions;
  /** Per-channel mean, in [0, 1] units (default 0). */
  mean?: ArrayLike<number>;
  /** Per-channel std, in [0, 1] units (default 1). */
  std?: ArrayLike<number>;
  /** Output element type (default "f16"). */
  dtype?: ImageDtype;
  /** The stream the batches are made on (default: the device's default stream). */
  stream?: Stream;
  /**
   * The ranks of a data-parallel job (default 1): each epoch's order is split as
   * {@linkcode DistributedSampler} splits it, the same shuffle on every rank for the same
   * seed (0 when none is given), this rank taking its share.
   */
  worldSize?: number;
  /** This rank, in [0, worldSize) (default 0). */
  rank?: number;
}

const LABEL_BYTES: Record<string, number> = { u8: 1, u16: 2, i32: 4 };
/** About how many samples one launch makes, records drawn and uploaded at once (whole batches). */
const CHUNK_SAMPLES = 2048;
/** At most this many bytes of output images per chunk (large images: fewer batches a chunk). */
const CHUNK_BYTES = 64 << 20;
/** Bytes of one sample's augment record. */
const RECORD_BYTES = 4 * AUGMENT_RECORD_LENGTH;

/**
 * A dataset uploaded to device memory once. Dispose it to free that memory.
 *
 * @example
 * ```ts
 * import { Device, DeviceDataset, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const images = new Uint8Array(new SharedArrayBuffer(10 * 4 * 4));
 * const labels = new Uint8Array(new SharedArrayBuffer(10));
 * using device = Device.open("cpu");
 * using d = new DeviceDataset(device,
 *   new TensorDataset({ image: { data: images, shape: [1, 4, 4] }, label: { data: labels, shape: [] } }));
 * assert.deepStrictEqual([d.length, d.channels, d.height, d.width, d.bytes], [10, 1, 4, 4, 170]);
 * ```
 */
export class DeviceDataset implements Disposable {
  /** The device holding the data. */
  readonly device: Device;
  /** Samples. */
  readonly length: number;
  /** Channels, height and width of an image. */
  readonly channels: number;
  /** Image height. */
  readonly height: number;
  /** Image width. */
  readonly width: number;
  /** Device bytes held (images and labels). */
  readonly bytes: number;
  /** The per-sample layout of the images. */
  readonly layout: ImageLayout;
  readonly #images: DeviceBuffer;
  readonly #labels: DeviceBuffer;
  readonly #imageBytes: number;
  readonly #labelBytes: number;
  readonly #dataset: Dataset;

  /**
   * Uploads the dataset's image and label fields to the device.
   *
   * @param device The device.
   * @param dataset A zero-copy dataset (TensorDataset, CIFAR10, FashionMNIST, ...) whose
   * samples are its records in order (not a Subset).
   * @param options The field names and the image layout.
   * @throws {TypeError} When the dataset has no shared fields or records elsewhere.
   * @throws {RangeError} When a field is missing or of the wrong type or shape.
   * @throws {PinstreamError} When the device memory cannot be allocated (`OUT_OF_MEMORY`).
   */
  constructor(device: Device, dataset: Dataset, options: DeviceDatasetOptions = {}) {
    const action = "create a DeviceDataset";
    refuseUnknownKeys(options ?? {}, ["imageField", "labelField", "layout"], action);
    if (typeof dataset?.sharedFields !== "function" || typeof dataset.records === "function") {
      throw new TypeError(
        `Cannot ${action}: need a zero-copy dataset whose samples are its records in order ` +
          "(TensorDataset, CIFAR10, FashionMNIST; not a Subset or a generic dataset)",
      );
    }
    const layout = options.layout ?? "nchw";
    if (layout !== "nchw" && layout !== "nhwc") {
      throw new RangeError(`Cannot ${action}: layout must be "nchw" or "nhwc", got ${layout}`);
    }
    const fields = dataset.sharedFields();
    const find = (name: string) => {
      const f = fields.find((x) => x.name === name);
      if (f === undefined) {
        throw new RangeError(
          `Cannot ${action}: the dataset has fields ${fields.map((x) => x.name).join(", ")}; ` +
            `no "${name}" (see the imageField/labelField options)`,
        );
      }
      return f;
    };
    const image = find(options.imageField ?? "image");
    const label = find(options.labelField ?? "label");
    if (image.dtype !== "u8") {
      throw new RangeError(`Cannot ${action}: field "${image.name}" is ${image.dtype}, need u8`);
    }
    const { c, h, w } = imageShape(image.shape, layout, `${action}: field "${image.name}"`);
    if (LABEL_BYTES[label.dtype] === undefined || label.shape.length !== 0) {
      throw new RangeError(
        `Cannot ${action}: field "${label.name}" is ${label.dtype} [${label.shape}], need one ` +
          "integer label (u8, u16 or i32) per sample",
      );
    }
    this.device = device;
    this.#dataset = dataset;
    this.length = dataset.length;
    this.layout = layout;
    [this.channels, this.height, this.width] = [c, h, w];
    this.#imageBytes = recordBytes(image);
    this.#labelBytes = recordBytes(label);
    this.#images = upload(device, image, this.#imageBytes * this.length);
    try {
      this.#labels = upload(device, label, this.#labelBytes * this.length);
    } catch (err) {
      this.#images.dispose();
      throw err;
    }
    this.bytes = this.#images.bytes + this.#labels.bytes;
  }

  /**
   * Batches of this dataset made on the device, epoch after epoch (`for await` runs one).
   *
   * @param options Order, augmentation and normalization, as for DataLoader + DevicePrefetcher.
   * @returns The loader; dispose it to free its buffers.
   */
  loader(options: DeviceLoaderOptions = {}): DeviceLoader {
    return new DeviceLoader(this, options);
  }

  /** @internal What a DeviceLoader gathers from. */
  _source(): {
    images: DeviceBuffer;
    labels: DeviceBuffer;
    imageBytes: number;
    labelBytes: number;
    dataset: Dataset;
  } {
    return {
      images: this.#images,
      labels: this.#labels,
      imageBytes: this.#imageBytes,
      labelBytes: this.#labelBytes,
      dataset: this.#dataset,
    };
  }

  /** Frees the device memory (batches still held become invalid). */
  [Symbol.dispose](): void {
    this.#images.dispose();
    this.#labels.dispose();
  }
}

function upload(device: Device, field: SharedField, bytes: number): DeviceBuffer {
  const buf = DeviceBuffer.alloc(device, bytes);
  try {
    if (bytes > 0) {
      buf.copyFrom(new Uint8Array(field.buffer, field.byteOffset ?? 0, bytes));
    }
  } catch (err) {
    buf.dispose();
    throw err;
  }
  return buf;
}

/**
 * Device-made batches of a {@linkcode DeviceDataset}: an async iterable of the prefetcher's
 * {@linkcode DeviceBatch} (images normalized on the device, int32 labels), one epoch per
 * `for await`. A batch is valid until the next one is requested.
 *
 * @example
 * ```ts
 * import { Device, DeviceDataset, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const images = new Uint8Array(new SharedArrayBuffer(64 * 16)).fill(255);
 * const labels = new Int32Array(new SharedArrayBuffer(64 * 4));
 * using device = Device.open("cpu");
 * using d = new DeviceDataset(device, new TensorDataset({ image: { data: images, shape: [4, 4] }, label: labels }));
 * await using loader = d.loader({ batchSize: 16, dtype: "f32" });
 * assert.strictEqual(loader.length, 4);
 * for await (const b of loader) assert.deepStrictEqual([...await b.images.toHost()].slice(0, 2), [1, 1]);
 * ```
 */
export class DeviceLoader implements AsyncIterable<DeviceBatch>, AsyncDisposable {
  /** The dataset. */
  readonly dataset: DeviceDataset;
  /** The output element type. */
  readonly dtype: ImageDtype;
  readonly #order: EpochOrder;
  readonly #affine: NormalizeAffine;
  readonly #stream: Stream | undefined;
  readonly #batchSize: number;
  readonly #batchCap: number;
  /** Batches made by one launch, their records drawn and uploaded at once (a chunk). */
  readonly #perChunk: number;
  #buffers:
    | {
      idx: DeviceBuffer;
      params: DeviceBuffer;
      staged: Int32Array;
      images: Tensor;
      labels: Tensor;
    }
    | undefined;
  /** Views of the chunk's images and labels, by "first sample:samples". */
  #views = new Map<string, { images: Tensor; labels: Tensor }>();
  #disposed = false;

  /**
   * Use {@linkcode DeviceDataset.loader}.
   *
   * @param dataset The device-resident dataset.
   * @param options Order, augmentation and normalization.
   */
  constructor(dataset: DeviceDataset, options: DeviceLoaderOptions = {}) {
    const action = "create a DeviceLoader";
    refuseUnknownKeys(options ?? {}, [
      "batchSize",
      "shuffle",
      "seed",
      "dropLast",
      "augment",
      "mean",
      "std",
      "dtype",
      "stream",
      "worldSize",
      "rank",
    ], action);
    this.dataset = dataset;
    this.dtype = options.dtype ?? "f16";
    if (this.dtype !== "f16" && this.dtype !== "f32") {
      throw new TypeError(`Cannot ${action}: dtype must be "f16" or "f32", got ${this.dtype}`);
    }
    const c = dataset.channels;
    this.#affine = normalizeAffine(
      options.mean ?? new Array(c).fill(0),
      options.std ?? new Array(c).fill(1),
    );
    if (this.#affine.scale.length !== c) {
      throw new RangeError(
        `Cannot ${action}: mean and std have ${this.#affine.scale.length} channels, the images ${c}`,
      );
    }
    this.#stream = options.stream;
    if (this.#stream !== undefined && this.#stream.device !== dataset.device) {
      throw new TypeError(`Cannot ${action}: the stream belongs to another device`);
    }
    // The streamed path's order and draws for the same seed, shuffle, dropLast and augment.
    const { shuffle, seed, dropLast, augment } = options;
    const batchSize = options.batchSize ?? 1;
    const worldSize = options.worldSize ?? 1, rank = options.rank ?? 0;
    // A sharded order: the seed must be the same on every rank, so it is never random here.
    const order = worldSize === 1 && rank === 0 ? { shuffle, seed } : {
      sampler: new DistributedSampler(dataset.length, {
        worldSize,
        rank,
        shuffle: shuffle ?? false,
        seed: seed ?? 0,
      }),
      seed: seed ?? 0,
    };
    this.#order = new EpochOrder(
      dataset.length,
      { batchSize, ...order, dropLast, augment },
      action,
    );
    this.#batchSize = batchSize;
    // Buffers hold what a batch can hold, not what batchSize asks: no batch has more samples
    // than the set (batchSize 1e8 on 10 samples allocated gigabytes).
    this.#batchCap = this.#order.maxBatchSize();
    // A chunk of whole batches is made at a time, within both caps.
    const sampleBytes = dataset.channels * dataset.height * dataset.width *
      (this.dtype === "f16" ? 2 : 4);
    this.#perChunk = Math.max(
      1,
      Math.min(
        Math.floor(CHUNK_SAMPLES / this.#batchCap),
        Math.floor(CHUNK_BYTES / Math.max(1, this.#batchCap * sampleBytes)),
      ),
    );
  }

  /** Batches per epoch. */
  get length(): number {
    return this.#order.length;
  }

  /** The epoch the next `for await` runs. */
  get epoch(): number {
    return this.#order.epoch;
  }

  /**
   * Sets the epoch of the next `for await` (its order and draws), as DataLoader.setEpoch.
   *
   * @param epoch A non-negative integer.
   */
  setEpoch(epoch: number): void {
    this.#order.setEpoch(epoch);
  }

  /**
   * Runs one epoch: gathers, augments and normalizes each batch on the device, a chunk of
   * batches per launch.
   *
   * @returns The epoch's batches.
   * @throws {Error} When the loader is disposed.
   */
  async *[Symbol.asyncIterator](): AsyncIterator<DeviceBatch> {
    if (this.#disposed) throw new Error("Cannot iterate a DeviceLoader: it is disposed");
    const ds = this.dataset, dev = ds.device, src = ds._source();
    const bufs = this.#buffersFor();
    const stream = this.#stream;
    const order = this.#order, b = this.#batchSize;
    // The whole order goes up at once; then per chunk of whole batches, its records drawn in
    // one call and uploaded in one copy, and one launch that makes all its batches.
    const epoch = order.nextEpoch();
    const indices = order.indices(epoch), n = indices.length;
    if (n > 0) bufs.idx.copyFrom(indices, { stream });
    const spec = order.augment;
    const chunk = this.#batchCap * this.#perChunk;
    const batches = this.length;
    for (let k = 0; k < batches; k++) {
      // An epoch left open when the loader was disposed ends here, before it touches the
      // freed buffers or allocates anything.
      if (this.#disposed) throw new Error("Cannot iterate a DeviceLoader: it is disposed");
      const at = k * b, size = Math.min(b, n - at), first = at % chunk;
      using _ = range("resident.batch", { stream: stream ?? dev.defaultStream });
      if (first === 0) {
        const count = Math.min(chunk, n - at);
        if (spec !== undefined) {
          // The copy stages the pageable array at the call and is ordered after the launch
          // that read the last chunk's records, so the array and the buffer are free again.
          order.records(epoch, at, count, bufs.staged, 0);
          bufs.params.copyFrom(
            new Uint8Array(bufs.staged.buffer, 0, count * RECORD_BYTES),
            { stream },
          );
        }
        const out = this.#viewsFor(0, count);
        dev.makeCurrent();
        // The images and their labels gathered in the kernel's own pass (no gathered copy in
        // between), for every batch of the chunk.
        imageAugment(src.images, out.images, {
          layout: ds.layout,
          affine: this.#affine,
          padding: spec?.padding ?? 0,
          params: spec !== undefined ? bufs.params : null,
          paramsOffset: spec !== undefined ? 0 : undefined,
          // Without the contrast option the records carry none: no mean-grey pre-pass.
          contrast: (spec?.contrast ?? 0) > 0,
          indices: bufs.idx,
          indicesOffset: at * 4,
          rows: ds.length,
          labels: src.labels,
          labelBytes: src.labelBytes,
          labelsOut: out.labels,
          stream,
        });
      }
      const { images, labels } = this.#viewsFor(first, size);
      yield { images, labels, size, index: k, epoch };
    }
  }

  #buffersFor() {
    if (this.#buffers === undefined) {
      const ds = this.dataset, dev = ds.device, chunk = this.#batchCap * this.#perChunk;
      const made: (DeviceBuffer | Tensor)[] = [];
      try {
        // The epoch's order, a chunk's records, images and labels.
        for (const bytes of [ds.length * 4, chunk * RECORD_BYTES]) {
          made.push(DeviceBuffer.alloc(dev, bytes));
        }
        made.push(Tensor.empty(dev, [chunk, ds.channels, ds.height, ds.width], this.dtype));
        made.push(Tensor.empty(dev, [chunk], "i32"));
      } catch (err) {
        for (const m of made) m.dispose();
        throw err;
      }
      const [idx, params, images, labels] = made;
      this.#buffers = {
        idx: idx as DeviceBuffer,
        params: params as DeviceBuffer,
        staged: new Int32Array(chunk * AUGMENT_RECORD_LENGTH),
        images: images as Tensor,
        labels: labels as Tensor,
      };
    }
    return this.#buffers;
  }

  /** The chunk's samples [first, first + n) as an image and a label tensor (kept). */
  #viewsFor(first: number, n: number): { images: Tensor; labels: Tensor } {
    const key = `${first}:${n}`;
    let v = this.#views.get(key);
    if (v === undefined) {
      const bufs = this.#buffersFor();
      v = { images: bufs.images.narrow(0, first, n), labels: bufs.labels.narrow(0, first, n) };
      this.#views.set(key, v);
    }
    return v;
  }

  /** Frees the loader's device buffers (the dataset stays). */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    await this.dataset.device.synchronize();
    // The views go with the chunk tensors they view.
    this.#views.clear();
    if (this.#buffers) {
      const { idx, params, images, labels } = this.#buffers;
      for (const b of [idx, params, images, labels]) b.dispose();
    }
    this.#buffers = undefined;
  }
}
