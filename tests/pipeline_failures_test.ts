// Wrong inputs and misuse of the device pipeline (pipeline/prefetcher.ts) are errors that
// name what is wrong, never silently wrong batches: normalization constants that do not fit
// the images, a crop padding other than the one the loader drew its offsets for, unknown
// option keys, overlapping next() calls, two prefetchers on one loader's staging ring.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { augmentHost } from "../augment/host.ts";
import { normalizeAffine } from "../augment/image.ts";
import {
  type DeviceBatch,
  DevicePrefetcher,
  toDevice,
  type ToDeviceOptions,
} from "../pipeline/prefetcher.ts";
import { bitDiff } from "./_image_reference.ts";
import { BACKENDS } from "./_backends.ts";
import {
  expectedBatch,
  makeData,
  makeLoader,
  MEAN,
  plainBatches,
  readBatch,
  STD,
} from "./pipeline_fixtures.ts";

function refuses(
  make: () => unknown,
  type: typeof TypeError | typeof RangeError | typeof Error,
  message: RegExp,
): void {
  assert.throws(make, (err: unknown) => {
    assert.ok(err instanceof type, `${String(err)} is not a ${type.name}`);
    assert.match((err as Error).message, message);
    return true;
  });
}

Deno.test("[cpu] DevicePrefetcher refuses mean/std that do not give one value per channel, naming the option", async () => {
  using device = Device.open("cpu");
  const d = makeData(8, [3, 8, 8], 1);
  await using loader = makeLoader(d, { batchSize: 4 });
  for (const augmentOn of ["device", "host"] as const) {
    const make = (o: ToDeviceOptions) => () =>
      new DevicePrefetcher(loader, device, { augmentOn, ...o });
    // One value for three channels: the device kernel would read past the array, the host
    // path would normalize channels 1 and 2 to NaN.
    refuses(
      make({ mean: [0.5], std: [0.5] }),
      RangeError,
      /Cannot create a DevicePrefetcher: mean has 1 value, the images have 3 channels/,
    );
    refuses(
      make({ mean: MEAN, std: [0.25, 0.25] }),
      RangeError,
      /std has 2 values, the images have 3 channels/,
    );
    refuses(make({ mean: [0, 0, 0, 0] }), RangeError, /mean has 4 values, the images have 3/);
    refuses(make({ std: [] }), RangeError, /std has 0 values, the images have 3 channels/);
    refuses(make({ mean: [0, NaN, 0] }), RangeError, /mean\[1\] is NaN, need a finite number/);
    refuses(make({ std: [1, 1, Infinity] }), RangeError, /std\[2\] is Infinity, need a finite/);
    refuses(make({ std: [1, 0, 1] }), RangeError, /std\[1\] is 0, need a finite number > 0/);
    refuses(make({ std: [1, 1, -0.5] }), RangeError, /std\[2\] is -0\.5, need a finite number > 0/);
    refuses(
      make({ mean: 0.5 as unknown as number[] }),
      TypeError,
      /mean must be an array of numbers, one per channel, got 0\.5/,
    );
    refuses(
      make({ std: ["1", 1, 1] as unknown as number[] }),
      TypeError,
      /std\[0\] is the string "1", need a finite number/,
    );
  }
});

Deno.test("[cpu] augmentHost refuses normalization constants shorter than the channel count and unknown keys", () => {
  const src = new Uint8Array(3 * 2 * 2);
  const out = new Float32Array(src.length);
  const options = {
    n: 1,
    channels: 3,
    height: 2,
    width: 2,
    layout: "nchw" as const,
    pad: 0,
    affine: normalizeAffine([0.5], [0.5]),
  };
  refuses(
    () => augmentHost(src, null, out, options),
    RangeError,
    /Cannot augment: 3 channels need 3 scale and bias values, got 1 and 1/,
  );
  assert.ok(out.every((v) => v === 0), "nothing written");
  refuses(
    () =>
      augmentHost(
        src,
        null,
        out,
        {
          ...options,
          affine: normalizeAffine([0, 0, 0], [1, 1, 1]),
          padding: 4,
        } as typeof options,
      ),
    TypeError,
    /Cannot augment: unknown option "padding"; options are n, channels, height, width, layout, pad, affine/,
  );
});

