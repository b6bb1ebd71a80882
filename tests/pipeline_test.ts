// The device pipeline (pipeline/prefetcher.ts) end to end, on every backend present: batches
// equal the independent TypeScript reference bit for bit; ring slots are never overwritten
// while a copy may still read them (poisoned on release); early exits free every native
// object and stop the loader. CPU always runs; CUDA runs on a GPU machine and shows as
// ignored elsewhere.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { Event } from "../ffi/stream.ts";
import { DataLoader } from "../loader/data_loader.ts";
import type { TensorDataset } from "../loader/datasets/tensor.ts";
import { RingBatch } from "../loader/ring.ts";
import { normalizeAffine } from "../augment/image.ts";
import { DevicePrefetcher, toDevice, type ToDeviceOptions } from "../pipeline/prefetcher.ts";
import { bitDiff, cropRecords, referenceAugment, rng } from "./_image_reference.ts";
import { BACKENDS } from "./_backends.ts";
import {
  expectedBatch,
  hostAugmented,
  makeData,
  makeLoader,
  MEAN,
  plainBatches,
  readBatch,
  STD,
} from "./pipeline_fixtures.ts";

for (const { kind, ignore } of BACKENDS) {
  for (
    const opts of [
      { augmentOn: "device", dtype: "f16", numWorkers: 0, pin: "register", copy: "auto" },
      { augmentOn: "device", dtype: "f16", numWorkers: 0, pin: "register", copy: "always" },
      { augmentOn: "device", dtype: "f32", numWorkers: 2, pin: "register", copy: "always" },
      { augmentOn: "device", dtype: "f32", numWorkers: 2, pin: "register", copy: "auto" },
      { augmentOn: "device", dtype: "f16", numWorkers: 2, pin: "alloc", copy: "auto" },
      { augmentOn: "device", dtype: "f16", numWorkers: 0, pin: "none", copy: "auto" },
      { augmentOn: "host", dtype: "f16", numWorkers: 0, pin: "register", copy: "auto" },
      { augmentOn: "host", dtype: "f32", numWorkers: 2, pin: "register", copy: "auto" },
    ] as const
  ) {
    Deno.test({
      name: `[${kind}] pipeline batches equal the TypeScript reference bit for bit ` +
        `(augmentOn ${opts.augmentOn}, ${opts.dtype}, ${opts.numWorkers} workers, pin ${opts.pin}, ` +
        `copy ${opts.copy})`,
      ignore,
      async fn() {
        using device = Device.open(kind);
        // 75 samples in batches of 16: four full batches and a short one of 11.
        const d = makeData(75, [3, 32, 32], 7);
        const expected = await plainBatches(d, {});
        await using loader = makeLoader(d, { numWorkers: opts.numWorkers });
        await using p = toDevice(loader, device, {
          augmentOn: opts.augmentOn,
          dtype: opts.dtype,
          pin: opts.pin,
          copy: opts.copy,
          mean: MEAN,
          std: STD,
          depth: 2,
        });
        let k = 0;
        for await (const b of p) {
          const want = expectedBatch(
            d,
            expected[k].indices,
            expected[k].params,
            "nchw",
            opts.dtype,
            4,
          );
          const got = await readBatch(b);
          assert.deepStrictEqual(b.images.shape, [b.size, 3, 32, 32]);
          assert.strictEqual(b.images.dtype, opts.dtype);
          assert.strictEqual(b.labels.dtype, "i32");
          assert.deepStrictEqual(bitDiff(got.images, want.images), [], `batch ${k}`);
          assert.deepStrictEqual(got.labels, want.labels, `labels of batch ${k}`);
          k++;
        }
        assert.strictEqual(k, 5);
        const s = p.stats!;
        assert.strictEqual(s.batches, 5);
        assert.strictEqual(s.samples, 75);
        const copies = opts.copy === "always" || opts.pin !== "register" ||
          opts.augmentOn === "host" || kind === "cuda";
        assert.strictEqual(s.copyBytes > 0, copies);
        assert.ok(s.copyMs >= 0 && s.wallMs > 0);
        assert.ok(s.copiesTimed <= s.batches && (s.copiesTimed > 0) === copies);
        assert.ok(s.inputBoundFraction >= 0 && s.inputBoundFraction <= 1);
      },
    });
  }

  Deno.test({
    name: `[${kind}] pipeline applies vflip, cutout, brightness and contrast as the reference ` +
      "(device and host, 0 and 2 workers)",
    ignore,
    async fn() {
      using device = Device.open(kind);
      const d = makeData(40, [3, 32, 32], 12);
      const augment = {
        padding: 4,
        flip: true,
        vflip: true,
        cutout: 8,
        brightness: 0.4,
        contrast: 0.4,
      };
      const expected = await plainBatches(d, { augment });
      for (
        const [augmentOn, numWorkers, dtype] of [
          ["device", 2, "f16"],
          ["device", 0, "f32"],
          ["host", 2, "f16"],
        ] as const
      ) {
        await using loader = makeLoader(d, { numWorkers, augment });
        await using p = toDevice(loader, device, { augmentOn, dtype, mean: MEAN, std: STD });
        let k = 0;
        for await (const b of p) {
          const e = expected[k];
          const want = expectedBatch(d, e.indices, e.params, "nchw", dtype, 4);
          const what = `${augmentOn} ${numWorkers} workers batch ${k}`;
          assert.deepStrictEqual(bitDiff((await readBatch(b)).images, want.images), [], what);
          k++;
        }
        assert.strictEqual(k, 3);
      }
    },
  });

  Deno.test({
    name: `[${kind}] crop and flip alone keep the bits they had before the other augmentations`,
    ignore,
    async fn() {
      // FNV-1a of every batch's image bytes for a fixed seed, taken with the three-word
      // (dy, dx, flip) record: the new options, off, shift no seeded result.
      using device = Device.open(kind);
      const d = makeData(40, [3, 32, 32], 11);
      const got: string[] = [];
      for (const dtype of ["f16", "f32"] as const) {
        await using loader = makeLoader(d, { numWorkers: 0, seed: 2024 });
        await using p = toDevice(loader, device, { mean: MEAN, std: STD, dtype });
        let h = 0x811c9dc5;
        for await (const b of p) {
          const x = await b.images.toHost();
          for (const v of new Uint8Array(x.buffer, x.byteOffset, x.byteLength)) {
            h = Math.imul(h ^ v, 0x01000193) >>> 0;
          }
        }
        got.push(`${dtype} ${h.toString(16)}`);
      }
      assert.deepStrictEqual(got, ["f16 d804bb4e", "f32 483ea32f"]);
    },
  });

  Deno.test({
    name: `[${kind}] pipeline handles NHWC and single-channel images`,
    ignore,
    async fn() {
      using device = Device.open(kind);
      for (const [shape, layout] of [[[12, 10, 3], "nhwc"], [[1, 9, 14], "nchw"]] as const) {
        const d = makeData(20, [...shape], 3);
        const expected = await plainBatches(d, {});
        await using loader = makeLoader(d);
        const c = layout === "nhwc" ? shape[2] : shape[0];
        await using p = toDevice(loader, device, {
          layout,
          mean: MEAN.slice(0, c),
          std: STD.slice(0, c),
        });
        let k = 0;
        for await (const b of p) {
          const want = expectedBatch(d, expected[k].indices, expected[k].params, layout, "f16", 4);
          const got = await readBatch(b);
          assert.deepStrictEqual(bitDiff(got.images, want.images), [], `${layout} batch ${k}`);
          k++;
        }
        assert.strictEqual(k, 2);
      }
    },
  });

  Deno.test({
    name: `[${kind}] host-side augmentation handles odd batch and image sizes`,
    ignore,
    async fn() {
      // 5 images of 1x3x5 in f16: 150 bytes of pixels, so the labels behind them in the
      // staging buffer need their own alignment.
      using device = Device.open(kind);
      const d = makeData(12, [1, 3, 5], 8);
      const expected = await plainBatches(d, { batchSize: 5 });
      await using loader = makeLoader(d, { batchSize: 5 });
      await using p = toDevice(loader, device, {
        augmentOn: "host",
        mean: MEAN.slice(0, 1),
        std: STD.slice(0, 1),
      });
      let k = 0;
      for await (const b of p) {
        const want = expectedBatch(d, expected[k].indices, expected[k].params, "nchw", "f16", 4);
        const got = await readBatch(b);
        assert.deepStrictEqual(bitDiff(got.images, want.images), [], `batch ${k}`);
        assert.deepStrictEqual(got.labels, want.labels);
        k++;
      }
      assert.strictEqual(k, 3);
    },
  });

  for (
    const [consumer, copy] of [["slow", "always"], ["fast", "always"], ["fast", "auto"]] as const
  ) {
    Deno.test({
      name: `[${kind}] pipeline never lets a ring slot be rewritten before its copy ` +
        `(${consumer} consumer, copy ${copy}, slots poisoned on release)`,
      ignore,
      async fn() {
        // Every loader slot is filled with 0xA5 the moment the pipeline hands it back: a
        // copy that had not finished, or a device slot refilled too early, would show up
        // as a wrong batch.
        const original = RingBatch.prototype.release;
        let poisoned = 0;
        RingBatch.prototype.release = function (this: RingBatch) {
          if (!this.released) {
            new Uint8Array(this.ring.buffer, this.byteOffset, this.ring.slotBytes).fill(0xa5);
            poisoned++;
          }
          original.call(this);
        };
        try {
          using device = Device.open(kind);
          const d = makeData(160, [3, 32, 32], 11);
          const expected = await plainBatches(d, {});
          await using loader = makeLoader(d, { numWorkers: 2, prefetchFactor: 2 });
          await using p = toDevice(loader, device, {
            mean: MEAN,
            std: STD,
            depth: 3,
            copy,
          });
          let k = 0;
          for await (const b of p) {
            // Slow: the loader and the copies run far ahead while we sleep; fast: we read
            // each batch at once and ask for the next.
            if (consumer === "slow") await new Promise((r) => setTimeout(r, 15));
            const want = expectedBatch(
              d,
              expected[k].indices,
              expected[k].params,
              "nchw",
              "f16",
              4,
            );
            const got = await readBatch(b);
            assert.deepStrictEqual(bitDiff(got.images, want.images), [], `batch ${k}`);
            assert.deepStrictEqual(got.labels, want.labels);
            k++;
          }
          assert.strictEqual(k, 10);
          assert.ok(poisoned >= 10, `only ${poisoned} slots went back through release()`);
        } finally {
          RingBatch.prototype.release = original;
        }
      },
    });
  }

  Deno.test({
    name: `[${kind}] the device slot of a batch survives until the next next() call`,
    ignore,
    async fn() {
      // Queue nothing, read the batch only after the pipeline has prefetched `depth` more.
      using device = Device.open(kind);
      const d = makeData(64, [3, 32, 32], 5);
      const expected = await plainBatches(d, {});
      await using loader = makeLoader(d, { numWorkers: 2 });
      await using p = toDevice(loader, device, {
        mean: MEAN,
        std: STD,
        depth: 1,
        copy: "always",
      });
      const it = p[Symbol.asyncIterator]();
      for (let k = 0; k < 4; k++) {
        const r = await it.next();
        assert.ok(!r.done);
        await new Promise((res) => setTimeout(res, 5));
        const want = expectedBatch(d, expected[k].indices, expected[k].params, "nchw", "f16", 4);
        assert.deepStrictEqual(bitDiff((await readBatch(r.value)).images, want.images), []);
      }
      assert.ok((await it.next()).done);
    },
  });

  for (const how of ["break", "throw", "dispose"] as const) {
    Deno.test({
      name: `[${kind}] leaving an epoch early (${how}) frees every native object and stops ` +
        `the loader's epoch`,
      ignore,
      async fn() {
        using device = Device.open(kind);
        const before = device.liveObjects();
        const d = makeData(200, [3, 32, 32], 1);
        await using loader = makeLoader(d, { numWorkers: 2 });
        for (const augmentOn of ["device", "host"] as const) {
          const p = new DevicePrefetcher(loader, device, {
            augmentOn,
            depth: 3,
            copy: "always",
          });
          let seen = 0;
          try {
            for await (const _ of p) {
              if (++seen === 2) {
                if (how === "break") break;
                if (how === "throw") throw new Error("step failed");
                await p.dispose();
              }
            }
          } catch (err) {
            if (!(err instanceof Error) || err.message !== "step failed") throw err;
          }
          assert.ok(seen >= 2);
          assert.deepStrictEqual(device.liveObjects(), before, `${augmentOn}: live objects`);
          // The loader is usable for another epoch, and so is the prefetcher unless disposed.
          if (how !== "dispose") {
            let batches = 0;
            for await (const _ of p) batches++;
            assert.strictEqual(batches, 13);
            assert.deepStrictEqual(device.liveObjects(), before);
          }
          await p.dispose();
        }
        await loader.dispose();
        assert.strictEqual(loader.workers, 0);
      },
    });
  }

  Deno.test({
    name: `[${kind}] persistent pipelines keep their device memory until dispose`,
    ignore,
    async fn() {
      using device = Device.open(kind);
      const before = device.liveObjects();
      const d = makeData(40, [3, 32, 32], 2);
      await using loader = makeLoader(d);
      const p = toDevice(loader, device, { persistent: true });
      for (let e = 0; e < 2; e++) {
        let n = 0;
        for await (const b of p) n += b.size;
        assert.strictEqual(n, 40);
        assert.ok(device.liveObjects().allocations > before.allocations);
      }
      assert.strictEqual(p.history.length, 2);
      await p.dispose();
      assert.deepStrictEqual(device.liveObjects(), before);
    },
  });
}

