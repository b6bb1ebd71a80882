/**
 * One rank of tests/dist_test.ts's collective check (run under mpirun): every collective, in
 * each dtype and reduction, blocking and asynchronous, over plain, shared, pinned and cpu
 * tensor memory, compared with a reference on every element. Prints `ok <rank> <checks>` and
 * exits 0, or throws naming the first wrong element.
 *
 * @module
 */

import { Device, HostBuffer, ProcessGroup, Tensor } from "../mod.ts";

type DT = "f32" | "f16" | "i32";
type Arr = Float32Array | Float16Array | Int32Array;
/** A typed view of `dt` over `buf`. */
function typed(dt: DT, buf: ArrayBuffer | SharedArrayBuffer): Arr {
  return dt === "f32"
    ? new Float32Array(buf)
    : dt === "f16"
    ? new Float16Array(buf)
    : new Int32Array(buf);
}

using group = ProcessGroup.init({ timeoutMs: 120_000 });
using device = Device.open("cpu");
const { rank, size } = group;
let checks = 0;

/** Small integers (exact in fp16 and in every sum of up to 4 ranks). */
function value(r: number, i: number): number {
  return ((r * 7 + i * 13) % 17) - 8;
}

/** The reference reduction of element `i` over the ranks, in float64. */
function reduce(op: "sum" | "avg" | "max" | "min", i: number): number {
  let acc = value(0, i);
  for (let r = 1; r < size; r++) {
    const v = value(r, i);
    acc = op === "max" ? Math.max(acc, v) : op === "min" ? Math.min(acc, v) : acc + v;
  }
  return op === "avg" ? Math.fround(acc / size) : acc;
}

function round(dt: DT, v: number): number {
  return dt === "f16" ? Math.f16round(Math.fround(v)) : dt === "f32" ? Math.fround(v) : v;
}

const pinned: HostBuffer[] = [];
/** A buffer of `n` elements in memory of kind `kind`, and how to read it back. */
function make(dt: DT, n: number, kind: string): { buf: Arr | Tensor; read: () => Arr } {
  const bytes = n * (dt === "f16" ? 2 : 4);
  if (kind === "tensor") {
    const t = Tensor.empty(device, [n], dt);
    const view = typed(dt, Deno.UnsafePointerView.getArrayBuffer(t.pointer!, bytes));
    return { buf: t, read: () => view };
  }
  let a: Arr;
  if (kind === "shared") a = typed(dt, new SharedArrayBuffer(bytes));
  else if (kind === "pinned") {
    const h = HostBuffer.alloc(device, bytes);
    pinned.push(h);
    a = typed(dt, h.arrayBuffer);
  } else a = typed(dt, new ArrayBuffer(bytes));
  return { buf: a, read: () => a };
}

function fill(x: { buf: Arr | Tensor; read: () => Arr }, f: (i: number) => number): void {
  const a = x.read();
  for (let i = 0; i < a.length; i++) a[i] = f(i);
}

function expectEqual(what: string, got: Arr, want: (i: number) => number): void {
  for (let i = 0; i < got.length; i++) {
    const w = want(i);
    if (!Object.is(got[i], w)) {
      throw new Error(`${what}: element ${i} is ${got[i]}, expected ${w} (rank ${rank})`);
    }
  }
  checks++;
}

async function run(asyncForm: boolean, w: { waitSync(): void; wait(): Promise<void> }) {
  if (asyncForm) await w.wait();
  else w.waitSync();
}

