// The profiler (ffi/profiler.ts): named host ranges with nesting, device ranges timed by events
// on a stream (every backend present), the per-name table, the Chrome trace, and nothing at all
// when no profiler is active.

import assert from "node:assert";
import { DeviceBuffer, HostBuffer } from "../ffi/memory.ts";
import { activeProfiler, Profiler, range } from "../ffi/profiler.ts";
import { Stream } from "../ffi/stream.ts";
import { CUDA, testEachBackend } from "./_backends.ts";
import { makeData, makeLoader, MEAN, STD } from "./pipeline_fixtures.ts";
import { toDevice } from "../pipeline/prefetcher.ts";
import { Flatten, GradScaler, Linear, Sequential, SGD } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { cifarModel } from "../train/models.ts";
import { Tensor } from "../ffi/tensor.ts";
import { Device } from "../ffi/device.ts";
import * as ops from "../ops/mod.ts";
import { opCounts, opDelta } from "../internal/op_count.ts";

function busy(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) { /* spin */ }
}

Deno.test("range() without an active profiler records nothing and returns one shared no-op", () => {
  assert.strictEqual(activeProfiler(), undefined);
  const a = range("a"), b = range("b", {});
  assert.strictEqual(a, b);
  a[Symbol.dispose]();
  const p = new Profiler();
  assert.deepStrictEqual(p.stats(), []);
  assert.strictEqual(p.range("before start"), a, "a stopped profiler records nothing either");
  p[Symbol.dispose]();
});

Deno.test("nested host ranges: calls, inclusive totals, means, shares and the table", async () => {
  using prof = new Profiler({ device: false }).start();
  for (let i = 0; i < 4; i++) {
    using _step = range("step");
    busy(2);
    {
      using _f = range("forward");
      busy(3);
    }
  }
  prof.stop();
  const rows = await prof.collect();
  assert.deepStrictEqual(rows.map((r) => [r.name, r.calls]), [["step", 4], ["forward", 4]]);
  const [step, fwd] = rows;
  assert.ok(step.totalMs >= fwd.totalMs + 4 * 2 - 0.5, "a parent's time includes its child");
  assert.ok(fwd.meanMs >= 3 && Math.abs(fwd.meanMs * 4 - fwd.totalMs) < 1e-9);
  assert.ok(step.share > 0 && step.share <= 1 && fwd.share < step.share, `share ${step.share}`);
  assert.strictEqual(step.deviceMs, undefined);
  const table = prof.table().split("\n");
  assert.match(table[0], /^name +calls +total ms +mean ms +share +device ms +ops +syncs$/);
  // Host work only: no device time, no operations, no synchronizations.
  assert.match(table[1], /^step +4 +\d+\.\d\d +\d+\.\d{3} +\d+\.\d% +0 +0$/);
  assert.match(table[2], /^forward +4 /);
});

Deno.test("one profiler at a time; options are checked", () => {
  using a = new Profiler().start();
  const b = new Profiler();
  assert.throws(() => b.start(), /another one is active/);
  a.stop();
  b.start();
  assert.strictEqual(activeProfiler(), b);
  b.stop();
  assert.throws(() => new Profiler({ devic: true } as never), /devic.*device/s);
  assert.throws(() => new Profiler({ device: 1 as never }), /device must be a boolean/);
});

Deno.test("the Chrome trace has the ranges as complete events in microseconds", async () => {
  using prof = new Profiler({ device: false }).start();
  {
    using _ = range("outer");
    busy(1);
    using _i = range("inner");
    busy(1);
  }
  prof.stop();
  const path = await Deno.makeTempFile({ suffix: ".json" });
  try {
    await prof.exportChromeTrace(path);
    const trace = JSON.parse(await Deno.readTextFile(path));
    assert.strictEqual(trace.displayTimeUnit, "ms");
    const x = trace.traceEvents.filter((e: { ph: string }) => e.ph === "X");
    assert.deepStrictEqual(x.map((e: { name: string }) => e.name).sort(), ["inner", "outer"]);
    const outer = x.find((e: { name: string }) => e.name === "outer");
    const inner = x.find((e: { name: string }) => e.name === "inner");
    assert.ok(inner.ts >= outer.ts && inner.ts + inner.dur <= outer.ts + outer.dur + 1);
    assert.ok(outer.dur >= 1900, `dur ${outer.dur} us`);
  } finally {
    await Deno.remove(path);
  }
});

