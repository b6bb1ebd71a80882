/**
 * An independent TypeScript reference of the fused image transform, written the long way
 * (torchvision's order of operations: pad the image, take the crop window, mirror it left-right
 * then top-bottom, ColorJitter's contrast toward the window's mean grey, brightness,
 * saturation and hue in that order, normalize each pixel, then cut a square out of the
 * normalized image), for the bit-for-bit tests of the kernels and of the pipeline.
 * It shares no code with augment/host.ts or augment/record.ts: it reads the record words as
 * kernels/pinstream.h documents them.
 *
 * @module
 */

/** int32 words of one sample's record (PS_IMAGE_PARAMS). */
export const RECORD = 11;
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
    out[RECORD * i + 7] = out[RECORD * i + 8] = out[RECORD * i + 9] = ONE_BITS;
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
  const { src, params, n, c, h, w, pad, layout, mean: mean_, std, dtype } = input;
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
    const saturation = asF32(word(i, 9, ONE_BITS)), hue = asF32(word(i, 10, 0));
    // The cutout square: centre pixel from the clamped 16-bit fractions, side `size`, clipped.
    const size = word(i, 6, 0);
    const centre = (frac: number, extent: number) =>
      Math.floor((Math.min(65535, Math.max(0, frac)) * extent) / 65536);
    const cy = centre(word(i, 4, 0), h), cx = centre(word(i, 5, 0), w);
    const inCut = (y: number, x: number) =>
      size > 0 && y >= cy - Math.floor(size / 2) && y < cy - Math.floor(size / 2) + size &&
      x >= cx - Math.floor(size / 2) && x < cx - Math.floor(size / 2) + size;
    // 1. pad: a (h + 2 pad) x (w + 2 pad) image, zeros around it.
    const ph = h + 2 * pad, pw = w + 2 * pad;
    const padded = (ch: number, y: number, x: number): number => {
      const yy = y - pad, xx = x - pad;
      if (yy < 0 || yy >= h || xx < 0 || xx >= w) return 0;
      return layout === "nchw"
        ? src[i * c * h * w + ch * h * w + yy * w + xx]
        : src[i * c * h * w + yy * w * c + xx * c + ch];
    };
    // 2. crop an h x w window at (dy, dx) (outside the padded image also reads 0), and
    // 3. flip the crop: left-right, then top-bottom.
    const view = (ch: number, y: number, x: number): number => {
      const py = (vflip ? h - 1 - y : y) + dy, px = (flip ? w - 1 - x : x) + dx;
      if (py < 0 || py >= ph || px < 0 || px >= pw) return 0;
      return padded(ch, py, px);
    };
    // 4. ColorJitter, each step clamped to [0, 255] and skipped when it is the identity.
    // Contrast's mean grey of the window: integer weights over 10000 (3 channels) or the
    // plain mean, one division of exact sums, rounded to fp32.
    let mean = 0;
    if (contrast !== 1) {
      let sum = 0;
      for (let y = 0; y < h; y++) {
        for (let x = 0; x < w; x++) {
          if (c === 3) {
            sum += 2989 * view(0, y, x) + 5870 * view(1, y, x) + 1140 * view(2, y, x);
          } else {
            for (let ch = 0; ch < c; ch++) sum += view(ch, y, x);
          }
        }
      }
      mean = f32(sum / (h * w * (c === 3 ? 10000 : c)));
    }
    const mixing = c === 3 && (saturation !== 1 || f32(hue * 6) !== 0);
    const jitter = brightness !== 1 || contrast !== 1 || mixing;
    const pixel = (y: number, x: number): number[] => {
      let v = Array.from({ length: c }, (_, ch) => view(ch, y, x));
      if (!jitter) return v;
      v = v.map((b) => clamp(f32(f32(contrast * b) + f32(f32(1 - contrast) * mean))));
      v = v.map((a) => clamp(f32(a * brightness)));
      if (!mixing) return v;
      let [r, g, b] = v;
      if (saturation !== 1) {
        const grey = f32(
          f32(f32(f32(0.2989) * r) + f32(f32(0.587) * g)) + f32(f32(0.114) * b),
        );
        const part = f32(grey * f32(1 - saturation));
        [r, g, b] = [r, g, b].map((x) => clamp(f32(f32(x * saturation) + part)));
      }
      const shift = f32(hue * 6);
      if (shift !== 0) {
        const top = r >= g && r >= b ? r : g >= b ? g : b;
        // The largest of r, g, b, ties to the first: the order the header names.
        const first = !(g > r) && !(b > r) ? 0 : !(b > g) ? 1 : 2;
        const low = r <= g && r <= b ? r : g <= b ? g : b;
        const span = f32(top - low);
        if (span > 0) {
          let sextant = first === 0
            ? f32(f32(g - b) / span)
            : first === 1
            ? f32(2 + f32(f32(b - r) / span))
            : f32(4 + f32(f32(r - g) / span));
          sextant = f32(sextant + shift);
          if (sextant < 0) sextant = f32(sextant + 6);
          if (sextant >= 6) sextant = f32(sextant - 6);
          // The first bound of 1..5 the hue lies below, else 5 (NaN too).
          const below = [1, 2, 3, 4, 5].findIndex((e) => sextant < e);
          const k = below < 0 ? 5 : below;
          const d = f32(span * f32(sextant - k));
          const q = clamp(f32(top - d)), t = clamp(f32(low + d));
          [r, g, b] = [
            [top, t, low],
            [q, top, low],
            [low, top, t],
            [low, q, top],
            [t, low, top],
            [top, low, q],
          ][k];
        }
      }
      return [r, g, b];
    };
    const planes: number[][] = Array.from({ length: c }, () => []);
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) {
        const t = pixel(y, x);
        for (let ch = 0; ch < c; ch++) {
          // The host-side constants, as C computes them in fp32.
          const sd = f32(std[ch]);
          const scale = f32(1 / f32(255 * sd));
          const bias = f32(-f32(f32(mean_[ch]) / sd));
          // 5. normalize: fp32 multiply, fp32 add; 6. cutout; then the cast.
          const r = inCut(y, x) ? 0 : f32(f32(t[ch] * scale) + bias);
          planes[ch].push(dtype === "f16" ? Math.f16round(r) : r);
        }
      }
    }
    for (const p of planes) for (const v of p) out.push(v);
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
