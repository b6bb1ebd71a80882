/**
 * The common PNG, decoded fast: 8-bit, not interlaced, without tRNS, grey to 1 channel, RGB to
 * 3 or RGBA to 4. libdeflate (`libdeflate.so.0`) checks every chunk's CRC, inflates the image
 * data at once and checks its Adler-32; decode/_simd.wat undoes the scanline filters. About
 * twice libspng's rate on photographs, whose time is zlib's inflate.
 *
 * Anything else, and any file this path finds wrong (a CRC, the stream, a filter type), goes to
 * libspng instead ({@linkcode PngFast.decode} returns undefined), so PNGs outside the fast
 * subset decode as before and a corrupt file fails with libspng's reason. The pixels are the
 * same: a PNG's are lossless.
 *
 * @module
 */

import type { Channels, DecodedImage } from "./types.ts";
import { wasmPng, wasmResizeAvailable } from "./_simd.ts";
import { pngHeader, u32 } from "./png.ts";

const SYMBOLS = {
  libdeflate_alloc_decompressor: { parameters: [], result: "pointer" },
  libdeflate_free_decompressor: { parameters: ["pointer"], result: "void" },
  libdeflate_zlib_decompress: {
    parameters: ["pointer", "buffer", "usize", "buffer", "usize", "buffer"],
    result: "i32",
  },
  libdeflate_crc32: { parameters: ["u32", "buffer", "usize"], result: "u32" },
} as const;

/** The library file dlopen looks for (Debian: `apt-get install libdeflate0`). */
export const LIBDEFLATE_LIBRARY = "libdeflate.so.0";

/** The channels each fast colour type gives, as asked (grey 0, RGB 2, RGBA 6). */
const FAST: Record<number, Channels> = { 0: 1, 2: 3, 6: 4 };

/** libdeflate and the WebAssembly unfilter, loaded. */
export class PngFast {
  #lib: Deno.DynamicLibrary<typeof SYMBOLS>;
  #decompressor: Deno.PointerValue;
  #actual = new BigUint64Array(1);
  #actualBytes = new Uint8Array(this.#actual.buffer);

  /**
   * Loads libdeflate.
   *
   * @throws what Deno.dlopen throws (no FFI permission, library missing), or an Error when
   *   WebAssembly SIMD is missing.
   */
  constructor(path = LIBDEFLATE_LIBRARY) {
    if (!wasmResizeAvailable()) throw new Error("no WebAssembly SIMD");
    this.#lib = Deno.dlopen(path, SYMBOLS);
    this.#decompressor = this.#lib.symbols.libdeflate_alloc_decompressor();
    if (this.#decompressor === null) {
      this.#lib.close();
      throw new Error("libdeflate_alloc_decompressor returned NULL");
    }
  }

  #crc(b: Uint8Array, from: number, to: number): number {
    return this.#lib.symbols.libdeflate_crc32(
      0,
      b.subarray(from, to) as Uint8Array<ArrayBuffer>,
      BigInt(to - from),
    );
  }

  /**
   * Decodes a PNG of the fast subset.
   *
   * @param bytes the file
   * @param channels what is asked: 1, 3 or 4
   * @param maxPixels larger images are left to libspng, which refuses them
   * @returns the pixels in the module's memory (valid until its next use: copy them to keep
   *   them), or undefined for libspng to decode the file
   */
  decode(bytes: Uint8Array, channels: Channels, maxPixels: number): DecodedImage | undefined {
    const b = bytes;
    if (b.length < 33 || u32(b, 8) !== 13) return undefined;
    let header;
    try {
      header = pngHeader(b);
    } catch {
      return undefined; // libspng names what is wrong
    }
    const { width, height, bitDepth, colorType, interlace } = header;
    if (bitDepth !== 8 || interlace !== 0 || FAST[colorType] !== channels) return undefined;
    if (width === 0 || height === 0 || width * height > maxPixels) return undefined;
    // The chunks: every CRC checked, the image data gathered.
    const idat: [number, number][] = [];
    let p = 8, total = 0, ended = false;
    while (p + 12 <= b.length) {
      const len = u32(b, p), end = p + 12 + len;
      if (end > b.length || this.#crc(b, p + 4, p + 8 + len) !== u32(b, p + 8 + len)) {
        return undefined;
      }
      const type = u32(b, p + 4);
      if (type === 0x49444154) idat.push([p + 8, p + 8 + len]), total += len; // IDAT
      else if (type === 0x74524e53) return undefined; // tRNS: libspng applies it
      else if (type === 0x49454e44) { // IEND
        ended = true;
        break;
      }
      p = end;
    }
    if (!ended || idat.length === 0) return undefined;
    const bpp = channels, rowBytes = width * bpp;
    const scratch = wasmPng(height, rowBytes, bpp)!;
    const stream = idat.length === 1 ? b.subarray(idat[0][0], idat[0][1]) : new Uint8Array(total);
    if (idat.length > 1) {
      let o = 0;
      for (const [from, to] of idat) stream.set(b.subarray(from, to), o), o += to - from;
    }
    const out = scratch.inflated;
    const rc = this.#lib.symbols.libdeflate_zlib_decompress(
      this.#decompressor,
      stream as Uint8Array<ArrayBuffer>,
      BigInt(stream.length),
      out as Uint8Array<ArrayBuffer>,
      BigInt(out.length),
      this.#actualBytes,
    );
    if (rc !== 0 || Number(this.#actual[0]) !== out.length) return undefined;
    const data = scratch.unfilter();
    if (typeof data === "number") return undefined;
    return { data, height, width, channels };
  }

  /** Frees the decompressor and closes the library. */
  dispose(): void {
    this.#lib.symbols.libdeflate_free_decompressor(this.#decompressor);
    this.#lib.close();
  }

  /** Same as {@linkcode dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
