/**
 * DataParallel over 2 and 4 ranks (oversubscribed) trains to the weights of one process fed
 * the combined batch; tests/_dist_train_child.ts is the training program of both.
 *
 * Tolerances, |multi - single| <= atol + rtol * |single| on every weight and buffer: fp32
 * atol 1e-5, rtol 1e-4 (the ranks sum the batch's gradient in another order: rounding
 * only); fp16 atol 1e-3, rtol 1e-2 (each rank rounds its own, smaller batch's fp16
 * gradients). Ranks must agree with each other exactly. The same holds for CUDA models on the
 * nccl backend ([cuda] cases: the CUDA emulator and its NCCL stand-in), also in bf16: atol 4e-3,
 * rtol 4e-2 (bf16 keeps 8 significant bits where fp16 keeps 11).
 */

import assert from "node:assert";
import { assertAllOk, MPIS, runRanks, runTorchrunStyle } from "./_dist.ts";
import { emulatedNccl } from "./_nccl_stand_in.ts";

const NCCL = emulatedNccl();
/** The stand-in NCCL for runs of the cuda model. */
function envOf(args: string[]): Record<string, string> {
  return args.includes("cuda") ? { PINSTREAM_NCCL_LIB: NCCL! } : {};
}

const CHILD = new URL("_dist_train_child.ts", import.meta.url).pathname;
const TOL = {
  fp32: { atol: 1e-5, rtol: 1e-4 },
  fp16: { atol: 1e-3, rtol: 1e-2 },
  bf16: { atol: 4e-3, rtol: 4e-2 },
};

interface Result {
  weights: Record<string, number[]>;
  scales: number[];
}

const dir = Deno.makeTempDirSync({ prefix: "pinstream-dist-" });
let runs = 0;

async function single(args: string[]): Promise<Result> {
  const out = `${dir}/single${runs++}`;
  const r = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CHILD, ...args, "--out", out],
    env: { NO_COLOR: "1", ...envOf(args) },
    stderr: "piped",
    stdout: "piped",
  }).output();
  assert.strictEqual(r.code, 0, new TextDecoder().decode(r.stderr));
  return JSON.parse(Deno.readTextFileSync(`${out}.0.json`));
}

async function multi(mpi: "openmpi" | "mpich", n: number, args: string[]): Promise<Result[]> {
  const out = `${dir}/multi${runs++}`;
  const r = await runRanks(mpi, n, [CHILD, ...args, "--out", out], { env: envOf(args) });
  assertAllOk(r, n);
  return Array.from({ length: n }, (_, k) => JSON.parse(Deno.readTextFileSync(`${out}.${k}.json`)));
}

function assertClose(got: Result, want: Result, tol: { atol: number; rtol: number }, what: string) {
  assert.deepStrictEqual(Object.keys(got.weights), Object.keys(want.weights));
  for (const [name, ref] of Object.entries(want.weights)) {
    const g = got.weights[name];
    for (let i = 0; i < ref.length; i++) {
      const bound = tol.atol + tol.rtol * Math.abs(ref[i]);
      if (!(Math.abs(g[i] - ref[i]) <= bound)) {
        assert.fail(
          `${what}: ${name}[${i}] is ${g[i]}, one process gave ${ref[i]} (bound ${bound})`,
        );
      }
    }
  }
  assert.deepStrictEqual(got.scales, want.scales, `${what}: the loss scales differ`);
}

function assertRanksEqual(results: Result[], what: string) {
  for (let k = 1; k < results.length; k++) {
    assert.deepStrictEqual(results[k], results[0], `${what}: rank ${k} differs from rank 0`);
  }
}

const refs = new Map<string, Promise<Result>>();
function reference(args: string[]): Promise<Result> {
  const key = args.join(" ");
  if (!refs.has(key)) refs.set(key, single(args));
  return refs.get(key)!;
}

for (const mpi of ["openmpi", "mpich"] as const) {
  for (const n of [2, 4]) {
    for (const precision of ["fp32", "fp16"] as const) {
      Deno.test({
        name:
          `DataParallel on ${n} ranks trains as 1 rank on the whole batch (${mpi}, ${precision})`,
        ignore: !MPIS.includes(mpi),
        async fn() {
          const args = ["--model", "cnn", "--precision", precision, "--steps", "12"];
          const results = await multi(mpi, n, args);
          assertRanksEqual(results, `${n} ranks`);
          assertClose(results[0], await reference(args), TOL[precision], `${n} ranks`);
        },
      });
    }
  }
}

const MPI = MPIS[0];

for (const [n, precision] of [[2, "fp32"], [4, "fp32"], [2, "fp16"]] as const) {
  Deno.test({
    name: `DataParallel on ${n} ranks over sharded DeviceLoaders with augmentation trains as 1 ` +
      `rank on the whole batch (${precision})`,
    ignore: MPI === undefined,
    async fn() {
      // 12 steps: 3 epochs of 4 batches, each reshuffled and redrawn.
      const args = ["--model", "cnn", "--precision", precision, "--steps", "12", "--augment"];
      const results = await multi(MPI!, n, args);
      assertRanksEqual(results, `${n} ranks`);
      assertClose(results[0], await reference(args), TOL[precision], `${n} ranks`);
    },
  });
}

