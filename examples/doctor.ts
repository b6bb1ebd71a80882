/**
 * `deno task doctor`: does training wait for data? Runs {@linkcode diagnose} (train/doctor.ts) on
 * an example's dataset and model: steps on a device-resident batch against the loader-fed steps,
 * a worker sweep, prefetch depth and pinned staging; prints the measurements and a verdict in
 * words, and writes them as JSON with an SVG chart.
 *
 *     deno task doctor                       # Fashion-MNIST CNN (Debian's dataset-fashion-mnist)
 *     deno task doctor --example cifar       # the CIFAR example (CIFAR-10, else its shapes set)
 *     deno task doctor --workers 0,2,4 --steps 60 --out doctor/
 *
 * In your own script, call `diagnose({ device, dataset, model, ... })` with your dataset and
 * model: the same measurements, as data.
 *
 * @module
 */

import { Device, diagnose, type DoctorReport, FashionMNIST, type Module } from "../mod.ts";
import { gpuLine, GpuSampler, type GpuSummary, openNvml } from "../ffi/nvml.ts";
import type { Dataset } from "../loader/dataset.ts";
import { FASHION_MNIST_DEBIAN_ROOT } from "../loader/datasets/mnist.ts";
import { CliError, parseCli, runMain, UsageError } from "../train/cli.ts";
import {
  CIFAR_MEAN,
  CIFAR_STD,
  cifarModel,
  FASHION_MEAN,
  FASHION_STD,
  fashionModel,
} from "../train/models.ts";
import { defaultCifarRoot, shapesDataset } from "./cifar.ts";
import { CIFAR10 } from "../loader/datasets/cifar10.ts";

/** The chart module, loaded only when a chart is drawn: its npm packages are fetched then, and
 * a run that draws none needs no network (a literal specifier would be fetched up front). */
const CHARTS: string = new URL("../train/_chart.ts", import.meta.url).href;

const CLI = {
  usage: "deno task doctor [options]",
  summary: "Does training wait for data? Synthetic against real steps, a worker sweep, prefetch " +
    "depth and pinned staging, on an example's data and model; a verdict in words, JSON and SVG.",
  options: {
    precision: {
      kind: "string",
      choices: ["fp16", "fp32"],
      default: "fp16",
      help: "the model's precision (batches follow it)",
    },
    example: {
      kind: "string",
      choices: ["fashion", "cifar"],
      default: "fashion",
      help: "whose dataset and model",
    },
    device: {
      kind: "string",
      choices: ["auto", "cpu", "cuda"],
      default: "auto",
      help: "where to train",
    },
    "batch-size": { kind: "int", min: 1, default: 128, help: "batch size" },
    steps: { kind: "int", min: 1, default: 30, help: "training steps per measurement" },
    workers: {
      kind: "string",
      metavar: "N,N,...",
      help: "worker counts of the sweep (default 0 to the core count)",
    },
    data: { kind: "string", metavar: "DIR", help: "the example's data directory" },
    out: {
      kind: "string",
      metavar: "DIR",
      default: "bench/out",
      help: "where doctor.json and doctor.svg go",
    },
  },
} as const;

async function data(
  example: string,
  dir: string | undefined,
): Promise<{ dataset: Dataset; model: Module; mean: number[]; std: number[]; note: string }> {
  if (example === "fashion") {
    const root = dir ?? FASHION_MNIST_DEBIAN_ROOT;
    try {
      const ds = await FashionMNIST.load({ root, train: true });
      return {
        dataset: ds,
        model: fashionModel("cnn"),
        mean: [FASHION_MEAN],
        std: [FASHION_STD],
        note: `Fashion-MNIST from ${root}`,
      };
    } catch (err) {
      throw new CliError(
        `Cannot load Fashion-MNIST from ${root}: ${(err as Error).message} (apt-get install ` +
          "dataset-fashion-mnist, or --data DIR)",
        { cause: err },
      );
    }
  }
  try {
    const root = dir ?? defaultCifarRoot();
    const ds = await CIFAR10.load({ root, train: true, download: false });
    return {
      dataset: ds,
      model: cifarModel(),
      mean: CIFAR_MEAN,
      std: CIFAR_STD,
      note: `CIFAR-10 from ${root}`,
    };
  } catch {
    if (dir !== undefined) throw new CliError(`Cannot load CIFAR-10 from --data ${dir}`);
    return {
      dataset: shapesDataset(4096, 1),
      model: cifarModel(),
      mean: CIFAR_MEAN,
      std: CIFAR_STD,
      note: "the CIFAR example's generated shapes set (no CIFAR-10 here)",
    };
  }
}

