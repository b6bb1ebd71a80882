// The image kernels (ps_image_augment, ps_image_labels_i32) through ops/image.ts, on every
// backend present: the output equals the independent TypeScript reference (tests/_image_reference.ts) bit for bit, for
// random images, random crop/flip parameters (in range and out of range), vertical flips,
// cutout squares, brightness/contrast and saturation/hue factors (alone, together and wild),
// both layouts,
// both output types and odd shapes. The CPU backend always runs; CUDA runs when a device is
// present and is reported as ignored otherwise. What the typed wrapper refuses before any launch
// (bad shapes, flags, rows, a buffer too short) is given to the native backend's entry point
// directly, to hold the kernels' own checks to their contract.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { PinstreamError } from "../internal/errors.ts";
import { DeviceBuffer } from "../ffi/memory.ts";
import { Tensor } from "../ffi/tensor.ts";
import { normalizeAffine } from "../augment/image.ts";
import { type KernelArgs, NativeBackend, type Operand } from "../ops/backend.ts";
import { imageAugment, imageLabelsI32 } from "../ops/image.ts";
import { bitDiff, f32Bits, ONE_BITS, RECORD, referenceAugment, rng } from "./_image_reference.ts";
import { BACKENDS } from "./_backends.ts";

interface Case {
  n: number;
  c: number;
  h: number;
  w: number;
  pad: number;
  layout: "nhwc" | "nchw";
  dtype: "f16" | "f32";
  params: "random" | "wild" | "extreme" | "none";
  /** The augmentations besides the crop and the horizontal flip (default none: all off). */
  extra?: readonly Extra[];
  /** Gather the batch from a bigger set by indices in the kernel's pass (default: no). */
  gather?: boolean;
}

type Extra = "vflip" | "cutout" | "color" | "mix";

const INT32_MIN = -(2 ** 31), INT32_MAX = 2 ** 31 - 1;

/**
 * Crop offsets for "extreme" cases: the ends of int32, where `dy - pad` and `y + dy - pad`
 * overflow 32 bits, mixed with offsets near `pad` so that some windows still see the image.
 */
function extremeOffsets(pad: number, extent: number): number[] {
  const near = [-extent - 1, -extent, -2, -1, 0, 1, 2, extent - 1, extent, extent + 1];
  const all = [
    INT32_MIN,
    INT32_MIN + 1,
    INT32_MIN + extent,
    -(2 ** 30),
    2 ** 30,
    INT32_MAX - extent,
    INT32_MAX - 1,
    INT32_MAX,
    ...near,
    ...near.map((d) => pad + d),
    2 * pad,
  ];
  return all.filter((d) => d >= INT32_MIN && d <= INT32_MAX);
}

/** Any int32, the ends of the range more often than not. */
function anyInt32(r: () => number): number {
  const ends = [INT32_MIN, INT32_MIN + 1, -65537, -1, 0, 65535, 65536, INT32_MAX - 1, INT32_MAX];
  return r() < 0.5 ? ends[Math.floor(r() * ends.length)] : (r() * 2 ** 32) | 0;
}

/** Colour factors: ordinary ones, the ends of torchvision's ranges, and out-of-range ones. */
const WILD_FACTORS = [0, 1, 2, 1e-30, 0.999999, 1.0000001, 37.5, 1e30, -0.5, -0];
/** Hue shifts: torchvision's range, its ends, and far outside it. */
const WILD_HUES = [0, -0, 0.5, -0.5, 1e-30, -1e-7, 0.25, 3, -7.25, 1e30, -Infinity, NaN];

/**
 * Fills the words of one augmentation in the record at `at`: in range (what the loader draws)
 * or, when `wild`, any int32 the ABI must take safely and exactly.
 */
