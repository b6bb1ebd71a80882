/**
 * What the nn kernel tests share: a seeded generator per test (the run's seed is printed in
 * every failure), random inputs, a tolerance check that names the worst element, and float64
 * references of the GEMM-based kernels. Used by tests/nn_kernels_test.ts (fp16) and
 * tests/nn_fp32_test.ts (the fp32 path).
 *
 * @module
 */

import assert from "node:assert";

export const SEED = crypto.getRandomValues(new Uint32Array(1))[0];

export function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A random generator per test, derived from the run's seed and the test's name. */
export function gen(name: string): () => number {
  let h = SEED;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x9e3779b1);
  return rng(h);
}

export function randH(r: () => number, n: number, lo = -1, hi = 1): Float16Array {
  const a = new Float16Array(n);
  for (let i = 0; i < n; i++) a[i] = lo + (hi - lo) * r();
  return a;
}

export function randF(r: () => number, n: number, lo = -1, hi = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = lo + (hi - lo) * r();
  return a;
}

export function assertClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  atol: number,
  rtol: number,
  what: string,
): void {
  assert.strictEqual(actual.length, expected.length, `${what}: length`);
  let worst = -1, worstExcess = 0;
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i], e = expected[i];
    if (Number.isNaN(e) && Number.isNaN(a)) continue;
    if (a === e) continue;
    const excess = Math.abs(a - e) - (atol + rtol * Math.abs(e));
    if (!(excess <= 0) && (worst < 0 || !(excess <= worstExcess))) {
      worst = i;
      worstExcess = excess;
    }
  }
  if (worst >= 0) {
    assert.fail(
      `${what} (seed ${SEED}): element ${worst} is ${actual[worst]}, expected ` +
        `${expected[worst]} (atol ${atol}, rtol ${rtol})`,
    );
  }
}

// ---- references (float64) ---------------------------------------------------------------

export function refMatmul(
  a: ArrayLike<number>,
  b: ArrayLike<number>,
  m: number,
  n: number,
  k: number,
  transA: boolean,
  transB: boolean,
): Float64Array {
  const c = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let p = 0; p < k; p++) {
        s += (transA ? a[p * m + i] : a[i * k + p]) * (transB ? b[j * k + p] : b[p * n + j]);
      }
      c[i * n + j] = s;
    }
  }
  return c;
}

export interface Geo {
  n: number;
  c: number;
  h: number;
  w: number;
  co: number;
  kh: number;
  kw: number;
  s: number;
  p: number;
}

export function outSize(g: Geo): [number, number] {
  return [
    Math.floor((g.h + 2 * g.p - g.kh) / g.s) + 1,
    Math.floor((g.w + 2 * g.p - g.kw) / g.s) + 1,
  ];
}

/** Calls f(n, o, c, oy, ox, ky, kx, xIndex, yIndex, wIndex) for every valid tap. */
export function eachTap(
  g: Geo,
  f: (xi: number, yi: number, wi: number) => void,
): void {
  const [oh, ow] = outSize(g);
  for (let n = 0; n < g.n; n++) {
    for (let o = 0; o < g.co; o++) {
      for (let oy = 0; oy < oh; oy++) {
        for (let ox = 0; ox < ow; ox++) {
          const yi = ((n * g.co + o) * oh + oy) * ow + ox;
          for (let c = 0; c < g.c; c++) {
            for (let ky = 0; ky < g.kh; ky++) {
              const iy = oy * g.s + ky - g.p;
              if (iy < 0 || iy >= g.h) continue;
              for (let kx = 0; kx < g.kw; kx++) {
                const ix = ox * g.s + kx - g.p;
                if (ix < 0 || ix >= g.w) continue;
                f(
                  ((n * g.c + c) * g.h + iy) * g.w + ix,
                  yi,
                  ((o * g.c + c) * g.kh + ky) * g.kw + kx,
                );
              }
            }
          }
        }
      }
    }
  }
}