testEachBackend(
  "a device range left open never breaks the program: collect() skips it, and closing it after the profiler was disposed is a no-op",
  async (dev) => {
    const before = dev.liveObjects().events;
    using s = new Stream(dev);
    using host = HostBuffer.alloc(dev, 4096), buf = DeviceBuffer.alloc(dev, 4096);
    const prof = new Profiler().start();
    const open = range("open", { stream: s });
    buf.copyFrom(host, { stream: s });
    {
      using _ = range("closed", { stream: s });
      buf.copyFrom(host, { stream: s });
    }
    // The open range's end is not on the device yet: collect() reads what is closed.
    const rows = await prof.collect();
    assert.deepStrictEqual(rows.map((r) => r.name), ["closed"]);
    assert.ok(rows[0].deviceMs !== undefined);
    open[Symbol.dispose]();
    const again = await prof.collect();
    assert.deepStrictEqual(again.map((r) => r.name).sort(), ["closed", "open"]);
    assert.ok(again.every((r) => r.deviceMs !== undefined), JSON.stringify(again));
    // A range still open when the profiler is disposed closes without touching freed events.
    const late = prof.range("late", { stream: s });
    prof[Symbol.dispose]();
    late[Symbol.dispose]();
    // What was recorded on the host is still there to read.
    assert.ok((await prof.collect()).some((r) => r.name === "late"));
    assert.strictEqual(dev.liveObjects().events, before, "disposing the profiler frees its events");
  },
);

testEachBackend(
  "device ranges time the work queued on their stream and free their events",
  async (dev) => {
    const before = dev.liveObjects().events;
    const bytes = 1 << 20;
    using s = new Stream(dev);
    using host = HostBuffer.alloc(dev, bytes), buf = DeviceBuffer.alloc(dev, bytes);
    {
      using prof = new Profiler().start();
      for (let i = 0; i < 3; i++) {
        using _ = range("copy", { stream: s });
        buf.copyFrom(host, { stream: s });
      }
      {
        using _ = range("host only");
      }
      prof.stop();
      const rows = await prof.collect();
      const copy = rows.find((r) => r.name === "copy")!;
      assert.strictEqual(copy.calls, 3);
      assert.ok(copy.deviceMs !== undefined && copy.deviceMs >= 0, JSON.stringify(copy));
      assert.strictEqual(rows.find((r) => r.name === "host only")!.deviceMs, undefined);
      const trace = prof.chromeTrace().traceEvents;
      const device = trace.filter((e) => e.cat === "device");
      assert.strictEqual(device.length, 3);
      assert.ok(device.every((e) => (e.ts as number) >= 0 && (e.dur as number) >= 0));
      assert.ok(
        trace.some((e) => e.ph === "M" && (e.args as { name: string }).name === "device stream 1"),
      );
      assert.ok(dev.liveObjects().events > before);
    }
    assert.strictEqual(dev.liveObjects().events, before, "disposing the profiler frees its events");
  },
);

