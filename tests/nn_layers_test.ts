// Tests of nn/: layers (backward vs finite differences on the CPU backend), the optimizer
// (vs a TypeScript transcription of torch.optim.SGD), GradScaler, LR schedulers (vs values
// printed by PyTorch 1.13), safetensors and checkpoint resume.
import assert from "node:assert";
import { decodeSafetensors, encodeSafetensors } from "../nn/safetensors.ts";
import { CosineAnnealingLR, LinearLR, StepLR } from "../nn/lr_scheduler.ts";
import { kaimingUniform, Xoshiro128 } from "../nn/init.ts";
import { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import {
  BatchNorm2d,
  Conv2d,
  CrossEntropyLoss,
  Flatten,
  GradScaler,
  Linear,
  loadCheckpoint,
  MaxPool2d,
  type Module,
  OneCycleLR,
  Parameter,
  ReLU,
  saveCheckpoint,
  Sequential,
  SGD,
} from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { smallCnn } from "./_nn_reference.ts";

function assertClose(actual: number, expected: number, atol: number, rtol: number, what = "") {
  const tol = atol + rtol * Math.abs(expected);
  assert.ok(
    Math.abs(actual - expected) <= tol,
    `${what}: ${actual} vs ${expected} (tolerance ${tol})`,
  );
}

// ---- LR schedulers -------------------------------------------------------------------------

// Printed by PyTorch 1.13 (SGD lr=0.1 momentum=0.9; lr after construction, then after each
// optimizer.step(); scheduler.step()).
const TORCH_SCHEDULES = {
  step: [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125],
  cos: [
    0.1,
    0.0855017856687341,
    0.0505,
    0.0154982143312659,
    0.001,
    0.015498214331265896,
    0.05050000000000001,
    0.08550178566873413,
    0.10000000000000003,
    0.08550178566873413,
    0.05050000000000003,
    0.015498214331265945,
    0.001,
  ],
  linear: [
    0.010000000000000002,
    0.03250000000000001,
    0.055000000000000014,
    0.07750000000000003,
    0.10000000000000003,
    0.10000000000000003,
    0.10000000000000003,
    0.10000000000000003,
  ],
  onecycle: [
    0.020000000000000018,
    0.26,
    0.5,
    0.47524231600673683,
    0.40587282697488153,
    0.30563101096814466,
    0.19437098903185537,
    0.09412917302511849,
    0.024759683993263143,
    2e-06,
  ],
  onecycleMom: [
    0.95,
    0.8999999999999999,
    0.85,
    0.854951556604879,
    0.8688255099070633,
    0.8888739533021842,
    0.9111260466978157,
    0.9311744900929366,
    0.945048443395121,
    0.95,
  ],
  onecycle3: [
    0.02,
    0.20461538461538464,
    0.3892307692307693,
    0.4261538461538461,
    0.24153846153846148,
    0.0569230769230768,
    0.01724165517241379,
    0.013793724137931033,
    0.010345793103448273,
    0.006897862068965515,
    0.0034499310344827568,
    1.9999999999985307e-06,
  ],
  onecycle3Mom: [
    0.95,
    0.9115384615384615,
    0.8730769230769231,
    0.8653846153846154,
    0.9038461538461539,
    0.9423076923076923,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
  ],
};

function trace(
  make: (o: { lr: number; momentum: number }) => { step(): void },
  n: number,
): { lrs: number[]; moms: number[] } {
  const opt = { lr: 0.1, momentum: 0.9 };
  const s = make(opt);
  const lrs = [opt.lr], moms = [opt.momentum];
  for (let i = 0; i < n; i++) {
    s.step();
    lrs.push(opt.lr);
    moms.push(opt.momentum);
  }
  return { lrs, moms };
}

function assertSeries(actual: number[], expected: number[], what: string) {
  assert.strictEqual(actual.length, expected.length, what);
  actual.forEach((v, i) => assertClose(v, expected[i], 1e-15, 1e-12, `${what}[${i}]`));
}

Deno.test("StepLR matches PyTorch's values", () => {
  const { lrs } = trace((o) => new StepLR(o, { stepSize: 3, gamma: 0.5 }), 10);
  assertSeries(lrs, TORCH_SCHEDULES.step, "StepLR");
});

Deno.test("CosineAnnealingLR matches PyTorch's values past one period", () => {
  const { lrs } = trace((o) => new CosineAnnealingLR(o, { tMax: 4, etaMin: 0.001 }), 12);
  assertSeries(lrs, TORCH_SCHEDULES.cos, "CosineAnnealingLR");
});

Deno.test("LinearLR warm-up matches PyTorch's values", () => {
  const { lrs } = trace((o) => new LinearLR(o, { startFactor: 0.1, totalIters: 4 }), 7);
  assertSeries(lrs, TORCH_SCHEDULES.linear, "LinearLR");
});

Deno.test("OneCycleLR matches PyTorch's lr and momentum, two and three phases", () => {
  const two = trace((o) => new OneCycleLR(o, { maxLr: 0.5, totalSteps: 10 }), 9);
  assertSeries(two.lrs, TORCH_SCHEDULES.onecycle, "OneCycleLR lr");
  assertSeries(two.moms, TORCH_SCHEDULES.onecycleMom, "OneCycleLR momentum");
  const three = trace(
    (o) =>
      new OneCycleLR(o, {
        maxLr: 0.5,
        totalSteps: 12,
        threePhase: true,
        annealStrategy: "linear",
      }),
    11,
  );
  assertSeries(three.lrs, TORCH_SCHEDULES.onecycle3, "OneCycleLR three-phase lr");
  assertSeries(three.moms, TORCH_SCHEDULES.onecycle3Mom, "OneCycleLR three-phase momentum");
});

Deno.test("OneCycleLR refuses to step past totalSteps, as PyTorch does", () => {
  const s = new OneCycleLR({ lr: 0, momentum: 0.9 }, { maxLr: 1, totalSteps: 3 });
  for (let i = 0; i < 3; i++) s.step();
  assert.throws(() => s.step(), /tried to step 5 times/);
});

Deno.test("a scheduler restored from its state continues the same schedule", () => {
  const a = trace((o) => new CosineAnnealingLR(o, { tMax: 5 }), 0);
  assert.ok(a);
  const optA = { lr: 0.1 };
  const sa = new CosineAnnealingLR(optA, { tMax: 5 });
  for (let i = 0; i < 3; i++) sa.step();
  const optB = { lr: 0.1 };
  const sb = new CosineAnnealingLR(optB, { tMax: 5 });
  sb.loadStateDict(JSON.parse(JSON.stringify(sa.stateDict())));
  for (let i = 0; i < 4; i++) {
    sa.step();
    sb.step();
    assert.strictEqual(optB.lr, optA.lr);
  }
});

// ---- init ----------------------------------------------------------------------------------

Deno.test("kaimingUniform with a = sqrt(5) draws from U(-1/sqrt(fanIn), 1/sqrt(fanIn))", () => {
  const w = kaimingUniform(new Float64Array(20000), 100, new Xoshiro128(1));
  const bound = 0.1;
  assert.ok(w.every((v) => Math.abs(v) <= bound));
  const mean = w.reduce((a, b) => a + b, 0) / w.length;
  const variance = w.reduce((a, b) => a + b * b, 0) / w.length;
  assertClose(mean, 0, 2e-3, 0, "mean");
  assertClose(variance, bound * bound / 3, 0, 0.03, "variance");
});

// ---- safetensors ---------------------------------------------------------------------------

Deno.test("safetensors writes the reference layout: LE length, padded JSON, offsets", () => {
  const bytes = encodeSafetensors({
    b: { dtype: "I64", shape: [], data: new BigInt64Array([7n]) },
    a: { dtype: "F16", shape: [3], data: new Float16Array([1, 2, 3]) },
  }, { format: "pt" });
  const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  assert.strictEqual(n % 8, 0);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  assert.deepStrictEqual(header.__metadata__, { format: "pt" });
  assert.deepStrictEqual(header.b, { dtype: "I64", shape: [], data_offsets: [0, 8] });
  assert.deepStrictEqual(header.a, { dtype: "F16", shape: [3], data_offsets: [8, 14] });
  assert.strictEqual(bytes.length, 8 + n + 14);
  const back = decodeSafetensors(bytes);
  assert.deepStrictEqual([...back.tensors.keys()], ["b", "a"]);
  assert.strictEqual((back.tensors.get("b")!.data as BigInt64Array)[0], 7n);
  assert.deepStrictEqual([...back.tensors.get("a")!.data as Float16Array], [1, 2, 3]);
});

Deno.test("safetensors reads a file whose tensors are stored out of header order", () => {
  // Hand-built like the Rust writer does: header keys sorted by name, data in another order.
  const header = {
    x: { dtype: "F32", shape: [2], data_offsets: [4, 12] },
    y: { dtype: "U8", shape: [1, 3], data_offsets: [0, 3] },
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const bytes = new Uint8Array(8 + json.length + 12);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(json.length), true);
  bytes.set(json, 8);
  bytes.set([9, 8, 7], 8 + json.length);
  bytes.set(new Uint8Array(new Float32Array([1.5, -2]).buffer), 8 + json.length + 4);
  const { tensors, metadata } = decodeSafetensors(bytes);
  assert.deepStrictEqual(metadata, {});
  assert.deepStrictEqual([...tensors.get("x")!.data as Float32Array], [1.5, -2]);
  assert.deepStrictEqual(tensors.get("y")!.shape, [1, 3]);
  assert.deepStrictEqual([...tensors.get("y")!.data as Uint8Array], [9, 8, 7]);
});

Deno.test("safetensors rejects truncated files, bad offsets and overlaps with the reason", () => {
  const good = encodeSafetensors({ w: { dtype: "F32", shape: [4], data: new Float32Array(4) } });
  assert.throws(() => decodeSafetensors(good.subarray(0, good.length - 1), "w.st"), /w\.st/);
  const mk = (h: unknown, dataBytes: number) => {
    const json = new TextEncoder().encode(JSON.stringify(h));
    const b = new Uint8Array(8 + json.length + dataBytes);
    new DataView(b.buffer).setBigUint64(0, BigInt(json.length), true);
    b.set(json, 8);
    return b;
  };
  assert.throws(
    () => decodeSafetensors(mk({ w: { dtype: "F32", shape: [2], data_offsets: [0, 4] } }, 8)),
    /expected 8 bytes/,
  );
  assert.throws(
    () =>
      decodeSafetensors(
        mk({
          a: { dtype: "U8", shape: [4], data_offsets: [0, 4] },
          b: { dtype: "U8", shape: [4], data_offsets: [2, 6] },
        }, 8),
      ),
    /overlap/,
  );
  assert.throws(
    () => decodeSafetensors(mk({ w: { dtype: "Q4", shape: [1], data_offsets: [0, 1] } }, 1)),
    /dtype Q4/,
  );
  const huge = new Uint8Array(16);
  new DataView(huge.buffer).setBigUint64(0, 1000n, true);
  assert.throws(() => decodeSafetensors(huge), /header length 1000/);
});

Deno.test("safetensors refuses data whose length does not match the shape", () => {
  assert.throws(
    () => encodeSafetensors({ w: { dtype: "F32", shape: [3], data: new Float32Array(2) } }),
    RangeError,
  );
});

// ---- layers: backward vs finite differences of a float64 reference ------------------------
//
// Each layer runs on the CPU backend (fp16 activations, fp32 accumulation). The reference is
// the same layer written in float64 TypeScript, evaluated on exactly the values the kernels
// saw (inputs and weights rounded to fp16 where the layer reads fp16). Its gradients come
// from central finite differences of L = sum(forward(x) * dy), so they check the backward's
// formulas, not a second hand-written backward. Tolerance atol + rtol*|ref|, with atol scaled
// to the gradient's magnitude: fp16 outputs carry a relative error of about 2^-11.

type Ref = (x: Float64Array, params: Float64Array[]) => Float64Array;

function randn(rng: Xoshiro128): number {
  const u = 1 - rng.random(), v = rng.random();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
}

function randomHalf(n: number, rng: Xoshiro128, scale = 1, awayFromZero = 0): Float16Array {
  const a = new Float16Array(n);
  for (let i = 0; i < n; i++) {
    let v = scale * randn(rng);
    if (Math.abs(v) < awayFromZero) v = Math.sign(v || 1) * (awayFromZero + Math.abs(v));
    a[i] = v;
  }
  return a;
}

function numericGrad(f: () => number, values: Float64Array, h = 1e-4): Float64Array {
  const g = new Float64Array(values.length);
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    values[i] = v + h;
    const up = f();
    values[i] = v - h;
    const down = f();
    values[i] = v;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

function assertAllClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  what: string,
  { atolFrac = 2e-3, rtol = 5e-3 } = {},
) {
  assert.strictEqual(actual.length, expected.length, `${what}: length`);
  let max = 0;
  for (let i = 0; i < expected.length; i++) max = Math.max(max, Math.abs(expected[i]));
  const atol = atolFrac * max + 1e-6;
  for (let i = 0; i < expected.length; i++) {
    const tol = atol + rtol * Math.abs(expected[i]);
    if (!(Math.abs(actual[i] - expected[i]) <= tol)) {
      assert.fail(`${what}[${i}]: ${actual[i]} vs ${expected[i]} (tolerance ${tol}, max ${max})`);
    }
  }
}

async function checkLayer(
  name: string,
  layer: Module,
  xShape: number[],
  ref: Ref,
  options: { seed?: number; awayFromZero?: number; distinct?: boolean; tol?: number } = {},
) {
  using device = Device.open("cpu");
  layer.to(device);
  const rng = new Xoshiro128(options.seed ?? 7);
  const n = xShape.reduce((a, b) => a * b, 1);
  let xh = randomHalf(n, rng, 1, options.awayFromZero ?? 0);
  if (options.distinct) {
    // Max pooling: distinct values so that a tiny perturbation never changes the argmax.
    const perm = [...Array(n).keys()].sort(() => rng.random() - 0.5);
    xh = Float16Array.from(perm, (p) => (p - n / 2) / 16);
  }
  using x = Tensor.fromHost(device, xh, xShape);
  const params = layer.parameters();
  // What the kernels read: the fp16 copy for fp16 weights, the fp32 master otherwise.
  const p64 = await Promise.all(params.map(async (p) => {
    const v = await p.read();
    return p.half ? Float64Array.from(Float16Array.from(v)) : Float64Array.from(v);
  }));
  const x64 = Float64Array.from(xh);
  const y = layer.forward(x);
  const yRef = ref(x64, p64);
  assertAllClose(await y.toHost(), yRef, `${name} forward`, { atolFrac: 2e-3, rtol: 2e-3 });
  const dyh = randomHalf(y.numel, rng);
  using dy = Tensor.fromHost(device, dyh, [...y.shape]);
  const dy64 = Float64Array.from(dyh);
  const loss = () => {
    const out = ref(x64, p64);
    let s = 0;
    for (let i = 0; i < out.length; i++) s += out[i] * dy64[i];
    return s;
  };
  const dx = layer.backward(dy);
  assert.ok(dx);
  const tol = { atolFrac: options.tol ?? 3e-3, rtol: options.tol ?? 3e-3 };
  assertAllClose(await dx.toHost(), numericGrad(loss, x64), `${name} dx`, tol);
  for (let i = 0; i < params.length; i++) {
    const [pname] = layer.namedParameters()[i];
    const g = await params[i].grad.toHost();
    assertAllClose(g, numericGrad(loss, p64[i]), `${name} d${pname}`, tol);
  }
  layer.dispose();
}

function linearRef(inF: number, outF: number, bias: boolean): Ref {
  return (x, [w, b]) => {
    const n = x.length / inF;
    const y = new Float64Array(n * outF);
    for (let i = 0; i < n; i++) {
      for (let o = 0; o < outF; o++) {
        let s = bias ? b[o] : 0;
        for (let k = 0; k < inF; k++) s += x[i * inF + k] * w[o * inF + k];
        y[i * outF + o] = s;
      }
    }
    return y;
  };
}

function convRef(
  [n, c, h, w]: number[],
  co: number,
  k: number,
  stride: number,
  pad: number,
  bias: boolean,
): Ref {
  const oh = Math.floor((h + 2 * pad - k) / stride) + 1;
  const ow = Math.floor((w + 2 * pad - k) / stride) + 1;
  return (x, [wt, b]) => {
    const y = new Float64Array(n * co * oh * ow);
    for (let i = 0; i < n; i++) {
      for (let o = 0; o < co; o++) {
        for (let yy = 0; yy < oh; yy++) {
          for (let xx = 0; xx < ow; xx++) {
            let s = bias ? b[o] : 0;
            for (let ci = 0; ci < c; ci++) {
              for (let ky = 0; ky < k; ky++) {
                const iy = yy * stride - pad + ky;
                if (iy < 0 || iy >= h) continue;
                for (let kx = 0; kx < k; kx++) {
                  const ix = xx * stride - pad + kx;
                  if (ix < 0 || ix >= w) continue;
                  s += x[((i * c + ci) * h + iy) * w + ix] * wt[((o * c + ci) * k + ky) * k + kx];
                }
              }
            }
            y[((i * co + o) * oh + yy) * ow + xx] = s;
          }
        }
      }
    }
    return y;
  };
}

function bnRef([n, c, h, w]: number[], eps: number): Ref {
  const hw = h * w;
  return (x, [g, b]) => {
    const y = new Float64Array(x.length);
    for (let ch = 0; ch < c; ch++) {
      let mean = 0;
      for (let i = 0; i < n; i++) for (let j = 0; j < hw; j++) mean += x[(i * c + ch) * hw + j];
      mean /= n * hw;
      let v = 0;
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < hw; j++) v += (x[(i * c + ch) * hw + j] - mean) ** 2;
      }
      v /= n * hw;
      const inv = 1 / Math.sqrt(v + eps);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < hw; j++) {
          const at = (i * c + ch) * hw + j;
          y[at] = (x[at] - mean) * inv * g[ch] + b[ch];
        }
      }
    }
    return y;
  };
}

