/**
 * Host batches to device batches: the loader's staging ring pinned in place, one
 * host-to-device copy per batch on a dedicated copy stream, an event handing each batch to
 * the compute stream (which waits on the device; the host does not), the geometry kernel
 * (with the loader's `geometry`) and the fused
 * crop/flip/colour/normalize/cutout/cast kernel on the compute stream, and a ring of device slots so that
 * `depth` batches are in flight while the consumer works on one.
 *
 * ## Lifetimes (who may touch what, when)
 *
 * - **Loader slot** (host, in the pinned ring): handed back to the loader
 *   (`RingBatch.release()`) as soon as the copy event of its batch has fired, never before.
 *   The host never blocks on that: the release runs when `Event.query()` says so, or when
 *   a nonblocking `Event.synchronize()` resolves.
 * - **Device slot** (`DeviceBatch.images`, `.labels`): valid until the next `next()` call
 *   (the next iteration of `for await`). Work the consumer queued on the compute stream
 *   before that call is safe; the slot is refilled only after an event recorded on the
 *   compute stream at that call has fired (the copy stream waits on it).
 * - **Raw bytes** (device mode, a device copy of the loader slot): rewritten by the copy
 *   stream only after the kernel that read them finished (an event after the kernel).
 * - **Host staging** (host mode: floats built on the host in pinned memory): rewritten only
 *   after the copy event of its previous batch fired (here the host does wait, rarely).
 *
 * On the CPU backend (device memory is host memory, streams run synchronously) the default
 * `copy: "auto"` skips the copy: the kernel reads the registered loader slot in place and
 * the slot goes back to the loader when the kernel returns. `copy: "always"` runs the GPU
 * path (copy, events, hand-off) on the CPU backend too; the tests run both.
 *
 * The epoch itself (staging, copies, the kernels) is in `_image_run.ts`, over the slot ring
 * both prefetchers share (`_slot_ring.ts`); the option checks are in `_image_options.ts`.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { Stream } from "../ffi/stream.ts";
import type { Tensor } from "../ffi/tensor.ts";
import type { DataLoader } from "../loader/data_loader.ts";
import type { RingBatch, StagingRing } from "../loader/ring.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import { BatchPrefetcher, type BatchPrefetcherOptions } from "./batch_prefetcher.ts";
import { type NvjpegDecoder, openNvjpeg } from "../ffi/nvjpeg.ts";
import { type DecodedBatch, decodedBatches } from "./_jpeg_loader.ts";
import { EpochRun, Resources } from "./_image_run.ts";
import { RingLease } from "./_slot_ring.ts";
import { cropPadding, describe, fieldName, geometry, oneOf, perChannel } from "./_image_options.ts";
import {
  type ImageDtype,
  type ImageLayout,
  type NormalizeAffine,
  normalizeAffine,
} from "../augment/image.ts";

/** Options of {@linkcode DevicePrefetcher} / {@linkcode toDevice}. */
export interface ToDeviceOptions {
  /** Batches in flight on the device besides the one the consumer holds (default 2). */
  depth?: number;
  /**
   * Where the augmentation (the loader's per-sample records), the normalize and the cast run:
   * "device" (default; uint8 bytes cross to the
   * device, one fused kernel there) or "host" (floats built on the host, then sent).
   */
  augmentOn?: "device" | "host";
  /** Output element type of `images` (default "f16"). */
  dtype?: ImageDtype;
  /**
   * Per-channel mean in [0, 1] units, one finite number per image channel (default 0 for
   * every channel).
   */
  mean?: ArrayLike<number>;
  /**
   * Per-channel std in [0, 1] units, one finite number > 0 per image channel (default 1 for
   * every channel).
   */
  std?: ArrayLike<number>;
  /**
   * Crop padding of the loader's `augment` parameters. Default and only accepted value: the
   * loader's own `loader.augment.padding` (0 when the loader draws no parameters); any other
   * value is refused, since the crop offsets were drawn for that padding.
   */
  padding?: number;
  /** Ring field holding the uint8 images (default "image"). */
  imageField?: string;
  /** Ring field holding the labels (u8, u16 or i32; default "label"). */
  labelField?: string;
  /**
   * Memory order of an image record (default "nchw": CIFAR's [3, 32, 32]; "nhwc", the only
   * one accepted, when the loader has `geometry`: its records are cropped, resized and rotated
   * by `imageGeometry` into `[height, width, channels]` images first).
   */
  layout?: ImageLayout;
  /** The compute stream the batches are handed to (default: the device's default stream). */
  stream?: Stream;
  /**
   * How the loader's ring reaches the device: "register" (default) pins the ring's
   * SharedArrayBuffer in place (cudaHostRegister); "alloc" first copies each slot on the
   * host into pinned memory from cudaHostAlloc; "none" copies from pageable memory.
   * With "register" the prefetcher pins the ring itself (for as long as it holds device
   * resources): build the loader with `pinMemory: true` (a flag), not with a pinning
   * function, or CUDA refuses the second registration of the same memory.
   */
  pin?: "register" | "alloc" | "none";
  /** Keep device memory, streams and the ring's pinning across epochs (default false). */
  persistent?: boolean;
  /**
   * "auto" (default): where the device reads pinned host memory directly and
   * synchronously (the CPU backend), the kernel reads the registered ring slot in place
   * and the host-to-device copy is skipped (copy stats stay 0). "always": copy every batch,
   * as on a GPU (tests use it to run the copy path on the CPU backend).
   */
  copy?: "auto" | "always";
}

