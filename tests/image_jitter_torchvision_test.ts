// ColorJitter against torchvision itself: the host reference (augmentHost, bit-identical to
// both kernels, see image_kernel_test.ts) against torchvision's functional ops
// (tests/_jitter_torchvision.py) on the same padded crops and flips, each colour step alone and
// all four together, on 3-channel and 1-channel images. Ignored, saying why, where no Python
// with torchvision is installed.
//
// The tolerance: pinstream computes in byte units with one fp32 rounding per operation and the
// contrast mean from exact integer sums; torchvision in [0, 1] with its own roundings, and
// torch.mean's summation. The outputs are compared in [0, 1] units after the normalization
// with mean 0 and std 1 (scale 1/255 in fp32).

import assert from "node:assert";
import { augmentHost } from "../augment/host.ts";
import { normalizeAffine } from "../augment/image.ts";
import { f32Bits, RECORD, rng } from "./_image_reference.ts";

/**
 * Largest difference allowed, in [0, 1] units: 1e-5, about 1/400 of a byte step. Measured:
 * at most 1.2e-6 (hue), 1.8e-7 for the other steps. A grey weight of 0.299 instead of
 * torchvision's 0.2989 would already differ by up to 5e-5.
 */
const TOLERANCE = 1e-5;

/** A Python with torchvision, or undefined. */
function pythonWithTorchvision(): string | undefined {
  for (const py of ["/usr/bin/python3", "python3"]) {
    try {
      const r = new Deno.Command(py, {
        args: ["-c", "import torchvision"],
        env: { OPENBLAS_NUM_THREADS: "1" },
        stderr: "null",
        stdout: "null",
      }).outputSync();
      if (r.success) return py;
    } catch {
      // Not installed here: try the next.
    }
  }
  return undefined;
}

const PY = pythonWithTorchvision();

interface Transform {
  dy: number;
  dx: number;
  flip: boolean;
  vflip: boolean;
  brightness: number;
  contrast: number;
  saturation: number;
  hue: number;
}

/** torchvision's outputs for the batch, flattened per image (CHW). */
async function torchvision(
  images: Uint8Array[],
  transforms: Transform[],
  c: number,
  h: number,
  w: number,
  pad: number,
): Promise<number[][]> {
  const script = new URL("./_jitter_torchvision.py", import.meta.url).pathname;
  const child = new Deno.Command(PY!, {
    args: [script],
    env: { OPENBLAS_NUM_THREADS: "1", OMP_NUM_THREADS: "1" },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(
    new TextEncoder().encode(
      JSON.stringify({ c, h, w, pad, images: images.map((i) => [...i]), transforms }),
    ),
  );
  await writer.close();
  const r = await child.output();
  if (!r.success) throw new Error(`torchvision run failed: ${new TextDecoder().decode(r.stderr)}`);
  return JSON.parse(new TextDecoder().decode(r.stdout));
}

/** The batch through augmentHost, with identity normalization in [0, 1] units. */
function pinstream(
  images: Uint8Array[],
  transforms: Transform[],
  c: number,
  h: number,
  w: number,
  pad: number,
): Float32Array {
  const n = images.length, size = c * h * w;
  const src = new Uint8Array(n * size);
  images.forEach((img, i) => src.set(img, i * size));
  const params = new Int32Array(RECORD * n);
  transforms.forEach((t, i) => {
    params.set([
      t.dy,
      t.dx,
      t.flip ? 1 : 0,
      t.vflip ? 1 : 0,
      0,
      0,
      0,
      f32Bits(t.brightness),
      f32Bits(t.contrast),
      f32Bits(t.saturation),
      f32Bits(t.hue),
    ], RECORD * i);
  });
  const out = new Float32Array(n * size);
  augmentHost(src, params, out, {
    n,
    channels: c,
    height: h,
    width: w,
    layout: "nchw",
    pad,
    affine: normalizeAffine(new Array(c).fill(0), new Array(c).fill(1)),
  });
  return out;
}

/** Random images and transforms: `steps` names the colour steps drawn, the rest are off. */
function batch(seed: number, n: number, c: number, h: number, w: number, pad: number, steps: {
  brightness?: boolean;
  contrast?: boolean;
  saturation?: boolean;
  hue?: boolean;
}): { images: Uint8Array[]; transforms: Transform[] } {
  const r = rng(seed);
  // Smooth images with some saturated and some grey pixels: hue has edges to get wrong.
  const images = Array.from({ length: n }, () => {
    const img = new Uint8Array(c * h * w);
    const base = Array.from({ length: c }, () => r() * 255);
    for (let ch = 0; ch < c; ch++) {
      for (let p = 0; p < h * w; p++) {
        const v = r() < 0.1 ? (r() < 0.5 ? 0 : 255) : base[ch] + (r() - 0.5) * 120;
        img[ch * h * w + p] = Math.max(0, Math.min(255, Math.round(v)));
      }
    }
    if (c === 3) {
      for (let p = 0; p < h * w; p += 7) img[p + h * w] = img[p + 2 * h * w] = img[p];
    }
    return img;
  });
  // Factors from ColorJitter(0.5, 0.5, 1, 0.5)'s ranges, and their ends.
  const factor = (lo: number, hi: number) => {
    const u = r();
    return u < 0.1 ? lo : u > 0.9 ? hi : lo + (hi - lo) * r();
  };
  const transforms = images.map((): Transform => ({
    dy: Math.floor(r() * (2 * pad + 1)),
    dx: Math.floor(r() * (2 * pad + 1)),
    flip: r() < 0.5,
    vflip: r() < 0.5,
    brightness: steps.brightness ? Math.fround(factor(0.5, 1.5)) : 1,
    contrast: steps.contrast ? Math.fround(factor(0.5, 1.5)) : 1,
    saturation: steps.saturation ? Math.fround(factor(0, 2)) : 1,
    hue: steps.hue ? Math.fround(factor(-0.5, 0.5)) : 0,
  }));
  return { images, transforms };
}

const STEPS = [
  {},
  { contrast: true },
  { brightness: true },
  { saturation: true },
  { hue: true },
  { brightness: true, contrast: true, saturation: true, hue: true },
];

for (const [c, h, w, pad] of [[3, 17, 23, 4], [1, 12, 9, 2]]) {
  Deno.test({
    name: `augmentHost's ColorJitter matches torchvision's functional ops on ${c}x${h}x${w} ` +
      `crops within ${TOLERANCE}${
        PY === undefined ? " (skipped: no python3 with torchvision)" : ""
      }`,
    ignore: PY === undefined,
    fn: async () => {
      // One torchvision run for every case (Python starts in seconds).
      const cases = STEPS.map((steps, k) => ({
        steps,
        ...batch(100 + k, 12, c, h, w, pad, steps),
      }));
      const want = await torchvision(
        cases.flatMap((k) => k.images),
        cases.flatMap((k) => k.transforms),
        c,
        h,
        w,
        pad,
      );
      const size = c * h * w;
      let image = 0;
      for (const { steps, images, transforms } of cases) {
        const got = pinstream(images, transforms, c, h, w, pad);
        let worst = 0, at = "";
        for (let i = 0; i < images.length; i++, image++) {
          for (let e = 0; e < size; e++) {
            const d = Math.abs(got[i * size + e] - want[image][e]);
            if (!(d <= worst)) [worst, at] = [d, `image ${i} element ${e}`];
          }
        }
        assert.ok(
          worst <= TOLERANCE,
          `${JSON.stringify(steps)}: ${worst} at ${at} (${JSON.stringify(transforms)})`,
        );
      }
    },
  });
}
