/**
 * The EXIF orientation tag (0x0112) of a JPEG (APP1 "Exif") or a PNG (eXIf chunk), and the
 * pixel transform that shows the image upright, as Pillow's `ImageOps.exif_transpose`.
 *
 * @module
 */

import type { DecodedImage } from "./types.ts";

/** Reads the orientation (1-8) from a TIFF-structured EXIF block; 1 when absent or malformed. */
function tiffOrientation(b: Uint8Array, start: number, end: number): number {
  if (end - start < 8) return 1;
  const le = b[start] === 0x49 && b[start + 1] === 0x49;
  const be = b[start] === 0x4d && b[start + 1] === 0x4d;
  if (!le && !be) return 1;
  const u16 = (at: number) => le ? b[at] | (b[at + 1] << 8) : (b[at] << 8) | b[at + 1];
  const u32 = (at: number) =>
    le
      ? (b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24)) >>> 0
      : ((b[at] << 24) | (b[at + 1] << 16) | (b[at + 2] << 8) | b[at + 3]) >>> 0;
  const ifd = start + u32(start + 4);
  if (ifd + 2 > end) return 1;
  const n = u16(ifd);
  for (let i = 0; i < n; i++) {
    const e = ifd + 2 + 12 * i;
    if (e + 12 > end) return 1;
    if (u16(e) === 0x0112) {
      const v = u16(e + 8);
      return v >= 1 && v <= 8 ? v : 1;
    }
  }
  return 1;
}

/**
 * The EXIF orientation of a JPEG or PNG file.
 *
 * @param bytes the file
 * @returns 1 (upright, also when there is no EXIF) to 8
 * @example No EXIF: upright
 * ```ts
 * import { exifOrientation } from "./exif.ts";
 * import assert from "node:assert";
 * assert.strictEqual(exifOrientation(new Uint8Array([0xff, 0xd8, 0xff, 0xd9])), 1);
 * ```
 */
export function exifOrientation(bytes: Uint8Array): number {
  const b = bytes;
  if (b[0] === 0xff && b[1] === 0xd8) {
    let p = 2;
    while (p + 4 <= b.length && b[p] === 0xff) {
      const marker = b[p + 1];
      if (marker === 0xd8 || (marker >= 0xd0 && marker <= 0xd7) || marker === 0x01) {
        p += 2;
        continue;
      }
      // Start of scan or end of image: no more header segments.
      if (marker === 0xda || marker === 0xd9) return 1;
      const len = (b[p + 2] << 8) | b[p + 3];
      const data = p + 4;
      if (
        marker === 0xe1 && len >= 8 && b[data] === 0x45 && b[data + 1] === 0x78 &&
        b[data + 2] === 0x69 && b[data + 3] === 0x66 && b[data + 4] === 0 && b[data + 5] === 0
      ) {
        return tiffOrientation(b, data + 6, Math.min(b.length, p + 2 + len));
      }
      p += 2 + len;
    }
    return 1;
  }
  if (b[0] === 0x89 && b[1] === 0x50) {
    let p = 8;
    while (p + 8 <= b.length) {
      const len = ((b[p] << 24) | (b[p + 1] << 16) | (b[p + 2] << 8) | b[p + 3]) >>> 0;
      const type = String.fromCharCode(b[p + 4], b[p + 5], b[p + 6], b[p + 7]);
      if (type === "eXIf") return tiffOrientation(b, p + 8, Math.min(b.length, p + 8 + len));
      if (type === "IDAT" || type === "IEND") return 1;
      p += 12 + len;
    }
  }
  return 1;
}

/**
 * The image turned upright for EXIF orientation `orientation` (a new buffer; the same image
 * for 1).
 *
 * @param image decoded pixels, HWC
 * @param orientation 1-8
 * @returns the upright image (height and width swap for 5-8)
 * @example Orientation 6 (rotate 90 degrees clockwise)
 * ```ts
 * import { applyOrientation } from "./exif.ts";
 * import assert from "node:assert";
 * const img = { data: new Uint8Array([1, 2, 3, 4, 5, 6]), height: 2, width: 3, channels: 1 as const };
 * const r = applyOrientation(img, 6);
 * assert.deepStrictEqual([r.height, r.width, [...r.data]], [3, 2, [4, 1, 5, 2, 6, 3]]);
 * ```
 */
export function applyOrientation(image: DecodedImage, orientation: number): DecodedImage {
  if (orientation <= 1 || orientation > 8) return image;
  const { data, height: h, width: w, channels: c } = image;
  const swap = orientation >= 5;
  const oh = swap ? w : h, ow = swap ? h : w;
  const out = new Uint8Array(data.length);
  for (let y = 0; y < oh; y++) {
    for (let x = 0; x < ow; x++) {
      let sy: number, sx: number;
      switch (orientation) {
        case 2:
          sy = y, sx = w - 1 - x;
          break;
        case 3:
          sy = h - 1 - y, sx = w - 1 - x;
          break;
        case 4:
          sy = h - 1 - y, sx = x;
          break;
        case 5:
          sy = x, sx = y;
          break;
        case 6:
          sy = h - 1 - x, sx = y;
          break;
        case 7:
          sy = h - 1 - x, sx = w - 1 - y;
          break;
        default:
          sy = x, sx = w - 1 - y;
      }
      const from = (sy * w + sx) * c, to = (y * ow + x) * c;
      for (let k = 0; k < c; k++) out[to + k] = data[from + k];
    }
  }
  return { data: out, height: oh, width: ow, channels: c };
}
