/**
 * Typed wrappers over the image kernels of kernels/pinstream.h (`ps_image_augment`,
 * `ps_image_labels_i32`, `ps_gather_rows`), as nn/ops.ts is over the `ps_nn_*` kernels: each
 * checks its arguments (TypeError / RangeError naming the offending one), makes the device
 * current and queues the kernel on `options.stream` (default: the device's default stream).
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
import type { Device } from "../ffi/device.ts";
import type { Stream } from "../ffi/stream.ts";
import type { Tensor } from "../ffi/tensor.ts";
import { AUGMENT_RECORD_LENGTH } from "../augment/record.ts";
import { type ImageLayout, MAX_CHANNELS, type NormalizeAffine } from "../augment/image.ts";

/** Raw bytes a kernel reads or writes: a buffer (bounds-checked) or a bare pointer (not). */
export type RawMemory = DeviceBuffer | HostBuffer | Deno.PointerValue;

/** Options shared by the image ops. */
export interface ImageOpOptions {
  /** The stream to queue the kernel on (default: the device's default stream). */
  stream?: Stream;
}

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
}

/** Source description of {@linkcode imageLabelsI32}. */
export interface ImageLabelsOptions extends ImageOpOptions {
  /** Bytes per source label: 1 (uint8), 2 (uint16) or 4 (int32, copied). */
  labelBytes: number;
  /** Byte offset of the first label in `src` (default 0). */
  srcOffset?: number;
}

/** Indices and row geometry of {@linkcode gatherRows}. */
export interface GatherRowsOptions extends ImageOpOptions {
  /** int32 row indices on the device, `count` of them, each in [0, rows). */
  indices: DeviceBuffer;
  /** Rows to gather. */
  count: number;
  /** Bytes per row (> 0). */
  rowBytes: number;
  /** Rows in `src` (default: as many whole rows as `src` holds after `srcOffset`). */
  rows?: number;
  /** Byte offset of row 0 in `src` (default 0). */
  srcOffset?: number;
  /** Byte offset of the first gathered row in `dst` (default 0). */
  dstOffset?: number;
  /** Byte offset of the first index in `indices` (default 0). */
  indicesOffset?: number;
}

// The C ABI's codes (kernels/pinstream.h).
const LAYOUT: Readonly<Record<ImageLayout, number>> = { nhwc: 0, nchw: 1 };
const IMAGE_F16 = 0, IMAGE_F32 = 1, IMAGE_SERIAL = 1;
const I32_MAX = 2 ** 31 - 1;

function isTensor(t: unknown): t is Tensor {
  return typeof t === "object" && t !== null && "dtype" in t && "shape" in t && "device" in t;
}

function int(v: unknown, name: string, min: number, max: number, action: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
    throw new RangeError(
      `Cannot ${action}: ${name} must be an integer in ${min}..${max}, got ${v}`,
    );
  }
  return v;
}

/**
 * The address `offset` bytes into `mem`, after checking that `bytes` bytes from there lie
 * inside it (a buffer) and that it is usable from `device`.
 */
function region(
  mem: unknown,
  name: string,
  offset: unknown,
  bytes: number,
  device: Device,
  action: string,
): Deno.PointerValue {
  if (mem instanceof DeviceBuffer || mem instanceof HostBuffer) {
    if (mem.device.lib !== device.lib) {
      throw new TypeError(`Cannot ${action}: ${name} is on ${mem.device}, not ${device.kind}`);
    }
    if (mem instanceof DeviceBuffer && mem.device !== device) {
      throw new TypeError(`Cannot ${action}: ${name} is on ${mem.device}, not ${device}`);
    }
    const at = int(offset ?? 0, `${name} offset`, 0, Number.MAX_SAFE_INTEGER, action);
    if (at + bytes > mem.bytes) {
      throw new RangeError(
        `Cannot ${action}: ${name} must hold ${bytes} bytes from offset ${at}, ` +
          `got a buffer of ${mem.bytes}`,
      );
    }
    return mem.pointerAt(at, action);
  }
  if (offset !== undefined && offset !== 0) {
    throw new TypeError(
      `Cannot ${action}: ${name} offset ${offset} needs a DeviceBuffer or HostBuffer, ` +
        `not a bare pointer`,
    );
  }
  if (mem === null) {
    if (bytes === 0) return null;
    throw new TypeError(`Cannot ${action}: ${name} must be a buffer or pointer, got null`);
  }
  if (typeof mem !== "object") {
    throw new TypeError(
      `Cannot ${action}: ${name} must be a DeviceBuffer, HostBuffer or pointer, got ${mem}`,
    );
  }
  return mem as Deno.PointerObject;
}