function poolRef([n, c, h, w]: number[], k: number, s: number): Ref {
  const oh = Math.floor((h - k) / s) + 1, ow = Math.floor((w - k) / s) + 1;
  return (x) => {
    const y = new Float64Array(n * c * oh * ow);
    for (let p = 0; p < n * c; p++) {
      for (let yy = 0; yy < oh; yy++) {
        for (let xx = 0; xx < ow; xx++) {
          let m = -Infinity;
          for (let ky = 0; ky < k; ky++) {
            for (let kx = 0; kx < k; kx++) {
              m = Math.max(m, x[p * h * w + (yy * s + ky) * w + xx * s + kx]);
            }
          }
          y[(p * oh + yy) * ow + xx] = m;
        }
      }
    }
    return y;
  };
}

Deno.test("Linear backward matches finite differences (odd sizes, with and without bias)", async () => {
  await checkLayer(
    "Linear(7,5)",
    new Linear(7, 5, { rng: new Xoshiro128(1) }),
    [3, 7],
    linearRef(7, 5, true),
  );
  await checkLayer(
    "Linear(13,3,nobias)",
    new Linear(13, 3, { bias: false, rng: new Xoshiro128(2) }),
    [5, 13],
    linearRef(13, 3, false),
  );
});

Deno.test("Conv2d backward matches finite differences (3x3 pad 1, 3x3 stride 2, 1x1)", async () => {
  const cases: [number[], number, number, number, number, boolean][] = [
    [[2, 3, 5, 6], 4, 3, 1, 1, true],
    [[2, 2, 7, 5], 3, 3, 2, 0, true],
    [[3, 5, 3, 4], 2, 1, 1, 0, false],
  ];
  for (const [shape, co, k, stride, pad, bias] of cases) {
    const conv = new Conv2d(shape[1], co, {
      kernelSize: k,
      stride,
      padding: pad,
      bias,
      rng: new Xoshiro128(3),
    });
    await checkLayer(
      `Conv2d(${shape[1]},${co},k${k},s${stride},p${pad})`,
      conv,
      shape,
      convRef(shape, co, k, stride, pad, bias),
    );
  }
});

