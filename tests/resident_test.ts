// The device-resident dataset (pipeline/resident.ts): the same batches, bit for bit, as the
// streamed path (DataLoader + DevicePrefetcher) for the same seed, shuffle, drop and augment,
// epoch after epoch, on every backend; its buffers freed; its mistakes named.

import assert from "node:assert";
import { Buffer } from "node:buffer";
import { DataLoader } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { Subset } from "../loader/datasets/subset.ts";
import { toDevice } from "../pipeline/prefetcher.ts";
import { DeviceDataset } from "../pipeline/resident.ts";
import { Device } from "../ffi/device.ts";
import { DeviceBuffer } from "../ffi/memory.ts";
import { testEachBackend } from "./_backends.ts";
import { opCounts, opDelta } from "../internal/op_count.ts";

function data(n: number, shape: number[], labelBytes: 1 | 4): TensorDataset {
  const per = shape.reduce((a, b) => a * b, 1);
  const images = new Uint8Array(new SharedArrayBuffer(n * per));
  let x = 12345;
  for (let i = 0; i < images.length; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    images[i] = x >>> 24;
  }
  const labels = labelBytes === 1
    ? new Uint8Array(new SharedArrayBuffer(n)).map((_, i) => (i * 7) % 10)
    : new Int32Array(new SharedArrayBuffer(n * 4)).map((_, i) => (i * 7) % 10);
  return new TensorDataset({
    image: { data: images, shape },
    label: { data: labels, shape: [] },
  });
}

