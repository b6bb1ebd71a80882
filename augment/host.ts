/**
 * The host reference of the fused image transform (crop with zero padding, horizontal and
 * vertical flips, ColorJitter's contrast, brightness, saturation and hue, per-channel
 * normalize, cutout, cast): the arithmetic of the device kernel (`ps_image_augment`) in
 * TypeScript, and the host-side path of the prefetcher (`augmentOn: "host"`).
 *
 * Every output element is `cast(fround(fround(t * scale[c]) + bias[c]))`: a fp32 multiply
 * and a fp32 add, each rounded, then one round-to-nearest-even cast to fp16 (or none for
 * f32), where `t` is the source byte `v`, or with a colour jitter, in this fixed order (one of
 * the orders torchvision's ColorJitter draws from):
 *
 * - contrast: `a = clamp(fround(fround(v * ct) + fround(fround(1 - ct) * m)))`, `m` the
 *   image's mean grey over its crop window: the exact integer sum of
 *   `2989 R + 5870 G + 1140 B` (3 channels; torchvision's grey weights times 10000) or of
 *   every value (other channel counts), divided once in double precision by
 *   `H * W * 10000` (or `H * W * C`) and rounded to fp32;
 * - brightness: `u = clamp(fround(a * br))`;
 * - saturation and hue, on 3-channel images (`ps_image_mix` in kernels/rules.h spells out
 *   each rounding): a blend with the pixel's grey, then a hue shift in HSV;
 *
 * each step clamped to [0, 255]; a pixel inside the sample's cutout square is +0 instead. The
 * kernels do exactly this (no fused multiply-add; kernels/rules.h writes their side once), so
 * the host path, the CPU backend and the CUDA backend give the same bits.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import type { ImageLayout, NormalizeAffine } from "./image.ts";
import { AUGMENT_RECORD_LENGTH } from "./record.ts";

/** Shape and transform of one batch for {@linkcode augmentHost}. */
export interface AugmentHostOptions {
  /** Samples in the batch. */
  n: number;
  /** Channels per image. */
  channels: number;
  /** Image height (the output has the same size: the crop window equals the image). */
  height: number;
  /** Image width. */
  width: number;
  /** Source memory order. */
  layout: ImageLayout;
  /** Zero padding on every side before the crop. */
  pad: number;
  /** From {@linkcode normalizeAffine}. */
  affine: NormalizeAffine;
}

// Every key of AugmentHostOptions, checked by the compiler against the interface.
const AUGMENT_HOST_KEYS = Object.keys(
  {
    n: true,
    channels: true,
    height: true,
    width: true,
    layout: true,
    pad: true,
    affine: true,
  } satisfies Record<keyof AugmentHostOptions, true>,
);

const f = Math.fround;
/** torchvision's grey weights as fp32 (`ps_image_grey`). */
const GREY_R = f(0.2989), GREY_G = f(0.587), GREY_B = f(0.114);

