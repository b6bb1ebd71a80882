// The geometric transforms (ps_image_geometry through ops/image.ts's imageGeometry): on every
// backend present the bytes equal the host reference (augment/geometry_host.ts) and, without
// a rotation, decode/resize.ts's two-pass Pillow resize, over random batches of images of
// different sizes (1-pixel images and boxes, non-square, up- and downscaling, boxes at the
// borders, every channel count, with and without antialias); the records' draws
// (RandomResizedCrop, CenterCrop, RandomRotation) are seeded and stay inside the image; the
// options refuse bad values by name; and where Python with Pillow is installed, the resize
// equals Pillow's and the rotation is within one grey level of Pillow's `Image.rotate`.

import assert from "node:assert";
import { DeviceBuffer } from "../ffi/memory.ts";
import { Tensor } from "../ffi/tensor.ts";
import { PinstreamError } from "../internal/errors.ts";
import {
  GEOMETRY_RECORD_LENGTH as R,
  resolveGeometry,
  writeGeometryRecord,
  writeGeometryRecords,
} from "../augment/geometry.ts";
import { geometryHost } from "../augment/geometry_host.ts";
import { sampleKey } from "../augment/record.ts";
import { resizeBilinear } from "../decode/resize.ts";
import { imageGeometry } from "../ops/image.ts";
import { NativeBackend } from "../ops/backend.ts";
import { rng } from "./_image_reference.ts";
import { testEachBackend } from "./_backends.ts";
import { pythonWithPillow } from "./_image_fixtures.ts";

const NONE = [2 ** 30, 0];

interface Batch {
  n: number;
  c: number;
  stride: number;
  oh: number;
  ow: number;
  antialias: boolean;
  fill: number;
  src: Uint8Array;
  params: Int32Array;
}

/** A side: often 1 or 2, else up to `max`. */
function side(r: () => number, max: number): number {
  const u = r();
  return Math.min(max, u < 0.15 ? 1 : u < 0.25 ? 2 : 1 + Math.floor(r() * max));
}

/** A random batch: every sample its own image size, box and (sometimes) rotation. */
function randomBatch(r: () => number, rotate: boolean): Batch {
  const n = 1 + Math.floor(r() * 4), c = 1 + Math.floor(r() * 4);
  const oh = side(r, 24), ow = side(r, 24);
  const maxH = 40, maxW = 40, stride = maxH * maxW * c + Math.floor(r() * 3);
  const src = new Uint8Array(n * stride);
  for (let i = 0; i < src.length; i++) src[i] = Math.floor(r() * 256);
  const params = new Int32Array(n * R);
  for (let s = 0; s < n; s++) {
    const h = side(r, maxH), w = side(r, maxW);
    const u = r();
    // The whole image, a box at a border or corner, or anywhere.
    const ch = u < 0.3 ? h : side(r, h), cw = u < 0.3 ? w : side(r, w);
    const top = r() < 0.3 ? h - ch : Math.floor(r() * (h - ch + 1));
    const left = r() < 0.3 ? 0 : Math.floor(r() * (w - cw + 1));
    let rot = NONE;
    if (rotate && r() < 0.8) {
      const deg = [180, 90, -90, 0.5][Math.floor(r() * 8)] ?? (r() - 0.5) * 360;
      rot = [
        Math.round(Math.cos(deg * Math.PI / 180) * 2 ** 30),
        Math.round(Math.sin(deg * Math.PI / 180) * 2 ** 30),
      ];
    }
    params.set([h, w, top, left, ch, cw, ...rot], s * R);
  }
  return {
    n,
    c,
    stride,
    oh,
    ow,
    antialias: r() < 0.7,
    fill: Math.floor(r() * 2 ** 32) | 0,
    src,
    params,
  };
}