function bytes(a: ArrayBufferView): number[] {
  return Array.from(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
}

for (
  const cfg of [
    { shape: [3, 9, 7], layout: "nchw", labelBytes: 4, dtype: "f16", dropLast: false, all: false },
    { shape: [9, 7, 3], layout: "nhwc", labelBytes: 1, dtype: "f32", dropLast: true, all: false },
    { shape: [12, 10], layout: "nchw", labelBytes: 1, dtype: "f16", dropLast: false, all: false },
    // Every augmentation: vertical flips, cutout and colour jitter too.
    { shape: [3, 9, 7], layout: "nchw", labelBytes: 4, dtype: "f16", dropLast: false, all: true },
    { shape: [9, 7, 3], layout: "nhwc", labelBytes: 1, dtype: "f32", dropLast: true, all: true },
  ] as const
) {
  testEachBackend(
    `a device-resident dataset yields the streamed path's batches bit for bit (${cfg.layout} ${cfg.shape}, ${cfg.dtype}, dropLast ${cfg.dropLast}${
      cfg.all ? ", every augmentation" : ""
    })`,
    async (dev) => {
      const ds = data(101, [...cfg.shape], cfg.labelBytes);
      const c = cfg.shape.length === 2 ? 1 : cfg.layout === "nchw" ? cfg.shape[0] : cfg.shape[2];
      const mean = Array.from({ length: c }, (_, k) => 0.3 + 0.1 * k);
      const std = Array.from({ length: c }, (_, k) => 0.2 + 0.05 * k);
      const common = {
        batchSize: 16,
        shuffle: true,
        seed: 77,
        dropLast: cfg.dropLast,
        augment: cfg.all
          ? { padding: 3, flip: true, vflip: true, cutout: 3, brightness: 0.5, contrast: 0.3 }
          : { padding: 3, flip: true },
      };
      const before = dev.liveObjects().allocations;
      {
        using resident = new DeviceDataset(dev, ds, { layout: cfg.layout });
        await using fast = resident.loader({ ...common, mean, std, dtype: cfg.dtype });
        await using loader = new DataLoader(ds, { ...common, numWorkers: 0, autoRelease: false });
        await using slow = toDevice(loader, dev, {
          mean,
          std,
          dtype: cfg.dtype,
          layout: cfg.layout,
        });
        for (let epoch = 0; epoch < 2; epoch++) {
          const a: number[][][] = [], b: number[][][] = [];
          for await (const x of fast) {
            a.push([bytes(await x.images.toHost()), [...await x.labels.toHost()]]);
          }
          for await (const x of slow) {
            b.push([bytes(await x.images.toHost()), [...await x.labels.toHost()]]);
          }
          assert.strictEqual(a.length, cfg.dropLast ? 6 : 7, `epoch ${epoch}`);
          assert.strictEqual(a.length, b.length);
          for (let k = 0; k < a.length; k++) {
            assert.deepStrictEqual(a[k][1], b[k][1], `epoch ${epoch} batch ${k}: labels`);
            assert.ok(
              a[k][0].length === b[k][0].length && a[k][0].every((v, i) => v === b[k][0][i]),
              `epoch ${epoch} batch ${k}: images differ`,
            );
          }
          // Both advance to the next epoch's order and draws.
          fast.setEpoch(epoch + 1);
          loader.setEpoch(epoch + 1);
        }
      }
      assert.strictEqual(dev.liveObjects().allocations, before, "every buffer freed");
    },
  );
}

Deno.test("[cpu] at CIFAR-10 size, the resident batches equal those streamed by 2 workers, every augmentation on", async () => {
  // 10,000 CIFAR-shaped images (30 MB, bigger than the caches: the kernel's gather and its
  // prefetch run on scattered rows), batch 128, 2 epochs, compared byte for byte.
  using dev = Device.open("cpu");
  const ds = data(10_000, [3, 32, 32], 1);
  const mean = [0.4914, 0.4822, 0.4465], std = [0.247, 0.2435, 0.2616];
  const common = {
    batchSize: 128,
    shuffle: true,
    seed: 3,
    augment: { padding: 4, flip: true, vflip: true, cutout: 8, brightness: 0.2, contrast: 0.2 },
  };
  using resident = new DeviceDataset(dev, ds);
  await using fast = resident.loader({ ...common, mean, std });
  await using loader = new DataLoader(ds, {
    ...common,
    numWorkers: 2,
    persistentWorkers: true,
    autoRelease: false,
  });
  await using slow = toDevice(loader, dev, { mean, std, padding: 4 });
  for (let epoch = 0; epoch < 2; epoch++) {
    const want: Uint8Array[] = [];
    for await (const x of slow) {
      want.push(new Uint8Array((await x.images.toHost()).buffer));
      want.push(new Uint8Array((await x.labels.toHost()).buffer));
    }
    let k = 0;
    for await (const x of fast) {
      for (const got of [await x.images.toHost(), await x.labels.toHost()]) {
        const g = new Uint8Array(got.buffer, got.byteOffset, got.byteLength);
        assert.ok(k < want.length && Buffer.compare(g, want[k]) === 0, `epoch ${epoch} part ${k}`);
        k++;
      }
    }
    assert.strictEqual(k, want.length);
    assert.strictEqual(k, 2 * 79);
    fast.setEpoch(epoch + 1);
    loader.setEpoch(epoch + 1);
  }
});

testEachBackend(
  "a resident loader slices its order into batches across chunks, dropLast as the DataLoader",
  async (dev) => {
    // The order is drawn in chunks of about 2,048 samples (whole batches: 6 of 300 here);
    // 4,000 samples span three chunks, and the short last batch exists only in the last one.
    const ds = data(4000, [1, 4, 4], 1);
    // And batches bigger than a chunk (one batch a chunk).
    for (const [dropLast, batchSize] of [[true, 300], [false, 300], [false, 2500]] as const) {
      const common = {
        batchSize,
        shuffle: true,
        seed: 5,
        dropLast,
        augment: { padding: 1, flip: true },
      };
      using resident = new DeviceDataset(dev, ds);
      await using fast = resident.loader({ ...common, dtype: "f32" });
      await using loader = new DataLoader(ds, { ...common, numWorkers: 0, autoRelease: false });
      await using slow = toDevice(loader, dev, { dtype: "f32" });
      assert.strictEqual(fast.length, batchSize === 2500 ? 2 : dropLast ? 13 : 14);
      assert.strictEqual(fast.length, loader.length);
      for (let epoch = 0; epoch < 2; epoch++) {
        const want: number[][] = [];
        for await (const x of slow) {
          want.push([...await x.images.toHost(), ...await x.labels.toHost()]);
        }
        let k = 0;
        for await (const x of fast) {
          assert.strictEqual(x.index, k);
          assert.deepStrictEqual(
            [...await x.images.toHost(), ...await x.labels.toHost()],
            want[k],
            `dropLast ${dropLast} epoch ${epoch} batch ${k}`,
          );
          k++;
        }
        assert.strictEqual(k, want.length);
        assert.strictEqual(k, fast.length);
        fast.setEpoch(epoch + 1);
        loader.setEpoch(epoch + 1);
      }
    }
  },
);

testEachBackend(
  "a resident loader makes a chunk of batches with one launch, its records drawn and uploaded once",
  async (dev) => {
    // 4,000 samples in batches of 300: chunks of 6 batches (1,800 samples), 1,800 + 1,800 +
    // 400, so 3 launches and 3 record uploads after the order's one upload; no allocation
    // once the first epoch made the buffers, and no wait.
    const ds = data(4000, [1, 4, 4], 1);
    using resident = new DeviceDataset(dev, ds);
    for (const augment of [{ padding: 1, flip: true }, undefined]) {
      await using fast = resident.loader({ batchSize: 300, shuffle: true, seed: 5, augment });
      for (let epoch = 0; epoch < 2; epoch++) {
        const before = opCounts();
        let batches = 0;
        for await (const x of fast) batches += x.size > 0 ? 1 : 0;
        const d = opDelta(opCounts(), before);
        assert.strictEqual(batches, 14);
        assert.deepStrictEqual(
          [d.kernels, d.copies, d.memsets, d.syncs],
          [3, augment ? 4 : 1, 0, 0],
          `epoch ${epoch}, augment ${augment !== undefined}`,
        );
        if (epoch > 0) assert.strictEqual(d.allocations, 0);
      }
    }
  },
);

testEachBackend(
  "a resident loader advances its epoch per iteration as the DataLoader, with or without shuffle and draws",
  async (dev) => {
    // No setEpoch: each for-await takes the next epoch, an early exit included; without
    // augment the centred window, without shuffle the dataset's order.
    const ds = data(50, [3, 6, 5], 4);
    for (const opts of [{ shuffle: true, seed: 9 }, { shuffle: false, augment: undefined }]) {
      const common = { batchSize: 8, augment: { padding: 2, flip: true }, ...opts };
      using resident = new DeviceDataset(dev, ds);
      await using fast = resident.loader({ ...common, dtype: "f32" });
      await using loader = new DataLoader(ds, { ...common, numWorkers: 0, autoRelease: false });
      await using slow = toDevice(loader, dev, {
        dtype: "f32",
        padding: common.augment ? 2 : undefined,
      });
      for (let epoch = 0; epoch < 3; epoch++) {
        const want: number[][] = [];
        for await (const x of slow) {
          want.push([...await x.images.toHost(), ...await x.labels.toHost()]);
          if (epoch === 1 && want.length === 2) break;
        }
        let k = 0;
        for await (const x of fast) {
          assert.strictEqual(x.epoch, epoch);
          assert.deepStrictEqual(
            [...await x.images.toHost(), ...await x.labels.toHost()],
            want[k],
            `${JSON.stringify(opts)} epoch ${epoch} batch ${k}`,
          );
          if (++k === want.length) break;
        }
        assert.strictEqual(k, epoch === 1 ? 2 : 7);
        assert.strictEqual(fast.epoch, epoch + 1);
      }
    }
  },
);

Deno.test("[cpu] a gather index outside the dataset is refused (CUDA skips the row)", () => {
  using dev = Device.open("cpu");
  using src = DeviceBuffer.alloc(dev, 16), idx = DeviceBuffer.alloc(dev, 8);
  using dst = DeviceBuffer.alloc(dev, 8);
  idx.copyFrom(new Int32Array([1, 4]));
  const s = dev.lib.symbols;
  const st = s.ps_gather_rows(
    src.pointerAt(0),
    4n,
    4n,
    idx.pointerAt(0),
    2,
    dst.pointerAt(0),
    null,
  );
  assert.throws(() => dev.check(st, "gather"), /indices\[1\] = 4 is outside \[0, 4\)/);
});

testEachBackend(
  "leaving a device-resident epoch early frees nothing it still needs",
  async (dev) => {
    using resident = new DeviceDataset(dev, data(64, [1, 4, 4], 4));
    await using loader = resident.loader({ batchSize: 8, dtype: "f32" });
    for await (const b of loader) {
      assert.strictEqual(b.size, 8);
      break;
    }
    let n = 0;
    for await (const b of loader) n += b.size;
    assert.strictEqual(n, 64, "the next epoch runs whole");
  },
);

testEachBackend("a device-resident dataset refuses what it cannot hold, naming it", (dev) => {
  const ds = data(10, [1, 4, 4], 4);
  assert.throws(() => new DeviceDataset(dev, new Subset(ds, [1, 2])), /not a Subset/);
  assert.throws(
    () => new DeviceDataset(dev, { length: 1, get: () => 1 }),
    /need a zero-copy dataset/,
  );
  assert.throws(() => new DeviceDataset(dev, ds, { imageField: "img" }), /no "img"/);
  assert.throws(() => new DeviceDataset(dev, ds, { layot: "nchw" } as never), /layot.*layout/s);
  const f32 = new TensorDataset({
    image: { data: new Float32Array(new SharedArrayBuffer(10 * 16 * 4)), shape: [1, 4, 4] },
    label: new Int32Array(new SharedArrayBuffer(40)),
  });
  assert.throws(() => new DeviceDataset(dev, f32), /field "image" is f32, need u8/);
  using resident = new DeviceDataset(dev, ds);
  assert.throws(
    () => resident.loader({ mean: [0, 0], std: [1, 1] }),
    /mean and std have 2 channels, the images 1/,
  );
  assert.throws(() => resident.loader({ dtype: "i32" as never }), /dtype must be "f16" or "f32"/);
  const s = dev.lib.symbols;
  assert.notStrictEqual(s.ps_gather_rows(null, 1n, 0n, null, 1, null, null), 0, "row_bytes 0");
  assert.notStrictEqual(s.ps_gather_rows(null, -1n, 4n, null, 1, null, null), 0, "rows < 0");
});

testEachBackend(
  "a DeviceLoader sizes its buffers by what a batch can hold, not by batchSize",
  async (dev) => {
    const ds = data(10, [3, 4, 4], 1);
    using resident = new DeviceDataset(dev, ds);
    const before = dev.memoryAllocated();
    for (const batchSize of [1e8, 1e9]) {
      await using loader = resident.loader({ batchSize, augment: { padding: 1, flip: true } });
      let samples = 0;
      for await (const b of loader) {
        samples += b.size;
        // Order, records, labels and one batch of 10 images: a few kilobytes, not gigabytes.
        assert.ok(dev.memoryAllocated() - before < 1 << 20, `batchSize ${batchSize}`);
      }
      assert.strictEqual(samples, 10);
    }
  },
);

testEachBackend(
  "an epoch left open when its DeviceLoader is disposed refuses to go on, naming the loader",
  async (dev) => {
    const ds = data(40, [3, 4, 4], 4);
    using resident = new DeviceDataset(dev, ds);
    const loader = resident.loader({ batchSize: 8 });
    const it = loader[Symbol.asyncIterator]();
    assert.strictEqual((await it.next()).done, false);
    await loader[Symbol.asyncDispose]();
    const held = dev.memoryAllocated();
    await assert.rejects(it.next(), /Cannot iterate a DeviceLoader: it is disposed/);
    assert.strictEqual(dev.memoryAllocated(), held, "nothing allocated after the dispose");
  },
);