/** One batch on the device, from {@linkcode DevicePrefetcher}. */
export interface DeviceBatch {
  /** `[n, C, H, W]`, `dtype` f16 or f32, normalized. Valid until the next `next()`. */
  readonly images: Tensor;
  /** `[n]` int32. Valid until the next `next()`. */
  readonly labels: Tensor;
  /** Samples in the batch (the last batch of an epoch may be short). */
  readonly size: number;
  /** Batch number within the epoch. */
  readonly index: number;
  /** The loader's epoch number. */
  readonly epoch: number;
}

/** What one epoch of the device pipeline looked like. */
export interface PipelineStats {
  /** The loader's epoch number. */
  epoch: number;
  /** Batches delivered. */
  batches: number;
  /** Samples delivered. */
  samples: number;
  /** Wall time from the first `next()` to the end of the epoch, ms. */
  wallMs: number;
  /**
   * Time the consumer spent inside `next()` waiting for input, ms: the loader's wait, the
   * copies' and kernels' queuing. Excludes `deviceWaitMs`.
   */
  waitMs: number;
  /** Of which: time the host waited for the loader to produce a batch, ms. */
  hostWaitMs: number;
  /**
   * Time `next()` waited for the device to finish earlier steps, ms: a host running ahead
   * of the device keeps loader slots until their copies run, and once it holds as many as
   * the loader's ring can spare it waits here (a device-bound step, not input wait).
   */
  deviceWaitMs: number;
  /**
   * Host-to-device copy time summed over `copiesTimed` batches, ms (from events on the copy
   * stream; a copy still running when its slot is reused is not waited for, only skipped).
   */
  copyMs: number;
  /** Batches whose copy time is in `copyMs`. */
  copiesTimed: number;
  /** Bytes copied host to device. */
  copyBytes: number;
  /**
   * `waitMs / wallMs`: the share of step time spent waiting for input (0 = never). Time spent
   * waiting for the device (`deviceWaitMs`) counts as step time, not as input wait.
   */
  inputBoundFraction: number;
  /** Samples per second over `wallMs`. */
  samplesPerSecond: number;
}

const DEFAULT_DEPTH = 2;

// Every key of ToDeviceOptions, checked by the compiler against the interface.
const OPTION_KEYS: Record<keyof ToDeviceOptions, true> = {
  depth: true,
  augmentOn: true,
  dtype: true,
  mean: true,
  std: true,
  padding: true,
  imageField: true,
  labelField: true,
  layout: true,
  stream: true,
  pin: true,
  persistent: true,
  copy: true,
};
const OPTION_NAMES = Object.keys(OPTION_KEYS);

// Keys people bring from other libraries' prefetchers, and where that setting lives here.
const OPTION_HINTS: Record<string, string> = {
  augment: "crop, flip, cutout and colour parameters are drawn by the loader (the " +
    "DataLoader's augment option) and applied here with its padding",
  normalize: "pass the mean and std options",
};

/**
 * The prefetcher each loader's staging ring feeds. The ring can be pinned
 * (cudaHostRegister) only once, and a second iteration of the loader stops the first's
 * epoch: two prefetchers on one loader cannot work, so the second is refused up front
 * instead of failing later in CUDA with "memory already registered".
 */