/**
 * The host-side twin of the device kernel: crops (window top-left `dy, dx` in the image
 * padded by `pad` zeros), flips, jitters brightness and contrast, normalizes, cuts out and
 * casts a batch of uint8 images into NCHW `out`, as each sample's record says (see
 * {@linkcode augmentRecord}). Same bits as `ps_image_augment` on either backend.
 *
 * @param src `n` images, uint8, `layout` order, contiguous.
 * @param params `n` records of {@linkcode AUGMENT_RECORD_LENGTH} int32 (the loader's
 * `batch.augment`), or `null` for the centred window and nothing else.
 * @param out `n x channels x height x width` elements; Float16Array for f16, Float32Array
 * for f32.
 * @param options Shape, layout, padding and normalization.
 * @throws {RangeError} When an array is shorter than the shape needs, or `affine` has fewer
 * constants than `channels` (the missing ones would make NaN).
 * @throws {TypeError} When `options` has a key not in {@linkcode AugmentHostOptions}.
 *
 * @example A flipped 1x1x2 image, identity normalization
 * ```ts
 * import { augmentHost, normalizeAffine } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const out = new Float32Array(2);
 * const one = 0x3f800000; // fp32 1.0: brightness, contrast, saturation unchanged; hue 0
 * const record = new Int32Array([0, 0, 1, 0, 0, 0, 0, one, one, one, 0]);
 * augmentHost(new Uint8Array([0, 255]), record, out, {
 *   n: 1, channels: 1, height: 1, width: 2, layout: "nchw", pad: 0,
 *   affine: normalizeAffine([0], [1]),
 * });
 * assert.deepStrictEqual([...out], [1, 0]);
 * ```
 *
 * @example Brightness 0.5 and a 1-pixel cutout
 * ```ts
 * import { augmentHost, normalizeAffine } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const f = new Int32Array(new Float32Array([0.5, 1]).buffer);
 * // The cutout's centre at fraction 0 of the height and width: pixel (0, 0).
 * const rec = new Int32Array([0, 0, 0, 0, 0, 0, 1, f[0], f[1], f[1], 0]);
 * const out = new Float32Array(2);
 * augmentHost(new Uint8Array([100, 200]), rec, out, {
 *   n: 1, channels: 1, height: 1, width: 2, layout: "nchw", pad: 0,
 *   affine: normalizeAffine([0], [1 / 255]), // out = byte value
 * });
 * assert.deepStrictEqual([...out], [0, 100]);
 * ```
 *
 * @example Contrast 0 makes an image its own mean grey
 * ```ts
 * import { augmentHost, normalizeAffine } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const f = new Int32Array(new Float32Array([0, 1]).buffer);
 * const rec = new Int32Array([0, 0, 0, 0, 0, 0, 0, f[1], f[0], f[1], 0]);
 * const out = new Float32Array(2);
 * augmentHost(new Uint8Array([100, 200]), rec, out, {
 *   n: 1, channels: 1, height: 1, width: 2, layout: "nchw", pad: 0,
 *   affine: normalizeAffine([0], [1 / 255]),
 * });
 * assert.deepStrictEqual([...out], [150, 150]);
 * ```
 */
export function augmentHost(
  src: Uint8Array,
  params: Int32Array | null,
  out: Float16Array | Float32Array,
  options: AugmentHostOptions,
): void {
  refuseUnknownKeys(options, AUGMENT_HOST_KEYS, "augment");
  const { n, channels: c, height: h, width: w, layout, pad, affine } = options;
  if (affine.scale.length < c || affine.bias.length < c) {
    throw new RangeError(
      `Cannot augment: ${c} channels need ${c} scale and bias values, got ` +
        `${affine.scale.length} and ${affine.bias.length}`,
    );
  }
  const plane = h * w, img = plane * c, R = AUGMENT_RECORD_LENGTH;
  if (src.length < n * img || out.length < n * img || (params && params.length < R * n)) {
    throw new RangeError(
      `Cannot augment: ${n} images of ${c}x${h}x${w} need ${n * img} source bytes, ` +
        `${n * img} output elements and ${R * n} params; got ${src.length}, ${out.length}, ` +
        `${params?.length ?? "null"}`,
    );
  }
  // A byte has 256 values: normalize each once per channel into a table of the output type
  // (the typed-array store does the final rounding: fp32, or fp16 to nearest even), then
  // every pixel is a lookup. Same bits as computing it per pixel. A sample with a colour
  // jitter gets its own table, through the colour steps first.
  const table = () =>
    out instanceof Float32Array ? new Float32Array(256 * c) : new Float16Array(256 * c);
  const plain = table(), jittered = table();
  for (let ch = 0; ch < c; ch++) {
    const s = affine.scale[ch], b = affine.bias[ch];
    for (let v = 0; v < 256; v++) plain[ch * 256 + v] = f(f(v * s) + b);
  }
  const factors = params ? new Float32Array(params.buffer, params.byteOffset, R * n) : null;
  for (let i = 0; i < n; i++) {
    const r = R * i;
    const dy = params ? params[r] : pad;
    const dx = params ? params[r + 1] : pad;
    const flip = params ? params[r + 2] !== 0 : false;
    const vflip = params ? params[r + 3] !== 0 : false;
    const br = factors ? factors[r + 7] : 1, ct = factors ? factors[r + 8] : 1;
    const sat = factors ? factors[r + 9] : 1, hue6 = factors ? f(factors[r + 10] * 6) : 0;
    // The offsets clamped to +-extent as ps_image_offset does: the same pixels, and the
    // window's sum stays in range.
    const oy = Math.min(Math.max(dy - pad, -h), h), ox = Math.min(Math.max(dx - pad, -w), w);
    const base = i * img;
    let lut = plain;
    // Factors of exactly 1 (a hue shift of 0) are identities (the kernels skip them too);
    // saturation and hue need three channels.
    const mix = c === 3 && !(sat === 1 && hue6 === 0);
    if (!(br === 1 && ct === 1) || mix) {
      lut = jittered;
      const m = ct === 1 ? 0 : meanGrey(src, base, layout, c, h, w, oy, ox);
      const cs = ct === 1 ? 0 : f(f(1 - ct) * m);
      for (let v = 0; v < 256; v++) colour[v] = clamp255(f(clamp255(f(f(v * ct) + cs)) * br));
      if (mix) {
        mixSample(src, base, layout, h, w, oy, ox, flip, vflip, affine, out, sat, hue6);
        cutout(params!, r, c, h, w, base, out);
        continue;
      }
      for (let v = 0; v < 256; v++) {
        for (let ch = 0; ch < c; ch++) {
          lut[ch * 256 + v] = f(f(colour[v] * affine.scale[ch]) + affine.bias[ch]);
        }
      }
    }
    for (let ch = 0; ch < c; ch++) {
      const t = ch * 256, zero = lut[t];
      for (let y = 0; y < h; y++) {
        const o = base + ch * plane + y * w;
        const sy = (vflip ? h - 1 - y : y) + oy;
        if (sy < 0 || sy >= h) {
          out.fill(zero, o, o + w);
          continue;
        }
        // Output column x reads source column sx = (flip ? w-1-x : x) + ox at
        // rowBase + step * sx; the columns inside the image form one run [x0, x1).
        const rowBase = layout === "nchw" ? base + (ch * h + sy) * w : base + sy * w * c + ch;
        const step = layout === "nchw" ? 1 : c;
        const lo = Math.max(0, -ox), hi = Math.min(w, w - ox);
        const x0 = Math.min(w, flip ? w - hi : lo), x1 = Math.max(x0, flip ? w - lo : hi);
        out.fill(zero, o, o + x0);
        out.fill(zero, o + x1, o + w);
        if (flip) {
          const last = rowBase + step * (w - 1 + ox);
          for (let x = x0; x < x1; x++) out[o + x] = lut[t + src[last - step * x]];
        } else {
          const first = rowBase + step * ox;
          for (let x = x0; x < x1; x++) out[o + x] = lut[t + src[first + step * x]];
        }
      }
    }
    if (params) cutout(params, r, c, h, w, base, out);
  }
}

