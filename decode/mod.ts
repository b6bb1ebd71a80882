/**
 * pinstream's image decoders: JPEG through libjpeg-turbo (TurboJPEG) and PNG through libspng,
 * both loaded with Deno.dlopen, or PNG in TypeScript where FFI is not allowed or the library
 * is missing. The file type comes from the magic bytes. The loader's image datasets import
 * this module only when they decode, in the thread that decodes (a worker), so a DataLoader
 * over other datasets never needs FFI.
 *
 * @module
 */

import { applyOrientation, exifOrientation } from "./exif.ts";
import { sniffImageType } from "./format.ts";
import { decodePngTs, pngHeader } from "./png.ts";
import { resizeBilinear } from "./resize.ts";
import { Spng, SPNG_LIBRARY } from "./spng.ts";
import { TurboJpeg, TURBOJPEG_LIBRARY } from "./turbojpeg.ts";
import { type Channels, type DecodedImage, ImageDecodeError } from "./types.ts";

export { type Channels, type DecodedImage, ImageDecodeError } from "./types.ts";
export { type ImageType, sniffImageType } from "./format.ts";
export { applyOrientation, exifOrientation } from "./exif.ts";
export { resizeBilinear } from "./resize.ts";

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

/** Where a decode goes and how small it may be. */
export interface DecodeTarget {
  /**
   * The exact output size: decoded at the smallest DCT scale covering it, then resized
   * (bilinear, antialiased) into `out` when given.
   */
  size?: readonly [height: number, width: number];
  /** Where the pixels go when `size` is given (`size[0] * size[1] * channels` bytes). */
  out?: Uint8Array;
}

interface Native {
  jpeg?: TurboJpeg;
  png?: Spng;
  jpegWhy: string;
  pngWhy: string;
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
  const n: Native = { jpegWhy: "", pngWhy: "" };
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
  /** "turbojpeg", or "unavailable" (JPEG files are then refused with the reason). */
  readonly jpeg: "turbojpeg" | "unavailable";
  /** "spng" or "typescript". */
  readonly png: "spng" | "typescript";
  /** One line: which decoders run and why. */
  readonly description: string;
  #native: Native;

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
    if (!["auto", "native", "typescript"].includes(backend)) {
      throw new RangeError(
        `Cannot create an image decoder: backend should be "auto", "native" or "typescript", got ${
          JSON.stringify(backend)
        }`,
      );
    }
    this.#native = backend === "typescript"
      ? { jpegWhy: 'backend "typescript" asked', pngWhy: 'backend "typescript" asked' }
      : loadNative();
    if (backend === "native" && (!this.#native.jpeg || !this.#native.png)) {
      throw new Error(
        `Cannot create an image decoder with backend "native": ${
          [this.#native.jpegWhy, this.#native.pngWhy].filter((s) => s).join("; ")
        }`,
      );
    }
    this.jpeg = this.#native.jpeg ? "turbojpeg" : "unavailable";
    this.png = this.#native.png ? "spng" : "typescript";
    this.description = `image decoders: JPEG ${
      this.#native.jpeg ? "libjpeg-turbo (TurboJPEG)" : `unavailable (${this.#native.jpegWhy})`
    }; PNG ${this.#native.png ? "libspng" : `TypeScript fallback (${this.#native.pngWhy})`}`;
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
    const size = target.size;
    // Orientations 5-8 swap the sides: the size asked is of the upright image.
    const want = size && orientation >= 5 ? [size[1], size[0]] as const : size;
    let img: DecodedImage;
    if (type === "jpeg") {
      const tj = this.#native.jpeg;
      if (tj === undefined) {
        throw new ImageDecodeError(
          `JPEG needs libjpeg-turbo, and it is unavailable: ${this.#native.jpegWhy}`,
        );
      }
      const h = tj.header(bytes);
      if (h.width * h.height > this.maxPixels) {
        throw new ImageDecodeError(
          `image of ${h.width}x${h.height} = ${
            h.width * h.height
          } pixels exceeds the limit of ${this.maxPixels} (maxPixels)`,
        );
      }
      const scaled = want
        ? TurboJpeg.scaledSize(h.height, h.width, want[0], want[1])
        : { height: h.height, width: h.width };
      const direct = want !== undefined && orientation === 1 && target.out !== undefined &&
        scaled.height === want[0] && scaled.width === want[1];
      img = tj.decode(bytes, this.channels, h, scaled, direct ? target.out : undefined);
      if (direct) return img;
    } else if (this.#native.png) {
      img = this.#native.png.decode(
        bytes,
        this.channels,
        this.maxPixels,
        size === undefined || orientation !== 1 ? undefined : directPng(bytes, size, target.out),
      );
    } else {
      img = decodePngTs(bytes, this.channels, this.maxPixels);
    }
    img = applyOrientation(img, orientation);
    if (size === undefined) return img;
    return resizeBilinear(img, size[0], size[1], true, target.out);
  }
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
