/**
 * `deno task status`: writes the measured figures of the README's Status section from the
 * committed benchmark results (bench/results/*.json), between its `status:begin` and
 * `status:end` markers, so the README's numbers are the results' numbers and are never edited
 * by hand. `--check` only says whether the README is up to date (exit code 1 when not);
 * tests/status_test.ts does the same in the test suite.
 *
 *     deno task status            # rewrite the section
 *     deno task status --check    # compare only
 *
 * @module
 */

const ROOT = new URL("../", import.meta.url);
/** The line before the generated figures. */
export const BEGIN = "<!-- status:begin: deno task status writes this list from bench/results -->";
/** The line after them. */
export const END = "<!-- status:end -->";

type Json = Record<string, unknown>;
interface Row extends Json {
  name: string;
}

/** Reads bench/results/NAME.json. */
async function result(name: string): Promise<Json & { rows: Row[] }> {
  return JSON.parse(await Deno.readTextFile(new URL(`bench/results/${name}.json`, ROOT)));
}

const day = (r: Json) => String(r.date ?? "").slice(0, 10);
const commit = (r: Json) => String(r.commit ?? "").replace(/^([0-9a-f]{7})[0-9a-f]{33}$/, "$1");
const millions = (x: number) => `${(x / 1e6).toFixed(2)}M`;
const times = (x: number) => `${x.toFixed(2)}x`;
const percent = (x: number) => `${Math.round(x * 100)}%`;
const source = (file: string, r: Json) =>
  `[${file}](bench/results/${file}), ${day(r)}, ${commit(r)}`;

function row(r: { rows: Row[] }, name: string | RegExp): Row {
  const found = r.rows.find((x) => typeof name === "string" ? x.name === name : name.test(x.name));
  if (found === undefined) throw new Error(`Cannot write the status: no row ${name}`);
  return found;
}

/**
 * The Status figures as Markdown list items, one per committed result.
 *
 * @returns The lines between the markers.
 */
export async function statusLines(): Promise<string[]> {
  const train = await result("train");
  const ratios = train.ratios as Record<
    string,
    { overTorch1Thread: number; overTorch2Threads: number }
  >;
  const cnn = row(train, /^CNN: pinstream, CPU backend, data in memory/);
  const mlp = row(train, /^MLP: pinstream, CPU backend, data in memory/);
  const pipeline = await result("pipeline");
  const pr = pipeline.ratios as Record<string, number>;
  const resident = row(pipeline, /^pinstream DeviceDataset/);
  const streamed = row(pipeline, String(pipeline.cpuBestRow));
  const loader = await result("loader");
  const zeroCopy = row(loader, "pinstream zero-copy, 2 workers");
  const torchLoader = row(loader, "PyTorch torchvision pipeline, 2 workers");
  const precision = await result("precision");
  const prec = precision.ratios as Record<string, { time: number; peakMemory: number }>;
  const kernels = await result("kernels");
  const best = kernels.rows.filter((r) => typeof r.gflops === "number")
    .sort((a, b) => (b.gflops as number) - (a.gflops as number))[0];
  const dist = await result("dist");
  const ar = (dist.allreduce as { mpi: string; mib: number; sameMomentRatio: number }[])
    .filter((r) => r.mpi === "openmpi");
  const load = (dist.loadAverage as { before: number[] }).before[0];
  const steps = dist.train as {
    model: string;
    ranks: number;
    pinstreamMs: number;
    torchMs: number;
  }[];
  const two = (m: string) => steps.find((r) => r.model === m && r.ranks === 2)!;
  const images = await result("imagefolder"), png = await result("imagefolder_png");
  /** "r0, r1, r2 samples/s at 0, 1, 2 workers, a-b x torchvision's" of an imagefolder result. */
  const imageRates = (r: Json & { rows: Row[] }) => {
    const ours = r.rows.filter((x) => x.impl === "pinstream");
    const ratio = ours.map((x) =>
      (x.samplesPerSecond as number) /
      (r.rows.find((t) => t.impl === "torchvision" && t.workers === x.workers)!
        .samplesPerSecond as number)
    );
    return {
      rates: `${ours.map((x) => Math.round(x.samplesPerSecond as number)).join(", ")} samples/s ` +
        `at ${ours.map((x) => x.workers).join(", ")} workers`,
      ratios: `${Math.min(...ratio).toFixed(2)}-${Math.max(...ratio).toFixed(2)}x`,
    };
  };
  const jpeg = imageRates(images), pngRates = imageRates(png);
  const decodeAlone = images.decodeAlone as {
    pinstreamImagesPerSecond: number;
    libjpegTurboImagesPerSecond: number;
  };
  const transfer = await result("transfer");
  const h2d = Math.max(...transfer.rows.map((r) => (r.h2d as { pinned: number }).pinned));
  return [
    `- **Training** (${source("train.json", train)}): a Fashion-MNIST CNN epoch in ` +
    `${(cnn.seconds as number).toFixed(1)} s on the CPU backend, ` +
    `${times(ratios.cnn.overTorch2Threads)} PyTorch's time with 2 threads and ` +
    `${times(ratios.cnn.overTorch1Thread)} with 1; the MLP epoch in ` +
    `${(mlp.seconds as number).toFixed(2)} s, ${times(ratios.mlp.overTorch2Threads)} and ` +
    `${times(ratios.mlp.overTorch1Thread)}.`,
    `- **Normalized fp16 CIFAR batches** (${source("pipeline.json", pipeline)}): from a resident ` +
    `set ${millions(resident.samplesPerSecond as number)} samples/s, ` +
    `${times(pr.residentVsTorchVectorizedBest)} PyTorch's best vectorized form and ` +
    `${percent(pr.residentVsBandwidthBoundLeastBytes)} of a plain copy's bound; streamed ` +
    `(${streamed.name.replace(/^pinstream toDevice, /, "")}) ` +
    `${millions(streamed.samplesPerSecond as number)}, ${times(pr.cpuBestVsTorchVectorizedBest)} ` +
    `and ${percent(pr.cpuBestVsBandwidthBound)}.`,
    `- **DataLoader** (${source("loader.json", loader)}): zero-copy CIFAR batches with 2 workers ` +
    `at ${millions(zeroCopy.samplesPerSecond as number)} samples/s, against ` +
    `${Math.round((torchLoader.samplesPerSecond as number) / 1e3)}k for PyTorch's torchvision ` +
    `pipeline with 2 workers.`,
    `- **fp32 against fp16** (${source("precision.json", precision)}): step time ` +
    `${times(prec.cnn.time)} on the Fashion-MNIST CNN, ${times(prec.cifar.time)} on the CIFAR-10 ` +
    `net, ${times(prec.mlp.time)} on the MLP; peak memory ${times(prec.cnn.peakMemory)}, ` +
    `${times(prec.cifar.peakMemory)} and ${times(prec.mlp.peakMemory)}.`,
    `- **Image files** (${source("imagefolder.json", images)}): JPEGs to normalized fp16 ` +
    `224x224 batches (RandomResizedCrop, flip) at ${jpeg.rates}, ${jpeg.ratios} torchvision + ` +
    `Pillow's rate at the same worker count (medians of ${
      (images.rows[0].rounds as number[] | undefined)?.length ?? 1
    } rounds); the JPEG decoder at ` +
    `${
      percent(decodeAlone.pinstreamImagesPerSecond / decodeAlone.libjpegTurboImagesPerSecond)
    } of libjpeg-turbo's own rate; PNGs (${source("imagefolder_png.json", png)}) ` +
    `${pngRates.ratios}.`,
    `- **Kernels** (${source("kernels.json", kernels)}): best ${best.name} at ` +
    `${Math.round(best.gflops as number)} GFLOP/s; **copies** ` +
    `(${source("transfer.json", transfer)}): up to ${h2d.toFixed(1)} GB/s host to device, pinned.`,
    `- **Data-parallel, 2 ranks** (${source("dist.json", dist)}): the all-reduce at ` +
    `${ar.map((r) => percent(r.sameMomentRatio)).join(", ")} of the speed of MPI_Allreduce ` +
    `called in turn in the same processes, at ${ar.map((r) => r.mib).join(", ")} MiB (Open ` +
    `MPI, medians, load ${load.toFixed(0)}); a step of the MLP in ` +
    `${times(two("mlp").pinstreamMs / two("mlp").torchMs)} and of the CNN in ` +
    `${times(two("cnn").pinstreamMs / two("cnn").torchMs)} PyTorch DDP's time (Gloo).`,
  ];
}

