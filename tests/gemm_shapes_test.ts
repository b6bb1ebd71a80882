/**
 * The GEMM behind matmul and the convolutions at the edges of its blocking, in fp16 and fp32,
 * against float64 references (tests/_nn_reference.ts): K that is no multiple of the 32-wide
 * k-step, outputs of one row or column, odd channel counts, the 32-row and 64-row tiles, operands
 * that can and cannot be copied 16 bytes at a time, and K long enough for split-K and too short
 * for it. On the CUDA backend (kernels/cuda/gemm.cuh) a GEMM splits K when its output tiles
 * leave the GPU less than half full (under 256 blocks of 32 or 64 x 64) and K has at least 8
 * k-steps (256); the shapes below are marked "split" where that holds. Runs on each backend
 * (tests/_backends.ts); the emulator runs the [cuda] cases in every thread order.
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
  randH,
  refConv,
  refMatmul,
} from "./_nn_reference.ts";

type Dtype = "f16" | "f32";

function rand(r: () => number, n: number, dtype: Dtype): Float16Array | Float32Array {
  return dtype === "f16" ? randH(r, n) : randF(r, n);
}

/** atol, rtol of an output that sums `terms` products (fp16 outputs round once more). */
function tol(dtype: Dtype, terms: number): [number, number] {
  return dtype === "f16" ? [2e-3, 2e-3] : [2e-6 * Math.max(1, terms), 1e-5];
}

async function host(t: Tensor): Promise<number[]> {
  return [...(await t.toHost())];
}

// m x n x k, and why the shape is here
const MATMUL: [number, number, number, string][] = [
  [1, 1, 1, "one element"],
  [1, 200, 64, "one row, 16-byte A, four column tiles"],
  [77, 1, 40, "one column"],
  [5, 9, 200, "7 k-steps: no split"],
  [32, 64, 256, "one 32-row tile, 8 k-steps: split in 2"],
  [33, 65, 47, "64-row tile with 31 rows of padding, K tail of 15"],
  [3, 5, 1000, "K tail of 8: split in 8"],
  [32, 10, 2048, "the Linear layer's shape: split in 16, 16-byte A"],
  [70, 130, 300, "two row and three column tiles, odd K: split"],
];

testEachBackend("matmul at the GEMM's tile edges, with and without split-K", async (dev) => {
  const r = gen("gemm-shapes-matmul");
  for (const dtype of ["f16", "f32"] as const) {
    for (const [m, n, k, why] of MATMUL) {
      for (const [transA, transB] of [[false, false], [true, false], [false, true]]) {
        const a = rand(r, m * k, dtype), b = rand(r, k * n, dtype);
        const ref = refMatmul(a, b, m, n, k, transA, transB);
        using ta = Tensor.fromHost(dev, a, transA ? [k, m] : [m, k]);
        using tb = Tensor.fromHost(dev, b, transB ? [n, k] : [k, n]);
        using c = Tensor.empty(dev, [m, n], dtype);
        ops.matmul(ta, tb, { out: c, transA, transB });
        const [atol, rtol] = tol(dtype, k);
        const what = `${dtype} matmul ${m}x${n}x${k} (${why}) transA=${transA} transB=${transB}`;
        assertClose(await host(c), ref, atol, rtol, what);
      }
    }
  }
});

testEachBackend("matmul accumulates onto its output through split-K", async (dev) => {
  const r = gen("gemm-shapes-acc");
  const [m, n, k] = [4, 12, 640]; // 20 k-steps: split in 5
  for (const dtype of ["f16", "f32"] as const) {
    const a = rand(r, m * k, dtype), b = rand(r, k * n, dtype), c0 = rand(r, m * n, dtype);
    const ref = refMatmul(a, b, m, n, k, false, false).map((v, i) => v + c0[i]);
    using ta = Tensor.fromHost(dev, a, [m, k]);
    using tb = Tensor.fromHost(dev, b, [k, n]);
    using c = Tensor.fromHost(dev, c0, [m, n]);
    ops.matmul(ta, tb, { out: c, accumulate: true });
    const [atol, rtol] = tol(dtype, k);
    assertClose(await host(c), ref, atol, rtol, `${dtype} matmul accumulate ${m}x${n}x${k}`);
  }
});

// The GEMMs: forward co x (n*P) x (c*kh*kw); data gradient c x (n*h*w) x (co*kh*kw); weight
// gradient co x (c*kh*kw) x (n*P).
const CONV: [Geo, string][] = [
  [{ n: 1, c: 1, h: 6, w: 5, co: 1, kh: 3, kw: 3, s: 1, p: 1 }, "one channel in and out"],
  [{ n: 2, c: 3, h: 9, w: 7, co: 5, kh: 3, kw: 3, s: 1, p: 1 }, "odd channels, K = 27"],
  [{ n: 1, c: 33, h: 5, w: 6, co: 7, kh: 3, kw: 3, s: 2, p: 2 }, "K = 297, stride 2, pad 2"],
  [
    { n: 2, c: 8, h: 8, w: 8, co: 32, kh: 3, kw: 3, s: 1, p: 1 },
    "32-row tiles, 16-byte weights and dY; weight gradient split (4 k-steps: no)",
  ],
  [
    { n: 4, c: 5, h: 16, w: 16, co: 40, kh: 3, kw: 3, s: 1, p: 1 },
    "64-row tile with padding; weight gradient 32 k-steps: split in 8",
  ],
  [
    { n: 3, c: 64, h: 4, w: 4, co: 3, kh: 3, kw: 3, s: 1, p: 1 },
    "forward K = 576 (18 k-steps) over 48 columns: split in 4",
  ],
  [
    { n: 2, c: 6, h: 7, w: 9, co: 65, kh: 1, kw: 1, s: 1, p: 0 },
    "1x1, 65 output channels: a second row tile of one row",
  ],
  [{ n: 2, c: 4, h: 9, w: 7, co: 3, kh: 2, kw: 4, s: 3, p: 1 }, "non-square kernel, stride 3"],
];