Deno.test("BatchNorm2d training backward matches finite differences", async () => {
  const bn = new BatchNorm2d(3);
  // Non-trivial affine parameters so dgamma and dbeta are exercised.
  bn.weight.write(new Float32Array([0.5, 1.5, -1]));
  bn.bias.write(new Float32Array([0.1, -0.2, 0.3]));
  await checkLayer("BatchNorm2d(3)", bn, [4, 3, 3, 2], bnRef([4, 3, 3, 2], 1e-5), { tol: 1e-2 });
});

Deno.test("ReLU backward matches finite differences", async () => {
  await checkLayer("ReLU", new ReLU(), [3, 11], (x) => x.map((v) => Math.max(0, v)), {
    awayFromZero: 0.05,
  });
});

Deno.test("MaxPool2d backward matches finite differences (2x2, and 3x3 stride 2)", async () => {
  await checkLayer("MaxPool2d(2)", new MaxPool2d(2), [2, 3, 4, 6], poolRef([2, 3, 4, 6], 2, 2), {
    distinct: true,
  });
  await checkLayer(
    "MaxPool2d(3,s2)",
    new MaxPool2d(3, { stride: 2 }),
    [1, 2, 7, 7],
    poolRef([1, 2, 7, 7], 3, 2),
    { distinct: true },
  );
});

