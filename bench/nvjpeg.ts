/**
 * JPEG decode on the GPU with nvJPEG against libjpeg-turbo on one host thread: generated
 * `--size` x `--size` JPEGs (quality 90, 4:2:0), decoded to full-size RGB from memory. The GPU
 * side decodes batches of `--batch` on one stream into a reused `[batch, size, size, 3]` tensor
 * and is timed to the stream's end; the best of `--rounds`. The first batch's bytes are compared
 * with libjpeg-turbo's (nvJPEG's IDCT rounds differently: the counts say how much). Where nvJPEG
 * cannot run it prints why and exits 0. Writes bench/out/nvjpeg.json (bench/results/ with --save).
 *
 *     deno run -A bench/nvjpeg.ts [--count 512] [--size 224] [--batch 64] [--save]
 *
 * @module
 */

import { assertMeasurable, commitStamp, machine, smokeRun, writeResult } from "./_results.ts";
import { parseCli } from "../train/cli.ts";
import { TurboJpeg } from "../decode/turbojpeg.ts";
import { Device } from "../ffi/device.ts";
import { openNvjpeg } from "../ffi/nvjpeg.ts";
import { Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";

const cli = parseCli(Deno.args, {
  usage: "deno run -A bench/nvjpeg.ts [options]",
  summary: "JPEG decode rate: nvJPEG on the GPU against libjpeg-turbo on one host thread.",
  options: {
    count: { kind: "int", min: 1, help: "JPEGs to generate", default: 512 },
    size: { kind: "int", min: 8, help: "their side in pixels", default: 224 },
    batch: { kind: "int", min: 1, help: "JPEGs per nvJPEG call", default: 64 },
    rounds: { kind: "int", min: 1, help: "timed passes; the best counts", default: 3 },
    save: { kind: "boolean", help: "write bench/results/ instead of bench/out/" },
  },
});
const o = cli as unknown as {
  count: number;
  size: number;
  batch: number;
  rounds: number;
  save?: boolean;
};
if (smokeRun()) Object.assign(o, { count: 6, size: 16, batch: 4, rounds: 1 });

using device = Device.open("cuda");
assertMeasurable(device);
const opened = openNvjpeg(device);
if (typeof opened === "string") {
  console.log(opened);
  Deno.exit(0);
}
using decoder = opened;
using tj = new TurboJpeg();
const loadAtStart = Deno.loadavg();

const { count, size, batch } = o;
const files: Uint8Array[] = [];
for (let i = 0; i < count; i++) {
  const data = new Uint8Array(size * size * 3);
  for (let k = 0; k < data.length; k++) {
    const p = (k / 3) | 0, x = p % size, y = (p / size) | 0;
    data[k] = (x * 3 + y * (k % 3 + 1) + ((x >> 3) ^ (y >> 3)) * 40 + i * 13) & 255;
  }
  files.push(tj.encode({ data, height: size, width: size, channels: 3 }, 90));
}
const inputs = files.map((bytes, i) => ({ name: `generated-${i}.jpg`, bytes }));

function hostRate(): number {
  const out = new Uint8Array(size * size * 3), h = tj.header(files[0]);
  const t0 = performance.now();
  for (const f of files) tj.decode(f, 3, h, h, out);
  return count / ((performance.now() - t0) / 1000);
}

using stream = new Stream(device);
using out = Tensor.empty(device, [batch, size, size, 3], "u8");
async function deviceRate(): Promise<number> {
  const t0 = performance.now();
  for (let i = 0; i + batch <= count; i += batch) {
    decoder.decode(inputs.slice(i, i + batch), { stream, out });
  }
  await stream.synchronize();
  return Math.floor(count / batch) * batch / ((performance.now() - t0) / 1000);
}

if (count < batch) throw new Error(`Cannot measure: --count ${count} is under --batch ${batch}`);
await deviceRate(); // warm-up: nvJPEG's buffers, the hardware decoder's start
const rounds = { nvjpeg: [] as number[], turbojpeg: [] as number[] };
for (let r = 0; r < o.rounds; r++) {
  rounds.nvjpeg.push(await deviceRate());
  rounds.turbojpeg.push(hostRate());
}
decoder.decode(inputs.slice(0, batch), { stream, out });
const got = await out.toHost({ stream }) as Uint8Array;
let differing = 0, maxDiff = 0;
for (let i = 0; i < batch; i++) {
  const want = tj.decode(files[i], 3, tj.header(files[i]), { height: size, width: size }).data;
  for (let k = 0; k < want.length; k++) {
    const d = Math.abs(got[i * want.length + k] - want[k]);
    if (d > 0) differing++;
    if (d > maxDiff) maxDiff = d;
  }
}
const best = (r: number[]) => Math.max(...r);
const loadAtEnd = Deno.loadavg();
console.log(
  `${count} JPEGs of ${size}x${size}, full-size RGB; nvJPEG ${decoder.version} ` +
    `(${decoder.backend} backend) in batches of ${batch} on ${device.props.name}, best of ` +
    `${o.rounds}:`,
);
for (const [name, r] of Object.entries(rounds)) {
  console.log(
    `  ${name.padEnd(9)} ${best(r).toFixed(0).padStart(7)} images/s  (rounds ${
      r.map((x) => x.toFixed(0)).join(", ")
    })${name === "turbojpeg" ? " one host thread" : ""}`,
  );
}
console.log(
  `  bytes differing from libjpeg-turbo in the first batch: ${differing} of ${
    batch * size * size * 3
  }, by at most ${maxDiff}`,
);
console.log(
  `load average ${loadAtStart[0].toFixed(1)} at the start, ${loadAtEnd[0].toFixed(1)} at the end`,
);
await writeResult("nvjpeg", {
  benchmark: "nvjpeg",
  date: new Date().toISOString(),
  machine: await machine(),
  commit: await commitStamp(),
  device: device.props.name,
  nvjpeg: { library: decoder.library, version: decoder.version, backend: decoder.backend },
  loadAverageAtStart: loadAtStart,
  loadAverageAtEnd: loadAtEnd,
  count,
  size,
  batch,
  imagesPerSecond: { nvjpeg: best(rounds.nvjpeg), turbojpeg: best(rounds.turbojpeg) },
  rounds,
  againstTurboJpeg: { differing, maxDiff },
}, o.save ?? false);
