/**
 * Datasets of image files: {@linkcode ImageFileList} (paths and labels, from arrays or a CSV)
 * and the base {@linkcode ImageFiles} that ImageFolder shares. A sample is read and decoded
 * where it is loaded (a worker, or the main thread with `numWorkers: 0`); the decoders
 * (decode/, native libraries through FFI) are imported on the first decode, so a loader over
 * other datasets never needs FFI. The paths live in shared memory, so workers rebuild the
 * dataset without copying them.
 *
 * @module
 */

import { refuseUnknownKeys } from "../../internal/options.ts";
import {
  afterLoaderDraws,
  type Dataset,
  type FilledField,
  type SampleContext,
  type SharedField,
  SKIP_SAMPLE,
  type WorkerSpec,
} from "../dataset.ts";
import { getWorkerInfo } from "../worker_info.ts";
import type { DecodedImage, ImageDecoder } from "../../decode/mod.ts";
import { readJpegInto } from "./_jpeg_bytes.ts";

/** What a bad file does: fail the batch naming it ("raise"), or skip it and count it. */
export type OnError = "raise" | "skip";

/** Decoding options of the image datasets. */
export interface ImageFilesOptions {
  /** 1 grey, 3 RGB (default, as torchvision's loader), 4 RGBA. */
  channels?: 1 | 3 | 4;
  /**
   * Decode every image to this `[height, width]` (DCT-downscaled JPEG where the size allows,
   * then bilinear with antialiasing, Pillow's arithmetic). Without it, images keep their own
   * size and a sample says it.
   */
  size?: readonly [number, number];
  /**
   * torchvision's `RandomResizedCrop`: per sample, a region of `scale` (default [0.08, 1]) of
   * the image's area and aspect ratio in `ratio` (default [3/4, 4/3], drawn log-uniform) from
   * the sample's random stream, resized to `size` (a side or [height, width]). A JPEG is
   * decoded at the smallest DCT scale that keeps the region at least `size`. Replaces `size`.
   */
  randomResizedCrop?: RandomResizedCrop;
  /**
   * Variable-size images on the zero-copy path: each image is decoded at its own size into a
   * ring slot of `[height, width]` (shrunk, keeping its aspect ratio, when larger), and its
   * size goes into the int32 [2] field `imageSize` beside it, so a DataLoader's `geometry`
   * (RandomResizedCrop, Resize, CenterCrop, RandomRotation) crops and resizes it on the
   * device. Excludes `size` and `randomResizedCrop`.
   */
  maxSize?: readonly [number, number];
  /**
   * Where JPEGs are decoded: "workers" (default) or "device": with `maxSize`, the workers read
   * each JPEG's bytes into its slot (the length in the int32 field `jpegLength`; -1 for a file
   * they decode: a PNG, a CMYK, turned or too large JPEG), and `toDevice` decodes them with
   * nvJPEG before the loader's `geometry` and `augment`; where it cannot, one line says why and
   * the workers decode all. Needs `channels` 3 and onError "raise".
   */
  decodeOn?: "workers" | "device";
  /** "auto" (default): libjpeg-turbo and libspng where they load, else the TypeScript decoders. */
  decoder?: "auto" | "native" | "typescript";
  /** Refuse larger images (default: Pillow's decompression-bomb limit, 178,956,970 pixels). */
  maxPixels?: number;
  /** Turn images upright by their EXIF orientation (default true; torchvision does not). */
  exifOrientation?: boolean;
  /** "raise" (default) or "skip": a bad file is left out of its batch and counted. */
  onError?: OnError;
  /** Print which decoders run, once, from the main thread or worker 0 (default true). */
  verbose?: boolean;
}

/** The options of torchvision's `RandomResizedCrop`. */
export interface RandomResizedCrop {
  /** Output side, or [height, width]. */
  size: number | readonly [number, number];
  /** Range of the region's share of the image area (default [0.08, 1]). */
  scale?: readonly [number, number];
  /** Range of the region's aspect ratio, width / height (default [3/4, 4/3]). */
  ratio?: readonly [number, number];
}