Deno.test("Sequential conv-BN-ReLU-pool-flatten-linear backward matches finite differences", async () => {
  const rng = new Xoshiro128(11);
  const model = new Sequential([
    // No conv bias: batch norm cancels it (its true gradient is 0, so only fp16 noise is left).
    new Conv2d(2, 3, { kernelSize: 3, padding: 1, bias: false, rng }),
    new BatchNorm2d(3),
    new ReLU(),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(3 * 2 * 2, 4, { rng }),
  ]);
  const conv = convRef([3, 2, 4, 4], 3, 3, 1, 1, false);
  const bn = bnRef([3, 3, 4, 4], 1e-5);
  const pool = poolRef([3, 3, 4, 4], 2, 2);
  const fc = linearRef(12, 4, true);
  const ref: Ref = (x, [cw, g, b, lw, lb]) =>
    fc(pool(bn(conv(x, [cw]), [g, b]).map((v) => Math.max(0, v)), []), [lw, lb]);
  await checkLayer("Sequential", model, [3, 2, 4, 4], ref, { tol: 2e-2 });
});

Deno.test("BatchNorm2d updates running statistics like PyTorch (unbiased variance)", async () => {
  using device = Device.open("cpu");
  using bn = new BatchNorm2d(1, { momentum: 0.5 }).to(device);
  using x = Tensor.fromHost(device, new Float16Array([1, 2, 3, 4]), [4, 1, 1, 1]);
  bn.forward(x);
  // mean 2.5, unbiased var 5/3: running = 0.5 * old + 0.5 * batch
  assertClose((await bn.runningMean.read())[0], 1.25, 1e-6, 1e-5, "running_mean");
  assertClose((await bn.runningVar.read())[0], 0.5 + 0.5 * 5 / 3, 1e-6, 1e-4, "running_var");
  assert.strictEqual(bn.numBatchesTracked, 1);
  bn.eval();
  const y = await bn.forward(x).toHost();
  const inv = 1 / Math.sqrt(0.5 + 0.5 * 5 / 3 + 1e-5);
  assertAllClose(y, [1, 2, 3, 4].map((v) => (v - 1.25) * inv), "eval forward");
});

