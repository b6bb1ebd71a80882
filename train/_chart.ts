/**
 * SVG charts of benchmark results and of a training run's loss curves, drawn with Vega-Lite
 * (npm:vega-lite, rendered to SVG by npm:vega without a browser or canvas). Private to train/
 * (the fit loop's curves) and bench/ (the benchmark charts), and always imported lazily.
 *
 * Why Vega-Lite: a chart is a small declarative spec (data, mark, encodings) and the library
 * does scales, axes, legends and layout well; it is maintained by the UW Interactive Data Lab
 * and renders headless. Compared: Observable Plot and Chart.js need a DOM or a canvas; d3 alone
 * leaves axes and legends to us; a hand-written SVG writer would redo all of that for four
 * charts. Only a chart being drawn loads it: importing pinstream fetches no npm package.
 *
 * One chart per benchmark, from the rows of its JSON result:
 * - loader: samples/s against numWorkers, one line per path, PyTorch's torchvision pipeline
 *   among them, the memory-copy bounds as rules;
 * - transfer: GB/s against copy size, pinned against pageable, both directions;
 * - pipeline: samples/s of each configuration, pinstream against PyTorch;
 * - train: seconds per epoch, pinstream against PyTorch;
 * - kernels: GFLOP/s (or ms) per kernel;
 * - precision: step time and peak memory, fp16 against fp32, per model;
 * - imagefolder: samples/s at each worker count, pinstream against torchvision;
 * - dist: the data-parallel step, pinstream against PyTorch DDP;
 * - doctor (`deno task doctor`): training samples/s of each run against a device-resident batch.
 *
 * @module
 */

import "./_no_punycode_warning.ts";
// Inline npm specifiers, not deno.json imports: an import map entry makes Deno fetch the
// package for every script of the project (a fresh `deno run examples/cifar.ts` would need
// the npm registry); inline, only what draws a chart fetches it.
// deno-lint-ignore no-import-prefix
import * as vl from "npm:vega-lite@5.21.0";
// deno-lint-ignore no-import-prefix
import * as vega from "npm:vega@5.30.0";

/** A benchmark result as the bench scripts write it (only what the charts read). */
export interface BenchResult {
  /** Which benchmark ("loader", "transfer", ...). */
  benchmark?: string;
  /** When it ran. */
  date?: string;
  /** Where it ran: a line, or an object with `cpu` and `cores`. */
  machine?: string | { cpu?: string; cores?: number };
  /** The commit measured. */
  commit?: string;
  /** The file format measured (imagefolder: "jpeg" or "png"). */
  format?: string;
  /** The measurements. */
  rows: Record<string, unknown>[];
}

type Spec = Record<string, unknown>;

const WIDTH = 520, HEIGHT = 300;

function subtitle(r: BenchResult): string {
  const day = r.date?.slice(0, 10) ?? "";
  const m = r.machine as unknown;
  const machine = typeof m === "object" && m !== null
    ? `${(m as { cpu?: string }).cpu ?? "?"}, ${(m as { cores?: number }).cores ?? "?"} cores`
    : m;
  const commit = r.commit ? `commit ${r.commit.replace(/^([0-9a-f]{7})[0-9a-f]+/, "$1")}` : "";
  return [day, machine, commit].filter((s) => s).join(" · ");
}

function titled(r: BenchResult, title: string, spec: Spec): Spec {
  return {
    $schema: "https://vega.github.io/schema/vega-lite/v5.json",
    title: { text: title, subtitle: subtitle(r), anchor: "start" },
    background: "white",
    config: { font: "sans-serif", view: { stroke: null } },
    ...spec,
  };
}

function loaderSpec(r: BenchResult): Spec {
  const sweep = r.rows.filter((x) => typeof x.numWorkers === "number").map((x) => ({
    workers: x.numWorkers,
    rate: x.samplesPerSecond,
    series: x.impl === "pytorch" ? `PyTorch: ${x.path}` : `pinstream: ${x.path}`,
    name: x.name,
  })).filter((x) => !String(x.name).includes("prefetchFactor"));
  // The bounds, and a tuned ("auto") row, as horizontal rules.
  const bounds = r.rows.filter((x) => x.impl === "bound" || / auto$/.test(String(x.name))).map((
    x,
  ) => ({
    rate: x.samplesPerSecond,
    name: x.name,
  }));
  return titled(r, "DataLoader: samples/s against numWorkers", {
    width: WIDTH,
    height: HEIGHT,
    layer: [
      {
        data: { values: sweep },
        mark: { type: "line", point: true },
        encoding: {
          x: { field: "workers", type: "ordinal", title: "numWorkers", axis: { labelAngle: 0 } },
          y: { field: "rate", type: "quantitative", title: "samples/s", scale: { type: "log" } },
          color: {
            field: "series",
            type: "nominal",
            title: null,
            legend: { orient: "bottom", columns: 2, labelLimit: 320 },
          },
        },
      },
      {
        data: { values: bounds },
        mark: { type: "rule", strokeDash: [4, 4], color: "#888" },
        encoding: { y: { field: "rate", type: "quantitative" } },
      },
      {
        data: { values: bounds },
        mark: { type: "text", align: "left", dx: 4, dy: -6, color: "#666", fontSize: 10 },
        encoding: {
          x: { value: 0 },
          y: { field: "rate", type: "quantitative" },
          text: { field: "name" },
        },
      },
    ],
  });
}