function extraWords(
  extra: Extra,
  p: Int32Array,
  at: number,
  wild: boolean,
  r: () => number,
  h: number,
  w: number,
): void {
  if (extra === "vflip") {
    p[at + 3] = wild ? Math.floor(r() * 7) - 3 : r() < 0.5 ? 1 : 0;
  } else if (extra === "cutout") {
    p[at + 4] = wild ? anyInt32(r) : Math.floor(r() * 65536);
    p[at + 5] = wild ? anyInt32(r) : Math.floor(r() * 65536);
    p[at + 6] = wild ? anyInt32(r) : Math.floor(r() * (Math.max(h, w) + 2));
  } else if (extra === "color") {
    for (const k of [7, 8]) {
      p[at + k] = f32Bits(wild ? WILD_FACTORS[Math.floor(r() * WILD_FACTORS.length)] : r() * 2);
    }
  } else {
    p[at + 9] = f32Bits(wild ? WILD_FACTORS[Math.floor(r() * WILD_FACTORS.length)] : r() * 2);
    p[at + 10] = f32Bits(wild ? WILD_HUES[Math.floor(r() * WILD_HUES.length)] : r() - 0.5);
  }
}

/** A device buffer holding a copy of `data`. */
function upload(dev: Device, data: ArrayBufferView): DeviceBuffer {
  const buf = DeviceBuffer.alloc(dev, data.byteLength);
  buf.copyFrom(data);
  return buf;
}

/**
 * The argument bag of ps_image_augment for one 3x4x4 NCHW image to f16 with no records and
 * scale and bias 1, with `over` in place of those values.
 */
function augmentArgs(
  src: Operand,
  out: Operand,
  over: Partial<KernelArgs<"imageAugment">> = {},
): KernelArgs<"imageAugment"> {
  const one = new Float32Array([1]);
  return {
    src,
    indices: null,
    rows: 0,
    layout: 1,
    n: 1,
    c: 3,
    h: 4,
    w: 4,
    pad: 0,
    params: null,
    scale: one,
    bias: one,
    out,
    out_dtype: 0,
    flags: 0,
    stream: null,
    ...over,
  };
}

/** Asserts that `fn` fails with INVALID_ARGUMENT, its message matching `pattern`. */
function refused(fn: () => void, pattern: RegExp, what: string): void {
  assert.throws(
    fn,
    (err: unknown) =>
      err instanceof PinstreamError && err.code === "INVALID_ARGUMENT" && pattern.test(err.message),
    what,
  );
}

