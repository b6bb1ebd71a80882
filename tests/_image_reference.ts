/**
 * An independent TypeScript reference of the fused image transform, written the long way
 * (torchvision's order of operations: pad the image, take the crop window, mirror it, then
 * normalize each pixel), for the bit-for-bit tests of the kernels and of the pipeline. It
 * shares no code with pipeline/augment.ts.
 *
 * @module
 */

/** One batch worth of inputs for {@linkcode referenceAugment}. */
export interface ReferenceInput {
  src: Uint8Array;
  /** n x 3 (dy, dx, flip) or null (centre window, no flip). */
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
  for (let i = 0; i < n; i++) {
    const dy = params ? params[i * 3] : pad;
    const dx = params ? params[i * 3 + 1] : pad;
    const flip = params ? params[i * 3 + 2] !== 0 : false;
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
          // 3. flip the crop.
          const v = flip ? cropped(y, w - 1 - x) : cropped(y, x);
          // 4. normalize: fp32 multiply, fp32 add, then the cast.
          const r = f32(f32(v * scale) + bias);
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
