/**
 * Data-parallel benchmark: pinstream's DataParallel over MPI against PyTorch's DDP over Gloo
 * (bench/dist_torch.py), in one run, and pinstream's all-reduce against raw MPI
 * (bench/mpi_allreduce.c).
 *
 * - Step time of the Fashion-MNIST MLP and CNN at batch 64 per rank, fp32 SGD, on 1 and 2
 *   ranks, one compute thread per rank on both sides (PINSTREAM_NUM_THREADS=1,
 *   torch.set_num_threads(1), OPENBLAS_NUM_THREADS=1); scaling efficiency = 1-rank step time
 *   / 2-rank step time (the per-rank batch is fixed, so 100% is a perfect 2x throughput);
 *   and the host's ceiling for it: two independent 1-rank pinstream processes run at once
 *   (no communication), 1-rank step time alone / their step time.
 * - All-reduce bandwidth of 1-64 MiB of f32 on 2 ranks, under each installed MPI (Open MPI,
 *   MPICH): pinstream's blocking allReduce, its asynchronous form, and the C program's
 *   MPI_Allreduce with the same library and launcher; also MPI_Allreduce called through FFI
 *   in the same processes, call for call in turn with pinstream's (the same moment's
 *   reference, which holds on a loaded host where two separate runs do not).
 * - Overlap on 2 ranks, CNN with 5 buckets: forward+backward alone, the buckets' all-reduce
 *   alone, and DataParallel's forward+backward with the all-reduce, in turn within one run;
 *   hidden = (alone + alone - both) / the all-reduce alone.
 *
 *     deno run -A bench/dist.ts [--save] [--steps 60] [--repeat 3]
 *
 * Each measurement is repeated, pinstream and its reference alternating run by run, and the
 * medians reported (of the calls within a run, then of the runs), with the load average: the
 * machine is shared, and the ratio of two runs made one after the other is what holds.
 *
 * Writes bench/out/dist.json (bench/results/ with --save). Ranks are started with mpirun by
 * this driver; `--part` runs one rank's part (internal).
 *
 * @module
 */

import { parseArgs } from "node:util";
import { existsSync } from "node:fs";
import {
  availableMpi,
  DataParallel,
  Device,
  FashionMNIST,
  launchEnv,
  mpirunCommand,
  ProcessGroup,
  SGD,
  Tensor,
  Trainer,
} from "../mod.ts";
import { FASHION_MNIST_DEBIAN_ROOT } from "../loader/datasets/mnist.ts";
import { fashionModel } from "../train/models.ts";
import { openMpi } from "../dist/_mpi.ts";
import { commitStamp, machine, writeResult } from "./_results.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    part: { type: "string" },
    model: { type: "string", default: "cnn" },
    steps: { type: "string", default: "60" },
    repeat: { type: "string", default: "3" },
    "bucket-mb": { type: "string", default: "25" },
    save: { type: "boolean", default: false },
    help: { type: "boolean", default: false },
  },
});
if (values.help) {
  console.log(
    "usage: deno run -A bench/dist.ts [--save] [--steps N]\n" +
      "DataParallel over MPI vs PyTorch DDP over Gloo, all-reduce vs raw MPI, overlap; writes " +
      "bench/out/dist.json (bench/results/ with --save).",
  );
  Deno.exit(0);
}
const BATCH = 64;
/** The distribution's Python, which has PyTorch (a pyenv shim first on PATH may not). */
const PYTHON = existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
const SIZES_MIB = [1, 4, 16, 64];
const ROOT = Deno.env.get("PINSTREAM_FASHION_ROOT") ?? FASHION_MNIST_DEBIAN_ROOT;

/** This rank's batches of Fashion-MNIST, normalized f32 on the device. */
async function batches(device: Device, group: ProcessGroup, count: number) {
  const train = await FashionMNIST.load({ root: ROOT, train: true });
  const out: { x: Tensor; y: Tensor }[] = [];
  for (let k = 0; k < count; k++) {
    const first = ((k * group.size + group.rank) * BATCH) % (train.length - BATCH);
    const x = new Float32Array(BATCH * 784);
    for (let i = 0; i < x.length; i++) {
      x[i] = (train.images[first * 784 + i] / 255 - 0.286) / 0.353;
    }
    const y = Int32Array.from(train.labels.subarray(first, first + BATCH));
    out.push({
      x: Tensor.fromHost(device, x, [BATCH, 1, 28, 28]),
      y: Tensor.fromHost(device, y, [BATCH]),
    });
  }
  return out;
}

