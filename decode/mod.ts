/**
 * pinstream's image decoders: JPEG through libjpeg-turbo (TurboJPEG) and PNG through libspng,
 * both loaded with Deno.dlopen, or in TypeScript (the same pixels, slower) where FFI is not
 * allowed or a library is missing. The file type comes from the magic bytes. The loader's image datasets import
 * this module only when they decode, in the thread that decodes (a worker), so a DataLoader
 * over other datasets never needs FFI.
 *
 * @module
 */

import { applyOrientation, exifOrientation } from "./exif.ts";
import { sniffImageType } from "./format.ts";
import { decodeJpegTs, jpegInfo } from "./jpeg.ts";
import { decodePngTs, pngHeader } from "./png.ts";
import { resizeBilinear } from "./resize.ts";
import { wasmInput } from "./_simd.ts";
import { LIBDEFLATE_LIBRARY, PngFast } from "./png_fast.ts";
import { Spng, SPNG_LIBRARY } from "./spng.ts";
import { type JpegHeader, TurboJpeg, TURBOJPEG_LIBRARY } from "./turbojpeg.ts";
import { type Channels, type CropBox, type DecodedImage, ImageDecodeError } from "./types.ts";

export { type Channels, type CropBox, type DecodedImage, ImageDecodeError } from "./types.ts";
export { type ImageType, sniffImageType } from "./format.ts";
export { applyOrientation, exifOrientation } from "./exif.ts";
export { resizeBilinear } from "./resize.ts";
export { type DecodeJpegOptions, decodeJpegTs, type JpegInfo, jpegInfo } from "./jpeg.ts";

/** Pillow's decompression-bomb limit: it refuses images over twice its MAX_IMAGE_PIXELS. */
export const DEFAULT_MAX_PIXELS = 2 * 89_478_485;

/** Which decoders to use: "auto" the native ones where they load, else the fallbacks. */
export type DecoderBackend = "auto" | "native" | "typescript";

/** Options of {@linkcode ImageDecoder}. */
export interface ImageDecoderOptions {
  /** 1 grey, 3 RGB (default, as torchvision's loader), 4 RGBA. */
  channels?: Channels;
  /** "auto" (default), "native" (fail when a library cannot load), "typescript". */
  backend?: DecoderBackend;
  /** Refuse images with more pixels (default {@linkcode DEFAULT_MAX_PIXELS}). */
  maxPixels?: number;
  /** Turn images upright by their EXIF orientation (default true). */
  exifOrientation?: boolean;
}

/**
 * The pixels of a region (a new buffer).
 *
 * @param image HWC pixels
 * @param box the region, inside the image
 * @returns the region's pixels
 * @example
 * ```ts
 * import { cropImage } from "./mod.ts";
 * import assert from "node:assert";
 * const img = { data: new Uint8Array([1, 2, 3, 4, 5, 6]), height: 2, width: 3, channels: 1 as const };
 * assert.deepStrictEqual([...cropImage(img, { top: 1, left: 1, height: 1, width: 2 }).data], [5, 6]);
 * ```
 */
export function cropImage(image: DecodedImage, box: CropBox): DecodedImage {
  const { data, width, channels: c } = image;
  if (
    box.top < 0 || box.left < 0 || box.height < 1 || box.width < 1 ||
    box.top + box.height > image.height || box.left + box.width > width
  ) {
    throw new RangeError(
      `Cannot crop ${JSON.stringify(box)} from an image of ${image.height}x${width}`,
    );
  }
  if (box.height === image.height && box.width === width) return image;
  const out = new Uint8Array(box.height * box.width * c);
  const row = box.width * c;
  for (let y = 0; y < box.height; y++) {
    const from = ((box.top + y) * width + box.left) * c;
    out.set(data.subarray(from, from + row), y * row);
  }
  return { data: out, height: box.height, width: box.width, channels: c };
}

/** Where a decode goes and how small it may be. */
export interface DecodeTarget {
  /**
   * The exact output size: decoded at the smallest DCT scale covering it, then resized
   * (bilinear, antialiased) into `out` when given.
   */
  size?: readonly [height: number, width: number];
  /**
   * A region to keep, chosen from the upright image's full size (e.g. RandomResizedCrop's):
   * cropped, then resized to `size` (which it needs). A JPEG is decoded at the smallest DCT
   * scale that keeps the region at least `size`, and the region is scaled with it.
   */
  crop?: (height: number, width: number) => CropBox;
  /**
   * Where the pixels go: `size[0] * size[1] * channels` bytes with `size`; without it, a
   * buffer for the image at its own size (used when large enough, for a JPEG upright as
   * stored; the result says where the pixels are).
   */
  out?: Uint8Array;
}

