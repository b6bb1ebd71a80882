/**
 * What the profiler costs (ffi/profiler.ts): `range()` with no profiler active, against an empty
 * call, in nanoseconds per call; and training steps of a small CNN with the profiler off and on.
 * The hooks run on every op and batch, so "off" must cost nothing measurable: the bound printed
 * is the hooks' share of a step when off (calls per step x ns per call / step time).
 *
 *     deno run -A bench/profiler.ts [--steps 60] [--calls 5000000]
 *
 * Prints a table; writes bench/out/profiler.json (bench/results/ with --save).
 *
 * @module
 */

import { Device } from "../mod.ts";
import { activeProfiler, Profiler, range } from "../ffi/profiler.ts";
import { Tensor } from "../ffi/tensor.ts";
import { fashionModel } from "../train/models.ts";
import { GradScaler, SGD } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { parseCli, runMain } from "../train/cli.ts";
import { assertMeasurable, commitStamp, machine, writeResult } from "./_results.ts";

const CLI = {
  usage: "deno run -A bench/profiler.ts [options]",
  summary: "The profiler's cost: range() when off, and training steps with it off and on.",
  options: {
    steps: { kind: "int", min: 5, default: 60, help: "training steps per measurement" },
    calls: { kind: "int", min: 1000, default: 5_000_000, help: "range() calls timed" },
    save: { kind: "boolean", help: "write to bench/results/ (tracked) instead of bench/out/" },
  },
} as const;

function nsPerCall(calls: number, f: () => void): number {
  for (let i = 0; i < 1000; i++) f();
  const t = performance.now();
  for (let i = 0; i < calls; i++) f();
  return ((performance.now() - t) * 1e6) / calls;
}

async function main(args: string[]): Promise<void> {
  const cli = parseCli(args, CLI);
  if (activeProfiler() !== undefined) throw new Error("a profiler is already active");
  const calls = cli.calls!, steps = cli.steps!;
  // The baseline returns one shared object too, as range() does when off: the difference is
  // the profiler's check.
  const shared: Disposable = { [Symbol.dispose]() {} };
  const noop = (_name: string): Disposable => shared;
  let sink = 0;
  const empty = nsPerCall(calls, () => {
    using _ = noop("x");
    sink++;
  });
  const off = nsPerCall(calls, () => {
    using _ = range("x");
    sink++;
  });

  using dev = Device.open("cpu");
  assertMeasurable(dev);
  using model = fashionModel("cnn").to(dev);
  using opt = new SGD(model.parameters(), { lr: 0.01, momentum: 0.9 });
  using scaler = new GradScaler(dev);
  using trainer = new Trainer(model, { optimizer: opt, scaler });
  const n = 128;
  const pixels = new Float16Array(n * 784);
  for (let i = 0; i < pixels.length; i++) pixels[i] = ((i * 2654435761) % 1000) / 1000;
  using x = Tensor.fromHost(dev, pixels, [n, 1, 28, 28]);
  using y = Tensor.fromHost(dev, Int32Array.from({ length: n }, (_, i) => i % 10), [n]);
  const stepMs = async (profile: boolean): Promise<{ ms: number; ranges: number }> => {
    for (let i = 0; i < 3; i++) trainer.trainStep(x, y);
    await dev.synchronize();
    const prof = profile ? new Profiler().start() : undefined;
    const t = performance.now();
    for (let i = 0; i < steps; i++) trainer.trainStep(x, y);
    await dev.synchronize();
    const ms = (performance.now() - t) / steps;
    prof?.stop();
    const rows = prof ? await prof.collect() : [];
    prof?.[Symbol.dispose]();
    return { ms, ranges: rows.reduce((s, r) => s + r.calls, 0) / steps };
  };
  const offStep = await stepMs(false), onStep = await stepMs(true);
  const offAgain = await stepMs(false);
  const stepOff = Math.min(offStep.ms, offAgain.ms);
  const boundPct = (onStep.ranges * Math.max(0, off - empty) * 1e-6 / stepOff) * 100;
  console.log(
    `range() with no profiler: ${off.toFixed(1)} ns per call (a call returning a shared ` +
      `object: ${empty.toFixed(1)} ns)`,
  );
  console.log(
    `training step (fashion CNN, batch ${n}, cpu): profiler off ${stepOff.toFixed(2)} ms, ` +
      `on ${onStep.ms.toFixed(2)} ms (${onStep.ranges.toFixed(0)} ranges per step)`,
  );
  console.log(`hooks when off: at most ${boundPct.toFixed(4)}% of a step`);
  if (sink < 0) console.log(sink);
  await writeResult("profiler", {
    benchmark: "profiler",
    date: new Date().toISOString(),
    machine: await machine(),
    commit: await commitStamp(),
    command: `deno run -A bench/profiler.ts ${args.join(" ")}`.trim(),
    loadAverage: Deno.loadavg()[0],
    rows: [
      { name: "a call returning a shared object", nsPerCall: empty },
      { name: "range() with no profiler", nsPerCall: off },
      { name: "training step, profiler off", ms: stepOff },
      { name: "training step, profiler on", ms: onStep.ms, rangesPerStep: onStep.ranges },
    ],
    offShareOfStepPercentBound: boundPct,
  }, cli.save ?? false);
}

if (import.meta.main) await runMain(() => main(Deno.args));
