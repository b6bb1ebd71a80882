/**
 * The nccl backend on one GPU, one rank (bench/gpu_run.sh runs it where a GPU and a
 * `libnccl.so.2` are at hand): a communicator, every collective in f32, f16 and i32, a grouped
 * all-reduce and one DataParallel step of a CUDA model, each result checked on every element.
 * Prints the library and `nccl smoke: ok <checks> checks`, or throws at the first wrong
 * element. With one rank every collective returns its input, which is what it checks; the
 * stand-in of the CUDA emulator runs the same script in the tests.
 *
 *     PINSTREAM_NCCL_LIB=/path/to/libnccl.so.2 deno run -A bench/nccl_smoke.ts
 *
 * @module
 */

import assert from "node:assert";
import { DataParallel, Device, Linear, ProcessGroup, SGD, Tensor } from "../mod.ts";
import { openNccl } from "../dist/_nccl.ts";

const lib = openNccl();
const v = lib.version;
console.log(
  `NCCL ${Math.floor(v / 10000)}.${Math.floor(v / 100) % 100}.${v % 100} at ${lib.path}` +
    (lib.standIn ? " (the CUDA emulator's stand-in)" : ""),
);
using device = Device.open("cuda");
using group = ProcessGroup.init({ backend: "nccl", env: () => undefined, timeoutMs: 60_000 });
let checks = 0;

async function same(what: string, t: Tensor, want: ArrayLike<number>) {
  const got = await t.toHost();
  assert.strictEqual(got.length, want.length, what);
  for (let i = 0; i < want.length; i++) {
    assert.ok(Object.is(got[i], want[i]), `${what}: element ${i} is ${got[i]}, not ${want[i]}`);
  }
  checks++;
}

const t0 = performance.now();
for (const dt of ["f32", "f16", "i32"] as const) {
  const values = Array.from({ length: 1000 }, (_, i) => (i % 17) - 8);
  const host = (dt === "f32"
    ? Float32Array.from(values)
    : dt === "f16"
    ? Float16Array.from(values)
    : Int32Array.from(values)) as Float32Array;
  for (const op of ["sum", "avg", "max", "min"] as const) {
    if (op === "avg" && dt === "i32") {
      continue;
    }
    using x = Tensor.fromHost(device, host, [1000]);
    await group.allReduceAsync(x, { op }).wait();
    await same(`allReduce ${op} ${dt}`, x, host);
  }
  using b = Tensor.fromHost(device, host, [1000]);
  group.broadcast(b);
  await same(`broadcast ${dt}`, b, host);
  using o = Tensor.empty(device, [1000], dt);
  group.allGather(b, o);
  await same(`allGather ${dt}`, o, host);
  group.reduceScatter(b, o, { op: "max" });
  await same(`reduceScatter ${dt}`, o, host);
}
{
  using a = Tensor.fromHost(device, new Float32Array([1, 2, 3]), [3]);
  using h = Tensor.fromHost(device, new Float16Array([4, 5]), [2]);
  group._allReduceTensorsAsync([a, h], "sum").waitSync();
  await same("grouped allReduce f32", a, [1, 2, 3]);
  await same("grouped allReduce f16", h, [4, 5]);
}
{
  using model = new Linear(4, 2).to(device, { precision: "fp32" });
  using dp = new DataParallel(model, group);
  using opt = new SGD(dp.parameters(), { lr: 0.1 });
  using x = Tensor.fromHost(device, new Float32Array([1, 2, 3, 4]), [1, 4]);
  using dy = Tensor.fromHost(device, new Float32Array([1, -1]), [1, 2]);
  dp.forward(x);
  dp.backward(dy, { inputGrad: false });
  await same("DataParallel gradient", model.weight.grad, [1, 2, 3, 4, -1, -2, -3, -4]);
  opt.step();
}
console.log(`nccl smoke: ok ${checks} checks in ${(performance.now() - t0).toFixed(0)} ms`);
