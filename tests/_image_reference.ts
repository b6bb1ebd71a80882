/**
 * An independent TypeScript reference of the fused image transform, written the long way
 * (torchvision's order of operations: pad the image, take the crop window, mirror it left-right
 * then top-bottom, jitter brightness then contrast, normalize each pixel, then cut a square
 * out of the normalized image), for the bit-for-bit tests of the kernels and of the pipeline.
 * It shares no code with augment/host.ts or augment/record.ts: it reads the record words as
 * kernels/pinstream.h documents them.
 *
 * @module
 */

/** int32 words of one sample's record (PS_IMAGE_PARAMS). */
export const RECORD = 9;
/** fp32 1.0 as int32 bits: a colour factor that changes nothing. */
export const ONE_BITS = 0x3f800000;

/** The int32 bits of fp32 `x`. */
export function f32Bits(x: number): number {
  return new Int32Array(new Float32Array([x]).buffer)[0];
}

/** Records of n samples with only (dy, dx, flip) set, everything else off. */
export function cropRecords(triples: ArrayLike<number>): Int32Array {
  const n = triples.length / 3;
  const out = new Int32Array(RECORD * n);
  for (let i = 0; i < n; i++) {
    out.set([triples[3 * i], triples[3 * i + 1], triples[3 * i + 2]], RECORD * i);
    out[RECORD * i + 7] = out[RECORD * i + 8] = ONE_BITS;
  }
  return out;
}

/** One batch worth of inputs for {@linkcode referenceAugment}. */
export interface ReferenceInput {
  src: Uint8Array;
  /** n records of RECORD words or null (centre window, nothing else). */
  params: Int32Array | null;
  n: number;
  c: number;
  h: number;
  w: number;
  pad: number;
  layout: "nhwc" | "nchw";
  mean: number[];
  std: number[];
  dtype: "f16" | "f32";
}

/** Returns the batch as NCHW numbers already rounded to the output type. */
export function referenceAugment(input: ReferenceInput): number[] {
  const { src, params, n, c, h, w, pad, layout, mean, std, dtype } = input;
  const f32 = Math.fround;
  const out: number[] = [];
  const word = (i: number, k: number, off: number) => params ? params[i * RECORD + k] : off;
  const asF32 = (bits: number) => new Float32Array(new Int32Array([bits]).buffer)[0];
  const clamp = (x: number) => (x < 0 ? 0 : x > 255 ? 255 : x);
  for (let i = 0; i < n; i++) {
    const dy = word(i, 0, pad);
    const dx = word(i, 1, pad);
    const flip = word(i, 2, 0) !== 0;
    const vflip = word(i, 3, 0) !== 0;
    const brightness = asF32(word(i, 7, ONE_BITS)), contrast = asF32(word(i, 8, ONE_BITS));
    // The cutout square: centre pixel from the clamped 16-bit fractions, side `size`, clipped.
    const size = word(i, 6, 0);
    const centre = (frac: number, extent: number) =>
      Math.floor((Math.min(65535, Math.max(0, frac)) * extent) / 65536);
    const cy = centre(word(i, 4, 0), h), cx = centre(word(i, 5, 0), w);
    const inCut = (y: number, x: number) =>
      size > 0 && y >= cy - Math.floor(size / 2) && y < cy - Math.floor(size / 2) + size &&
      x >= cx - Math.floor(size / 2) && x < cx - Math.floor(size / 2) + size;
    for (let ch = 0; ch < c; ch++) {
      // The host-side constants, as C computes them in fp32.
      const sd = f32(std[ch]);
      const scale = f32(1 / f32(255 * sd));
      const bias = f32(-f32(f32(mean[ch]) / sd));
      // 1. pad: a (h + 2 pad) x (w + 2 pad) plane of this channel, zeros around the image.
      const ph = h + 2 * pad, pw = w + 2 * pad;
      const padded = (y: number, x: number): number => {
        const yy = y - pad, xx = x - pad;
        if (yy < 0 || yy >= h || xx < 0 || xx >= w) return 0;
        return layout === "nchw"
          ? src[i * c * h * w + ch * h * w + yy * w + xx]
          : src[i * c * h * w + yy * w * c + xx * c + ch];
      };
      // 2. crop an h x w window at (dy, dx) (outside the padded plane also reads 0).
      const cropped = (y: number, x: number): number => {
        const py = y + dy, px = x + dx;
        if (py < 0 || py >= ph || px < 0 || px >= pw) return 0;
        return padded(py, px);
      };
      for (let y = 0; y < h; y++) {
        for (let x = 0; x < w; x++) {
          // 3. flip the crop: left-right, then top-bottom.
          const yy = vflip ? h - 1 - y : y;
          let v = flip ? cropped(yy, w - 1 - x) : cropped(yy, x);
          // 4. brightness, then contrast toward the grey 127.5, each clamped to [0, 255]
          // (skipped when both factors are 1, where they change nothing).
          if (brightness !== 1 || contrast !== 1) {
            v = clamp(f32(v * brightness));
            v = clamp(f32(f32(contrast * v) + f32(f32(1 - contrast) * 127.5)));
          }
          // 5. normalize: fp32 multiply, fp32 add; 6. cutout; then the cast.
          const r = inCut(y, x) ? 0 : f32(f32(v * scale) + bias);
          out.push(dtype === "f16" ? Math.f16round(r) : r);
        }
      }
    }
  }
  return out;
}

/** Deterministic generator for test data (mulberry32). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Indices where two arrays differ bitwise (NaN-safe via Object.is), at most `limit`. */
export function bitDiff(
  a: ArrayLike<number>,
  b: ArrayLike<number>,
  limit = 5,
): string[] {
  const d: string[] = [];
  if (a.length !== b.length) d.push(`length ${a.length} != ${b.length}`);
  for (let i = 0; i < Math.min(a.length, b.length) && d.length < limit; i++) {
    if (!Object.is(a[i], b[i])) d.push(`[${i}] ${a[i]} != ${b[i]}`);
  }
  return d;
}