testEachBackend(
  "a profiled training loop shows the loader, the pipeline and every op of a step",
  async (dev) => {
    const d = makeData(48, [3, 8, 8], 5);
    await using loader = makeLoader(d, { numWorkers: 0 });
    await using p = toDevice(loader, dev, { dtype: "f16", mean: MEAN, std: STD, depth: 1 });
    using model = new Sequential([new Flatten(), new Linear(192, 10)]).to(dev);
    using opt = new SGD(model.parameters(), { lr: 0.01 });
    using scaler = new GradScaler(dev);
    using trainer = new Trainer(model, { optimizer: opt, scaler });
    using prof = new Profiler().start();
    for await (const b of p) trainer.trainStep(b.images, b.labels);
    prof.stop();
    const rows = await prof.collect();
    const names = new Set(rows.map((r) => r.name));
    for (
      const name of [
        "loader.next",
        "loader.batch",
        "pipeline.next",
        "pipeline.augment",
        "train.step",
        "train.forward",
        "train.backward",
        "train.optimizer",
        "nn.matmul",
        "nn.crossEntropyForwardBackward",
        "nn.multiSgdStep",
      ]
    ) {
      assert.ok(names.has(name), `${name} missing from ${[...names].join(", ")}`);
    }
    const step = rows.find((r) => r.name === "train.step")!;
    assert.strictEqual(step.calls, 3, "48 samples in batches of 16");
    assert.ok(
      rows.find((r) => r.name === "nn.matmul")!.deviceMs! >= 0,
      "ops are timed on their stream",
    );
    assert.ok(rows.find((r) => r.name === "pipeline.augment")!.deviceMs! >= 0);
  },
);

Deno.test("a profile shows each batch a worker loaded, on the workers' track", async () => {
  const d = makeData(64, [3, 8, 8], 6);
  await using loader = makeLoader(d, { numWorkers: 2, autoRelease: true });
  using prof = new Profiler({ device: false }).start();
  let batches = 0;
  for await (const _ of loader) batches++;
  prof.stop();
  const row = (await prof.collect()).find((r) => r.name === "loader.batch");
  assert.strictEqual(row?.calls, batches, "one span per batch, from hand-out to back");
  const trace = prof.chromeTrace().traceEvents;
  const track = trace.find((e) =>
    e.ph === "M" && (e.args as { name: string }).name === "loader workers"
  );
  assert.ok(track !== undefined);
  assert.strictEqual(
    trace.filter((e) => e.name === "loader.batch" && e.tid === track.tid).length,
    batches,
  );
});

// ---- operations per training step --------------------------------------------------------

/**
 * The budget of one CIFAR-net training step (train/models.ts cifarModel, fp16, SGD with
 * momentum, weight decay and Nesterov, a GradScaler, the Trainer), in backend calls; the same on
 * every backend, since each call of the library counts once (internal/op_count.ts). Written out
 * so a change that adds operations to the step has to change this table, and say why (docs/
 * profiling.md keeps the same table):
 *
 *   forward   5 conv + 5 batch norm with its ReLU (one call each; the running statistics are
 *             backed up inside it) + 3 max-pool + Linear's matmul with its bias
 *             added in the GEMM's epilogue + the logit Scale's multiply      = 15 kernels
 *             Flatten's device-to-device copy                                  =  1 copy
 *   loss      cross-entropy (forward and gradient in one call)                 =  1 kernel
 *   backward  the logit Scale's multiply; Linear: 2 matmuls (dW, dX) + bias gradient;
 *             3 max-pool; 5 batch norm with its ReLU; 5 weight and 4 data gradients
 *             of the conv (none for the first conv's input)                    = 21 kernels
 *             Flatten's copy back                                              =  1 copy
 *   step      multi-tensor inf check + multi-tensor SGD over all 17 parameters + step
 *             count + one restore of every running statistic if skipped + scale
 *             update                                                           =  5 kernels
 *             the found-inf flag cleared for the next step                     =  1 memset
 *
 * No allocations, frees or synchronizations: the workspaces, the parameter list and
 * the statistics list are made on the first step and kept, and nothing is read back. Nor
 * does the library allocate inside its calls (Device.scratchAllocations): the split-K
 * partial sums of the convolutions and the CPU's per-call buffers come from scratch it keeps.
 */
const CIFAR_STEP_BUDGET = {
  kernels: 15 + 1 + 21 + 5,
  copies: 2,
  memsets: 1,
  allocations: 0,
  frees: 0,
  syncs: 0,
};