/** Sets sample `base`'s cutout square (record at `r`) to +0 in each channel. */
function cutout(
  params: Int32Array,
  r: number,
  c: number,
  h: number,
  w: number,
  base: number,
  out: Float16Array | Float32Array,
): void {
  if (!(params[r + 6] > 0)) return;
  const [y0, y1] = cutoutSpan(params[r + 4], params[r + 6], h);
  const [x0, x1] = cutoutSpan(params[r + 5], params[r + 6], w);
  for (let ch = 0; ch < c; ch++) {
    for (let y = y0; y < y1; y++) {
      const o = base + ch * h * w + y * w;
      out.fill(0, o + x0, o + x1);
    }
  }
}

/** The contrast and brightness steps of the current sample, per byte value. */
const colour = new Float32Array(256);
/** One pixel's three channels through ps_image_mix. */
const rgb = new Float64Array(3);

/**
 * The sample's mean grey over its crop window (ps_image_grey_mean): the source rows and
 * columns the window covers, an exact integer sum (below 2^53), one division, one rounding.
 */
function meanGrey(
  src: Uint8Array,
  base: number,
  layout: ImageLayout,
  c: number,
  h: number,
  w: number,
  oy: number,
  ox: number,
): number {
  const y0 = Math.max(oy, 0), y1 = oy < 0 ? h + oy : h;
  const x0 = Math.max(ox, 0), x1 = ox < 0 ? w + ox : w;
  const cstep = layout === "nchw" ? h * w : 1, pstep = layout === "nchw" ? 1 : c;
  let sum = 0;
  for (let y = y0; y < y1; y++) {
    const row = base + y * w * pstep;
    for (let x = x0; x < x1; x++) {
      const p = row + x * pstep;
      if (c === 3) {
        sum += 2989 * src[p] + 5870 * src[p + cstep] + 1140 * src[p + 2 * cstep];
      } else {
        for (let ch = 0; ch < c; ch++) sum += src[p + ch * cstep];
      }
    }
  }
  return f(sum / (h * w * (c === 3 ? 10000 : c)));
}

