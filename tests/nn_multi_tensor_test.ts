/**
 * The multi-tensor optimizer path (SGD `foreach`, the GradScaler's one-launch inf check, the
 * model's one-launch running-statistics revert) against the per-parameter path: the same bits
 * for fp16 and fp32 gradients and every SGD variant, over steps with inf and NaN gradients that
 * the scaler skips, on each backend.
 */

import assert from "node:assert";
import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import { GradScaler, Parameter, SGD, Xoshiro128 } from "../nn/mod.ts";
import * as ops from "../ops/mod.ts";
import { TensorList } from "../ops/tensor_list.ts";
import { testEachBackend } from "./_backends.ts";

/** Shapes of a small model's parameters, one over 4096 elements (several blocks a row on CUDA). */
const SHAPES = [[32, 3, 3, 3], [64, 9, 9], [10], [1]];

/** What poisons each step's gradients: none, an inf in one, a NaN in another. */
const POISON = [null, null, Infinity, null, NaN, null, -Infinity, null];

async function bytes(t: Tensor): Promise<Uint8Array> {
  const h = await t.toHost();
  return new Uint8Array(h.buffer.slice(h.byteOffset, h.byteOffset + h.byteLength));
}

async function train(
  device: Device,
  gradDtype: "f16" | "f32",
  hyper: { momentum: number; weightDecay: number; nesterov: boolean; dampening: number },
  foreach: boolean,
  unscaleFirst: boolean,
): Promise<Uint8Array[]> {
  const rng = new Xoshiro128(7);
  const params = SHAPES.map((s) => {
    const n = s.reduce((a, b) => a * b, 1);
    const init = Float32Array.from({ length: n }, () => rng.random() - 0.5);
    return new Parameter(init, s, { gradDtype }).to(device);
  });
  using opt = new SGD(params, { lr: 0.05, ...hyper, foreach });
  using scaler = new GradScaler(device, { initScale: 1024, growthInterval: 3 });
  const grng = new Xoshiro128(11);
  for (let step = 0; step < POISON.length; step++) {
    params.forEach((p, i) => {
      const g = Float32Array.from({ length: p.numel }, () => (grng.random() - 0.5) * 1024);
      if (POISON[step] !== null && i === step % params.length) g[p.numel - 1] = POISON[step]!;
      p.grad.buffer.copyFrom(gradDtype === "f16" ? Float16Array.from(g) : g);
    });
    if (unscaleFirst) scaler.unscale_(opt);
    scaler.step(opt);
    scaler.update();
  }
  const state = await opt.stateDict();
  const out: Uint8Array[] = [];
  for (const p of params) out.push(await bytes(p.master), await bytes(p.half!));
  for (const b of state.momentumBuffers) out.push(new Uint8Array(b.buffer));
  out.push(new Uint8Array(Int32Array.of(state.stepsDone).buffer));
  out.push(new Uint8Array(Float32Array.of(await scaler.getScale()).buffer));
  params.forEach((p) => p.dispose());
  return out;
}

const VARIANTS = [
  { momentum: 0, weightDecay: 0, nesterov: false, dampening: 0 },
  { momentum: 0.9, weightDecay: 5e-4, nesterov: false, dampening: 0 },
  { momentum: 0.9, weightDecay: 5e-4, nesterov: true, dampening: 0 },
  { momentum: 0.5, weightDecay: 0, nesterov: false, dampening: 0.25 },
];

testEachBackend(
  "SGD foreach with a GradScaler gives the per-parameter path's bits, skipped steps included",
  async (device) => {
    for (const gradDtype of ["f16", "f32"] as const) {
      for (const hyper of VARIANTS) {
        for (const unscaleFirst of [false, true]) {
          const what = `${gradDtype} ${JSON.stringify(hyper)} unscale_ ${unscaleFirst}`;
          const one = await train(device, gradDtype, hyper, false, unscaleFirst);
          const multi = await train(device, gradDtype, hyper, true, unscaleFirst);
          assert.strictEqual(multi.length, one.length, what);
          one.forEach((b, i) => assert.deepStrictEqual(multi[i], b, `${what}: output ${i}`));
          // Steps 2, 4 and 6 were skipped: 5 of 8 counted.
          assert.deepStrictEqual(
            new Int32Array(multi[multi.length - 2].buffer.slice(0)),
            Int32Array.of(5),
            what,
          );
        }
      }
    }
  },
);

