/**
 * Models that are not a plain Sequential: `Module.apply` for custom initialization, and a
 * two-input model (an image branch and an audio branch fused by `cat`) written as a Module
 * with its own forwardInputs/backwardInputs: its gradients against finite differences of a
 * float64 loss, and training through the Trainer with a GradScaler, on every backend.
 */

import assert from "node:assert";
import {
  cat,
  catBackward,
  Conv2d,
  type Device,
  Flatten,
  GradScaler,
  kaimingUniform,
  Linear,
  Module,
  ReLU,
  Sequential,
  SGD,
  Tensor,
  Trainer,
  Xoshiro128,
} from "../mod.ts";
import type { BackwardOptions } from "../nn/module.ts";
import { testEachBackend } from "./_backends.ts";
import { gen, randF, SEED } from "./_nn_reference.ts";

/** image [N, 1, 4, 4] -> conv 3x3 (pad 1) -> ReLU -> flatten [N, 32]; audio [N, 8] -> linear
 * -> ReLU [N, 6]; both cat along features [N, 38] -> linear [N, 3]. */
class Fusion extends Module {
  image: Sequential;
  audio: Sequential;
  head: Linear;

  constructor(rng: Xoshiro128) {
    super();
    this.image = this.addModule(
      "image",
      new Sequential([
        new Conv2d(1, 2, { kernelSize: 3, padding: 1, rng }),
        new ReLU(),
        new Flatten(),
      ]),
    );
    this.audio = this.addModule("audio", new Sequential([new Linear(8, 6, { rng }), new ReLU()]));
    this.head = this.addModule("head", new Linear(38, 3, { rng }));
  }

  forward(): Tensor {
    throw new TypeError("Cannot run Fusion: it takes two inputs (forwardInputs)");
  }

  backward(): Tensor | null {
    throw new TypeError("Cannot run Fusion: it takes two inputs (backwardInputs)");
  }

  override forwardInputs([image, audio]: readonly Tensor[]): Tensor {
    const a = this.image.forward(image), b = this.audio.forward(audio);
    const fused = this.workspace("fused", [a.shape[0], a.shape[1] + b.shape[1]], a.dtype);
    cat([a, b], fused, { dim: 1 });
    return this.head.forward(fused);
  }

  override backwardInputs(dy: Tensor, options?: BackwardOptions): (Tensor | null)[] {
    const dfused = this.head.backward(dy)!;
    this.gradReady(this.head); // head's gradients are final (data-parallel reduces them now)
    const n = dy.shape[0];
    const da = this.workspace("dimage", [n, 32], dy.dtype);
    const db = this.workspace("daudio", [n, 6], dy.dtype);
    catBackward(dfused, [da, db], { dim: 1 });
    return [this.image.backward(da, options), this.audio.backward(db, options)];
  }
}

/** Mean cross-entropy in float64 and its gradient with respect to the logits. */
function crossEntropy(logits: Float32Array, labels: Int32Array, k: number) {
  const n = labels.length;
  const grad = new Float32Array(logits.length);
  let loss = 0;
  for (let i = 0; i < n; i++) {
    const row = Array.from(logits.subarray(i * k, (i + 1) * k));
    const m = Math.max(...row);
    const e = row.map((v) => Math.exp(v - m));
    const s = e.reduce((a, b) => a + b, 0);
    loss += Math.log(s) - (row[labels[i]] - m);
    for (let j = 0; j < k; j++) grad[i * k + j] = (e[j] / s - (j === labels[i] ? 1 : 0)) / n;
  }
  return { loss: loss / n, grad };
}

Deno.test("apply visits children before their parent, then the module, and returns it", () => {
  const inner = new Sequential([new Linear(2, 2), new ReLU()]);
  const model = new Sequential([inner, new Linear(2, 1)]);
  const seen: string[] = [];
  const names = new Map(model.namedModules().map(([n, m]) => [m, n]));
  assert.strictEqual(model.apply((m) => seen.push(names.get(m)!)), model);
  assert.deepStrictEqual(seen, ["0.0", "0.1", "0", "1", ""]);
  // @ts-expect-error apply takes a function
  assert.throws(() => model.apply(3), /Cannot apply to a module: fn must be a function/);
});