async function runCase(dev: Device, k: Case, seed: number): Promise<void> {
  const r = rng(seed);
  const { n, c, h, w, pad } = k;
  const src = new Uint8Array(n * c * h * w);
  for (let i = 0; i < src.length; i++) src[i] = (r() * 256) | 0;
  // Gathered: a bigger set of random images, and the batch is its rows at random indices
  // (repeats included), which the kernel reads there.
  const rows = k.gather ? 2 * n + 3 : 0;
  const indices = Int32Array.from({ length: k.gather ? n : 0 }, () => Math.floor(r() * rows));
  let set = src;
  if (k.gather) {
    const img = c * h * w;
    set = Uint8Array.from({ length: rows * img }, () => (r() * 256) | 0);
    indices.forEach((j, i) => src.set(set.subarray(j * img, (j + 1) * img), i * img));
  }
  let params: Int32Array | null = null;
  if (k.params !== "none") {
    params = new Int32Array(RECORD * n);
    const ys = extremeOffsets(pad, h), xs = extremeOffsets(pad, w);
    const wild = k.params !== "random";
    for (let i = 0; i < n; i++) {
      const at = RECORD * i;
      params[at + 7] = params[at + 8] = params[at + 9] = ONE_BITS;
      if (k.params === "extreme") {
        params[at] = ys[Math.floor(r() * ys.length)];
        params[at + 1] = xs[Math.floor(r() * xs.length)];
        params[at + 2] = r() < 0.5 ? 1 : 0;
      } else {
        // "wild": windows partly or wholly outside the padded image must read zeros, safely.
        const span = k.params === "wild" ? 2 * pad + 2 * Math.max(h, w) + 5 : 2 * pad + 1;
        const lo = k.params === "wild" ? -Math.max(h, w) - 2 : 0;
        params[at] = lo + Math.floor(r() * span);
        params[at + 1] = lo + Math.floor(r() * span);
        params[at + 2] = k.params === "wild" ? Math.floor(r() * 7) - 3 : r() < 0.5 ? 1 : 0;
      }
      for (const extra of k.extra ?? []) extraWords(extra, params, at, wild, r, h, w);
    }
  }
  const mean = Array.from({ length: c }, () => r() * 2 - 0.5);
  const std = Array.from({ length: c }, () => 0.01 + r() * 3);
  const { scale, bias } = normalizeAffine(mean, std);
  const expected = referenceAugment({
    src,
    params,
    n,
    c,
    h,
    w,
    pad,
    layout: k.layout,
    mean,
    std,
    dtype: k.dtype,
  });

  using dSet = upload(dev, set);
  using dParams = params ? upload(dev, params) : null;
  using dIndices = k.gather ? upload(dev, indices) : null;
  using out = Tensor.empty(dev, [n, c, h, w], k.dtype);
  imageAugment(dSet, out, {
    layout: k.layout,
    affine: { scale, bias },
    padding: pad,
    params: dParams,
    ...(dIndices ? { indices: dIndices, rows } : {}),
  });
  const got = await out.toHost();
  assert.deepStrictEqual(bitDiff(got, expected), [], `case ${JSON.stringify(k)} seed ${seed}`);
}

/** A CIFAR image's geometry, with the usual crop padding. */
const CIFAR = { c: 3, h: 32, w: 32, pad: 4 } as const;
const ALL_EXTRAS: readonly Extra[] = ["vflip", "cutout", "color", "mix"];

