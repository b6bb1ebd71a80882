/**
 * The image kernels: {@linkcode imageAugment}, one fused pass from uint8 images to a
 * normalized, augmented f16 or f32 batch (optionally gathered from a device-resident set), and
 * {@linkcode imageLabelsI32}, which widens labels to int32. Each checks its arguments
 * (TypeError / RangeError naming the offending one) and queues the kernel on `options.stream`
 * (default: the device's default stream) through the device's backend (ops/backend.ts).
 * Nothing here waits for the device.
 *
 * Raw bytes come as a {@linkcode DeviceBuffer} or {@linkcode HostBuffer} (memory the kernel
 * may read: registered or pinned host memory on a backend that maps it) plus a byte offset,
 * and are bounds-checked against the extent the kernel will read or write. A bare
 * `Deno.PointerValue` is accepted for memory the caller has already laid out and checked
 * (the prefetcher's ring slots); its extent cannot be checked here.
 *
 * @module
 */

import { DeviceBuffer, HostBuffer } from "../ffi/memory.ts";
import type { Tensor } from "../ffi/tensor.ts";
import { AUGMENT_RECORD_LENGTH } from "../augment/record.ts";
import { GEOMETRY_RECORD_LENGTH } from "../augment/geometry.ts";
import { type ImageLayout, MAX_CHANNELS, type NormalizeAffine } from "../augment/image.ts";
import type { Operand, OpOptions, RawMemory } from "./backend.ts";
import { queue, streamOn } from "./_launch.ts";
import { I32_MAX, intIn, region } from "./_memory.ts";

export type { RawMemory };

/** Options shared by the image ops. */
export type ImageOpOptions = OpOptions;

/** Transform and source description of {@linkcode imageAugment}. */
export interface ImageAugmentOptions extends ImageOpOptions {
  /** Memory order of the uint8 source images. */
  layout: ImageLayout;
  /** Per-channel normalization from {@linkcode normalizeAffine}, one entry per channel. */
  affine: NormalizeAffine;
  /** Zero padding on every side before the crop (default 0). */
  padding?: number;
  /**
   * n records of {@linkcode AUGMENT_RECORD_LENGTH} int32 on the device (the loader's `augment`
   * field, see {@linkcode augmentRecord}): crop window, flips, cutout square and colour factors
   * (default null: the centred window and nothing else).
   */
  params?: RawMemory;
  /**
   * Gathers the batch from a device-resident set in the same pass: n int32 image indices on
   * the device, sample i reading image `indices[i]` of `src` (which then holds `rows` images),
   * with no gathered copy in between (default null: sample i is image i of `src`). An index
   * outside [0, rows) fails on the CPU backend; on CUDA that sample is skipped and its output
   * left as it was (the kernel cannot fail), as in {@linkcode gatherRows}.
   */
  indices?: RawMemory | null;
  /**
   * Images in `src` when `indices` is given (default: as many whole images as a buffer `src`
   * holds after `srcOffset`; required for a bare pointer).
   */
  rows?: number;
  /** Byte offset of the first image in `src` (default 0). */
  srcOffset?: number;
  /** Byte offset of the first record in `params` (default 0). */
  paramsOffset?: number;
  /** Byte offset of the first index in `indices` (default 0). */
  indicesOffset?: number;
  /**
   * CPU backend: run the batch on the calling thread alone (default false: a batch of 64 KiB or
   * more is split over the backend's threads, which backs off while a thread is held up). For
   * a caller whose other cores are busy, such as a loader's workers on a small machine;
   * {@linkcode DevicePrefetcher} sets it then. CUDA ignores it.
   */
  serial?: boolean;
  /**
   * Whether the records' contrast words count (default true). False, for records that never
   * carry contrast (a loader without the `contrast` option), reads them as 1.0 and spares
   * CUDA the per-batch pre-pass that finds each image's mean grey (a launch and scratch
   * memory); the output is then the same as with true.
   */
  contrast?: boolean;
  /**
   * The batch's labels in the same launch (default null): one label of `labelBytes` per image
   * of `src` (per `rows` image with `indices`), sample i's written to `labelsOut[i]` as int32,
   * which replaces a {@linkcode gatherRows} and an {@linkcode imageLabelsI32} per batch.
   */
  labels?: RawMemory | null;
  /** Bytes per label of `labels`: 1 (uint8), 2 (uint16) or 4 (int32). */
  labelBytes?: number;
  /** Byte offset of the first label in `labels` (default 0). */
  labelsOffset?: number;
  /** i32 [n], written with the batch's labels; required with `labels`. */
  labelsOut?: Tensor;
}