testEachBackend(
  "apply re-initializes every Linear and Conv2d weight on the device",
  async (dev) => {
    using model = new Fusion(new Xoshiro128(1)).to(dev);
    const rng = new Xoshiro128(9);
    const expected = new Map<string, Float32Array>();
    const names = new Map(model.namedModules().map(([name, m]) => [m, name]));
    model.apply((m) => {
      if (!(m instanceof Linear || m instanceof Conv2d)) return;
      const fanIn = m.weight.numel / m.weight.shape[0];
      const w = kaimingUniform(new Float32Array(m.weight.numel), fanIn, rng, 0);
      m.weight.write(w);
      m.bias?.write(new Float32Array(m.bias.numel).fill(0.25));
      expected.set(`${names.get(m)}.weight`, w);
    });
    assert.deepStrictEqual([...expected.keys()], [
      "image.0.weight",
      "audio.0.weight",
      "head.weight",
    ]);
    for (const [name, p] of model.namedParameters()) {
      const values = await p.read();
      if (name.endsWith("bias")) assert.ok(values.every((v) => v === 0.25), name);
      else assert.deepStrictEqual(values, expected.get(name), name);
    }
    // The fp16 copies the kernels read follow the writes.
    const w = model.head.weight;
    assert.deepStrictEqual(
      [...await w.half!.toHost()],
      [...Float16Array.from(await w.read())],
    );
  },
);

testEachBackend(
  "a two-input model's gradients match finite differences of a float64 loss",
  async (dev) => {
    const r = gen("fusion-fd");
    const n = 4;
    using model = new Fusion(new Xoshiro128(3)).to(dev, { precision: "fp32" });
    using image = Tensor.fromHost(dev, randF(r, n * 16), [n, 1, 4, 4]);
    using audio = Tensor.fromHost(dev, randF(r, n * 8), [n, 8]);
    const labels = Int32Array.from({ length: n }, (_, i) => i % 3);
    const lossAt = async () => {
      const logits = await model.forwardInputs([image, audio]).toHost() as Float32Array;
      return crossEntropy(logits, labels, 3);
    };
    const { grad, loss: base } = await lossAt();
    using dlogits = Tensor.fromHost(dev, grad, [n, 3]);
    const ready: string[] = [];
    const names = new Map(model.namedParameters().map(([name, p]) => [p, name]));
    using _hook = model.registerGradReadyHook((ps) => ready.push(...ps.map((p) => names.get(p)!)));
    const [dimage, daudio] = model.backwardInputs(dlogits);
    assert.deepStrictEqual(ready.slice(0, 2), ["head.weight", "head.bias"]);
    assert.deepStrictEqual([dimage!.shape, daudio!.shape], [[n, 1, 4, 4], [n, 8]]);
    const eps = 1e-3;
    // Central differences, except where a ReLU input crosses zero within eps of the point (the
    // one-sided slopes disagree there): such an entry is counted, not compared.
    let checked = 0, kinks = 0;
    const compare = (what: string, up: number, down: number, analytic: number) => {
      const numeric = (up - down) / (2 * eps);
      const tol = 2e-3 + 2e-2 * Math.abs(numeric);
      if (Math.abs((up - base) / eps - (base - down) / eps) > tol) {
        kinks++;
        return;
      }
      assert.ok(
        Math.abs(numeric - analytic) <= tol,
        `${what} (seed ${SEED}): backward ${analytic}, finite differences ${numeric}`,
      );
      checked++;
    };
    for (const [name, p] of model.namedParameters()) {
      const analytic = await p.grad.toHost();
      const w = await p.read();
      for (let i = 0; i < p.numel; i++) {
        const v = w[i];
        w[i] = v + eps;
        p.write(w);
        const up = (await lossAt()).loss;
        w[i] = v - eps;
        p.write(w);
        const down = (await lossAt()).loss;
        w[i] = v;
        p.write(w);
        compare(`${name}[${i}]`, up, down, analytic[i]);
      }
    }
    assert.strictEqual(checked + kinks, 18 + 2 + 48 + 6 + 114 + 3);
    // The audio input's gradient too (a linear branch: exact up to fp32 rounding).
    const a = await audio.toHost() as Float32Array, da = await daudio!.toHost();
    for (const i of [0, 5, 13, 31]) {
      const v = a[i];
      a[i] = v + eps;
      audio.buffer.copyFrom(a);
      const up = (await lossAt()).loss;
      a[i] = v - eps;
      audio.buffer.copyFrom(a);
      const down = (await lossAt()).loss;
      a[i] = v;
      audio.buffer.copyFrom(a);
      compare(`daudio[${i}]`, up, down, da[i]);
    }
    assert.ok(kinks <= 0.1 * (checked + kinks), `${kinks} of ${checked + kinks} at a kink`);
  },
);