Deno.test("layers use PyTorch's default initialization bounds", () => {
  const fc = new Linear(50, 20, { rng: new Xoshiro128(4) });
  const conv = new Conv2d(3, 8, { kernelSize: 3, rng: new Xoshiro128(5) });
  const bn = new BatchNorm2d(4);
  return (async () => {
    const within = (a: Float32Array, b: number) => a.every((v) => Math.abs(v) <= b);
    assert.ok(within(await fc.weight.read(), 1 / Math.sqrt(50)));
    assert.ok(within(await fc.bias!.read(), 1 / Math.sqrt(50)));
    assert.ok(within(await conv.weight.read(), 1 / Math.sqrt(27)));
    assert.deepStrictEqual([...await bn.weight.read()], [1, 1, 1, 1]);
    assert.deepStrictEqual([...await bn.bias.read()], [0, 0, 0, 0]);
    assert.deepStrictEqual([...await bn.runningVar.read()], [1, 1, 1, 1]);
  })();
});

Deno.test("CrossEntropyLoss gradient is scale * (softmax - onehot) / N, stats on the device", async () => {
  using device = Device.open("cpu");
  using loss = new CrossEntropyLoss(device);
  const rng = new Xoshiro128(9);
  const n = 5, k = 7;
  const lh = randomHalf(n * k, rng, 2);
  const labels = Int32Array.from({ length: n }, (_, i) => (i * 3) % k);
  using logits = Tensor.fromHost(device, lh, [n, k]);
  using y = Tensor.fromHost(device, labels, [n]);
  const d = await loss.forwardBackward(logits, y).toHost();
  const expected = new Float64Array(n * k);
  let total = 0, correct = 0;
  for (let i = 0; i < n; i++) {
    const row = [...lh.subarray(i * k, i * k + k)];
    const m = Math.max(...row);
    const z = row.reduce((a, v) => a + Math.exp(v - m), 0);
    total += Math.log(z) + m - row[labels[i]];
    if (row.indexOf(m) === labels[i]) correct++;
    for (let j = 0; j < k; j++) {
      expected[i * k + j] = (Math.exp(row[j] - m) / z - (j === labels[i] ? 1 : 0)) / n;
    }
  }
  assertAllClose(d, expected, "dlogits");
  const s = await loss.read();
  assertClose(s.loss, total / n, 1e-4, 1e-3, "mean loss");
  assert.strictEqual(s.accuracy, correct / n);
  assert.strictEqual((await loss.read()).samples, 0);
});

// ---- SGD vs torch.optim.SGD's formula -------------------------------------------------------

/** torch.optim.SGD (1.13, single tensor, foreach=False), in fp32 arithmetic like the kernel. */
function sgdReference(
  p: Float32Array,
  grads: Float32Array[],
  o: { lr: number; momentum: number; dampening: number; nesterov: boolean; weightDecay: number },
): Float32Array {
  const f = Math.fround;
  const param = p.slice();
  let buf: Float32Array | null = null;
  for (const g of grads) {
    const d = new Float32Array(param.length);
    for (let i = 0; i < d.length; i++) {
      d[i] = o.weightDecay ? f(g[i] + f(o.weightDecay * param[i])) : g[i];
    }
    if (o.momentum !== 0) {
      if (buf === null) buf = d.slice();
      else {
        for (let i = 0; i < d.length; i++) {
          buf[i] = f(f(o.momentum * buf[i]) + f(f(1 - o.dampening) * d[i]));
        }
      }
      for (let i = 0; i < d.length; i++) {
        d[i] = o.nesterov ? f(d[i] + f(o.momentum * buf[i])) : buf[i];
      }
    }
    for (let i = 0; i < d.length; i++) param[i] = f(param[i] - f(o.lr * d[i]));
  }
  return param;
}

Deno.test("SGD matches torch.optim.SGD's update over several steps, every option", async () => {
  using device = Device.open("cpu");
  const rng = new Xoshiro128(21);
  const configs = [
    { lr: 0.1, momentum: 0, dampening: 0, nesterov: false, weightDecay: 0 },
    { lr: 0.05, momentum: 0.9, dampening: 0, nesterov: false, weightDecay: 0 },
    { lr: 0.05, momentum: 0.9, dampening: 0.1, nesterov: false, weightDecay: 1e-2 },
    { lr: 0.02, momentum: 0.8, dampening: 0, nesterov: true, weightDecay: 5e-4 },
  ];
  for (const cfg of configs) {
    const init = Float32Array.from({ length: 37 }, () => randn(rng));
    const grads = [0, 1, 2, 3].map(() => Float32Array.from({ length: 37 }, () => randn(rng)));
    const p = new Parameter(init, [37], { gradDtype: "f32" }).to(device);
    using opt = new SGD([p], cfg);
    for (const g of grads) {
      p.grad.buffer.copyFrom(g);
      opt.step();
    }
    const expected = sgdReference(init, grads, cfg);
    const got = await p.master.toHost() as Float32Array;
    assertAllClose(got, expected, `SGD ${JSON.stringify(cfg)}`, { atolFrac: 1e-6, rtol: 1e-6 });
    // The fp16 copy the forward reads is the rounded master weight.
    assert.deepStrictEqual([...await p.half!.toHost()], [...Float16Array.from(got)]);
    assert.strictEqual((await opt.stateDict()).stepsDone, 4);
    p.dispose();
  }
});

