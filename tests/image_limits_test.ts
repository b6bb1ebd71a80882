// imageAugment (ps_image_augment) past the CUDA launch's grid limits: launch_augment (kernels/cuda/image.cu)
// caps grid.x at 1024 blocks of 256 pixels and grid.y at 65535 (sample, channel) planes, and
// the kernel grid-strides over the rest. A plane of more than 1024 x 256 pixels and a batch
// of more than 65535 planes, in odd shapes, both layouts and both output types: the CPU
// backend equals the TypeScript reference bit for bit, and CUDA (a GPU, or the emulator with
// PINSTREAM_CUDA_EMULATOR=1) equals the CPU backend byte for byte. Every other sample also
// vertically flips, cuts out a square and jitters brightness and contrast.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { DeviceBuffer } from "../ffi/memory.ts";
import { Tensor } from "../ffi/tensor.ts";
import { normalizeAffine } from "../augment/image.ts";
import { imageAugment } from "../ops/image.ts";
import { bitDiff, f32Bits, ONE_BITS, RECORD, referenceAugment, rng } from "./_image_reference.ts";
import { CUDA } from "./_backends.ts";

interface Shape {
  what: string;
  n: number;
  c: number;
  h: number;
  w: number;
  pad: number;
}

const SHAPES: Shape[] = [
  // 269,357 pixels: more than 1024 blocks x 256 threads, so threads take a second pixel.
  { what: "one 521x517 plane", n: 1, c: 1, h: 521, w: 517, pad: 9 },
  // 65,553 planes: more than grid.y's 65535, so blocks take a second plane.
  { what: "21851 x 3 planes of 3x5", n: 21851, c: 3, h: 3, w: 5, pad: 2 },
];
const LAYOUTS = ["nchw", "nhwc"] as const;
const DTYPES = ["f16", "f32"] as const;

interface Batch {
  src: Uint8Array;
  params: Int32Array;
  mean: number[];
  std: number[];
}

/**
 * Random pixels and crop/flip parameters, windows reaching up to 2 pixels past the padding;
 * every other sample also has a vertical flip bit, a cutout square and all four colour factors.
 */
function batch(s: Shape, seed: number): Batch {
  const r = rng(seed);
  const src = new Uint8Array(s.n * s.c * s.h * s.w);
  for (let i = 0; i < src.length; i++) src[i] = (r() * 256) | 0;
  const params = new Int32Array(RECORD * s.n);
  for (let i = 0; i < s.n; i++) {
    const at = RECORD * i;
    params[at] = Math.floor(r() * (2 * s.pad + 5)) - 2;
    params[at + 1] = Math.floor(r() * (2 * s.pad + 5)) - 2;
    params[at + 2] = r() < 0.5 ? 1 : 0;
    params[at + 7] = params[at + 8] = params[at + 9] = ONE_BITS;
    // A batch of one (the big plane) gets them too: its contrast's mean spans many rows.
    if (i % 2 === 1 || s.n === 1) {
      params[at + 3] = r() < 0.5 ? 1 : 0;
      params[at + 4] = Math.floor(r() * 65536);
      params[at + 5] = Math.floor(r() * 65536);
      params[at + 6] = Math.floor(r() * Math.max(s.h, s.w));
      params[at + 7] = f32Bits(r() * 2);
      params[at + 8] = f32Bits(r() * 2);
      params[at + 9] = f32Bits(r() * 2);
      params[at + 10] = f32Bits(r() - 0.5);
    }
  }
  const mean = Array.from({ length: s.c }, () => r());
  const std = Array.from({ length: s.c }, () => 0.05 + r());
  return { src, params, mean, std };
}

/** A device buffer holding a copy of `data`. */
function upload(dev: Device, data: ArrayBufferView): DeviceBuffer {
  const buf = DeviceBuffer.alloc(dev, data.byteLength);
  buf.copyFrom(data);
  return buf;
}

/** Runs imageAugment on `dev` and returns the output's bytes. */
async function augment(
  dev: Device,
  s: Shape,
  b: Batch,
  layout: "nchw" | "nhwc",
  dtype: "f16" | "f32",
): Promise<Uint8Array> {
  using src = upload(dev, b.src), params = upload(dev, b.params);
  using out = Tensor.empty(dev, [s.n, s.c, s.h, s.w], dtype);
  imageAugment(src, out, {
    layout,
    affine: normalizeAffine(b.mean, b.std),
    padding: s.pad,
    params,
  });
  return new Uint8Array((await out.toHost()).buffer);
}

for (const s of SHAPES) {
  Deno.test(`[cpu] ps_image_augment on ${s.what} equals the TypeScript reference`, async () => {
    using dev = Device.open("cpu");
    const b = batch(s, s.n + s.h);
    for (const layout of LAYOUTS) {
      for (const dtype of DTYPES) {
        const bytes = await augment(dev, s, b, layout, dtype);
        const got = dtype === "f16"
          ? new Float16Array(bytes.buffer)
          : new Float32Array(bytes.buffer);
        const expected = referenceAugment({ ...b, ...s, layout, dtype });
        assert.deepStrictEqual(bitDiff(got, expected), [], `${s.what} ${layout} ${dtype}`);
      }
    }
  });

  Deno.test({
    name: `[cuda] ps_image_augment on ${s.what} equals the cpu backend byte for byte`,
    ignore: CUDA.ignore,
    async fn() {
      using cuda = Device.open("cuda"), cpu = Device.open("cpu");
      const b = batch(s, s.n + s.h);
      for (const layout of LAYOUTS) {
        for (const dtype of DTYPES) {
          const got = await augment(cuda, s, b, layout, dtype);
          const expected = await augment(cpu, s, b, layout, dtype);
          const bad = got.findIndex((v, i) => v !== expected[i]);
          const size = dtype === "f16" ? 2 : 4;
          assert.strictEqual(
            bad,
            -1,
            `${s.what} ${layout} ${dtype}: output element ${Math.floor(bad / size)} ` +
              `(byte ${bad}) is ${got[bad]}, expected the cpu backend's ${expected[bad]}`,
          );
        }
      }
    },
  });
}