async function checkConv(dev: Device, g: Geo, why: string, dtype: Dtype, r: () => number) {
  const [oh, ow] = outSize(g);
  const xs = [g.n, g.c, g.h, g.w], ws = [g.co, g.c, g.kh, g.kw], ys = [g.n, g.co, oh, ow];
  const x = rand(r, g.n * g.c * g.h * g.w, dtype);
  const w = rand(r, g.co * g.c * g.kh * g.kw, dtype);
  const dy = rand(r, g.n * g.co * oh * ow, dtype);
  const ref = refConv(g, x, w, dy);
  using tx = Tensor.fromHost(dev, x, xs);
  using tw = Tensor.fromHost(dev, w, ws);
  using tdy = Tensor.fromHost(dev, dy, ys);
  using ty = Tensor.empty(dev, ys, dtype);
  using tdx = Tensor.empty(dev, xs, dtype);
  using tdw = Tensor.empty(dev, ws, "f32");
  const opts = { stride: g.s, padding: g.p };
  ops.conv2dForward(tx, ty, { ...opts, weight: tw });
  ops.conv2dBackwardData(tdy, tdx, { ...opts, weight: tw });
  ops.conv2dBackwardWeight(tdy, tdw, { ...opts, x: tx });
  const what = `${dtype} conv x[${xs}] w[${ws}] s${g.s} p${g.p} (${why})`;
  assertClose(await host(ty), ref.y, ...tol(dtype, g.c * g.kh * g.kw), `${what} forward`);
  assertClose(await host(tdx), ref.dx, ...tol(dtype, g.co * g.kh * g.kw), `${what} data grad`);
  // the weight gradient is fp32 whatever the activations: an fp32 sum of n*oh*ow products
  const terms = g.n * oh * ow;
  assertClose(await host(tdw), ref.dw, 2e-6 * terms, 1e-4, `${what} weight grad`);
}

testEachBackend("conv2d at the GEMM's tile edges, with and without split-K", async (dev) => {
  const r = gen("gemm-shapes-conv");
  for (const dtype of ["f16", "f32"] as const) {
    for (const [g, why] of CONV) await checkConv(dev, g, why, dtype, r);
  }
});

/** A random tensor of `dtype` (bf16 through the device's cast from f32). */
function make(
  dev: Device,
  r: () => number,
  shape: number[],
  dtype: Dtype | "bf16",
): Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  if (dtype !== "bf16") return Tensor.fromHost(dev, rand(r, n, dtype), shape);
  using src = Tensor.fromHost(dev, randF(r, n), shape);
  const t = Tensor.empty(dev, shape, "bf16");
  ops.cast(src, t);
  return t;
}

testEachBackend(
  "matmul with a bias and ReLU is one call with the bits of matmul, biasAdd and reluForward",
  async (dev: Device) => {
    const r = gen("gemm-bias-act");
    // [m, n, k]: a Linear's forward with split-K (CIFAR's classifier at batch 128), without,
    // a 32-row tile, one column; outputs straddling zero so ReLU has work.
    const shapes: [number, number, number][] = [[128, 10, 2048], [70, 45, 40], [20, 96, 300], [
      5,
      1,
      33,
    ]];
    for (const [m, n, k] of shapes) {
      for (const dtype of ["f16", "f32", "bf16"] as const) {
        for (const biasDtype of ["f32", dtype === "f32" ? "f16" : dtype] as const) {
          for (const relu of [false, true]) {
            using a = make(dev, r, [m, k], dtype);
            using w = make(dev, r, [n, k], dtype);
            using bias = make(dev, r, [n], biasDtype);
            using want = Tensor.empty(dev, [m, n], dtype);
            using got = Tensor.empty(dev, [m, n], dtype);
            got.buffer.fill(0xff); // overwritten, not added to
            ops.matmul(a, w, { out: want, transB: true });
            ops.biasAdd(want, bias);
            if (relu) ops.reluForward(want, want);
            ops.matmul(a, w, { out: got, transB: true, bias, relu });
            const what = `${m}x${n}x${k} ${dtype} bias ${biasDtype} relu ${relu}`;
            const [g, e] = [await host(got), await host(want)];
            assert.deepStrictEqual(g, e, what);
            if (relu && m * n >= 100 && dtype !== "bf16") {
              assert.ok(e.includes(0) && e.some((v) => v > 0), what);
            }
          }
        }
      }
    }
    using a = Tensor.empty(dev, [2, 3], "f32");
    using b = Tensor.empty(dev, [3, 4], "f32");
    using c = Tensor.empty(dev, [2, 4], "f32");
    using bias = Tensor.empty(dev, [3], "f32");
    assert.throws(() => ops.matmul(a, b, { out: c, bias }), /bias has shape \[3\]|bias.*\[4\]/);
    using bias4 = Tensor.empty(dev, [4], "f32");
    assert.throws(() => ops.matmul(a, b, { out: c, bias: bias4, accumulate: true }), /accumulate/);
    assert.throws(() => ops.matmul(a, b, { out: c, relu: true }), /relu needs a bias/);
  },
);
