/**
 * A PNG decoder in TypeScript: the fallback where libspng cannot be loaded (no FFI
 * permission in the workers, or the library missing). Every bit depth and colour type,
 * Adam7 interlacing, tRNS transparency and CRC checks; inflate is node:zlib's. Gives the
 * same pixels as the libspng path (16-bit samples keep their high byte, low bit depths are
 * scaled to 0-255).
 *
 * @module
 */

import { inflateSync } from "node:zlib";
import { type Channels, type DecodedImage, ImageDecodeError } from "./types.ts";

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

function crc32(b: Uint8Array, from: number, to: number): number {
  let c = 0xffffffff;
  for (let i = from; i < to; i++) c = CRC_TABLE[(c ^ b[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** The header fields of a PNG (IHDR). */
export interface PngHeader {
  width: number;
  height: number;
  bitDepth: number;
  colorType: number;
  interlace: number;
}

/** The big-endian u32 at `at`. */
export const u32 = (b: Uint8Array, at: number): number =>
  ((b[at] << 24) | (b[at + 1] << 16) | (b[at + 2] << 8) | b[at + 3]) >>> 0;

/**
 * The size and format of a PNG from its IHDR chunk, without decoding.
 *
 * @throws {ImageDecodeError} for a file too short or with no IHDR first.
 */
export function pngHeader(b: Uint8Array): PngHeader {
  if (b.length < 33 || String.fromCharCode(b[12], b[13], b[14], b[15]) !== "IHDR") {
    throw new ImageDecodeError("PNG header is truncated or has no IHDR chunk");
  }
  return {
    width: u32(b, 16),
    height: u32(b, 20),
    bitDepth: b[24],
    colorType: b[25],
    interlace: b[28],
  };
}

const SAMPLES: Record<number, number> = { 0: 1, 2: 3, 3: 1, 4: 2, 6: 4 };
const DEPTHS: Record<number, number[]> = {
  0: [1, 2, 4, 8, 16],
  2: [8, 16],
  3: [1, 2, 4, 8],
  4: [8, 16],
  6: [8, 16],
};
// Adam7 passes: x start, y start, x step, y step.
const ADAM7 = [
  [0, 0, 8, 8],
  [4, 0, 8, 8],
  [0, 4, 4, 8],
  [2, 0, 4, 4],
  [0, 2, 2, 4],
  [1, 0, 2, 2],
  [0, 1, 1, 2],
];

function paeth(a: number, b: number, c: number): number {
  const p = a + b - c;
  const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/** Undoes the filters of `rows` scanlines of `rowBytes` bytes in place; returns the end. */
function unfilter(
  d: Uint8Array,
  at: number,
  rows: number,
  rowBytes: number,
  bpp: number,
): number {
  let prev = -1;
  for (let y = 0; y < rows; y++) {
    if (at + 1 + rowBytes > d.length) {
      throw new ImageDecodeError("PNG image data is truncated");
    }
    const f = d[at], row = at + 1;
    for (let i = 0; i < rowBytes; i++) {
      const a = i >= bpp ? d[row + i - bpp] : 0;
      const b = prev >= 0 ? d[prev + i] : 0;
      const c = prev >= 0 && i >= bpp ? d[prev + i - bpp] : 0;
      let v: number;
      switch (f) {
        case 0:
          v = 0;
          break;
        case 1:
          v = a;
          break;
        case 2:
          v = b;
          break;
        case 3:
          v = (a + b) >>> 1;
          break;
        case 4:
          v = paeth(a, b, c);
          break;
        default:
          throw new ImageDecodeError(`PNG row ${y} has an unknown filter type ${f}`);
      }
      d[row + i] = (d[row + i] + v) & 0xff;
    }
    prev = row;
    at = row + rowBytes;
  }
  return at;
}

/**
 * Decodes a PNG to 8-bit pixels.
 *
 * @param bytes the file
 * @param channels 1 (grey, Pillow's weights for colour), 3 (RGB, alpha dropped) or 4 (RGBA)
 * @param maxPixels images with more pixels are refused before decoding
 * @returns the pixels, HWC
 * @throws {ImageDecodeError} for a truncated, corrupt or too large file.
 * @example
 * ```ts
 * import { decodePngTs } from "./png.ts";
 * import { deflateSync } from "node:zlib";
 * import assert from "node:assert";
 * // A 1x2 8-bit grey PNG built by hand.
 * const chunk = (type: string, data: Uint8Array) => {
 *   const out = new Uint8Array(12 + data.length);
 *   new DataView(out.buffer).setUint32(0, data.length);
 *   out.set(new TextEncoder().encode(type), 4);
 *   out.set(data, 8);
 *   return out; // CRC left 0: checked below with a wrong-CRC error
 * };
 * const ihdr = new Uint8Array([0, 0, 0, 2, 0, 0, 0, 1, 8, 0, 0, 0, 0]);
 * const idat = new Uint8Array(deflateSync(new Uint8Array([0, 10, 20])));
 * const png = new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10, ...chunk("IHDR", ihdr),
 *   ...chunk("IDAT", idat), ...chunk("IEND", new Uint8Array())]);
 * assert.throws(() => decodePngTs(png, 1), /CRC/);
 * ```
 */
export function decodePngTs(
  bytes: Uint8Array,
  channels: Channels,
  maxPixels = Infinity,
): DecodedImage {
  const b = bytes;
  const h = pngHeader(b);
  const { width: w, height: ht, bitDepth: depth, colorType: ct } = h;
  if (!(ct in SAMPLES) || !DEPTHS[ct].includes(depth)) {
    throw new ImageDecodeError(
      `PNG has colour type ${ct} with bit depth ${depth}, not a valid pair`,
    );
  }
  if (w === 0 || ht === 0) throw new ImageDecodeError(`PNG has an empty size ${w}x${ht}`);
  if (w * ht > maxPixels) {
    throw new ImageDecodeError(
      `image of ${w}x${ht} = ${w * ht} pixels exceeds the limit of ${maxPixels} (maxPixels)`,
    );
  }
  if (h.interlace > 1) {
    throw new ImageDecodeError(`PNG has unknown interlace method ${h.interlace}`);
  }
  let palette: Uint8Array | undefined, trns: Uint8Array | undefined;
  const idat: Uint8Array[] = [];
  let p = 8, ended = false;
  while (p + 12 <= b.length) {
    const len = u32(b, p);
    const type = String.fromCharCode(b[p + 4], b[p + 5], b[p + 6], b[p + 7]);
    if (p + 12 + len > b.length) throw new ImageDecodeError(`PNG chunk ${type} is truncated`);
    if (crc32(b, p + 4, p + 8 + len) !== u32(b, p + 8 + len)) {
      throw new ImageDecodeError(`PNG chunk ${type} has a wrong CRC (corrupt file)`);
    }
    const data = b.subarray(p + 8, p + 8 + len);
    if (type === "PLTE") palette = data;
    else if (type === "tRNS") trns = data;
    else if (type === "IDAT") idat.push(data);
    else if (type === "IEND") {
      ended = true;
      break;
    }
    p += 12 + len;
  }
  if (idat.length === 0) throw new ImageDecodeError("PNG has no image data (truncated)");
  if (ct === 3 && palette === undefined) {
    throw new ImageDecodeError("PNG palette image has no PLTE chunk");
  }
  let joined: Uint8Array;
  if (idat.length === 1) joined = idat[0];
  else {
    joined = new Uint8Array(idat.reduce((s, d) => s + d.length, 0));
    let o = 0;
    for (const d of idat) joined.set(d, o), o += d.length;
  }
  let raw: Uint8Array;
  try {
    raw = new Uint8Array(inflateSync(joined, { finishFlush: ended ? 0 : 2 }));
  } catch (e) {
    throw new ImageDecodeError(`PNG image data is truncated or corrupt (${(e as Error).message})`, {
      cause: e,
    });
  }
  const spp = SAMPLES[ct];
  const bitsPP = spp * depth;
  const bpp = Math.max(1, bitsPP >> 3);
  // RGBA8 of every pixel, then packed to the channels asked.
  const rgba = new Uint8Array(w * ht * 4);
  const maxV = (1 << depth) - 1;
  const key = trns !== undefined && (ct === 0 || ct === 2)
    ? ct === 0 ? [(trns[0] << 8) | trns[1]] : [0, 2, 4].map((i) => (trns![i] << 8) | trns![i + 1])
    : undefined;
  const put = (x: number, y: number, row: number, col: number) => {
    // Sample k of pixel col in a scanline starting at `row` (full bit-depth value).
    const sample = (k: number): number => {
      if (depth === 8) return raw[row + col * spp + k];
      if (depth === 16) {
        return (raw[row + 2 * (col * spp + k)] << 8) | raw[row + 2 * (col * spp + k) + 1];
      }
      const bit = (col * spp + k) * depth;
      return (raw[row + (bit >> 3)] >> (8 - depth - (bit & 7))) & maxV;
    };
    const to8 = (v: number) =>
      depth === 16 ? v >> 8 : depth === 8 ? v : Math.round((v * 255) / maxV);
    const o = (y * w + x) * 4;
    let r: number, g: number, bl: number, a = 255;
    if (ct === 3) {
      const i = sample(0);
      if (3 * i + 2 >= palette!.length) {
        throw new ImageDecodeError(`PNG pixel uses palette entry ${i}, outside the palette`);
      }
      r = palette![3 * i], g = palette![3 * i + 1], bl = palette![3 * i + 2];
      if (trns !== undefined && i < trns.length) a = trns[i];
    } else if (ct === 0 || ct === 4) {
      const v = sample(0);
      r = g = bl = to8(v);
      if (ct === 4) a = to8(sample(1));
      else if (key !== undefined && v === key[0]) a = 0;
    } else {
      const rv = sample(0), gv = sample(1), bv = sample(2);
      r = to8(rv), g = to8(gv), bl = to8(bv);
      if (ct === 6) a = to8(sample(3));
      else if (key !== undefined && rv === key[0] && gv === key[1] && bv === key[2]) a = 0;
    }
    rgba[o] = r, rgba[o + 1] = g, rgba[o + 2] = bl, rgba[o + 3] = a;
  };
  let at = 0;
  const passes = h.interlace === 1 ? ADAM7 : [[0, 0, 1, 1]];
  for (const [x0, y0, dx, dy] of passes) {
    const pw = Math.ceil((w - x0) / dx), ph = Math.ceil((ht - y0) / dy);
    if (pw <= 0 || ph <= 0) continue;
    const rowBytes = Math.ceil((pw * bitsPP) / 8);
    const start = at;
    at = unfilter(raw, at, ph, rowBytes, bpp);
    for (let j = 0; j < ph; j++) {
      const row = start + j * (rowBytes + 1) + 1;
      for (let i = 0; i < pw; i++) put(x0 + i * dx, y0 + j * dy, row, i);
    }
  }
  return packRgba(rgba, ht, w, channels);
}

/** RGBA8 pixels packed to 1 (Pillow's "L" weights), 3 or 4 channels. */
export function packRgba(
  rgba: Uint8Array,
  height: number,
  width: number,
  channels: Channels,
): DecodedImage {
  if (channels === 4) return { data: rgba, height, width, channels };
  const n = height * width;
  const out = new Uint8Array(n * channels);
  if (channels === 3) {
    for (let i = 0, o = 0, s = 0; i < n; i++, o += 3, s += 4) {
      out[o] = rgba[s], out[o + 1] = rgba[s + 1], out[o + 2] = rgba[s + 2];
    }
  } else {
    for (let i = 0, s = 0; i < n; i++, s += 4) out[i] = grey(rgba[s], rgba[s + 1], rgba[s + 2]);
  }
  return { data: out, height, width, channels };
}

/** Pillow's RGB to "L": ITU-R 601-2 luma in 16-bit fixed point, rounded. */
export function grey(r: number, g: number, b: number): number {
  return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >>> 16;
}
