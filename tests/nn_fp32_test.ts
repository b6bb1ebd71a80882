/**
 * The fp32 path of every activation kernel (ops/ with f32 tensors) against float64
 * references, on each backend (tests/_backends.ts), with tolerances that an fp16 computation
 * could not meet: inputs are arbitrary fp32 values (not fp16-exact), and outputs must be
 * within fp32 rounding of the reference (rtol 1e-5 plus an atol that grows with the length of
 * the sum, ~1e-6 per term), where fp16 would be off by ~5e-4 relative. Then the error paths:
 * an op refuses to mix f16 and f32.
 */

import assert from "node:assert";
import { type Device, Tensor } from "../mod.ts";
import * as ops from "../ops/mod.ts";
import { testEachBackend } from "./_backends.ts";
import {
  assertClose,
  gen,
  type Geo,
  outSize,
  randF,
  refBatchNorm,
  refConv,
  refCrossEntropy,
  refMatmul,
  refMaxPool,
  SEED,
} from "./_nn_reference.ts";

const RTOL = 1e-5;
/** The absolute tolerance of an fp32 sum of `terms` products of values of magnitude <= ~3. */
function atol(terms: number): number {
  return 2e-6 * Math.max(1, terms);
}

async function host(t: Tensor): Promise<number[]> {
  return [...(await t.toHost())];
}

function f32(dev: Device, data: Float32Array, shape: number[]): Tensor {
  return Tensor.fromHost(dev, data, shape);
}

testEachBackend(
  "fp32 matmul matches float64 for every transpose, beyond fp16 accuracy",
  async (dev) => {
    const r = gen("fp32-matmul");
    for (
      const [m, n, k] of [[1, 1, 1], [3, 5, 7], [37, 45, 29], [130, 70, 513], [20, 600, 17]]
    ) {
      for (const transA of [false, true]) {
        for (const transB of [false, true]) {
          const a = randF(r, m * k), b = randF(r, k * n);
          const ref = refMatmul(a, b, m, n, k, transA, transB);
          using ta = f32(dev, a, transA ? [k, m] : [m, k]);
          using tb = f32(dev, b, transB ? [n, k] : [k, n]);
          using c = Tensor.empty(dev, [m, n], "f32");
          ops.matmul(ta, tb, { out: c, transA, transB });
          const what = `fp32 matmul ${m}x${n}x${k} transA=${transA} transB=${transB}`;
          assertClose(await host(c), ref, atol(k), RTOL, what);
          // accumulate
          ops.matmul(ta, tb, { out: c, transA, transB, accumulate: true });
          assertClose(await host(c), ref.map((v) => 2 * v), 2 * atol(k), RTOL, `${what} acc`);
        }
      }
    }
  },
);

const GEOS: Geo[] = [
  { n: 2, c: 3, h: 9, w: 7, co: 5, kh: 3, kw: 3, s: 1, p: 1 },
  { n: 3, c: 5, h: 10, w: 11, co: 7, kh: 3, kw: 3, s: 2, p: 1 },
  { n: 2, c: 6, h: 5, w: 6, co: 33, kh: 1, kw: 1, s: 1, p: 0 },
  { n: 2, c: 3, h: 7, w: 8, co: 2, kh: 5, kw: 3, s: 1, p: 2 },
  { n: 2, c: 1, h: 28, w: 28, co: 32, kh: 3, kw: 3, s: 1, p: 1 }, // the small CNN's layers
  { n: 2, c: 32, h: 14, w: 14, co: 64, kh: 3, kw: 3, s: 1, p: 1 },
];

testEachBackend(
  "fp32 conv2d forward, backward-data and backward-weight match float64",
  async (dev) => {
    const r = gen("fp32-conv");
    for (const g of GEOS) {
      const [oh, ow] = outSize(g);
      const xs = [g.n, g.c, g.h, g.w], ws = [g.co, g.c, g.kh, g.kw], ys = [g.n, g.co, oh, ow];
      const x = randF(r, g.n * g.c * g.h * g.w), w = randF(r, g.co * g.c * g.kh * g.kw);
      const dy = randF(r, g.n * g.co * oh * ow);
      const { y, dx, dw } = refConv(g, x, w, dy);
      using tx = f32(dev, x, xs);
      using tw = f32(dev, w, ws);
      using tdy = f32(dev, dy, ys);
      using ty = Tensor.empty(dev, ys, "f32");
      using tdx = Tensor.empty(dev, xs, "f32");
      using tdw = Tensor.empty(dev, ws, "f32");
      const opts = { stride: g.s, padding: g.p };
      ops.conv2dForward(tx, ty, { ...opts, weight: tw });
      ops.conv2dBackwardData(tdy, tdx, { ...opts, weight: tw });
      ops.conv2dBackwardWeight(tdy, tdw, { ...opts, x: tx });
      const what = `fp32 conv x[${xs}] w[${ws}] s${g.s} p${g.p}`;
      const K = g.c * g.kh * g.kw;
      assertClose(await host(ty), y, atol(K), RTOL, `${what} forward`);
      assertClose(await host(tdx), dx, atol(g.co * g.kh * g.kw), RTOL, `${what} backward data`);
      assertClose(await host(tdw), dw, atol(g.n * oh * ow), RTOL, `${what} backward weight`);
    }
  },
);