Deno.test("[cpu] pipeline works with the loader's autoRelease: true (waits on each copy)", async () => {
  using device = Device.open("cpu");
  const d = makeData(48, [3, 32, 32], 4);
  const expected = await plainBatches(d, {});
  await using loader = makeLoader(d, { autoRelease: true, numWorkers: 2 });
  await using p = toDevice(loader, device, { mean: MEAN, std: STD, copy: "always" });
  let k = 0;
  for await (const b of p) {
    const want = expectedBatch(d, expected[k].indices, expected[k].params, "nchw", "f16", 4);
    assert.deepStrictEqual(bitDiff((await readBatch(b)).images, want.images), []);
    k++;
  }
  assert.strictEqual(k, 3);
});

Deno.test("[cpu] the fused kernel runs serially while the loader's workers own the other cores, split without workers", async () => {
  using device = Device.open("cpu");
  const d = makeData(8, [3, 4, 4], 4);
  const cores = navigator.hardwareConcurrency;
  for (
    const [workers, serial] of [[0, false], [cores, true], [Math.max(1, cores - 1), true]] as const
  ) {
    await using loader = makeLoader(d, { autoRelease: false, numWorkers: workers });
    await using p = toDevice(loader, device, { mean: MEAN, std: STD });
    assert.strictEqual(p._serialKernel(), serial, `${workers} workers on ${cores} cores`);
  }
});

