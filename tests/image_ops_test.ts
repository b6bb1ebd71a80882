// The typed image wrappers (ops/image.ts, ops/gather.ts): the same bits as the host reference, and
// errors that name the argument at fault before anything reaches the kernel.
import assert from "node:assert";
import {
  Device,
  DeviceBuffer,
  gatherRows,
  imageAugment,
  imageLabelsI32,
  normalizeAffine,
  Stream,
  Tensor,
} from "../mod.ts";
import { testEachBackend } from "./_backends.ts";
import { hostAugmented } from "./pipeline_fixtures.ts";
import {
  bitDiff,
  cropRecords,
  f32Bits,
  ONE_BITS,
  RECORD,
  referenceAugment,
  rng,
} from "./_image_reference.ts";

Deno.test("[cpu] imageAugment equals augmentHost with params, padding and either layout", async () => {
  using dev = Device.open("cpu");
  const n = 3, c = 3, h = 5, w = 4, pad = 2;
  const bytes = Uint8Array.from({ length: n * c * h * w }, (_, i) => (i * 37 + 11) & 255);
  const params = cropRecords([0, 0, 1, 2, 3, 0, 4, 4, 1]);
  const affine = normalizeAffine([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]);
  using src = DeviceBuffer.alloc(dev, bytes.length + 8);
  src.copyFrom(bytes, { dstOffset: 8 });
  using p = DeviceBuffer.alloc(dev, params.byteLength);
  p.copyFrom(params);
  for (const layout of ["nhwc", "nchw"] as const) {
    for (const dtype of ["f16", "f32"] as const) {
      using out = Tensor.empty(dev, [n, c, h, w], dtype);
      imageAugment(src, out, { layout, affine, padding: pad, params: p, srcOffset: 8 });
      const ref = hostAugmented(bytes, params, dtype, { n, c, h, w, layout, pad, affine });
      assert.deepStrictEqual([...await out.toHost()], [...ref], `${layout} ${dtype}`);
    }
  }
});

Deno.test("[cpu] imageAugment with indices gathers in its pass: the rows of gatherRows then imageAugment", async () => {
  using dev = Device.open("cpu");
  const rows = 7, c = 3, h = 5, w = 4, img = c * h * w, n = 4, pad = 2;
  using set = DeviceBuffer.alloc(dev, 16 + rows * img);
  set.copyFrom(Uint8Array.from({ length: rows * img }, (_, i) => (i * 53 + 7) & 255), {
    dstOffset: 16,
  });
  using idx = DeviceBuffer.alloc(dev, 4 + 4 * n);
  idx.copyFrom(new Int32Array([6, 0, 6, 3]), { dstOffset: 4 });
  using p = DeviceBuffer.alloc(dev, 4 * RECORD * n);
  p.copyFrom(cropRecords([0, 0, 1, 4, 4, 0, 1, 3, 1, 2, 2, 0]));
  using raw = DeviceBuffer.alloc(dev, n * img);
  gatherRows(set, raw, { indices: idx, indicesOffset: 4, count: n, rowBytes: img, srcOffset: 16 });
  const affine = normalizeAffine([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]);
  for (const layout of ["nhwc", "nchw"] as const) {
    using want = Tensor.empty(dev, [n, c, h, w], "f16");
    imageAugment(raw, want, { layout, affine, padding: pad, params: p });
    using got = Tensor.empty(dev, [n, c, h, w], "f16");
    imageAugment(set, got, {
      layout,
      affine,
      padding: pad,
      params: p,
      indices: idx,
      indicesOffset: 4,
      srcOffset: 16,
    });
    assert.deepStrictEqual(bitDiff(await got.toHost(), await want.toHost()), [], layout);
  }
  // An index outside the set (rows derived from the buffer: 7) is refused, naming it.
  idx.copyFrom(new Int32Array([7]), { dstOffset: 8 });
  using out = Tensor.empty(dev, [n, c, h, w], "f32");
  assert.throws(
    () =>
      imageAugment(set, out, {
        layout: "nchw",
        affine,
        indices: idx,
        indicesOffset: 4,
        srcOffset: 16,
      }),
    { message: /indices\[1\] = 7 is outside \[0, 7\)/ },
  );
});