function host(b: Batch): Uint8Array {
  const out = new Uint8Array(b.n * b.oh * b.ow * b.c);
  geometryHost(b.src, b.params, out, {
    n: b.n,
    channels: b.c,
    srcStride: b.stride,
    height: b.oh,
    width: b.ow,
    antialias: b.antialias,
    fill: b.fill,
  });
  return out;
}

/** decode/resize.ts on sample s's box (no rotation). */
function twoPass(b: Batch, s: number): Uint8Array {
  const [h, w, top, left, ch, cw] = b.params.subarray(s * R);
  const image = {
    data: b.src.subarray(s * b.stride, s * b.stride + h * w * b.c),
    height: h,
    width: w,
    channels: b.c as 1 | 3 | 4,
  };
  return resizeBilinear(image, b.oh, b.ow, b.antialias, undefined, {
    top,
    left,
    height: ch,
    width: cw,
  }).data;
}

function firstDiff(a: Uint8Array, b: Uint8Array): string {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return `byte ${i}: ${a[i]} vs ${b[i]}`;
  return a.length === b.length ? "none" : `lengths ${a.length} vs ${b.length}`;
}

Deno.test("the host reference equals decode/resize.ts's two-pass resize on every box", () => {
  const r = rng(11);
  for (let round = 0; round < 300; round++) {
    const b = randomBatch(r, false);
    const got = host(b), img = b.oh * b.ow * b.c;
    for (let s = 0; s < b.n; s++) {
      const want = twoPass(b, s), mine = got.subarray(s * img, (s + 1) * img);
      assert.ok(
        want.every((v, i) => v === mine[i]),
        `round ${round} sample ${s} [${[...b.params.subarray(s * R, s * R + 6)]}] -> ` +
          `${b.oh}x${b.ow}x${b.c} antialias ${b.antialias}: ${firstDiff(mine, want)}`,
      );
    }
  }
});

testEachBackend("imageGeometry equals the host reference bit for bit", async (device) => {
  const r = rng(device.kind === "cpu" ? 5 : 6);
  for (let round = 0; round < 60; round++) {
    const b = randomBatch(r, round % 2 === 1);
    using src = DeviceBuffer.alloc(device, b.src.length);
    src.copyFrom(b.src);
    using params = DeviceBuffer.alloc(device, b.params.byteLength);
    params.copyFrom(b.params);
    using out = Tensor.empty(device, [b.n, b.oh, b.ow, b.c], "u8");
    imageGeometry(src, out, {
      params,
      srcStride: b.stride,
      antialias: b.antialias,
      fill: b.fill,
    });
    const got = await out.toHost() as Uint8Array, want = host(b);
    assert.ok(
      want.every((v, i) => v === got[i]),
      `round ${round} (${b.n} samples ${b.c} ch -> ${b.oh}x${b.ow}, records ` +
        `[${[...b.params]}]): ${firstDiff(got, want)}`,
    );
  }
});

testEachBackend("imageGeometry: a big downscale and an upscale with a rotation", async (device) => {
  const r = rng(21);
  const c = 3, h = 300, w = 200, stride = h * w * c;
  const data = new Uint8Array(2 * stride).map(() => Math.floor(r() * 256));
  const deg = 10 * Math.PI / 180;
  const rot = [Math.round(Math.cos(deg) * 2 ** 30), Math.round(Math.sin(deg) * 2 ** 30)];
  const records = new Int32Array([h, w, 0, 0, h, w, ...NONE, h, w, 7, 5, 3, 2, ...rot]);
  const b = {
    n: 2,
    c,
    stride,
    oh: 17,
    ow: 23,
    antialias: true,
    fill: 0x102030,
    src: data,
    params: records,
  };
  using src = DeviceBuffer.alloc(device, data.length);
  src.copyFrom(data);
  using params = DeviceBuffer.alloc(device, records.byteLength);
  params.copyFrom(records);
  using out = Tensor.empty(device, [2, 17, 23, c], "u8");
  imageGeometry(src, out, { params, srcStride: stride, fill: b.fill });
  const got = await out.toHost() as Uint8Array, want = host(b);
  assert.strictEqual(firstDiff(got, want), "none");
  assert.deepStrictEqual(got.subarray(0, 17 * 23 * c), twoPass(b, 0));
});