function streamOf(options: ImageOpOptions, device: Device, action: string): Deno.PointerValue {
  const stream = options.stream;
  if (stream !== undefined && stream.device !== device) {
    throw new TypeError(`Cannot ${action}: the stream belongs to ${stream.device}, not ${device}`);
  }
  return stream?.handle ?? null;
}

/**
 * One fused pass over a batch of uint8 images on the device: per-sample crop from the image
 * zero-padded by `padding`, optional horizontal and vertical flips, brightness and contrast,
 * per-channel normalize, cutout, cast to the output's dtype; NCHW out, the same bits as
 * {@linkcode augmentHost} on either backend.
 *
 * @param src n uint8 images of `out`'s size, contiguous, in `options.layout` order (with
 *   `options.indices`: the `rows` images the batch is gathered from).
 * @param out f16 or f32 [n, c, h, w], written; its shape gives the batch's geometry.
 * @param options layout, affine (c entries), padding (0), params (n records or null),
 *   indices (n int32 or null) and rows, srcOffset, paramsOffset, indicesOffset, serial, stream.
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
    int(v, `out's ${name}`, 0, I32_MAX, action);
  }
  int(c, "out's channel count", 1, MAX_CHANNELS, action);
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
  const padding = int(options.padding ?? 0, "padding", 0, I32_MAX, action);
  const device = out.device;
  const imageBytes = c * h * w;
  const indices = options.indices ?? null;
  let rows = n, indicesPtr: Deno.PointerValue = null;
  if (indices !== null) {
    const sized = src instanceof DeviceBuffer || src instanceof HostBuffer;
    if (options.rows === undefined && !sized) {
      throw new TypeError(`Cannot ${action}: rows is needed with indices and a bare src pointer`);
    }
    const at = int(options.srcOffset ?? 0, "src offset", 0, Number.MAX_SAFE_INTEGER, action);
    rows = int(
      options.rows ?? Math.floor(((src as DeviceBuffer | HostBuffer).bytes - at) / imageBytes),
      "rows",
      1,
      Number.MAX_SAFE_INTEGER,
      action,
    );
    indicesPtr = region(indices, "indices", options.indicesOffset, n * 4, device, action);
  } else if (options.rows !== undefined || options.indicesOffset !== undefined) {
    throw new TypeError(`Cannot ${action}: rows and indicesOffset go with indices, got none`);
  }
  const srcPtr = region(src, "src", options.srcOffset, rows * imageBytes, device, action);
  const params = options.params ?? null;
  const paramsPtr = params === null
    ? null
    : region(params, "params", options.paramsOffset, n * 4 * AUGMENT_RECORD_LENGTH, device, action);
  const stream = streamOf(options, device, action);
  device.makeCurrent();
  device.check(
    device.lib.symbols.ps_image_augment(
      srcPtr,
      indicesPtr,
      BigInt(indices === null ? 0 : rows),
      LAYOUT[layout],
      n,
      c,
      h,
      w,
      padding,
      paramsPtr,
      affine.scale,
      affine.bias,
      out.pointer,
      out.dtype === "f16" ? IMAGE_F16 : IMAGE_F32,
      options.serial ? IMAGE_SERIAL : 0,
      stream,
    ),
    `${action} [${out.shape}] ${layout}`,
  );
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
  const n = int(out.numel, "out's element count", 0, I32_MAX, action);
  const labelBytes = options?.labelBytes;
  if (labelBytes !== 1 && labelBytes !== 2 && labelBytes !== 4) {
    throw new RangeError(`Cannot ${action}: labelBytes must be 1, 2 or 4, got ${labelBytes}`);
  }
  const device = out.device;
  const srcPtr = region(src, "src", options.srcOffset, n * labelBytes, device, action);
  const stream = streamOf(options, device, action);
  device.makeCurrent();
  device.check(
    device.lib.symbols.ps_image_labels_i32(srcPtr, labelBytes, n, out.pointer, stream),
    `${action} ${n} x ${labelBytes} bytes`,
  );
}

/**
 * Gathers rows of a device-resident dataset on the device: row k of `dst` becomes row
 * `indices[k]` of `src`, `rowBytes` bytes each. An index outside [0, rows) fails on the CPU
 * backend; on CUDA that row is skipped and left as it was (the kernel cannot fail).
 *
 * @param src `rows` rows of `rowBytes` bytes.
 * @param dst `count` rows, written; must not overlap `src`.
 * @param options indices (count int32), count, rowBytes, rows, srcOffset, dstOffset,
 *   indicesOffset, stream.
 * @throws {TypeError} On a wrong memory kind, or memory of another device.
 * @throws {RangeError} On a bad count, row size or row count, or a buffer too small.
 * @throws {PinstreamError} When the backend refuses the launch (CPU: an index out of range).
 * @example Rows 2 and 0 of a 3-row table
 * ```ts
 * import { Device, DeviceBuffer, gatherRows } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using table = DeviceBuffer.alloc(dev, 6);
 * table.copyFrom(new Uint8Array([1, 2, 3, 4, 5, 6]));
 * using idx = DeviceBuffer.alloc(dev, 8);
 * idx.copyFrom(new Int32Array([2, 0]));
 * using out = DeviceBuffer.alloc(dev, 4);
 * gatherRows(table, out, { indices: idx, count: 2, rowBytes: 2 });
 * const back = new Uint8Array(4);
 * out.copyTo(back);
 * await dev.defaultStream.synchronize();
 * assert.deepStrictEqual([...back], [5, 6, 1, 2]);
 * ```
 */
