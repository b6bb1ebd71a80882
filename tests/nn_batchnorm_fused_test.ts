/**
 * Batch norm with ReLU fused in (ops/norm.ts `relu`, BatchNorm2d `relu`, Sequential's fusion of a
 * BatchNorm2d followed by a ReLU): the same bits as the two kernels one after the other, forward
 * and backward, on each backend and in both dtypes; and the two-phase reduction gives the same
 * bits on every run (fixed partition, fixed order: rules.h ps_bn_groups).
 */

import assert from "node:assert";
import { type Device, Tensor } from "../mod.ts";
import { BatchNorm2d, ReLU, Sequential } from "../nn/layers.ts";
import * as ops from "../ops/mod.ts";
import { testEachBackend } from "./_backends.ts";
import { gen, randF, randH } from "./_nn_reference.ts";

type Dt = "f16" | "f32";

async function bits(t: Tensor): Promise<Uint8Array> {
  const h = await t.toHost();
  return new Uint8Array(h.buffer.slice(h.byteOffset, h.byteOffset + h.byteLength));
}

function input(dev: Device, data: Float16Array, shape: number[], dt: Dt): Tensor {
  return Tensor.fromHost(dev, dt === "f16" ? data : Float32Array.from(data), shape);
}

/** One forward and backward, fused or as batch norm then ReLU; every output's bytes. */
async function run(
  dev: Device,
  shape: number[],
  dt: Dt,
  x16: Float16Array,
  dy16: Float16Array,
  gamma: Float32Array,
  beta: Float32Array,
  fused: boolean,
): Promise<Uint8Array[]> {
  const c = shape[1];
  using x = input(dev, x16, shape, dt);
  using dy = input(dev, dy16, shape, dt);
  using g = Tensor.fromHost(dev, gamma);
  using b = Tensor.fromHost(dev, beta);
  using rm = Tensor.fromHost(dev, new Float32Array(c));
  using rv = Tensor.fromHost(dev, new Float32Array(c).fill(1));
  using y = Tensor.empty(dev, shape, dt);
  using dyr = Tensor.empty(dev, shape, dt);
  using dx = Tensor.empty(dev, shape, dt);
  using m = Tensor.empty(dev, [c], "f32");
  using s = Tensor.empty(dev, [c], "f32");
  using dg = Tensor.empty(dev, [c], "f32");
  using db = Tensor.empty(dev, [c], "f32");
  using work = Tensor.empty(dev, [ops.batchNormWorkspaceSize(shape)], "f32");
  const stats = { saveMean: m, saveInvStd: s, runMean: rm, runVar: rv };
  ops.batchNormForwardTrain(x, y, {
    gamma: g,
    beta: b,
    ...stats,
    relu: fused,
    workspace: fused ? work : null,
  });
  if (!fused) ops.reluForward(y, y);
  const grads = { x, gamma: g, saveMean: m, saveInvStd: s, dgamma: dg, dbeta: db };
  if (fused) {
    ops.batchNormBackward(dy, dx, { ...grads, relu: true, y, workspace: work });
  } else {
    ops.reluBackward(dy, dyr, { y });
    ops.batchNormBackward(dyr, dx, grads);
  }
  return await Promise.all([y, dx, m, s, rm, rv, dg, db].map(bits));
}

const SHAPES = [[16, 4, 32, 32], [10, 3, 4, 130], [9, 3, 23, 23], [3, 5, 1, 1]];
const NAMES = ["y", "dx", "saveMean", "saveInvStd", "runMean", "runVar", "dgamma", "dbeta"];

testEachBackend(
  "batchNorm with relu gives the bits of batch norm then ReLU, and the same bits every run",
  async (dev) => {
    const r = gen("bn-fused");
    for (const shape of SHAPES) {
      const count = shape.reduce((a, b) => a * b, 1), c = shape[1];
      const x = randH(r, count, -2, 3), dy = randH(r, count);
      const gamma = randF(r, c, 0.5, 1.5), beta = randF(r, c);
      for (const dt of ["f16", "f32"] as const) {
        const plain = await run(dev, shape, dt, x, dy, gamma, beta, false);
        const fused = await run(dev, shape, dt, x, dy, gamma, beta, true);
        const again = await run(dev, shape, dt, x, dy, gamma, beta, true);
        for (let i = 0; i < NAMES.length; i++) {
          const what = `[${shape}] ${dt} ${NAMES[i]}`;
          assert.deepStrictEqual(fused[i], plain[i], `${what}: fused differs from unfused`);
          assert.deepStrictEqual(again[i], fused[i], `${what}: a second run differs`);
        }
        // The ReLU did act: some outputs are zero and some gradients masked.
        const y = dt === "f16"
          ? new Float16Array(fused[0].buffer)
          : new Float32Array(fused[0].buffer);
        assert.ok(y.some((v) => v === 0) && y.some((v) => v > 0), `[${shape}] ${dt} relu`);
      }
    }
  },
);

testEachBackend("batchNorm refuses a relu backward without y and a short workspace", (dev) => {
  const shape = [2, 3, 4, 4];
  using x = Tensor.fromHost(dev, new Float16Array(96), shape);
  using p = Tensor.fromHost(dev, new Float32Array(3));
  using small = Tensor.empty(dev, [2], "f32");
  const stats = { gamma: p, beta: p, saveMean: p, saveInvStd: p };
  assert.throws(
    () => ops.batchNormForwardTrain(x, x, { ...stats, workspace: small }),
    /workspace of 2 floats, \[2, 3, 16\] needs 9/,
  );
  const grads = { x, gamma: p, saveMean: p, saveInvStd: p, dgamma: p, dbeta: p };
  assert.throws(
    () => ops.batchNormBackward(x, x, { ...grads, relu: true }),
    /Cannot run batchNormBackward: relu needs the forward's output y/,
  );
});

testEachBackend(
  "Sequential fuses BatchNorm2d + ReLU in training: the same bits as BatchNorm2d({ relu: true }) and as the layers one by one",
  async (dev) => {
    const r = gen("bn-seq");
    const shape = [8, 4, 16, 16], count = 8 * 4 * 256;
    const x16 = randH(r, count, -2, 2), dy16 = randH(r, count);
    const results: Uint8Array[][] = [];
    for (const how of ["sequential", "flag", "separate"] as const) {
      using x = Tensor.fromHost(dev, x16, shape);
      using dy = Tensor.fromHost(dev, dy16, shape);
      using bn = new BatchNorm2d(4, { relu: how === "flag" }).to(dev);
      using relu = new ReLU().to(dev);
      let dx: Tensor | null;
      let y: Tensor;
      if (how === "sequential") {
        const seq = new Sequential([bn, relu]); // its layers are disposed by their own `using`
        y = seq.forward(x);
        dx = seq.backward(dy);
        results.push([await bits(y), await bits(dx!)]);
      } else if (how === "flag") {
        y = bn.forward(x);
        dx = bn.backward(dy);
        results.push([await bits(y), await bits(dx!)]);
      } else {
        y = relu.forward(bn.forward(x));
        dx = bn.backward(relu.backward(dy)!);
        results.push([await bits(y), await bits(dx!)]);
      }
      results[results.length - 1].push(await bits(bn.weight.grad), await bits(bn.bias.grad));
    }
    assert.deepStrictEqual(results[0], results[2], "Sequential vs separate layers");
    assert.deepStrictEqual(results[1], results[2], "relu flag vs separate layers");
  },
);