Deno.test("[cpu] DataLoader exposes its augment configuration, frozen", async () => {
  const d = makeData(8, [3, 8, 8], 1);
  await using withAugment = makeLoader(d, { augment: { padding: 2 } });
  assert.deepStrictEqual(withAugment.augment, {
    padding: 2,
    flip: false,
    vflip: false,
    cutout: 0,
    brightness: 0,
    contrast: 0,
    saturation: 0,
    hue: 0,
  });
  assert.ok(Object.isFrozen(withAugment.augment));
  assert.throws(() => {
    (withAugment.augment as { padding: number }).padding = 4;
  }, TypeError);
  assert.strictEqual(withAugment.augment?.padding, 2);
  await using without = makeLoader(d, { augment: undefined });
  assert.strictEqual(without.augment, undefined);
});

for (const { kind, ignore } of BACKENDS) {
  Deno.test({
    name: `[${kind}] DevicePrefetcher takes the crop padding from the loader by default`,
    ignore,
    async fn() {
      using device = Device.open(kind);
      const d = makeData(40, [3, 32, 32], 3);
      for (const padding of [4, 1]) {
        const expected = await plainBatches(d, { augment: { padding, flip: true } });
        await using loader = makeLoader(d, { augment: { padding, flip: true } });
        await using p = toDevice(loader, device, { mean: MEAN, std: STD, copy: "always" });
        assert.strictEqual(p.padding, padding);
        let k = 0;
        for await (const b of p) {
          const e = expected[k];
          const want = expectedBatch(d, e.indices, e.params, "nchw", "f16", padding);
          const got = await readBatch(b);
          assert.deepStrictEqual(bitDiff(got.images, want.images), [], `padding ${padding}`);
          k++;
        }
        assert.strictEqual(k, 3);
      }
    },
  });
}

Deno.test("[cpu] DevicePrefetcher refuses a padding that contradicts the loader's augment", async () => {
  using device = Device.open("cpu");
  const d = makeData(8, [3, 8, 8], 1);
  await using loader = makeLoader(d, { batchSize: 4, augment: { padding: 4, flip: true } });
  refuses(
    () => new DevicePrefetcher(loader, device, { padding: 2 }),
    RangeError,
    /Cannot create a DevicePrefetcher: padding 2 contradicts the loader's augment\.padding 4/,
  );
  // The same value is accepted (it says what the loader says).
  await new DevicePrefetcher(loader, device, { padding: 4 }).dispose();
  await using plain = makeLoader(d, { batchSize: 4, augment: undefined });
  refuses(
    () => new DevicePrefetcher(plain, device, { padding: 4 }),
    RangeError,
    /padding 4 contradicts the loader, which draws no crop offsets \(no augment option\)/,
  );
  await new DevicePrefetcher(plain, device, { padding: 0 }).dispose();
});

