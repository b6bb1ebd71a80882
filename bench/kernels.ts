/**
 * Throughput of the nn kernels: GFLOP/s of matmul and of the convolutions of the small
 * Fashion-MNIST CNN (conv3x3 1->32, relu, pool, conv3x3 32->64, relu, pool, linear 3136->10)
 * at batch 128, then the time of one whole training step of that CNN built from ops/
 * (forward, backward, loss, SGD with momentum) and the epoch time it implies (469 steps).
 * Writes bench/results/kernels.json.
 *
 *     deno run -A bench/kernels.ts [--device cpu|cuda|auto] [--batch 128] [--reps 20]
 *
 * @module
 */

import { Device, Tensor } from "../mod.ts";
import * as ops from "../ops/mod.ts";
import { assertMeasurable, writeResult } from "./_results.ts";
import { parseCli } from "../train/cli.ts";

const CLI = {
  usage: "deno run -A bench/kernels.ts [options]",
  summary:
    "Throughput of the nn kernels; writes bench/out/kernels.json (bench/results/ with --save).",
  options: {
    save: { kind: "boolean", help: "write to bench/results/ (tracked) instead of bench/out/" },
    device: { kind: "string", choices: ["cpu", "cuda", "auto"], default: "cpu", help: "backend" },
    batch: { kind: "int", min: 1, default: 128, help: "batch size" },
    reps: { kind: "int", min: 1, default: 20, help: "timed repetitions (median kept)" },
  },
} as const;

interface Row {
  name: string;
  ms: number;
  gflops: number | null;
}

function randomHalf(n: number, scale = 1): Float16Array {
  const a = new Float16Array(n);
  for (let i = 0; i < n; i++) a[i] = (Math.random() * 2 - 1) * scale;
  return a;
}

/** Median milliseconds of `fn` over `reps` runs after two warm-ups (synchronized). */
async function time(dev: Device, reps: number, fn: () => void): Promise<number> {
  fn();
  fn();
  await dev.synchronize();
  const ms: number[] = [];
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    fn();
    await dev.synchronize();
    ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  return ms[Math.floor(ms.length / 2)];
}

function gitCommit(): string {
  try {
    const out = new Deno.Command("git", { args: ["rev-parse", "--short", "HEAD"] }).outputSync();
    return new TextDecoder().decode(out.stdout).trim();
  } catch {
    return "unknown";
  }
}

function cpuName(): string {
  try {
    const info = Deno.readTextFileSync("/proc/cpuinfo");
    const name = info.match(/^model name\s*:\s*(.*)$/m)?.[1] ?? Deno.build.arch;
    return `${name}, ${navigator.hardwareConcurrency} logical cores`;
  } catch {
    return Deno.build.arch;
  }
}

