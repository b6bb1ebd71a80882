/**
 * One CIFAR training step read closely, for the GPU run (bench/gpu_run.sh):
 *
 * 1. **Per-op device times** of one fp16 step of the CIFAR network (examples/cifar.ts, batch
 *    128), from the profiler's events: each `nn.*` op is a range timed by two events on its
 *    stream. The profiled step is queued behind a few unprofiled ones, so its ops are all
 *    queued before the device reaches them and each event pair brackets the op's device time,
 *    not the host's enqueue gaps (while the device is slower than the host; "sum of ops"
 *    against the synchronized step time shows whether it was).
 * 2. **The cost of one enqueue**: an empty FFI call (`ps_abi_version`), a raw FFI call that
 *    launches a one-element ReLU, the same through the TypeScript wrapper (`reluForward`), and
 *    one launch of a CUDA graph holding that ReLU; each `--calls` times without a synchronize.
 * 3. **The step with and without CUDA graphs**: milliseconds per step after warm-up (the best
 *    of `--repeat` synchronized runs of `--steps` steps) and host milliseconds per
 *    `trainStep` call (the enqueue alone).
 *
 *     deno run -A bench/step.ts [--device cuda] [--steps 50] [--calls 10000]
 *
 * Prints tables; writes bench/out/step.json (bench/results/ with --save). The CUDA emulator
 * measures nothing and is refused (unless PINSTREAM_BENCH_SMOKE=1).
 *
 * @module
 */