/** Python's round(): halves to even. */
function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * torchvision's `RandomResizedCrop.get_params`: ten tries at a region of the drawn area and
 * aspect ratio that fits, else the central crop clamped to the ratio range.
 *
 * @param height image rows
 * @param width image columns
 * @param scale area share range
 * @param ratio aspect ratio range
 * @param random a uniform [0, 1) draw
 * @returns the region
 * @example A region always fits the image
 * ```ts
 * import { randomResizedCropBox } from "./image_files.ts";
 * import assert from "node:assert";
 * let seed = 1;
 * const random = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
 * for (let i = 0; i < 100; i++) {
 *   const b = randomResizedCropBox(375, 500, [0.08, 1], [3 / 4, 4 / 3], random);
 *   assert.ok(b.top >= 0 && b.left >= 0 && b.top + b.height <= 375 && b.left + b.width <= 500);
 * }
 * ```
 */
export function randomResizedCropBox(
  height: number,
  width: number,
  scale: readonly [number, number],
  ratio: readonly [number, number],
  random: () => number,
): { top: number; left: number; height: number; width: number } {
  const area = height * width;
  const lo = Math.log(ratio[0]), hi = Math.log(ratio[1]);
  for (let k = 0; k < 10; k++) {
    const target = area * (scale[0] + (scale[1] - scale[0]) * random());
    const aspect = Math.exp(lo + (hi - lo) * random());
    const w = roundHalfEven(Math.sqrt(target * aspect));
    const h = roundHalfEven(Math.sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const top = Math.floor(random() * (height - h + 1));
      const left = Math.floor(random() * (width - w + 1));
      return { top, left, height: h, width: w };
    }
  }
  const inRatio = width / height;
  let w = width, h = height;
  if (inRatio < Math.min(...ratio)) h = roundHalfEven(w / Math.min(...ratio));
  else if (inRatio > Math.max(...ratio)) w = roundHalfEven(h * Math.max(...ratio));
  return {
    top: Math.floor((height - h) / 2),
    left: Math.floor((width - w) / 2),
    height: h,
    width: w,
  };
}

/** The option names of {@linkcode ImageFilesOptions}. */
export const IMAGE_FILES_KEYS = [
  "channels",
  "size",
  "randomResizedCrop",
  "maxSize",
  "decodeOn",
  "decoder",
  "maxPixels",
  "exifOrientation",
  "onError",
  "verbose",
] as const;

/** One decoded sample: HWC pixels, its label and size. */
export interface ImageSample {
  /** `height * width * channels` bytes, HWC. */
  image: Uint8Array;
  /** Class index. */
  label: number;
  /** Rows. */
  height: number;
  /** Columns. */
  width: number;
}

/** File paths in shared memory: UTF-8 bytes and the end of each path. */
export interface PathTable {
  /** The paths' UTF-8 bytes, one after another. */
  bytes: SharedArrayBuffer;
  /** Float64 end offset of each path in `bytes`. */
  ends: SharedArrayBuffer;
}

/** Packs paths into shared memory. */
export function packPaths(paths: readonly string[]): PathTable {
  const enc = new TextEncoder();
  const encoded = paths.map((p) => enc.encode(p));
  const total = encoded.reduce((s, e) => s + e.length, 0);
  const bytes = new SharedArrayBuffer(Math.max(1, total));
  const ends = new SharedArrayBuffer(Math.max(1, paths.length) * 8);
  const b = new Uint8Array(bytes), e = new Float64Array(ends);
  let at = 0;
  encoded.forEach((p, i) => {
    b.set(p, at);
    at += p.length;
    e[i] = at;
  });
  return { bytes, ends };
}

/** What a worker rebuilds an image dataset from (the memory is shared, not copied). */
export interface ImageFilesState {
  /** The files' paths. */
  paths: PathTable;
  /** One int32 label per file. */
  labels: SharedArrayBuffer;
  /** Number of files. */
  length: number;
  /** Class names by index. */
  classes: string[];
  /** The checked options. */
  options: Omit<ImageFilesOptions, "verbose" | "randomResizedCrop"> & {
    verbose: boolean;
    /** RandomResizedCrop's ranges (its size is `size`). */
    crop?: { scale: readonly [number, number]; ratio: readonly [number, number] };
  };
  /** [skipped count], shared by every thread. */
  skipped: SharedArrayBuffer;
  /** [1 while the workers hand JPEG bytes to a device decoder], with decodeOn "device". */
  deviceBytes: SharedArrayBuffer;
}