/** Steps of SGD on bf16-precision parameters (no scaler: bf16 needs none), their bytes. */
async function trainBf16(
  device: Device,
  gradDtype: "f16" | "f32",
  hyper: { momentum: number; weightDecay: number; nesterov: boolean; dampening: number },
  foreach: boolean,
): Promise<Uint8Array[]> {
  const rng = new Xoshiro128(7);
  const params = SHAPES.map((s) => {
    const n = s.reduce((a, b) => a * b, 1);
    const init = Float32Array.from({ length: n }, () => rng.random() - 0.5);
    // gradDtype "f16" is the half type: bf16 under precision "bf16"
    return new Parameter(init, s, { gradDtype }).to(device, "bf16");
  });
  using opt = new SGD(params, { lr: 0.05, ...hyper, foreach });
  const grng = new Xoshiro128(11);
  for (let step = 0; step < 4; step++) {
    params.forEach((p) => {
      const g = Float32Array.from({ length: p.numel }, () => grng.random() - 0.5);
      const top = new Uint16Array(g.buffer).filter((_, i) => i % 2 === 1); // truncated to bf16
      p.grad.buffer.copyFrom(p.grad.dtype === "bf16" ? top : g);
    });
    opt.step();
  }
  const out: Uint8Array[] = [];
  for (const p of params) {
    assert.strictEqual(p.half!.dtype, "bf16");
    assert.strictEqual(p.grad.dtype, gradDtype === "f16" ? "bf16" : "f32");
    out.push(await bytes(p.master), await bytes(p.half!));
  }
  params.forEach((p) => p.dispose());
  return out;
}

testEachBackend(
  "SGD foreach on bf16 parameters gives the per-parameter path's bits",
  async (device) => {
    for (const gradDtype of ["f16", "f32"] as const) {
      for (const hyper of VARIANTS) {
        const what = `bf16, ${gradDtype === "f16" ? "bf16" : "f32"} grads ${JSON.stringify(hyper)}`;
        const one = await trainBf16(device, gradDtype, hyper, false);
        const multi = await trainBf16(device, gradDtype, hyper, true);
        assert.strictEqual(multi.length, one.length, what);
        one.forEach((b, i) => assert.deepStrictEqual(multi[i], b, `${what}: output ${i}`));
      }
    }
  },
);

testEachBackend("multi-tensor kernels refuse lists of the wrong kind or device", (device) => {
  using p = Tensor.fromHost(device, new Float32Array([1, 2]));
  using g16 = Tensor.fromHost(device, new Float16Array([1, 2, 3]));
  using flag = Tensor.fromHost(device, new Int32Array([0]));
  using sgd = new TensorList(device, "sgd");
  using copy = new TensorList(device, "copy");
  assert.throws(
    () => sgd.setSgd([{ param: p, grad: g16, momentumBuf: null, paramHalf: null }]),
    /Cannot set a TensorList: entry 0 grad has 3 elements, param 2/,
  );
  assert.throws(
    () => copy.setCopies([{ dst: p, src: p, srcOffset: 1, count: 2 }]),
    /Cannot set a TensorList: entry 0 copies 2 values from 1 of 2 to 0 of 2/,
  );
  assert.throws(() => ops.multiSgdStep(copy, { lr: 1 }), /expected a "sgd" TensorList, got copy/);
  assert.throws(
    () => ops.multiCopyIf(sgd, { flag }),
    /expected a "copy" TensorList, got sgd/,
  );
  assert.throws(
    () => ops.multiSgdStep(sgd, { lr: 1, momentum: 0.5, nesterov: true, dampening: 0.1 }),
    /Nesterov momentum requires a momentum and zero dampening/,
  );
});

testEachBackend(
  "multiCopyIf copies every entry when the flag is set, none when clear",
  async (device) => {
    using a = Tensor.fromHost(device, new Float32Array([1, 2, 3, 4]));
    using b = Tensor.fromHost(device, new Float32Array(6));
    using clear = Tensor.fromHost(device, new Int32Array([0]));
    using set = Tensor.fromHost(device, new Int32Array([1]));
    using list = new TensorList(device, "copy");
    list.setCopies([
      { dst: b, src: a, srcOffset: 2, count: 2 },
      { dst: b, dstOffset: 3, src: a, count: 3 },
    ]);
    ops.multiCopyIf(list, { flag: clear });
    assert.deepStrictEqual([...await b.toHost()], [0, 0, 0, 0, 0, 0]);
    ops.multiCopyIf(list, { flag: set });
    assert.deepStrictEqual([...await b.toHost()], [3, 4, 0, 1, 2, 3]);
    ops.multiCopyIf(list, { flag: null });
    assert.deepStrictEqual([...await b.toHost()], [3, 4, 0, 1, 2, 3]);
  },
);