testEachBackend(
  "one CIFAR-net training step queues its budget of operations and no sync",
  async (device) => {
    using model = cifarModel(0).to(device);
    using opt = new SGD(model.parameters(), {
      lr: 0.05,
      momentum: 0.9,
      weightDecay: 5e-4,
      nesterov: true,
    });
    using scaler = new GradScaler(device);
    using trainer = new Trainer(model, { optimizer: opt, scaler });
    using x = Tensor.fromHost(
      device,
      Float16Array.from({ length: 2 * 3 * 32 * 32 }, (_, i) => Math.sin(i)),
      [2, 3, 32, 32],
    );
    using y = Tensor.fromHost(device, new Int32Array([3, 7]), [2]);
    {
      // The first step makes the workspaces and uploads the lists. Profiled like the steps
      // below: a profiled step runs op by op on the current stream, where the library keeps
      // its scratch (per stream on CUDA).
      using _ = new Profiler({ device: false }).start();
      trainer.trainStep(x, y);
    }
    for (let step = 0; step < 2; step++) {
      const scratch = device.scratchAllocations();
      using prof = new Profiler({ device: false }).start();
      trainer.trainStep(x, y);
      prof.stop();
      assert.deepStrictEqual(prof.opCounts(), CIFAR_STEP_BUDGET, `step ${step + 2}`);
      assert.strictEqual(device.scratchAllocations() - scratch, 0, `step ${step + 2}: scratch`);
      const row = prof.stats().find((r) => r.name === "train.step")!;
      assert.deepStrictEqual(row.ops, CIFAR_STEP_BUDGET, "the train.step range counts the same");
      assert.match(prof.table(), /^name +calls +total ms +mean ms +share +device ms +ops +syncs$/m);
    }
    await device.synchronize();
  },
);

testEachBackend(
  "the scratch a convolution's weight gradient needs is allocated once per larger size",
  async (device) => {
    // A fresh stream (CUDA keeps scratch per stream) and a size above any other test's (the
    // CPU keeps it per calling thread): the first call grows the kept scratch, for the split-K
    // partial sums on CUDA and the per-chunk partials on the CPU; the repeat and a smaller
    // batch do not.
    using stream = new Stream(device);
    const run = (n: number) => {
      using x = ops.randn(device, [n, 64, 6, 6], { seed: n, stream });
      using dy = ops.randn(device, [n, 256, 6, 6], { seed: n + 1, stream });
      using dw = Tensor.empty(device, [256, 64, 3, 3], "f32");
      ops.conv2dBackwardWeight(dy, dw, { x, padding: 1, stream });
    };
    const at = () => device.scratchAllocations();
    let before = at();
    run(8);
    assert.ok(at() > before, "the first call of a new size grows the scratch");
    before = at();
    run(8);
    run(4);
    assert.strictEqual(at(), before, "the same or a smaller size reuses it");
    await stream.synchronize();
    await device.synchronize();
  },
);

Deno.test({
  name: "with CUDA graphs a CIFAR-net training step is its two input copies and one launch [cuda]",
  ignore: CUDA.ignore,
  async fn() {
    // The counter counts what the ABI is asked to do: the recorded step replays as one
    // ps_graph_launch. No profiler here: a profiled step runs op by op (its ranges time each op).
    using device = Device.open("cuda");
    using model = cifarModel(0).to(device);
    using opt = new SGD(model.parameters(), { lr: 0.05, momentum: 0.9, nesterov: true });
    using scaler = new GradScaler(device);
    using trainer = new Trainer(model, { optimizer: opt, scaler, cudaGraphs: true });
    using x = Tensor.fromHost(device, new Float16Array(2 * 3 * 32 * 32).fill(0.5), [2, 3, 32, 32]);
    using y = Tensor.fromHost(device, new Int32Array([3, 7]), [2]);
    trainer.trainStep(x, y); // op by op: makes the buffers
    trainer.trainStep(x, y); // records the graph
    assert.ok(trainer.cudaGraphsActive, "the step was recorded");
    for (let step = 0; step < 2; step++) {
      const before = opCounts();
      trainer.trainStep(x, y);
      assert.deepStrictEqual(opDelta(opCounts(), before), {
        kernels: 1,
        copies: 2,
        memsets: 0,
        allocations: 0,
        frees: 0,
        syncs: 0,
      });
    }
    await device.synchronize();
  },
});