const counts = [1, 1000, 65_536 * size + 3 * size];
const kinds = ["plain", "shared", "pinned", "tensor"];
for (const dt of ["f32", "f16", "i32"] as const) {
  for (const kind of kinds) {
    // The large count (past MPI's switch to its large-message algorithms) once per dtype.
    for (const n of kind === "plain" ? counts : counts.slice(0, 2)) {
      for (const asyncForm of [false, true]) {
        const tag = `${dt} ${kind} n=${n} ${asyncForm ? "async" : "blocking"}`;
        for (const op of ["sum", "avg", "max", "min"] as const) {
          if (op === "avg" && dt === "i32") continue;
          const x = make(dt, n, kind);
          fill(x, (i) => value(rank, i));
          if (asyncForm) await group.allReduceAsync(x.buf, { op }).wait();
          else group.allReduce(x.buf, { op });
          expectEqual(`allReduce ${op} ${tag}`, x.read(), (i) => round(dt, reduce(op, i)));
          if (x.buf instanceof Tensor) x.buf.dispose();
        }
        const root = (n + 1) % size;
        const b = make(dt, n, kind);
        fill(b, (i) => value(rank, i));
        await run(asyncForm, group.broadcastAsync(b.buf, { root }));
        expectEqual(`broadcast ${tag}`, b.read(), (i) => value(root, i));

        const gi = make(dt, n, kind), go = make(dt, n * size, kind);
        fill(gi, (i) => value(rank, i));
        await run(asyncForm, group.allGatherAsync(gi.buf, go.buf));
        expectEqual(`allGather ${tag}`, go.read(), (i) => value(Math.floor(i / n), i % n));

        const block = Math.ceil(n / size);
        for (const op of ["sum", "max"] as const) {
          const si = make(dt, block * size, kind), so = make(dt, block, kind);
          fill(si, (i) => value(rank, i));
          await run(asyncForm, group.reduceScatterAsync(si.buf, so.buf, { op }));
          expectEqual(
            `reduceScatter ${op} ${tag}`,
            so.read(),
            (i) => round(dt, reduce(op, rank * block + i)),
          );
        }
        for (const x of [b, gi, go]) if (x.buf instanceof Tensor) x.buf.dispose();
      }
    }
  }
}

// Several asynchronous collectives in flight at once complete in issue order with their own
// results.
const many = Array.from({ length: 8 }, (_, k) => new Float32Array(4096).fill(rank + k));
const works = many.map((a) => group.allReduceAsync(a));
for (const w of works.reverse()) await w.wait();
many.forEach((a, k) =>
  expectEqual(`in-flight allReduce ${k}`, a, () => (size * (size - 1)) / 2 + size * k)
);
// An asynchronous collective progresses while this thread computes and never yields.
const busy = new Float32Array(1 << 20).fill(1);
const inFlight = group.allReduceAsync(busy);
const t0 = performance.now();
let spins = 0;
while (!inFlight.query()) {
  if (performance.now() - t0 > 60_000) throw new Error("the async all-reduce made no progress");
  spins++;
}
await inFlight.wait();
expectEqual("all-reduce finished during compute", busy, () => size);
if (rank === 0) console.error(`async all-reduce done after ${spins} spins of this thread`);

// Blocking collectives issued behind asynchronous ones still in flight wait their turn (the
// calling thread runs a blocking one itself only when nothing is in flight), and more
// collectives in flight than the job queue holds make the issuing thread wait for room: every
// result is its own, in issue order.
const mixed = Array.from({ length: 600 }, (_, k) => new Int32Array(k % 7 === 0 ? 3000 : 5));
mixed.forEach((a, k) => a.fill(rank * 3 + k));
const pending: { k: number; w: { wait(): Promise<void> } }[] = [];
mixed.forEach((a, k) => {
  if (k % 50 === 49) group.allReduce(a, { op: "max" });
  else pending.push({ k, w: group.allReduceAsync(a) });
});
for (const { w } of pending) await w.wait();
mixed.forEach((a, k) =>
  expectEqual(
    `mixed allReduce ${k}`,
    a,
    () => k % 50 === 49 ? (size - 1) * 3 + k : (3 * size * (size - 1)) / 2 + size * k,
  )
);
group.barrier();
for (const h of pinned) h.dispose();
console.log(`ok ${rank} ${checks}`);
