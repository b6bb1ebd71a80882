/**
 * bf16 mixed precision (PS_NN_BF16, precision "bf16"): the rounding rule (rules.h
 * ps_bf16_from_f32) bit for bit against a TypeScript twin on each backend, so the CPU and the
 * CUDA backend (a GPU or the emulator) write the same bits wherever an element is rounded once;
 * every nn kernel in bf16 against the float64 references of tests/nn_kernels_test.ts with
 * bf16's tolerances; the CPU and CUDA backends against each other in one process; and a bf16
 * model that trains without a GradScaler.
 *
 * Tolerances: a bf16 rounding is at most 2^-8 ≈ 3.9e-3 relative, so outputs rounded once get
 * rtol 8e-3 and atol 8e-3 (values near zero after cancellation).
 */

import assert from "node:assert";
import { Device, ProcessGroup, SyncBatchNorm, Tensor } from "../mod.ts";
import * as ops from "../ops/mod.ts";
import { add } from "../ops/combine.ts";
import { arange, full, rand, randn } from "../ops/fill.ts";
import { CrossEntropyLoss, GradScaler, SGD } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { CUDA, testEachBackend } from "./_backends.ts";
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
  smallCnn,
} from "./_nn_reference.ts";

const ATOL = 8e-3, RTOL = 8e-3;

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);