Deno.test("[cpu] image wrappers name the argument at fault", () => {
  using dev = Device.open("cpu");
  using src = DeviceBuffer.alloc(dev, 12);
  using out = Tensor.empty(dev, [1, 3, 2, 2], "f16");
  const affine = normalizeAffine([0, 0, 0], [1, 1, 1]);
  assert.throws(() => imageAugment(src, out, { layout: "nhwc", affine, srcOffset: 1 }), {
    name: "RangeError",
    message: /src must hold 12 bytes from offset 1, got a buffer of 12/,
  });
  assert.throws(
    () => imageAugment(src, out, { layout: "nchw", affine: normalizeAffine([0], [1]) }),
    { name: "RangeError", message: /affine\.scale must be a Float32Array of 3/ },
  );
  assert.throws(
    // @ts-expect-error a layout the kernel does not know
    () => imageAugment(src, out, { layout: "hwc", affine }),
    { name: "TypeError", message: /layout must be "nhwc" or "nchw", got hwc/ },
  );
  using small = DeviceBuffer.alloc(dev, 8);
  assert.throws(() => imageAugment(src, out, { layout: "nhwc", affine, params: small }), {
    name: "RangeError",
    message: /params must hold 44 bytes/,
  });
  using i32 = Tensor.empty(dev, [1, 3, 2, 2], "i32");
  assert.throws(() => imageAugment(src, i32, { layout: "nhwc", affine }), {
    name: "TypeError",
    message: /out must be f16 or f32, got i32/,
  });
  // Gathering: rows, indicesOffset only with indices; rows needed for a bare pointer; the set,
  // the indices and rows checked against their buffers.
  assert.throws(() => imageAugment(src, out, { layout: "nhwc", affine, rows: 1 }), {
    name: "TypeError",
    message: /rows and indicesOffset go with indices, got none/,
  });
  assert.throws(
    () => imageAugment(src.pointer, out, { layout: "nhwc", affine, indices: small }),
    { name: "TypeError", message: /rows is needed with indices and a bare src pointer/ },
  );
  assert.throws(() => imageAugment(src, out, { layout: "nhwc", affine, indices: small, rows: 2 }), {
    name: "RangeError",
    message: /src must hold 24 bytes from offset 0, got a buffer of 12/,
  });
  assert.throws(
    () => imageAugment(src, out, { layout: "nhwc", affine, indices: small, indicesOffset: 6 }),
    { name: "RangeError", message: /indices must hold 4 bytes from offset 6, got a buffer of 8/ },
  );
  assert.throws(() => imageAugment(small, out, { layout: "nhwc", affine, indices: small }), {
    name: "RangeError",
    message: /rows must be an integer in 1\.\.\d+, got 0/,
  });
  using labels = Tensor.empty(dev, [4], "i32");
  assert.throws(() => imageLabelsI32(src, labels, { labelBytes: 3 }), {
    name: "RangeError",
    message: /labelBytes must be 1, 2 or 4, got 3/,
  });
  assert.throws(() => imageLabelsI32(small, labels, { labelBytes: 4 }), {
    name: "RangeError",
    message: /src must hold 16 bytes/,
  });
  assert.throws(() => gatherRows(src, small, { indices: small, count: 2, rowBytes: 6 }), {
    name: "RangeError",
    message: /dst must hold 12 bytes/,
  });
  assert.throws(() => gatherRows(src, src, { indices: small, count: 3, rowBytes: 1 }), {
    name: "RangeError",
    message: /indices must hold 12 bytes/,
  });
  assert.throws(() => gatherRows(src, small, { indices: small, count: 1, rowBytes: 4, rows: 4 }), {
    name: "RangeError",
    message: /src must hold 16 bytes/,
  });
});

