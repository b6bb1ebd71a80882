/**
 * A model's precision (Module.to(device, { precision })): an "fp32" model computes its
 * forward and backward in fp32 (checked against float64 with tolerances fp16 cannot meet),
 * keeps no fp16 copies, refuses f16 inputs with a clear error, and shares checkpoints with
 * "fp16" models. On each backend.
 */

import assert from "node:assert";
import { full, Tensor } from "../mod.ts";
import { CrossEntropyLoss, Linear, ReLU, Sequential, SGD } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { testEachBackend } from "./_backends.ts";
import { assertClose, gen, randF, smallCnn } from "./_nn_reference.ts";

/** Linear(5, 7) -> ReLU -> Linear(7, 3), the float64 forward and backward of it. */
function refMlp(
  x: Float32Array,
  w1: Float32Array,
  b1: Float32Array,
  w2: Float32Array,
  b2: Float32Array,
  dy: Float32Array,
  n: number,
): { y: Float64Array; dw1: Float64Array; dw2: Float64Array; db1: Float64Array } {
  const h = new Float64Array(n * 7), y = new Float64Array(n * 3);
  for (let i = 0; i < n; i++) {
    for (let o = 0; o < 7; o++) {
      let s = b1[o];
      for (let k = 0; k < 5; k++) s += x[i * 5 + k] * w1[o * 5 + k];
      h[i * 7 + o] = Math.max(0, s);
    }
    for (let o = 0; o < 3; o++) {
      let s = b2[o];
      for (let k = 0; k < 7; k++) s += h[i * 7 + k] * w2[o * 7 + k];
      y[i * 3 + o] = s;
    }
  }
  const dw2 = new Float64Array(21), dh = new Float64Array(n * 7);
  const dw1 = new Float64Array(35), db1 = new Float64Array(7);
  for (let i = 0; i < n; i++) {
    for (let o = 0; o < 3; o++) {
      for (let k = 0; k < 7; k++) {
        dw2[o * 7 + k] += dy[i * 3 + o] * h[i * 7 + k];
        dh[i * 7 + k] += dy[i * 3 + o] * w2[o * 7 + k];
      }
    }
    for (let o = 0; o < 7; o++) {
      const g = h[i * 7 + o] > 0 ? dh[i * 7 + o] : 0;
      db1[o] += g;
      for (let k = 0; k < 5; k++) dw1[o * 5 + k] += g * x[i * 5 + k];
    }
  }
  return { y, dw1, dw2, db1 };
}

testEachBackend(
  "an fp32 model's forward and backward match float64 beyond fp16 accuracy",
  async (dev) => {
    const r = gen("precision-mlp");
    const n = 9;
    const fc1 = new Linear(5, 7), fc2 = new Linear(7, 3);
    using model = new Sequential([fc1, new ReLU(), fc2]).to(dev, { precision: "fp32" });
    const [w1, b1, w2, b2] = [randF(r, 35), randF(r, 7), randF(r, 21), randF(r, 3)];
    fc1.weight.write(w1), fc1.bias!.write(b1), fc2.weight.write(w2), fc2.bias!.write(b2);
    const x = randF(r, n * 5, -3, 3), dy = randF(r, n * 3);
    const ref = refMlp(x, w1, b1, w2, b2, dy, n);
    using tx = Tensor.fromHost(dev, x, [n, 5]);
    using tdy = Tensor.fromHost(dev, dy, [n, 3]);
    const y = model.forward(tx);
    assert.strictEqual(y.dtype, "f32");
    model.backward(tdy, { inputGrad: false });
    // fp16 activations would be off by ~1e-3 here; fp32 by ~1e-6.
    assertClose([...await y.toHost()], ref.y, 1e-5, 1e-5, "fp32 MLP forward");
    assertClose(await fc2.weight.grad.toHost(), ref.dw2, 1e-5, 1e-5, "fp32 MLP dW2");
    assertClose(await fc1.weight.grad.toHost(), ref.dw1, 1e-5, 1e-5, "fp32 MLP dW1");
    assertClose(await fc1.bias!.grad.toHost(), ref.db1, 1e-5, 1e-5, "fp32 MLP db1");
  },
);

testEachBackend("an fp32 model keeps no fp16 copies and its gradients are f32", (dev) => {
  using fp32 = smallCnn(1).to(dev, { precision: "fp32" });
  using fp16 = smallCnn(1).to(dev);
  assert.strictEqual(fp32.precision, "fp32");
  assert.strictEqual(fp16.precision, "fp16");
  for (const [name, p] of fp32.namedParameters()) {
    assert.strictEqual(p.half, null, `${name} has an fp16 copy`);
    assert.strictEqual(p.value.dtype, "f32", name);
    assert.strictEqual(p.grad.dtype, "f32", name);
  }
  const halves = fp16.parameters().filter((p) => p.half !== null).length;
  assert.strictEqual(halves, 2, "the fp16 model reads its conv and linear weights in fp16");
});