function checkOptions(o: ImageFilesOptions, what: string): void {
  const action = `create ${what}`;
  if (o.channels !== undefined && ![1, 3, 4].includes(o.channels)) {
    throw new RangeError(`Cannot ${action}: channels should be 1, 3 or 4, got ${o.channels}`);
  }
  if (
    o.size !== undefined &&
    !(Array.isArray(o.size) && o.size.length === 2 &&
      o.size.every((s) => Number.isInteger(s) && s > 0))
  ) {
    throw new RangeError(
      `Cannot ${action}: size should be [height, width] of positive integers, got ${
        JSON.stringify(o.size)
      }`,
    );
  }
  if (
    o.maxSize !== undefined &&
    !(Array.isArray(o.maxSize) && o.maxSize.length === 2 &&
      o.maxSize.every((s) => Number.isInteger(s) && s > 0))
  ) {
    throw new RangeError(
      `Cannot ${action}: maxSize should be [height, width] of positive integers, got ${
        JSON.stringify(o.maxSize)
      }`,
    );
  }
  if (o.maxSize !== undefined && (o.size !== undefined || o.randomResizedCrop !== undefined)) {
    throw new TypeError(
      `Cannot ${action}: maxSize (variable-size images) excludes size and randomResizedCrop ` +
        "(crop and resize on the device with the DataLoader's geometry option instead)",
    );
  }
  if (o.decodeOn !== undefined && o.decodeOn !== "workers" && o.decodeOn !== "device") {
    const got = JSON.stringify(o.decodeOn);
    throw new RangeError(`Cannot ${action}: decodeOn should be "workers" or "device", got ${got}`);
  }
  if (o.decodeOn === "device") {
    const why = o.maxSize === undefined
      ? "maxSize (the largest image a slot holds; crop and resize with the DataLoader's geometry)"
      : (o.channels ?? 3) !== 3
      ? `channels 3 (nvJPEG decodes to RGB), got ${o.channels}`
      : o.onError === "skip"
      ? 'onError "raise" (a skipped file would leave a hole in the batch)'
      : undefined;
    if (why !== undefined) throw new TypeError(`Cannot ${action}: decodeOn "device" needs ${why}`);
  }
  if (o.onError !== undefined && o.onError !== "raise" && o.onError !== "skip") {
    throw new RangeError(
      `Cannot ${action}: onError should be "raise" or "skip", got ${JSON.stringify(o.onError)}`,
    );
  }
  if (o.maxPixels !== undefined && !(Number.isFinite(o.maxPixels) && o.maxPixels > 0)) {
    throw new RangeError(
      `Cannot ${action}: maxPixels should be a positive number, got ${o.maxPixels}`,
    );
  }
  if (o.decoder !== undefined && !["auto", "native", "typescript"].includes(o.decoder)) {
    throw new RangeError(
      `Cannot ${action}: decoder should be "auto", "native" or "typescript", got ${
        JSON.stringify(o.decoder)
      }`,
    );
  }
}

/** Decoders already announced in this thread (the line is printed once). */
let announced = false;

/**
 * A dataset of image files with one label each, decoded on load: the base of
 * {@linkcode ImageFolder} and {@linkcode ImageFileList}.
 *
 * @example A fixed size takes the zero-copy path: labels shared, images filled by the workers
 * ```ts
 * import { ImageFileList, type ImageFiles } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ds: ImageFiles = new ImageFileList(["a.jpg", "b.png"], [0, 1], { size: [32, 32] });
 * assert.deepStrictEqual(ds.filledFields!()[0].shape, [32, 32, 3]);
 * assert.deepStrictEqual([...new Int32Array(ds.sharedFields!()[0].buffer, 0, 2)], [0, 1]);
 * assert.strictEqual(ds.skipped, 0);
 * ```
 */