testEachBackend("a two-input model trains through the Trainer with a GradScaler", async (dev) => {
  // The class needs both inputs: the image's mean sign and the first audio feature's sign.
  const r = gen("fusion-train");
  const n = 64;
  const img = randF(r, n * 16), aud = randF(r, n * 8);
  const labels = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    const mean = img.subarray(i * 16, (i + 1) * 16).reduce((s, v) => s + v, 0) / 16;
    for (let j = 0; j < 16; j++) img[i * 16 + j] += mean > 0 ? 0.5 : -0.5;
    labels[i] = (mean > 0 ? 1 : 0) + (aud[i * 8] > 0 ? 1 : 0);
  }
  using model = new Fusion(new Xoshiro128(5)).to(dev);
  using image = Tensor.fromHost(dev, Float16Array.from(img), [n, 1, 4, 4]);
  using audio = Tensor.fromHost(dev, Float16Array.from(aud), [n, 8]);
  using y = Tensor.fromHost(dev, labels, [n]);
  using opt = new SGD(model.parameters(), { lr: 0.2, momentum: 0.9 });
  using scaler = new GradScaler(dev);
  using trainer = new Trainer(model, { optimizer: opt, scaler });
  // On CUDA the steps are recorded once per input shapes and replayed as graphs.
  assert.strictEqual(trainer.cudaGraphsActive, dev.kind === "cuda");
  const losses: number[] = [];
  for (let epoch = 0; epoch < 6; epoch++) {
    for (let s = 0; s < 10; s++) trainer.trainStep([image, audio], y);
    losses.push((await trainer.readTrain()).loss);
  }
  trainer.evalStep([image, audio], y);
  const { accuracy } = await trainer.readEval();
  assert.ok(losses.every(Number.isFinite), `losses ${losses}`);
  assert.ok(losses[5] < 0.5 * losses[0], `losses ${losses}`);
  assert.ok(accuracy >= 0.9, `accuracy ${accuracy}, losses ${losses}`);
  assert.throws(() => trainer.trainStep([], y), /the inputs are an empty array/);
  assert.throws(() => model.forward(), /Fusion: it takes two inputs/);
});

testEachBackend("a one-input model refuses several inputs, naming itself", (dev: Device) => {
  using fc = new Linear(2, 1).to(dev);
  using x = Tensor.empty(dev, [1, 2], "f16");
  assert.throws(() => fc.forwardInputs([x, x]), /Cannot run Linear: it takes one input, got 2/);
  assert.throws(() => fc.addModule("a.b", new ReLU()), /without dots/);
  fc.addModule("act", new ReLU());
  assert.throws(() => fc.addModule("act", new ReLU()), /"act" is taken/);
});