function transferSpec(r: BenchResult): Spec {
  const values: Record<string, unknown>[] = [];
  for (const row of r.rows) {
    for (const dir of ["h2d", "d2h"] as const) {
      const rates = row[dir] as Record<string, number> | undefined;
      if (!rates) continue;
      for (const kind of ["pinned", "pageable"] as const) {
        values.push({
          mib: (row.bytes as number) / 2 ** 20,
          gbs: rates[kind],
          series: `${dir === "h2d" ? "host→device" : "device→host"}, ${kind}`,
        });
      }
    }
  }
  return titled(r, "Copy bandwidth: pinned against pageable host memory", {
    width: WIDTH,
    height: HEIGHT,
    data: { values },
    mark: { type: "line", point: true },
    encoding: {
      x: { field: "mib", type: "quantitative", title: "copy size (MiB)", scale: { type: "log" } },
      y: { field: "gbs", type: "quantitative", title: "GB/s" },
      color: {
        field: "series",
        type: "nominal",
        title: null,
        legend: { orient: "bottom", columns: 2, labelLimit: 320 },
      },
    },
  });
}

function barSpec(
  r: BenchResult,
  title: string,
  values: { name: unknown; value: unknown; who: unknown }[],
  axis: string,
): Spec {
  return titled(r, title, {
    width: WIDTH,
    data: { values },
    mark: { type: "bar" },
    encoding: {
      y: { field: "name", type: "nominal", title: null, sort: null, axis: { labelLimit: 520 } },
      x: { field: "value", type: "quantitative", title: axis },
      color: {
        field: "who",
        type: "nominal",
        title: null,
        legend: { orient: "bottom", columns: 2, labelLimit: 320 },
      },
    },
  });
}

function who(impl: unknown): string {
  return impl === "pytorch" || impl === "torch"
    ? "PyTorch"
    : impl === "bound"
    ? "bound"
    : "pinstream";
}

function pipelineSpec(r: BenchResult): Spec {
  return barSpec(
    r,
    "Device pipeline: normalized batches per second",
    r.rows.map((x) => ({ name: x.name, value: x.samplesPerSecond, who: who(x.impl) })),
    "samples/s",
  );
}

function trainSpec(r: BenchResult): Spec {
  return barSpec(
    r,
    "Training: seconds per epoch",
    r.rows.map((x) => ({
      name: x.name,
      value: x.seconds,
      who: String(x.name).toLowerCase().includes("pytorch") ? "PyTorch" : who(x.impl),
    })),
    "seconds per epoch (lower is better)",
  );
}

function distSpec(r: BenchResult): Spec {
  return barSpec(
    r,
    "Data-parallel training step, batch 64 per rank",
    r.rows.map((x) => ({ name: x.name, value: x.msPerStep, who: who(x.impl) })),
    "ms per step (lower is better)",
  );
}

function imagefolderSpec(r: BenchResult): Spec {
  return barSpec(
    r,
    `${
      String(r.format ?? "image").toUpperCase()
    } files to fp16 224x224 batches (RandomResizedCrop, flip, normalize): samples/s`,
    r.rows.map((x) => ({
      name: `${x.workers} worker${x.workers === 1 ? "" : "s"}, ${
        x.impl === "torchvision" ? "torchvision + Pillow" : "pinstream"
      }`,
      value: x.samplesPerSecond,
      who: x.impl === "torchvision" ? "PyTorch" : "pinstream",
    })),
    "samples/s (higher is better)",
  );
}

function kernelsSpec(r: BenchResult): Spec {
  const withFlops = r.rows.filter((x) => typeof x.gflops === "number");
  return barSpec(
    r,
    "Kernels: GFLOP/s",
    withFlops.map((x) => ({ name: x.name, value: x.gflops, who: "pinstream" })),
    "GFLOP/s",
  );
}

/** A run of `deno task doctor` as doctor.json holds it (train/doctor.ts's DoctorReport). */
interface DoctorRun {
  name: string;
  samplesPerSecond: number;
}

function doctorSpec(r: BenchResult): Spec {
  const d = r as unknown as {
    data?: string;
    synthetic: DoctorRun;
    sweep: DoctorRun[];
    depth1: DoctorRun;
    pageable: DoctorRun;
    resident?: DoctorRun | null;
  };
  const fed = [...d.sweep, d.depth1, d.pageable];
  if (d.resident) fed.push({ ...d.resident, name: "data resident on the device" });
  return barSpec(
    { ...r, machine: r.machine ?? d.data },
    "Does training wait for data? Training samples/s per run",
    [
      {
        name: "device-resident batch (no loader)",
        value: d.synthetic.samplesPerSecond,
        who: "no input",
      },
      ...fed.map((x) => ({ name: x.name, value: x.samplesPerSecond, who: "fed by the loader" })),
    ],
    "training samples/s (higher is better)",
  );
}

