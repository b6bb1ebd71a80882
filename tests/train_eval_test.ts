// The fit loop's evaluation schedule (--eval-every, --eval-every-steps), its TensorBoard
// output (--tensorboard), the loader counts (--workers auto, --prefetch-factor) and the
// memory line of its summary, on the CPU backend with a small random set: which steps
// evaluate, what the epochs without evaluation report, and what the event file and the JSON
// Lines hold.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { DataLoader, type RingBatch, TensorDataset } from "../loader/mod.ts";
import { Xoshiro128 } from "../nn/mod.ts";
import {
  type EvalReport,
  parseTrainArgs,
  runTraining,
  summaryText,
  type TrainArgs,
  trainImages,
} from "../train/fit.ts";
import { MetricsLog } from "../train/metrics.ts";
import { fashionModel } from "../train/models.ts";
import { nvmlStandIn } from "./_nvml_stand_in.ts";

function randomSet(n: number, seed: number): TensorDataset {
  const rng = new Xoshiro128(seed);
  const images = new Uint8Array(n * 784).map(() => rng.nextU32() & 0xff);
  const labels = new Int32Array(n).map(() => rng.nextU32() % 10);
  return new TensorDataset({ image: { data: images, shape: [1, 28, 28] }, label: labels });
}

async function fit(extra: Partial<TrainArgs>, dir: string, gpuStats?: boolean) {
  const args: TrainArgs = {
    ...parseTrainArgs(["--device", "cpu", "--quiet", "--workers", "0"], "test", {}),
    epochs: 3,
    batchSize: 64,
    model: "mlp",
    log: `${dir}/run.jsonl`,
    ...extra,
  };
  using device = Device.open("cpu");
  const net = fashionModel("mlp", 0).to(device, { precision: args.precision });
  const common = { batchSize: 64, numWorkers: 0, seed: 0, autoRelease: false };
  await using trainLoader = new DataLoader<RingBatch>(randomSet(512, 1), {
    ...common,
    shuffle: true,
  });
  await using testLoader = new DataLoader<RingBatch>(randomSet(128, 2), common);
  const evals: EvalReport[] = [];
  try {
    const reports = await runTraining({
      args,
      device,
      model: net,
      trainLoader,
      testLoader,
      spec: { mean: [0.5], std: [0.25] },
      onEval: (r) => evals.push(r),
      gpuStats,
    });
    return { reports, evals };
  } finally {
    net.dispose();
  }
}

