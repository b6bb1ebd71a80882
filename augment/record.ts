/**
 * The per-sample augment record: the words a loader draws for each sample and the image
 * kernels (`ps_image_augment`) and {@linkcode augmentHost} apply. This module is the record's
 * one owner: its layout, the key of an epoch's draws and the loop that writes them.
 *
 * ## The record
 *
 * Sample k's record is {@linkcode AUGMENT_RECORD_LENGTH} int32 words (the `PS_IMAGE_PARAMS`
 * record of `ps_image_augment` in kernels/pinstream.h):
 *
 * | word | meaning | off |
 * |------|---------|-----|
 * | 0, 1 | `dy, dx` in `[0, 2p]`: the crop window's top-left corner in the image zero-padded by `p = padding` on every side (torchvision's `RandomCrop(size, padding=p)`) | `0, 0` with padding 0 |
 * | 2 | `flip` in `{0, 1}`: mirror left-right (`RandomHorizontalFlip`) | 0 |
 * | 3 | `vflip` in `{0, 1}`: mirror top-bottom (`RandomVerticalFlip`) | 0 |
 * | 4, 5 | the cutout square's centre row and column as fractions of the height and width in 1/65536 units, each in `[0, 65535]` | 0, 0 |
 * | 6 | the cutout square's side in pixels (`cutout`) | 0: none |
 * | 7, 8 | brightness and contrast factors as the bits of fp32 values, each drawn uniformly in `[max(0, 1 - j), 1 + j]` for `brightness: j` / `contrast: j` (ColorJitter) | `1.0` (`0x3f800000`) |
 * | 9 | saturation factor, fp32 bits, drawn likewise for `saturation: j` | `1.0` |
 * | 10 | hue shift in turns, fp32 bits, drawn uniformly in `[-h, h]` for `hue: h` (`h <= 0.5`) | `0.0` (`0`) |
 *
 * Per output pixel (y, x) of an H x W image: `xs = flip ? W - 1 - x : x`,
 * `ys = vflip ? H - 1 - y : y`, source pixel `(ys + dy - p, xs + dx - p)`, 0 outside the image;
 * then ColorJitter's steps in a fixed order, contrast, brightness, saturation, hue (contrast
 * blends toward the image's own mean grey over its crop window, see `augmentHost`; saturation
 * and hue act on 3-channel images only), the normalization, and cutout sets the normalized
 * value to 0 inside the square (rows `cy - floor(side / 2)` .. `+ side`,
 * `cy = floor(word4 * H / 65536)`, likewise columns, clipped to the image).
 *
 * ## The draws
 *
 * The words come from the sample's stream of uint32 draws, a pure function of (seed, epoch,
 * draw position) and the same as `ctx.u32()` in a dataset's `get(index, ctx)` (and
 * `ctx.position` is that draw position): draw 0
 * gives words 0-2 (see {@linkcode augmentFromDraw}), draw 1 the vertical flip, draw 2 the
 * cutout centre, draws 3 and 4 the brightness and contrast factors, draws 5 and 6 the
 * saturation factor and the hue shift. Each option has its own draw, so turning one on or off
 * leaves the others' values as they were.
 *
 * ## The draw position
 *
 * A sample's draw position is its place in the epoch's global order: the order of the whole
 * epoch before any sharding, counting from 0 batch after batch. In one process it is the
 * sample's position in the loader's epoch. With a `DistributedSampler` of
 * `worldSize` ranks, the k-th sample of rank r's shard sits at `r + k * worldSize` of the
 * un-sharded (shuffled, padded) order that every rank computes alike, and that is its draw
 * position (`EpochOrder.drawPosition`). So two ranks never draw for the same position, and
 * with the same seed the ranks' batches together hold exactly the samples and records of one
 * process fed the combined batch (batch b of N ranks of size B is batch b of one process of
 * size N * B, its positions interleaved by rank). A loader over a DistributedSampler takes
 * the sampler's seed as its own when none is given, so that the ranks share the key.
 *
 * A new transform adds its words here (and to `PS_IMAGE_PARAMS`), its option to options.ts,
 * its arithmetic to host.ts, kernels/rules.h and the two image kernels.
 *
 * @module
 */

import { hash4, seedWords, STREAM_SAMPLE } from "../internal/random.ts";
import type { AugmentSpec } from "./options.ts";

