// The GPU benchmarks' code paths, run on the CUDA emulator (PINSTREAM_BENCH_SMOKE=1 lets the
// benchmarks take it, at tiny sizes, and write nothing): a mistake in the part of a benchmark
// that only runs with a GPU shows here, not in the few minutes a machine with a GPU is at hand
// (bench/gpu_run.sh runs these same benchmarks there). The timings printed mean nothing.

import assert from "node:assert";

const ROOT = new URL("..", import.meta.url).pathname;

async function smoke(args: string[]): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", ...args],
    cwd: ROOT,
    env: { PINSTREAM_CUDA_EMULATOR: "1", PINSTREAM_BENCH_SMOKE: "1", NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.strictEqual(out.code, 0, `${args.join(" ")} exited ${out.code}:\n${text.slice(-3000)}`);
  return text;
}

const CASES: [string, string[], RegExp][] = [
  [
    "step",
    [
      "bench/step.ts",
      "--device",
      "cuda",
      "--steps",
      "1",
      "--warmup",
      "2",
      "--repeat",
      "1",
      "--ahead",
      "0",
      "--calls",
      "10",
      "--batch-size",
      "2",
    ],
    /nn\.conv2dForward +5 [\s\S]*graphLaunch +\d+[\s\S]*graphs \(on\)/,
  ],
  [
    "pipeline",
    ["bench/pipeline.ts", "--samples", "512", "--epochs", "2", "--no-torch"],
    /pinstream toDevice on the GPU[\s\S]*DeviceDataset on the GPU[\s\S]*gpuCopyStageVsRawBound/,
  ],
  ["transfer", ["bench/transfer.ts", "--device", "cuda", "--max-mib", "1"], /1 MiB/],
  [
    "kernels",
    ["bench/kernels.ts", "--device", "cuda", "--batch", "2", "--reps", "1"],
    /CNN train step/,
  ],
  [
    "precision",
    [
      "bench/precision.ts",
      "--device",
      "cuda",
      "--steps",
      "1",
      "--warmup",
      "0",
      "--repeat",
      "1",
      "--batch-size",
      "2",
    ],
    /CIFAR-10 net, fp32/,
  ],
  [
    "seed_claims",
    [
      "bench/seed_claims.ts",
      "--device",
      "cuda",
      "--synthetic",
      "--limit",
      "8",
      "--batch-size",
      "8",
      "--epochs",
      "1",
    ],
    /PyTorch defaults \/ pinstream defaults, time[\s\S]*augmentation on \/ off[\s\S]*pageable \/ pinned/,
  ],
];

for (const [name, args, expect] of CASES) {
  Deno.test(`bench/${name}.ts runs its GPU mode on the CUDA emulator (smoke), writing nothing`, async () => {
    const text = await smoke(args);
    assert.match(text, expect);
    assert.match(text, new RegExp(`smoke run: ${name} not written`));
    assert.doesNotMatch(text, /^wrote /m);
  });
}