export class ImageFiles implements Dataset<ImageSample> {
  /** Number of images. */
  readonly length: number;
  /** Class names, by index. */
  readonly classes: readonly string[];
  /** Class name to index. */
  readonly classToIndex: Readonly<Record<string, number>>;
  /** Label of each image, in shared memory. */
  readonly labels: Int32Array;
  /**
   * With a fixed `size` (and `onError: "raise"`): the labels, so the DataLoader takes its
   * zero-copy path, where the workers decode each image straight into the ring slot.
   */
  readonly sharedFields?: () => readonly [SharedField<"label", "i32">];
  /**
   * With `sharedFields`: the decoded image, `[height, width, channels]` bytes (HWC); with
   * `maxSize`, also each image's int32 `[height, width]` (its pixels packed at the start of
   * its slot).
   */
  readonly filledFields?: () =>
    | readonly [FilledField<"image", "u8">]
    | readonly [FilledField<"image", "u8">, FilledField<"imageSize", "i32">]
    | readonly [
      FilledField<"image", "u8">,
      FilledField<"imageSize", "i32">,
      FilledField<"jpegLength", "i32">,
    ];
  readonly #state: ImageFilesState;
  readonly #pathBytes: Uint8Array;
  readonly #ends: Float64Array;
  readonly #skipped: Int32Array;
  readonly #deviceBytes: Int32Array;
  #decoder: ImageDecoder | undefined;
  /** decode/'s resize, loaded with the decoders. */
  #resize: typeof import("../../decode/mod.ts").resizeBilinear | undefined;
  /** decode/, loaded with the decoders (its header readers serve decodeOn "device"). */
  #decodeModule: typeof import("../../decode/mod.ts") | undefined;
  /**
   * maxSize: the height and width of images decoded into the ring whose size field is still to
   * fill, and how many occurrences in the batch still need it.
   */
  readonly #sizes = new Map<number, [number, number, number, number]>();
  #warned = new Set<number>();

  /** Views a state (use {@linkcode ImageFileList} or `ImageFolder` to make one). */
  protected constructor(state: ImageFilesState) {
    this.#state = state;
    this.length = state.length;
    this.classes = state.classes;
    this.classToIndex = Object.fromEntries(state.classes.map((c, i) => [c, i]));
    this.labels = new Int32Array(state.labels, 0, state.length);
    this.#pathBytes = new Uint8Array(state.paths.bytes);
    this.#ends = new Float64Array(state.paths.ends, 0, state.length);
    this.#skipped = new Int32Array(state.skipped);
    this.#deviceBytes = new Int32Array(state.deviceBytes);
    const size = state.options.size, max = state.options.maxSize;
    // A skipped file would leave a hole in a fixed-size batch: skipping takes the generic path.
    if ((size !== undefined || max !== undefined) && state.options.onError !== "skip") {
      const slot = size ?? max!;
      const shape = [slot[0], slot[1], state.options.channels ?? 3];
      this.sharedFields = () => [{ name: "label", dtype: "i32", shape: [], buffer: state.labels }];
      this.filledFields = max === undefined
        ? () => [{ name: "image", dtype: "u8", shape }]
        : state.options.decodeOn === "device"
        ? () => [
          { name: "image", dtype: "u8", shape },
          { name: "imageSize", dtype: "i32", shape: [2] },
          { name: "jpegLength", dtype: "i32", shape: [] },
        ]
        : () => [
          { name: "image", dtype: "u8", shape },
          { name: "imageSize", dtype: "i32", shape: [2] },
        ];
    }
  }

