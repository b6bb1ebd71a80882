/**
 * Image-file benchmark: a folder of JPEGs (or PNGs) to normalized fp16 batches of 224x224
 * ready for the training step, side by side in one run:
 *
 * - pinstream: `ImageFolder` with `randomResizedCrop: { size: 224 }` (the workers decode with
 *   libjpeg-turbo at the smallest DCT scale that keeps the crop at least 224, crop, bilinear
 *   resize straight into the ring slot), the loader's flip, and `toDevice` on the CPU device
 *   (flip + normalize + fp16 fused), batch 64, shuffled, at 0, 1 and 2 workers;
 * - torchvision `ImageFolder` + Pillow + `DataLoader(num_workers)` with RandomResizedCrop(224),
 *   RandomHorizontalFlip, ToTensor, Normalize and a cast to fp16 (bench/imagefolder_torch.py),
 *   at the same worker counts, each right after pinstream's row of that count;
 * - the decoders alone, one thread, full-size RGB decodes of every file from memory:
 *   pinstream's `ImageDecoder` against libjpeg-turbo's own rate in a small C loop over the same
 *   files (bench/tj_decode.c, built here with cc) and Pillow's (bench/pillow_decode.py), in
 *   turns, the best of three rounds each;
 * - the resize alone: RandomResizedCrop boxes of 200 decoded files to 224x224, decode/resize.ts
 *   in WebAssembly against its JavaScript loops (the same bytes), in turns, best of three.
 *
 * The folder: `--data DIR`, else `--count` generated files (bench/make_imagefolder.py,
 * ImageNet-like sizes around 500x375, JPEG quality 90, or PNG with `--png`) in bench/out/.
 * Writes bench/out/imagefolder.json, or imagefolder_png.json with --png (bench/results/ with
 * --save).
 *
 *     deno run -A bench/imagefolder.ts [--data DIR] [--count 2000] [--png] [--workers 0,1,2]
 *       [--epochs 1] [--repeat 1] [--no-torch] [--save]
 *
 * @module
 */

import { join } from "node:path";
import { commitStamp, machine, writeResult } from "./_results.ts";
import { parseCli } from "../train/cli.ts";
import { Device } from "../ffi/device.ts";
import { DataLoader } from "../loader/data_loader.ts";
import { ImageFolder } from "../loader/datasets/image_folder.ts";
import { ImageDecoder, resizeBilinear } from "../decode/mod.ts";
import { Spng } from "../decode/spng.ts";
import { randomResizedCropBox } from "../loader/datasets/image_files.ts";
import { toDevice } from "../pipeline/prefetcher.ts";

const HERE = new URL(".", import.meta.url).pathname;
const BATCH = 64;
const MEAN = [0.485, 0.456, 0.406], STD = [0.229, 0.224, 0.225];

const cli = parseCli(Deno.args, {
  usage: "deno run -A bench/imagefolder.ts [options]",
  summary: "Image files to normalized fp16 224x224 batches: pinstream against torchvision.",
  options: {
    data: { kind: "string", metavar: "DIR", help: "class folders of images (default: generated)" },
    count: { kind: "int", min: 64, help: "files to generate without --data", default: 2000 },
    png: { kind: "boolean", help: "generate PNG files instead of JPEG" },
    workers: { kind: "string", help: "worker counts", default: "0,1,2" },
    epochs: { kind: "int", min: 1, help: "measured epochs after a warm-up one", default: 1 },
    repeat: {
      kind: "int",
      min: 1,
      help: "rounds over the worker counts (each row reports the median round)",
      default: 1,
    },
    torch: {
      kind: "boolean",
      help: "run the torchvision rows (--no-torch to skip)",
      default: true,
    },
    save: { kind: "boolean", help: "write bench/results/ instead of bench/out/" },
  },
});
const o = cli as unknown as {
  data?: string;
  count: number;
  png?: boolean;
  workers: string;
  epochs: number;
  repeat: number;
  torch: boolean;
  save?: boolean;
};
const workerCounts = o.workers.split(",").map(Number);