/**
 * The text between the markers with its line breaks and runs of spaces made single spaces, so
 * the formatter's wrapping of the list does not count as a difference.
 *
 * @param readme The README's text.
 * @returns The figures, normalized.
 */
export function statusOf(readme: string): string {
  const a = readme.indexOf(BEGIN), b = readme.indexOf(END);
  if (a < 0 || b < a) throw new Error(`Cannot read the status: README.md lacks ${BEGIN}`);
  return normalized(readme.slice(a + BEGIN.length, b));
}

/**
 * Markdown list text with every run of whitespace made one space.
 *
 * @param text The text.
 * @returns It, normalized.
 */
export function normalized(text: string): string {
  return text.replace(/\s+/g, " ").trim();
}

/**
 * The README with its Status figures replaced by `lines`.
 *
 * @param readme The README's text.
 * @param lines The figures.
 * @returns The new text.
 * @throws {Error} When the README lacks the markers.
 */
export function withStatus(readme: string, lines: readonly string[]): string {
  const a = readme.indexOf(BEGIN), b = readme.indexOf(END);
  if (a < 0 || b < a) throw new Error(`Cannot write the status: README.md lacks ${BEGIN}`);
  return readme.slice(0, a + BEGIN.length) + "\n" + lines.join("\n") + "\n" + readme.slice(b);
}

if (import.meta.main) {
  const path = new URL("README.md", ROOT);
  const readme = await Deno.readTextFile(path);
  const lines = await statusLines();
  if (statusOf(readme) === normalized(lines.join("\n"))) {
    console.log("README.md's Status figures match bench/results");
  } else if (Deno.args.includes("--check")) {
    console.error("README.md's Status figures differ from bench/results: run deno task status");
    Deno.exit(1);
  } else {
    await Deno.writeTextFile(path, withStatus(readme, lines));
    // The formatter wraps the list as it wraps the rest of the README.
    await new Deno.Command(Deno.execPath(), { args: ["fmt", path.pathname] }).output();
    console.log("README.md: Status figures written from bench/results");
  }
}
