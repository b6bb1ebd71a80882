/**
 * The arithmetic of the fused image transform (crop with zero padding, horizontal and
 * vertical flips, brightness, contrast, per-channel normalize, cutout, cast), shared by the
 * device kernel (`ps_image_augment`) and the host-side path of the prefetcher
 * (`augmentOn: "host"`).
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
import { AUGMENT_RECORD_LENGTH } from "../loader/ring.ts";

/** Memory order of the uint8 source images: channels last or channels first. */
export type ImageLayout = "nhwc" | "nchw";

/** Element type of the normalized output. */
export type ImageDtype = "f16" | "f32";

/** The per-channel constants of `(x / 255 - mean) / std` as one multiply and one add. */
export interface NormalizeAffine {
  /** `1 / (255 * std[c])`, rounded to fp32. */
  readonly scale: Float32Array;
  /** `-mean[c] / std[c]`, rounded to fp32. */
  readonly bias: Float32Array;
}

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

/** Most channels the kernels accept (`PS_IMAGE_MAX_CHANNELS`). */
export const MAX_CHANNELS = 16;

/**
 * Turns `mean`/`std` (in units of the [0, 1] range, as torchvision's `Normalize` after
 * `ToTensor`) into the fp32 `scale`/`bias` pair the kernels take: `scale = 1 / (255 * std)`,
 * `bias = -mean / std`, each operation rounded to fp32 as C would on the host.
 *
 * @param mean Per-channel means.
 * @param std Per-channel standard deviations, each finite and > 0.
 * @returns The fp32 constants.
 * @throws {RangeError} When the lengths differ, are 0 or above {@linkcode MAX_CHANNELS}, or a
 * value is not finite (std must also be > 0).
 *
 * @example Identity normalization maps a byte to x / 255
 * ```ts
 * import { normalizeAffine } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const { scale, bias } = normalizeAffine([0], [1]);
 * assert.strictEqual(scale[0], Math.fround(1 / 255));
 * assert.strictEqual(bias[0], 0);
 * ```
 */
export function normalizeAffine(
  mean: ArrayLike<number>,
  std: ArrayLike<number>,
): NormalizeAffine {
  if (mean.length !== std.length || mean.length === 0 || mean.length > MAX_CHANNELS) {
    throw new RangeError(
      `Cannot normalize: mean has ${mean.length} channels and std ${std.length} ` +
        `(need the same count, 1..${MAX_CHANNELS})`,
    );
  }
  const f = Math.fround;
  const scale = new Float32Array(mean.length);
  const bias = new Float32Array(mean.length);
  for (let c = 0; c < mean.length; c++) {
    const m = f(mean[c]), s = f(std[c]);
    if (!Number.isFinite(m) || !Number.isFinite(s) || !(s > 0)) {
      throw new RangeError(
        `Cannot normalize: channel ${c} has mean ${mean[c]} and std ${std[c]} ` +
          `(need finite values and std > 0)`,
      );
    }
    scale[c] = f(1 / f(255 * s));
    // 0 - x rather than -x: the same value, but +0 for a zero mean.
    bias[c] = 0 - f(m / s);
  }
  return { scale, bias };
}

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

/**
 * The channels, height and width of a u8 image field's per-sample shape: `[H, W]` (one
 * channel), `[C, H, W]` for "nchw" or `[H, W, C]` for "nhwc", with 1 to 4 channels.
 *
 * @param shape The per-sample shape.
 * @param layout How the image is laid out.
 * @param what What is being done and to which field, for errors ("create a DevicePrefetcher:
 * field \"image\"").
 * @returns `{ c, h, w }`.
 * @throws {RangeError} Naming the field and its shape when it is none of those.
 *
 * @example
 * ```ts
 * import { imageShape } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.deepStrictEqual(imageShape([32, 32, 3], "nhwc", "x"), { c: 3, h: 32, w: 32 });
 * ```
 */
export function imageShape(
  shape: readonly number[],
  layout: ImageLayout,
  what: string,
): { c: number; h: number; w: number } {
  const s = shape;
  let c: number, h: number, w: number;
  if (s.length === 2) [c, h, w] = [1, s[0], s[1]];
  else if (s.length === 3 && layout === "nchw") [c, h, w] = [s[0], s[1], s[2]];
  else if (s.length === 3) [h, w, c] = [s[0], s[1], s[2]];
  else {
    throw new RangeError(`Cannot ${what} has shape [${s}], need [C, H, W], [H, W, C] or [H, W]`);
  }
  if (c < 1 || c > MAX_CHANNELS) {
    throw new RangeError(`Cannot ${what} has ${c} channels, the kernel takes 1..${MAX_CHANNELS}`);
  }
  return { c, h, w };
}
