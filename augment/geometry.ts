/**
 * The geometric transforms of an image batch (`ps_image_geometry`, before the fused augment
 * kernel): Resize, CenterCrop and RandomResizedCrop to a fixed output size, then
 * RandomRotation. This module owns their options, their per-sample record and the draws it
 * comes from.
 *
 * ## The record
 *
 * Sample k's record is {@linkcode GEOMETRY_RECORD_LENGTH} int32 words
 * (`PS_IMAGE_GEOMETRY_PARAMS` in kernels/pinstream.h):
 *
 * | word | meaning |
 * |------|---------|
 * | 0, 1 | the source image's height and width (images of different sizes share a batch) |
 * | 2-5 | the box `top, left, height, width`, resized to the output size |
 * | 6, 7 | the rotation's cosine and sine, `round(cos(a) * 2^30)` (`1 << 30, 0`: none) |
 *
 * ## The draws
 *
 * The words come from the sample's stream of uint32 draws (the one {@linkcode augmentRecord}
 * reads, a pure function of seed, epoch and position), from draw {@linkcode GEOMETRY_FIRST_DRAW}
 * on, far from the augment record's draws, so turning a geometric transform on or off leaves
 * every other value as it was: the rotation angle is draw 32, RandomResizedCrop's attempt
 * `a` (0..9) reads draws `33 + 4a` .. `36 + 4a` (area scale, log aspect ratio, row, column).
 *
 * @module
 */

import { hash4 } from "../internal/random.ts";
import { optionError, refuseUnknownKeys } from "../internal/options.ts";

/**
 * int32 words of one sample's geometry record (`PS_IMAGE_GEOMETRY_PARAMS` in
 * kernels/pinstream.h): `[h, w, top, left, cropH, cropW, cos, sin]`.
 *
 * @example
 * ```ts
 * import { GEOMETRY_RECORD_LENGTH } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(GEOMETRY_RECORD_LENGTH, 8);
 * ```
 */
export const GEOMETRY_RECORD_LENGTH: number = 8;

/**
 * The first draw of the sample stream the geometric transforms read (the augment record's
 * draws are below it).
 *
 * @example
 * ```ts
 * import { GEOMETRY_FIRST_DRAW } from "./geometry.ts";
 * import assert from "node:assert";
 * assert.strictEqual(GEOMETRY_FIRST_DRAW, 32);
 * ```
 */
export const GEOMETRY_FIRST_DRAW: number = 32;

/** The rotation's fixed point: cosine and sine in units of 2^-30 (`PS_IMAGE_ROTATION_BITS`). */
const ROTATION_ONE = 2 ** 30;

/** How the box that becomes the output is chosen (torchvision's transform of that name). */
export type GeometryCrop = "resize" | "center-crop" | "random-resized-crop";

/**
 * Geometric transforms to a fixed output size, applied on the device before the augment
 * kernel's flips, colour, normalize and cutout.
 */
export interface GeometryOptions {
  /** The output `[height, width]`, or one number for a square (required). */
  size: number | readonly [number, number];
  /**
   * The box of each image that becomes the output (default "resize"):
   * - "resize": the whole image, as torchvision's `Resize((h, w))`;
   * - "center-crop": the centred window of the output's size, as `CenterCrop((h, w))`
   *   (an image smaller than that along an axis gives its whole extent there, resized up,
   *   where torchvision pads with zeros);
   * - "random-resized-crop": `RandomResizedCrop(size, scale, ratio)`: ten tries at a box of
   *   random area and aspect ratio, then the centre crop of the clamped ratio.
   */
  crop?: GeometryCrop;
  /** RandomResizedCrop's range of the box's area as a fraction of the image's (default [0.08, 1]). */
  scale?: readonly [number, number];
  /** RandomResizedCrop's range of the box's aspect ratio, width / height (default [3/4, 4/3]). */
  ratio?: readonly [number, number];
  /**
   * Widen the bilinear filter by the scale when shrinking, as Pillow and torchvision's
   * `antialias=True` (default true).
   */
  antialias?: boolean;
  /**
   * RandomRotation's degrees: `d` draws the angle in [-d, d], `[lo, hi]` in [lo, hi],
   * counter-clockwise, about the centre, bilinear (default 0: none).
   */
  rotation?: number | readonly [number, number];
  /** The rotation's fill outside the image: one byte, or one per channel (default 0). */
  fill?: number | readonly number[];
}