for (
  const [mpi, n, precision] of [
    ["openmpi", 2, "fp32"],
    ["openmpi", 4, "fp32"],
    ["openmpi", 4, "fp16"],
    ["mpich", 2, "fp16"],
    ["mpich", 4, "fp32"],
    ["openmpi", 4, "bf16"],
  ] as const
) {
  Deno.test({
    name: `DataParallel of a CUDA model on ${n} ranks (nccl backend) trains as 1 rank on the ` +
      `whole batch (${mpi}, ${precision}) [cuda]`,
    ignore: !MPIS.includes(mpi) || NCCL === undefined,
    async fn() {
      const args = [
        "--model",
        "cnn",
        "--precision",
        precision,
        "--steps",
        "12",
        "--device",
        "cuda",
      ];
      const results = await multi(mpi, n, args);
      assertRanksEqual(results, `${n} ranks`);
      assertClose(results[0], await reference(args), TOL[precision], `${n} ranks`);
    },
  });
}

Deno.test({
  name: "DataParallel of a CUDA model in a torchrun-style launch (no MPI) trains as 1 rank [cuda]",
  ignore: NCCL === undefined,
  async fn() {
    const args = ["--model", "cnn", "--steps", "12", "--device", "cuda"];
    const out = `${dir}/torchrun${runs++}`;
    const r = await runTorchrunStyle(2, [CHILD, ...args, "--out", out], { env: envOf(args) });
    assertAllOk(r, 2);
    const results = [0, 1].map((k) => JSON.parse(Deno.readTextFileSync(`${out}.${k}.json`)));
    assertRanksEqual(results, "torchrun-style");
    assertClose(results[0], await reference(args), TOL.fp32, "torchrun-style");
  },
});

Deno.test({
  name: "DataParallel of a CUDA model: noSync accumulation and a NaN skip on the nccl backend " +
    "[cuda]",
  ignore: MPI === undefined || NCCL === undefined,
  async fn() {
    const accumulate = ["--model", "mlp", "--steps", "4", "--accumulate", "3", "--device", "cuda"];
    const results = await multi(MPI!, 2, accumulate);
    assertRanksEqual(results, "noSync");
    assertClose(results[0], await reference(accumulate), TOL.fp32, "noSync");
    const nan = ["--model", "cnn", "--precision", "fp16", "--steps", "6", "--nan-step", "2"];
    const args = [...nan, "--nan-index", "1500", "--device", "cuda"];
    const want = await reference(args);
    assert.strictEqual(want.scales[2], want.scales[1] / 2, "the reference skipped no step");
    const skipped = await multi(MPI!, 2, args);
    assertRanksEqual(skipped, "NaN step");
    assertClose(skipped[0], want, TOL.fp16, "NaN at 1500");
  },
});

Deno.test({
  name:
    "SyncBatchNorm on 2 ranks normalizes as BatchNorm2d on the whole batch; BatchNorm2d does not",
  ignore: MPI === undefined,
  async fn() {
    const args = ["--model", "bn", "--steps", "8"];
    const want = await reference(args);
    const synced = await multi(MPI!, 2, [...args, "--sync-bn"]);
    assertRanksEqual(synced, "SyncBatchNorm");
    assertClose(synced[0], want, TOL.fp32, "SyncBatchNorm");
    const local = await multi(MPI!, 2, args);
    assert.throws(() => assertClose(local[0], want, TOL.fp32, "BatchNorm2d"), /one process gave/);
  },
});

Deno.test({
  name: "SyncBatchNorm of a CUDA model on 2 ranks over nccl normalizes as 1 rank on the whole " +
    "batch [cuda]",
  ignore: MPI === undefined || NCCL === undefined,
  async fn() {
    for (const precision of ["fp32", "fp16"] as const) {
      const args = ["--model", "bn", "--steps", "8", "--precision", precision, "--device", "cuda"];
      const want = await reference(args);
      const synced = await multi(MPI!, 2, [...args, "--sync-bn"]);
      assertRanksEqual(synced, `SyncBatchNorm ${precision}`);
      assertClose(synced[0], want, TOL[precision], `SyncBatchNorm ${precision}`);
      if (precision === "fp32") {
        const local = await multi(MPI!, 2, args);
        assert.throws(() => assertClose(local[0], want, TOL.fp32, "BatchNorm2d"), /one process/);
      }
    }
  },
});

Deno.test({
  name: "DataParallel: a NaN on one rank makes every rank skip that step, as one process does",
  ignore: MPI === undefined,
  async fn() {
    // The batch is 32 x 64 values: element 100 lies in rank 0's half, 1500 in rank 1's.
    const args = ["--model", "cnn", "--precision", "fp16", "--steps", "6", "--nan-step", "2"];
    for (const index of ["100", "1500"]) {
      const want = await reference([...args, "--nan-index", index]);
      assert.strictEqual(want.scales[2], want.scales[1] / 2, "the reference skipped no step");
      const results = await multi(MPI!, 2, [...args, "--nan-index", index]);
      assertRanksEqual(results, "NaN step");
      assertClose(results[0], want, TOL.fp16, `NaN at ${index}`);
    }
  },
});

Deno.test({
  name: "DataParallel.noSync accumulates micro-batches as one process does",
  ignore: MPI === undefined,
  async fn() {
    const args = ["--model", "mlp", "--steps", "4", "--accumulate", "3"];
    const results = await multi(MPI!, 2, args);
    assertRanksEqual(results, "noSync");
    assertClose(results[0], await reference(args), TOL.fp32, "noSync");
  },
});

Deno.test({
  name: "DataParallel refuses models that differ across ranks, naming the first difference",
  ignore: MPI === undefined,
  async fn() {
    const r = await runRanks(MPI!, 2, [CHILD, "--differ", "--out", `${dir}/differ`]);
    assert.notStrictEqual(r.code, 0);
    assert.match(
      r.stderr,
      /Cannot wrap the model in DataParallel: the ranks' models differ: .*parameter "1\.weight" \[32,64\] on rank 0 but parameter "1\.weight" \[33,64\] on rank 1/,
    );
  },
});