const CASES: Case[] = [
  { n: 7, c: 3, h: 32, w: 32, pad: 4, layout: "nchw", dtype: "f16", params: "random" },
  { n: 5, c: 3, h: 32, w: 32, pad: 4, layout: "nhwc", dtype: "f16", params: "random" },
  { n: 4, c: 3, h: 32, w: 32, pad: 4, layout: "nchw", dtype: "f32", params: "random" },
  { n: 6, c: 1, h: 28, w: 28, pad: 2, layout: "nchw", dtype: "f16", params: "random" },
  { n: 3, c: 5, h: 7, w: 13, pad: 3, layout: "nhwc", dtype: "f32", params: "random" },
  { n: 9, c: 2, h: 5, w: 3, pad: 6, layout: "nchw", dtype: "f16", params: "wild" },
  { n: 9, c: 4, h: 6, w: 17, pad: 1, layout: "nhwc", dtype: "f16", params: "wild" },
  { n: 2, c: 3, h: 32, w: 32, pad: 4, layout: "nchw", dtype: "f16", params: "none" },
  { n: 1, c: 16, h: 1, w: 1, pad: 0, layout: "nhwc", dtype: "f32", params: "random" },
  // Rows of 1, 2, 3 and 4 chunks of 16 (the CPU row path has a copy for each count but 3):
  // whole and partial last chunks.
  { n: 5, c: 3, h: 16, w: 16, pad: 3, layout: "nchw", dtype: "f16", params: "random" },
  { n: 4, c: 3, h: 64, w: 64, pad: 8, layout: "nchw", dtype: "f16", params: "random" },
  { n: 7, c: 2, h: 9, w: 53, pad: 5, layout: "nchw", dtype: "f32", params: "wild" },
  { n: 7, c: 2, h: 6, w: 49, pad: 60, layout: "nchw", dtype: "f16", params: "wild" },
  { n: 6, c: 3, h: 5, w: 47, pad: 4, layout: "nhwc", dtype: "f16", params: "random" },
  // Rows of 32 to fp16 (the CPU backend's table path, two rows a step): windows wholly or
  // partly outside the image, flipped both ways, NHWC, and an odd height (the row path).
  { n: 24, c: 2, h: 6, w: 32, pad: INT32_MAX, layout: "nchw", dtype: "f16", params: "extreme" },
  { n: 24, c: 3, h: 4, w: 32, pad: 40, layout: "nchw", dtype: "f16", params: "wild" },
  { n: 6, c: 3, h: 8, w: 32, pad: 33, layout: "nhwc", dtype: "f16", params: "wild" },
  { n: 5, c: 3, h: 7, w: 32, pad: 4, layout: "nchw", dtype: "f16", params: "random" },
  // Offsets at the ends of int32: exactly the zero-padded crop, never a wrapped index.
  { n: 24, c: 2, h: 5, w: 7, pad: INT32_MAX, layout: "nchw", dtype: "f16", params: "extreme" },
  { n: 24, c: 3, h: 6, w: 3, pad: INT32_MAX, layout: "nhwc", dtype: "f32", params: "extreme" },
  { n: 24, c: 1, h: 4, w: 9, pad: 0, layout: "nchw", dtype: "f32", params: "extreme" },
  { n: 24, c: 2, h: 3, w: 5, pad: 0, layout: "nhwc", dtype: "f16", params: "extreme" },
  { n: 24, c: 2, h: 7, w: 4, pad: 2 ** 30 + 3, layout: "nchw", dtype: "f16", params: "extreme" },
  { n: 24, c: 3, h: 9, w: 40, pad: INT32_MAX - 5, layout: "nchw", dtype: "f32", params: "extreme" },
  { n: 3, c: 3, h: 5, w: 6, pad: INT32_MAX, layout: "nhwc", dtype: "f16", params: "none" },
  // Each new augmentation alone, then all of them, in range and wild.
  ...(["vflip", "cutout", "color", "mix"] as const).flatMap((e): Case[] => [
    {
      n: 7,
      c: 3,
      h: 32,
      w: 32,
      pad: 4,
      layout: "nchw",
      dtype: "f16",
      params: "random",
      extra: [e],
    },
    {
      n: 5,
      c: 3,
      h: 32,
      w: 32,
      pad: 4,
      layout: "nhwc",
      dtype: "f32",
      params: "random",
      extra: [e],
    },
    { n: 9, c: 2, h: 5, w: 3, pad: 6, layout: "nchw", dtype: "f16", params: "wild", extra: [e] },
    { n: 12, c: 3, h: 5, w: 7, pad: 6, layout: "nhwc", dtype: "f16", params: "wild", extra: [e] },
  ]),
  ...([["vflip", "cutout", "color", "mix"]] as const).flatMap((e): Case[] => [
    { n: 8, c: 3, h: 32, w: 32, pad: 4, layout: "nchw", dtype: "f16", params: "random", extra: e },
    { n: 8, c: 3, h: 32, w: 32, pad: 4, layout: "nchw", dtype: "f32", params: "random", extra: e },
    { n: 6, c: 1, h: 28, w: 28, pad: 2, layout: "nhwc", dtype: "f16", params: "random", extra: e },
    { n: 9, c: 4, h: 6, w: 17, pad: 1, layout: "nhwc", dtype: "f16", params: "wild", extra: e },
    {
      n: 24,
      c: 2,
      h: 7,
      w: 4,
      pad: 2 ** 30,
      layout: "nchw",
      dtype: "f32",
      params: "extreme",
      extra: e,
    },
    // Wider than the CPU backend's row path (16 x 64 pixels): the plane path with vflip.
    { n: 2, c: 2, h: 3, w: 1100, pad: 5, layout: "nchw", dtype: "f16", params: "random", extra: e },
  ]),
  // Gathered from a bigger set by indices, in the kernel's pass: the row path, the plane path
  // (NHWC, colour, wide), wild windows and no records.
  ...([
    { ...CIFAR, n: 19, layout: "nchw", dtype: "f16", params: "random" },
    { ...CIFAR, n: 7, layout: "nhwc", dtype: "f32", params: "random" },
    { n: 9, c: 2, h: 5, w: 3, pad: 6, layout: "nchw", dtype: "f16", params: "wild" },
    { ...CIFAR, n: 4, pad: 0, layout: "nchw", dtype: "f32", params: "none" },
    { ...CIFAR, n: 8, layout: "nchw", dtype: "f16", params: "random", extra: ALL_EXTRAS },
    { n: 3, c: 2, h: 3, w: 1100, pad: 5, layout: "nchw", dtype: "f16", params: "random" },
  ] as Case[]).map((k): Case => ({ ...k, gather: true })),
  // NHWC with 3 channels: the CPU backend's de-interleave into planes, with a plane of no
  // whole 16-pixel chunks (63 pixels), gathered with every extra, and wider than its row path.
  { n: 6, c: 3, h: 7, w: 9, pad: 2, layout: "nhwc", dtype: "f16", params: "random" },
  { n: 5, c: 3, h: 1, w: 15, pad: 3, layout: "nhwc", dtype: "f32", params: "wild" },
  {
    ...CIFAR,
    n: 9,
    layout: "nhwc",
    dtype: "f16",
    params: "random",
    extra: ALL_EXTRAS,
    gather: true,
  },
  {
    n: 2,
    c: 3,
    h: 3,
    w: 1100,
    pad: 5,
    layout: "nhwc",
    dtype: "f32",
    params: "random",
    extra: ["vflip"],
  },
  // Batches of 64 KiB and more: the CPU backend splits them over its threads.
  { ...CIFAR, n: 40, layout: "nchw", dtype: "f16", params: "random" },
  { ...CIFAR, n: 37, layout: "nhwc", dtype: "f32", params: "wild" },
  {
    ...CIFAR,
    n: 41,
    layout: "nchw",
    dtype: "f16",
    params: "random",
    extra: ALL_EXTRAS,
    gather: true,
  },
];