/** One rank's part; rank 0 prints `RESULT <json>`. */
async function rankPart(part: string): Promise<void> {
  using group = ProcessGroup.init({ timeoutMs: 300_000 });
  using device = Device.open("cpu");
  const report = (r: unknown) => group.rank === 0 && console.log(`RESULT ${JSON.stringify(r)}`);
  if (part === "allreduce") {
    // MPI_Allreduce called straight through FFI, call for call in turn with pinstream's: the
    // same moment's reference, which on a loaded host the C program's separate run is not.
    const lib = openMpi({ flavor: group.mpi });
    const c = lib.c;
    const rows = [];
    for (const mib of SIZES_MIB) {
      const buf = new Float32Array(mib * 2 ** 20 / 4).fill(1);
      const p = Deno.UnsafePointer.of(buf);
      const iters = mib <= 4 ? 20 : mib <= 16 ? 10 : 5;
      const calls = {
        direct: () => lib.fn.MPI_Allreduce(c.inPlace, p, buf.length, c.float, c.sum, c.commWorld),
        blocking: () => group.allReduce(buf),
        async: () => group.allReduceAsync(buf).waitSync(),
      };
      const ms: Record<keyof typeof calls, number[]> = { direct: [], blocking: [], async: [] };
      for (let i = -2; i < iters; i++) {
        for (const [name, call] of Object.entries(calls)) {
          group.barrier();
          const t0 = performance.now();
          call();
          if (i >= 0) ms[name as keyof typeof calls].push(performance.now() - t0);
        }
      }
      const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
      rows.push({
        mib,
        iters,
        bestMs: Math.min(...ms.blocking),
        medianMs: med(ms.blocking),
        asyncMedianMs: med(ms.async),
        directMedianMs: med(ms.direct),
        // Call by call: the direct call's time over pinstream's right after it.
        pairRatioMedian: med(ms.direct.map((d, i) => d / ms.blocking[i])),
        asyncPairRatioMedian: med(ms.direct.map((d, i) => d / ms.async[i])),
      });
    }
    report(rows);
    return;
  }
  const steps = Number(values.steps);
  const data = await batches(device, group, Math.min(steps, 50));
  const m = fashionModel(values.model!).to(device, { precision: "fp32" });
  const dp = new DataParallel(m, group, { bucketMB: Number(values["bucket-mb"]) });
  const opt = new SGD(dp.parameters(), { lr: 0.01, momentum: 0.9 });
  const time = (fn: (k: number) => void) => {
    for (let k = 0; k < 5; k++) fn(k);
    group.barrier();
    const t0 = performance.now();
    for (let k = 0; k < steps; k++) fn(k);
    group.barrier();
    return (performance.now() - t0) / steps;
  };
  if (part === "train") {
    using trainer = new Trainer(dp, { optimizer: opt });
    const ms = time((k) => trainer.trainStep(data[k % data.length].x, data[k % data.length].y));
    report({ model: values.model, ranks: group.size, msPerStep: ms });
    return;
  }
  // overlap: forward+backward alone, the buckets' all-reduce alone, and DataParallel's
  // forward+backward with the all-reduce, in turn round after round (medians of the rounds).
  const dy = Tensor.fromHost(device, new Float32Array(BATCH * 10).fill(1e-3), [BATCH, 10]);
  const flats = dp.buckets.map((ps) => new Float32Array(ps.reduce((a, p) => a + p.numel, 0)));
  const rounds = 5, per = Math.max(1, Math.floor(steps / rounds));
  const block = (fn: (k: number) => void) => {
    group.barrier();
    const t0 = performance.now();
    for (let k = 0; k < per; k++) fn(k);
    group.barrier();
    return (performance.now() - t0) / per;
  };
  const compute = (k: number) => {
    m.forward(data[k % data.length].x);
    m.backward(dy, { inputGrad: false });
  };
  const comm = () => {
    for (const w of flats.map((f) => group.allReduceAsync(f))) w.waitSync();
  };
  const both = (k: number) => {
    dp.forward(data[k % data.length].x);
    dp.backward(dy, { inputGrad: false });
  };
  for (let k = 0; k < 3; k++) [compute, comm, both].forEach((f) => f(k));
  const c: number[] = [], a: number[] = [], b: number[] = [];
  for (let r = 0; r < rounds; r++) {
    c.push(block(compute));
    a.push(block(comm));
    b.push(block(both));
  }
  const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1];
  const computeMs = med(c), commMs = med(a), bothMs = med(b);
  report({
    model: values.model,
    buckets: flats.map((f) => f.length * 4),
    computeMs,
    commMs,
    bothMs,
    // The share of the all-reduce that backward hid: 1 when both took as long as compute
    // alone, 0 when as long as the two one after the other.
    hidden: (computeMs + commMs - bothMs) / commMs,
  });
}