Deno.test("[cpu] imageLabelsI32 widens uint16 labels and gatherRows refuses an index past the rows", async () => {
  using dev = Device.open("cpu");
  using src = DeviceBuffer.alloc(dev, 6);
  src.copyFrom(new Uint16Array([1, 65535, 300]));
  using labels = Tensor.empty(dev, [3], "i32");
  imageLabelsI32(src, labels, { labelBytes: 2 });
  assert.deepStrictEqual([...await labels.toHost()], [1, 65535, 300]);
  using idx = DeviceBuffer.alloc(dev, 4);
  idx.copyFrom(new Int32Array([3]));
  using dst = DeviceBuffer.alloc(dev, 2);
  assert.throws(() => gatherRows(src, dst, { indices: idx, count: 1, rowBytes: 2 }));
});

/** n records with every augmentation: random crops, flips, cutouts and colour factors. */
function fullRecords(n: number, pad: number, r: () => number): Int32Array {
  const p = new Int32Array(RECORD * n);
  for (let i = 0; i < n; i++) {
    const on = (k: number) => (i >> k) & 1; // every combination of the six among 64 samples
    p.set([
      Math.floor(r() * (2 * pad + 1)),
      Math.floor(r() * (2 * pad + 1)),
      r() < 0.5 ? 1 : 0,
      on(0),
      Math.floor(r() * 65536),
      Math.floor(r() * 65536),
      on(1) ? 1 + Math.floor(r() * 6) : 0,
      on(2) ? f32Bits(0.5 + r()) : ONE_BITS,
      on(3) ? f32Bits(r() * 2) : ONE_BITS,
      on(4) ? f32Bits(r() * 2) : ONE_BITS,
      on(5) ? f32Bits(r() - 0.5) : 0,
    ], RECORD * i);
  }
  return p;
}

testEachBackend(
  "imageAugment and augmentHost give the reference's bits with vflip, cutout and ColorJitter",
  async (dev) => {
    const r = rng(31);
    const n = 64, pad = 3, mean = [0.49, 0.48, 0.45], std = [0.25, 0.24, 0.26];
    const affine = normalizeAffine(mean, std);
    for (const [c, h, w] of [[3, 32, 32], [3, 7, 11]]) {
      const bytes = Uint8Array.from({ length: n * c * h * w }, () => (r() * 256) | 0);
      const params = fullRecords(n, pad, r);
      using src = DeviceBuffer.alloc(dev, bytes.length);
      src.copyFrom(bytes);
      using p = DeviceBuffer.alloc(dev, params.byteLength);
      p.copyFrom(params);
      for (const layout of ["nhwc", "nchw"] as const) {
        for (const dtype of ["f16", "f32"] as const) {
          const what = `${c}x${h}x${w} ${layout} ${dtype}`;
          const want = referenceAugment({
            src: bytes,
            params,
            n,
            c,
            h,
            w,
            pad,
            layout,
            mean,
            std,
            dtype,
          });
          using out = Tensor.empty(dev, [n, c, h, w], dtype);
          imageAugment(src, out, { layout, affine, padding: pad, params: p });
          assert.deepStrictEqual(bitDiff(await out.toHost(), want), [], `device ${what}`);
          const host = hostAugmented(bytes, params, dtype, { n, c, h, w, layout, pad, affine });
          assert.deepStrictEqual(bitDiff(host, want), [], `host ${what}`);
        }
      }
    }
  },
);

testEachBackend(
  "gatherRows refuses an index outside the set: the CPU at the call, CUDA at the next synchronize",
  async (dev) => {
    using set = DeviceBuffer.alloc(dev, 4 * 16);
    using out = DeviceBuffer.alloc(dev, 3 * 16);
    using idx = DeviceBuffer.alloc(dev, 3 * 4);
    idx.copyFrom(new Int32Array([1, 7, 2]));
    const gather = () => gatherRows(set, out, { indices: idx, count: 3, rowBytes: 16, rows: 4 });
    const refusal = /indices\[1\] = 7 (is )?outside \[0, 4\)/;
    if (dev.kind === "cpu") {
      assert.throws(gather, refusal);
      return;
    }
    // The device finds it: the call returns, the next synchronize reports it, once.
    gather();
    await assert.rejects(dev.synchronize(), refusal);
    await dev.synchronize();
    // Through a stream's synchronize too.
    using s = new Stream(dev);
    gatherRows(set, out, { indices: idx, count: 3, rowBytes: 16, rows: 4, stream: s });
    await assert.rejects(s.synchronize(), refusal);
    await s.synchronize();
    // An index in range raises nothing.
    idx.copyFrom(new Int32Array([1, 3, 2]));
    gather();
    await dev.synchronize();
  },
);

