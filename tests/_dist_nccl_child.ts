/**
 * One rank of tests/dist_nccl_test.ts (run under mpirun, on the CUDA emulator with its NCCL
 * stand-in): every collective of the nccl backend on CUDA tensors, in each dtype and
 * reduction, blocking and asynchronous, one NCCL group of several all-reduces, and the
 * ordering with the current stream (a kernel writes the input and another reads the result,
 * with no host wait between them), and collectives on host memory (over MPI under mpirun, over
 * NCCL in a torchrun-style launch), compared with a reference on every element. Prints
 * `ok <rank> <checks>` and exits 0, or throws naming the first wrong element.
 *
 * @module
 */

import { add, Device, ProcessGroup, Stream, Tensor } from "../mod.ts";
import { cast } from "../ops/elementwise.ts";

type DT = "f32" | "f16" | "bf16" | "i32";
type Arr = Float32Array | Float16Array | Int32Array;

using device = Device.open("cuda");
// The device at init: a torchrun-style launch (no MPI) needs it; under mpirun it makes the
// communicator at once instead of at the first collective on a CUDA tensor.
using group = ProcessGroup.init({ backend: "nccl", timeoutMs: 120_000, device });
const { rank, size } = group;
let checks = 0;

/** Small integers (exact in fp16 and in every sum of up to 4 ranks). */
function value(r: number, i: number): number {
  return ((r * 7 + i * 13) % 17) - 8;
}

/** The reference reduction of element `i` over the ranks. */
function reduce(op: "sum" | "avg" | "max" | "min", i: number): number {
  let acc = value(0, i);
  for (let r = 1; r < size; r++) {
    const v = value(r, i);
    acc = op === "max" ? Math.max(acc, v) : op === "min" ? Math.min(acc, v) : acc + v;
  }
  return op === "avg" ? Math.fround(acc / size) : acc;
}

/** fp32 to bf16, to nearest even (values here are finite). */
function bf16round(v: number): number {
  const u = new Uint32Array(new Float32Array([v]).buffer);
  u[0] = ((u[0] + 0x7fff + ((u[0] >>> 16) & 1)) >>> 0) & 0xffff0000;
  return new Float32Array(u.buffer)[0];
}

function round(dt: DT, v: number): number {
  if (dt === "bf16") return bf16round(Math.fround(v));
  return dt === "f16" ? Math.f16round(Math.fround(v)) : dt === "f32" ? Math.fround(v) : v;
}

function host(dt: DT, n: number, f: (i: number) => number): Arr {
  const a = dt === "f32"
    ? new Float32Array(n)
    : dt === "f16"
    ? new Float16Array(n)
    : new Int32Array(n);
  for (let i = 0; i < n; i++) a[i] = f(i);
  return a;
}

function tensor(dt: DT, n: number, f: (i: number) => number): Tensor {
  if (dt !== "bf16") return Tensor.fromHost(device, host(dt, n, f) as Float32Array, [n]);
  // No bf16 array on the host: made on the device from fp32 (the values are exact in bf16).
  using wide = Tensor.fromHost(device, host("f32", n, f) as Float32Array, [n]);
  const t = Tensor.empty(device, [n], "bf16");
  cast(wide, t);
  return t;
}

async function expectEqual(what: string, t: Tensor, want: (i: number) => number) {
  const got = await t.toHost() as Arr;
  for (let i = 0; i < got.length; i++) {
    const w = want(i);
    if (!Object.is(got[i], w)) {
      throw new Error(`${what}: element ${i} is ${got[i]}, expected ${w} (rank ${rank})`);
    }
  }
  checks++;
}

function expectHost(what: string, got: Arr, want: (i: number) => number) {
  for (let i = 0; i < got.length; i++) {
    if (!Object.is(got[i], want(i))) {
      throw new Error(`${what}: element ${i} is ${got[i]}, expected ${want(i)} (rank ${rank})`);
    }
  }
  checks++;
}

async function run(asyncForm: boolean, w: { waitSync(): void; wait(): Promise<void> }) {
  if (asyncForm) await w.wait();
  else w.waitSync();
}

