/**
 * The host reference of `ps_image_geometry`: each sample's box resized with Pillow's bilinear
 * (22-bit fixed-point weights from fp64 filter values, the horizontal pass first, rounded to
 * bytes between passes), then rotated with Pillow's bilinear transform in fixed point, in
 * TypeScript, with the arithmetic of kernels/rules.h (JavaScript's numbers are fp64 and never
 * fused), so the bytes equal both backends'.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { GEOMETRY_RECORD_LENGTH } from "./geometry.ts";

/** Shape of one batch for {@linkcode geometryHost}. */
export interface GeometryHostOptions {
  /** Samples. */
  n: number;
  /** Channels per pixel, 1 to 4 (HWC). */
  channels: number;
  /** Bytes from one sample's source slot to the next. */
  srcStride: number;
  /** Output rows. */
  height: number;
  /** Output columns. */
  width: number;
  /** Widen the filter when shrinking (default true). */
  antialias?: boolean;
  /** The rotation's fill, one byte per channel, channel k in bits 8k..8k+7 (default 0). */
  fill?: number;
}

const KEYS = Object.keys(
  {
    n: true,
    channels: true,
    srcStride: true,
    height: true,
    width: true,
    antialias: true,
    fill: true,
  } satisfies Record<keyof GeometryHostOptions, true>,
);

const BITS = 22, HALF = 1 << 21, ONE = 1 << BITS;

interface Axis {
  scale: number;
  fscale: number;
  start: number;
  in: number;
  out: number;
}

function axis(start: number, size: number, out: number, antialias: boolean): Axis {
  const scale = size / out;
  return { scale, fscale: antialias && scale > 1 ? scale : 1, start, in: size, out };
}

/** Taps of position x: [lo, n, weights...] (ps_geo_taps_at and ps_geo_weight). */
function taps(a: Axis, x: number): { lo: number; weights: number[] } {
  const center = (x + 0.5) * a.scale;
  const lo = Math.max(Math.trunc(center - a.fscale + 0.5), 0);
  const n = Math.min(Math.trunc(center + a.fscale + 0.5), a.in) - lo;
  const k: number[] = [];
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const d = Math.abs((lo + i - center + 0.5) / a.fscale);
    k.push(d < 1 ? 1 - d : 0);
    sum += k[i];
  }
  return { lo, weights: k.map((v) => Math.trunc(0.5 + (sum !== 0 ? v / sum : v) * ONE)) };
}

function byte(acc: number): number {
  const v = acc >> BITS;
  return v < 0 ? 0 : v > 255 ? 255 : v;
}

/**
 * The host-side twin of `ps_image_geometry`: crops, resizes and rotates a batch of uint8 HWC
 * images, each in its slot with its size in its record ({@linkcode writeGeometryRecord}), into
 * `n` HWC images of `height` x `width`. Same bytes as the kernel on either backend.
 *
 * @param src `n` slots of `srcStride` bytes.
 * @param params `n` records of {@linkcode GEOMETRY_RECORD_LENGTH} int32.
 * @param out `n * height * width * channels` bytes, written.
 * @param options Shape, filter and fill.
 * @throws {RangeError} When an array is shorter than the shape needs or a record lies outside
 * its slot.
 * @throws {TypeError} When `options` has a key not in {@linkcode GeometryHostOptions}.
 *
 * @example Halving a 2x2 grey image averages it; a 180-degree turn mirrors both axes
 * ```ts
 * import { geometryHost } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const out = new Uint8Array(1);
 * const none = [2 ** 30, 0];
 * geometryHost(new Uint8Array([0, 100, 200, 100]), new Int32Array([2, 2, 0, 0, 2, 2, ...none]), out, {
 *   n: 1, channels: 1, srcStride: 4, height: 1, width: 1,
 * });
 * assert.deepStrictEqual([...out], [100]);
 * const turned = new Uint8Array(2);
 * geometryHost(new Uint8Array([1, 2]), new Int32Array([1, 2, 0, 0, 1, 2, -(2 ** 30), 0]), turned, {
 *   n: 1, channels: 1, srcStride: 2, height: 1, width: 2,
 * });
 * assert.deepStrictEqual([...turned], [2, 1]);
 * ```
 */