/** rules.h ps_bf16_from_f32 in TypeScript: fp32 -> bf16 bits, nearest even, NaN -> ±0x7fc0. */
function bf16Bits(x: number): number {
  f32[0] = x;
  const b = u32[0];
  if ((b & 0x7fffffff) > 0x7f800000) return ((b >>> 16) & 0x8000) | 0x7fc0;
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The fp32 value of bf16 bits. */
function bf16Value(h: number): number {
  u32[0] = h << 16;
  return f32[0];
}

/** x rounded to bf16, as an fp32 value. */
const roundBf16 = (x: number) => bf16Value(bf16Bits(x));

/** n random values in [lo, hi) that bf16 holds exactly. */
function randB(r: () => number, n: number, lo = -1, hi = 1): Float32Array {
  return randF(r, n, lo, hi).map(roundBf16);
}

/** A bf16 tensor holding `values` (each rounded by the device's cast, exact for randB). */
function bf16(dev: Device, values: Float32Array, shape?: number[]): Tensor {
  using src = Tensor.fromHost(dev, values, shape);
  const t = Tensor.empty(dev, [...src.shape], "bf16");
  ops.cast(src, t);
  return t;
}

/** A bf16 tensor's bits. */
async function bits(t: Tensor): Promise<Uint16Array> {
  await t.device.currentStream.synchronize();
  const out = new Uint16Array(t.numel);
  t.buffer.copyTo(out);
  return out;
}

async function host(t: Tensor): Promise<number[]> {
  return [...(await t.toHost())];
}

/** The values every rounding case of the rule covers. */
function edgeValues(r: () => number): Float32Array {
  const v = randF(r, 2000, -3e38, 3e38);
  const fromBits = (b: number) => {
    u32[0] = b;
    return f32[0];
  };
  v.set([
    0,
    -0,
    1,
    -1,
    fromBits(0x3f808000), // a tie, even below: stays 0x3f80
    fromBits(0x3f818000), // a tie, odd below: rounds up to 0x3f82
    fromBits(0x3f808001), // just above a tie: up
    fromBits(0x3f807fff), // just below a tie: down
    fromBits(0x7f7fffff), // the largest fp32: rounds to inf
    fromBits(0x7f7f7fff), // the largest bf16 below it stays
    fromBits(0xff7fffff),
    fromBits(0x00000001), // the smallest subnormal: rounds to +0
    fromBits(0x00008000), // a subnormal tie, even: stays 0
    fromBits(0x00018000), // a subnormal tie, odd: up (no flush to zero)
    fromBits(0x807fffff), // the largest negative subnormal: rounds to -0x0080 (a normal)
    Infinity,
    -Infinity,
    NaN,
    fromBits(0xffc00001), // a negative NaN keeps its sign
    fromBits(0x7f800001), // a signalling NaN becomes quiet
    1e-40,
    3.14159265,
  ]);
  for (let i = 30; i < 300; i++) v[i] = randF(r, 1, -1e-38, 1e-38)[0];
  return v;
}

testEachBackend(
  "cast rounds f32 to bf16 by the rule, widens it exactly, and goes to and from f16",
  async (dev) => {
    const r = gen("bf16-cast");
    const src = edgeValues(r);
    using a = Tensor.fromHost(dev, src);
    using h = Tensor.empty(dev, [src.length], "bf16");
    using back = Tensor.empty(dev, [src.length], "f32");
    ops.cast(a, h);
    ops.cast(h, back);
    const got = await bits(h), wide = await host(back);
    for (let i = 0; i < src.length; i++) {
      const want = bf16Bits(src[i]);
      assert.strictEqual(
        got[i],
        want,
        `cast(${src[i]}) = 0x${got[i].toString(16)}, want 0x${want.toString(16)} (seed ${SEED})`,
      );
      assert.ok(Object.is(wide[i], bf16Value(want)), `widen 0x${want.toString(16)}`);
    }
    assert.deepStrictEqual(await host(h), wide, "toHost widens bf16 exactly");
    // f16 <-> bf16 goes through fp32 and rounds once
    const small = randF(r, 513, -60000, 60000);
    using s = Tensor.fromHost(dev, Float16Array.from(small));
    using sb = Tensor.empty(dev, [small.length], "bf16");
    using sh = Tensor.empty(dev, [small.length], "f16");
    ops.cast(s, sb);
    ops.cast(sb, sh);
    const h16 = Float16Array.from(small);
    assert.deepStrictEqual([...await bits(sb)], [...h16].map(bf16Bits), "f16 -> bf16");
    assert.deepStrictEqual(
      await host(sh),
      [...Float16Array.from([...h16].map(roundBf16))],
      "bf16 -> f16",
    );
  },
);

testEachBackend(
  "relu on bf16 bits zeroes -0 and negatives and passes NaN, like fp32",
  async (dev) => {
    const r = gen("bf16-relu");
    for (const n of [1, 17, 1000, 70001]) {
      const x = randB(r, n, -2, 2), dy = randB(r, n);
      x[0] = -0;
      if (n > 4) x.set([-Infinity, NaN, Infinity], 1);
      using tx = bf16(dev, x);
      using ty = Tensor.empty(dev, [n], "bf16");
      using tdy = bf16(dev, dy);
      using tdx = Tensor.empty(dev, [n], "bf16");
      ops.reluForward(tx, ty);
      ops.reluBackward(tdy, tdx, { y: ty });
      const y = await host(ty), dx = await host(tdx);
      for (let i = 0; i < n; i++) {
        const want = Number.isNaN(x[i]) ? NaN : x[i] > 0 ? x[i] : 0;
        assert.ok(Object.is(y[i], want), `relu(${x[i]}) = ${y[i]} (seed ${SEED})`);
        assert.ok(Object.is(dx[i], x[i] > 0 ? dy[i] : 0), `relu'(${x[i]}) (seed ${SEED})`);
      }
    }
  },
);

testEachBackend("bf16 fills are the f32 fills rounded once by the rule", async (dev) => {
  const n = 4099;
  for (
    const [name, make] of [
      ["randn", (dtype: "f32" | "bf16") => randn(dev, [n], { seed: 7, dtype })],
      ["rand", (dtype: "f32" | "bf16") => rand(dev, [n], { seed: 8, low: -3, high: 5, dtype })],
      ["arange", (dtype: "f32" | "bf16") => arange(dev, n, { start: -1000, step: 0.37, dtype })],
      ["full", (dtype: "f32" | "bf16") => full(dev, [n], 0.1, { dtype })],
    ] as const
  ) {
    using wide = make("f32");
    using narrow = make("bf16");
    const want = (await host(wide)).map(bf16Bits);
    assert.deepStrictEqual([...await bits(narrow)], want, name);
  }
});

// ---- the GEMM-based kernels ------------------------------------------------------------------

testEachBackend(
  "bf16 matmul matches float64 for every transpose, into f32 and bf16",
  async (dev) => {
    const r = gen("bf16-matmul");
    for (const [m, n, k] of [[1, 1, 1], [3, 5, 7], [37, 45, 29], [130, 70, 513], [20, 600, 17]]) {
      for (const transA of [false, true]) {
        for (const transB of [false, true]) {
          const a = randB(r, m * k), b = randB(r, k * n);
          const ref = refMatmul(a, b, m, n, k, transA, transB);
          using ta = bf16(dev, a, transA ? [k, m] : [m, k]);
          using tb = bf16(dev, b, transB ? [n, k] : [k, n]);
          using c32 = Tensor.empty(dev, [m, n], "f32");
          using c16 = Tensor.empty(dev, [m, n], "bf16");
          ops.matmul(ta, tb, { out: c32, transA, transB });
          ops.matmul(ta, tb, { out: c16, transA, transB });
          const what = `bf16 matmul ${m}x${n}x${k} transA=${transA} transB=${transB}`;
          // bf16 products are exact in fp32: only the fp32 sums round
          assertClose(await host(c32), ref, 1e-5 * k, 1e-4, `${what} f32`);
          assertClose(await host(c16), ref, ATOL, RTOL, `${what} bf16`);
          ops.matmul(ta, tb, { out: c16, transA, transB, accumulate: true });
          assertClose(await host(c16), ref.map((v) => 2 * v), 2 * ATOL, RTOL, `${what} acc`);
        }
      }
    }
    using a = Tensor.empty(dev, [2, 3], "bf16");
    using f = Tensor.empty(dev, [3, 2], "f16");
    using c = Tensor.empty(dev, [2, 2], "f32");
    assert.throws(() => ops.matmul(a, f, { out: c }), /b is f16 but a is bf16/);
  },
);

const CONV_GEOS: Geo[] = [
  { n: 2, c: 3, h: 9, w: 7, co: 5, kh: 3, kw: 3, s: 1, p: 1 },
  { n: 3, c: 5, h: 10, w: 11, co: 7, kh: 3, kw: 3, s: 2, p: 1 },
  { n: 2, c: 6, h: 5, w: 6, co: 33, kh: 1, kw: 1, s: 1, p: 0 },
  { n: 2, c: 1, h: 28, w: 28, co: 32, kh: 3, kw: 3, s: 1, p: 1 },
  { n: 2, c: 32, h: 14, w: 14, co: 64, kh: 3, kw: 3, s: 1, p: 1 },
];

testEachBackend("bf16 conv2d forward and backward match float64 references", async (dev) => {
  const r = gen("bf16-conv");
  for (const g of CONV_GEOS) {
    const [oh, ow] = outSize(g);
    const xs = [g.n, g.c, g.h, g.w], ws = [g.co, g.c, g.kh, g.kw], ys = [g.n, g.co, oh, ow];
    const x = randB(r, g.n * g.c * g.h * g.w), w = randB(r, g.co * g.c * g.kh * g.kw);
    const dy = randB(r, g.n * g.co * oh * ow);
    const { y, dx, dw } = refConv(g, x, w, dy);
    using tx = bf16(dev, x, xs);
    using tw = bf16(dev, w, ws);
    using tdy = bf16(dev, dy, ys);
    using ty = Tensor.empty(dev, ys, "bf16");
    using tdx = Tensor.empty(dev, xs, "bf16");
    using tdw32 = Tensor.empty(dev, ws, "f32");
    using tdw16 = Tensor.empty(dev, ws, "bf16");
    const opts = { stride: g.s, padding: g.p };
    ops.conv2dForward(tx, ty, { ...opts, weight: tw });
    ops.conv2dBackwardData(tdy, tdx, { ...opts, weight: tw });
    ops.conv2dBackwardWeight(tdy, tdw32, { ...opts, x: tx });
    ops.conv2dBackwardWeight(tdy, tdw16, { ...opts, x: tx });
    const what = `bf16 conv x[${xs}] w[${ws}] s${g.s} p${g.p}`;
    assertClose(await host(ty), y, ATOL, RTOL, `${what} forward`);
    assertClose(await host(tdx), dx, ATOL, RTOL, `${what} backward data`);
    const terms = g.n * oh * ow;
    assertClose(await host(tdw32), dw, 1e-6 * terms, 1e-4, `${what} backward weight f32`);
    assertClose(await host(tdw16), dw, ATOL, RTOL, `${what} backward weight bf16`);
  }
});

// ---- pooling, norms, bias, loss --------------------------------------------------------------

testEachBackend("bf16 maxPool2d, batchNorm, bias and crossEntropy match float64", async (dev) => {
  const r = gen("bf16-misc");
  for (const [n, c, h, w, k, s] of [[2, 3, 8, 8, 2, 2], [2, 3, 7, 9, 3, 2]]) {
    const oh = Math.floor((h - k) / s) + 1, ow = Math.floor((w - k) / s) + 1;
    const x = randB(r, n * c * h * w), dy = randB(r, n * c * oh * ow);
    const ref = refMaxPool(x, dy, { n, c, h, w, k, s });
    using tx = bf16(dev, x, [n, c, h, w]);
    using ty = Tensor.empty(dev, [n, c, oh, ow], "bf16");
    using ti = Tensor.empty(dev, [n, c, oh, ow], "i32");
    using tdy = bf16(dev, dy, [n, c, oh, ow]);
    using tdx = Tensor.empty(dev, [n, c, h, w], "bf16");
    ops.maxPool2dForward(tx, ty, { kernel: k, stride: s, indices: ti });
    ops.maxPool2dBackward(tdy, tdx, { indices: ti });
    assert.deepStrictEqual(await host(ty), [...ref.y], `maxPool [${n},${c},${h},${w}] k${k}`);
    const idx = await host(ti);
    if (idx.every((v, i) => v === ref.idx[i])) {
      assertClose(await host(tdx), ref.dx, ATOL, RTOL, `maxPool backward k${k} s${s}`);
    }
  }
  // batch norm (the last shape reads 16 bytes at a time on CUDA: hw a multiple of 8)
  for (const [n, c, hw] of [[4, 3, 25], [7, 5, 1], [16, 4, 1024]]) {
    const x = randB(r, n * c * hw, -2, 3), dy = randB(r, n * c * hw);
    const gamma = randF(r, c, 0.5, 1.5), beta = randF(r, c);
    const rm0 = randF(r, c), rv0 = randF(r, c, 0.5, 2);
    const eps = 1e-5, momentum = 0.1;
    const ref = refBatchNorm(x, dy, { n, c, hw, gamma, beta, rm0, rv0, eps, momentum });
    const shape = [n, c, hw];
    using tx = bf16(dev, x, shape);
    using tdy = bf16(dev, dy, shape);
    using tg = Tensor.fromHost(dev, gamma);
    using tb = Tensor.fromHost(dev, beta);
    using trm = Tensor.fromHost(dev, rm0);
    using trv = Tensor.fromHost(dev, rv0);
    using ty = Tensor.empty(dev, shape, "bf16");
    using tdx = Tensor.empty(dev, shape, "bf16");
    using tm = Tensor.empty(dev, [c], "f32");
    using ts = Tensor.empty(dev, [c], "f32");
    using tdg = Tensor.empty(dev, [c], "f32");
    using tdb = Tensor.empty(dev, [c], "f32");
    ops.batchNormForwardTrain(tx, ty, {
      gamma: tg,
      beta: tb,
      eps,
      saveMean: tm,
      saveInvStd: ts,
      runMean: trm,
      runVar: trv,
      momentum,
    });
    ops.batchNormBackward(tdy, tdx, {
      x: tx,
      gamma: tg,
      saveMean: tm,
      saveInvStd: ts,
      dgamma: tdg,
      dbeta: tdb,
    });
    const what = `bf16 batchNorm [${shape}]`;
    assertClose(await host(ty), ref.y, ATOL, RTOL, `${what} y`);
    assertClose(await host(tm), ref.mean, 1e-5, 1e-5, `${what} mean`);
    assertClose(await host(tdb), ref.dbeta, 1e-5 * n * hw, 1e-4, `${what} dbeta`);
    assertClose(await host(tdx), ref.dx, 3e-2, 3e-2, `${what} dx`);
  }
  // bias add and grad, per channel and per feature, with an f32 and a bf16 bias
  for (const shape of [[3, 5, 4, 7], [9, 13]]) {
    const [n, c] = shape, hw = shape.slice(2).reduce((a, b) => a * b, 1);
    const y = randB(r, n * c * hw);
    for (const biasDtype of ["f32", "bf16"] as const) {
      const bias = randB(r, c), ref = new Float64Array(y.length), g = new Float64Array(c);
      for (let i = 0; i < y.length; i++) {
        const ch = Math.floor(i / hw) % c;
        ref[i] = y[i] + bias[ch];
        g[ch] += y[i];
      }
      using ty = bf16(dev, y, shape);
      using tb = biasDtype === "f32" ? Tensor.fromHost(dev, bias) : bf16(dev, bias);
      ops.biasAdd(ty, tb);
      assertClose(await host(ty), ref, ATOL, RTOL, `biasAdd [${shape}] ${biasDtype}`);
      using ty2 = bf16(dev, y, shape);
      using g32 = Tensor.empty(dev, [c], "f32");
      using g16 = Tensor.empty(dev, [c], "bf16");
      ops.biasGrad(ty2, g32);
      ops.biasGrad(ty2, g16);
      assertClose(await host(g32), g, 1e-5 * n * hw, 1e-4, `biasGrad f32 [${shape}]`);
      assertClose(await host(g16), g, ATOL, RTOL, `biasGrad bf16 [${shape}]`);
    }
  }
  // cross entropy, every argmax position in a warp (class counts up to 40)
  for (const [n, k, scale] of [[5, 10, 1], [33, 7, 1024], [40, 40, 1]] as const) {
    const logits = randB(r, n * k, -4, 4);
    if (k === 40) { for (let i = 0; i < n; i++) logits[i * k + (i % k)] = 8; }
    const labels = Int32Array.from({ length: n }, () => Math.floor(r() * k));
    const ref = refCrossEntropy(logits, labels, n, k, scale);
    using tl = bf16(dev, logits, [n, k]);
    using tlab = Tensor.fromHost(dev, labels);
    using td = Tensor.empty(dev, [n, k], "bf16");
    using tloss = Tensor.fromHost(dev, new Float32Array([0]));
    using thits = Tensor.fromHost(dev, new Int32Array([0]));
    ops.crossEntropyForwardBackward(tl, tlab, {
      dlogits: td,
      lossSum: tloss,
      correct: thits,
      scale,
    });
    const what = `bf16 crossEntropy [${n},${k}]`;
    assertClose(await host(tloss), [ref.loss], 1e-4 * n, 1e-5, `${what} loss`);
    assert.deepStrictEqual(await host(thits), [ref.hits], `${what} correct (seed ${SEED})`);
    assertClose(await host(td), ref.dlogits, ATOL * Math.max(1, scale / n), RTOL, `${what} grad`);
  }
});

// ---- loss scaling and the optimizer ------------------------------------------------------------

testEachBackend(
  "sgdStep writes a bf16 compute copy rounded by the rule; unscale checks bf16",
  async (dev) => {
    const r = gen("bf16-sgd");
    const n = 3001, p0 = randF(r, n, -2, 2), g = randB(r, n);
    using p = Tensor.fromHost(dev, p0);
    using tg = bf16(dev, g);
    using half = Tensor.empty(dev, [n], "bf16");
    ops.sgdStep(p, tg, { lr: 0.1, paramHalf: half });
    const master = await p.toHost();
    assertClose([...master], [...p0].map((v, i) => v - 0.1 * g[i]), 1e-6, 1e-6, "fp32 update");
    assert.deepStrictEqual([...await bits(half)], [...master].map(bf16Bits), "the bf16 copy");
    // the GradScaler's check on bf16 gradients
    using flag = Tensor.fromHost(dev, new Int32Array([0]));
    ops.unscaleAndCheck(tg, flag, { invScale: 0.5, inPlace: true });
    assert.deepStrictEqual(await host(flag), [0]);
    assert.deepStrictEqual(await host(tg), [...g].map((v) => v * 0.5), "unscaled exactly");
    using bad = bf16(dev, new Float32Array([1, -Infinity, 2]));
    ops.unscaleAndCheck(bad, flag);
    assert.deepStrictEqual(await host(flag), [1], "a bf16 inf is found");
    using h16 = Tensor.empty(dev, [n], "f32");
    assert.throws(
      () => ops.sgdStep(p, tg, { lr: 0.1, paramHalf: h16 }),
      /paramHalf must be f16 or bf16/,
    );
  },
);

// ---- models ----------------------------------------------------------------------------------

testEachBackend(
  "a bf16 model keeps bf16 compute copies, refuses other inputs and a GradScaler",
  async (dev) => {
    using model = smallCnn(11).to(dev, { precision: "bf16" });
    assert.strictEqual(model.precision, "bf16");
    for (const [name, p] of model.namedParameters()) {
      assert.ok(p.computeDtype === "bf16" || p.computeDtype === "f32", name);
      if (p.half) {
        assert.strictEqual(p.half.dtype, "bf16", name);
        assert.deepStrictEqual([...await bits(p.half)], [...await p.read()].map(bf16Bits), name);
      }
    }
    using x16 = Tensor.empty(dev, [2, 1, 8, 8], "f16");
    assert.throws(
      () => model.forward(x16),
      /the input is f16 but the layer computes in bf16; give it bf16 inputs .*precision: "fp16"/,
    );
    const optimizer = new SGD(model.parameters(), { lr: 0.1 });
    using scaler = new GradScaler(dev);
    assert.throws(
      () => new Trainer(model, { optimizer, scaler }),
      /the model computes in bf16, which has fp32's range and needs no loss scaling/,
    );
    using off = new GradScaler(dev, { enabled: false });
    new Trainer(model, { optimizer, scaler: off }).dispose();
    optimizer.dispose();
  },
);

testEachBackend(
  "a bf16 model trains without loss scaling and agrees with its fp16 twin",
  async (dev) => {
    const r = gen("bf16-train");
    const n = 24, x = new Float32Array(n * 64), labels = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      labels[i] = i % 3;
      for (let j = 0; j < 64; j++) x[i * 64 + j] = labels[i] - 1 + 0.3 * (r() - 0.5);
    }
    using model = smallCnn(6).to(dev, { precision: "bf16" });
    using twin = smallCnn(6).to(dev);
    using tx = bf16(dev, x, [n, 1, 8, 8]);
    using tx16 = Tensor.fromHost(dev, Float16Array.from(x), [n, 1, 8, 8]);
    using tl = Tensor.fromHost(dev, labels);
    model.eval(), twin.eval();
    assertClose(
      await host(model.forward(tx)),
      await host(twin.forward(tx16)),
      5e-2,
      5e-2,
      "bf16 and fp16 forwards of the same weights",
    );
    model.train();
    const optimizer = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
    const trainer = new Trainer(model, { optimizer });
    const loss = new CrossEntropyLoss(dev);
    const lossOf = async () => {
      model.eval();
      loss.forward(model.forward(tx), tl);
      const s = await loss.read();
      model.train();
      return s.loss;
    };
    const first = await lossOf();
    for (let step = 0; step < 30; step++) trainer.trainStep(tx, tl);
    const last = await lossOf();
    assert.ok(last < first / 4, `loss ${first} -> ${last}`);
    for (const [name, p] of model.namedParameters()) {
      if (p.half) {
        assert.deepStrictEqual([...await bits(p.half)], [...await p.read()].map(bf16Bits), name);
      }
    }
    trainer.dispose();
    optimizer.dispose();
    loss.dispose();
  },
);

