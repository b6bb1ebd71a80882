// Scale (a fixed factor on a layer's output) on both backends, and cifarModel's logit scale.
import assert from "node:assert";
import { Tensor } from "../ffi/tensor.ts";
import { Linear, Scale, type Sequential } from "../nn/mod.ts";
import { CIFAR_LOGIT_SCALE, cifarModel } from "../train/models.ts";
import { testEachBackend } from "./_backends.ts";

/** The factor in the dtype, the product in fp32, rounded once to the dtype (mul's rule). */
function expected(x: ArrayLike<number>, factor: number, dtype: "f16" | "f32"): number[] {
  const f32 = dtype === "f16" ? new Float16Array([factor])[0] : Math.fround(factor);
  return Array.from(x, (v) => {
    const p = Math.fround(Math.fround(v) * f32);
    return dtype === "f16" ? new Float16Array([p])[0] : p;
  });
}

for (const dtype of ["f16", "f32"] as const) {
  testEachBackend(`Scale forward and backward, ${dtype}`, async (device) => {
    const Host = dtype === "f16" ? Float16Array : Float32Array;
    for (const factor of [0.125, 0.3, -2.5]) {
      using scale = new Scale(factor).to(device);
      // Two shapes in turn (a full and a partial batch), then the first again: each shape's
      // factor tensor is filled once and reused.
      for (const n of [4, 3, 4]) {
        const xs = new Host(Array.from({ length: n * 5 }, (_, i) => (i - 7) * 0.731));
        using x = Tensor.fromHost(device, xs, [n, 5]);
        const y = scale.forward(x);
        assert.deepStrictEqual(y.shape, [n, 5]);
        assert.strictEqual(y.dtype, dtype);
        assert.deepStrictEqual([...await y.toHost()], expected(xs, factor, dtype), `y ${factor}`);
        const dys = new Host(Array.from({ length: n * 5 }, (_, i) => 1 - i * 0.37));
        using dy = Tensor.fromHost(device, dys, [n, 5]);
        const dx = scale.backward(dy)!;
        assert.deepStrictEqual([...await dx.toHost()], expected(dys, factor, dtype), `dx ${n}`);
        assert.strictEqual(scale.backward(dy, { inputGrad: false }), null);
      }
    }
  });
}

testEachBackend("Scale refuses a backward without a training forward", (device) => {
  using scale = new Scale(2).to(device);
  using x = Tensor.fromHost(device, new Float16Array([1, 2]), [1, 2]);
  scale.eval();
  scale.forward(x);
  assert.throws(() => scale.backward(x), /Cannot run Scale.backward: no training forward/);
});

Deno.test("Scale refuses a factor that is not a finite number", () => {
  for (const bad of [NaN, Infinity, "2" as unknown as number]) {
    assert.throws(() => new Scale(bad), /Cannot create Scale: factor must be a finite number/);
  }
});

Deno.test("cifarModel ends with the logit scale, or without it for logitScale 1", () => {
  const last = (m: Sequential) => m.layers.at(-1);
  const scaled = cifarModel(0) as Sequential;
  const s = last(scaled);
  assert.ok(s instanceof Scale);
  assert.strictEqual(s.factor, CIFAR_LOGIT_SCALE);
  const plain = cifarModel(0, { logitScale: 1 }) as Sequential;
  assert.ok(last(plain) instanceof Linear);
  // A parameter-free layer at the end: the same parameter names, so checkpoints of either load
  // into the other.
  assert.deepStrictEqual(
    scaled.namedParameters().map(([n]) => n),
    plain.namedParameters().map(([n]) => n),
  );
  assert.throws(
    () => cifarModel(0, { logitscale: 1 } as never),
    /logitscale.*did you mean "logitScale"/s,
  );
});