Deno.test("SGD refuses PyTorch's invalid hyper-parameters", () => {
  using device = Device.open("cpu");
  const p = new Parameter(new Float32Array(1), [1]).to(device);
  assert.throws(() => new SGD([p], { lr: -1 }), /invalid learning rate -1/);
  assert.throws(() => new SGD([p], { lr: 0.1, nesterov: true }), /Nesterov/);
  assert.throws(
    () => new SGD([p], { lr: 0.1, momentum: 0.9, nesterov: true, dampening: 0.1 }),
    /Nesterov/,
  );
  assert.throws(() => new SGD([], { lr: 0.1 }), /empty parameter list/);
  p.dispose();
});

// ---- GradScaler -----------------------------------------------------------------------------

/** torch.cuda.amp.GradScaler's scale bookkeeping (_amp_update_scale_), as a reference. */
class ScalerReference {
  scale: number;
  tracker = 0;
  constructor(
    init: number,
    readonly growth: number,
    readonly backoff: number,
    readonly interval: number,
  ) {
    this.scale = init;
  }
  update(foundInf: boolean) {
    if (foundInf) {
      this.scale = Math.fround(this.scale * this.backoff);
      this.tracker = 0;
    } else if (++this.tracker === this.interval) {
      const s = Math.fround(this.scale * this.growth);
      if (Number.isFinite(s)) this.scale = s;
      this.tracker = 0;
    }
  }
}

Deno.test("GradScaler has PyTorch's defaults", async () => {
  using device = Device.open("cpu");
  using s = new GradScaler(device);
  const st = await s.stateDict();
  assert.deepStrictEqual(st, {
    scale: 65536,
    growth_factor: 2,
    backoff_factor: 0.5,
    growth_interval: 2000,
    _growth_tracker: 0,
  });
});

Deno.test("GradScaler grows, backs off and skips steps on injected inf/NaN like PyTorch", async () => {
  using device = Device.open("cpu");
  const a = new Parameter(new Float32Array([1, 2]), [2], { gradDtype: "f32" }).to(device);
  const b = new Parameter(new Float32Array([3]), [1], { gradDtype: "f32" }).to(device);
  using opt = new SGD([a, b], { lr: 0.5, momentum: 0.9 });
  using scaler = new GradScaler(device, { initScale: 8, growthInterval: 3 });
  const ref = new ScalerReference(8, 2, 0.5, 3);
  // Per step: which gradient value to inject into b (a's gradient is always finite).
  const plan = [1, 1, 1, 1, Infinity, 1, NaN, 1, 1, 1, 1, -Infinity, 1];
  let expectA: Float32Array = Float32Array.from([1, 2]);
  let expectB: Float32Array = Float32Array.from([3]);
  const gradsA: Float32Array[] = [], gradsB: Float32Array[] = [];
  for (const [step, inject] of plan.entries()) {
    const scale = ref.scale;
    // Gradients as backward would leave them: scaled by the current scale.
    a.grad.buffer.copyFrom(new Float32Array([0.25 * scale, -0.5 * scale]));
    b.grad.buffer.copyFrom(new Float32Array([inject * scale]));
    const finite = Number.isFinite(inject);
    scaler.step(opt);
    scaler.update();
    ref.update(!finite);
    if (finite) {
      // PyTorch runs optimizer.step() only on finite steps; skipped ones leave no trace.
      gradsA.push(new Float32Array([0.25, -0.5]));
      gradsB.push(new Float32Array([inject]));
      const cfg = { lr: 0.5, momentum: 0.9, dampening: 0, nesterov: false, weightDecay: 0 };
      expectA = sgdReference(new Float32Array([1, 2]), gradsA, cfg);
      expectB = sgdReference(new Float32Array([3]), gradsB, cfg);
    }
    assert.strictEqual(await scaler.getScale(), ref.scale, `scale after step ${step}`);
    assert.strictEqual((await scaler.stateDict())._growth_tracker, ref.tracker, `tracker ${step}`);
    assertAllClose(await a.master.toHost(), expectA, `a after step ${step}`, {
      atolFrac: 0,
      rtol: 1e-6,
    });
    assertAllClose(await b.master.toHost(), expectB, `b after step ${step}`, {
      atolFrac: 0,
      rtol: 1e-6,
    });
  }
  assert.strictEqual((await opt.stateDict()).stepsDone, plan.filter(Number.isFinite).length);
  a.dispose();
  b.dispose();
});

Deno.test("a skipped first step leaves PyTorch's first-step momentum init for the next one", async () => {
  using device = Device.open("cpu");
  const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
  using opt = new SGD([p], { lr: 1, momentum: 0.9, dampening: 0.5 });
  using scaler = new GradScaler(device, { initScale: 4 });
  p.grad.buffer.copyFrom(new Float32Array([Infinity]));
  scaler.step(opt);
  scaler.update();
  p.grad.buffer.copyFrom(new Float32Array([2 * 0.1])); // scale is now 2: unscaled grad 0.1
  scaler.step(opt);
  scaler.update();
  // First real step: buf = g (not (1 - dampening) * g), p = 1 - 0.1.
  assertClose((await p.master.toHost())[0], 0.9, 0, 1e-6, "param");
  p.dispose();
});

