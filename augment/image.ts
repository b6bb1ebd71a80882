/**
 * The image transform's shared vocabulary: source layouts, output types, the normalization
 * constants and the image shapes the kernels take. Used by the kernels' wrappers, the
 * prefetcher, the resident loader and the host reference ({@linkcode augmentHost}).
 *
 * @module
 */

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
