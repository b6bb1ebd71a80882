/**
 * Bilinear resizing of 8-bit HWC images on the host, with Pillow's arithmetic (the same
 * triangle filter widened by the scale when shrinking, 22-bit fixed-point weights, the
 * horizontal pass first, rounded to bytes between passes), so a fixed-size image set gets the
 * pixels `PIL.Image.resize(size, BILINEAR)` gives. `antialias: false` keeps the filter two
 * pixels wide whatever the scale (torchvision's tensor Resize without antialias).
 *
 * @module
 */

import type { DecodedImage } from "./types.ts";

const BITS = 22;
const ONE = 1 << BITS;

interface Taps {
  start: Int32Array;
  count: Int32Array;
  weights: Int32Array;
  width: number;
}

/** Each output position's first input, count and fixed-point weights (Pillow's precompute). */
function taps(inSize: number, outSize: number, antialias: boolean): Taps {
  const scale = inSize / outSize;
  const filterScale = antialias ? Math.max(scale, 1) : 1;
  const support = filterScale;
  const width = Math.ceil(support) * 2 + 1;
  const start = new Int32Array(outSize), count = new Int32Array(outSize);
  const weights = new Int32Array(outSize * width);
  const k = new Float64Array(width);
  for (let x = 0; x < outSize; x++) {
    const center = (x + 0.5) * scale;
    const lo = Math.max(Math.trunc(center - support + 0.5), 0);
    const n = Math.min(Math.trunc(center + support + 0.5), inSize) - lo;
    let sum = 0;
    for (let i = 0; i < n; i++) {
      const t = Math.abs((i + lo - center + 0.5) / filterScale);
      k[i] = t < 1 ? 1 - t : 0;
      sum += k[i];
    }
    for (let i = 0; i < n; i++) {
      const w = sum !== 0 ? k[i] / sum : k[i];
      weights[x * width + i] = Math.trunc(w < 0 ? -0.5 + w * ONE : 0.5 + w * ONE);
    }
    start[x] = lo, count[x] = n;
  }
  return { start, count, weights, width };
}

const clip8 = (ss: number) => {
  const v = Math.floor(ss / ONE);
  return v < 0 ? 0 : v > 255 ? 255 : v;
};

/**
 * Resizes an image to `height` x `width` (bilinear).
 *
 * @param image 8-bit HWC pixels
 * @param height rows out
 * @param width columns out
 * @param antialias widen the filter when shrinking (default true, as Pillow)
 * @param out where the pixels go (`height * width * channels` bytes), e.g. a ring slot
 * @returns the resized image (the input itself when the size is unchanged and no `out`)
 * @example Halving a 2x2 grey image averages it
 * ```ts
 * import { resizeBilinear } from "./resize.ts";
 * import assert from "node:assert";
 * const img = { data: new Uint8Array([0, 100, 200, 100]), height: 2, width: 2, channels: 1 as const };
 * assert.deepStrictEqual([...resizeBilinear(img, 1, 1).data], [100]);
 * ```
 */
export function resizeBilinear(
  image: DecodedImage,
  height: number,
  width: number,
  antialias = true,
  out?: Uint8Array,
): DecodedImage {
  const { data, height: ih, width: iw, channels: c } = image;
  const size = height * width * c;
  const dst = out ? out.subarray(0, size) : new Uint8Array(size);
  if (ih === height && iw === width) {
    if (out === undefined) return image;
    // Already decoded into `out`: nothing to move.
    if (data.buffer !== dst.buffer || data.byteOffset !== dst.byteOffset) {
      dst.set(data.subarray(0, size));
    }
    return { data: dst, height, width, channels: c };
  }
  // Horizontal pass (skipped when the width is unchanged), rounded to bytes.
  let mid = data;
  if (iw !== width) {
    const t = taps(iw, width, antialias);
    mid = ih === height && out !== undefined ? dst : new Uint8Array(ih * width * c);
    for (let y = 0; y < ih; y++) {
      const row = y * iw * c, orow = y * width * c;
      for (let x = 0; x < width; x++) {
        const s = t.start[x], n = t.count[x], w0 = x * t.width;
        for (let ch = 0; ch < c; ch++) {
          let ss = ONE >> 1;
          for (let i = 0; i < n; i++) ss += data[row + (s + i) * c + ch] * t.weights[w0 + i];
          mid[orow + x * c + ch] = clip8(ss);
        }
      }
    }
    if (ih === height) return { data: mid, height, width, channels: c };
  }
  const t = taps(ih, height, antialias);
  const rowLen = width * c;
  for (let y = 0; y < height; y++) {
    const s = t.start[y], n = t.count[y], w0 = y * t.width, orow = y * rowLen;
    for (let x = 0; x < rowLen; x++) {
      let ss = ONE >> 1;
      for (let i = 0; i < n; i++) ss += mid[(s + i) * rowLen + x] * t.weights[w0 + i];
      dst[orow + x] = clip8(ss);
    }
  }
  return { data: dst, height, width, channels: c };
}