testEachBackend("fp32 maxPool2d keeps every value exactly and routes the gradient", async (dev) => {
  const r = gen("fp32-pool");
  for (const [n, c, h, w, k, s] of [[2, 3, 8, 8, 2, 2], [2, 3, 7, 9, 2, 2], [1, 2, 8, 8, 3, 2]]) {
    const oh = Math.floor((h - k) / s) + 1, ow = Math.floor((w - k) / s) + 1;
    const x = randF(r, n * c * h * w), dy = randF(r, n * c * oh * ow);
    const { y, dx } = refMaxPool(x, dy, { n, c, h, w, k, s });
    using tx = f32(dev, x, [n, c, h, w]);
    using ty = Tensor.empty(dev, [n, c, oh, ow], "f32");
    using ti = Tensor.empty(dev, [n, c, oh, ow], "i32");
    using tdy = f32(dev, dy, [n, c, oh, ow]);
    using tdx = Tensor.empty(dev, [n, c, h, w], "f32");
    ops.maxPool2dForward(tx, ty, { kernel: k, stride: s, indices: ti });
    ops.maxPool2dBackward(tdy, tdx, { indices: ti });
    const what = `fp32 maxPool2d [${n},${c},${h},${w}] k${k} s${s}`;
    assert.deepStrictEqual(await host(ty), [...y], `${what} forward (seed ${SEED})`);
    assertClose(await host(tdx), dx, 1e-7, RTOL, `${what} backward`);
  }
});

testEachBackend("fp32 batchNorm train, eval and backward match float64", async (dev) => {
  const r = gen("fp32-bn");
  for (const [n, c, hw] of [[4, 3, 25], [7, 5, 1], [3, 2, 1137]]) {
    const x = randF(r, n * c * hw, -2, 3), dy = randF(r, n * c * hw);
    const gamma = randF(r, c, 0.5, 1.5), beta = randF(r, c);
    const rm0 = randF(r, c), rv0 = randF(r, c, 0.5, 2);
    const eps = 1e-5, cnt = n * hw;
    const p = { n, c, hw, gamma, beta, rm0, rv0, eps, momentum: 0.1 };
    const { y, ye, dx } = refBatchNorm(x, dy, p);
    const shape = [n, c, hw];
    using tx = f32(dev, x, shape);
    using tdy = f32(dev, dy, shape);
    using tg = Tensor.fromHost(dev, gamma);
    using tb = Tensor.fromHost(dev, beta);
    using trm = Tensor.fromHost(dev, rm0);
    using trv = Tensor.fromHost(dev, rv0);
    using ty = Tensor.empty(dev, shape, "f32");
    using tye = Tensor.empty(dev, shape, "f32");
    using tdx = Tensor.empty(dev, shape, "f32");
    using tm = Tensor.empty(dev, [c], "f32");
    using ts = Tensor.empty(dev, [c], "f32");
    using tdg = Tensor.empty(dev, [c], "f32");
    using tdb = Tensor.empty(dev, [c], "f32");
    ops.batchNormForwardEval(tx, tye, { gamma: tg, beta: tb, eps, runMean: trm, runVar: trv });
    ops.batchNormForwardTrain(tx, ty, { gamma: tg, beta: tb, eps, saveMean: tm, saveInvStd: ts });
    ops.batchNormBackward(tdy, tdx, {
      x: tx,
      gamma: tg,
      saveMean: tm,
      saveInvStd: ts,
      dgamma: tdg,
      dbeta: tdb,
    });
    const what = `fp32 batchNorm [${shape}]`;
    // The statistics are fp32 sums of cnt values (the mean's error reaches y through invstd).
    assertClose(await host(ty), y, 2e-6 * Math.sqrt(cnt), 1e-5, `${what} train y`);
    assertClose(await host(tye), ye, 2e-6, 1e-5, `${what} eval y`);
    assertClose(await host(tdx), dx, 4e-6 * Math.sqrt(cnt), 1e-4, `${what} dx`);
  }
});

