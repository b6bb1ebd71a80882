// Tests of nn/: layers (backward vs finite differences on the CPU backend), the optimizer
// (vs a TypeScript transcription of torch.optim.SGD), GradScaler, LR schedulers (vs values
// printed by PyTorch 1.13), safetensors and checkpoint resume.
import assert from "node:assert";
import { decodeSafetensors, encodeSafetensors } from "../nn/safetensors.ts";
import { CosineAnnealingLR, LinearLR, OneCycleLR, StepLR } from "../nn/lr_scheduler.ts";
import { kaimingUniform, Xoshiro128 } from "../nn/init.ts";

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