  /** Builds the state of `paths` and `labels` with checked options. */
  protected static makeState(
    paths: readonly string[],
    labels: ArrayLike<number>,
    classes: string[],
    options: ImageFilesOptions,
    what: string,
    extraKeys: readonly string[] = [],
  ): ImageFilesState {
    refuseUnknownKeys(options, [...IMAGE_FILES_KEYS, ...extraKeys], `create ${what}`);
    checkOptions(options, what);
    const lab = new Int32Array(new SharedArrayBuffer(Math.max(1, paths.length) * 4));
    for (let i = 0; i < paths.length; i++) lab[i] = labels[i];
    const { verbose, randomResizedCrop: rrc, ...rest } = options;
    for (const k of extraKeys) delete (rest as Record<string, unknown>)[k];
    let crop: ImageFilesState["options"]["crop"];
    if (rrc !== undefined) {
      const bad = (msg: string) => {
        throw new RangeError(`Cannot create ${what}: randomResizedCrop.${msg}`);
      };
      if (options.size !== undefined) {
        throw new TypeError(
          `Cannot create ${what}: both size and randomResizedCrop given (the crop's size is the output size)`,
        );
      }
      refuseUnknownKeys(rrc, ["size", "scale", "ratio"], `create ${what}: randomResizedCrop`);
      const side = typeof rrc.size === "number" ? [rrc.size, rrc.size] : rrc.size;
      checkOptions({ size: side as [number, number] }, what);
      rest.size = [side[0], side[1]];
      const scale = rrc.scale ?? [0.08, 1], ratio = rrc.ratio ?? [3 / 4, 4 / 3];
      if (!(scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1)) {
        bad(`scale should be [lo, hi] with 0 < lo <= hi <= 1, got ${JSON.stringify(scale)}`);
      }
      if (!(ratio[0] > 0 && ratio[0] <= ratio[1])) {
        bad(`ratio should be [lo, hi] with 0 < lo <= hi, got ${JSON.stringify(ratio)}`);
      }
      crop = { scale: [scale[0], scale[1]], ratio: [ratio[0], ratio[1]] };
    }
    return {
      paths: packPaths(paths),
      labels: lab.buffer as SharedArrayBuffer,
      length: paths.length,
      classes,
      options: { ...rest, verbose: verbose ?? true, crop },
      skipped: new SharedArrayBuffer(4),
      deviceBytes: new SharedArrayBuffer(4),
    };
  }