Deno.test("[cpu] DevicePrefetcher refuses unknown option keys, naming the key", async () => {
  using device = Device.open("cpu");
  const d = makeData(8, [3, 8, 8], 1);
  await using loader = makeLoader(d, { batchSize: 4 });
  const bad: [Record<string, unknown>, RegExp][] = [
    [{ paddding: 4 }, /unknown option "paddding" \(did you mean "padding"\?\)/],
    [{ Mean: MEAN }, /unknown option "Mean" \(did you mean "mean"\?\)/],
    [
      { augment: { vflip: true } },
      /unknown option "augment": crop, flip, cutout and colour parameters are drawn by the loader \(the DataLoader's augment option\)/,
    ],
    [
      { normalize: { mean: MEAN, std: STD } },
      /unknown option "normalize".*mean and std options/,
    ],
    [{ vflip: true }, /unknown option "vflip"; options are depth, augmentOn, /],
  ];
  for (const [o, re] of bad) {
    refuses(
      () => new DevicePrefetcher(loader, device, o as ToDeviceOptions),
      TypeError,
      new RegExp("Cannot create a DevicePrefetcher: " + re.source),
    );
  }
  refuses(
    () => new DevicePrefetcher(loader, device, 7 as unknown as ToDeviceOptions),
    TypeError,
    /options must be an object, got 7/,
  );
});

for (const { kind, ignore } of BACKENDS) {
  for (
    const o of [
      { augmentOn: "device", copy: "auto", numWorkers: 0 },
      { augmentOn: "device", copy: "always", numWorkers: 2 },
      { augmentOn: "host", copy: "auto", numWorkers: 2 },
    ] as const
  ) {
    Deno.test({
      name: `[${kind}] overlapping next() calls on an epoch run one after another and yield ` +
        `batches in order (augmentOn ${o.augmentOn}, copy ${o.copy}, ${o.numWorkers} workers)`,
      ignore,
      async fn() {
        using device = Device.open(kind);
        // 4 batches and 4 device slots (depth 3): no slot is reused within the epoch, so every
        // batch still holds its own contents after all four calls have returned.
        const d = makeData(60, [3, 16, 16], 21);
        const expected = await plainBatches(d, {});
        await using loader = makeLoader(d, { numWorkers: o.numWorkers });
        await using p = toDevice(loader, device, {
          mean: MEAN,
          std: STD,
          depth: 3,
          augmentOn: o.augmentOn,
          copy: o.copy,
        });
        const it = p[Symbol.asyncIterator]();
        const results = await Promise.all([it.next(), it.next(), it.next(), it.next()]);
        assert.ok(results.every((r) => !r.done), "four batches before the end");
        const batches = results.map((r) => r.value as DeviceBatch);
        assert.deepStrictEqual(batches.map((b) => b.index), [0, 1, 2, 3]);
        assert.deepStrictEqual(batches.map((b) => b.size), [16, 16, 16, 12]);
        for (const [k, b] of batches.entries()) {
          const want = expectedBatch(
            d,
            expected[k].indices,
            expected[k].params,
            "nchw",
            "f16",
            4,
          );
          const got = await readBatch(b);
          assert.deepStrictEqual(got.labels, want.labels, `labels of batch ${k}`);
          assert.deepStrictEqual(bitDiff(got.images, want.images), [], `images of batch ${k}`);
        }
        assert.strictEqual(p.stats?.batches, 4);
        // The end comes after the last batch, and so do calls that overlap it.
        const ends = await Promise.all([it.next(), it.next()]);
        assert.ok(ends.every((r) => r.done));
      },
    });
  }
}

Deno.test("[cpu] a second DevicePrefetcher on the same loader is refused until the first is disposed", async () => {
  using device = Device.open("cpu");
  const before = device.liveObjects();
  const d = makeData(64, [3, 8, 8], 5);
  await using loader = makeLoader(d, { numWorkers: 0 });
  const first = new DevicePrefetcher(loader, device, { mean: MEAN, std: STD });
  const it = first[Symbol.asyncIterator]();
  assert.ok(!(await it.next()).done, "the first one has pinned the ring and holds a batch");
  for (const pin of ["register", "alloc", "none"] as const) {
    refuses(
      () => new DevicePrefetcher(loader, device, { mean: MEAN, std: STD, pin }),
      Error,
      /Cannot create a DevicePrefetcher: the DataLoader's staging ring is already attached to another DevicePrefetcher; dispose that one first/,
    );
  }
  await first.dispose();
  assert.deepStrictEqual(device.liveObjects(), before);
  await using second = new DevicePrefetcher(loader, device, { mean: MEAN, std: STD });
  let n = 0;
  for await (const b of second) n += b.size;
  assert.strictEqual(n, 64);
  // A loader of its own is no conflict.
  await using other = makeLoader(d);
  await new DevicePrefetcher(other, device).dispose();
});
