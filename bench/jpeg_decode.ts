/**
 * JPEG decode rate, one thread, full-size RGB from memory: pinstream's TypeScript decoder
 * (the fallback without libjpeg-turbo), pinstream's TurboJPEG path, and libjpeg-turbo's own C
 * loop (bench/tj_decode.c, built here with cc) on the same files, in turns, the best of three
 * rounds each. The files: `--data DIR` (class folders), else `--count` generated ones
 * (bench/make_imagefolder.py: ImageNet-like sizes around 500x375, quality 90) in bench/out/.
 * Writes bench/out/jpeg_decode.json (bench/results/ with --save).
 *
 *     deno run -A bench/jpeg_decode.ts [--data DIR] [--count 200] [--save]
 *
 * @module
 */

import { join } from "node:path";
import { commitStamp, machine, writeResult } from "./_results.ts";
import { parseCli } from "../train/cli.ts";
import { ImageFolder } from "../loader/datasets/image_folder.ts";
import { ImageDecoder } from "../decode/mod.ts";

const HERE = new URL(".", import.meta.url).pathname;

const cli = parseCli(Deno.args, {
  usage: "deno run -A bench/jpeg_decode.ts [options]",
  summary: "JPEG decode rate: the TypeScript decoder, the TurboJPEG path, libjpeg-turbo in C.",
  options: {
    data: { kind: "string", metavar: "DIR", help: "class folders of JPEGs (default: generated)" },
    count: { kind: "int", min: 10, help: "files to generate without --data", default: 200 },
    save: { kind: "boolean", help: "write bench/results/ instead of bench/out/" },
  },
});
const o = cli as unknown as { data?: string; count: number; save?: boolean };

async function folder(): Promise<string> {
  if (o.data) return o.data;
  const root = join(HERE, "out", `imagefolder-jpeg-${o.count}`);
  try {
    await Deno.stat(join(root, "complete"));
    return root;
  } catch {
    // Not generated yet.
  }
  console.error(`generating ${o.count} JPEG files into ${root}`);
  const args = [join(HERE, "make_imagefolder.py"), root, "--count", String(o.count)];
  const r = await new Deno.Command("/usr/bin/python3", { args, stdout: "inherit" }).output();
  if (!r.success) throw new Error("Cannot generate the benchmark folder");
  await Deno.writeTextFile(join(root, "complete"), "");
  return root;
}

const loadAtStart = Deno.loadavg();
const files = new ImageFolder(await folder(), { verbose: false });
const paths = Array.from({ length: files.length }, (_, i) => files.path(i));
const bytes = paths.map((p) => Deno.readFileSync(p));
const pixels = paths.reduce((n, _, i) => {
  const d = new ImageDecoder({ backend: "typescript" }).decode(bytes[i]);
  return n + d.width * d.height;
}, 0);

/** Images per second of one pass of `decoder` over every file, after a short warm-up. */
function rate(decoder: ImageDecoder): number {
  // One output buffer, as the C loop has.
  const out = new Uint8Array(4096 * 4096 * 3);
  for (const b of bytes.slice(0, 10)) decoder.decode(b, { out });
  const t0 = performance.now();
  for (const b of bytes) decoder.decode(b, { out });
  return bytes.length / ((performance.now() - t0) / 1000);
}

const exe = join(HERE, "out", "tj_decode");
await Deno.mkdir(join(HERE, "out"), { recursive: true });
const cc = await new Deno.Command("cc", {
  args: ["-O2", "-o", exe, join(HERE, "tj_decode.c"), "-lturbojpeg"],
}).output();
if (!cc.success) throw new Error(`Cannot build tj_decode: ${new TextDecoder().decode(cc.stderr)}`);
const list = join(HERE, "out", "jpeg_decode.list");
await Deno.writeTextFile(list, paths.join("\n") + "\n");
async function cLoop(): Promise<number> {
  const r = await new Deno.Command(exe, { args: [list] }).output();
  if (!r.success) throw new Error(`tj_decode failed: ${new TextDecoder().decode(r.stderr)}`);
  return JSON.parse(new TextDecoder().decode(r.stdout)).imagesPerSecond;
}

const typescript = new ImageDecoder({ backend: "typescript" });
const turbojpeg = new ImageDecoder({ backend: "native" });
const rounds = { typescript: [] as number[], turbojpeg: [] as number[], c: [] as number[] };
for (let k = 0; k < 3; k++) {
  rounds.c.push(await cLoop());
  rounds.turbojpeg.push(rate(turbojpeg));
  rounds.typescript.push(rate(typescript));
}
const best = (r: number[]) => Math.max(...r);
const c = best(rounds.c);
console.log(
  `${files.length} JPEGs, ${(pixels / files.length / 1000).toFixed(0)} kpixels each on average, ` +
    "full-size RGB, one thread, best of 3 rounds:",
);
for (const [name, r] of Object.entries(rounds)) {
  console.log(
    `  ${name.padEnd(10)} ${best(r).toFixed(0).padStart(6)} images/s  (${
      (100 * best(r) / c).toFixed(0)
    }% of the C loop; rounds ${r.map((x) => x.toFixed(0)).join(", ")})`,
  );
}
const loadAtEnd = Deno.loadavg();
console.log(
  `load average ${loadAtStart[0].toFixed(1)} at the start, ${loadAtEnd[0].toFixed(1)} at the end`,
);
await writeResult("jpeg_decode", {
  benchmark: "jpeg_decode",
  date: new Date().toISOString(),
  machine: await machine(),
  commit: await commitStamp(),
  loadAverageAtStart: loadAtStart,
  loadAverageAtEnd: loadAtEnd,
  files: files.length,
  pixels,
  imagesPerSecond: { typescript: best(rounds.typescript), turbojpeg: best(rounds.turbojpeg), c },
  rounds,
}, o.save ?? false);
