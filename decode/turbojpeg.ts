/**
 * JPEG decoding through libjpeg-turbo's TurboJPEG API (libturbojpeg.so.0, the 2.x `tj*`
 * functions that every libjpeg-turbo since 1.4 exports), loaded with Deno.dlopen. One
 * decompressor per thread, reused. Accurate integer IDCT and fancy upsampling, the settings
 * of djpeg and Pillow, so the pixels are theirs bit for bit. DCT-domain downscaling by 1/2,
 * 1/4 or 1/8 when the caller's minimum size allows it.
 *
 * @module
 */

import { type Channels, type DecodedImage, ImageDecodeError } from "./types.ts";
import { grey } from "./png.ts";

const SYMBOLS = {
  tjInitDecompress: { parameters: [], result: "pointer" },
  tjDecompressHeader3: {
    parameters: ["pointer", "buffer", "u64", "buffer", "buffer", "buffer", "buffer"],
    result: "i32",
  },
  tjDecompress2: {
    parameters: ["pointer", "buffer", "u64", "buffer", "i32", "i32", "i32", "i32", "i32"],
    result: "i32",
  },
  tjGetErrorStr2: { parameters: ["pointer"], result: "pointer" },
  tjGetErrorCode: { parameters: ["pointer"], result: "i32" },
  tjDestroy: { parameters: ["pointer"], result: "i32" },
  tjInitCompress: { parameters: [], result: "pointer" },
  tjCompress2: {
    parameters: [
      "pointer",
      "buffer",
      "i32",
      "i32",
      "i32",
      "i32",
      "buffer",
      "buffer",
      "i32",
      "i32",
      "i32",
    ],
    result: "i32",
  },
  tjFree: { parameters: ["pointer"], result: "void" },
} as const;

/** The library file dlopen looks for (Debian: `apt-get install libturbojpeg0`). */
export const TURBOJPEG_LIBRARY = "libturbojpeg.so.0";

const TJPF_RGB = 0, TJPF_GRAY = 6, TJPF_RGBA = 7, TJPF_CMYK = 11;
const TJCS_GRAY = 2, TJCS_CMYK = 3, TJCS_YCCK = 4;
const TJERR_WARNING = 0;
const TJFLAG_STOPONWARNING = 8192;
/** The scales tried, largest reduction first: the IDCT's fast paths (8x8 -> 1x1, 2x2, 4x4). */
const SCALES = [8, 4, 2, 1];

/** A JPEG's header: its size and colour space (TJCS_*). */
export interface JpegHeader {
  width: number;
  height: number;
  colorspace: number;
  subsampling: number;
}

/** Decompressor state of one thread. */
export class TurboJpeg {
  #lib: Deno.DynamicLibrary<typeof SYMBOLS>;
  #handle: Deno.PointerValue;
  #ints = new Int32Array(4);
  #intBytes = [0, 1, 2, 3].map((i) => new Uint8Array(this.#ints.buffer, 4 * i, 4));

  /**
   * Loads the library.
   *
   * @throws what Deno.dlopen throws (no FFI permission, library missing).
   */
  constructor(path = TURBOJPEG_LIBRARY) {
    this.#lib = Deno.dlopen(path, SYMBOLS);
    this.#handle = this.#lib.symbols.tjInitDecompress();
    if (this.#handle === null) {
      this.#lib.close();
      throw new Error("Cannot start a TurboJPEG decompressor: tjInitDecompress returned NULL");
    }
  }