testEachBackend("imageGeometry refuses a record outside its slot, naming it", async (device) => {
  using src = DeviceBuffer.alloc(device, 32);
  using params = DeviceBuffer.alloc(device, 2 * R * 4);
  // Sample 1's box runs past its 4x4 image.
  params.copyFrom(new Int32Array([4, 4, 0, 0, 4, 4, ...NONE, 4, 4, 1, 0, 4, 4, ...NONE]));
  using out = Tensor.fromHost(device, new Uint8Array(8).fill(77), [2, 2, 2, 1]);
  if (device.kind === "cpu") {
    assert.throws(
      () => imageGeometry(src, out, { params, srcStride: 16 }),
      (e: unknown) =>
        e instanceof PinstreamError && /sample 1's record is outside its slot/.test(e.message),
    );
  } else {
    // CUDA cannot fail in the kernel: the sample is skipped, its output left as it was.
    imageGeometry(src, out, { params, srcStride: 16 });
    assert.deepStrictEqual([...(await out.toHost()).subarray(4)], [77, 77, 77, 77]);
  }
  assert.throws(
    () => imageGeometry(src, out, { params, srcStride: 16, fill: 1.5 }),
    /fill must be an integer/,
  );
  using wide = Tensor.empty(device, [1, 2, 2, 5], "u8");
  assert.throws(() => imageGeometry(src, wide, { params, srcStride: 20 }), /channel count must be/);
  assert.throws(() => imageGeometry(src, out, { params, srcStride: 17 }), /src must hold 34 bytes/);
  assert.throws(() => imageGeometry(src, out, { params, srcStride: 0 }), /srcStride must be/);
  // The native entry point's own checks, past the wrapper's.
  const native = NativeBackend.of(device);
  assert.throws(
    () =>
      native.imageGeometry!({
        src: { memory: src, offset: 0 },
        src_stride: 16,
        n: 1,
        c: 1,
        params: { memory: params, offset: 0 },
        oh: 2,
        ow: 2,
        fill: 0,
        out,
        flags: 4,
        stream: null,
      }, "run it"),
    /unknown flags 0x4/,
  );
});

