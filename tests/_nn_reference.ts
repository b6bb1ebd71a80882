/**
 * What the nn kernel tests share: a seeded generator per test (the run's seed is printed in
 * every failure), random inputs, a tolerance check that names the worst element, and float64
 * references of the GEMM-based kernels. Used by tests/nn_kernels_test.ts (fp16) and
 * tests/nn_fp32_test.ts (the fp32 path); the layer tests take its small seeded CNN.
 *
 * @module
 */

import assert from "node:assert";
import { rng } from "./_image_reference.ts";
import {
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  ReLU,
  Sequential,
  Xoshiro128,
} from "../nn/mod.ts";

export const SEED = crypto.getRandomValues(new Uint32Array(1))[0];

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

/** conv2d's forward, data gradient and weight gradient in float64 (cross-correlation, zero padding). */
export function refConv(
  g: Geo,
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  dy: ArrayLike<number>,
): { y: Float64Array; dx: Float64Array; dw: Float64Array } {
  const y = new Float64Array(dy.length), dx = new Float64Array(x.length);
  const dw = new Float64Array(w.length);
  eachTap(g, (xi, yi, wi) => {
    y[yi] += x[xi] * w[wi];
    dx[xi] += dy[yi] * w[wi];
    dw[wi] += x[xi] * dy[yi];
  });
  return { y, dx, dw };
}

/** Batch norm over [n, c, hw] in float64: what the train, eval and backward kernels write. */
export interface BatchNormReference {
  /** Train-mode output (batch statistics, biased variance). */
  y: Float64Array;
  /** Eval-mode output (running statistics rm0, rv0). */
  ye: Float64Array;
  /** Input gradient of the train-mode forward. */
  dx: Float64Array;
  mean: Float64Array;
  invstd: Float64Array;
  /** Running statistics after the train-mode update (unbiased variance). */
  rm: Float64Array;
  rv: Float64Array;
  dgamma: Float64Array;
  dbeta: Float64Array;
}

/** The float64 batch norm of x (and its backward for dy); see {@linkcode BatchNormReference}. */
export function refBatchNorm(
  x: ArrayLike<number>,
  dy: ArrayLike<number>,
  p: {
    n: number;
    c: number;
    hw: number;
    gamma: ArrayLike<number>;
    beta: ArrayLike<number>;
    rm0: ArrayLike<number>;
    rv0: ArrayLike<number>;
    eps: number;
    momentum: number;
  },
): BatchNormReference {
  const { n, c, hw, gamma, beta, rm0, rv0, eps, momentum } = p;
  const cnt = n * hw;
  const r: BatchNormReference = {
    y: new Float64Array(x.length),
    ye: new Float64Array(x.length),
    dx: new Float64Array(x.length),
    mean: new Float64Array(c),
    invstd: new Float64Array(c),
    rm: new Float64Array(c),
    rv: new Float64Array(c),
    dgamma: new Float64Array(c),
    dbeta: new Float64Array(c),
  };
  const at = (i: number, ch: number, j: number) => (i * c + ch) * hw + j;
  for (let ch = 0; ch < c; ch++) {
    let s = 0, ss = 0;
    for (let i = 0; i < n; i++) for (let j = 0; j < hw; j++) s += x[at(i, ch, j)];
    const mu = s / cnt;
    for (let i = 0; i < n; i++) for (let j = 0; j < hw; j++) ss += (x[at(i, ch, j)] - mu) ** 2;
    const is = 1 / Math.sqrt(ss / cnt + eps);
    r.mean[ch] = mu;
    r.invstd[ch] = is;
    r.rm[ch] = (1 - momentum) * rm0[ch] + momentum * mu;
    r.rv[ch] = (1 - momentum) * rv0[ch] + momentum * ss / (cnt - 1);
    let sdy = 0, sdyx = 0;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < hw; j++) {
        const v = x[at(i, ch, j)], xh = (v - mu) * is;
        r.y[at(i, ch, j)] = gamma[ch] * xh + beta[ch];
        r.ye[at(i, ch, j)] = gamma[ch] * (v - rm0[ch]) / Math.sqrt(rv0[ch] + eps) + beta[ch];
        sdy += dy[at(i, ch, j)];
        sdyx += dy[at(i, ch, j)] * xh;
      }
    }
    r.dgamma[ch] = sdyx;
    r.dbeta[ch] = sdy;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < hw; j++) {
        const xh = (x[at(i, ch, j)] - mu) * is;
        r.dx[at(i, ch, j)] = gamma[ch] * is * (dy[at(i, ch, j)] - sdy / cnt - xh * sdyx / cnt);
      }
    }
  }
  return r;
}

/**
 * Max pooling without padding over n*c planes of h x w (kernel k, stride s) in float64: the
 * outputs, the chosen positions (first maximum) and the scatter-added input gradient of dy.
 */
export function refMaxPool(
  x: ArrayLike<number>,
  dy: ArrayLike<number>,
  g: { n: number; c: number; h: number; w: number; k: number; s: number },
): { y: Float64Array; idx: Int32Array; dx: Float64Array; oh: number; ow: number } {
  const { n, c, h, w, k, s } = g;
  const oh = Math.floor((h - k) / s) + 1, ow = Math.floor((w - k) / s) + 1;
  const y = new Float64Array(n * c * oh * ow), idx = new Int32Array(y.length);
  const dx = new Float64Array(x.length);
  for (let pl = 0; pl < n * c; pl++) {
    for (let oy = 0; oy < oh; oy++) {
      for (let ox = 0; ox < ow; ox++) {
        let best = oy * s * w + ox * s, m = x[pl * h * w + best];
        for (let ky = 0; ky < k; ky++) {
          for (let kx = 0; kx < k; kx++) {
            const at = (oy * s + ky) * w + ox * s + kx;
            if (x[pl * h * w + at] > m) [m, best] = [x[pl * h * w + at], at];
          }
        }
        const o = (pl * oh + oy) * ow + ox;
        y[o] = m;
        idx[o] = best;
        dx[pl * h * w + best] += dy[o];
      }
    }
  }
  return { y, idx, dx, oh, ow };
}

/**
 * Softmax cross-entropy of logits [n, k] in float64: the summed loss, the count of rows whose
 * first maximum is the label, and the gradient of `scale` times the mean loss.
 */
export function refCrossEntropy(
  logits: ArrayLike<number>,
  labels: ArrayLike<number>,
  n: number,
  k: number,
  scale: number,
): { loss: number; hits: number; dlogits: Float64Array } {
  let loss = 0, hits = 0;
  const d = new Float64Array(n * k);
  for (let i = 0; i < n; i++) {
    const row = Array.from({ length: k }, (_, j) => logits[i * k + j]);
    const m = Math.max(...row);
    const s = row.reduce((a, v) => a + Math.exp(v - m), 0);
    loss += m + Math.log(s) - row[labels[i]];
    if (row.indexOf(m) === labels[i]) hits++;
    for (let j = 0; j < k; j++) {
      d[i * k + j] = scale * (Math.exp(row[j] - m) / s - (j === labels[i] ? 1 : 0)) / n;
    }
  }
  return { loss, hits, dlogits: d };
}

/** A small CNN on 1x8x8 inputs (conv, batch norm, ReLU, pool, linear to 3 classes), seeded. */
export function smallCnn(seed: number): Sequential {
  const rng = new Xoshiro128(seed);
  return new Sequential([
    new Conv2d(1, 4, { kernelSize: 3, padding: 1, rng }),
    new BatchNorm2d(4),
    new ReLU(),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(4 * 4 * 4, 3, { rng }),
  ]);
}