  #error(): { message: string; warning: boolean } {
    const s = this.#lib.symbols;
    const p = s.tjGetErrorStr2(this.#handle);
    const message = p === null ? "unknown error" : Deno.UnsafePointerView.getCString(p);
    const warning = s.tjGetErrorCode(this.#handle) === TJERR_WARNING;
    // A decompressor that failed inside a header keeps that state (libjpeg-turbo 2.1): the
    // next file then fails with this file's error. A fresh one decodes it.
    s.tjDestroy(this.#handle);
    this.#handle = s.tjInitDecompress();
    if (this.#handle === null) {
      throw new Error("Cannot start a TurboJPEG decompressor: tjInitDecompress returned NULL");
    }
    return { message, warning };
  }

  /** The size and colour space of a JPEG. */
  header(bytes: Uint8Array): JpegHeader {
    const [w, h, ss, cs] = this.#intBytes;
    // A tables-only stream leaves the outputs untouched: no stale size from the last file.
    this.#ints.fill(0);
    const rc = this.#lib.symbols.tjDecompressHeader3(
      this.#handle,
      bytes as Uint8Array<ArrayBuffer>,
      BigInt(bytes.length),
      w as Uint8Array<ArrayBuffer>,
      h as Uint8Array<ArrayBuffer>,
      ss as Uint8Array<ArrayBuffer>,
      cs as Uint8Array<ArrayBuffer>,
    );
    if (rc !== 0) throw new ImageDecodeError(`JPEG header is corrupt (${this.#error().message})`);
    const [width, height, subsampling, colorspace] = this.#ints;
    // A stream that ends before its frame header reads as tables only, of size 0.
    if (width <= 0 || height <= 0) {
      throw new ImageDecodeError("JPEG header is truncated (no frame header before the end)");
    }
    return { width, height, colorspace, subsampling };
  }

  /**
   * The scaled size of a `width` x `height` JPEG at the largest reduction (1/8, 1/4, 1/2, 1)
   * that keeps both sides at or above `minHeight` x `minWidth`.
   */
  static scaledSize(
    height: number,
    width: number,
    minHeight: number,
    minWidth: number,
  ): { height: number; width: number; denom: number } {
    for (const d of SCALES) {
      const sh = Math.ceil(height / d), sw = Math.ceil(width / d);
      if (sh >= minHeight && sw >= minWidth) return { height: sh, width: sw, denom: d };
    }
    return { height, width, denom: 1 };
  }

  /**
   * Decodes a JPEG.
   *
   * @param bytes the file
   * @param channels 1 (the luma plane; for CMYK, Pillow's weights of its RGB), 3 or 4
   * @param header from {@linkcode header}
   * @param size the output size (from {@linkcode scaledSize}, or the full size)
   * @param out where the pixels go (`height * width * channels` bytes), e.g. a ring slot
   */
  decode(
    bytes: Uint8Array,
    channels: Channels,
    header: JpegHeader,
    size: { height: number; width: number },
    out?: Uint8Array,
  ): DecodedImage {
    const cmyk = header.colorspace === TJCS_CMYK || header.colorspace === TJCS_YCCK;
    const n = size.height * size.width;
    const dst = out ?? new Uint8Array(n * channels);
    if (dst.length < n * channels) {
      throw new RangeError(
        `Cannot decode into ${dst.length} bytes: the image needs ${n * channels}`,
      );
    }
    let target = dst, format: number;
    if (cmyk) {
      target = new Uint8Array(n * 4);
      format = TJPF_CMYK;
    } else format = channels === 1 ? TJPF_GRAY : channels === 3 ? TJPF_RGB : TJPF_RGBA;
    const run = (flags: number) =>
      this.#lib.symbols.tjDecompress2(
        this.#handle,
        bytes as Uint8Array<ArrayBuffer>,
        BigInt(bytes.length),
        target as Uint8Array<ArrayBuffer>,
        size.width,
        0,
        size.height,
        format,
        flags,
      );
    // Stop at the first warning: TurboJPEG reports any error after a warning as a warning too
    // (with that error's message), so only the first one says what happened.
    if (run(TJFLAG_STOPONWARNING) !== 0) {
      const first = this.#error();
      // libjpeg reports a truncated file as a warning and fills the rest grey: refuse it,
      // as Pillow does; likewise corrupt data.
      if (!first.warning || /premature end|corrupt|bad huffman/i.test(first.message)) {
        throw decodeError(first.message);
      }
      // Other warnings (an inconsistent progression, an unknown JFIF version) leave good
      // pixels: decode through them, refusing anything else that goes wrong.
      if (run(0) !== 0) {
        const e = this.#error();
        if (!e.warning || e.message !== first.message) throw decodeError(e.message);
      }
    }
    if (cmyk) cmykToChannels(target, dst, n, channels);
    return {
      data: dst.subarray(0, n * channels),
      height: size.height,
      width: size.width,
      channels,
    };
  }