for (const { kind: backend, ignore } of BACKENDS) {
  Deno.test({
    name: `[${backend}] imageAugment equals the TypeScript reference bit for bit`,
    ignore,
    async fn() {
      using dev = Device.open(backend);
      let seed = 1;
      for (const k of CASES) {
        for (let rep = 0; rep < 3; rep++) await runCase(dev, k, seed++);
      }
    },
  });

  Deno.test({
    name: `[${backend}] imageAugment with contrast: false reads every contrast word as 1.0`,
    ignore,
    async fn() {
      using dev = Device.open(backend);
      const r = rng(404);
      const n = 6, c = 3, h = 9, w = 10, pad = 2;
      const src = Uint8Array.from({ length: n * c * h * w }, () => (r() * 256) | 0);
      const params = new Int32Array(RECORD * n);
      for (let i = 0; i < n; i++) {
        params.set([r() * 5 | 0, r() * 5 | 0, i & 1, 0, 0, 0, 0], RECORD * i);
        params[RECORD * i + 7] = f32Bits(i % 3 === 0 ? 1 : 0.5 + r());
        params[RECORD * i + 8] = f32Bits(i % 2 === 0 ? 0.25 : 1.75);
        params[RECORD * i + 9] = f32Bits(i % 3 === 1 ? 1 : 2 * r());
        params[RECORD * i + 10] = f32Bits(i % 3 === 2 ? 0 : r() - 0.5);
      }
      const noContrast = params.slice();
      for (let i = 0; i < n; i++) noContrast[RECORD * i + 8] = ONE_BITS;
      const mean = [0.4, 0.5, 0.6], std = [0.2, 0.3, 0.25];
      const affine = normalizeAffine(mean, std);
      using dSrc = upload(dev, src);
      using dParams = upload(dev, params);
      for (const layout of ["nchw", "nhwc"] as const) {
        const ref = (p: Int32Array) =>
          referenceAugment({ src, params: p, n, c, h, w, pad, layout, mean, std, dtype: "f32" });
        using out = Tensor.empty(dev, [n, c, h, w], "f32");
        const opts = { layout, affine, padding: pad, params: dParams };
        imageAugment(dSrc, out, { ...opts, contrast: false });
        assert.deepStrictEqual(bitDiff(await out.toHost(), ref(noContrast)), [], layout);
        imageAugment(dSrc, out, opts);
        const withContrast = await out.toHost();
        assert.deepStrictEqual(bitDiff(withContrast, ref(params)), [], layout);
        assert.notDeepStrictEqual(bitDiff(withContrast, ref(noContrast)), [], layout);
      }
    },
  });

  Deno.test({
    name: `[${backend}] imageAugment is exact on every byte value at extreme scales`,
    ignore,
    async fn() {
      // All 256 byte values through tiny, huge and ordinary std: covers fp16 subnormals,
      // overflow to infinity and ties of the round-to-nearest-even cast.
      using dev = Device.open(backend);
      const c = 6, h = 16, w = 16;
      const src = new Uint8Array(c * h * w);
      for (let i = 0; i < src.length; i++) src[i] = i & 255;
      const mean = [0, 0.5, 1e-3, -300, 0.25, 100];
      const std = [1e-6, 1e-3, 5e4, 1e-3, 0.3, 2e-3];
      const affine = normalizeAffine(mean, std);
      using dSrc = upload(dev, src);
      for (const dtype of ["f16", "f32"] as const) {
        const expected = referenceAugment({
          src,
          params: null,
          n: 1,
          c,
          h,
          w,
          pad: 0,
          layout: "nchw",
          mean,
          std,
          dtype,
        });
        using out = Tensor.empty(dev, [1, c, h, w], dtype);
        imageAugment(dSrc, out, { layout: "nchw", affine });
        assert.deepStrictEqual(bitDiff(await out.toHost(), expected), [], dtype);
      }
    },
  });

  Deno.test({
    name: `[${backend}] ps_image_augment refuses bad shapes, layouts, dtypes and flags`,
    ignore,
    fn() {
      using dev = Device.open(backend);
      const native = NativeBackend.of(dev);
      using src = DeviceBuffer.alloc(dev, 64), out = DeviceBuffer.alloc(dev, 256);
      const at = (b: DeviceBuffer) => ({ memory: b, offset: 0 });
      const bad: [number, number, number, number, number, number, number][] = [
        // layout, n, c, h, w, pad, dtype
        [2, 1, 1, 4, 4, 0, 0],
        [1, -1, 1, 4, 4, 0, 0],
        [1, 1, 0, 4, 4, 0, 0],
        [1, 1, 17, 1, 1, 0, 0],
        [1, 1, 1, 0, 4, 0, 0],
        [1, 1, 1, 4, 4, -1, 0],
        [1, 1, 1, 4, 4, 0, 2],
      ];
      for (const [layout, n, c, h, w, pad, dt] of bad) {
        const args = augmentArgs(at(src), at(out), { layout, n, c, h, w, pad, out_dtype: dt });
        refused(() => native.imageAugment(args, "augment"), /./, `${[layout, n, c, h, w]}`);
      }
      // Flags other than PS_IMAGE_SERIAL are refused.
      for (const flags of [2, 8, -1, 0x100]) {
        const args = augmentArgs(at(src), at(out), { flags });
        refused(() => native.imageAugment(args, "augment"), /unknown flags/, `flags ${flags}`);
      }
      // n = 0 is a no-op even with null pointers.
      native.imageAugment(augmentArgs(null, null, { n: 0 }), "augment nothing");
    },
  });

  Deno.test({
    name: `[${backend}] imageAugment with indices: an index outside the set is refused ` +
      "(cpu) or its sample left as it was (cuda); rows must be positive",
    ignore,
    async fn() {
      using dev = Device.open(backend);
      const rows = 3, img = 4; // 1 x 2 x 2 images holding 10 * (row + 1)
      using set = upload(
        dev,
        Uint8Array.from({ length: rows * img }, (_, i) => 10 * (1 + (i >> 2))),
      );
      const affine = { scale: new Float32Array([1]), bias: new Float32Array([0]) };
      for (const bad of [[2, 3, 0], [0, -1, 1], [2, 2 ** 31 - 1, 0]]) {
        const sentinel = new Float32Array(3 * img).fill(-7);
        using out = Tensor.fromHost(dev, sentinel, [3, 1, 2, 2]);
        using indices = upload(dev, Int32Array.from(bad));
        const run = () => imageAugment(set, out, { layout: "nchw", affine, indices });
        const at = bad.findIndex((j) => j < 0 || j >= rows);
        if (backend === "cpu") {
          refused(
            run,
            new RegExp(`indices\\[${at}\\] = ${bad[at]} is outside \\[0, 3\\)`),
            `${bad}`,
          );
          assert.deepStrictEqual([...await out.toHost()], [...sentinel], "nothing written");
        } else {
          run();
          const want = bad.flatMap((j) =>
            new Array(img).fill(j >= 0 && j < rows ? 10 * (j + 1) : -7)
          );
          assert.deepStrictEqual([...await out.toHost()], want, `indices ${bad}`);
        }
      }
      // rows <= 0 with indices is refused on every backend, before any launch (the wrapper
      // refuses it too, so the entry point is called directly).
      using out = DeviceBuffer.alloc(dev, 3 * img * 4);
      using idx = upload(dev, new Int32Array([0, 0, 0]));
      for (const r of [0, -1]) {
        const args = augmentArgs({ memory: set, offset: 0 }, { memory: out, offset: 0 }, {
          indices: { memory: idx, offset: 0 },
          rows: r,
          n: 3,
          c: 1,
          h: 2,
          w: 2,
          out_dtype: 1,
          scale: affine.scale,
          bias: affine.bias,
        });
        refused(
          () => NativeBackend.of(dev).imageAugment(args, "augment"),
          new RegExp(`rows=${r} with indices`),
          `rows ${r}`,
        );
      }
    },
  });

  Deno.test({
    name: `[${backend}] imageLabelsI32 widens uint8, uint16 and copies int32 labels`,
    ignore,
    async fn() {
      using dev = Device.open(backend);
      const n = 37;
      const r = rng(9);
      for (
        const src of [
          Uint8Array.from({ length: n }, () => (r() * 256) | 0),
          Uint16Array.from({ length: n }, () => (r() * 65536) | 0),
          Int32Array.from({ length: n }, () => ((r() * 2 ** 32) | 0)),
        ]
      ) {
        using dSrc = upload(dev, src);
        using out = Tensor.empty(dev, [n], "i32");
        imageLabelsI32(dSrc, out, { labelBytes: src.BYTES_PER_ELEMENT });
        assert.deepStrictEqual(await out.toHost(), Int32Array.from(src));
      }
      refused(
        () =>
          NativeBackend.of(dev).imageLabelsI32(
            { src: null, src_bytes: 3, n: 1, out: null, stream: null },
            "widen labels",
          ),
        /./,
        "3-byte labels",
      );
    },
  });
}