  /** Path of image `index`. */
  path(index: number): string {
    this.#check(index);
    const start = index === 0 ? 0 : this.#ends[index - 1];
    // TextDecoder refuses views of shared memory: copy the path's bytes out.
    return new TextDecoder().decode(this.#pathBytes.slice(start, this.#ends[index]));
  }

  /** Images skipped so far with `onError: "skip"`, counted by every worker. */
  get skipped(): number {
    return Atomics.load(this.#skipped, 0);
  }

  /** Where JPEGs are decoded, as asked ("device" may still fall back to the workers). */
  get decodeOn(): "workers" | "device" {
    return this.#state.options.decodeOn ?? "workers";
  }

  /** decodeOn "device": whether the workers hand JPEG bytes on (set by `toDevice`; between epochs). */
  get deviceBytes(): boolean {
    return Atomics.load(this.#deviceBytes, 0) === 1;
  }

  set deviceBytes(on: boolean) {
    if (on && this.decodeOn !== "device") {
      throw new Error('Cannot hand JPEG bytes to the device: the dataset has no decodeOn "device"');
    }
    Atomics.store(this.#deviceBytes, 0, on ? 1 : 0);
  }

  /** The fixed decode size, if any. */
  get size(): readonly [number, number] | undefined {
    return this.#state.options.size;
  }

  #check(index: number): void {
    if (!(index >= 0 && index < this.length) || !Number.isInteger(index)) {
      throw new RangeError(
        `Cannot get sample ${index}: index out of range for a dataset of length ${this.length}`,
      );
    }
  }

  /** Loads the decoders of this thread (once), printing which run when verbose. */
  async decoder(): Promise<ImageDecoder> {
    if (this.#decoder) return this.#decoder;
    const decode = await import("../../decode/mod.ts");
    const { ImageDecoder, resizeBilinear } = decode;
    this.#decodeModule = decode;
    this.#resize = resizeBilinear;
    const o = this.#state.options;
    this.#decoder = new ImageDecoder({
      channels: o.channels,
      backend: o.decoder,
      maxPixels: o.maxPixels,
      exifOrientation: o.exifOrientation,
    });
    const worker = getWorkerInfo();
    if (o.verbose && !announced && (worker === null || worker.id === 0)) {
      announced = true;
      console.error(`pinstream: ${this.#decoder.description}`);
    }
    return this.#decoder;
  }

  /**
   * Image `index`, decoded (a promise only until this thread's decoders are loaded).
   *
   * @param index sample index
   * @param context the sample's context (its random stream draws RandomResizedCrop's region)
   * @returns `{ image, label, height, width }`; with `onError: "skip"`, {@linkcode SKIP_SAMPLE}
   *   for a bad file
   * @throws {Error} naming the sample, the file and the reason, for a bad file
   */
  get(
    index: number,
    context?: SampleContext,
  ): ImageSample | typeof SKIP_SAMPLE | Promise<ImageSample | typeof SKIP_SAMPLE> {
    this.#check(index);
    if (this.#decoder === undefined) {
      return this.decoder().then(() => this.#load(index, undefined, context));
    }
    return this.#load(index, undefined, context);
  }

  /**
   * Decodes image `record` into `out` (the zero-copy path's fill; `size` is set).
   *
   * @param record sample index
   * @param _field 0, the image (the only filled field)
   * @param out `size[0] * size[1] * channels` bytes
   * @throws {Error} naming the sample, the file and the reason
   */
  fillRecord(record: number, field: number, out: Uint8Array, context?: SampleContext): void {
    this.#check(record);
    if (this.#decoder === undefined) {
      throw new Error("Cannot decode into the ring: prepareFill() was not awaited first");
    }
    if (field >= 1) {
      // The size (and byte count) of the image field 0 filled for this record (the gather
      // fills field 0 of the batch first).
      const hw = this.#sizes.get(record);
      if (hw === undefined) {
        throw new Error(`Cannot fill the size of sample ${record}: not decoded`);
      }
      const last = this.#state.options.decodeOn === "device" ? 2 : 1;
      // A sample may occur more than once in a batch: each occurrence decoded it once.
      if (field === last && --hw[2] === 0) this.#sizes.delete(record);
      const v = new DataView(out.buffer, out.byteOffset, 4 * (3 - field));
      if (field === 2) v.setInt32(0, hw[3], true);
      else {
        v.setInt32(0, hw[0], true);
        v.setInt32(4, hw[1], true);
      }
      return;
    }
    const max = this.#state.options.maxSize;
    if (Atomics.load(this.#deviceBytes, 0) === 1) {
      const o = this.#state.options;
      const read = readJpegInto(this.path(record), out, {
        maxSize: o.maxSize!,
        maxPixels: o.maxPixels,
        exifOrientation: o.exifOrientation,
      }, this.#decodeModule!);
      if (read !== undefined) {
        const seen = this.#sizes.get(record);
        this.#sizes.set(record, [read[0], read[1], (seen?.[2] ?? 0) + 1, read[2]]);
        return;
      }
    }
    const r = this.#load(record, max === undefined ? out : undefined, context, max && out);
    if (max !== undefined && r !== SKIP_SAMPLE) {
      const seen = this.#sizes.get(record);
      // -1: pixels, decoded here (for decodeOn "device", what the device does not decode).
      this.#sizes.set(record, [r.height, r.width, (seen?.[2] ?? 0) + 1, -1]);
    }
  }

  /** Loads this thread's decoders before the first fillRecord. */
  async prepareFill(): Promise<void> {
    await this.decoder();
  }

  #load(
    index: number,
    out?: Uint8Array,
    context?: SampleContext,
    slot?: Uint8Array,
  ): ImageSample | typeof SKIP_SAMPLE {
    const path = this.path(index);
    let img: DecodedImage;
    try {
      let bytes: Uint8Array;
      try {
        bytes = Deno.readFileSync(path);
      } catch (e) {
        throw new Error(`the file cannot be read (${(e as Error).message})`, { cause: e });
      }
      const c = this.#state.options.crop;
      // After the loader's own draws: the crop must not follow the sample's flip or offsets.
      const random = context ? afterLoaderDraws(context) : Math.random;
      img = this.#decoder!.decode(bytes, {
        size: this.#state.options.size,
        out: out ?? slot,
        crop: c && ((h, w) => randomResizedCropBox(h, w, c.scale, c.ratio, random)),
      });
      if (slot !== undefined) img = this.#intoSlot(img, slot);
    } catch (e) {
      const reason = (e as Error).message;
      if (this.#state.options.onError === "skip") {
        Atomics.add(this.#skipped, 0, 1);
        if (!this.#warned.has(index)) {
          this.#warned.add(index);
          console.error(`pinstream: skipped sample ${index} (${path}): ${reason}`);
        }
        return SKIP_SAMPLE;
      }
      throw new Error(`Cannot load sample ${index} (${path}): ${reason}`, { cause: e });
    }
    return { image: img.data, label: this.labels[index], height: img.height, width: img.width };
  }

  /**
   * maxSize: a decoded image packed at the start of its slot, shrunk (bilinear, antialiased,
   * keeping the aspect ratio) when it exceeds maxSize.
   */
  #intoSlot(img: DecodedImage, slot: Uint8Array): DecodedImage {
    const [mh, mw] = this.#state.options.maxSize!;
    const inSlot = img.data.buffer === slot.buffer && img.data.byteOffset === slot.byteOffset;
    if (img.height <= mh && img.width <= mw) {
      if (!inSlot) slot.set(img.data.subarray(0, img.height * img.width * img.channels));
      return { ...img, data: slot.subarray(0, img.height * img.width * img.channels) };
    }
    const f = Math.min(mh / img.height, mw / img.width);
    const h = Math.max(1, Math.min(mh, Math.round(img.height * f)));
    const w = Math.max(1, Math.min(mw, Math.round(img.width * f)));
    // Decoded into the slot (an upright image of fewer bytes): resize from a copy.
    const src = inSlot ? { ...img, data: img.data.slice() } : img;
    return this.#resize!(src, h, w, true, slot);
  }

  /** The state workers rebuild this dataset from. */
  protected state(): ImageFilesState {
    return this.#state;
  }

  /** How workers rebuild this dataset. */
  workerSpec(): WorkerSpec {
    return { module: import.meta.url, export: "ImageFiles.fromState", state: this.#state };
  }

  /** Rebuilds a dataset from its state (in a worker). */
  static fromState(state: ImageFilesState): ImageFiles {
    return new ImageFiles(state);
  }
}

/** Options of {@linkcode ImageFileList}. */
export interface ImageFileListOptions extends ImageFilesOptions {
  /**
   * Class names by index, for string labels (default: the sorted distinct labels) or to name
   * numeric ones.
   */
  classes?: readonly string[];
}

/** Options of {@linkcode ImageFileList.fromCsv}. */
export interface ImageFileListCsvOptions extends ImageFileListOptions {
  /** Column of the paths (default "path"). */
  pathColumn?: string;
  /** Column of the labels (default "label"). */
  labelColumn?: string;
  /** Directory relative paths are resolved against (default the CSV's directory). */
  root?: string;
}

/** Splits one CSV line (RFC 4180 quoting). */
function csvFields(line: string): string[] {
  const out: string[] = [];
  let cur = "", quoted = false;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i];
    if (quoted) {
      if (ch === '"' && line[i + 1] === '"') cur += '"', i++;
      else if (ch === '"') quoted = false;
      else cur += ch;
    } else if (ch === '"') quoted = true;
    else if (ch === ",") out.push(cur), cur = "";
    else cur += ch;
  }
  out.push(cur);
  return out;
}

/**
 * Images given as a list of paths with a label each (numbers, or class names mapped to their
 * index among the sorted names).
 *
 * @example
 * ```ts
 * import { ImageFileList } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ds = new ImageFileList(["a/cat1.jpg", "b/dog1.png", "a/cat2.jpg"], ["cat", "dog", "cat"]);
 * assert.deepStrictEqual(ds.classes, ["cat", "dog"]);
 * assert.deepStrictEqual([...ds.labels], [0, 1, 0]);
 * assert.strictEqual(ds.path(1), "b/dog1.png");
 * ```
 */
export class ImageFileList extends ImageFiles {
  /**
   * Makes the list from paths and labels.
   *
   * @param paths image files
   * @param labels one per path: class indices, or class names
   * @param options decoding options and class names
   * @throws {RangeError} when the counts differ or a label is not a class
   */
  constructor(
    paths: readonly string[],
    labels: readonly (number | string)[] | Int32Array,
    options: ImageFileListOptions = {},
  ) {
    super(ImageFileList.#state(paths, labels, options));
  }

  static #state(
    paths: readonly string[],
    labels: readonly (number | string)[] | Int32Array,
    options: ImageFileListOptions,
  ): ImageFilesState {
    if (paths.length !== labels.length) {
      throw new RangeError(
        `Cannot create ImageFileList: ${paths.length} paths but ${labels.length} labels`,
      );
    }
    const strings = Array.from(labels as ArrayLike<number | string>).some((l) =>
      typeof l === "string"
    );
    let classes: string[];
    let idx: number[];
    if (strings) {
      classes = options.classes
        ? [...options.classes]
        : [...new Set(labels as string[])].map(String).sort();
      const map = new Map(classes.map((c, i) => [c, i]));
      idx = Array.from(labels as ArrayLike<number | string>, (l, i) => {
        const k = map.get(String(l));
        if (k === undefined) {
          throw new RangeError(
            `Cannot create ImageFileList: label ${JSON.stringify(l)} of ${
              paths[i]
            } is not one of the classes`,
          );
        }
        return k;
      });
    } else {
      idx = Array.from(labels as ArrayLike<number>);
      const max = idx.reduce((m, v) => Math.max(m, v), -1);
      classes = options.classes
        ? [...options.classes]
        : Array.from({ length: max + 1 }, (_, i) => String(i));
      idx.forEach((l, i) => {
        if (!Number.isInteger(l) || l < 0 || l >= classes.length) {
          throw new RangeError(
            `Cannot create ImageFileList: label ${l} of ${paths[i]} should be an integer in 0..${
              classes.length - 1
            }`,
          );
        }
      });
    }
    return ImageFiles.makeState(paths, idx, classes, options, "ImageFileList", ["classes"]);
  }