  #compressor: Deno.PointerValue = null;

  /**
   * Encodes 8-bit pixels as a baseline JPEG (4:2:0 for colour), for generating test and
   * example data without other tools.
   *
   * @param image HWC pixels, 1 or 3 channels
   * @param quality 1-100
   * @returns the JPEG file's bytes
   */
  encode(image: DecodedImage, quality = 90): Uint8Array {
    const s = this.#lib.symbols;
    if (image.channels !== 1 && image.channels !== 3) {
      throw new RangeError(`Cannot encode a JPEG of ${image.channels} channels (1 or 3)`);
    }
    this.#compressor ??= s.tjInitCompress();
    if (this.#compressor === null) throw new Error("Cannot start a TurboJPEG compressor");
    const out = new BigUint64Array(1), size = new BigUint64Array(1);
    const rc = s.tjCompress2(
      this.#compressor,
      image.data as Uint8Array<ArrayBuffer>,
      image.width,
      0,
      image.height,
      image.channels === 1 ? TJPF_GRAY : TJPF_RGB,
      new Uint8Array(out.buffer),
      new Uint8Array(size.buffer),
      image.channels === 1 ? 3 : 2,
      quality,
      0,
    );
    const ptr = Deno.UnsafePointer.create(out[0]);
    try {
      if (rc !== 0 || ptr === null) {
        const p = s.tjGetErrorStr2(this.#compressor);
        throw new Error(
          `Cannot encode a JPEG: ${
            p === null ? "unknown error" : Deno.UnsafePointerView.getCString(p)
          }`,
        );
      }
      return new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(ptr, Number(size[0])).slice(0));
    } finally {
      if (ptr !== null) s.tjFree(ptr);
    }
  }

  /** Frees the decompressor (and compressor) and closes the library. */
  dispose(): void {
    if (this.#handle !== null) {
      this.#lib.symbols.tjDestroy(this.#handle);
      if (this.#compressor !== null) this.#lib.symbols.tjDestroy(this.#compressor);
      this.#handle = null;
      this.#compressor = null;
      this.#lib.close();
    }
  }

  /** Same as {@linkcode dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

function decodeError(message: string): ImageDecodeError {
  return new ImageDecodeError(
    /premature end/i.test(message)
      ? `JPEG data is truncated (${message})`
      : `JPEG data is corrupt (${message})`,
  );
}

/** Whether a JPEG colour space needs the CMYK conversion. */
export function isCmyk(colorspace: number): boolean {
  return colorspace === TJCS_CMYK || colorspace === TJCS_YCCK;
}

/** Whether a JPEG is greyscale. */
export function isGreyJpeg(colorspace: number): boolean {
  return colorspace === TJCS_GRAY;
}

/**
 * CMYK (as libjpeg returns it for Adobe files: inverted, 255 = no ink) to RGB the way djpeg
 * writes it to PPM: R = round(C * K / 255).
 */
export function cmykToChannels(
  cmyk: Uint8Array,
  out: Uint8Array,
  n: number,
  channels: Channels,
): void {
  for (let i = 0, s = 0; i < n; i++, s += 4) {
    const k = cmyk[s + 3];
    const r = Math.round((cmyk[s] * k) / 255);
    const g = Math.round((cmyk[s + 1] * k) / 255);
    const b = Math.round((cmyk[s + 2] * k) / 255);
    if (channels === 1) out[i] = grey(r, g, b);
    else {
      const o = i * channels;
      out[o] = r, out[o + 1] = g, out[o + 2] = b;
      if (channels === 4) out[o + 3] = 255;
    }
  }
}
