/**
 * Whether the CIFAR-10 example's recipe is stable: trains `examples/cifar.ts` over a sweep of
 * peak learning rates and seeds, with and without the classifier's logit scale, on the
 * generated shapes set and on Fashion-MNIST widened to CIFAR's 3 x 32 x 32 (written as CIFAR-10
 * binary batches, so the example reads it through its own CIFAR-10 reader). A run counts as
 * blown up when its first epoch's training loss is above ln(10) + 0.2 (worse than guessing)
 * or its last test accuracy is under 20%.
 *
 * Each run is a child process of the example as a user runs it (CPU backend, 4 epochs, batch
 * 64, the first 4,000 training samples). The table goes to stdout and, with --out, to a JSON
 * file. docs/recipe.md holds a run of it.
 *
 * Usage:
 *   deno run -A bench/recipe.ts [--lrs 0.02,0.05,0.1,0.2] [--seeds 0,1] [--scales 1,0.125]
 *     [--sets shapes,fashion3] [--epochs 4] [--out bench/out/recipe.json]
 *
 * @module
 */

import { parseArgs } from "node:util";

const ROOT = new URL("..", import.meta.url).pathname;
const FASHION = "/usr/share/datasets/fashion-mnist";
/** The loss of a uniform guess over 10 classes, plus a margin. */
const BLOWN_LOSS = Math.log(10) + 0.2;

interface Run {
  set: string;
  scale: number;
  lr: number;
  seed: number;
  epochLosses: number[];
  testAccuracy: number[];
  blownUp: boolean;
  seconds: number;
}

async function gunzip(path: string): Promise<Uint8Array> {
  const file = await Deno.open(path);
  const stream = file.readable.pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** Fashion-MNIST as CIFAR-10 binary batches: 28x28 grey centred in 32x32, copied to 3 channels. */
async function writeFashionAsCifar(dir: string): Promise<void> {
  const write = async (images: string, labels: string, names: string[]) => {
    const x = (await gunzip(`${FASHION}/${images}`)).subarray(16);
    const y = (await gunzip(`${FASHION}/${labels}`)).subarray(8);
    for (let f = 0; f < names.length; f++) {
      const out = new Uint8Array(10000 * 3073);
      for (let i = 0; i < 10000; i++) {
        const k = f * 10000 + i;
        const rec = out.subarray(i * 3073, (i + 1) * 3073);
        rec[0] = y[k];
        for (let c = 0; c < 3; c++) {
          for (let r = 0; r < 28; r++) {
            const src = x.subarray(k * 784 + r * 28, k * 784 + r * 28 + 28);
            rec.set(src, 1 + c * 1024 + (r + 2) * 32 + 2);
          }
        }
      }
      await Deno.writeFile(`${dir}/${names[f]}`, out);
    }
  };
  await write("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
  ]);
  await write("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", ["test_batch.bin"]);
}

async function trainOnce(
  set: string,
  data: string | null,
  scale: number,
  lr: number,
  seed: number,
  epochs: number,
  tmp: string,
): Promise<Run> {
  const log = `${tmp}/${set}-${scale}-${lr}-${seed}.jsonl`;
  const args = [
    "run",
    "-A",
    `${ROOT}examples/cifar.ts`,
    ...(data ? ["--data", data] : ["--synthetic"]),
    ...["--device", "cpu", "--quiet", "--epochs", String(epochs), "--batch-size", "64"],
    ...["--limit", "4000", "--lr", String(lr), "--seed", String(seed)],
    ...["--logit-scale", String(scale), "--log", log, "--checkpoint", `${tmp}/ck.safetensors`],
  ];
  const t0 = performance.now();
  const out = await new Deno.Command(Deno.execPath(), { args, stdout: "piped", stderr: "piped" })
    .output();
  const seconds = (performance.now() - t0) / 1000;
  if (!out.success) {
    throw new Error(
      `Cannot run ${set} lr ${lr} seed ${seed}: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  const lines = (await Deno.readTextFile(log)).trim().split("\n").map((l) => JSON.parse(l));
  const epochLosses = lines.map((l) => l.trainLoss as number);
  const testAccuracy = lines.map((l) => l.testAcc as number);
  const blownUp = !(epochLosses[0] <= BLOWN_LOSS) || !(testAccuracy.at(-1)! >= 0.2);
  return { set, scale, lr, seed, epochLosses, testAccuracy, blownUp, seconds };
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      lrs: { type: "string", default: "0.02,0.05,0.1,0.2" },
      seeds: { type: "string", default: "0,1" },
      scales: { type: "string", default: "1,0.125" },
      sets: { type: "string", default: "shapes,fashion3" },
      epochs: { type: "string", default: "4" },
      out: { type: "string" },
    },
    strict: true,
  });
  const list = (s: string) => s.split(",").map(Number);
  const tmp = await Deno.makeTempDir({ prefix: "pinstream-recipe-" });
  const runs: Run[] = [];
  try {
    for (const set of values.sets.split(",")) {
      let data: string | null = null;
      if (set === "fashion3") {
        data = `${tmp}/fashion3`;
        await Deno.mkdir(data);
        await writeFashionAsCifar(data);
      } else if (set !== "shapes") {
        throw new Error(`Cannot run the sweep: unknown set "${set}" (shapes or fashion3)`);
      }
      for (const lr of list(values.lrs)) {
        for (const scale of list(values.scales)) {
          for (const seed of list(values.seeds)) {
            const r = await trainOnce(set, data, scale, lr, seed, Number(values.epochs), tmp);
            runs.push(r);
            console.log(
              `${set.padEnd(8)} scale ${String(scale).padEnd(5)} lr ${String(lr).padEnd(5)} ` +
                `seed ${seed}  epoch losses ${r.epochLosses.map((l) => l.toFixed(3)).join(" ")}  ` +
                `test acc ${r.testAccuracy.map((a) => (a * 100).toFixed(1)).join(" ")}%  ` +
                `${r.blownUp ? "BLOWN UP" : "ok"}  (${r.seconds.toFixed(0)} s)`,
            );
          }
        }
      }
    }
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
  if (values.out) {
    await Deno.writeTextFile(values.out, JSON.stringify({ blownLoss: BLOWN_LOSS, runs }, null, 1));
  }
}