testEachBackend("fp32 biasAdd and biasGrad work per channel and per feature", async (dev) => {
  const r = gen("fp32-bias");
  for (const shape of [[3, 5, 4, 7], [9, 13], [2, 33, 17]]) {
    const [n, c] = shape;
    const hw = shape.slice(2).reduce((a, b) => a * b, 1);
    const y = randF(r, n * c * hw), bias = randF(r, c);
    const ref = new Float64Array(y.length), g = new Float64Array(c);
    for (let i = 0; i < y.length; i++) {
      const ch = Math.floor(i / hw) % c;
      ref[i] = Math.fround(y[i] + bias[ch]); // one fp32 addition: exact to the bit
      g[ch] += y[i];
    }
    using ty = f32(dev, y, shape);
    using tb = Tensor.fromHost(dev, bias);
    using tg = Tensor.empty(dev, [c], "f32");
    ops.biasGrad(ty, tg);
    ops.biasAdd(ty, tb);
    assert.deepStrictEqual(await host(ty), [...ref], `fp32 biasAdd [${shape}] (seed ${SEED})`);
    assertClose(await host(tg), g, atol(n * hw), RTOL, `fp32 biasGrad [${shape}]`);
  }
});

testEachBackend(
  "fp32 relu decides on the sign bit: -0 and negatives to +0, NaN kept",
  async (dev) => {
    const r = gen("fp32-relu");
    for (const n of [1, 17, 70001]) {
      const x = randF(r, n), dy = randF(r, n);
      const bits = new Uint32Array(x.buffer);
      const special = [0x80000000, 0x7fc00000, 0xff800000, 0x7f800000, 0x00000001, 0x80000001];
      for (let i = 0; i < Math.min(n, special.length); i++) bits[i] = special[i];
      using tx = f32(dev, x, [n]);
      using ty = Tensor.empty(dev, [n], "f32");
      using tdy = f32(dev, dy, [n]);
      using tdx = Tensor.empty(dev, [n], "f32");
      ops.reluForward(tx, ty);
      ops.reluBackward(tdy, tdx, { y: ty });
      const yb = new Uint32Array((await ty.toHost() as Float32Array).buffer);
      const dxv = await host(tdx);
      for (let i = 0; i < n; i++) {
        const negative = (bits[i] & 0x80000000) !== 0 && (bits[i] & 0x7fffffff) <= 0x7f800000;
        assert.strictEqual(yb[i], negative ? 0 : bits[i], `relu(0x${bits[i].toString(16)})`);
        const passes = !negative && bits[i] !== 0 && (bits[i] & 0x7fffffff) <= 0x7f800000;
        assert.ok(Object.is(dxv[i], passes ? dy[i] : 0), `relu'(0x${bits[i].toString(16)})`);
      }
    }
  },
);

testEachBackend("fp32 crossEntropy writes the loss, hits and an fp32 gradient", async (dev) => {
  const r = gen("fp32-ce");
  for (const [n, k, scale] of [[5, 10, 1], [33, 7, 1024], [2, 40, 8]]) {
    const logits = randF(r, n * k, -4, 4);
    const labels = Int32Array.from({ length: n }, () => Math.floor(r() * k));
    const { loss, hits, dlogits: d } = refCrossEntropy(logits, labels, n, k, scale);
    using tl = f32(dev, logits, [n, k]);
    using tlab = Tensor.fromHost(dev, labels);
    using td = Tensor.empty(dev, [n, k], "f32");
    using tloss = Tensor.fromHost(dev, new Float32Array([0]));
    using thits = Tensor.fromHost(dev, new Int32Array([0]));
    ops.crossEntropyForwardBackward(tl, tlab, {
      dlogits: td,
      lossSum: tloss,
      correct: thits,
      scale,
    });
    const what = `fp32 crossEntropy [${n},${k}] scale ${scale}`;
    assertClose(await host(tloss), [loss], 1e-5 * n, 1e-5, `${what} loss`);
    assert.deepStrictEqual(await host(thits), [hits], `${what} correct (seed ${SEED})`);
    assertClose(await host(td), d, 1e-6 * Math.max(1, scale / n), RTOL, `${what} dlogits`);
  }
});

testEachBackend("an op refuses to mix f16 and f32 activations, naming both", (dev) => {
  using x16 = Tensor.empty(dev, [1, 1, 4, 4], "f16");
  using x32 = Tensor.empty(dev, [1, 1, 4, 4], "f32");
  using w32 = Tensor.empty(dev, [1, 1, 3, 3], "f32");
  using y32 = Tensor.empty(dev, [1, 1, 4, 4], "f32");
  assert.throws(
    () => ops.conv2dForward(x16, y32, { weight: w32, padding: 1 }),
    (e: Error) =>
      e instanceof TypeError && /weight is f32 but x is f16/.test(e.message) &&
      /conv2dForward/.test(e.message),
  );
  assert.throws(() => ops.reluForward(x32, x16), /y is f16 but x is f32/);
  using a = Tensor.empty(dev, [2, 2], "f32");
  using b = Tensor.empty(dev, [2, 2], "f16");
  using c = Tensor.empty(dev, [2, 2], "f32");
  assert.throws(() => ops.matmul(a, b, { out: c }), /b is f16 but a is f32/);
  using i32 = Tensor.empty(dev, [2, 2], "i32");
  assert.throws(() => ops.matmul(i32, b, { out: c }), /a must be f16, bf16 or f32, got i32/);
});