/** Runs the benchmark (`deno task bench kernels` calls this). */
export async function main(args: string[] = Deno.args): Promise<void> {
  const cli = parseCli(args, CLI);
  const kind = cli.device as "cpu" | "cuda" | "auto";
  const batch = cli.batch!;
  const reps = cli.reps!;
  using dev = Device.open(kind);
  assertMeasurable(dev);
  const rows: Row[] = [];
  const add = (name: string, ms: number, flop: number | null) => {
    const gflops = flop === null ? null : flop / ms / 1e6;
    rows.push({ name, ms, gflops });
    console.log(
      `${name.padEnd(46)} ${ms.toFixed(3).padStart(9)} ms` +
        (gflops === null ? "" : `  ${gflops.toFixed(1).padStart(7)} GFLOP/s`),
    );
  };
  const keep: Tensor[] = [];
  const t = (data: Float16Array | Float32Array | Int32Array, shape: number[]) => {
    const x = Tensor.fromHost(dev, data, shape);
    keep.push(x);
    return x;
  };
  const e = (shape: number[], dtype: "f16" | "f32" | "i32") => {
    const x = Tensor.empty(dev, shape, dtype);
    keep.push(x);
    return x;
  };
  try {
    console.log(`nn kernels on ${dev.kind} (${cpuName()}), batch ${batch}`);
    // -- matmul
    for (const n of [256, 512, 1024]) {
      const a = t(randomHalf(n * n), [n, n]), b = t(randomHalf(n * n), [n, n]);
      const c = e([n, n], "f32");
      add(
        `matmul ${n}x${n}x${n} -> f32`,
        await time(dev, reps, () => ops.matmul(a, b, { out: c })),
        2 * n ** 3,
      );
    }
    // -- the CNN's convolutions
    const convs = [
      { name: "conv1 1->32 28x28", c: 1, h: 28, co: 32 },
      { name: "conv2 32->64 14x14", c: 32, h: 14, co: 64 },
    ];
    for (const cv of convs) {
      const x = t(randomHalf(batch * cv.c * cv.h * cv.h), [batch, cv.c, cv.h, cv.h]);
      const w = t(randomHalf(cv.co * cv.c * 9, 0.3), [cv.co, cv.c, 3, 3]);
      const y = e([batch, cv.co, cv.h, cv.h], "f16");
      const dx = e([batch, cv.c, cv.h, cv.h], "f16");
      const dw = e([cv.co, cv.c, 3, 3], "f32");
      const flop = 2 * batch * cv.co * cv.h * cv.h * cv.c * 9;
      const o = { padding: 1 };
      add(
        `${cv.name} forward`,
        await time(dev, reps, () => ops.conv2dForward(x, y, { ...o, weight: w })),
        flop,
      );
      add(
        `${cv.name} backward data`,
        await time(dev, reps, () => ops.conv2dBackwardData(y, dx, { ...o, weight: w })),
        flop,
      );
      add(
        `${cv.name} backward weight`,
        await time(dev, reps, () => ops.conv2dBackwardWeight(y, dw, { ...o, x })),
        flop,
      );
    }
    // -- one training step of the CNN from ops (what nn/ layers do, minus their bookkeeping)
    const N = batch;
    const x = t(randomHalf(N * 784), [N, 1, 28, 28]);
    const labels = t(Int32Array.from({ length: N }, () => Math.floor(Math.random() * 10)), [N]);
    const p = (shape: number[], fan: number) => {
      const n = shape.reduce((a, b) => a * b, 1);
      const master = t(Float32Array.from(randomHalf(n, 1 / Math.sqrt(fan))), shape);
      const half = e(shape, "f16");
      ops.cast(master, half);
      return { master, half, grad: e(shape, "f16"), buf: t(new Float32Array(n), shape) };
    };
    const w1 = p([32, 1, 3, 3], 9), b1 = p([32], 9);
    const w2 = p([64, 32, 3, 3], 288), b2 = p([64], 288);
    const w3 = p([10, 3136], 3136), b3 = p([10], 3136);
    const a1 = e([N, 32, 28, 28], "f16"), p1 = e([N, 32, 14, 14], "f16");
    const i1 = e([N, 32, 14, 14], "i32");
    const a2 = e([N, 64, 14, 14], "f16"), p2 = e([N, 64, 7, 7], "f16");
    const i2 = e([N, 64, 7, 7], "i32");
    const logits = e([N, 10], "f16"), dlogits = e([N, 10], "f16");
    const loss = t(new Float32Array(1), [1]), correct = t(new Int32Array(1), [1]);
    const dflat = e([N, 3136], "f16"), dp1 = e([N, 32, 14, 14], "f16");
    const da2 = e([N, 64, 14, 14], "f16"), da1 = e([N, 32, 28, 28], "f16");
    const conv = { padding: 1 }, pool = { kernel: 2, stride: 2 };
    const parts = new Map<string, number>();
    const timed = (name: string, fn: () => void) => {
      const t0 = performance.now();
      fn();
      parts.set(name, (parts.get(name) ?? 0) + performance.now() - t0);
    };
    const step = () => {
      timed("conv1 fwd", () => ops.conv2dForward(x, a1, { ...conv, weight: w1.half }));
      timed("bias/relu/pool", () => {
        ops.biasAdd(a1, b1.half);
        ops.reluForward(a1, a1);
        ops.maxPool2dForward(a1, p1, { ...pool, indices: i1 });
      });
      timed("conv2 fwd", () => ops.conv2dForward(p1, a2, { ...conv, weight: w2.half }));
      timed("bias/relu/pool", () => {
        ops.biasAdd(a2, b2.half);
        ops.reluForward(a2, a2);
        ops.maxPool2dForward(a2, p2, { ...pool, indices: i2 });
      });
      timed("linear + loss", () => {
        ops.matmul(viewAs(p2, [N, 3136]), w3.half, { out: logits, transB: true });
        ops.biasAdd(logits, b3.half);
        ops.crossEntropyForwardBackward(logits, labels, {
          dlogits,
          lossSum: loss,
          correct,
          scale: 1024,
        });
        ops.matmul(dlogits, viewAs(p2, [N, 3136]), { out: w3.grad, transA: true });
        ops.biasGrad(dlogits, b3.grad);
        ops.matmul(dlogits, w3.half, { out: dflat });
      });
      timed("pool/relu/bias bwd", () => {
        ops.maxPool2dBackward(viewAs(dflat, [N, 64, 7, 7]), da2, { indices: i2 });
        ops.reluBackward(da2, da2, { y: a2 });
        ops.biasGrad(da2, b2.grad);
      });
      timed("conv2 bwd weight", () => ops.conv2dBackwardWeight(da2, w2.grad, { ...conv, x: p1 }));
      timed("conv2 bwd data", () => ops.conv2dBackwardData(da2, dp1, { ...conv, weight: w2.half }));
      timed("pool/relu/bias bwd", () => {
        ops.maxPool2dBackward(dp1, da1, { indices: i1 });
        ops.reluBackward(da1, da1, { y: a1 });
        ops.biasGrad(da1, b1.grad);
      });
      timed("conv1 bwd weight", () => ops.conv2dBackwardWeight(da1, w1.grad, { ...conv, x }));
      timed("sgd", () => {
        for (const q of [w1, b1, w2, b2, w3, b3]) {
          ops.sgdStep(q.master, q.grad, {
            lr: 0.01,
            momentum: 0.9,
            momentumBuf: q.buf,
            paramHalf: q.half,
          });
        }
      });
    };
    const stepMs = await time(dev, reps, step);
    parts.clear();
    for (let r = 0; r < reps; r++) step();
    await dev.synchronize();
    for (const [name, ms] of parts) add(`  step part: ${name}`, ms / reps, null);
    const stepsPerEpoch = Math.ceil(60000 / N);
    add(`CNN train step (batch ${N})`, stepMs, null);
    console.log(
      `=> ${(stepMs * stepsPerEpoch / 1000).toFixed(1)} s per 60,000-sample epoch ` +
        `(${stepsPerEpoch} steps; kernels only, no data loading)`,
    );
    const result = {
      benchmark: "kernels",
      date: new Date().toISOString(),
      machine: `${cpuName()}, ${Deno.build.os}, deno ${Deno.version.deno}`,
      commit: gitCommit(),
      command: `deno run -A bench/kernels.ts ${args.join(" ")}`.trim(),
      device: dev.kind,
      batch,
      rows,
      epochSecondsKernelsOnly: stepMs * stepsPerEpoch / 1000,
      // The machines are shared: other processes on the cores slow every row down.
      loadAverageAtEnd: loadAverage(),
    };
    await writeResult("kernels", result, cli.save ?? false);
  } finally {
    for (const x of keep) x.dispose();
  }
}

function loadAverage(): string | null {
  try {
    return Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
  } catch {
    return null;
  }
}

/** The same device memory seen with another shape of equal size (no copy). */
function viewAs(t: Tensor, shape: number[]): Tensor {
  return Object.create(t, { shape: { value: Object.freeze([...shape]) } });
}

if (import.meta.main) await main();