/** Source description of {@linkcode imageLabelsI32}. */
export interface ImageLabelsOptions extends ImageOpOptions {
  /** Bytes per source label: 1 (uint8), 2 (uint16) or 4 (int32, copied). */
  labelBytes: number;
  /** Byte offset of the first label in `src` (default 0). */
  srcOffset?: number;
}

// The C ABI's codes (kernels/pinstream.h).
const LAYOUT: Readonly<Record<ImageLayout, number>> = { nhwc: 0, nchw: 1 };
const IMAGE_F16 = 0, IMAGE_F32 = 1, IMAGE_SERIAL = 1, IMAGE_ANTIALIAS = 2, IMAGE_NO_CONTRAST = 4;

function isTensor(t: unknown): t is Tensor {
  return typeof t === "object" && t !== null && "dtype" in t && "shape" in t && "device" in t;
}

/**
 * One fused pass over a batch of uint8 images on the device: per-sample crop from the image
 * zero-padded by `padding`, optional horizontal and vertical flips, ColorJitter's contrast
 * (toward each image's mean grey), brightness, saturation and hue, per-channel normalize,
 * cutout, cast to the output's dtype; NCHW out, the same bits as
 * {@linkcode augmentHost} on either backend.
 *
 * @param src n uint8 images of `out`'s size, contiguous, in `options.layout` order (with
 *   `options.indices`: the `rows` images the batch is gathered from).
 * @param out f16 or f32 [n, c, h, w], written; its shape gives the batch's geometry.
 * @param options layout, affine (c entries), padding (0), params (n records or null),
 *   indices (n int32 or null) and rows, srcOffset, paramsOffset, indicesOffset, serial,
 *   contrast, stream;
 *   labels, labelBytes, labelsOffset and labelsOut to write the batch's labels in the same pass.
 * @throws {TypeError} On a wrong dtype, layout or memory kind, or memory of another device.
 * @throws {RangeError} On a wrong shape, padding, channel count or a buffer too small.
 * @throws {PinstreamError} When the backend refuses the launch (on the CPU backend: an index
 *   outside [0, rows)).
 * @example Normalize two 1x1 RGB pixels to [0, 1]
 * ```ts
 * import { Device, DeviceBuffer, imageAugment, normalizeAffine, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using src = DeviceBuffer.alloc(dev, 6);
 * src.copyFrom(new Uint8Array([0, 51, 255, 255, 0, 102]));
 * using out = Tensor.empty(dev, [2, 3, 1, 1], "f32");
 * const affine = normalizeAffine([0, 0, 0], [1, 1, 1]);
 * imageAugment(src, out, { layout: "nhwc", affine });
 * const got = [...await out.toHost()].map((v) => Math.round(v * 255));
 * assert.deepStrictEqual(got, [0, 51, 255, 255, 0, 102]);
 * ```
 * @example Gather images 2 and 0 of a resident set of three 1x2 grey images, in one pass
 * ```ts
 * import { Device, DeviceBuffer, imageAugment, normalizeAffine, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using set = DeviceBuffer.alloc(dev, 6);
 * set.copyFrom(new Uint8Array([10, 11, 20, 21, 30, 31]));
 * using indices = DeviceBuffer.alloc(dev, 8);
 * indices.copyFrom(new Int32Array([2, 0]));
 * using out = Tensor.empty(dev, [2, 1, 1, 2], "f32");
 * imageAugment(set, out, { layout: "nchw", affine: normalizeAffine([0], [1 / 255]), indices });
 * assert.deepStrictEqual([...await out.toHost()], [30, 31, 10, 11]);
 * ```
 * @example The same gather with its uint8 labels widened to int32 in the same launch
 * ```ts
 * import { Device, DeviceBuffer, imageAugment, normalizeAffine, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using set = DeviceBuffer.alloc(dev, 3);
 * set.copyFrom(new Uint8Array([10, 20, 30]));
 * using labelSet = DeviceBuffer.alloc(dev, 3);
 * labelSet.copyFrom(new Uint8Array([7, 8, 9]));
 * using indices = DeviceBuffer.alloc(dev, 8);
 * indices.copyFrom(new Int32Array([2, 0]));
 * using out = Tensor.empty(dev, [2, 1, 1, 1], "f32");
 * using labels = Tensor.empty(dev, [2], "i32");
 * imageAugment(set, out, {
 *   layout: "nchw",
 *   affine: normalizeAffine([0], [1 / 255]),
 *   indices,
 *   labels: labelSet,
 *   labelBytes: 1,
 *   labelsOut: labels,
 * });
 * assert.deepStrictEqual([...await out.toHost()], [30, 10]);
 * assert.deepStrictEqual([...await labels.toHost()], [9, 7]);
 * ```
 */