const attached = new WeakMap<StagingRing, DevicePrefetcher>();

/**
 * Turns a DataLoader's batches (zero-copy path) into batches on a device, `depth` ahead.
 * Iterate it once per epoch (`for await`); each iteration starts a new epoch of the loader.
 * This is the image path (uint8 images, integer labels); batches of anything else go through
 * {@linkcode BatchPrefetcher}, which {@linkcode toDevice} picks for them.
 *
 * With an image dataset of `decodeOn: "device"` (and the loader's `geometry`), the workers hand
 * each JPEG's bytes on and the files are decoded here with nvJPEG, one batch ahead on a stream of
 * their own, before the same kernels; where nvJPEG cannot run, one line says why and the workers
 * decode (docs/image_files.md).
 *
 * The loader should be built with `autoRelease: false` so that a loader slot is only
 * reused after its copy to the device fired; with `autoRelease: true` (the loader's
 * default) the prefetcher waits for each copy before asking for the next batch, which is
 * correct but serializes host and copy on a GPU.
 *
 * @example CIFAR-shaped batches through the CPU backend
 * ```ts
 * import { DataLoader, Device, DevicePrefetcher, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * using device = Device.open("cpu");
 * const n = 8;
 * const ds = new TensorDataset({
 *   image: { data: new Uint8Array(n * 3 * 32 * 32).fill(255), shape: [3, 32, 32] },
 *   label: { data: new Int32Array(n).map((_, i) => i % 10), shape: [] },
 * });
 * await using loader = new DataLoader(ds, {
 *   batchSize: 4, augment: { padding: 4, flip: true }, autoRelease: false, seed: 1,
 * });
 * // The crop padding comes from the loader (loader.augment.padding).
 * await using prefetcher = new DevicePrefetcher(loader, device, {
 *   mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5],
 * });
 * let seen = 0;
 * for await (const batch of prefetcher) {
 *   assert.deepStrictEqual(batch.images.shape, [4, 3, 32, 32]);
 *   assert.strictEqual(batch.images.dtype, "f16");
 *   seen += batch.size;
 * }
 * assert.strictEqual(seen, n);
 * assert.strictEqual(prefetcher.stats?.samples, n);
 * assert.strictEqual(prefetcher.padding, 4);
 * ```
 */
export class DevicePrefetcher implements AsyncIterable<DeviceBatch>, AsyncDisposable {
  /** The loader batches come from. */
  readonly loader: DataLoader<unknown>;
  /** The device batches go to. */
  readonly device: Device;
  /** Batches in flight besides the one the consumer holds. */
  readonly depth: number;
  /** Where the augmentation runs. */
  readonly augmentOn: "device" | "host";
  /** Output element type. */
  readonly dtype: ImageDtype;
  /** Crop padding of the loader's parameters. */
  readonly padding: number;
  /** Ring pinning strategy. */
  readonly pin: "register" | "alloc" | "none";
  /** Whether batches are always copied, or read in place where the backend allows. */
  readonly copy: "auto" | "always";
  /** Every finished epoch's stats, oldest first. */
  readonly history: PipelineStats[] = [];

  #layout: ImageLayout;
  #imageField: string;
  #labelField: string;
  #affine: NormalizeAffine | undefined;
  #userStream: Stream | undefined;
  #persistent: boolean;
  readonly #lease = new RingLease<Resources, EpochRun>(this.history);
  #disposed = false;
  /** decodeOn "device": nvJPEG once opened, or why it cannot run (then the workers decode). */
  #nvjpeg: NvjpegDecoder | string | undefined;
  #decoding: AsyncGenerator<DecodedBatch> | undefined;