/** The folder measured: --data, or generated once into bench/out/. */
async function folder(): Promise<string> {
  if (o.data) return o.data;
  const root = join(HERE, "out", `imagefolder-${o.png ? "png" : "jpeg"}-${o.count}`);
  try {
    await Deno.stat(join(root, "complete"));
    return root;
  } catch {
    // Not generated yet.
  }
  console.error(`generating ${o.count} ${o.png ? "PNG" : "JPEG"} files into ${root}`);
  const args = [join(HERE, "make_imagefolder.py"), root, "--count", String(o.count)];
  if (o.png) args.push("--png");
  const r = await new Deno.Command("/usr/bin/python3", { args, stdout: "inherit" }).output();
  if (!r.success) {
    throw new Error(`Cannot generate the folder: ${new TextDecoder().decode(r.stderr)}`);
  }
  await Deno.writeTextFile(join(root, "complete"), "");
  return root;
}

const root = await folder();
const loadAtStart = Deno.loadavg();
const files = new ImageFolder(root, { verbose: false });
console.error(`${files.length} files in ${files.classes.length} classes under ${root}`);

interface Row {
  impl: string;
  workers: number;
  samplesPerSecond: number;
  epochs: number[];
  /** Each round's rate (with --repeat). */
  rounds?: number[];
}
const rows: Row[] = [];

async function pinstreamRow(numWorkers: number, device: Device): Promise<Row> {
  const ds = new ImageFolder(root, { randomResizedCrop: { size: 224 }, verbose: false });
  await using loader = new DataLoader(ds, {
    batchSize: BATCH,
    shuffle: true,
    seed: 0,
    numWorkers,
    persistentWorkers: numWorkers > 0,
    augment: { flip: true },
    autoRelease: false,
  });
  await using p = toDevice(loader, device, {
    mean: MEAN,
    std: STD,
    dtype: "f16",
    layout: "nhwc",
    persistent: true,
  });
  const rates: number[] = [];
  for (let e = 0; e <= o.epochs; e++) {
    const t0 = performance.now();
    let n = 0;
    for await (const b of p) n += b.size;
    await device.synchronize();
    if (e > 0) rates.push(n / ((performance.now() - t0) / 1000));
  }
  return {
    impl: "pinstream",
    workers: numWorkers,
    samplesPerSecond: Math.max(...rates),
    epochs: rates,
  };
}

/** torchvision's row at `w` workers (bench/imagefolder_torch.py). */
async function torchRow(w: number): Promise<Row> {
  const r = await new Deno.Command("/usr/bin/python3", {
    args: [
      join(HERE, "imagefolder_torch.py"),
      "--data",
      root,
      "--workers",
      String(w),
      "--epochs",
      String(o.epochs),
      "--batch",
      String(BATCH),
    ],
    stderr: "inherit",
  }).output();
  if (!r.success) throw new Error("bench/imagefolder_torch.py failed");
  const line = new TextDecoder().decode(r.stdout).split("\n").find((l) => l.startsWith("{"));
  const t = JSON.parse(line!);
  return {
    impl: "torchvision",
    workers: w,
    samplesPerSecond: Math.max(...t.epochs),
    epochs: t.epochs,
  };
}

// The rows alternate, pinstream then torchvision at each worker count, so that a change in
// the machine's load between them (other jobs) weighs on both alike; with --repeat, round
// after round, each row then the median of its rounds (every round's rate kept).
{
  using device = Device.open("cpu");
  const rounds: Row[][] = [];
  for (let r = 0; r < o.repeat; r++) {
    const round: Row[] = [];
    for (const w of workerCounts) {
      console.error(`... round ${r + 1}: pinstream, ${w} workers`);
      round.push(await pinstreamRow(w, device));
      if (o.torch) {
        console.error(`... round ${r + 1}: torchvision, ${w} workers`);
        round.push(await torchRow(w));
      }
    }
    rounds.push(round);
  }
  for (const [k, first] of rounds[0].entries()) {
    const rates = rounds.map((round) => round[k].samplesPerSecond);
    const median = [...rates].sort((a, b) => a - b)[rates.length >> 1];
    rows.push({ ...first, samplesPerSecond: median, rounds: rates } as Row);
  }
}