export function imageAugment(src: RawMemory, out: Tensor, options: ImageAugmentOptions): void {
  const action = "run imageAugment";
  if (!isTensor(out)) throw new TypeError(`Cannot ${action}: out must be a Tensor, got ${out}`);
  if (out.dtype !== "f16" && out.dtype !== "f32") {
    throw new TypeError(`Cannot ${action}: out must be f16 or f32, got ${out.dtype}`);
  }
  if (out.shape.length !== 4) {
    throw new RangeError(`Cannot ${action}: out must be [n, c, h, w], got [${out.shape}]`);
  }
  const [n, c, h, w] = out.shape;
  for (const [v, name] of [[n, "n"], [h, "h"], [w, "w"]] as const) {
    intIn(v, `out's ${name}`, 0, I32_MAX, action);
  }
  intIn(c, "out's channel count", 1, MAX_CHANNELS, action);
  const layout = options?.layout;
  if (layout !== "nhwc" && layout !== "nchw") {
    throw new TypeError(`Cannot ${action}: layout must be "nhwc" or "nchw", got ${layout}`);
  }
  const affine = options.affine;
  for (const key of ["scale", "bias"] as const) {
    const a = affine?.[key];
    if (!(a instanceof Float32Array) || a.length !== c) {
      throw new RangeError(
        `Cannot ${action}: affine.${key} must be a Float32Array of ${c} (out's channels), ` +
          `got ${a instanceof Float32Array ? `${a.length} entries` : a}`,
      );
    }
  }
  const padding = intIn(options.padding ?? 0, "padding", 0, I32_MAX, action);
  const device = out.device;
  const imageBytes = c * h * w;
  const indices = options.indices ?? null;
  let rows = n, indicesAt: Operand = null;
  if (indices !== null) {
    const sized = src instanceof DeviceBuffer || src instanceof HostBuffer;
    if (options.rows === undefined && !sized) {
      throw new TypeError(`Cannot ${action}: rows is needed with indices and a bare src pointer`);
    }
    const at = intIn(options.srcOffset ?? 0, "src offset", 0, Number.MAX_SAFE_INTEGER, action);
    rows = intIn(
      options.rows ?? Math.floor(((src as DeviceBuffer | HostBuffer).bytes - at) / imageBytes),
      "rows",
      1,
      Number.MAX_SAFE_INTEGER,
      action,
    );
    indicesAt = region(indices, "indices", options.indicesOffset, n * 4, device, action);
  } else if (options.rows !== undefined || options.indicesOffset !== undefined) {
    throw new TypeError(`Cannot ${action}: rows and indicesOffset go with indices, got none`);
  }
  const srcAt = region(src, "src", options.srcOffset, rows * imageBytes, device, action);
  const params = options.params ?? null;
  const paramsAt = params === null
    ? null
    : region(params, "params", options.paramsOffset, n * 4 * AUGMENT_RECORD_LENGTH, device, action);
  const labels = options.labels ?? null;
  let labelBytes = 4, labelsAt: Operand = null, labelsOut: Tensor | null = null;
  if (labels !== null) {
    const lb = options.labelBytes;
    if (lb !== 1 && lb !== 2 && lb !== 4) {
      throw new RangeError(`Cannot ${action}: labelBytes must be 1, 2 or 4, got ${lb}`);
    }
    labelBytes = lb;
    const lo = options.labelsOut;
    if (!isTensor(lo) || lo.dtype !== "i32" || lo.numel !== n) {
      throw new TypeError(
        `Cannot ${action}: labelsOut must be an i32 Tensor of ${n} (out's samples) with labels, ` +
          `got ${isTensor(lo) ? `${lo.dtype} [${lo.shape}]` : lo}`,
      );
    }
    if (lo.device !== device) {
      throw new TypeError(`Cannot ${action}: labelsOut is on ${lo.device}, not ${device}`);
    }
    labelsOut = lo;
    labelsAt = region(labels, "labels", options.labelsOffset, rows * labelBytes, device, action);
  } else if (
    options.labelBytes !== undefined || options.labelsOffset !== undefined ||
    options.labelsOut !== undefined
  ) {
    throw new TypeError(
      `Cannot ${action}: labelBytes, labelsOffset and labelsOut go with labels, got none`,
    );
  }
  const stream = streamOn(options, device, action);
  device.makeCurrent();
  const args = {
    src: srcAt,
    indices: indicesAt,
    rows: indices === null ? 0 : rows,
    layout: LAYOUT[layout],
    n,
    c,
    h,
    w,
    pad: padding,
    params: paramsAt,
    scale: affine.scale,
    bias: affine.bias,
    out,
    out_dtype: out.dtype === "f16" ? IMAGE_F16 : IMAGE_F32,
    flags: (options.serial ? IMAGE_SERIAL : 0) |
      (options.contrast === false ? IMAGE_NO_CONTRAST : 0),
  };
  const what = `${action} [${out.shape}] ${layout}`;
  if (labelsOut === null) queue(device, "imageAugment", { ...args, stream }, what);
  else {
    queue(device, "imageAugmentLabeled", {
      ...args,
      labels: labelsAt,
      label_bytes: labelBytes,
      labels_out: labelsOut,
      stream,
    }, what);
  }
}