Deno.test("[cpu] ps_image_augment refuses a freed or too-short device buffer", () => {
  // The CPU backend checks live ranges so that a pipeline bug shows up as an error here
  // rather than as silent reads of freed memory (CUDA would report an illegal address).
  // The typed wrapper refuses a short buffer itself, so the entry point gets bare pointers.
  using dev = Device.open("cpu");
  const native = NativeBackend.of(dev);
  using src = DeviceBuffer.alloc(dev, 3 * 4 * 4), short = DeviceBuffer.alloc(dev, 2 * 48 - 2);
  refused(
    () => native.imageAugment(augmentArgs(src.pointer, short.pointer), "augment"),
    /not a live buffer of the batch.s size/,
    "output 2 bytes short",
  );
  const host = new Uint8Array(48);
  using out = DeviceBuffer.alloc(dev, 96);
  refused(
    () => native.imageAugment(augmentArgs(Deno.UnsafePointer.of(host), out.pointer), "augment"),
    /not a live buffer of the batch.s size/,
    "source in JS memory",
  );
});

Deno.test("[cpu] ps_image_augment gives the same bits split over the threads, backing off and serial (PS_IMAGE_SERIAL), with the cores busy part of the time", async () => {
  // A CIFAR batch of 128 is split over the CPU backend's threads unless a helper keeps the call
  // waiting, after which the call site runs serially for a while (kernels/cpu/threads.c).
  // Spinning workers in the middle rounds force stalls and the backoff's transitions; every
  // round must give the reference's bits.
  using dev = Device.open("cpu");
  const r = rng(2024);
  const n = 128, c = 3, h = 32, w = 32, pad = 4, rows = 300;
  const set = Uint8Array.from({ length: rows * c * h * w }, () => (r() * 256) | 0);
  const indices = Int32Array.from({ length: n }, () => Math.floor(r() * rows));
  const src = new Uint8Array(n * c * h * w);
  indices.forEach((j, i) => src.set(set.subarray(j * 3072, (j + 1) * 3072), i * 3072));
  const params = new Int32Array(RECORD * n);
  for (let i = 0; i < n; i++) {
    params.set([(r() * 9) | 0, (r() * 9) | 0, r() < 0.5 ? 1 : 0], RECORD * i);
    params[RECORD * i + 7] = params[RECORD * i + 8] = ONE_BITS;
  }
  const mean = [0.4914, 0.4822, 0.4465], std = [0.247, 0.2435, 0.2616];
  const affine = normalizeAffine(mean, std);
  const expected = referenceAugment({
    src,
    params,
    n,
    c,
    h,
    w,
    pad,
    layout: "nchw",
    mean,
    std,
    dtype: "f16",
  });
  const stop = new Int32Array(new SharedArrayBuffer(4));
  const code = "self.onmessage = (e) => { const f = new Int32Array(e.data); " +
    "while (Atomics.load(f, 0) === 0) {} self.postMessage(0); };";
  const url = URL.createObjectURL(new Blob([code], { type: "application/javascript" }));
  const spinners: Worker[] = [];
  try {
    using dSet = upload(dev, set), dIdx = upload(dev, indices), dPrm = upload(dev, params);
    using out = Tensor.empty(dev, [n, c, h, w], "f16");
    let first: Uint8Array | undefined;
    for (let round = 0; round < 300; round++) {
      if (round === 100) {
        for (let k = 0; k < 2; k++) {
          const wk = new Worker(url, { type: "module" });
          wk.postMessage(stop.buffer);
          spinners.push(wk);
        }
      }
      if (round === 200) Atomics.store(stop, 0, 1);
      imageAugment(dSet, out, {
        layout: "nchw",
        affine,
        padding: pad,
        params: dPrm,
        indices: dIdx,
        rows,
        serial: round % 3 === 0, // every third round PS_IMAGE_SERIAL
      });
      const got = await out.toHost();
      const bytes = new Uint8Array(got.buffer);
      if (first === undefined) {
        assert.deepStrictEqual(bitDiff(got, expected), []);
        first = bytes.slice();
      } else {
        assert.ok(bytes.every((v, i) => v === first![i]), `round ${round} differs`);
      }
    }
  } finally {
    Atomics.store(stop, 0, 1);
    for (const wk of spinners) wk.terminate();
    URL.revokeObjectURL(url);
  }
});
