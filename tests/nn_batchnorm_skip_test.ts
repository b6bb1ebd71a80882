// A batch with inf/NaN and batch norm: the GradScaler skips the step on the device, and the
// running statistics that the batch's forward updated are put back there too, on both backends.
import assert from "node:assert";
import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import {
  BatchNorm2d,
  Conv2d,
  Flatten,
  GradScaler,
  Linear,
  Sequential,
  SGD,
  Xoshiro128,
} from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { testEachBackend } from "./_backends.ts";

const N = 4, C = 2, HW = 4, K = 3;

function setup(device: Device, revertStatsOnSkip?: boolean) {
  const bn = new BatchNorm2d(C);
  const model = new Sequential([
    new Conv2d(1, C, { kernelSize: 3, padding: 1, rng: new Xoshiro128(1) }),
    bn,
    new Flatten(),
    new Linear(C * HW * HW, K, { rng: new Xoshiro128(2) }),
  ]).to(device);
  const optimizer = new SGD(model.parameters(), { lr: 0.05, momentum: 0.9 });
  const scaler = new GradScaler(device, { initScale: 256 });
  const trainer = new Trainer(model, { optimizer, scaler, revertStatsOnSkip });
  const x = Tensor.empty(device, [N, 1, HW, HW], "f16");
  const y = Tensor.fromHost(device, new Int32Array([0, 1, 2, 1]), [N]);
  const rng = new Xoshiro128(3);
  const step = (poison: number | null) => {
    const data = Float16Array.from({ length: N * HW * HW }, () => rng.random() * 2 - 1);
    if (poison !== null) data[5] = poison;
    x.buffer.copyFrom(data);
    trainer.trainStep(x, y);
  };
  const stats = async () => [...await bn.runningMean.read(), ...await bn.runningVar.read()];
  const weights = async () =>
    (await Promise.all(model.parameters().map((p) => p.read()))).flatMap((a) => [...a]);
  const dispose = () => {
    x.dispose();
    y.dispose();
    trainer.dispose();
    scaler.dispose();
    optimizer.dispose();
    model.dispose();
  };
  return { model, scaler, step, stats, weights, dispose };
}

for (const [poison, what] of [[NaN, "a NaN"], [Infinity, "an infinite"]] as const) {
  testEachBackend(
    `a skipped step with ${what} input leaves BatchNorm's running statistics as they were`,
    async (device) => {
      const t = setup(device);
      t.step(null);
      t.step(null);
      const stats = await t.stats();
      const weights = await t.weights();
      t.step(poison);
      // The scaler skipped the step: scale halved, weights untouched, statistics restored.
      assert.strictEqual(await t.scaler.getScale(), 128);
      assert.deepStrictEqual(await t.weights(), weights);
      assert.deepStrictEqual(await t.stats(), stats);
      // Training goes on with finite statistics that keep moving.
      t.step(null);
      const after = await t.stats();
      assert.ok(after.every(Number.isFinite), `statistics ${after}`);
      assert.notDeepStrictEqual(after, stats);
      t.dispose();
    },
  );
}

testEachBackend(
  "restoring statistics on skipped steps changes nothing on finite steps, bit for bit",
  async (device) => {
    const on = setup(device, true);
    const off = setup(device, false);
    for (let i = 0; i < 4; i++) {
      on.step(null);
      off.step(null);
    }
    assert.deepStrictEqual(await on.stats(), await off.stats());
    assert.deepStrictEqual(await on.weights(), await off.weights());
    on.dispose();
    off.dispose();
  },
);

testEachBackend(
  "with revertStatsOnSkip false a NaN batch poisons the running statistics, as in PyTorch",
  async (device) => {
    const t = setup(device, false);
    t.step(null);
    t.step(NaN);
    assert.ok((await t.stats()).every(Number.isNaN));
    t.dispose();
  },
);

testEachBackend(
  "GradScaler.step with a model restores statistics only on the step it skips",
  async (device) => {
    using bn = new BatchNorm2d(1).to(device);
    using opt = new SGD(bn.parameters(), { lr: 0.1 });
    using scaler = new GradScaler(device);
    using finite = Tensor.fromHost(device, new Float16Array([1, 3]), [2, 1, 1, 1]);
    using bad = Tensor.fromHost(device, new Float16Array([1, NaN]), [2, 1, 1, 1]);
    const stepOn = (x: Tensor) => {
      bn.backward(bn.forward(x));
      scaler.step(opt, { model: bn });
      scaler.update();
    };
    using set = Tensor.fromHost(device, new Int32Array([1]));
    const read = async () => [...await bn.runningMean.read(), ...await bn.runningVar.read()];
    stepOn(finite);
    const first = await read();
    assert.notDeepStrictEqual(first, [0, 1]);
    stepOn(bad);
    assert.deepStrictEqual(await read(), first);
    stepOn(finite);
    const second = await read();
    assert.notDeepStrictEqual(second, first);
    // The saved statistics are used once: a later revert does not go back past a taken step.
    bn.revertRunningStats(set);
    assert.deepStrictEqual(await read(), second);
  },
);