import { Device, type DeviceKind } from "../ffi/device.ts";
import { captureRefused, CudaGraph } from "../ffi/graph.ts";
import { Profiler } from "../ffi/profiler.ts";
import { Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import { GradScaler, type Precision, SGD } from "../nn/mod.ts";
import * as ops from "../ops/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { cifarModel } from "../train/models.ts";
import { parseCli, runMain } from "../train/cli.ts";
import { assertMeasurable, commitStamp, machine, writeResult } from "./_results.ts";

const CLI = {
  usage: "deno run -A bench/step.ts [options]",
  summary: "One CIFAR step read closely: per-op device times from the profiler, the cost of " +
    "one enqueue, and the step with and without CUDA graphs; writes bench/out/step.json.",
  options: {
    save: { kind: "boolean", help: "write to bench/results/ (tracked) instead of bench/out/" },
    device: { kind: "string", choices: ["auto", "cuda", "cpu"], default: "auto", help: "backend" },
    steps: { kind: "int", min: 1, default: 50, help: "timed steps per repeat" },
    warmup: { kind: "int", min: 2, default: 10, help: "untimed steps first" },
    repeat: { kind: "int", min: 1, default: 3, help: "timed repeats; the fastest is kept" },
    ahead: {
      kind: "int",
      min: 0,
      default: 3,
      help: "unprofiled steps queued before the profiled one",
    },
    calls: { kind: "int", min: 1, default: 10_000, help: "calls per enqueue measurement" },
    "batch-size": { kind: "int", min: 1, default: 128, help: "batch size" },
    precision: { kind: "string", choices: ["fp16", "fp32"], default: "fp16", help: "precision" },
  },
} as const;

interface Setup extends Disposable {
  trainer: Trainer;
  x: Tensor;
  labels: Tensor;
}

function setup(device: Device, precision: Precision, batch: number, cudaGraphs: boolean): Setup {
  const model = cifarModel(0).to(device, { precision });
  const optimizer = new SGD(model.parameters(), { lr: 0.01, momentum: 0.9, weightDecay: 5e-4 });
  const scaler = new GradScaler(device, { enabled: precision === "fp16" });
  const trainer = new Trainer(model, { optimizer, scaler, cudaGraphs });
  const dtype = precision === "fp16" ? "f16" : "f32";
  const x = ops.randn(device, [batch, 3, 32, 32], { seed: 1, dtype });
  const labels = Tensor.fromHost(device, new Int32Array(batch).map((_, i) => (i * 7919) % 10));
  return {
    trainer,
    x,
    labels,
    [Symbol.dispose]() {
      x.dispose();
      labels.dispose();
      trainer.dispose();
      scaler.dispose();
      optimizer.dispose();
      model.dispose();
    },
  };
}

/** Per-op device milliseconds of one step, and the synchronized step they add up against. */
async function profileStep(device: Device, o: Options) {
  using s = setup(device, o.precision, o.batch, false);
  for (let i = 0; i < o.warmup; i++) s.trainer.trainStep(s.x, s.labels);
  await device.synchronize();
  const t0 = performance.now();
  for (let i = 0; i < o.ahead; i++) s.trainer.trainStep(s.x, s.labels);
  using prof = new Profiler().start();
  s.trainer.trainStep(s.x, s.labels);
  prof.stop();
  await device.synchronize();
  const wallMs = (performance.now() - t0) / (o.ahead + 1);
  const rows = (await prof.collect()).filter((r) => r.deviceMs !== undefined);
  const opRows = rows.filter((r) => r.name.startsWith("nn."));
  const sumOps = opRows.reduce((a, r) => a + r.deviceMs!, 0);
  return {
    rows: rows.map((r) => ({
      name: r.name,
      calls: r.calls,
      deviceMs: r.deviceMs!,
      hostMs: r.totalMs,
    })).sort((a, b) => b.deviceMs - a.deviceMs),
    sumOfOpsMs: sumOps,
    stepMs: wallMs,
    table: prof.table(),
  };
}

function nsPer(calls: number, f: () => void): number {
  for (let i = 0; i < Math.min(1000, calls); i++) f();
  const t = performance.now();
  for (let i = 0; i < calls; i++) f();
  return ((performance.now() - t) * 1e6) / calls;
}

/** Host nanoseconds per call of an empty FFI call, a launch, and a graph launch. */
async function enqueueCosts(device: Device, calls: number) {
  const lib = device.lib.symbols;
  const out = new Int32Array(1);
  using one = Tensor.fromHost(device, new Float16Array([1]), [1]);
  const p = one.pointer;
  const result: Record<string, number> = {};
  result.emptyFfiCall = nsPer(calls, () => void lib.ps_abi_version(out));
  await device.synchronize();
  result.ffiPlusLaunch = nsPer(calls, () => void lib.ps_nn_relu_forward(p, p, 1, 1n, null));
  await device.synchronize();
  result.wrapperPlusLaunch = nsPer(calls, () => ops.reluForward(one, one));
  await device.synchronize();
  using stream = new Stream(device, { nonBlocking: true });
  await device.synchronize();
  let graph: CudaGraph | null = null;
  try {
    graph = CudaGraph.capture(stream, () => ops.reluForward(one, one));
    const g = graph;
    result.graphLaunch = nsPer(calls, () => g.launch());
    await stream.synchronize();
  } catch (err) {
    if (!captureRefused(err)) throw err;
    result.graphLaunch = NaN;
  } finally {
    graph?.dispose();
  }
  return result;
}

/** Step time after warm-up (synchronized) and host time per trainStep call. */
async function stepTimes(device: Device, o: Options, cudaGraphs: boolean) {
  using s = setup(device, o.precision, o.batch, cudaGraphs);
  for (let i = 0; i < o.warmup; i++) s.trainer.trainStep(s.x, s.labels);
  await device.synchronize();
  const all: number[] = [], host: number[] = [];
  for (let r = 0; r < o.repeat; r++) {
    let hostMs = 0;
    const t0 = performance.now();
    for (let i = 0; i < o.steps; i++) {
      const h = performance.now();
      s.trainer.trainStep(s.x, s.labels);
      hostMs += performance.now() - h;
    }
    await device.synchronize();
    all.push((performance.now() - t0) / o.steps);
    host.push(hostMs / o.steps);
  }
  return {
    cudaGraphs: s.trainer.cudaGraphsActive,
    msPerStep: Math.min(...all),
    allMsPerStep: all,
    hostMsPerStep: Math.min(...host),
    samplesPerSecond: o.batch / (Math.min(...all) / 1000),
  };
}

interface Options {
  precision: Precision;
  batch: number;
  steps: number;
  warmup: number;
  repeat: number;
  ahead: number;
  calls: number;
}

/**
 * Runs the benchmark.
 *
 * @param args Command-line arguments.
 */
export async function main(args: string[]): Promise<void> {
  const cli = parseCli(args, CLI);
  using device = Device.open(cli.device as DeviceKind);
  assertMeasurable(device);
  const o: Options = {
    precision: cli.precision as Precision,
    batch: cli["batch-size"]!,
    steps: cli.steps!,
    warmup: cli.warmup!,
    repeat: cli.repeat!,
    ahead: cli.ahead!,
    calls: cli.calls!,
  };
  const load = Deno.loadavg()[0];
  console.log(
    `# one CIFAR step (${o.precision}, batch ${o.batch}) on ${device} (${device.props.name})`,
  );
  const profile = await profileStep(device, o);
  console.log(
    `\n## per-op device time of one step (after ${o.ahead} unprofiled steps queued ahead)`,
  );
  console.log(profile.table);
  console.log(
    `sum of the nn.* ops ${profile.sumOfOpsMs.toFixed(3)} ms; synchronized step ` +
      `${profile.stepMs.toFixed(3)} ms (profiled, with its event pairs)`,
  );
  const enqueue = await enqueueCosts(device, o.calls);
  console.log(`\n## host cost of one enqueue (ns per call, ${o.calls} calls, no synchronize)`);
  for (const [k, v] of Object.entries(enqueue)) {
    console.log(`${k.padEnd(20)} ${v.toFixed(0).padStart(8)}`);
  }
  const eager = await stepTimes(device, o, false);
  const graphs = await stepTimes(device, o, true);
  console.log(`\n## the step after ${o.warmup} warm-up steps (best of ${o.repeat} x ${o.steps})`);
  console.log(
    `${"".padEnd(16)} ${"ms/step".padStart(8)} ${"host ms".padStart(8)} ${
      "samples/s".padStart(10)
    }`,
  );
  for (
    const [name, r] of [["op by op", eager], [
      `graphs (${graphs.cudaGraphs ? "on" : "refused"})`,
      graphs,
    ]] as const
  ) {
    console.log(
      `${name.padEnd(16)} ${r.msPerStep.toFixed(3).padStart(8)} ${
        r.hostMsPerStep.toFixed(3).padStart(8)
      } ` +
        `${Math.round(r.samplesPerSecond).toLocaleString("en-US").padStart(10)}`,
    );
  }
  await writeResult("step", {
    benchmark: "step",
    commit: await commitStamp(),
    machine: machine(),
    device: `${device} (${device.props.name})`,
    load,
    options: o,
    profile: { rows: profile.rows, sumOfOpsMs: profile.sumOfOpsMs, stepMs: profile.stepMs },
    enqueueNs: enqueue,
    steps: { eager, graphs },
  }, cli.save ?? false);
}

if (import.meta.main) runMain(() => main(Deno.args));
