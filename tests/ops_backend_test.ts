// A second backend slots in under ops/ with nothing above it changed: tests/_array_backend.ts
// (TypeScript over ArrayBuffers) runs ops/ calls and a small nn model's forward on a CPU
// device, with the native backend's results; an op it lacks fails naming the op and the
// backend; disposing the handle gives the device its native backend back.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { PinstreamError } from "../internal/errors.ts";
import { Tensor } from "../ffi/tensor.ts";
import { backendOf, NativeBackend, useBackend } from "../ops/backend.ts";
import { arange, full, randn } from "../ops/fill.ts";
import { matmul } from "../ops/gemm.ts";
import { conv2dForward } from "../ops/conv.ts";
import { Linear, ReLU, Sequential } from "../nn/layers.ts";
import { Xoshiro128 } from "../nn/init.ts";
import { ArrayBackend } from "./_array_backend.ts";

/** Runs `fn` with the ops of `dev` on a fresh array backend; returns the backend too. */
function onArray<T>(dev: Device, fn: () => T): { result: T; backend: ArrayBackend } {
  const backend = new ArrayBackend(dev);
  using _ = useBackend(dev, backend);
  return { result: fn(), backend };
}

Deno.test("an ops/ call runs on the installed backend, with the native backend's values", async () => {
  using dev = Device.open("cpu");
  using a = Tensor.fromHost(dev, new Float32Array([1, -2, 3, 0.5, 4, -1]), [2, 3]);
  using b = Tensor.fromHost(dev, new Float32Array([2, 1, 0, -1, 1, 3]), [3, 2]);
  using viaArray = Tensor.empty(dev, [2, 2], "f32");
  using viaNative = Tensor.empty(dev, [2, 2], "f32");
  const { backend } = onArray(dev, () => matmul(a, b, { out: viaArray }));
  assert.deepStrictEqual(backend.calls, ["matmul"]);
  matmul(a, b, { out: viaNative });
  assert.deepStrictEqual([...await viaArray.toHost()], [...await viaNative.toHost()]);
  assert.deepStrictEqual([...await viaArray.toHost()], [5, 12, 0, -6.5]);
});

Deno.test("the ops' checks run before any backend: a bad shape never reaches it", () => {
  using dev = Device.open("cpu");
  using a = Tensor.empty(dev, [2, 3], "f32");
  using out = Tensor.empty(dev, [2, 2], "f32");
  const { backend } = onArray(
    dev,
    () => assert.throws(() => matmul(a, a, { out }), /inner dimensions differ/),
  );
  assert.deepStrictEqual(backend.calls, []);
});

Deno.test("fills run on the installed backend; one it cannot do names itself", async () => {
  using dev = Device.open("cpu");
  const { result, backend } = onArray(dev, () => ({
    steps: arange(dev, 7, { start: 1, step: 2, dtype: "i32" }),
    twos: full(dev, [3], 2, { dtype: "f16" }),
  }));
  using steps = result.steps, twos = result.twos;
  assert.deepStrictEqual(backend.calls, ["tensorFill", "tensorFill"]);
  assert.deepStrictEqual([...await steps.toHost()], [1, 3, 5]);
  assert.deepStrictEqual([...await twos.toHost()], [2, 2, 2]);
  onArray(dev, () =>
    assert.throws(
      () => randn(dev, [4], { seed: 1 }),
      (err: unknown) =>
        err instanceof PinstreamError && err.code === "UNSUPPORTED" &&
        /fill mode 3 is not implemented by the array backend/.test(err.message),
    ));
});

Deno.test("an op the backend lacks fails with UNSUPPORTED, naming the op and the backend", () => {
  using dev = Device.open("cpu");
  using x = Tensor.empty(dev, [1, 1, 3, 3], "f32");
  using w = Tensor.empty(dev, [1, 1, 3, 3], "f32");
  using y = Tensor.empty(dev, [1, 1, 1, 1], "f32");
  onArray(dev, () =>
    assert.throws(
      () => conv2dForward(x, y, { weight: w }),
      (err: unknown) =>
        err instanceof PinstreamError && err.code === "UNSUPPORTED" &&
        err.message.startsWith("Cannot run conv2dForward x [1,1,3,3] weight [1,1,3,3]:") &&
        err.message.includes("conv2dForward is not implemented by the array backend"),
    ));
});

for (const precision of ["fp32", "fp16"] as const) {
  Deno.test(`a Linear-ReLU-Linear forward (${precision}) on the array backend`, async () => {
    using dev = Device.open("cpu");
    const dtype = precision === "fp32" ? "f32" : "f16";
    const input = Float32Array.from({ length: 4 * 5 }, (_, i) => Math.sin(i * 0.7) * 2);
    // The same initial weights for both runs: each model draws from its own generator.
    const model = () => {
      const rng = new Xoshiro128(3);
      return new Sequential([new Linear(5, 6, { rng }), new ReLU(), new Linear(6, 3, { rng })])
        .to(dev, { precision });
    };
    const viaArray = onArray(dev, () => {
      const m = model();
      const x = Tensor.fromHost(
        dev,
        dtype === "f32" ? input : Float16Array.from(input),
        [4, 5],
      );
      return { m, x, y: m.forward(x) };
    });
    using _array = viaArray.result.m;
    using native = model();
    using xn = Tensor.fromHost(dev, dtype === "f32" ? input : Float16Array.from(input), [4, 5]);
    const yn = native.forward(xn);
    const got = [...await viaArray.result.y.toHost()], want = [...await yn.toHost()];
    viaArray.result.x.dispose();
    assert.strictEqual(viaArray.result.y.dtype, dtype);
    assert.ok(
      got.every((v, i) => Math.abs(v - want[i]) <= (dtype === "f32" ? 1e-5 : 2e-3)),
      `array ${got} vs native ${want}`,
    );
    assert.ok(got.some((v) => v !== 0), "a forward of all zeros would hide a missing kernel");
    const expected = ["matmul", "biasAdd", "reluForward", "matmul", "biasAdd"];
    const calls = viaArray.backend.calls.filter((c) => c !== "cast");
    assert.deepStrictEqual(calls, expected);
    if (precision === "fp16") assert.ok(viaArray.backend.calls.includes("cast"));
  });
}

Deno.test("disposing the handle restores the device's native backend", () => {
  using dev = Device.open("cpu");
  using other = Device.open("cpu");
  const array = new ArrayBackend(dev);
  {
    using _ = useBackend(dev, array);
    assert.strictEqual(backendOf(dev), array);
    assert.strictEqual(backendOf(other), NativeBackend.of(other), "one device at a time");
  }
  assert.strictEqual(backendOf(dev), NativeBackend.of(dev));
  assert.throws(() => useBackend(dev, {} as never), /it must have a name/);
});
