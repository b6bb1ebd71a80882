// A generated stand-in for CIFAR-10 (used by examples/cifar.ts when the real data is not
// there): ten classes of procedurally drawn objects, 32x32x3 uint8 in CIFAR's layout
// (channel-major: all red, then green, then blue), deterministic from a seed.
//
// It is built to be a learning problem, not a smoke test: colour, position, scale, rotation,
// background and noise are drawn independently of the class, so only the shape (and the
// texture inside it) tells the classes apart, and several classes differ in a detail that
// the network has to learn to see (a ring and a bullseye differ by a centre dot, a disc and a
// crescent by a bite, a square and a checkered square by their inside). A nearest-class-mean
// classifier on the pixels is at chance (about 10%).
//
// The nuisance ranges (contrast, noise, clutter, scale) are tuned so that the example's CNN
// learns it gradually in examples/cifar.ts's one-minute CPU run (4,000 samples, 4 epochs,
// batch 64): measured 13%, 28%, 47%, 66% test accuracy after epochs 1-4 at lr 0.01 without
// the logit scale, and 13%, 48%, 70%, 82% at lr 0.1 with it (docs/recipe.md). With twice the
// contrast range, noise up to 24 and three strokes it barely left chance in that budget.
//
// Not part of the public API (leading underscore).

import { Xoshiro128 } from "../nn/mod.ts";

/** Class names of the generated set, by label. */
export const SHAPE_CLASSES: readonly string[] = [
  "disc",
  "ring",
  "square",
  "triangle",
  "cross",
  "crescent",
  "striped disc",
  "checkered square",
  "bullseye",
  "pair of dots",
];

/** A generated set: images u8 [n, 3, 32, 32] and labels i32 [n], in shared memory. */
export interface ShapesData {
  images: Uint8Array;
  labels: Int32Array;
}

const SIDE = 32;
const PLANE = SIDE * SIDE;

/**
 * Signed distance (in object units, radius 1) from (u, v) to the outline of class `c`'s
 * shape; negative inside. `pattern` is the second-colour test for the textured classes.
 */
function shapeDistance(c: number, u: number, v: number): number {
  const r = Math.hypot(u, v);
  switch (c) {
    case 0: // disc
    case 6: // striped disc (texture added by the caller)
    case 8: // bullseye (rings added by the caller)
      return r - 1;
    case 1: // ring: radii 0.5 .. 1
      return Math.abs(r - 0.75) - 0.25;
    case 2: // square
    case 7: // checkered square
      return Math.max(Math.abs(u), Math.abs(v)) - 0.8;
    case 3: { // equilateral triangle, circumradius 1: the farthest of its three edge lines
      const a = v;
      const b = -0.8660254 * u - 0.5 * v;
      const d = 0.8660254 * u - 0.5 * v;
      return Math.max(a, b, d) - 0.5;
    }
    case 4: { // cross: two bars
      const au = Math.abs(u), av = Math.abs(v);
      return Math.min(Math.max(au - 0.95, av - 0.3), Math.max(au - 0.3, av - 0.95));
    }
    case 5: // crescent: a disc with an offset disc taken out
      return Math.max(r - 1, 0.8 - Math.hypot(u - 0.5, v));
    case 9: // pair of dots
      return Math.min(Math.hypot(u - 0.55, v), Math.hypot(u + 0.55, v)) - 0.4;
  }
  throw new RangeError(`Cannot draw class ${c}: expected 0..9`);
}

/** A random colour at `contrast` (RGB distance) from `base`, kept in 0..255. */
function colourAway(rng: Xoshiro128, base: number[], contrast: number): number[] {
  const d = [rng.random() - 0.5, rng.random() - 0.5, rng.random() - 0.5];
  const norm = Math.hypot(d[0], d[1], d[2]) || 1;
  const out = base.map((b, k) => b + contrast * d[k] / norm);
  // Clamping would eat the contrast near the ends of the range: reflect instead.
  return out.map((x) => x < 0 ? -x : x > 255 ? 510 - x : x);
}