/**
 * A 3-channel sample whose saturation or hue is on: per output pixel, its three bytes
 * through `colour` (contrast, brightness), then {@linkcode mixPixel}, normalize, store.
 */
function mixSample(
  src: Uint8Array,
  base: number,
  layout: ImageLayout,
  h: number,
  w: number,
  oy: number,
  ox: number,
  flip: boolean,
  vflip: boolean,
  affine: NormalizeAffine,
  out: Float16Array | Float32Array,
  sat: number,
  hue6: number,
): void {
  const plane = h * w;
  const cstep = layout === "nchw" ? plane : 1, pstep = layout === "nchw" ? 1 : 3;
  const ks = f(1 - sat);
  for (let y = 0; y < h; y++) {
    const sy = (vflip ? h - 1 - y : y) + oy;
    for (let x = 0; x < w; x++) {
      const sx = (flip ? w - 1 - x : x) + ox;
      if (sy >= 0 && sy < h && sx >= 0 && sx < w) {
        const p = base + (sy * w + sx) * pstep;
        rgb[0] = colour[src[p]];
        rgb[1] = colour[src[p + cstep]];
        rgb[2] = colour[src[p + 2 * cstep]];
      } else {
        rgb[0] = rgb[1] = rgb[2] = colour[0];
      }
      mixPixel(rgb, sat, ks, hue6);
      const o = base + y * w + x;
      for (let ch = 0; ch < 3; ch++) {
        out[o + ch * plane] = f(f(rgb[ch] * affine.scale[ch]) + affine.bias[ch]);
      }
    }
  }
}

/** ps_image_mix (kernels/rules.h) on `p` in place: saturation, then the hue shift in HSV. */
function mixPixel(p: Float64Array, sat: number, ks: number, hue6: number): void {
  let x = p[0], y = p[1], z = p[2];
  if (sat !== 1) {
    const grey = f(f(f(f(GREY_R * x) + f(GREY_G * y)) + f(GREY_B * z)) * ks);
    x = clamp255(f(f(x * sat) + grey));
    y = clamp255(f(f(y * sat) + grey));
    z = clamp255(f(f(z * sat) + grey));
  }
  if (hue6 !== 0) {
    let mx = x, mn = x;
    if (y > mx) mx = y;
    if (z > mx) mx = z;
    if (y < mn) mn = y;
    if (z < mn) mn = z;
    const cr = f(mx - mn);
    if (cr > 0) {
      let hh = mx === x
        ? f(f(y - z) / cr)
        : mx === y
        ? f(2 + f(f(z - x) / cr))
        : f(4 + f(f(x - y) / cr));
      hh = f(hh + hue6);
      if (hh < 0) hh = f(hh + 6);
      if (hh >= 6) hh = f(hh - 6);
      const i = hh < 1 ? 0 : hh < 2 ? 1 : hh < 3 ? 2 : hh < 4 ? 3 : hh < 5 ? 4 : 5;
      const d = f(cr * f(hh - i));
      const q = clamp255(f(mx - d)), t = clamp255(f(mn + d));
      if (i === 0) [x, y, z] = [mx, t, mn];
      else if (i === 1) [x, y, z] = [q, mx, mn];
      else if (i === 2) [x, y, z] = [mn, mx, t];
      else if (i === 3) [x, y, z] = [mn, q, mx];
      else if (i === 4) [x, y, z] = [t, mn, mx];
      else [x, y, z] = [mx, mn, q];
    }
  }
  p[0] = x;
  p[1] = y;
  p[2] = z;
}

/** A colour step's clamp to the byte range (NaN passes through, as in kernels/rules.h). */
function clamp255(a: number): number {
  return a < 0 ? 0 : a > 255 ? 255 : a;
}

/**
 * The cutout's [lo, hi) along an axis of `extent` pixels for `size` > 0 (ps_image_cutout_span):
 * centre floor(clamp(frac, 0, 65535) * extent / 2^16), from centre - floor(size / 2), clipped.
 */
function cutoutSpan(frac: number, size: number, extent: number): [number, number] {
  const centre = Math.floor((Math.min(Math.max(frac, 0), 65535) * extent) / 65536);
  const lo = centre - Math.floor(size / 2);
  return [Math.max(lo, 0), Math.min(lo + size, extent)];
}