export function geometryHost(
  src: Uint8Array,
  params: Int32Array,
  out: Uint8Array,
  options: GeometryHostOptions,
): void {
  refuseUnknownKeys(options, KEYS, "transform images");
  const { n, channels: c, srcStride, height: oh, width: ow } = options;
  const antialias = options.antialias ?? true, fill = options.fill ?? 0;
  const R = GEOMETRY_RECORD_LENGTH, img = oh * ow * c;
  if (src.length < n * srcStride || out.length < n * img || params.length < n * R) {
    throw new RangeError(
      `Cannot transform images: ${n} samples need ${n * srcStride} source bytes, ${n * img} ` +
        `output bytes and ${n * R} params; got ${src.length}, ${out.length}, ${params.length}`,
    );
  }
  const resized = new Uint8Array(img);
  for (let s = 0; s < n; s++) {
    const r = params.subarray(s * R, s * R + R);
    const [h, w, top, left, ch, cw, cs, sn] = r;
    if (
      !(h >= 1 && w >= 1 && h * w * c <= srcStride && top >= 0 && left >= 0 && ch >= 1 &&
        cw >= 1 && top + ch <= h && left + cw <= w)
    ) {
      throw new RangeError(
        `Cannot transform images: sample ${s}'s record [${[...r]}] lies outside its slot`,
      );
    }
    const base = s * srcStride, row = w * c;
    const ay = axis(top, ch, oh, antialias), ax = axis(left, cw, ow, antialias);
    const xt = Array.from({ length: ow }, (_, x) => taps(ax, x));
    const yt = Array.from({ length: oh }, (_, y) => taps(ay, y));
    const rotate = !(cs === 2 ** 30 && sn === 0);
    const dst = rotate ? resized : out.subarray(s * img, s * img + img);
    for (let y = 0; y < oh; y++) {
      const ty = yt[y];
      for (let x = 0; x < ow; x++) {
        const tx = xt[x];
        for (let k = 0; k < c; k++) {
          // An axis of unchanged size has one tap of weight one: read it directly.
          const rowByte = (sy: number) => {
            const p = base + sy * row + k;
            if (ax.in === ax.out) return src[p + (left + x) * c];
            let acc = HALF;
            for (let i = 0; i < tx.weights.length; i++) {
              acc += src[p + (left + tx.lo + i) * c] * tx.weights[i];
            }
            return byte(acc);
          };
          let v: number;
          if (ay.in === ay.out) v = rowByte(top + y);
          else {
            let acc = HALF;
            for (let j = 0; j < ty.weights.length; j++) {
              acc += rowByte(top + ty.lo + j) * ty.weights[j];
            }
            v = byte(acc);
          }
          dst[(y * ow + x) * c + k] = v;
        }
      }
    }
    if (rotate) rotateInto(resized, cs, sn, oh, ow, c, fill, out.subarray(s * img, s * img + img));
  }
}

/** ps_geo_rotate_at and ps_geo_blend over a whole image, in BigInt where int64 is needed. */
function rotateInto(
  src: Uint8Array,
  cs: number,
  sn: number,
  oh: number,
  ow: number,
  c: number,
  fill: number,
  out: Uint8Array,
): void {
  const one = 2n ** 31n, half = 2n ** 30n;
  const C = BigInt(cs), S = BigInt(sn);
  for (let y = 0; y < oh; y++) {
    for (let x = 0; x < ow; x++) {
      const o = (y * ow + x) * c;
      const u = BigInt(2 * x + 1 - ow), v = BigInt(2 * y + 1 - oh);
      const X = C * u - S * v + BigInt(ow) * half, Y = S * u + C * v + BigInt(oh) * half;
      if (X < 0n || Y < 0n || X >= BigInt(ow) * one || Y >= BigInt(oh) * one) {
        for (let k = 0; k < c; k++) out[o + k] = (fill >>> (8 * k)) & 255;
        continue;
      }
      const xs = X + half, ys = Y + half;
      const px = Number(xs / one) - 1, py = Number(ys / one) - 1;
      const fx = Number((xs % one) >> 15n), fy = Number((ys % one) >> 15n);
      const x0 = Math.max(px, 0), x1 = Math.min(px + 1, ow - 1), y0 = Math.max(py, 0);
      const hasY1 = py + 1 < oh, y1 = hasY1 ? py + 1 : y0;
      for (let k = 0; k < c; k++) {
        const a = src[(y0 * ow + x0) * c + k], b = src[(y0 * ow + x1) * c + k];
        const top = a * (65536 - fx) + b * fx;
        const bottom = hasY1
          ? src[(y1 * ow + x0) * c + k] * (65536 - fx) + src[(y1 * ow + x1) * c + k] * fx
          : top;
        // top, bottom < 2^24: the sum below is < 2^40, exact in a double.
        out[o + k] = Math.floor((top * (65536 - fy) + bottom * fy) / 2 ** 32);
      }
    }
  }
}