Deno.test("[cpu] host-side augment equals the reference on random params, both layouts", () => {
  const r = rng(77);
  for (const layout of ["nchw", "nhwc"] as const) {
    for (const [dtype, wild] of [["f16", false], ["f32", false], ["f16", true]] as const) {
      const n = 12, c = 3, h = 9, w = 11, pad = 3;
      const src = Uint8Array.from({ length: n * c * h * w }, () => (r() * 256) | 0);
      // wild: windows partly or wholly outside the padded image read zeros.
      const span = wild ? 2 * pad + 2 * w + 5 : 2 * pad + 1, lo = wild ? -w - 2 : 0;
      const params = cropRecords(Int32Array.from(
        { length: 3 * n },
        (_, i) => i % 3 === 2 ? (r() < 0.5 ? 1 : 0) : lo + Math.floor(r() * span),
      ));
      const affine = normalizeAffine(MEAN, STD);
      const out = hostAugmented(src, params, dtype, { n, c, h, w, layout, pad, affine });
      const want = referenceAugment({
        src,
        params,
        n,
        c,
        h,
        w,
        pad,
        layout,
        mean: MEAN,
        std: STD,
        dtype,
      });
      assert.deepStrictEqual(bitDiff(out, want), [], `${layout} ${dtype} wild=${wild}`);
    }
  }
});