/** {@linkcode GeometryOptions} checked, with every default filled in, frozen. */
export interface GeometrySpec {
  /** Output rows. */
  readonly height: number;
  /** Output columns. */
  readonly width: number;
  /** How the box is chosen. */
  readonly crop: GeometryCrop;
  /** Area fraction range. */
  readonly scale: readonly [number, number];
  /** Aspect ratio range. */
  readonly ratio: readonly [number, number];
  /** Widen the filter when shrinking. */
  readonly antialias: boolean;
  /** The angle's range in degrees ([0, 0]: no rotation). */
  readonly rotation: readonly [number, number];
  /** The fill, one byte per channel (channel k in bits 8k..8k+7), for the kernel. */
  readonly fill: number;
}

const GEOMETRY_KEYS = Object.keys(
  {
    size: true,
    crop: true,
    scale: true,
    ratio: true,
    antialias: true,
    rotation: true,
    fill: true,
  } satisfies Record<keyof GeometryOptions, true>,
);

/** The largest output side the kernel takes (`PS_GEO_MAX_SIDE`). */
const MAX_SIDE = 2 ** 14;

/**
 * Checks geometry options and fills in the defaults.
 *
 * @param options What the caller passed as its `geometry` option.
 * @param action What the caller was doing, for "Cannot <action>: ...".
 * @returns The checked options, frozen.
 * @throws {TypeError} When `options` is not an object, has a key outside
 * {@linkcode GeometryOptions} (with a did-you-mean), or a value of the wrong type.
 * @throws {RangeError} When a value is out of range, naming the option and the value.
 *
 * @example RandomResizedCrop(224) with its defaults; a bad scale named
 * ```ts
 * import { resolveGeometry } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const spec = resolveGeometry({ size: 224, crop: "random-resized-crop" }, "create DataLoader");
 * assert.deepStrictEqual([spec.height, spec.width, spec.scale], [224, 224, [0.08, 1]]);
 * assert.throws(
 *   () => resolveGeometry({ size: 8, scale: [0.5, 0.1] }, "create DataLoader"),
 *   /Cannot create DataLoader: geometry\.scale option should be \[lo, hi\] with 0 < lo <= hi <= 1/,
 * );
 * assert.throws(() => resolveGeometry({ size: 8, rotate: 10 } as never, "go"), /rotation/);
 * ```
 */