// 300_000 fp32 elements pass through the stand-in's 1 MiB staging slots in several chunks.
for (const dt of ["f32", "f16", "bf16", "i32"] as const) {
  for (const n of dt === "f32" ? [1, 1000, 300_000 + 3 * size] : [1, 1000]) {
    for (const asyncForm of [false, true]) {
      const tag = `${dt} n=${n} ${asyncForm ? "async" : "blocking"}`;
      for (const op of ["sum", "avg", "max", "min"] as const) {
        if (op === "avg" && dt === "i32") continue;
        using x = tensor(dt, n, (i) => value(rank, i));
        if (asyncForm) await group.allReduceAsync(x, { op }).wait();
        else group.allReduce(x, { op });
        await expectEqual(`allReduce ${op} ${tag}`, x, (i) => round(dt, reduce(op, i)));
      }
      const root = (n + 1) % size;
      using b = tensor(dt, n, (i) => value(rank, i));
      await run(asyncForm, group.broadcastAsync(b, { root }));
      await expectEqual(`broadcast ${tag}`, b, (i) => value(root, i));

      using gi = tensor(dt, n, (i) => value(rank, i));
      using go = Tensor.empty(device, [n * size], dt);
      await run(asyncForm, group.allGatherAsync(gi, go));
      await expectEqual(`allGather ${tag}`, go, (i) => value(Math.floor(i / n), i % n));

      const block = Math.ceil(n / size);
      for (const op of ["sum", "max"] as const) {
        using si = tensor(dt, block * size, (i) => value(rank, i));
        using so = Tensor.empty(device, [block], dt);
        await run(asyncForm, group.reduceScatterAsync(si, so, { op }));
        await expectEqual(
          `reduceScatter ${op} ${tag}`,
          so,
          (i) => round(dt, reduce(op, rank * block + i)),
        );
      }
    }
  }
}

// One NCCL group of several all-reduces (DataParallel's bucket), of different dtypes.
{
  const parts = [
    tensor("f32", 777, (i) => value(rank, i)),
    tensor("f16", 5, (i) => value(rank, i)),
  ];
  group._allReduceTensorsAsync(parts, "sum").waitSync();
  for (const [k, t] of parts.entries()) {
    await expectEqual(`grouped allReduce ${k}`, t, (i) => reduce("sum", i));
    t.dispose();
  }
}

// Stream order: on a stream of its own, a kernel writes the input, the all-reduce reads it and
// a kernel reads the result, with no host wait in between. A missing event wait shows in the
// emulator's deferred-stream mode as stale input or output.
{
  using stream = new Stream(device, { nonBlocking: true });
  using _ = device.useStream(stream);
  const n = 4096;
  using a = tensor("f32", n, (i) => value(rank, i));
  using one = tensor("f32", n, () => 1);
  using x = Tensor.empty(device, [n], "f32");
  using y = Tensor.empty(device, [n], "f32");
  for (let round = 0; round < 3; round++) {
    add(a, one, x); // x = value + 1
    const w = group.allReduceAsync(x); // sum over ranks of (value + 1)
    await w.wait();
    add(x, x, y); // y = 2 x
    await expectEqual(
      `stream-ordered allReduce, round ${round}`,
      y,
      (i) => 2 * (reduce("sum", i) + size),
    );
  }
}

// Host memory: over MPI under mpirun, staged through the device and NCCL without MPI.
for (const dt of ["f32", "f16", "i32"] as const) {
  const n = 1000;
  for (const op of ["sum", "max"] as const) {
    const x = host(dt, n, (i) => value(rank, i));
    await group.allReduceAsync(x, { op }).wait();
    expectHost(`host allReduce ${op} ${dt}`, x, (i) => reduce(op, i));
  }
  const b = host(dt, n, (i) => value(rank, i));
  group.broadcast(b, { root: size - 1 });
  expectHost(`host broadcast ${dt}`, b, (i) => value(size - 1, i));
  const out = host(dt, n * size, () => 0);
  group.allGather(host(dt, n, (i) => value(rank, i)), out);
  expectHost(`host allGather ${dt}`, out, (i) => value(Math.floor(i / n), i % n));
  const block = host(dt, n, () => 0);
  group.reduceScatter(host(dt, n * size, (i) => value(rank, i)), block);
  expectHost(`host reduceScatter ${dt}`, block, (i) => reduce("sum", rank * n + i));
}
const empty = new Float32Array(0);
group.allReduce(empty);

group.barrier();
console.log(`ok ${rank} ${checks}`);