Deno.test("[cpu] DevicePrefetcher rejects bad options and non-ring loaders", async () => {
  using device = Device.open("cpu");
  const d = makeData(8, [3, 32, 32], 1);
  await using loader = makeLoader(d);
  const bad: [ToDeviceOptions, RegExp][] = [
    [{ depth: 0 }, /depth must be an integer in 1\.\.64, got 0/],
    [{ augmentOn: "gpu" as "host" }, /augmentOn must be one of device, host, got gpu/],
    [{ dtype: "f64" as "f32" }, /dtype must be one of f16, f32/],
    [{ pin: "maybe" as "none" }, /pin must be one of register, alloc, none/],
    [{ copy: "never" as "auto" }, /copy must be one of auto, always/],
    [{ padding: -1 }, /padding must be an integer >= 0, got -1/],
    [{ imageField: "pixels" }, /need "pixels" and "label"/],
    [{ mean: [0, 0], std: [1, 1, 1] }, /mean has 2 values, the images have 3 channels/],
    [{ std: [1, 0, 1] }, /std\[1\] is 0, need a finite number > 0/],
  ];
  for (const [o, re] of bad) {
    assert.throws(() => new DevicePrefetcher(loader, device, { ...o }), re);
  }
  const generic = new DataLoader(
    { length: 4, get: (i: number) => i } as unknown as TensorDataset,
    { batchSize: 2 },
  );
  // The image path needs the ring; without one, toDevice moves the batch as it is.
  assert.throws(() => toDevice(generic, device, { batch: "images" }), /no staging ring/);
  assert.throws(() => toDevice(generic, device, { mean: [0] }), /no staging ring/);
  await toDevice(generic, device).dispose();
  await generic.dispose();
});