/**
 * Widens a batch of uint8 or uint16 labels to int32 on the device (int32 labels are
 * copied); the copy is a memmove, so `src` may overlap `out`.
 *
 * @param src `out.numel` labels of `options.labelBytes` bytes each.
 * @param out i32, written; one element per label.
 * @param options labelBytes (1, 2 or 4), srcOffset, stream.
 * @throws {TypeError} On a wrong dtype or memory kind, or memory of another device.
 * @throws {RangeError} On a wrong labelBytes or a buffer too small.
 * @throws {PinstreamError} When the backend refuses the launch.
 * @example uint8 labels to int32
 * ```ts
 * import { Device, DeviceBuffer, imageLabelsI32, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using src = DeviceBuffer.alloc(dev, 3);
 * src.copyFrom(new Uint8Array([7, 0, 255]));
 * using labels = Tensor.empty(dev, [3], "i32");
 * imageLabelsI32(src, labels, { labelBytes: 1 });
 * assert.deepStrictEqual([...await labels.toHost()], [7, 0, 255]);
 * ```
 */
export function imageLabelsI32(src: RawMemory, out: Tensor, options: ImageLabelsOptions): void {
  const action = "run imageLabelsI32";
  if (!isTensor(out)) throw new TypeError(`Cannot ${action}: out must be a Tensor, got ${out}`);
  if (out.dtype !== "i32") {
    throw new TypeError(`Cannot ${action}: out must be i32, got ${out.dtype}`);
  }
  const n = intIn(out.numel, "out's element count", 0, I32_MAX, action);
  const labelBytes = options?.labelBytes;
  if (labelBytes !== 1 && labelBytes !== 2 && labelBytes !== 4) {
    throw new RangeError(`Cannot ${action}: labelBytes must be 1, 2 or 4, got ${labelBytes}`);
  }
  const device = out.device;
  const srcAt = region(src, "src", options.srcOffset, n * labelBytes, device, action);
  const stream = streamOn(options, device, action);
  device.makeCurrent();
  queue(
    device,
    "imageLabelsI32",
    { src: srcAt, src_bytes: labelBytes, n, out, stream },
    `${action} ${n} x ${labelBytes} bytes`,
  );
}

/** Source and transform of {@linkcode imageGeometry}. */
export interface ImageGeometryOptions extends ImageOpOptions {
  /** n records of {@linkcode GEOMETRY_RECORD_LENGTH} int32 on the device ({@linkcode writeGeometryRecord}). */
  params: RawMemory;
  /** Bytes from one sample's source slot to the next (each image packed at its slot's start). */
  srcStride: number;
  /** Widen the resize filter when shrinking, as Pillow and torchvision's antialias (default true). */
  antialias?: boolean;
  /** The rotation's fill: one byte per channel, channel k in bits 8k..8k+7 (default 0). */
  fill?: number;
  /** Byte offset of the first slot in `src` (default 0). */
  srcOffset?: number;
  /** Byte offset of the first record in `params` (default 0). */
  paramsOffset?: number;
  /** CPU backend: run the batch on the calling thread alone (default false). CUDA ignores it. */
  serial?: boolean;
}

