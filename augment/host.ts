/**
 * The host reference of the fused image transform (crop with zero padding, horizontal and
 * vertical flips, brightness, contrast, per-channel normalize, cutout, cast): the arithmetic
 * of the device kernel (`ps_image_augment`) in TypeScript, and the host-side path of the
 * prefetcher (`augmentOn: "host"`).
 *
 * Every output element is `cast(fround(fround(t * scale[c]) + bias[c]))`: a fp32 multiply
 * and a fp32 add, each rounded, then one round-to-nearest-even cast to fp16 (or none for
 * f32), where `t` is the source byte, or with a colour jitter the byte after
 * `u = clamp(fround(v * br))`, `t = clamp(fround(fround(u * ct) + fround(fround(1 - ct) *
 * 127.5)))` (clamp to [0, 255]); a pixel inside the sample's cutout square is +0 instead. The
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

/** The grey that contrast blends toward, in byte units (`PS_IMAGE_CONTRAST_CENTER`). */
const CONTRAST_CENTER = 127.5;

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
 * const one = 0x3f800000; // fp32 1.0: brightness and contrast unchanged
 * augmentHost(new Uint8Array([0, 255]), new Int32Array([0, 0, 1, 0, 0, 0, 0, one, one]), out, {
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
 * const half = new Int32Array(new Float32Array([0.5, 1]).buffer);
 * // The cutout's centre at fraction 0 of the height and width: pixel (0, 0).
 * const rec = new Int32Array([0, 0, 0, 0, 0, 0, 1, half[0], half[1]]);
 * const out = new Float32Array(2);
 * augmentHost(new Uint8Array([100, 200]), rec, out, {
 *   n: 1, channels: 1, height: 1, width: 2, layout: "nchw", pad: 0,
 *   affine: normalizeAffine([0], [1 / 255]), // out = byte value
 * });
 * assert.deepStrictEqual([...out], [0, 100]);
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
  const f = Math.fround;
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
    let lut = plain;
    // Factors of exactly 1 are identities (the kernels skip them too).
    if (!(br === 1 && ct === 1)) {
      lut = jittered;
      const cs = f(f(1 - ct) * CONTRAST_CENTER);
      for (let v = 0; v < 256; v++) {
        const t = clamp255(f(f(clamp255(f(v * br)) * ct) + cs));
        for (let ch = 0; ch < c; ch++) {
          lut[ch * 256 + v] = f(f(t * affine.scale[ch]) + affine.bias[ch]);
        }
      }
    }
    const oy = dy - pad, ox = dx - pad;
    const base = i * img;
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
    if (params && params[r + 6] > 0) {
      const [y0, y1] = cutoutSpan(params[r + 4], params[r + 6], h);
      const [x0, x1] = cutoutSpan(params[r + 5], params[r + 6], w);
      for (let ch = 0; ch < c; ch++) {
        for (let y = y0; y < y1; y++) {
          const o = base + ch * plane + y * w;
          out.fill(0, o + x0, o + x1);
        }
      }
    }
  }
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