export function resolveGeometry(options: GeometryOptions, action: string): GeometrySpec {
  const fail = (key: string, message: string, type: "type" | "range" = "range"): never =>
    optionError(action, key ? `geometry.${key}` : "geometry", message, type);
  if (typeof options !== "object" || options === null) {
    fail("", 'should be an object such as { size: 224, crop: "random-resized-crop" }', "type");
  }
  refuseUnknownKeys(options, GEOMETRY_KEYS, `${action} with geometry`);
  const o = options;
  const side = (v: unknown) =>
    Number.isInteger(v) && (v as number) >= 1 && (v as number) <= MAX_SIDE;
  const size = typeof o.size === "number" ? [o.size, o.size] : o.size;
  if (!Array.isArray(size) || size.length !== 2 || !side(size[0]) || !side(size[1])) {
    fail(
      "size",
      `should be [height, width] or one side, integers in 1..${MAX_SIDE}, got ${
        JSON.stringify(o.size)
      }`,
    );
  }
  const crop = o.crop ?? "resize";
  if (crop !== "resize" && crop !== "center-crop" && crop !== "random-resized-crop") {
    fail(
      "crop",
      `should be "resize", "center-crop" or "random-resized-crop", got ${JSON.stringify(crop)}`,
      "type",
    );
  }
  const pair = (key: "scale" | "ratio", dflt: [number, number], max: number) => {
    const v = o[key] ?? dflt;
    if (
      !Array.isArray(v) || v.length !== 2 || !v.every((x) => Number.isFinite(x)) ||
      !(v[0] > 0 && v[0] <= v[1] && v[1] <= max)
    ) {
      fail(
        key,
        `should be [lo, hi] with 0 < lo <= hi <= ${max === 1 ? 1 : "a finite number"}, got ${
          JSON.stringify(v)
        }`,
      );
    }
    if (o[key] !== undefined && crop !== "random-resized-crop") {
      fail(key, `goes with crop: "random-resized-crop", got crop: "${crop}"`, "type");
    }
    return Object.freeze([v[0], v[1]] as [number, number]);
  };
  const scale = pair("scale", [0.08, 1], 1);
  const ratio = pair("ratio", [3 / 4, 4 / 3], Number.MAX_VALUE);
  const antialias = o.antialias ?? true;
  if (typeof antialias !== "boolean") {
    fail("antialias", `should be a boolean value, got ${String(antialias)}`, "type");
  }
  const r = o.rotation ?? 0;
  const rotation = typeof r === "number" ? [-r, r] : r;
  if (
    !Array.isArray(rotation) || rotation.length !== 2 ||
    !rotation.every((x) => Number.isFinite(x)) || !(rotation[0] <= rotation[1]) ||
    (typeof r === "number" && r < 0)
  ) {
    fail(
      "rotation",
      `should be degrees d >= 0 (angles in [-d, d]) or [lo, hi] with lo <= hi, got ${
        JSON.stringify(r)
      }`,
    );
  }
  const f = o.fill ?? 0;
  const fills = typeof f === "number" ? [f, f, f, f] : f;
  if (
    !Array.isArray(fills) || fills.length < 1 || fills.length > 4 ||
    !fills.every((x) => Number.isInteger(x) && x >= 0 && x <= 255)
  ) {
    fail(
      "fill",
      `should be a byte 0..255 or 1 to 4 of them (one per channel), got ${JSON.stringify(f)}`,
    );
  }
  let fill = 0;
  for (let k = 0; k < fills.length; k++) fill |= fills[k] << (8 * k);
  return Object.freeze({
    height: size[0],
    width: size[1],
    crop,
    scale,
    ratio,
    antialias,
    rotation: Object.freeze([rotation[0] + 0, rotation[1] + 0] as [number, number]),
    fill,
  });
}

/** Draw k of the sample stream at `position` (the stream of augment/record.ts). */
function draw(k0: number, position: number, k: number): number {
  return hash4(k0, position, k, 0x243f6a88);
}