export function gatherRows(
  src: DeviceBuffer,
  dst: DeviceBuffer,
  options: GatherRowsOptions,
): void {
  const action = "run gatherRows";
  for (const [b, name] of [[src, "src"], [dst, "dst"], [options?.indices, "indices"]] as const) {
    if (!(b instanceof DeviceBuffer)) {
      throw new TypeError(`Cannot ${action}: ${name} must be a DeviceBuffer, got ${b}`);
    }
  }
  const device = src.device;
  const count = int(options.count, "count", 0, I32_MAX, action);
  const rowBytes = int(options.rowBytes, "rowBytes", 1, Number.MAX_SAFE_INTEGER, action);
  const srcOffset = int(options.srcOffset ?? 0, "src offset", 0, src.bytes, action);
  const rows = int(
    options.rows ?? Math.floor((src.bytes - srcOffset) / rowBytes),
    "rows",
    0,
    Number.MAX_SAFE_INTEGER,
    action,
  );
  const srcPtr = region(src, "src", srcOffset, rows * rowBytes, device, action);
  const dstPtr = region(dst, "dst", options.dstOffset, count * rowBytes, device, action);
  const idxPtr = region(
    options.indices,
    "indices",
    options.indicesOffset,
    count * 4,
    device,
    action,
  );
  const stream = streamOf(options, device, action);
  device.makeCurrent();
  device.check(
    device.lib.symbols.ps_gather_rows(
      srcPtr,
      BigInt(rows),
      BigInt(rowBytes),
      idxPtr,
      count,
      dstPtr,
      stream,
    ),
    `${action} ${count} of ${rows} rows x ${rowBytes} bytes`,
  );
}