  /**
   * Reads paths and labels from a CSV file with a header row.
   *
   * @param csv path of the CSV file
   * @param options columns, root and decoding options
   * @returns the dataset, relative paths resolved against `root`
   * @throws {Error} naming the file and line for a missing column or a short row
   */
  static async fromCsv(csv: string, options: ImageFileListCsvOptions = {}): Promise<ImageFileList> {
    const { pathColumn = "path", labelColumn = "label", root, ...rest } = options;
    const text = await Deno.readTextFile(csv);
    const lines = text.split(/\r?\n/).filter((l) => l.trim() !== "");
    if (lines.length === 0) throw new Error(`Cannot read ${csv}: the CSV file is empty`);
    const header = csvFields(lines[0]);
    const pc = header.indexOf(pathColumn), lc = header.indexOf(labelColumn);
    if (pc < 0 || lc < 0) {
      throw new Error(
        `Cannot read ${csv}: expected columns "${pathColumn}" and "${labelColumn}" in the header, found ${
          header.map((h) => JSON.stringify(h)).join(", ")
        }`,
      );
    }
    const { dirname, isAbsolute, join } = await import("node:path");
    const base = root ?? dirname(csv);
    const paths: string[] = [], labels: string[] = [];
    for (let i = 1; i < lines.length; i++) {
      const f = csvFields(lines[i]);
      if (f.length <= Math.max(pc, lc)) {
        throw new Error(
          `Cannot read ${csv}: line ${i + 1} has ${f.length} fields, expected ${header.length}`,
        );
      }
      paths.push(isAbsolute(f[pc]) ? f[pc] : join(base, f[pc]));
      labels.push(f[lc]);
    }
    const numeric = labels.every((l) => /^\d+$/.test(l)) && rest.classes === undefined;
    return new ImageFileList(paths, numeric ? labels.map(Number) : labels, rest);
  }
}