Deno.test("[cpu] a device that lags behind the host slows the host down instead of starving the loader", async () => {
  // The CPU backend finishes every copy at once. Here every event reports "not yet" to
  // query() and fires only a few milliseconds after synchronize() is asked, as on a GPU
  // whose steps take longer than the host needs to queue them: the prefetcher keeps
  // each loader slot until its copy fires, and must wait for the device rather than hold
  // every slot of the loader's ring (the loader would fail: "all ring slots are held").
  const query = Event.prototype.query, synchronize = Event.prototype.synchronize;
  const release = RingBatch.prototype.release;
  let held = 0, maxHeld = 0, yielded = 0;
  Event.prototype.query = () => false;
  Event.prototype.synchronize = function (this: Event) {
    return new Promise<void>((r) => setTimeout(r, 3)).then(() => synchronize.call(this));
  };
  RingBatch.prototype.release = function (this: RingBatch) {
    if (!this.released) held--;
    release.call(this);
  };
  try {
    using device = Device.open("cpu");
    for (const numWorkers of [0, 2]) {
      const d = makeData(16 * 24, [3, 32, 32], 9);
      const expected = await plainBatches(d, {});
      await using loader = makeLoader(d, { numWorkers });
      const next = loader[Symbol.asyncIterator].bind(loader);
      // Count the loader batches the prefetcher holds.
      loader[Symbol.asyncIterator] = () => {
        const it = next();
        return Object.assign(Object.create(it), {
          async next() {
            const r = await it.next();
            if (!r.done) maxHeld = Math.max(maxHeld, ++held), yielded++;
            return r;
          },
        });
      };
      held = maxHeld = yielded = 0;
      await using p = toDevice(loader, device, { mean: MEAN, std: STD, copy: "always" });
      let k = 0;
      for await (const b of p) {
        const want = expectedBatch(d, expected[k].indices, expected[k].params, "nchw", "f16", 4);
        assert.deepStrictEqual(bitDiff((await readBatch(b)).images, want.images), [], `batch ${k}`);
        k++;
      }
      assert.strictEqual(k, 24);
      assert.strictEqual(yielded, 24);
      assert.strictEqual(held, 0, "every loader slot went back");
      // What the loader says a consumer may hold: its ring minus what its loading needs in
      // flight (8 - 6 with 2 workers and prefetchFactor 2, 2 - 1 without workers).
      assert.strictEqual(loader.maxHeldBatches, numWorkers === 2 ? 2 : 1);
      assert.ok(
        maxHeld <= loader.maxHeldBatches,
        `${numWorkers} workers: held ${maxHeld} loader slots`,
      );
      const s = p.stats!;
      assert.ok(s.deviceWaitMs > 0, "the host waited for the device");
      assert.ok(s.waitMs + s.deviceWaitMs <= s.wallMs + 1);
    }
  } finally {
    Event.prototype.query = query;
    Event.prototype.synchronize = synchronize;
    RingBatch.prototype.release = release;
  }
});
