// The profiler (ffi/profiler.ts): named host ranges with nesting, device ranges timed by events
// on a stream (every backend present), the per-name table, the Chrome trace, and nothing at all
// when no profiler is active.

import assert from "node:assert";
import { DeviceBuffer, HostBuffer } from "../ffi/memory.ts";
import { activeProfiler, Profiler, range } from "../ffi/profiler.ts";
import { Stream } from "../ffi/stream.ts";
import { testEachBackend } from "./_backends.ts";
import { makeData, makeLoader, MEAN, STD } from "./pipeline_fixtures.ts";
import { toDevice } from "../pipeline/prefetcher.ts";
import { Flatten, GradScaler, Linear, Sequential, SGD } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";

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
  assert.match(table[0], /^name +calls +total ms +mean ms +share +device ms$/);
  assert.match(table[1], /^step +4 +\d+\.\d\d +\d+\.\d{3} +\d+\.\d%$/);
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
        "nn.sgdStep",
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
