// The bottleneck doctor (train/doctor.ts, examples/doctor.ts): every measurement is there and
// consistent, options are checked, and the CLI refuses bad input in one line.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { diagnose } from "../train/doctor.ts";
import { Flatten, Linear, Sequential } from "../nn/mod.ts";

function tiny(n: number): TensorDataset {
  const images = new Uint8Array(new SharedArrayBuffer(n * 3 * 8 * 8));
  for (let i = 0; i < images.length; i++) images[i] = (i * 37) & 0xff;
  const labels = new Int32Array(new SharedArrayBuffer(n * 4));
  for (let i = 0; i < n; i++) labels[i] = i % 10;
  return new TensorDataset({ image: { data: images, shape: [3, 8, 8] }, label: labels });
}

Deno.test("diagnose measures synthetic and fed steps, the sweep, depth and staging", async () => {
  using device = Device.open("cpu");
  using model = new Sequential([new Flatten(), new Linear(192, 10)]).to(device);
  // 96 samples, batches of 32: 3 batches an epoch, fewer than 3 warm-up + 5 steps, so each
  // fed measurement runs over several epochs.
  const r = await diagnose({
    device,
    model,
    dataset: tiny(96),
    batchSize: 32,
    steps: 5,
    workers: [0, 2],
    prefetcher: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
  });
  assert.strictEqual(r.device, "cpu:0");
  assert.deepStrictEqual(r.sweep.map((s) => [s.name, s.numWorkers, s.depth, s.pin]), [
    ["numWorkers 0", 0, 2, "register"],
    ["numWorkers 2", 2, 2, "register"],
  ]);
  assert.ok(r.sweep.includes(r.best));
  assert.strictEqual(r.best.stepsPerSecond, Math.max(...r.sweep.map((s) => s.stepsPerSecond)));
  assert.deepStrictEqual([r.depth1.depth, r.depth1.numWorkers], [1, r.best.numWorkers]);
  assert.deepStrictEqual([r.pageable.pin, r.pageable.numWorkers], ["none", r.best.numWorkers]);
  for (const run of [r.synthetic, ...r.sweep, r.depth1, r.pageable]) {
    assert.ok(run.stepsPerSecond > 0 && Number.isFinite(run.stepsPerSecond));
    assert.ok(
      Math.abs(run.samplesPerSecond - run.stepsPerSecond * 32) < 1e-6 * run.samplesPerSecond,
    );
  }
  for (const run of [...r.sweep, r.depth1, r.pageable]) {
    assert.ok(run.inputWaitShare >= 0 && run.inputWaitShare <= 1);
  }
  assert.ok(r.resident !== undefined && r.resident.stepsPerSecond > 0, "the set fits: measured");
  assert.match(r.verdict, /the data resident on the device: [\d.]+ steps\/s, [\d.]+x the best/);
  assert.strictEqual(r.realOverSynthetic, r.best.stepsPerSecond / r.synthetic.stepsPerSecond);
  assert.strictEqual(r.inputBound, r.realOverSynthetic < 0.9 && r.best.inputWaitShare > 0.05);
  assert.match(r.verdict, r.inputBound ? /^input-bound: / : /^not input-bound: /);
  assert.match(r.verdict, /prefetch depth 2 against 1: \d+\.\d\dx; pinned against pageable/);
});

Deno.test("diagnose refuses what it cannot measure", async () => {
  using device = Device.open("cpu");
  using model = new Sequential([new Flatten(), new Linear(192, 10)]).to(device);
  const generic = { length: 4, get: (i: number) => ({ x: i }) };
  await assert.rejects(
    () => diagnose({ device, model, dataset: generic }),
    /dataset must be a zero-copy dataset/,
  );
  await assert.rejects(
    () => diagnose({ device, model, dataset: tiny(8), steps: 0 }),
    /steps must be a positive integer, got 0/,
  );
  await assert.rejects(
    () => diagnose({ device, model, dataset: tiny(8), workers: [-1] }),
    /workers must be non-negative integers, got \[-1\]/,
  );
  await assert.rejects(
    () => diagnose({ device, model, dataset: tiny(8), stepz: 3 } as never),
    /stepz.*steps/s,
  );
});

Deno.test("deno task doctor refuses a bad --workers in one line, exit code 2", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../examples/doctor.ts", import.meta.url).pathname,
      "--workers",
      "0,x",
    ],
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const err = new TextDecoder().decode(out.stderr);
  assert.strictEqual(out.code, 2, err);
  assert.match(err, /^error: invalid value for --workers: "0,x" \(expected whole numbers >= 0/);
});

Deno.test("diagnose feeds an fp32 model f32 batches without being told", async () => {
  using device = Device.open("cpu");
  using model = new Sequential([new Flatten(), new Linear(192, 10)]).to(device, {
    precision: "fp32",
  });
  const r = await diagnose({
    device,
    model,
    dataset: tiny(64),
    batchSize: 32,
    steps: 2,
    workers: [0],
    repeat: 1,
    prefetcher: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
  });
  // Every run trained: with f16 batches the fp32 Linear would have refused the input.
  const runs = [r.synthetic, ...r.sweep, r.depth1, r.pageable, r.resident!];
  runs.forEach((run, i) => assert.ok(run.stepsPerSecond > 0, `run ${i}`));
});

Deno.test("diagnose feeds a bf16 model f32 batches cast to bf16, without a loss scaler", async () => {
  using device = Device.open("cpu");
  using model = new Sequential([new Flatten(), new Linear(192, 10)]).to(device, {
    precision: "bf16",
  });
  const r = await diagnose({
    device,
    model,
    dataset: tiny(64),
    batchSize: 32,
    steps: 2,
    workers: [0],
    repeat: 1,
    prefetcher: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
  });
  // Every run trained: an f16 or f32 batch given to the bf16 Linear would have been refused.
  const runs = [r.synthetic, ...r.sweep, r.depth1, r.pageable, r.resident!];
  runs.forEach((run, i) => assert.ok(run.stepsPerSecond > 0, `run ${i}`));
});