testEachBackend("a model refuses inputs of the other precision, saying what to do", (dev) => {
  using fp32 = smallCnn(1).to(dev, { precision: "fp32" });
  using fp16 = smallCnn(1).to(dev);
  using x16 = Tensor.empty(dev, [2, 1, 8, 8], "f16");
  using x32 = Tensor.empty(dev, [2, 1, 8, 8], "f32");
  assert.throws(
    () => fp32.forward(x16),
    /Conv2d\(1, 4\): the input is f16 but the layer computes in fp32; give it f32 inputs \(a DevicePrefetcher with dtype "f32"\)/,
  );
  assert.throws(() => fp16.forward(x32), /the input is f32 but the layer computes in fp16/);
});

testEachBackend("to() checks the precision and never changes it afterwards", (dev) => {
  using model = smallCnn(2);
  assert.throws(
    () => model.to(dev, { precision: "fp8" as "fp16" }),
    /precision must be "fp16", "bf16" or "fp32", got "fp8"/,
  );
  assert.throws(
    () => model.to(dev, { precison: "fp32" } as unknown as { precision: "fp32" }),
    /precison/,
  );
  model.to(dev, { precision: "fp32" });
  model.to(dev, { precision: "fp32" }); // the same again: a no-op
  assert.throws(() => model.to(dev), /already on .* in fp32 \(a model.s precision is chosen once/);
  assert.strictEqual(model.precision, "fp32");
});

testEachBackend(
  "fp16 and fp32 models trade state dicts and agree to fp16 accuracy",
  async (dev) => {
    const r = gen("precision-state");
    using a = smallCnn(3).to(dev);
    using b = smallCnn(4).to(dev, { precision: "fp32" });
    b.loadStateDict(await a.stateDict());
    a.eval(), b.eval();
    const x = randF(r, 2 * 64, 0, 1);
    using x16 = Tensor.fromHost(dev, Float16Array.from(x), [2, 1, 8, 8]);
    using x32 = Tensor.fromHost(dev, Float32Array.from(Float16Array.from(x)), [2, 1, 8, 8]);
    const ya = [...await a.forward(x16).toHost()], yb = [...await b.forward(x32).toHost()];
    assertClose(ya, yb, 1e-2, 1e-2, "fp16 vs fp32 model on the same weights");
    // and back: the fp32 model's state loads into an fp16 one bit for bit
    using c = smallCnn(5).to(dev);
    c.loadStateDict(await b.stateDict());
    for (const [[name, p], [, q]] of zip(a.namedParameters(), c.namedParameters())) {
      assert.deepStrictEqual(await p.read(), await q.read(), name);
    }
  },
);

function zip<A, B>(a: A[], b: B[]): [A, B][] {
  return a.map((v, i) => [v, b[i]]);
}

testEachBackend("a Trainer trains an fp32 model without a scaler", async (dev) => {
  const r = gen("precision-train");
  using model = smallCnn(6).to(dev, { precision: "fp32" });
  const optimizer = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
  const trainer = new Trainer(model, { optimizer });
  // Three separable classes: the mean brightness of the image picks the label.
  const n = 24, x = new Float32Array(n * 64), labels = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    labels[i] = i % 3;
    for (let j = 0; j < 64; j++) x[i * 64 + j] = labels[i] - 1 + 0.3 * (r() - 0.5);
  }
  using tx = Tensor.fromHost(dev, x, [n, 1, 8, 8]);
  using tl = Tensor.fromHost(dev, labels);
  const loss = new CrossEntropyLoss(dev);
  const first = await lossOf(model, loss, tx, tl);
  for (let step = 0; step < 30; step++) trainer.trainStep(tx, tl);
  const last = await lossOf(model, loss, tx, tl);
  assert.ok(last < first / 4, `loss ${first} -> ${last}`);
  loss.dispose();
});

async function lossOf(
  model: Sequential,
  loss: CrossEntropyLoss,
  x: Tensor,
  labels: Tensor,
): Promise<number> {
  model.eval();
  loss.forward(model.forward(x), labels);
  const stats = await loss.read();
  model.train();
  return stats.loss;
}

testEachBackend(
  "an fp32 step needs about twice the activation memory of an fp16 one",
  async (dev) => {
    // Device.maxMemoryAllocated counts every tensor: the activations and their gradients are
    // 4 bytes in fp32 and 2 in fp16, and dominate this model's memory at batch 32.
    const peak = async (precision: "fp16" | "fp32") => {
      const base = dev.memoryAllocated();
      using model = smallCnn(7).to(dev, { precision });
      const optimizer = new SGD(model.parameters(), { lr: 0.01 });
      const trainer = new Trainer(model, { optimizer });
      using x = full(dev, [32, 1, 8, 8], 0.5, {
        dtype: precision === "fp16" ? "f16" : "f32",
      });
      using labels = full(dev, [32], 1, { dtype: "i32" });
      dev.resetPeakMemoryStats();
      trainer.trainStep(x, labels);
      await dev.synchronize();
      const bytes = dev.maxMemoryAllocated() - base;
      trainer.dispose();
      optimizer.dispose();
      return bytes;
    };
    const before = dev.memoryAllocated();
    const [h, f] = [await peak("fp16"), await peak("fp32")];
    assert.ok(f > 1.5 * h && f < 2.2 * h, `fp16 ${h} bytes, fp32 ${f} bytes`);
    assert.strictEqual(dev.memoryAllocated(), before, "everything was freed");
  },
);