interface Native {
  jpeg?: TurboJpeg;
  png?: Spng;
  /** libdeflate with the WebAssembly unfilter, for the common PNGs (before libspng). */
  pngFast?: PngFast;
  jpegWhy: string;
  pngWhy: string;
  pngFastWhy: string;
}

let native: Native | undefined;

function reasonOf(e: unknown, library: string, pkg: string): string {
  if (e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied) {
    return `no FFI permission (--allow-ffi) to load ${library}`;
  }
  return `${library} could not be loaded (apt-get install ${pkg}): ${(e as Error).message}`;
}

/** Loads the native libraries once per thread. */
function loadNative(): Native {
  if (native) return native;
  const n: Native = { jpegWhy: "", pngWhy: "", pngFastWhy: "" };
  try {
    n.jpeg = new TurboJpeg();
  } catch (e) {
    n.jpegWhy = reasonOf(e, TURBOJPEG_LIBRARY, "libturbojpeg0");
  }
  try {
    n.png = new Spng();
  } catch (e) {
    n.pngWhy = reasonOf(e, SPNG_LIBRARY, "libspng0");
  }
  if (n.png) {
    try {
      n.pngFast = new PngFast();
    } catch (e) {
      n.pngFastWhy = reasonOf(e, LIBDEFLATE_LIBRARY, "libdeflate0");
    }
  }
  native = n;
  return n;
}

/**
 * Decodes JPEG and PNG files to 8-bit HWC pixels.
 *
 * @example A PNG made in memory, decoded by whichever PNG decoder loads
 * ```ts
 * import { ImageDecoder } from "./mod.ts";
 * import { deflateSync } from "node:zlib";
 * import assert from "node:assert";
 * const crcTable = [...Array(256)].map((_, n) => {
 *   let c = n;
 *   for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
 *   return c >>> 0;
 * });
 * const chunk = (type: string, data: Uint8Array) => {
 *   const out = new Uint8Array(12 + data.length), v = new DataView(out.buffer);
 *   v.setUint32(0, data.length);
 *   out.set(new TextEncoder().encode(type), 4);
 *   out.set(data, 8);
 *   let c = 0xffffffff;
 *   for (const b of out.subarray(4, 8 + data.length)) c = crcTable[(c ^ b) & 255] ^ (c >>> 8);
 *   v.setUint32(8 + data.length, (c ^ 0xffffffff) >>> 0);
 *   return out;
 * };
 * const ihdr = new Uint8Array([0, 0, 0, 2, 0, 0, 0, 1, 8, 0, 0, 0, 0]); // 2x1 grey
 * const png = new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10, ...chunk("IHDR", ihdr),
 *   ...chunk("IDAT", new Uint8Array(deflateSync(new Uint8Array([0, 10, 20])))),
 *   ...chunk("IEND", new Uint8Array())]);
 * const decoder = new ImageDecoder({ channels: 3 });
 * const img = decoder.decode(png);
 * assert.deepStrictEqual([img.height, img.width, [...img.data]], [1, 2, [10, 10, 10, 20, 20, 20]]);
 * ```
 */
export class ImageDecoder {
  /** Channels of every decoded image. */
  readonly channels: Channels;
  /** The pixel limit. */
  readonly maxPixels: number;
  /** Whether EXIF orientation is applied. */
  readonly exifOrientation: boolean;
  /** "turbojpeg" or "typescript". */
  readonly jpeg: "turbojpeg" | "typescript";
  /** "spng" or "typescript". */
  readonly png: "spng" | "typescript";
  /** One line: which decoders run and why. */
  readonly description: string;
  #native: Native;
  #backend: DecoderBackend;
  /** Stored (not upright) height and width of the JPEG being decoded. */
  #lastJpeg: [number, number] = [0, 0];
  #scratch: Uint8Array = new Uint8Array(0);

  /** `n` bytes of the scratch buffer (grown as needed). */
  #scratchOf(n: number): Uint8Array {
    // The resize's own memory where it has one: the resize then reads the pixels in place.
    const inResize = wasmInput(n);
    if (inResize !== undefined) return this.#scratch = inResize;
    if (this.#scratch.length < n) this.#scratch = new Uint8Array(n);
    return this.#scratch.subarray(0, n);
  }