async function run(cmd: string[], env: Record<string, string> = {}): Promise<string> {
  const o = await new Deno.Command(cmd[0], {
    args: cmd.slice(1),
    env: { NO_COLOR: "1", PINSTREAM_NUM_THREADS: "1", OPENBLAS_NUM_THREADS: "1", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  if (o.code !== 0) {
    throw new Error(`${cmd.join(" ")} failed (${o.code}):\n${dec.decode(o.stderr).slice(-2000)}`);
  }
  return dec.decode(o.stdout);
}

function results(out: string): unknown[] {
  return out.split("\n").filter((l) => l.startsWith("RESULT ")).map((l) => JSON.parse(l.slice(7)));
}

/** The step times as the chart's bars (train/_chart.ts). */
export function chartRows(
  train: readonly { model: string; ranks: number; pinstreamMs: number; torchMs: number }[],
): { name: string; impl: string; msPerStep: number }[] {
  return train.flatMap((r) => {
    const what = `${r.model.toUpperCase()}, ${r.ranks} rank${r.ranks > 1 ? "s" : ""}`;
    return [
      { name: `${what}: pinstream (MPI)`, impl: "pinstream", msPerStep: r.pinstreamMs },
      { name: `${what}: PyTorch DDP (Gloo)`, impl: "pytorch", msPerStep: r.torchMs },
    ];
  });
}

async function driver(): Promise<void> {
  if (!existsSync(ROOT)) throw new Error(`Cannot benchmark: no Fashion-MNIST at ${ROOT}`);
  const here = new URL(".", import.meta.url).pathname;
  const self = new URL(import.meta.url).pathname;
  const steps = values.steps!;
  const load = () => Deno.loadavg()[0];
  const loadBefore = Deno.loadavg();
  const ranks = (n: number, args: string[]) =>
    n === 1
      ? [Deno.execPath(), "run", "-A", self, ...args]
      : mpirunCommand([self, ...args], { n, mpi: "openmpi" });

  // Raw MPI, built here against each MPI, and pinstream's all-reduce under the same mpirun,
  // run after run in turn (raw, pinstream, raw, ...): the ratio compares runs of one moment.
  await Deno.mkdir(`${here}out`, { recursive: true });
  const repeat = Number(values.repeat);
  type Timed = {
    mib: number;
    bestMs: number;
    medianMs: number;
    asyncMedianMs?: number;
    directMedianMs?: number;
    pairRatioMedian?: number;
    asyncPairRatioMedian?: number;
  };
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
  const allreduce = [];
  for (const mpi of availableMpi()) {
    const exe = `${here}out/mpi_allreduce_${mpi}`;
    await run([`mpicc.${mpi}`, "-O2", "-o", exe, `${here}mpi_allreduce.c`]);
    const mpirun = mpirunCommand(["x"], { n: 2, mpi });
    const rawCmd = [
      ...mpirun.slice(0, mpirun.indexOf(Deno.execPath())),
      exe,
      ...SIZES_MIB.map(String),
    ];
    const oursCmd = mpirunCommand([self, "--part", "allreduce"], { n: 2, mpi });
    const rawRuns: Timed[][] = [], ourRuns: Timed[][] = [];
    const loads: number[] = [];
    for (let k = 0; k < repeat; k++) {
      loads.push(load());
      rawRuns.push((await run(rawCmd)).trim().split("\n").map((l) => JSON.parse(l)));
      ourRuns.push(results(await run(oursCmd))[0] as Timed[]);
    }
    for (const [i, mib] of SIZES_MIB.entries()) {
      const raw = rawRuns.map((r) => r[i]), ours = ourRuns.map((r) => r[i]);
      const rawMs = median(raw.map((r) => r.medianMs));
      const oursMs = median(ours.map((r) => r.medianMs));
      const asyncMs = median(ours.map((r) => r.asyncMedianMs!));
      const gbps = (ms: number) => mib * 2 ** 20 / (ms / 1000) / 1e9;
      allreduce.push({
        mpi,
        mib,
        rawMedianMs: rawMs,
        pinstreamMedianMs: oursMs,
        pinstreamAsyncMedianMs: asyncMs,
        rawGBps: gbps(rawMs),
        pinstreamGBps: gbps(oursMs),
        ratio: rawMs / oursMs,
        asyncRatio: rawMs / asyncMs,
        // Pair by pair (run k of each): the spread of the ratio over the runs.
        pairRatios: raw.map((r, k) => r.medianMs / ours[k].medianMs),
        // The same moment's reference: MPI_Allreduce through FFI, call for call in turn with
        // pinstream's in the same processes (median over runs of each run's median ratio).
        directMedianMs: median(ours.map((r) => r.directMedianMs!)),
        sameMomentRatio: median(ours.map((r) => r.pairRatioMedian!)),
        sameMomentAsyncRatio: median(ours.map((r) => r.asyncPairRatioMedian!)),
        rawBestMs: Math.min(...raw.map((r) => r.bestMs)),
        pinstreamBestMs: Math.min(...ours.map((r) => r.bestMs)),
        load: median(loads),
      });
    }
  }
  console.table(allreduce.map(({ pairRatios: _, ...r }) => r));

  const train: {
    model: string;
    ranks: number;
    pinstreamMs: number;
    torchMs: number;
    pinstreamRuns: number[];
    torchRuns: number[];
    load: number;
  }[] = [];
  for (const m of ["mlp", "cnn"]) {
    for (const n of [1, 2]) {
      const l = load();
      const ours: number[] = [], theirs: number[] = [];
      for (let k = 0; k < repeat; k++) {
        const p = results(
          await run(ranks(n, ["--part", "train", "--model", m, "--steps", steps])),
        )[0] as { msPerStep: number };
        ours.push(p.msPerStep);
        const torchArgs = ["--model", m, "--world", String(n), "--steps", steps];
        const out = await run([PYTHON, `${here}dist_torch.py`, ...torchArgs]);
        theirs.push(JSON.parse(out.trim().split("\n").pop()!).msPerStep);
      }
      train.push({
        model: m,
        ranks: n,
        pinstreamMs: median(ours),
        torchMs: median(theirs),
        pinstreamRuns: ours,
        torchRuns: theirs,
        load: l,
      });
    }
  }
  // The host's own ceiling: two independent 1-rank processes at once (no communication), each
  // step time against one process alone. Two ranks cannot scale better than two processes that
  // only share the machine.
  const pair: { model: string; stepsMs: number[] }[] = [];
  for (const m of ["mlp", "cnn"]) {
    const stepsMs: number[] = [];
    for (let k = 0; k < repeat; k++) {
      const both = await Promise.all(
        [0, 1].map(() => run(ranks(1, ["--part", "train", "--model", m, "--steps", steps]))),
      );
      for (const out of both) stepsMs.push((results(out)[0] as { msPerStep: number }).msPerStep);
    }
    pair.push({ model: m, stepsMs });
  }
  const scaling = ["mlp", "cnn"].map((m) => {
    const one = train.find((r) => r.model === m && r.ranks === 1)!;
    const two = train.find((r) => r.model === m && r.ranks === 2)!;
    const apart = pair.find((r) => r.model === m)!;
    return {
      model: m,
      pinstreamEfficiency: one.pinstreamMs / two.pinstreamMs,
      torchEfficiency: one.torchMs / two.torchMs,
      pinstreamVsTorch2Ranks: two.torchMs / two.pinstreamMs,
      // 1-rank step alone / the median step of two independent processes run at once.
      hostCeiling: one.pinstreamMs / median(apart.stepsMs),
      independentPairMs: apart.stepsMs,
    };
  });
  console.table(train.map(({ pinstreamRuns: _, torchRuns: __, ...r }) => r));
  console.table(scaling.map(({ independentPairMs: _, ...r }) => r));
  // Small buckets, so that the CNN's 200 KB of gradients make several and some can overlap.
  const overlapArgs = ["--part", "overlap", "--model", "cnn", "--steps", steps, "--bucket-mb"];
  const overlap = results(await run(ranks(2, [...overlapArgs, "0.05"])))[0];
  console.log("overlap", overlap);
  const path = await writeResult("dist", {
    benchmark: "dist",
    date: new Date().toISOString(),
    machine: await machine(),
    loadAverage: { before: loadBefore, after: Deno.loadavg() },
    commit: await commitStamp(),
    command: `deno run -A bench/dist.ts${values.save ? " --save" : ""} --steps ${steps} ` +
      `--repeat ${repeat}`,
    config: {
      batchPerRank: BATCH,
      precision: "fp32 on both sides, SGD momentum 0.9",
      threads: "one compute thread per rank (PINSTREAM_NUM_THREADS=1; torch 1 thread, " +
        "OPENBLAS_NUM_THREADS=1)",
      mpi: "Open MPI (mpirun.openmpi --oversubscribe) for the training steps, bucketMB 25 " +
        "(0.05 in the overlap run); the all-reduce under every installed MPI",
      statistic: "medians: of the calls within a run, then of the runs (pinstream and its " +
        "reference alternating run by run)",
      repeat,
      torch: "DistributedDataParallel, Gloo backend, default buckets",
      steps: Number(steps),
    },
    allreduce,
    train,
    scaling,
    overlap,
    rows: chartRows(train),
  }, values.save);
  console.log(`wrote ${path}`);
}

if (values.part) await rankPart(values.part);
else if (launchEnv().size > 1) throw new Error("Cannot benchmark: run the driver without mpirun");
else await driver();