function table(r: DoctorReport): string {
  const rows = [
    ["device-resident batch (no loader)", r.synthetic.stepsPerSecond, NaN],
    ...r.sweep.map((s) => [s.name, s.stepsPerSecond, s.inputWaitShare] as const),
    [r.depth1.name, r.depth1.stepsPerSecond, r.depth1.inputWaitShare],
    [r.pageable.name, r.pageable.stepsPerSecond, r.pageable.inputWaitShare],
    ...(r.resident
      ? [["data resident on the device", r.resident.stepsPerSecond, NaN] as const]
      : []),
  ] as const;
  const w = Math.max(...rows.map((x) => String(x[0]).length));
  return [
    `${"run".padEnd(w)}  steps/s  input wait`,
    ...rows.map(([name, sps, wait]) =>
      `${String(name).padEnd(w)}  ${sps.toFixed(2).padStart(7)}  ${
        Number.isNaN(wait) ? "" : `${(100 * wait).toFixed(1).padStart(9)}%`
      }`.trimEnd()
    ),
  ].join("\n");
}

async function main(): Promise<void> {
  const cli = parseCli(Deno.args, CLI);
  let workers: number[] | undefined;
  if (cli.workers !== undefined) {
    workers = cli.workers.split(",").map(Number);
    if (workers.some((w) => !Number.isInteger(w) || w < 0)) {
      throw new UsageError(
        `invalid value for --workers: ${JSON.stringify(cli.workers)} (expected whole numbers ` +
          ">= 0 separated by commas); see --help",
      );
    }
  }
  const d = await data(cli.example!, cli.data);
  using device = Device.open(cli.device as "auto" | "cpu" | "cuda");
  using model = d.model.to(device, { precision: cli.precision as "fp16" | "fp32" });
  console.log(
    `doctor: ${d.note}, ${cli.example} model (${cli.precision}), ${device}, ` +
      `batch ${cli["batch-size"]}, ` +
      `${cli.steps} steps per measurement`,
  );
  // GPU utilisation while the measurements run (one line when NVML is absent).
  const nvml = openNvml();
  const sampler = typeof nvml === "string" ? undefined : new GpuSampler(nvml, { intervalMs: 250 });
  let gpu: GpuSummary | string = typeof nvml === "string" ? nvml : "";
  const report = await diagnose({
    device,
    dataset: d.dataset,
    model,
    batchSize: cli["batch-size"]!,
    steps: cli.steps!,
    workers,
    prefetcher: { mean: d.mean, std: d.std },
  }).finally(() => {
    if (sampler) gpu = sampler.stop();
    if (typeof nvml !== "string") nvml.dispose();
  });
  console.log(table(report));
  console.log(`gpu: ${gpuLine(gpu)}`);
  console.log(`\nverdict: ${report.verdict}`);
  const out = cli.out!.replace(/\/$/, "");
  await Deno.mkdir(out, { recursive: true });
  const result = { date: new Date().toISOString(), data: d.note, ...report, gpu };
  await Deno.writeTextFile(`${out}/doctor.json`, JSON.stringify(result, null, 2) + "\n");
  let drawn = "";
  try {
    const { chartSvg } = await import(CHARTS);
    await Deno.writeTextFile(`${out}/doctor.svg`, (await chartSvg(result, "doctor"))!);
    drawn = ` and ${out}/doctor.svg`;
  } catch (err) {
    drawn = ` (no chart: ${(err as Error).message.split("\n")[0]})`;
  }
  console.log(`wrote ${out}/doctor.json${drawn}`);
}

if (import.meta.main) await runMain(main);