  /**
   * Picks the decoders.
   *
   * @throws {Error} with backend "native" when a library cannot load (the reason and the
   *   package to install).
   */
  constructor(options: ImageDecoderOptions = {}) {
    this.channels = options.channels ?? 3;
    if (![1, 3, 4].includes(this.channels)) {
      throw new RangeError(
        `Cannot create an image decoder: channels should be 1, 3 or 4, got ${this.channels}`,
      );
    }
    this.maxPixels = options.maxPixels ?? DEFAULT_MAX_PIXELS;
    if (!(this.maxPixels > 0)) {
      throw new RangeError(
        `Cannot create an image decoder: maxPixels should be positive, got ${this.maxPixels}`,
      );
    }
    this.exifOrientation = options.exifOrientation ?? true;
    const backend = options.backend ?? "auto";
    this.#backend = backend;
    if (!["auto", "native", "typescript"].includes(backend)) {
      throw new RangeError(
        `Cannot create an image decoder: backend should be "auto", "native" or "typescript", got ${
          JSON.stringify(backend)
        }`,
      );
    }
    this.#native = backend === "typescript"
      ? {
        jpegWhy: 'backend "typescript" asked',
        pngWhy: 'backend "typescript" asked',
        pngFastWhy: 'backend "typescript" asked',
      }
      : loadNative();
    if (backend === "native" && (!this.#native.jpeg || !this.#native.png)) {
      throw new Error(
        `Cannot create an image decoder with backend "native": ${
          [this.#native.jpegWhy, this.#native.pngWhy].filter((s) => s).join("; ")
        }`,
      );
    }
    this.jpeg = this.#native.jpeg ? "turbojpeg" : "typescript";
    this.png = this.#native.png ? "spng" : "typescript";
    this.description = `image decoders: JPEG ${
      this.#native.jpeg
        ? "libjpeg-turbo (TurboJPEG)"
        : `TypeScript fallback (${this.#native.jpegWhy})`
    }; PNG ${
      this.#native.png
        ? this.#native.pngFast
          ? "libdeflate (8-bit grey, RGB, RGBA) and libspng"
          : `libspng (libdeflate not used: ${this.#native.pngFastWhy})`
        : `TypeScript fallback (${this.#native.pngWhy})`
    }`;
  }

  /**
   * Decodes one file.
   *
   * @param bytes the file's bytes; the type is found from them
   * @param target an exact output size, and where the pixels go
   * @returns the pixels, HWC, upright by EXIF orientation unless turned off
   * @throws {ImageDecodeError} for an empty, unknown, truncated, corrupt or too large file.
   */
  decode(bytes: Uint8Array, target: DecodeTarget = {}): DecodedImage {
    if (bytes.length === 0) throw new ImageDecodeError("the file is empty (0 bytes)");
    const type = sniffImageType(bytes);
    if (type !== "jpeg" && type !== "png") {
      throw new ImageDecodeError(
        type === undefined
          ? "not a JPEG or PNG file (unknown magic bytes)"
          : `${type.toUpperCase()} files are not decoded (only JPEG and PNG)`,
      );
    }
    const orientation = this.exifOrientation ? exifOrientation(bytes) : 1;
    let box: CropBox | undefined;
    const size = target.size;
    // Orientations 5-8 swap the sides: the size asked is of the upright image.
    const want = size && orientation >= 5 ? [size[1], size[0]] as const : size;
    let img: DecodedImage;
    if (type === "jpeg") {
      let tj = this.#native.jpeg;
      let header: JpegHeader | undefined;
      try {
        header = tj?.header(bytes);
      } catch (e) {
        // TurboJPEG 2.1 decodes only the samplings it has a name for (4:4:4, 4:2:2, 4:2:0,
        // 4:4:0, 4:1:1, grey); the TypeScript decoder decodes the rest as djpeg does.
        if (this.#backend !== "auto" || !/determine subsampling type/.test(String(e))) throw e;
        tj = undefined;
      }
      // Without libjpeg-turbo, the TypeScript decoder's header check: the size before the scans.
      const h = header ?? jpegInfo(bytes);
      this.#lastJpeg = [h.height, h.width];
      if (h.width * h.height > this.maxPixels) {
        throw new ImageDecodeError(
          `image of ${h.width}x${h.height} = ${
            h.width * h.height
          } pixels exceeds the limit of ${this.maxPixels} (maxPixels)`,
        );
      }
      let scaled = want
        ? TurboJpeg.scaledSize(h.height, h.width, want[0], want[1])
        : { height: h.height, width: h.width, denom: 1 };
      if (target.crop && want) {
        const swap = orientation >= 5;
        box = target.crop(swap ? h.width : h.height, swap ? h.height : h.width);
        // The DCT scale that keeps the region at least the size asked (in stored axes).
        const [bh, bw] = swap ? [box.width, box.height] : [box.height, box.width];
        scaled = TurboJpeg.scaledSize(
          h.height,
          h.width,
          Math.ceil((want[0] * h.height) / bh),
          Math.ceil((want[1] * h.width) / bw),
        );
      }
      const need = scaled.height * scaled.width * this.channels;
      const direct = orientation === 1 && target.out !== undefined && box === undefined &&
        (want === undefined
          ? target.out.length >= need
          : scaled.height === want[0] && scaled.width === want[1]);
      // An image resized afterwards is decoded into a buffer kept between calls: a fresh one
      // each time costs its allocation and zeroing, as much as a tenth of the decode.
      const into = direct ? target.out : want !== undefined ? this.#scratchOf(need) : undefined;
      img = tj
        ? tj.decode(bytes, this.channels, header!, scaled, into)
        : decodeJpegTs(bytes, this.channels, {
          out: into,
          scale: turboJpegScale(h, scaled),
          maxPixels: this.maxPixels,
        });
      if (direct) return img;
    } else {
      const fast = this.#native.pngFast?.decode(bytes, this.channels, this.maxPixels);
      if (fast !== undefined) {
        // In the WebAssembly memory: read there by the resize, copied out otherwise.
        img = size === undefined ? { ...fast, data: fast.data.slice() } : fast;
        if (size !== undefined) this.#scratch = fast.data;
      } else if (this.#native.png) {
        img = this.#native.png.decode(
          bytes,
          this.channels,
          this.maxPixels,
          size === undefined || orientation !== 1 || target.crop
            ? undefined
            : directPng(bytes, size, target.out),
        );
      } else {
        img = decodePngTs(bytes, this.channels, this.maxPixels);
      }
    }
    img = applyOrientation(img, orientation);
    if (size === undefined) return img;
    if (target.crop) {
      if (box === undefined) box = target.crop(img.height, img.width);
      else {
        // Decoded at a DCT scale: the region scales with the image (upright sizes).
        const full = orientation >= 5 ? [this.#lastJpeg[1], this.#lastJpeg[0]] : this.#lastJpeg;
        const sy = img.height / full[0], sx = img.width / full[1];
        const top = Math.min(img.height - 1, Math.floor(box.top * sy));
        const left = Math.min(img.width - 1, Math.floor(box.left * sx));
        box = {
          top,
          left,
          height: Math.max(1, Math.min(img.height - top, Math.round(box.height * sy))),
          width: Math.max(1, Math.min(img.width - left, Math.round(box.width * sx))),
        };
      }
    }
    const r = resizeBilinear(img, size[0], size[1], true, target.out, box);
    // Never hand out the scratch buffer: the next decode overwrites it.
    return r.data.buffer === this.#scratch.buffer ? { ...r, data: r.data.slice() } : r;
  }
}

/**
 * Encodes 8-bit pixels as a JPEG with libjpeg-turbo (4:2:0 for colour), to generate image
 * files without other tools.
 *
 * @param image HWC pixels, 1 or 3 channels
 * @param quality 1-100 (default 90)
 * @returns the file's bytes
 * @throws {Error} when libjpeg-turbo cannot be loaded (the reason and the package)
 * @example A grey gradient, encoded and decoded again
 * ```ts
 * import { encodeJpeg, ImageDecoder } from "./mod.ts";
 * import assert from "node:assert";
 * const data = Uint8Array.from({ length: 16 * 16 * 3 }, (_, i) => (i / 3) & 0xff);
 * const jpeg = encodeJpeg({ data, height: 16, width: 16, channels: 3 }, 95);
 * const back = new ImageDecoder().decode(jpeg);
 * assert.deepStrictEqual([back.height, back.width], [16, 16]);
 * ```
 */
export function encodeJpeg(image: DecodedImage, quality = 90): Uint8Array {
  const n = loadNative();
  if (n.jpeg === undefined) throw new Error(`Cannot encode a JPEG: ${n.jpegWhy}`);
  return n.jpeg.encode(image, quality);
}

/**
 * The scale TurboJPEG decodes at for an output size: the largest factor that fits it. For
 * images a few pixels across that is larger than the size's own denominator (a 2x2 image
 * asked at 1x1 decodes at 1/2, not 1/8), and the pixels differ.
 */
function turboJpegScale(
  image: { height: number; width: number },
  size: { height: number; width: number },
): 1 | 2 | 4 | 8 {
  for (const d of [1, 2, 4, 8] as const) {
    if (Math.ceil(image.height / d) <= size.height && Math.ceil(image.width / d) <= size.width) {
      return d;
    }
  }
  return 8;
}

/** `out` when a PNG is already of the size asked (decoded straight into it), else undefined. */
function directPng(
  bytes: Uint8Array,
  size: readonly [number, number],
  out: Uint8Array | undefined,
): Uint8Array | undefined {
  if (out === undefined) return undefined;
  const h = pngHeader(bytes);
  return h.height === size[0] && h.width === size[1] ? out : undefined;
}