Deno.test("geometry records: seeded, inside the image, and each transform on its own draws", () => {
  const rrc = resolveGeometry({ size: [32, 48], crop: "random-resized-crop" }, "test");
  const rotated = resolveGeometry(
    { size: [32, 48], crop: "random-resized-crop", rotation: 30 },
    "test",
  );
  const k0 = sampleKey(3, 1);
  const a = new Int32Array(R), b = new Int32Array(R), c = new Int32Array(R);
  const boxes = new Set<string>();
  let fallbacks = 0;
  for (let p = 0; p < 2000; p++) {
    const h = 1 + (p % 97), w = 1 + ((p * 7) % 131);
    writeGeometryRecord(a, 0, rrc, h, w, k0, p);
    writeGeometryRecord(b, 0, rrc, h, w, k0, p);
    writeGeometryRecord(c, 0, rotated, h, w, k0, p);
    assert.deepStrictEqual(a, b);
    // The rotation has its own draw: the box is the same with it on.
    assert.deepStrictEqual([...c.subarray(0, 6)], [...a.subarray(0, 6)]);
    const [, , top, left, ch, cw] = a;
    assert.ok(top >= 0 && left >= 0 && ch >= 1 && cw >= 1 && top + ch <= h && left + cw <= w);
    const area = (ch * cw) / (h * w);
    if (h >= 20 && w >= 20 && (area < 0.07 || area > 1)) assert.fail(`area ${area} at ${p}`);
    boxes.add(`${top},${left},${ch},${cw}`);
    if (ch === h && cw === w && h > 30 && w > 30) fallbacks++;
    const angle = Math.atan2(c[7], c[6]) * 180 / Math.PI;
    assert.ok(Math.abs(angle) <= 30 + 1e-6, `angle ${angle}`);
    assert.ok(Math.abs(Math.hypot(c[6], c[7]) - 2 ** 30) < 2, "cos^2 + sin^2 = 1");
  }
  assert.ok(boxes.size > 1000, `${boxes.size} distinct boxes`);
  assert.ok(fallbacks < 200, `${fallbacks} whole-image boxes`);
  // Another epoch draws other boxes.
  writeGeometryRecord(b, 0, rrc, 97, 131, sampleKey(3, 2), 5);
  writeGeometryRecord(a, 0, rrc, 97, 131, k0, 5);
  assert.notDeepStrictEqual(a, b);
  // The fallback of a very wide image: the centre crop at the largest ratio.
  const tall = resolveGeometry({ size: 8, crop: "random-resized-crop", scale: [1, 1] }, "test");
  writeGeometryRecord(a, 0, tall, 10, 1000, k0, 0);
  assert.deepStrictEqual([...a.subarray(0, 6)], [10, 1000, 0, 493, 10, 13]);
  // Resize: the whole image; many sizes at once.
  const out = new Int32Array(2 * R);
  writeGeometryRecords(out, 0, resolveGeometry({ size: 4 }, "t"), [5, 6, 7, 8], k0, 0, 2);
  assert.deepStrictEqual([...out], [5, 6, 0, 0, 5, 6, ...NONE, 7, 8, 0, 0, 7, 8, ...NONE]);
  // A rank's shard (stride = world size): its samples draw at positions 1 and 4 of the epoch.
  writeGeometryRecords(out, 0, rrc, [97, 131], k0, 1, 2, 3);
  writeGeometryRecord(a, 0, rrc, 97, 131, k0, 4);
  assert.deepStrictEqual([...out.subarray(R, 2 * R)], [...a.subarray(0, R)]);
  writeGeometryRecord(a, 0, rrc, 97, 131, k0, 1);
  assert.deepStrictEqual([...out.subarray(0, R)], [...a.subarray(0, R)]);
});

Deno.test("geometry options: defaults, and every bad value named", () => {
  const spec = resolveGeometry({ size: [4, 6], rotation: [-5, 10], fill: [1, 2, 3] }, "t");
  assert.deepStrictEqual(
    { ...spec },
    {
      height: 4,
      width: 6,
      crop: "resize",
      scale: [0.08, 1],
      ratio: [3 / 4, 4 / 3],
      antialias: true,
      rotation: [-5, 10],
      fill: 0x030201,
    },
  );
  assert.ok(Object.isFrozen(spec));
  const bad: [unknown, RegExp][] = [
    [null, /geometry option should be an object/],
    [{}, /geometry\.size option should be \[height, width\]/],
    [{ size: 0 }, /geometry\.size option/],
    [{ size: [4, 2 ** 14 + 1] }, /geometry\.size option/],
    [{ size: 4, crop: "centre" }, /geometry\.crop option should be "resize"/],
    [{ size: 4, crop: "random-resized-crop", scale: [0, 1] }, /geometry\.scale option/],
    [{ size: 4, crop: "random-resized-crop", ratio: [2, 1] }, /geometry\.ratio option/],
    [{ size: 4, scale: [0.5, 1] }, /scale option goes with crop: "random-resized-crop"/],
    [{ size: 4, antialias: 1 }, /geometry\.antialias option should be a boolean/],
    [{ size: 4, rotation: -3 }, /geometry\.rotation option/],
    [{ size: 4, rotation: [5, 1] }, /geometry\.rotation option/],
    [{ size: 4, fill: 256 }, /geometry\.fill option/],
    [{ size: 4, fill: [1, 2, 3, 4, 5] }, /geometry\.fill option/],
    [{ size: 4, antialiased: true }, /antialias/],
  ];
  for (const [options, message] of bad) {
    assert.throws(() => resolveGeometry(options as never, "load"), message, String(options));
  }
});