/**
 * int32 words of one sample's `augment` record (`PS_IMAGE_PARAMS` in kernels/pinstream.h):
 * `[dy, dx, flip, vflip, cutY, cutX, cutSize, brightnessBits, contrastBits, saturationBits,
 * hueBits]`.
 *
 * @example
 * ```ts
 * import { AUGMENT_RECORD_LENGTH } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(AUGMENT_RECORD_LENGTH, 11);
 * ```
 */
export const AUGMENT_RECORD_LENGTH: number = 11;

/** Draw k of the sample stream at `position` (CounterRandom's output k for that key). */
function draw(k0: number, position: number, k: number): number {
  return hash4(k0, position, k, 0x243f6a88);
}

/** The bits of fp32 1.0: a brightness or contrast factor that changes nothing. */
const F32_ONE = 0x3f800000;
const f32 = new Float32Array(1), f32Bits = new Int32Array(f32.buffer);

/** The fp32 bits of a factor uniform in [max(0, 1 - jitter), 1 + jitter] from draw `u`. */
function factorBits(u: number, jitter: number): number {
  if (jitter === 0) return F32_ONE;
  const lo = Math.max(0, 1 - jitter), hi = 1 + jitter;
  f32[0] = lo + (hi - lo) * (u / 0x1_0000_0000);
  return f32Bits[0];
}

/** The fp32 bits of a hue shift uniform in [-jitter, jitter] from draw `u` (0 when off). */
function hueBits(u: number, jitter: number): number {
  if (jitter === 0) return 0;
  f32[0] = -jitter + 2 * jitter * (u / 0x1_0000_0000);
  return f32Bits[0];
}

/**
 * The key of an epoch's per-sample streams (the `k0` of {@linkcode writeAugmentRecords}).
 *
 * @param seed The loader's seed.
 * @param epoch The epoch.
 * @returns A uint32 key.
 *
 * @example One key per (seed, epoch)
 * ```ts
 * import { sampleKey } from "./record.ts";
 * import assert from "node:assert";
 * assert.strictEqual(sampleKey(1, 0), sampleKey(1, 0));
 * assert.notStrictEqual(sampleKey(1, 0), sampleKey(1, 1));
 * ```
 */
export function sampleKey(seed: number, epoch: number): number {
  const [lo, hi] = seedWords(seed);
  return hash4(lo, hi, epoch >>> 0, STREAM_SAMPLE);
}

/**
 * Writes the records of `count` samples at draw positions `position`, `position + stride`,
 * ... (the module documentation's draw positions: `stride` is 1 in one process, the world
 * size for a rank's shard), one after another from `out[at]`, from the epoch's key `k0`
 * ({@linkcode sampleKey}); draw k of a sample is `CounterRandom`'s output k for its position. The gather's hot loop: no allocation, one hash
 * per option in use, and no call per sample (one measured 10-45% slower in the order loader).
 *
 * @param out Where the records go.
 * @param at The first word of the first record in `out`.
 * @param k0 The epoch's key.
 * @param position The draw position of the first sample.
 * @param count Samples.
 * @param augment What is drawn.
 * @param stride The step between the samples' draw positions (default 1).
 *
 * @example The same words as {@linkcode augmentRecord}
 * ```ts
 * import { AUGMENT_OFF } from "./options.ts";
 * import { AUGMENT_RECORD_LENGTH, augmentRecord, sampleKey, writeAugmentRecords } from "./record.ts";
 * import assert from "node:assert";
 *
 * const spec = { ...AUGMENT_OFF, padding: 4, flip: true };
 * const out = new Int32Array(3 * AUGMENT_RECORD_LENGTH);
 * writeAugmentRecords(out, 0, sampleKey(7, 2), 10, 3, spec);
 * assert.deepStrictEqual([...out.subarray(11, 22)], [...augmentRecord(7, 2, 11, spec)]);
 *
 * // Rank 1 of 4: its samples sit at draw positions 1, 5, 9.
 * writeAugmentRecords(out, 0, sampleKey(7, 2), 1, 3, spec, 4);
 * assert.deepStrictEqual([...out.subarray(22, 33)], [...augmentRecord(7, 2, 9, spec)]);
 * ```
 */