  /**
   * Checks the loader's ring and the options; nothing native is allocated until the first
   * epoch starts.
   *
   * @param loader A DataLoader on the zero-copy path (its dataset has shared fields).
   * @param device The target device.
   * @param options See {@linkcode ToDeviceOptions}.
   * @throws {TypeError} When the loader has no staging ring (not zero-copy), an option key
   * is unknown or an option has the wrong type.
   * @throws {RangeError} When an option is out of range, `mean`/`std` do not hold one valid
   * value per image channel, `padding` differs from the loader's `augment.padding`, or a
   * ring field is missing or has an unusable type or shape.
   * @throws {Error} When another DevicePrefetcher, not yet disposed, is attached to the
   * loader.
   */
  constructor(loader: DataLoader<unknown>, device: Device, options: ToDeviceOptions = {}) {
    const action = "create a DevicePrefetcher";
    if (options === null || typeof options !== "object") {
      throw new TypeError(`Cannot ${action}: options must be an object, got ${String(options)}`);
    }
    refuseUnknownKeys(options, OPTION_NAMES, action, OPTION_HINTS);
    if (loader.ring === undefined) {
      throw new TypeError(
        `Cannot ${action}: the loader has no staging ring (zero-copy path); use a dataset ` +
          `with shared fields and a batchSize, or move its batches as they are with ` +
          `toDevice(loader, device) (a BatchPrefetcher)`,
      );
    }
    this.loader = loader;
    this.device = device;
    const depth = options.depth ?? DEFAULT_DEPTH;
    if (!Number.isInteger(depth) || depth < 1 || depth > 64) {
      throw new RangeError(`Cannot ${action}: depth must be an integer in 1..64, got ${depth}`);
    }
    this.depth = depth;
    this.augmentOn = oneOf(options.augmentOn ?? "device", ["device", "host"], "augmentOn");
    this.dtype = oneOf(options.dtype ?? "f16", ["f16", "f32"], "dtype");
    this.pin = oneOf(options.pin ?? "register", ["register", "alloc", "none"], "pin");
    this.copy = oneOf(options.copy ?? "auto", ["auto", "always"], "copy");
    this.#layout = oneOf(
      options.layout ?? (loader.geometry ? "nhwc" : "nchw"),
      ["nchw", "nhwc"],
      "layout",
    );
    if (loader.geometry && this.#layout !== "nhwc") {
      throw new TypeError(
        `Cannot ${action}: layout "nchw" with the loader's geometry option; its images are ` +
          `[height, width, channels] (leave layout out, or pass "nhwc")`,
      );
    }
    this.#imageField = fieldName(options.imageField ?? "image", "imageField");
    this.#labelField = fieldName(options.labelField ?? "label", "labelField");
    this.padding = cropPadding(options.padding, loader.augment);
    if (options.stream !== undefined && !(options.stream instanceof Stream)) {
      throw new TypeError(
        `Cannot ${action}: stream must be a Stream, got ${describe(options.stream)}`,
      );
    }
    this.#userStream = options.stream;
    if (options.persistent !== undefined && typeof options.persistent !== "boolean") {
      throw new TypeError(
        `Cannot ${action}: persistent must be a boolean, got ${describe(options.persistent)}`,
      );
    }
    this.#persistent = options.persistent ?? false;
    // Validate the ring now, so a wrong field name fails at construction.
    const g = geometry(
      loader.ring,
      this.#imageField,
      this.#labelField,
      this.#layout,
      loader.geometry,
    );
    // One value per channel, checked here: the kernel reads `c` constants from the arrays
    // (past the end of shorter ones) and the host path would make NaN of the missing ones.
    this.#affine = normalizeAffine(
      perChannel(options.mean, "mean", g.c, 0),
      perChannel(options.std, "std", g.c, 1),
    );
    if (attached.has(loader.ring)) {
      throw new Error(
        `Cannot ${action}: the DataLoader's staging ring is already attached to another ` +
          `DevicePrefetcher; dispose that one first (a loader feeds one prefetcher at a time)`,
      );
    }
    attached.set(loader.ring, this);
  }

  /** The epoch in progress, else the last finished one (undefined before any). */
  get stats(): PipelineStats | undefined {
    return this.#lease.stats();
  }

  /**
   * Starts an epoch of the loader and yields its batches on the device. Leaving the loop
   * early (break, throw) stops the loader's epoch and frees the pipeline's native
   * resources once the copies in flight have completed.
   *
   * Overlapping `next()` calls run one after another, in call order.
   *
   * @returns An async iterator over device batches.
   * @throws {Error} When disposed, or when another epoch of this prefetcher is running.
   */
  [Symbol.asyncIterator](): AsyncIterableIterator<DeviceBatch> {
    if (this.#disposed) throw new Error("Cannot iterate: the DevicePrefetcher is disposed");
    if (this.#lease.active !== undefined || this.#decoding !== undefined) {
      throw new Error("Cannot iterate: an epoch of this DevicePrefetcher is still running");
    }
    const decoder = this.#jpegDecoder();
    if (decoder !== undefined) return this.#decodeEpoch(decoder);
    const run = new EpochRun(this, this.#resources());
    this.#lease.active = run;
    return run;
  }

  /**
   * With a dataset of `decodeOn: "device"`: nvJPEG where it runs (the workers then hand the
   * files' bytes on), else undefined after one line saying why (the workers decode).
   */
  #jpegDecoder(): NvjpegDecoder | undefined {
    const ds = this.loader.dataset as { decodeOn?: string; deviceBytes?: boolean };
    if (
      ds.decodeOn !== "device" || !this.loader.ring?.fields.some((f) => f.name === "jpegLength")
    ) {
      return undefined;
    }
    if (this.#nvjpeg === undefined) {
      let why: string | undefined;
      if (this.loader.geometry === undefined) why = "the DataLoader has no geometry option";
      else if (this.augmentOn !== "device") why = 'augmentOn "host" is asked for';
      else if (this.#labelField !== "label" || this.#imageField !== "image") {
        why = "imageField or labelField is not the dataset's";
      } else if (this.#persistent) why = "persistent is asked for";
      const d = why === undefined
        ? openNvjpeg(this.device)
        : `JPEG decoding stays on the workers: ${why}`;
      this.#nvjpeg = d;
      ds.deviceBytes = typeof d !== "string";
      if (typeof d === "string") console.error(`pinstream: decodeOn "device": ${d}`);
    }
    return typeof this.#nvjpeg === "string" ? undefined : this.#nvjpeg;
  }

  #decodeEpoch(decoder: NvjpegDecoder): AsyncIterableIterator<DeviceBatch> {
    const gen = decodedBatches({
      loader: this.loader,
      device: this.device,
      decoder,
      dtype: this.dtype,
      padding: this.padding,
      affine: this.#affine!,
      stream: this.#userStream,
      labelField: this.#labelField,
      serial: () => this._serialKernel(),
    });
    this.#decoding = gen;
    const start = performance.now();
    let batches = 0, samples = 0, epoch = -1;
    const end = () => {
      if (this.#decoding !== gen) return;
      this.#decoding = undefined;
      const wallMs = performance.now() - start;
      this.history.push({
        epoch,
        batches,
        samples,
        wallMs,
        waitMs: 0,
        hostWaitMs: 0,
        deviceWaitMs: 0,
        copyMs: 0,
        copiesTimed: 0,
        copyBytes: 0,
        inputBoundFraction: 0,
        samplesPerSecond: wallMs > 0 ? samples / (wallMs / 1000) : 0,
      });
    };
    const it: AsyncIterableIterator<DeviceBatch> = {
      next: async () => {
        try {
          const r = await gen.next();
          if (r.done) end();
          else batches++, samples += r.value.size, epoch = r.value.epoch;
          return r as IteratorResult<DeviceBatch>;
        } catch (err) {
          end();
          throw err;
        }
      },
      return: async () => {
        try {
          await gen.return(undefined);
        } finally {
          end();
        }
        return { done: true, value: undefined };
      },
      [Symbol.asyncIterator]: () => it,
    };
    return it;
  }

  /**
   * Frees every native resource (after the copies in flight have completed) and stops a
   * running epoch. Idempotent. Does not dispose the loader, which can then feed a new
   * prefetcher.
   */
  async dispose(): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    try {
      await this.#lease.active?.return();
      await this.#decoding?.return(undefined);
      await this._freeResources();
    } finally {
      if (typeof this.#nvjpeg === "object") {
        this.#nvjpeg.dispose();
        (this.loader.dataset as { deviceBytes?: boolean }).deviceBytes = false;
      }
      const ring = this.loader.ring!;
      if (attached.get(ring) === this) attached.delete(ring);
    }
  }

  /** Same as `dispose()`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.dispose();
  }

  /** @internal */
  _affine(): NormalizeAffine {
    return this.#affine!;
  }

  /**
   * @internal Whether the CPU backend should run the fused kernel on the calling thread alone:
   * when the loader's workers leave no core free (read per batch: autotuning moves the count).
   * Split anyway, the kernel's helper thread took a worker's core: on 2 cores with 1 worker
   * the pipeline ran at 0.65-0.98M samples/s split against 1.22-1.54M serial.
   */
  _serialKernel(): boolean {
    const workers = this.loader.numWorkers;
    return this.device.kind === "cpu" && workers > 0 &&
      workers + 1 >= (navigator.hardwareConcurrency ?? 1);
  }

  /** @internal Called by an epoch when it ends. */
  async _epochEnded(run: EpochRun, stats: PipelineStats, early: boolean): Promise<void> {
    await this.#lease.ended(run, stats, early || !this.#persistent || this.#disposed);
  }

  /** @internal */
  async _freeResources(): Promise<void> {
    await this.#lease.free();
  }

  #resources(): Resources {
    this.#lease.ring ??= new Resources(this, {
      geometry: geometry(
        this.loader.ring!,
        this.#imageField,
        this.#labelField,
        this.#layout,
        this.loader.geometry,
      ),
      layout: this.#layout,
      userStream: this.#userStream,
    });
    return this.#lease.ring;
  }
}