Deno.test("GradScaler.unscale_ unscales in place and step() then does not unscale again", async () => {
  using device = Device.open("cpu");
  const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
  using opt = new SGD([p], { lr: 1 });
  using scaler = new GradScaler(device, { initScale: 16 });
  p.grad.buffer.copyFrom(new Float32Array([16 * 0.25]));
  scaler.unscale_(opt);
  assert.deepStrictEqual([...await p.grad.toHost()], [0.25]);
  assert.throws(() => scaler.unscale_(opt), /already called/);
  scaler.step(opt);
  scaler.update();
  assert.deepStrictEqual([...await p.master.toHost()], [0.75]);
  p.dispose();
});

Deno.test("the loss gradient follows the device's scale even when the host's copy is stale", async () => {
  using device = Device.open("cpu");
  const p = new Parameter(new Float32Array([0]), [1], { gradDtype: "f32" }).to(device);
  using opt = new SGD([p], { lr: 0 });
  using scaler = new GradScaler(device, { initScale: 4, growthInterval: 1 });
  using loss = new CrossEntropyLoss(device);
  using logits = Tensor.fromHost(device, new Float16Array([0, 0]), [1, 2]);
  using labels = Tensor.fromHost(device, new Int32Array([0]), [1]);
  p.grad.buffer.copyFrom(new Float32Array([1]));
  scaler.step(opt);
  scaler.update(); // device scale 8, host still believes 4 (nothing was read)
  assert.strictEqual(scaler.lossScale(), 4);
  const d = await loss.forwardBackward(logits, labels, scaler).toHost();
  assert.deepStrictEqual([...d], [8 * -0.5, 8 * 0.5]);
  assert.strictEqual(await scaler.getScale(), 8);
  assert.strictEqual(scaler.lossScale(), 8);
  p.dispose();
});

Deno.test("a scale the device backed off from is not used for the loss gradient (no fp16 overflow)", async () => {
  // Two overflowing steps halve the device scale twice, 2^17 -> 2^15, while the host still
  // holds 2^17. The gradient of one confident-but-wrong sample is about -1 per unit scale:
  // at 2^17 it overflows fp16 (max 65504), at the device's 2^15 it does not.
  using device = Device.open("cpu");
  const p = new Parameter(new Float32Array([0]), [1], { gradDtype: "f32" }).to(device);
  using opt = new SGD([p], { lr: 0 });
  using scaler = new GradScaler(device, { initScale: 2 ** 17 });
  using loss = new CrossEntropyLoss(device);
  for (let i = 0; i < 2; i++) {
    p.grad.buffer.copyFrom(new Float32Array([Infinity]));
    scaler.step(opt);
    scaler.update();
  }
  assert.strictEqual(scaler.lossScale(), 2 ** 17, "the host's copy is stale");
  using logits = Tensor.fromHost(device, new Float16Array([0, 12]), [1, 2]);
  using labels = Tensor.fromHost(device, new Int32Array([0]), [1]);
  const d = [...await loss.forwardBackward(logits, labels, scaler).toHost()];
  assert.ok(d.every(Number.isFinite), `gradient ${d}`);
  const p0 = 1 / (1 + Math.exp(12));
  assertClose(d[0], 2 ** 15 * (p0 - 1), 32, 0, "dlogits[0]");
  assert.strictEqual(await scaler.getScale(), 2 ** 15);
  p.dispose();
});

Deno.test("a disabled GradScaler is a pass-through", async () => {
  using device = Device.open("cpu");
  const p = new Parameter(new Float32Array([1]), [1], { gradDtype: "f32" }).to(device);
  using opt = new SGD([p], { lr: 1 });
  using scaler = new GradScaler(device, { enabled: false });
  p.grad.buffer.copyFrom(new Float32Array([0.5]));
  scaler.step(opt);
  scaler.update();
  assert.strictEqual(await scaler.getScale(), 1);
  assert.deepStrictEqual([...await p.master.toHost()], [0.5]);
  p.dispose();
});

// ---- checkpoints ----------------------------------------------------------------------------

async function snapshot(model: Module): Promise<number[][]> {
  const out: number[][] = [];
  for (const [, t] of await model.stateDict()) {
    out.push(Array.from(t.data as ArrayLike<number | bigint>, Number));
  }
  return out;
}