// ---- the two backends against each other --------------------------------------------------------

Deno.test({
  name: "bf16 element-wise kernels give the same bits on the cpu and cuda backends [cuda]",
  ignore: CUDA.ignore,
  async fn() {
    using cpu = Device.open("cpu");
    using gpu = Device.open("cuda");
    const r = gen("bf16-parity");
    const src = edgeValues(r);
    const run = async (dev: Device) => {
      const out: Record<string, number[]> = {};
      using a = Tensor.fromHost(dev, src);
      using h = Tensor.empty(dev, [src.length], "bf16");
      ops.cast(a, h);
      out.cast = [...await bits(h)];
      using y = Tensor.empty(dev, [src.length], "bf16");
      ops.reluForward(h, y);
      out.relu = [...await bits(y)];
      using z = Tensor.empty(dev, [src.length], "bf16");
      add(h, y, z);
      out.add = [...await bits(z)];
      using nrm = randn(dev, [5000], { seed: 3, dtype: "bf16" });
      out.randn = [...await bits(nrm)];
      const p0 = randF(gen("bf16-parity-sgd"), 777, -3, 3);
      using p = Tensor.fromHost(dev, p0);
      using g = randn(dev, [777], { seed: 4, dtype: "bf16" });
      using half = Tensor.empty(dev, [777], "bf16");
      ops.sgdStep(p, g, { lr: 0.01, paramHalf: half });
      out.sgd = [...await bits(half)];
      return out;
    };
    const want = await run(cpu), got = await run(gpu);
    for (const k of Object.keys(want)) {
      assert.deepStrictEqual(got[k], want[k], `${k} (seed ${SEED})`);
    }
  },
});