/** Draws one sample of class `label` into `out` (3072 bytes), using `px` as scratch. */
function drawSample(
  rng: Xoshiro128,
  label: number,
  out: Uint8ClampedArray,
  px: Float32Array,
): void {
  // Background: a linear gradient between two random colours, plus a low-frequency wave.
  const bgA = [255 * rng.random(), 255 * rng.random(), 255 * rng.random()];
  const bgB = colourAway(rng, bgA, 5 + 25 * rng.random());
  const ga = 2 * Math.PI * rng.random();
  const gx = Math.cos(ga) / SIDE, gy = Math.sin(ga) / SIDE;
  const wave = 6 * rng.random(), wf = 0.1 + 0.3 * rng.random(), wp = 6.3 * rng.random();
  const bgMean = [0, 1, 2].map((k) => (bgA[k] + bgB[k]) / 2);
  for (let y = 0; y < SIDE; y++) {
    for (let x = 0; x < SIDE; x++) {
      const t = Math.min(1, Math.max(0, 0.5 + (x - 16) * gx + (y - 16) * gy));
      const w = wave * Math.sin(wf * (x * gy - y * gx) * SIDE + wp);
      for (let k = 0; k < 3; k++) px[k * PLANE + y * SIDE + x] = bgA[k] + t * (bgB[k] - bgA[k]) + w;
    }
  }
  // Clutter: at most one thin straight stroke in random colours, unrelated to the class.
  const strokes = Math.floor(1.5 * rng.random());
  for (let s = 0; s < strokes; s++) {
    const col = colourAway(rng, bgMean, 30 + 50 * rng.random());
    const x0 = SIDE * rng.random(), y0 = SIDE * rng.random();
    const a = Math.PI * rng.random(), len = 6 + 14 * rng.random();
    const dx = Math.cos(a), dy = Math.sin(a);
    for (let y = 0; y < SIDE; y++) {
      for (let x = 0; x < SIDE; x++) {
        const along = (x - x0) * dx + (y - y0) * dy;
        if (along < 0 || along > len) continue;
        const cov = Math.max(0, 1 - Math.abs((x - x0) * dy - (y - y0) * dx));
        if (cov === 0) continue;
        for (let k = 0; k < 3; k++) {
          const j = k * PLANE + y * SIDE + x;
          px[j] += cov * (col[k] - px[j]);
        }
      }
    }
  }
  // The object: random centre, radius 8.5..12 px, rotation, colours and contrast.
  const radius = 8.5 + 3.5 * rng.random();
  const cx = 16 + (16 - radius) * (2 * rng.random() - 1) * 0.8;
  const cy = 16 + (16 - radius) * (2 * rng.random() - 1) * 0.8;
  const rot = 2 * Math.PI * rng.random();
  const cr = Math.cos(rot), sr = Math.sin(rot);
  const fg = colourAway(rng, bgMean, 125 + 55 * rng.random());
  // Second colour of the textured classes; the bullseye's gap shows the background.
  const fg2 = colourAway(rng, fg, 60 + 90 * rng.random());
  // Stripes and checks: 3..5 px per band, never finer than the pixels can show.
  const band = (3 + 2 * rng.random()) / radius;
  const inv = 1 / radius;
  for (let y = 0; y < SIDE; y++) {
    for (let x = 0; x < SIDE; x++) {
      const ox = (x + 0.5 - cx) * inv, oy = (y + 0.5 - cy) * inv;
      const u = ox * cr + oy * sr, v = -ox * sr + oy * cr;
      const d = shapeDistance(label, u, v);
      // Anti-aliased edge: coverage from the distance in pixels.
      const cov = Math.min(1, Math.max(0, 0.5 - d * radius));
      if (cov === 0) continue;
      let second = false;
      if (label === 6) second = Math.floor(u / band) % 2 === 0;
      else if (label === 7) second = (Math.floor(u / band) + Math.floor(v / band)) % 2 === 0;
      const r = Math.hypot(u, v);
      const gap = label === 8 && r > 0.4 && r < 0.7;
      for (let k = 0; k < 3; k++) {
        const j = k * PLANE + y * SIDE + x;
        const col = gap ? px[j] : second ? fg2[k] : fg[k];
        px[j] += cov * (col - px[j]);
      }
    }
  }
  // Sensor noise, 3..9 levels, per pixel and channel (the store rounds and clamps).
  const sigma = 3 + 6 * rng.random();
  for (let j = 0; j < 3 * PLANE; j++) {
    out[j] = px[j] + sigma * (rng.random() + rng.random() + rng.random() - 1.5) * 2;
  }
}

/**
 * Generates `n` samples of the shapes set, deterministically from `seed`. Labels cycle
 * 0..9 (balanced, also in any prefix of the set); the loader shuffles.
 *
 * @param n Samples.
 * @param seed Seed: the same (n, seed) gives the same bytes.
 * @returns Images u8 [n, 3, 32, 32] (CIFAR's layout) and labels i32 [n], in shared memory.
 * @throws {RangeError} For a negative or fractional n.
 * @example
 * ```ts
 * import { generateShapes } from "./_shapes.ts";
 * import assert from "node:assert";
 * const a = generateShapes(20, 1), b = generateShapes(20, 1);
 * assert.deepStrictEqual(a.images, b.images);
 * assert.deepStrictEqual([...a.labels.subarray(0, 3)], [0, 1, 2]);
 * ```
 */
export function generateShapes(n: number, seed: number): ShapesData {
  if (!Number.isInteger(n) || n < 0) {
    throw new RangeError(`Cannot generate ${n} samples: expected a whole number >= 0`);
  }
  const images = new Uint8Array(new SharedArrayBuffer(n * 3 * PLANE));
  const labels = new Int32Array(new SharedArrayBuffer(n * 4));
  // A Uint8Array store wraps modulo 256 (300 becomes 44); the clamped view rounds and clamps.
  const clamped = new Uint8ClampedArray(images.buffer);
  const px = new Float32Array(3 * PLANE);
  const rng = new Xoshiro128(seed);
  for (let i = 0; i < n; i++) {
    labels[i] = i % 10;
    drawSample(rng, i % 10, clamped.subarray(i * 3 * PLANE, (i + 1) * 3 * PLANE), px);
  }
  return { images, labels };
}