Deno.test("--eval-every 2 --eval-every-steps 5: evaluations by step and by epoch, the last epoch always", async () => {
  const dir = await Deno.makeTempDir();
  try {
    // 512 samples in batches of 64: 8 steps per epoch, 24 in all.
    const { reports, evals } = await fit({ evalEvery: 2, evalEverySteps: 5 }, dir);
    assert.deepStrictEqual(
      evals.map((e) => [e.epoch, e.step]),
      [[1, 5], [2, 10], [2, 15], [2, 16], [3, 20], [3, 24]],
    );
    assert.ok(evals.every((e) => Number.isFinite(e.testLoss) && e.testAcc >= 0));
    assert.ok(Number.isNaN(reports[0].testAcc), "epoch 1 is not evaluated");
    assert.strictEqual(reports[1].testAcc, evals[3].testAcc);
    assert.strictEqual(reports[2].testAcc, evals[5].testAcc);
    const rows = await MetricsLog.read(`${dir}/run.jsonl`);
    assert.deepStrictEqual(rows.map((r) => [r.epoch, r.step, r.testAcc === null]), [
      [1, 8, true],
      [2, 16, false],
      [3, 24, false],
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the default evaluates after every epoch only", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const { reports, evals } = await fit({ epochs: 2 }, dir);
    assert.deepStrictEqual(evals.map((e) => e.step), [8, 16]);
    assert.ok(reports.every((r) => Number.isFinite(r.testAcc)));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("--eval-every and --eval-every-steps are parsed and checked", () => {
  const parse = (argv: string[]) => parseTrainArgs(argv, "test", {});
  assert.deepStrictEqual([parse([]).evalEvery, parse([]).evalEverySteps], [1, 0]);
  const a = parse(["--eval-every", "3", "--eval-every-steps=100", "--tensorboard", "runs/a"]);
  assert.deepStrictEqual([a.evalEvery, a.evalEverySteps, a.tensorboard], [3, 100, "runs/a"]);
  assert.throws(() => parse(["--eval-every", "0"]), /--eval-every/);
  assert.throws(() => parse(["--eval-every-steps", "-1"]), /--eval-every-steps/);
  assert.throws(() => parse(["--eval-evry", "2"]), /did you mean.*--eval-every/);
});

const PY = (() => {
  try {
    return new Deno.Command("python3", { args: ["-c", "pass"] }).outputSync().success
      ? "python3"
      : undefined;
  } catch {
    return undefined;
  }
})();

Deno.test({
  name: "--tensorboard writes training scalars per log interval and test scalars per evaluation",
  ignore: PY === undefined,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      await fit({ epochs: 2, evalEverySteps: 4, tensorboard: `${dir}/tb` }, dir);
      const [file] = [...Deno.readDirSync(`${dir}/tb`)].map((e) => `${dir}/tb/${e.name}`);
      const out = await new Deno.Command(PY!, {
        args: [new URL("./_read_tfevents.py", import.meta.url).pathname, file],
      }).output();
      assert.ok(out.success, new TextDecoder().decode(out.stderr));
      const events: { step: number; summary?: { tag: string; simple_value: number }[] }[] =
        JSON.parse(new TextDecoder().decode(out.stdout))[0].events;
      const stepsOf = (tag: string) =>
        events.filter((e) => e.summary?.some((v) => v.tag === tag)).map((e) => e.step);
      // 8 steps per epoch: the log interval is max(1, min(50, floor(8 / 10))) = 1 step.
      assert.deepStrictEqual(stepsOf("train/loss"), Array.from({ length: 16 }, (_, i) => i + 1));
      assert.deepStrictEqual(stepsOf("test/accuracy"), [4, 8, 12, 16]);
      assert.deepStrictEqual(stepsOf("epoch/train_loss"), [8, 16]);
      const lr = events.flatMap((e) => e.summary ?? []).filter((v) => v.tag === "train/lr");
      assert.ok(lr.every((v) => v.simple_value > 0));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("--workers auto and --prefetch-factor N|auto are parsed, and refused without workers", () => {
  const parse = (argv: string[]) => parseTrainArgs(argv, "test", {});
  assert.deepStrictEqual([parse([]).workers, parse([]).prefetchFactor], [2, undefined]);
  const a = parse(["--workers", "auto", "--prefetch-factor", "4"]);
  assert.deepStrictEqual([a.workers, a.prefetchFactor], ["auto", 4]);
  assert.strictEqual(parse(["--prefetch-factor=auto"]).prefetchFactor, "auto");
  assert.throws(
    () => parse(["--workers", "many"]),
    /invalid value for --workers: "many" \(expected a whole number >= 0 or auto\)/,
  );
  assert.throws(() => parse(["--prefetch-factor", "0"]), /--prefetch-factor.*>= 1 or auto/);
  assert.throws(
    () => parse(["--workers", "0", "--prefetch-factor", "3"]),
    /--prefetch-factor needs workers/,
  );
});

Deno.test("an image run with --workers auto --prefetch-factor 3 trains, says so, and shows its pinned memory", async () => {
  const dir = await Deno.makeTempDir();
  const args = parseTrainArgs(
    [
      "--device=cpu",
      "--quiet",
      "--epochs=2",
      "--batch-size=64",
      "--workers=auto",
      "--prefetch-factor=3",
      "--precision=fp32",
      `--log=${dir}/run.jsonl`,
    ],
    "test",
    { model: "mlp" },
  );
  const lines: string[] = [];
  const log = console.log;
  console.log = (...a: unknown[]) => lines.push(a.join(" "));
  try {
    const reports = await trainImages(args, {
      train: randomSet(256, 3),
      test: randomSet(64, 4),
      model: () => fashionModel("mlp", 0),
      mean: [0.5],
      std: [0.25],
      augment: null,
      intro: "training on random data",
      dataNote: "random",
    });
    assert.strictEqual(reports.length, 2);
  } finally {
    console.log = log;
    await Deno.remove(dir, { recursive: true });
  }
  assert.match(lines[0], /auto workers \(prefetch 3\)/);
  // Each epoch line says what the tuner ran: prefetch stays 3, the workers are tuned.
  const epochs = lines.filter((l) => l.startsWith("epoch "));
  assert.strictEqual(epochs.length, 2, lines.join("\n"));
  for (const l of epochs) assert.match(l, /, \d+ workers x prefetch 3\)$/);
  // The loaders' pinned rings and the prefetchers' staging show in the summary.
  const memory = lines.find((l) => l.includes("memory peak"));
  assert.ok(memory, lines.join("\n"));
  const pinned = Number(/([\d.]+) MiB of pinned host memory/.exec(memory)?.[1]);
  assert.ok(pinned > 0, memory);
});

Deno.test("the summary names the peak device and pinned memory", () => {
  const r = {
    epoch: 1,
    trainLoss: 1,
    trainAcc: 0.5,
    testLoss: 1,
    testAcc: 0.5,
    samplesPerSecond: 10,
    inputWaitShare: 0,
    seconds: 1,
    lossScale: 1,
  };
  const text = summaryText([r], { device: "cpu", memory: { device: 3 << 20, pinned: 1 << 19 } });
  assert.match(text, /memory peak +3\.0 MiB on the device, 0\.5 MiB of pinned host memory/);
  // Epochs without evaluation (--eval-every) are left out of the accuracy line.
  const text2 = summaryText([{ ...r, testAcc: NaN }, { ...r, epoch: 2, testAcc: 0.25 }], {
    device: "cpu",
  });
  assert.match(text2, /test accuracy +25\.00% after epoch 2\n/);
});

const NVML = nvmlStandIn();

Deno.test({
  name:
    "the training summary shows the GPU figures sampled through NVML (the stand-in), or why none",
  ignore: NVML === undefined,
  async fn() {
    const dir = await Deno.makeTempDir();
    const lines: string[] = [];
    const log = console.log;
    console.log = (...a: unknown[]) => lines.push(a.join(" "));
    try {
      Deno.env.set("PINSTREAM_NVML_LIB", NVML!);
      await fit({ epochs: 1 }, dir, true);
      Deno.env.set("PINSTREAM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1");
      await fit({ epochs: 1 }, dir, true);
      await fit({ epochs: 1 }, dir); // a CPU run samples no GPU unless asked
    } finally {
      console.log = log;
      Deno.env.delete("PINSTREAM_NVML_LIB");
      await Deno.remove(dir, { recursive: true });
    }
    const gpu = lines.filter((l) => l.includes("\n  gpu ")).map((l) =>
      /\n {2}gpu +(.*)/.exec(l)![1]
    );
    assert.strictEqual(gpu.length, 2, lines.join("\n"));
    assert.match(
      gpu[0],
      /^GPU 0 \(NVML stand-in GPU\): SM 87% \(max 87%\), memory 41%, 3\.0 of 80\.0 GiB/,
    );
    assert.match(
      gpu[1],
      /^NVML not available: \/nonexistent\/libnvidia-ml\.so\.1 could not be loaded/,
    );
  },
});