/**
 * Which path {@linkcode toDevice} takes: "images" (the {@linkcode DevicePrefetcher}: uint8
 * images normalized and cast on the device, int32 labels), "any" (the
 * {@linkcode BatchPrefetcher}: every typed array of the batch copied as it is), or "auto"
 * (the default): "images" when the loader's staging ring has the image and label fields (or an
 * option of the image path is given), "any" otherwise.
 */
export type ToDeviceBatch = "auto" | "images" | "any";

/**
 * What {@linkcode toDevice} returns for a loader whose batches are of type `B` with
 * `batch: "auto"`: a {@linkcode DevicePrefetcher} for ring batches with `image` and `label`
 * fields, a {@linkcode BatchPrefetcher} for every other known batch type, and either where the
 * type does not tell (`unknown`).
 *
 * @typeParam B the loader's batch type
 */
export type ToDeviceResult<B> = unknown extends B ? DevicePrefetcher | BatchPrefetcher<B>
  : [B] extends [RingBatch<infer F>] ? "image" | "label" extends keyof F ? DevicePrefetcher
    : BatchPrefetcher<B>
  : BatchPrefetcher<B>;

/** {@linkcode ToDeviceOptions} with at least one option only the image path takes. */
export type ImagePathOptions =
  & ToDeviceOptions
  & {
    [K in Exclude<keyof ToDeviceOptions, keyof BatchPrefetcherOptions>]: Required<
      Pick<ToDeviceOptions, K>
    >;
  }[Exclude<keyof ToDeviceOptions, keyof BatchPrefetcherOptions>];