/**
 * The geometric transforms of a batch on the device, before {@linkcode imageAugment}: per
 * sample its record's box of its source image (each image has its own size, in its record)
 * resized to `out`'s height and width with Pillow's bilinear, then rotated about the centre
 * (bilinear, the fill outside); uint8 HWC in and out, the same bytes as
 * {@linkcode geometryHost} on either backend.
 *
 * @param src n slots of `options.srcStride` bytes, each an HWC uint8 image at its start.
 * @param out u8 [n, height, width, c] (c 1 to 4), written.
 * @param options params (n records), srcStride, antialias, fill, offsets, serial, stream.
 * @throws {TypeError} On a wrong dtype or memory kind, or memory of another device.
 * @throws {RangeError} On a wrong shape or stride, or a buffer too small.
 * @throws {PinstreamError} When the backend refuses the launch (on the CPU backend: a record
 *   outside its slot; CUDA skips that sample, leaving its output as it was).
 * @example Halve a 2x2 grey image (the mean), and turn a 1x2 image by 180 degrees
 * ```ts
 * import { Device, DeviceBuffer, imageGeometry, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using src = DeviceBuffer.alloc(dev, 8);
 * src.copyFrom(new Uint8Array([0, 100, 200, 100, 1, 2, 0, 0]));
 * using params = DeviceBuffer.alloc(dev, 64);
 * params.copyFrom(new Int32Array([2, 2, 0, 0, 2, 2, 2 ** 30, 0, 1, 2, 0, 0, 1, 2, -(2 ** 30), 0]));
 * using half = Tensor.empty(dev, [1, 1, 1, 1], "u8");
 * imageGeometry(src, half, { params, srcStride: 4 });
 * assert.deepStrictEqual([...await half.toHost()], [100]);
 * using turned = Tensor.empty(dev, [1, 1, 2, 1], "u8");
 * imageGeometry(src, turned, { params, paramsOffset: 32, srcOffset: 4, srcStride: 4 });
 * assert.deepStrictEqual([...await turned.toHost()], [2, 1]);
 * ```
 */
export function imageGeometry(src: RawMemory, out: Tensor, options: ImageGeometryOptions): void {
  const action = "run imageGeometry";
  if (!isTensor(out)) throw new TypeError(`Cannot ${action}: out must be a Tensor, got ${out}`);
  if (out.dtype !== "u8") throw new TypeError(`Cannot ${action}: out must be u8, got ${out.dtype}`);
  if (out.shape.length !== 4) {
    throw new RangeError(`Cannot ${action}: out must be [n, height, width, c], got [${out.shape}]`);
  }
  const [n, oh, ow, c] = out.shape;
  intIn(n, "out's n", 0, I32_MAX, action);
  intIn(oh, "out's height", 1, 2 ** 14, action);
  intIn(ow, "out's width", 1, 2 ** 14, action);
  intIn(c, "out's channel count", 1, 4, action);
  const stride = intIn(options?.srcStride, "srcStride", c, Number.MAX_SAFE_INTEGER, action);
  const antialias = options.antialias ?? true;
  if (typeof antialias !== "boolean") {
    throw new TypeError(`Cannot ${action}: antialias must be a boolean, got ${antialias}`);
  }
  const fill = intIn(options.fill ?? 0, "fill", -(2 ** 31), 2 ** 32 - 1, action) | 0;
  const device = out.device;
  const srcAt = region(src, "src", options.srcOffset, n * stride, device, action);
  const paramsAt = region(
    options.params,
    "params",
    options.paramsOffset,
    n * 4 * GEOMETRY_RECORD_LENGTH,
    device,
    action,
  );
  const stream = streamOn(options, device, action);
  device.makeCurrent();
  queue(device, "imageGeometry", {
    src: srcAt,
    src_stride: stride,
    n,
    c,
    params: paramsAt,
    oh,
    ow,
    fill,
    out,
    flags: (options.serial ? IMAGE_SERIAL : 0) | (antialias ? IMAGE_ANTIALIAS : 0),
    stream,
  }, `${action} [${out.shape}]`);
}