export function writeAugmentRecords(
  out: Int32Array,
  at: number,
  k0: number,
  position: number,
  count: number,
  augment: AugmentSpec,
  stride = 1,
): void {
  const span = 2 * augment.padding + 1;
  for (let k = 0, o = at; k < count; k++, o += AUGMENT_RECORD_LENGTH) {
    const p = (position + k * stride) >>> 0;
    const u = draw(k0, p, 0);
    // Words 0-2 as augmentFromDraw splits draw 0.
    out[o] = Math.floor(((u & 0xffff) / 65536) * span);
    out[o + 1] = Math.floor((((u >>> 16) & 0x7fff) / 32768) * span);
    out[o + 2] = augment.flip ? u >>> 31 : 0;
    out[o + 3] = augment.vflip ? draw(k0, p, 1) >>> 31 : 0;
    const cut = augment.cutout > 0 ? draw(k0, p, 2) : 0;
    out[o + 4] = cut & 0xffff;
    out[o + 5] = cut >>> 16;
    out[o + 6] = augment.cutout;
    out[o + 7] = factorBits(augment.brightness > 0 ? draw(k0, p, 3) : 0, augment.brightness);
    out[o + 8] = factorBits(augment.contrast > 0 ? draw(k0, p, 4) : 0, augment.contrast);
    out[o + 9] = factorBits(augment.saturation > 0 ? draw(k0, p, 5) : 0, augment.saturation);
    out[o + 10] = hueBits(augment.hue > 0 ? draw(k0, p, 6) : 0, augment.hue);
  }
}

/**
 * The `augment` record the loader writes for the sample at draw `position` (its place in the
 * epoch's global order, see the module documentation) of `epoch`: a pure function of the seed, the epoch, the position and the
 * options, whatever worker loads the sample and however many there are. See the module
 * documentation for the words.
 *
 * @param seed the loader's seed
 * @param epoch the epoch
 * @param position the sample's draw position in the epoch
 * @param augment the loader's augment options with defaults filled in (`loader.augment`)
 * @returns the record, {@linkcode AUGMENT_RECORD_LENGTH} int32 words
 * @example The record of the first sample, every augmentation off but the crop
 * ```ts
 * import { augmentRecord } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const off = {
 *   padding: 4, flip: false, vflip: false, cutout: 0,
 *   brightness: 0, contrast: 0, saturation: 0, hue: 0,
 * };
 * const r = augmentRecord(1, 0, 0, off);
 * assert.ok(r[0] >= 0 && r[0] <= 8 && r[1] >= 0 && r[1] <= 8);
 * assert.deepStrictEqual([...r.slice(2)], [0, 0, 0, 0, 0, 0x3f800000, 0x3f800000, 0x3f800000, 0]);
 * ```
 */
export function augmentRecord(
  seed: number,
  epoch: number,
  position: number,
  augment: AugmentSpec,
): Int32Array {
  const out = new Int32Array(AUGMENT_RECORD_LENGTH);
  writeAugmentRecords(out, 0, sampleKey(seed, epoch), position, 1, augment);
  return out;
}

/**
 * The crop offsets and flip bit of one sample from one 32-bit draw `u`:
 * `dy = floor((u & 0xffff) / 2^16 * (2p+1))`, `dx = floor(((u >>> 16) & 0x7fff) / 2^15 * (2p+1))`,
 * `flip = u >>> 31` (0 when flips are off). One draw instead of three keeps the per-sample
 * cost of the zero-copy gather low.
 *
 * @param u a uint32 draw (the first of the sample's stream)
 * @param padding the crop padding p
 * @param flip whether flips are drawn
 * @returns `[dy, dx, flip]`
 * @example
 * ```ts
 * import { augmentFromDraw } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.deepStrictEqual(augmentFromDraw(0xffffffff, 4, true), [8, 8, 1]);
 * assert.deepStrictEqual(augmentFromDraw(0, 4, true), [0, 0, 0]);
 * ```
 */
export function augmentFromDraw(
  u: number,
  padding: number,
  flip: boolean,
): [number, number, number] {
  const span = 2 * padding + 1;
  return [
    Math.floor(((u & 0xffff) / 65536) * span),
    Math.floor((((u >>> 16) & 0x7fff) / 32768) * span),
    flip ? u >>> 31 : 0,
  ];
}