Deno.test("checkpoint save, load and resume give the same next step, bit for bit", async () => {
  using device = Device.open("cpu");
  const rng = new Xoshiro128(3);
  const batches = [0, 1, 2, 3, 4].map(() => ({
    x: randomHalf(6 * 64, rng),
    y: Int32Array.from({ length: 6 }, () => rng.nextU32() % 3),
  }));
  using x = Tensor.empty(device, [6, 1, 8, 8], "f16");
  using y = Tensor.empty(device, [6], "i32");
  const build = (seed: number) => {
    const model = smallCnn(seed).to(device);
    const optimizer = new SGD(model.parameters(), {
      lr: 0.1,
      momentum: 0.9,
      nesterov: true,
      weightDecay: 1e-3,
    });
    const scaler = new GradScaler(device, { initScale: 1024, growthInterval: 2 });
    const scheduler = new OneCycleLR(optimizer, { maxLr: 0.2, totalSteps: 10 });
    const trainer = new Trainer(model, { optimizer, scaler, scheduler });
    const step = (i: number) => {
      x.buffer.copyFrom(batches[i].x);
      y.buffer.copyFrom(batches[i].y);
      trainer.trainStep(x, y);
    };
    const dispose = () => {
      trainer.dispose();
      scaler.dispose();
      optimizer.dispose();
      model.dispose();
    };
    return { model, optimizer, scaler, scheduler, step, dispose };
  };
  const dir = await Deno.makeTempDir();
  const path = `${dir}/net.safetensors`;
  // Run A: 3 steps, checkpoint, 2 more steps.
  const a = build(1);
  for (let i = 0; i < 3; i++) a.step(i);
  const parts = (r: typeof a) => ({
    model: r.model,
    optimizer: r.optimizer,
    scaler: r.scaler,
    scheduler: r.scheduler,
  });
  await saveCheckpoint(path, parts(a), { epoch: 1, step: 3, extra: { note: "test" } });
  a.step(3);
  a.step(4);
  const after = await snapshot(a.model);
  const aScale = await a.scaler.getScale();
  // Run B: a differently initialized model restored from the checkpoint, same 2 steps.
  const b = build(99);
  const progress = await loadCheckpoint(path, parts(b));
  assert.deepStrictEqual(progress, { epoch: 1, step: 3, extra: { note: "test" } });
  b.step(3);
  b.step(4);
  assert.deepStrictEqual(await snapshot(b.model), after);
  assert.strictEqual(await b.scaler.getScale(), aScale);
  assert.strictEqual(b.optimizer.lr, a.optimizer.lr);
  assert.strictEqual(b.optimizer.momentum, a.optimizer.momentum);
  // The weights file is plain safetensors with PyTorch's names.
  const w = decodeSafetensors(await Deno.readFile(path));
  assert.deepStrictEqual([...w.tensors.keys()], [
    "0.weight",
    "0.bias",
    "1.weight",
    "1.bias",
    "1.running_mean",
    "1.running_var",
    "1.num_batches_tracked",
    "5.weight",
    "5.bias",
  ]);
  assert.strictEqual(w.metadata.format, "pt");
  assert.deepStrictEqual(w.tensors.get("0.weight")!.shape, [4, 1, 3, 3]);
  assert.strictEqual((w.tensors.get("1.num_batches_tracked")!.data as BigInt64Array)[0], 3n);
  a.dispose();
  b.dispose();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("loadStateDict refuses mismatched shapes and, strictly, missing or extra keys", async () => {
  const m = new Linear(3, 2);
  const state = await m.stateDict();
  const bad = new Map(state);
  bad.set("weight", { dtype: "F32", shape: [3, 2], data: new Float32Array(6) });
  assert.throws(() => new Linear(3, 2).loadStateDict(bad), /shape \[3,2\]/);
  const extra = new Map(state);
  extra.set("junk", { dtype: "F32", shape: [1], data: new Float32Array(1) });
  assert.throws(() => new Linear(3, 2).loadStateDict(extra), /unexpected keys \[junk\]/);
  new Linear(3, 2).loadStateDict(extra, { strict: false });
  const missing = new Map(state);
  missing.delete("bias");
  assert.throws(() => new Linear(3, 2).loadStateDict(missing), /missing keys \[bias\]/);
});

Deno.test("a weights-only safetensors file (as PyTorch would export) loads into a model", async () => {
  using device = Device.open("cpu");
  const dir = await Deno.makeTempDir();
  const path = `${dir}/w.safetensors`;
  // Written by hand, fp16 and in another order than the module's, no state file next to it.
  await Deno.writeFile(
    path,
    encodeSafetensors({
      bias: { dtype: "F16", shape: [2], data: new Float16Array([0.5, -0.5]) },
      weight: { dtype: "F32", shape: [2, 3], data: new Float32Array([1, 2, 3, 4, 5, 6]) },
    }),
  );
  using fc = new Linear(3, 2).to(device);
  assert.deepStrictEqual(await loadCheckpoint(path, { model: fc }), { epoch: 0, step: 0 });
  assert.deepStrictEqual([...await fc.weight.read()], [1, 2, 3, 4, 5, 6]);
  assert.deepStrictEqual([...await fc.bias!.read()], [0.5, -0.5]);
  // The fp16 compute copy follows the loaded master weights.
  assert.deepStrictEqual([...await fc.weight.half!.toHost()], [1, 2, 3, 4, 5, 6]);
  // Restoring an optimizer needs the state file.
  using opt = new SGD(fc.parameters(), { lr: 0.1 });
  await assert.rejects(loadCheckpoint(path, { model: fc, optimizer: opt }), Deno.errors.NotFound);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("GradScaler state round-trips with PyTorch's keys", async () => {
  using device = Device.open("cpu");
  using a = new GradScaler(device, { initScale: 256, growthInterval: 5 });
  a.loadStateDict({
    scale: 1024,
    growth_factor: 2,
    backoff_factor: 0.5,
    growth_interval: 5,
    _growth_tracker: 3,
  });
  assert.strictEqual(a.lossScale(), 1024);
  using b = new GradScaler(device, { growthInterval: 5 });
  b.loadStateDict(await a.stateDict());
  assert.deepStrictEqual(await b.stateDict(), await a.stateDict());
});

Deno.test("Trainer steps an epoch-interval scheduler only at endEpoch", async () => {
  using device = Device.open("cpu");
  using model = new Linear(2, 2).to(device);
  using opt = new SGD(model.parameters(), { lr: 1 });
  const scheduler = new StepLR(opt, { stepSize: 1, gamma: 0.5 });
  using trainer = new Trainer(model, { optimizer: opt, scheduler, schedulerInterval: "epoch" });
  using x = Tensor.fromHost(device, new Float16Array([1, 0, 0, 1]), [2, 2]);
  using y = Tensor.fromHost(device, new Int32Array([0, 1]), [2]);
  trainer.trainStep(x, y);
  trainer.trainStep(x, y);
  assert.strictEqual(opt.lr, 1);
  trainer.endEpoch();
  assert.strictEqual(opt.lr, 0.5);
  assert.strictEqual((await trainer.readTrain()).samples, 4);
});