// The options only the image path understands (giving one picks it), checked by the compiler.
const IMAGE_ONLY = Object.keys(
  {
    augmentOn: true,
    dtype: true,
    mean: true,
    std: true,
    padding: true,
    imageField: true,
    labelField: true,
    layout: true,
    pin: true,
  } satisfies Record<Exclude<keyof ToDeviceOptions, keyof BatchPrefetcherOptions>, true>,
) as (keyof ToDeviceOptions)[];

/**
 * A loader's batches on `device`, `depth` ahead: PyTorch's `pin_memory` and
 * `.to(device, non_blocking=True)` as one prefetcher. With image-ring batches (uint8 `image`,
 * integer `label`) it is `new DevicePrefetcher(loader, device, options)`: one fused kernel per
 * batch crops, flips, normalizes and casts. With any other batch (a `collate`'s nested objects
 * and arrays of typed arrays, ring batches of other fields) it is
 * `new BatchPrefetcher(loader, device, options)`: every typed array staged in pinned memory and
 * copied as it is. `batch: "any"` or `batch: "images"` picks the path explicitly.
 *
 * @param loader A DataLoader; ideally with `autoRelease: false` on the image path.
 * @param device The target device.
 * @param options See {@linkcode ToDeviceOptions} (images) and
 *   {@linkcode BatchPrefetcherOptions} (any batch), plus `batch` ({@linkcode ToDeviceBatch}).
 * @returns The prefetcher; iterate it once per epoch, dispose it when done.
 * @throws {TypeError} See {@linkcode DevicePrefetcher} and {@linkcode BatchPrefetcher}; also
 *   when an option of the image path is given with `batch: "any"`.
 * @throws {RangeError} See {@linkcode DevicePrefetcher}.
 *
 * @example Host-side augmentation for comparison
 * ```ts
 * import { DataLoader, Device, TensorDataset, toDevice } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * using device = Device.open("cpu");
 * const ds = new TensorDataset({
 *   image: { data: new Uint8Array(2 * 3 * 8 * 8), shape: [3, 8, 8] },
 *   label: { data: new Uint8Array([3, 7]), shape: [] },
 * });
 * await using loader = new DataLoader(ds, { batchSize: 2, autoRelease: false });
 * await using p = toDevice(loader, device, { augmentOn: "host", dtype: "f32" });
 * for await (const b of p) {
 *   assert.deepStrictEqual([...await b.labels.toHost()], [3, 7]);
 * }
 * ```
 *
 * @example Token ids and their mask, nested, from a collate
 * ```ts
 * import { DataLoader, Device, toDevice } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * using device = Device.open("cpu");
 * const dataset = { length: 4, get: (i: number) => i };
 * await using loader = new DataLoader(dataset, {
 *   batchSize: 2,
 *   collate: (ids: number[]) => ({
 *     inputs: { ids: new Int32Array(ids.flatMap((i) => [i, i + 1, i + 2])), mask: new Uint8Array(6).fill(1) },
 *     target: new Float32Array(ids),
 *   }),
 * });
 * await using feed = toDevice(loader, device);
 * for await (const batch of feed) {
 *   assert.deepStrictEqual(batch.inputs.ids.shape, [2, 3]);
 *   assert.deepStrictEqual(batch.target.shape, [2]);
 *   assert.strictEqual(batch.inputs.mask.dtype, "u8");
 * }
 * ```
 */