Deno.test({
  name: "a bf16 training step agrees between the cpu and cuda backends [cuda]",
  ignore: CUDA.ignore,
  async fn() {
    const r = gen("bf16-step");
    const n = 8,
      x = randB(r, n * 64, -1, 1),
      labels = Int32Array.from({ length: n }, (_, i) => i % 3);
    const step = async (kind: "cpu" | "cuda") => {
      using dev = Device.open(kind);
      using model = smallCnn(21).to(dev, { precision: "bf16" });
      const optimizer = new SGD(model.parameters(), { lr: 0.05 });
      const trainer = new Trainer(model, { optimizer, cudaGraphs: false });
      using tx = bf16(dev, x, [n, 1, 8, 8]);
      using tl = Tensor.fromHost(dev, labels);
      trainer.trainStep(tx, tl);
      const s = await trainer.readTrain();
      const params = await Promise.all(model.parameters().map((p) => p.read()));
      trainer.dispose();
      optimizer.dispose();
      return { loss: s.loss, params };
    };
    const a = await step("cpu"), b = await step("cuda");
    assertClose([b.loss], [a.loss], 1e-3, 1e-3, "loss");
    a.params.forEach((p, i) => assertClose([...b.params[i]], p, 2e-3, 2e-3, `parameter ${i}`));
  },
});

Deno.test("SyncBatchNorm refuses bf16 activations, naming the precisions it takes", () => {
  using device = Device.open("cpu");
  using group = ProcessGroup.init();
  using bn = new SyncBatchNorm(1, group).to(device, { precision: "bf16" });
  using x = full(device, [2, 1, 1, 1], 1, { dtype: "bf16" });
  assert.throws(() => bn.forward(x), /SyncBatchNorm: it computes on the host in fp16 or fp32/);
});