function precisionSpec(r: BenchResult): Spec {
  const bars = (field: string, scale: number, title: string): Spec => ({
    width: WIDTH,
    height: 110,
    data: {
      values: r.rows.map((x) => ({
        model: String(x.name).replace(/, fp(16|32)$/, ""),
        precision: x.precision,
        value: Number(x[field]) / scale,
      })),
    },
    mark: { type: "bar" },
    encoding: {
      y: { field: "model", type: "nominal", title: null, sort: null, axis: { labelLimit: 200 } },
      yOffset: { field: "precision", type: "nominal" },
      x: { field: "value", type: "quantitative", title },
      color: { field: "precision", type: "nominal", title: null, legend: { orient: "bottom" } },
    },
  });
  return titled(r, "fp16 (mixed) against fp32: step time and memory", {
    vconcat: [
      bars("msPerStep", 1, "milliseconds per training step (lower is better)"),
      bars("peakBytes", 2 ** 20, "peak device memory of a step, MiB"),
    ],
  });
}

const SPECS: Record<string, (r: BenchResult) => Spec> = {
  doctor: doctorSpec,
  precision: precisionSpec,
  loader: loaderSpec,
  transfer: transferSpec,
  pipeline: pipelineSpec,
  train: trainSpec,
  kernels: kernelsSpec,
  dist: distSpec,
  imagefolder: imagefolderSpec,
};

/**
 * Renders the loss and accuracy curves of a training log (train/metrics.ts records with `epoch`,
 * `trainLoss`, `testLoss`, `trainAcc`, `testAcc`) to SVG text.
 *
 * @param records The log's records, in order.
 * @returns The SVG.
 */
export async function curvesSvg(records: readonly Record<string, unknown>[]): Promise<string> {
  const rows: Record<string, unknown>[] = [];
  for (const r of records) {
    for (
      const [key, series, panel] of [
        ["trainLoss", "train", "loss"],
        ["testLoss", "test", "loss"],
        ["trainAcc", "train", "accuracy"],
        ["testAcc", "test", "accuracy"],
      ]
    ) {
      const v = r[key];
      if (typeof v === "number" && Number.isFinite(v)) {
        rows.push({ epoch: r.epoch, value: v, series, panel });
      }
    }
  }
  const data = records.find((r) => typeof r.data === "string")?.data;
  const panel = (name: string, title: string) => ({
    width: 300,
    height: 220,
    transform: [{ filter: `datum.panel === '${name}'` }],
    mark: { type: "line", point: true },
    encoding: {
      x: { field: "epoch", type: "ordinal", title: "epoch", axis: { labelAngle: 0 } },
      y: {
        field: "value",
        type: "quantitative",
        title,
        ...(name === "accuracy" ? { axis: { format: "%" } } : {}),
      },
      color: { field: "series", type: "nominal", title: null, legend: { orient: "bottom" } },
    },
  });
  const spec = {
    $schema: "https://vega.github.io/schema/vega-lite/v5.json",
    title: {
      text: "Training curves",
      subtitle: typeof data === "string" ? data : "",
      anchor: "start",
    },
    background: "white",
    config: { font: "sans-serif", view: { stroke: null } },
    data: { values: rows },
    hconcat: [panel("loss", "loss"), panel("accuracy", "accuracy")],
  };
  // deno-lint-ignore no-explicit-any
  const view = new vega.View(vega.parse(vl.compile(spec as any).spec), { renderer: "none" });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

/**
 * The Vega-Lite spec of a result's chart, or undefined for a benchmark without one.
 *
 * @param result A benchmark result.
 * @param name The benchmark's name when the result does not carry it (its file name).
 * @returns The spec.
 */
export function chartSpec(result: BenchResult, name = result.benchmark): Spec | undefined {
  const make = name === undefined ? undefined : SPECS[name];
  return make?.(result);
}

/**
 * Renders a result's chart to SVG text.
 *
 * @param result A benchmark result.
 * @param name The benchmark's name when the result does not carry it.
 * @returns The SVG, or undefined for a benchmark without a chart.
 */
export async function chartSvg(result: BenchResult, name?: string): Promise<string | undefined> {
  const spec = chartSpec(result, name);
  if (spec === undefined) return undefined;
  // deno-lint-ignore no-explicit-any
  const compiled = vl.compile(spec as any).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: "none" });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

/**
 * Writes `<result>.svg` beside a result's JSON file.
 *
 * @param jsonPath The result file.
 * @returns The SVG's path, or undefined for a benchmark without a chart.
 */
export async function writeChart(jsonPath: string): Promise<string | undefined> {
  const result = JSON.parse(await Deno.readTextFile(jsonPath)) as BenchResult;
  const name = jsonPath.replace(/^.*\//, "").replace(/\.json$/, "");
  const svg = await chartSvg(result, result.benchmark ?? name);
  if (svg === undefined) return undefined;
  const out = jsonPath.replace(/\.json$/, ".svg");
  await Deno.writeTextFile(out, svg);
  return out;
}