const PY = pythonWithPillow();

Deno.test({
  name: `resize equals Pillow's; rotation is within one level of Pillow's${
    PY ? "" : " (skipped: no python3 with Pillow)"
  }`,
  ignore: PY === undefined,
  fn: async () => {
    const r = rng(99);
    // Grey and RGB only: Pillow resizes RGBA and LA premultiplied by alpha.
    const cases: { b: Batch; angle: number; h: number; w: number }[] = [];
    for (let i = 0; i < 40; i++) {
      const c = r() < 0.5 ? 1 : 3, h = side(r, 60), w = side(r, 60);
      const oh = side(r, 40), ow = side(r, 40);
      const ch = side(r, h), cw = side(r, w);
      const top = Math.floor(r() * (h - ch + 1)), left = Math.floor(r() * (w - cw + 1));
      const angle = i % 2 === 0 ? 0 : (r() - 0.5) * 60;
      const rad = (angle * Math.PI) / 180;
      const src = new Uint8Array(h * w * c);
      // Smooth images (a gradient and noise), like photographs, and pure noise.
      for (let y = 0; y < h; y++) {
        for (let x = 0; x < w * c; x++) {
          src[y * w * c + x] = i % 4 < 2 ? Math.floor(r() * 256) : (x * 3 + y * 5 + r() * 20) & 255;
        }
      }
      const rot = angle === 0 ? NONE : [
        Math.round(Math.cos(rad) * 2 ** 30),
        Math.round(Math.sin(rad) * 2 ** 30),
      ];
      cases.push({
        b: {
          n: 1,
          c,
          stride: src.length,
          oh,
          ow,
          antialias: true,
          fill: 0,
          src,
          params: new Int32Array([h, w, top, left, ch, cw, ...rot]),
        },
        angle,
        h,
        w,
      });
    }
    const dir = await Deno.makeTempDir();
    try {
      const meta = cases.map(({ b, angle, h, w }) => ({
        c: b.c,
        h,
        w,
        box: [...b.params.subarray(2, 6)],
        oh: b.oh,
        ow: b.ow,
        angle,
      }));
      await Deno.writeTextFile(`${dir}/meta.json`, JSON.stringify(meta));
      const all = new Uint8Array(cases.reduce((s, { b }) => s + b.src.length, 0));
      let at = 0;
      for (const { b } of cases) all.set(b.src, (at += b.src.length) - b.src.length);
      await Deno.writeFile(`${dir}/src.bin`, all);
      const script = `
import json, sys
from PIL import Image
d = sys.argv[1]
meta = json.load(open(d + "/meta.json"))
raw = open(d + "/src.bin", "rb").read()
out = bytearray()
at = 0
for m in meta:
    n = m["h"] * m["w"] * m["c"]
    im = Image.frombytes("L" if m["c"] == 1 else "RGB", (m["w"], m["h"]), raw[at:at + n])
    at += n
    top, left, ch, cw = m["box"]
    im = im.crop((left, top, left + cw, top + ch)).resize((m["ow"], m["oh"]), Image.BILINEAR)
    if m["angle"] != 0:
        im = im.rotate(m["angle"], resample=Image.BILINEAR, fillcolor=0 if m["c"] == 1 else (0, 0, 0))
    out += im.tobytes()
open(d + "/out.bin", "wb").write(out)
`;
      const run = await new Deno.Command(PY!, { args: ["-c", script, dir] }).output();
      assert.ok(run.success, new TextDecoder().decode(run.stderr));
      const pil = await Deno.readFile(`${dir}/out.bin`);
      at = 0;
      let rotated = 0, off = 0, maxOff = 0;
      for (const [i, { b, angle }] of cases.entries()) {
        const size = b.oh * b.ow * b.c, want = pil.subarray(at, at + size);
        at += size;
        const got = host(b);
        if (angle === 0) {
          assert.strictEqual(firstDiff(got, want), "none", `case ${i}: ${JSON.stringify(meta[i])}`);
          continue;
        }
        for (let k = 0; k < size; k++) {
          const d = Math.abs(got[k] - want[k]);
          if (d > 0) off++, maxOff = Math.max(maxOff, d);
        }
        rotated += size;
      }
      // Pillow computes the rotation in fp64; the kernel's fixed point (2^-31 pixel
      // coordinates, 16-bit weights) truncates a hair differently now and then.
      assert.ok(maxOff <= 1, `rotation off by up to ${maxOff} (${off} of ${rotated} bytes)`);
      assert.ok(off <= rotated * 0.01, `${off} of ${rotated} rotated bytes differ from Pillow's`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

/** A Python with torch and torchvision, or undefined. */
function pythonWithTorchvision(): string | undefined {
  for (const py of ["/usr/bin/python3", "python3"]) {
    try {
      const r = new Deno.Command(py, {
        args: ["-c", "import torch, torchvision"],
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

const TV = pythonWithTorchvision();

Deno.test({
  name: `resize is within one level of torchvision's tensor resize, with and without antialias${
    TV ? "" : " (skipped: no python3 with torchvision)"
  }`,
  ignore: TV === undefined,
  fn: async () => {
    const dir = await Deno.makeTempDir();
    try {
      const script = `
import json, sys
import numpy as np, torch
import torchvision.transforms.functional as F
torch.set_num_threads(1)
d = sys.argv[1]
rs = np.random.RandomState(0)
meta, src, out = [], bytearray(), bytearray()
for i in range(30):
    h, w, oh, ow = (int(v) for v in (rs.randint(1, 90), rs.randint(1, 90), rs.randint(1, 70), rs.randint(1, 70)))
    y = np.arange(h)[:, None, None]; x = np.arange(w)[None, :, None]
    a = ((x * 5 + y * 3 + rs.randint(0, 40, (h, w, 3))) & 255).astype(np.uint8)
    t = torch.from_numpy(a).permute(2, 0, 1).contiguous()
    for aa in (True, False):
        out += F.resize(t, [oh, ow], antialias=aa).permute(1, 2, 0).contiguous().numpy().tobytes()
    meta.append([h, w, oh, ow]); src += a.tobytes()
json.dump(meta, open(d + "/meta.json", "w"))
open(d + "/src.bin", "wb").write(src); open(d + "/out.bin", "wb").write(out)
`;
      const run = await new Deno.Command(TV!, {
        args: ["-c", script, dir],
        env: { OPENBLAS_NUM_THREADS: "1" },
      }).output();
      assert.ok(run.success, new TextDecoder().decode(run.stderr));
      const meta: number[][] = JSON.parse(await Deno.readTextFile(`${dir}/meta.json`));
      const src = await Deno.readFile(`${dir}/src.bin`), tv = await Deno.readFile(`${dir}/out.bin`);
      let a = 0, b = 0, off = 0, total = 0;
      for (const [h, w, oh, ow] of meta) {
        for (const antialias of [true, false]) {
          const size = oh * ow * 3;
          const got = host({
            n: 1,
            c: 3,
            stride: h * w * 3,
            oh,
            ow,
            antialias,
            fill: 0,
            src: src.subarray(a, a + h * w * 3),
            params: new Int32Array([h, w, 0, 0, h, w, ...NONE]),
          });
          for (let i = 0; i < size; i++) {
            const d = Math.abs(got[i] - tv[b + i]);
            assert.ok(d <= 1, `${h}x${w} -> ${oh}x${ow} antialias ${antialias}: off by ${d}`);
            if (d > 0) off++;
          }
          b += size, total += size;
        }
        a += h * w * 3;
      }
      // torchvision rounds its float results; Pillow's fixed point rounds a hair differently.
      assert.ok(off < total * 0.3, `${off} of ${total} bytes differ`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