/** Python's round(): to nearest, ties to even (torchvision rounds the box's sides so). */
function roundEven(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * Writes the geometry record of one sample of an `h` x `w` image at `out[at]`: the box
 * `spec.crop` chooses and the rotation, from the draws of the sample at `position` of the epoch
 * whose key is `k0` ({@linkcode sampleKey}).
 *
 * @param out Where the record goes.
 * @param at Its first word.
 * @param spec From {@linkcode resolveGeometry}.
 * @param h The source image's height.
 * @param w Its width.
 * @param k0 The epoch's key.
 * @param position The sample's position in the epoch.
 * @throws {RangeError} When `h` or `w` is not a positive integer.
 *
 * @example The centre crop of a 10x20 image to 4x4, no rotation
 * ```ts
 * import { resolveGeometry, writeGeometryRecord } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const spec = resolveGeometry({ size: 4, crop: "center-crop" }, "crop");
 * const out = new Int32Array(8);
 * writeGeometryRecord(out, 0, spec, 10, 20, 0, 0);
 * assert.deepStrictEqual([...out], [10, 20, 3, 8, 4, 4, 2 ** 30, 0]);
 * ```
 */
export function writeGeometryRecord(
  out: Int32Array,
  at: number,
  spec: GeometrySpec,
  h: number,
  w: number,
  k0: number,
  position: number,
): void {
  if (!(Number.isInteger(h) && h >= 1 && Number.isInteger(w) && w >= 1)) {
    throw new RangeError(`Cannot draw a geometry record: the image is ${h}x${w}`);
  }
  const p = position >>> 0;
  let top = 0, left = 0, ch = h, cw = w;
  if (spec.crop === "center-crop") {
    ch = Math.min(spec.height, h);
    cw = Math.min(spec.width, w);
    // torchvision: int(round((h - th) / 2.0)).
    top = roundEven((h - ch) / 2);
    left = roundEven((w - cw) / 2);
  } else if (spec.crop === "random-resized-crop") {
    [top, left, ch, cw] = randomResizedBox(spec, h, w, k0, p);
  }
  out[at] = h;
  out[at + 1] = w;
  out[at + 2] = top;
  out[at + 3] = left;
  out[at + 4] = ch;
  out[at + 5] = cw;
  const [lo, hi] = spec.rotation;
  if (lo === 0 && hi === 0) {
    out[at + 6] = ROTATION_ONE;
    out[at + 7] = 0;
  } else {
    const u = draw(k0, p, GEOMETRY_FIRST_DRAW) / 2 ** 32;
    const radians = ((lo + (hi - lo) * u) * Math.PI) / 180;
    out[at + 6] = Math.round(Math.cos(radians) * ROTATION_ONE);
    out[at + 7] = Math.round(Math.sin(radians) * ROTATION_ONE);
  }
}

/** torchvision's RandomResizedCrop.get_params on the sample's draws: [top, left, h, w]. */
function randomResizedBox(
  spec: GeometrySpec,
  h: number,
  w: number,
  k0: number,
  p: number,
): [number, number, number, number] {
  const area = h * w;
  const [s0, s1] = spec.scale, [r0, r1] = spec.ratio;
  const l0 = Math.log(r0), l1 = Math.log(r1);
  for (let a = 0; a < 10; a++) {
    const k = GEOMETRY_FIRST_DRAW + 1 + 4 * a;
    const target = area * (s0 + (s1 - s0) * (draw(k0, p, k) / 2 ** 32));
    const aspect = Math.exp(l0 + (l1 - l0) * (draw(k0, p, k + 1) / 2 ** 32));
    const cw = roundEven(Math.sqrt(target * aspect));
    const ch = roundEven(Math.sqrt(target / aspect));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      const top = Math.floor((draw(k0, p, k + 2) / 2 ** 32) * (h - ch + 1));
      const left = Math.floor((draw(k0, p, k + 3) / 2 ** 32) * (w - cw + 1));
      return [top, left, ch, cw];
    }
  }
  // The fallback: the centre crop with the ratio clamped to its range.
  const inRatio = w / h;
  let cw = w, ch = h;
  if (inRatio < r0) ch = Math.max(1, Math.min(h, roundEven(w / r0)));
  else if (inRatio > r1) cw = Math.max(1, Math.min(w, roundEven(h * r1)));
  return [Math.floor((h - ch) / 2), Math.floor((w - cw) / 2), ch, cw];
}

/**
 * Writes the geometry records of `count` samples at draw positions `position`,
 * `position + stride`, ... (augment/record.ts: `stride` is 1 in one process, the world size for
 * a rank's shard), one after another from `out[at]`, for images of the sizes `sizes` gives (`[h0, w0, h1, w1, ...]`,
 * or one `[h, w]` for all).
 *
 * @param out Where the records go.
 * @param at The first word of the first record.
 * @param spec From {@linkcode resolveGeometry}.
 * @param sizes Each sample's image height and width, or one pair for every sample.
 * @param k0 The epoch's key ({@linkcode sampleKey}).
 * @param position The draw position of the first sample.
 * @param count Samples.
 * @param stride The step between the samples' draw positions (default 1).
 * @example Records of two 32x32 images resized to 16x16
 * ```ts
 * import { GEOMETRY_RECORD_LENGTH, resolveGeometry, writeGeometryRecords } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const out = new Int32Array(2 * GEOMETRY_RECORD_LENGTH);
 * writeGeometryRecords(out, 0, resolveGeometry({ size: 16 }, "resize"), [32, 32], 1, 0, 2);
 * assert.deepStrictEqual([...out.subarray(8, 14)], [32, 32, 0, 0, 32, 32]);
 * ```
 */
export function writeGeometryRecords(
  out: Int32Array,
  at: number,
  spec: GeometrySpec,
  sizes: ArrayLike<number>,
  k0: number,
  position: number,
  count: number,
  stride = 1,
): void {
  const each = sizes.length === 2 ? 0 : 2;
  if (each === 2 && sizes.length < 2 * count) {
    throw new RangeError(
      `Cannot draw geometry records: ${count} samples need ${2 * count} sizes, got ${sizes.length}`,
    );
  }
  for (let k = 0; k < count; k++) {
    writeGeometryRecord(
      out,
      at + k * GEOMETRY_RECORD_LENGTH,
      spec,
      sizes[each * k],
      sizes[each * k + 1],
      k0,
      position + k * stride,
    );
  }
}