// The decoders alone: one thread, every file decoded in full to RGB from memory, pinstream's
// ImageDecoder and libjpeg-turbo's C loop in turns, three rounds, the best of each.
const paths = Array.from({ length: files.length }, (_, i) => files.path(i));
const bytes = paths.map((p) => Deno.readFileSync(p));
const decoder = new ImageDecoder();
const oursOnce = () => {
  // One output buffer, as the C loop has.
  const out = new Uint8Array(4096 * 4096 * 3);
  for (const b of bytes.slice(0, 20)) decoder.decode(b, { out }); // warm-up
  const t0 = performance.now();
  for (const b of bytes) decoder.decode(b, { out });
  return bytes.length / ((performance.now() - t0) / 1000);
};
// The files, one path a line, for the C loop and Pillow's script.
await Deno.mkdir(join(HERE, "out"), { recursive: true });
const list = join(HERE, "out", "decode.list");
await Deno.writeTextFile(list, paths.join("\n") + "\n");
let referenceOnce: () => Promise<number>;
if (!o.png) {
  const exe = join(HERE, "out", "tj_decode");
  const cc = await new Deno.Command("cc", {
    args: ["-O2", "-o", exe, join(HERE, "tj_decode.c"), "-lturbojpeg"],
  }).output();
  if (!cc.success) {
    throw new Error(`Cannot build tj_decode: ${new TextDecoder().decode(cc.stderr)}`);
  }
  referenceOnce = async () => {
    const r = await new Deno.Command(exe, { args: [list] }).output();
    if (!r.success) throw new Error(`tj_decode failed: ${new TextDecoder().decode(r.stderr)}`);
    return JSON.parse(new TextDecoder().decode(r.stdout)).imagesPerSecond;
  };
} else {
  // libspng alone (the decoder of every PNG outside the libdeflate path), for PNGs.
  const spng = new Spng();
  referenceOnce = () => {
    for (const b of bytes.slice(0, 20)) spng.decode(b, 3, Infinity); // warm-up
    const t0 = performance.now();
    for (const b of bytes) spng.decode(b, 3, Infinity);
    return Promise.resolve(bytes.length / ((performance.now() - t0) / 1000));
  };
}
// Pillow's decode of the same files (what torchvision's loader runs per file), one thread.
const pillowOnce = async () => {
  const r = await new Deno.Command("/usr/bin/python3", {
    args: [join(HERE, "pillow_decode.py"), list],
  }).output();
  if (!r.success) {
    throw new Error(`pillow_decode.py failed: ${new TextDecoder().decode(r.stderr)}`);
  }
  return JSON.parse(new TextDecoder().decode(r.stdout)).imagesPerSecond as number;
};
const oursRounds: number[] = [], referenceRounds: number[] = [], pillowRounds: number[] = [];
for (let k = 0; k < 3; k++) {
  referenceRounds.push(await referenceOnce());
  if (o.torch) pillowRounds.push(await pillowOnce());
  oursRounds.push(oursOnce());
}
const ours = Math.max(...oursRounds);
const reference = Math.max(...referenceRounds);
const pillow = o.torch ? Math.max(...pillowRounds) : undefined;

