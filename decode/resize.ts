/**
 * Bilinear resizing of 8-bit HWC images on the host, with Pillow's arithmetic (the same
 * triangle filter widened by the scale when shrinking, 22-bit fixed-point weights, the
 * horizontal pass first, rounded to bytes between passes), so a fixed-size image set gets the
 * pixels `PIL.Image.resize(size, BILINEAR)` gives. `antialias: false` keeps the filter two
 * pixels wide whatever the scale (torchvision's tensor Resize without antialias).
 *
 * @module
 */

import type { CropBox, DecodedImage } from "./types.ts";
import { type PassTaps, WASM_SCRATCH_LIMIT, wasmResize, wasmResizeAvailable } from "./_simd.ts";

const BITS = 22;
const ONE = 1 << BITS;
/** Rounding: half of one in the fixed point. */
const HALF = ONE >> 1;

type Taps = PassTaps;

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

/**
 * Resizes an image to `height` x `width` (bilinear).
 *
 * @param image 8-bit HWC pixels
 * @param height rows out
 * @param width columns out
 * @param antialias widen the filter when shrinking (default true, as Pillow)
 * @param out where the pixels go (`height * width * channels` bytes), e.g. a ring slot
 * @param box the region of `image` to resize (default all of it; the crop costs no copy)
 * @param engine the loops that resample: WebAssembly SIMD where the engine has it (about 4x
 *   faster), else JavaScript; both give the same bytes
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
  box?: CropBox,
  engine: "auto" | "javascript" = "auto",
): DecodedImage {
  const { data, height: fullH, width: fullW, channels: c } = image;
  const top = box?.top ?? 0, left = box?.left ?? 0;
  const ih = box?.height ?? fullH, iw = box?.width ?? fullW;
  const size = height * width * c;
  const dst = out ? out.subarray(0, size) : new Uint8Array(size);
  if (ih === height && iw === width) {
    if (out === undefined && box === undefined) return image;
    // Already decoded into `out`: nothing to move.
    if (box === undefined && data.buffer === dst.buffer && data.byteOffset === dst.byteOffset) {
      return { data: dst, height, width, channels: c };
    }
    const row = width * c;
    for (let y = 0; y < height; y++) {
      const from = ((top + y) * fullW + left) * c;
      dst.set(data.subarray(from, from + row), y * row);
    }
    return { data: dst, height, width, channels: c };
  }
  // The scratch the passes need (input rows, intermediate rows, output) within the module's
  // limit; larger images take the JavaScript loops.
  const scratch = ih * fullW * c + ih * width * c + size;
  if (engine === "auto" && scratch <= WASM_SCRATCH_LIMIT && wasmResizeAvailable()) {
    const h = iw !== width ? taps(iw, width, antialias) : undefined;
    const v = ih !== height ? taps(ih, height, antialias) : undefined;
    wasmResize(data, fullW, c, top, left, ih, height, width, h, v, dst);
    return { data: dst, height, width, channels: c };
  }
  // Results clamp to 0..255 on store through a clamped view (one branchless store).
  const clamped = (a: Uint8Array) => new Uint8ClampedArray(a.buffer, a.byteOffset, a.length);
  // Horizontal pass (skipped when the width is unchanged), rounded to bytes.
  let mid = data, midW = fullW, midTop = top, midLeft = left;
  if (iw !== width) {
    const t = taps(iw, width, antialias);
    const m = ih === height ? dst : new Uint8Array(ih * width * c);
    const mc = clamped(m);
    const tw = t.width, W = t.weights;
    for (let y = 0; y < ih; y++) {
      const row = ((top + y) * fullW + left) * c, orow = y * width * c;
      if (c === 3) {
        for (let x = 0; x < width; x++) {
          const n = t.count[x], w0 = x * tw;
          let p = row + t.start[x] * 3;
          let r = HALF, g = HALF, b = HALF;
          for (let i = 0; i < n; i++, p += 3) {
            const w = W[w0 + i];
            r += data[p] * w;
            g += data[p + 1] * w;
            b += data[p + 2] * w;
          }
          const o = orow + x * 3;
          mc[o] = r >> BITS;
          mc[o + 1] = g >> BITS;
          mc[o + 2] = b >> BITS;
        }
      } else {
        for (let x = 0; x < width; x++) {
          const n = t.count[x], w0 = x * tw, s = row + t.start[x] * c;
          for (let ch = 0; ch < c; ch++) {
            let ss = HALF;
            for (let i = 0; i < n; i++) ss += data[s + i * c + ch] * W[w0 + i];
            mc[orow + x * c + ch] = ss >> BITS;
          }
        }
      }
    }
    if (ih === height) return { data: m, height, width, channels: c };
    mid = m, midW = width, midTop = 0, midLeft = 0;
  }
  // Vertical pass: each output row accumulates its input rows, one tap at a time.
  const t = taps(ih, height, antialias);
  const rowLen = width * c, stride = midW * c, base = midTop * stride + midLeft * c;
  if (acc.length < rowLen) acc = new Int32Array(rowLen);
  const dc = clamped(dst);
  for (let y = 0; y < height; y++) {
    const s = t.start[y], n = t.count[y], w0 = y * t.width, orow = y * rowLen;
    acc.fill(HALF, 0, rowLen);
    for (let i = 0; i < n; i++) {
      const w = t.weights[w0 + i], from = base + (s + i) * stride;
      for (let x = 0; x < rowLen; x++) acc[x] += mid[from + x] * w;
    }
    for (let x = 0; x < rowLen; x++) dc[orow + x] = acc[x] >> BITS;
  }
  return { data: dst, height, width, channels: c };
}

/** The vertical pass's row of sums, kept between calls. */
let acc = new Int32Array(0);
