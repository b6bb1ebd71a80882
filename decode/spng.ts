/**
 * PNG decoding through libspng (libspng.so.0), loaded with Deno.dlopen: a context per image,
 * CRC and Adler-32 checked, tRNS applied for RGBA output, 16-bit samples to their high byte.
 *
 * @module
 */

import { type Channels, type DecodedImage, ImageDecodeError } from "./types.ts";
import { grey } from "./png.ts";

const SYMBOLS = {
  spng_ctx_new: { parameters: ["i32"], result: "pointer" },
  spng_ctx_free: { parameters: ["pointer"], result: "void" },
  spng_set_png_buffer: { parameters: ["pointer", "buffer", "usize"], result: "i32" },
  spng_set_image_limits: { parameters: ["pointer", "u32", "u32"], result: "i32" },
  spng_get_ihdr: { parameters: ["pointer", "buffer"], result: "i32" },
  spng_decoded_image_size: { parameters: ["pointer", "i32", "buffer"], result: "i32" },
  spng_decode_image: {
    parameters: ["pointer", "buffer", "usize", "i32", "i32"],
    result: "i32",
  },
  spng_strerror: { parameters: ["i32"], result: "pointer" },
} as const;

/** The library file dlopen looks for (Debian: `apt-get install libspng0`). */
export const SPNG_LIBRARY = "libspng.so.0";

const SPNG_FMT_RGBA8 = 1, SPNG_FMT_RGB8 = 4, SPNG_DECODE_TRNS = 1;

/** libspng, loaded. */
export class Spng {
  #lib: Deno.DynamicLibrary<typeof SYMBOLS>;
  #ihdr = new Uint8Array(16);
  #size = new BigUint64Array(1);

  /**
   * Loads the library.
   *
   * @throws what Deno.dlopen throws (no FFI permission, library missing).
   */
  constructor(path = SPNG_LIBRARY) {
    this.#lib = Deno.dlopen(path, SYMBOLS);
  }

  #reason(rc: number): string {
    const p = this.#lib.symbols.spng_strerror(rc);
    return p === null ? `error ${rc}` : Deno.UnsafePointerView.getCString(p);
  }

  /**
   * Decodes a PNG.
   *
   * @param bytes the file
   * @param channels 1 (Pillow's grey weights), 3 (alpha dropped) or 4 (RGBA, tRNS applied)
   * @param maxPixels images with more pixels are refused before decoding
   * @param out where the pixels go, when their size is known (e.g. a ring slot)
   */
  decode(bytes: Uint8Array, channels: Channels, maxPixels: number, out?: Uint8Array): DecodedImage {
    const s = this.#lib.symbols;
    const ctx = s.spng_ctx_new(0);
    if (ctx === null) throw new Error("Cannot start a libspng context: spng_ctx_new returned NULL");
    try {
      const fail = (rc: number, what: string) => {
        if (rc !== 0) throw new ImageDecodeError(`PNG ${what}: ${this.#reason(rc)}`);
      };
      fail(
        s.spng_set_png_buffer(ctx, bytes as Uint8Array<ArrayBuffer>, BigInt(bytes.length)),
        "is unreadable",
      );
      fail(s.spng_get_ihdr(ctx, this.#ihdr), "header is truncated or corrupt");
      const v = new DataView(this.#ihdr.buffer);
      const width = v.getUint32(0, true), height = v.getUint32(4, true);
      if (width * height > maxPixels) {
        throw new ImageDecodeError(
          `image of ${width}x${height} = ${
            width * height
          } pixels exceeds the limit of ${maxPixels} (maxPixels)`,
        );
      }
      const fmt = channels === 4 ? SPNG_FMT_RGBA8 : SPNG_FMT_RGB8;
      fail(s.spng_decoded_image_size(ctx, fmt, new Uint8Array(this.#size.buffer)), "size");
      const bytesOut = Number(this.#size[0]);
      const n = width * height;
      const direct = channels !== 1 && out !== undefined;
      if (direct && out!.length < bytesOut) {
        throw new RangeError(
          `Cannot decode into ${out!.length} bytes: the image needs ${bytesOut}`,
        );
      }
      const target = direct ? out!.subarray(0, bytesOut) : new Uint8Array(bytesOut);
      fail(
        s.spng_decode_image(
          ctx,
          target as Uint8Array<ArrayBuffer>,
          BigInt(bytesOut),
          fmt,
          channels === 4 ? SPNG_DECODE_TRNS : 0,
        ),
        "data is truncated or corrupt",
      );
      if (channels !== 1) return { data: target, height, width, channels };
      const g = out ?? new Uint8Array(n);
      for (let i = 0, p = 0; i < n; i++, p += 3) {
        g[i] = grey(target[p], target[p + 1], target[p + 2]);
      }
      return { data: g.subarray(0, n), height, width, channels };
    } finally {
      s.spng_ctx_free(ctx);
    }
  }

  /** Closes the library. */
  dispose(): void {
    this.#lib.close();
  }

  /** Same as {@linkcode dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