// The resize alone, one thread: each of the first 200 files decoded once, then a
// RandomResizedCrop box of it (seeded) resized to 224 x 224 by decode/resize.ts, in
// WebAssembly and in JavaScript in turns (the same bytes), three rounds, the best of each.
const resizeInputs = bytes.slice(0, 200).map((b, i) => {
  const image = decoder.decode(b);
  let s = i + 1;
  const random = () => (s = (s * 1103515245 + 12345) % 2147483648) / 2147483648;
  return {
    image,
    box: randomResizedCropBox(image.height, image.width, [0.08, 1], [3 / 4, 4 / 3], random),
  };
});
const resizeOnce = (engine: "auto" | "javascript") => {
  const out = new Uint8Array(224 * 224 * 3);
  const t0 = performance.now();
  for (const { image, box } of resizeInputs) {
    resizeBilinear(image, 224, 224, true, out, box, engine);
  }
  return (performance.now() - t0) * 1000 / resizeInputs.length;
};
const wasmRounds: number[] = [], jsRounds: number[] = [];
for (let k = 0; k < 3; k++) {
  wasmRounds.push(resizeOnce("auto"));
  jsRounds.push(resizeOnce("javascript"));
}
const resizeUs = { webAssembly: Math.min(...wasmRounds), javaScript: Math.min(...jsRounds) };

const row = (impl: string, w: number) => rows.find((r) => r.impl === impl && r.workers === w);
console.log(
  `\n${files.length} ${
    o.png ? "PNG" : "JPEG"
  } files, batch ${BATCH}, RandomResizedCrop(224) + flip + normalize to fp16`,
);
console.log(
  `workers  pinstream/s  torchvision/s  ratio${
    o.repeat > 1 ? ` (medians of ${o.repeat} rounds; each round's ratio)` : ""
  }`,
);
for (const w of workerCounts) {
  const p = row("pinstream", w)!, t = row("torchvision", w);
  const each = t && o.repeat > 1
    ? `  (${p.rounds!.map((x, k) => (x / t.rounds![k]).toFixed(2) + "x").join(", ")})`
    : "";
  console.log(
    `${String(w).padStart(7)}  ${p.samplesPerSecond.toFixed(0).padStart(11)}  ${
      t ? t.samplesPerSecond.toFixed(0).padStart(13) : "            -"
    }  ${t ? (p.samplesPerSecond / t.samplesPerSecond).toFixed(2) + "x" : "-"}${each}`,
  );
}
console.log(
  `decode alone, one thread: pinstream ${ours.toFixed(0)} images/s` +
    (reference
      ? `, ${o.png ? "libspng" : "libjpeg-turbo C loop"} ${reference.toFixed(0)} images/s (${
        (100 * ours / reference).toFixed(0)
      }%)`
      : "") +
    (pillow ? `, Pillow ${pillow.toFixed(0)} images/s` : ""),
);
console.log(
  `resize alone (a RandomResizedCrop box to 224x224), one thread: WebAssembly ${
    resizeUs.webAssembly.toFixed(0)
  } us, JavaScript ${resizeUs.javaScript.toFixed(0)} us per image`,
);

const load = Deno.loadavg();
await writeResult(o.png ? "imagefolder_png" : "imagefolder", {
  benchmark: "imagefolder",
  command: `deno run -A bench/imagefolder.ts ${Deno.args.join(" ")}`.trim(),
  date: new Date().toISOString(),
  machine: await machine(),
  commit: await commitStamp(),
  loadAverageAtStart: loadAtStart,
  loadAverageAtEnd: load,
  files: files.length,
  format: o.png ? "png" : "jpeg",
  batch: BATCH,
  pipeline: "RandomResizedCrop(224) + horizontal flip + normalize (ImageNet mean/std) to fp16",
  decoders: decoder.description,
  rows,
  decodeAlone: {
    pinstreamImagesPerSecond: ours,
    // For PNG files: libspng's rate (called from Deno), not libjpeg-turbo's.
    libjpegTurboImagesPerSecond: o.png ? undefined : reference,
    libspngImagesPerSecond: o.png ? reference : undefined,
    pinstreamRounds: oursRounds,
    [o.png ? "libspngRounds" : "libjpegTurboRounds"]: referenceRounds,
    pillowImagesPerSecond: pillow,
    pillowRounds,
  },
  resizeAloneMicroseconds: {
    ...resizeUs,
    webAssemblyRounds: wasmRounds,
    javaScriptRounds: jsRounds,
  },
}, o.save ?? false);