testEachBackend(
  "imageAugment with labels writes each gathered sample's label as int32 in the same launch",
  async (dev) => {
    const rows = 6, c = 2, h = 3, w = 5, img = c * h * w, n = 5, pad = 1;
    using set = DeviceBuffer.alloc(dev, rows * img);
    set.copyFrom(Uint8Array.from({ length: rows * img }, (_, i) => (i * 29 + 3) & 255));
    using idx = DeviceBuffer.alloc(dev, 4 * n);
    const order = new Int32Array([5, 0, 3, 3, 1]);
    idx.copyFrom(order);
    using p = DeviceBuffer.alloc(dev, 4 * RECORD * n);
    p.copyFrom(cropRecords([0, 0, 1, 2, 2, 0, 1, 1, 1, 2, 0, 0, 0, 2, 1]));
    const affine = normalizeAffine([0.5, 0.4], [0.2, 0.25]);
    // Labels with every byte set, so a narrow read or a wrong index shows.
    const values = [0x7f6e5d4c, -2, 65535, 0x01020304, 255, -0x80000000];
    const sources = {
      1: Uint8Array.from(values, (v) => v & 0xff),
      2: Uint16Array.from(values, (v) => v & 0xffff),
      4: Int32Array.from(values),
    } as const;
    for (const labelBytes of [1, 2, 4] as const) {
      const s = sources[labelBytes];
      // At an offset, after a label that must not be read.
      using labelSet = DeviceBuffer.alloc(dev, (rows + 1) * labelBytes);
      labelSet.copyFrom(new Uint8Array(s.buffer), { dstOffset: labelBytes });
      using want = Tensor.empty(dev, [n, c, h, w], "f16");
      imageAugment(set, want, { layout: "nhwc", affine, padding: pad, params: p, indices: idx });
      using got = Tensor.empty(dev, [n, c, h, w], "f16");
      using labels = Tensor.empty(dev, [n], "i32");
      imageAugment(set, got, {
        layout: "nhwc",
        affine,
        padding: pad,
        params: p,
        indices: idx,
        labels: labelSet,
        labelBytes,
        labelsOffset: labelBytes,
        labelsOut: labels,
      });
      assert.deepStrictEqual(bitDiff(await got.toHost(), await want.toHost()), [], `${labelBytes}`);
      assert.deepStrictEqual(
        [...await labels.toHost()],
        [...order].map((j) => s[j]),
        `labels of ${labelBytes} bytes`,
      );
    }
    // Without indices, sample i's label is label i.
    using plain = Tensor.empty(dev, [2, c, h, w], "f32");
    using two = Tensor.empty(dev, [2], "i32");
    using lab = DeviceBuffer.alloc(dev, 2);
    lab.copyFrom(new Uint8Array([9, 4]));
    imageAugment(set, plain, {
      layout: "nchw",
      affine,
      labels: lab,
      labelBytes: 1,
      labelsOut: two,
    });
    assert.deepStrictEqual([...await two.toHost()], [9, 4]);
    // The label options are checked, naming the one at fault.
    assert.throws(
      () =>
        imageAugment(set, plain, {
          layout: "nchw",
          affine,
          labels: lab,
          labelBytes: 3,
          labelsOut: two,
        }),
      { name: "RangeError", message: /labelBytes must be 1, 2 or 4, got 3/ },
    );
    assert.throws(
      () => imageAugment(set, plain, { layout: "nchw", affine, labels: lab, labelBytes: 1 }),
      { name: "TypeError", message: /labelsOut must be an i32 Tensor of 2/ },
    );
    assert.throws(
      () => imageAugment(set, plain, { layout: "nchw", affine, labelsOut: two }),
      { name: "TypeError", message: /go with labels, got none/ },
    );
    assert.throws(
      () =>
        imageAugment(set, plain, {
          layout: "nchw",
          affine,
          labels: lab,
          labelBytes: 2,
          labelsOut: two,
        }),
      { name: "RangeError", message: /labels/ },
    );
  },
);