export function toDevice<B>(
  loader: DataLoader<B>,
  device: Device,
  options: BatchPrefetcherOptions & { batch: "any" },
): BatchPrefetcher<B>;
/**
 * `batch: "images"`: the image path; see the first signature.
 *
 * @param loader The DataLoader.
 * @param device The target device.
 * @param options The options.
 * @returns The image prefetcher.
 */
export function toDevice<B>(
  loader: DataLoader<B>,
  device: Device,
  options: ToDeviceOptions & { batch: "images" },
): DevicePrefetcher;
/**
 * An option of the image path picks it; see the first signature.
 *
 * @param loader The DataLoader.
 * @param device The target device.
 * @param options The options.
 * @returns The image prefetcher.
 */
export function toDevice<B>(
  loader: DataLoader<B>,
  device: Device,
  options: ImagePathOptions & { batch?: "auto" },
): DevicePrefetcher;
/**
 * `batch: "auto"` (the default): the path the loader's batches call for; see the first signature.
 *
 * @param loader The DataLoader.
 * @param device The target device.
 * @param options The options.
 * @returns The prefetcher ({@linkcode ToDeviceResult}).
 */
export function toDevice<B>(
  loader: DataLoader<B>,
  device: Device,
  options?: ToDeviceOptions & { batch?: "auto" },
): ToDeviceResult<B>;
export function toDevice<B>(
  loader: DataLoader<B>,
  device: Device,
  options: ToDeviceOptions & { batch?: ToDeviceBatch } = {},
): DevicePrefetcher | BatchPrefetcher<B> {
  const action = "move batches to the device";
  if (options === null || typeof options !== "object") {
    throw new TypeError(`Cannot ${action}: options must be an object, got ${String(options)}`);
  }
  const { batch = "auto", ...rest } = options;
  if (batch !== "auto" && batch !== "images" && batch !== "any") {
    throw new RangeError(`Cannot ${action}: batch must be one of auto, images, any, got ${batch}`);
  }
  const path: ToDeviceBatch = batch;
  const imageOptions = IMAGE_ONLY.filter((k) => rest[k] !== undefined);
  const images = path === "images" ||
    (path === "auto" && (imageOptions.length > 0 || isImageRing(loader.ring, rest)));
  if (images) return new DevicePrefetcher(loader as DataLoader<unknown>, device, rest);
  if (imageOptions.length > 0) {
    throw new TypeError(
      `Cannot ${action}: ${imageOptions.join(", ")} ${
        imageOptions.length === 1 ? "is an option" : "are options"
      } of the image path, which batch: "any" does not take`,
    );
  }
  return new BatchPrefetcher(loader, device, rest as BatchPrefetcherOptions);
}

/** Whether a loader's ring holds what the image path needs: uint8 images and labels. */
function isImageRing(ring: StagingRing | undefined, o: ToDeviceOptions): boolean {
  if (ring === undefined) return false;
  const has = (n: string) => ring.fields.some((f) => f.name === n);
  const image = o.imageField ?? "image", label = o.labelField ?? "label";
  return has(image) && has(label) && ring.field(image).dtype === "u8";
}
