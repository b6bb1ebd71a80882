// The loader's `geometry` option end to end: each batch's records are the seeded ones
// (writeGeometryRecord at the sample's epoch position), and toDevice's batches equal the host
// reference (geometryHost, then augmentHost) bit for bit in every staging mode, with and
// without workers, for fixed-size images (a TensorDataset) and variable-size JPEG files
// (ImageFolder with maxSize: each image at its own size in the ring, its size beside it).

import assert from "node:assert";
import { DataLoader, type DataLoaderOptions } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { ImageFolder } from "../loader/datasets/image_folder.ts";
import { ImageFileList } from "../loader/datasets/image_files.ts";
import type { Dataset } from "../loader/dataset.ts";
import type { RingBatch } from "../loader/ring.ts";
import { toDevice, type ToDeviceOptions } from "../pipeline/prefetcher.ts";
import { GEOMETRY_RECORD_LENGTH as R, writeGeometryRecord } from "../augment/geometry.ts";
import { geometryHost } from "../augment/geometry_host.ts";
import { augmentHost } from "../augment/host.ts";
import { normalizeAffine } from "../augment/image.ts";
import { sampleKey } from "../augment/record.ts";
import { encodeJpeg, ImageDecoder } from "../decode/mod.ts";
import { rng } from "./_image_reference.ts";
import { testEachBackend } from "./_backends.ts";

const MEAN = [0.5, 0.4, 0.3], STD = [0.2, 0.25, 0.3];

/** The f32 batches the prefetcher should deliver, from the loader's own ring batches. */
async function expected(
  ds: Dataset,
  options: DataLoaderOptions,
): Promise<{ images: Float32Array; labels: number[]; geometry: Int32Array }[]> {
  await using loader = new DataLoader(ds, options);
  const spec = loader.geometry!, affine = normalizeAffine(MEAN, STD);
  const out = [];
  for await (const raw of loader) {
    const b = raw as RingBatch, n = b.size, c = 3, { height: h, width: w } = spec;
    const image = b.fields.image as Uint8Array;
    const px = new Uint8Array(n * h * w * c);
    geometryHost(image, b.geometry!, px, {
      n,
      channels: c,
      srcStride: image.length / n,
      height: h,
      width: w,
      antialias: spec.antialias,
      fill: spec.fill,
    });
    const images = new Float32Array(n * c * h * w);
    augmentHost(px, b.augment ?? null, images, {
      n,
      channels: c,
      height: h,
      width: w,
      layout: "nhwc",
      pad: 0,
      affine,
    });
    out.push({
      images,
      labels: Array.from(b.fields.label as ArrayLike<number>),
      geometry: b.geometry!.slice(),
    });
  }
  return out;
}

const MODES: { what: string; workers: number; to: ToDeviceOptions }[] = [
  { what: "device, in place", workers: 0, to: {} },
  { what: "device, copied, 1 worker", workers: 1, to: { copy: "always" } },
  { what: "device, pinned copy", workers: 0, to: { pin: "alloc" } },
  { what: "host", workers: 1, to: { augmentOn: "host" } },
];

async function checkModes(
  ds: Dataset,
  options: DataLoaderOptions,
  device: Parameters<typeof toDevice>[1],
  batches: number,
): Promise<void> {
  const want = await expected(ds, options);
  assert.strictEqual(want.length, batches);
  for (const m of MODES) {
    await using loader = new DataLoader(ds, { ...options, numWorkers: m.workers });
    await using p = toDevice(loader, device, { ...m.to, dtype: "f32", mean: MEAN, std: STD });
    let k = 0;
    for await (const b of p) {
      const spec = loader.geometry!;
      assert.deepStrictEqual(b.images.shape, [b.size, 3, spec.height, spec.width]);
      const got = await b.images.toHost() as Float32Array;
      const e = want[k];
      const bad = got.findIndex((v, i) => !Object.is(v, e.images[i]));
      assert.strictEqual(bad, -1, `${m.what}, batch ${k}: element ${bad}`);
      assert.deepStrictEqual([...await b.labels.toHost()], e.labels, `${m.what}, batch ${k}`);
      k++;
    }
    assert.strictEqual(k, batches, m.what);
  }
}

testEachBackend(
  "the loader's geometry on fixed-size images, every staging mode",
  async (device) => {
    const r = rng(4), n = 10, h = 20, w = 28;
    const ds = new TensorDataset({
      image: {
        data: new Uint8Array(n * h * w * 3).map(() => Math.floor(r() * 256)),
        shape: [h, w, 3],
      },
      label: { data: new Uint8Array(n).map((_, i) => i % 7), shape: [] },
    });
    const options: DataLoaderOptions = {
      batchSize: 4,
      seed: 3,
      shuffle: true,
      geometry: { size: [12, 16], crop: "random-resized-crop", rotation: 15, fill: [5, 6, 7] },
      augment: { flip: true, brightness: 0.2 },
    };
    // The records are the seeded ones, at each sample's position in the epoch.
    const want = await expected(ds, options);
    await using loader = new DataLoader(ds, options);
    const record = new Int32Array(R);
    for (const [b, batch] of want.entries()) {
      for (let k = 0; k < batch.geometry.length / R; k++) {
        writeGeometryRecord(record, 0, loader.geometry!, h, w, sampleKey(3, 0), b * 4 + k);
        assert.deepStrictEqual(batch.geometry.subarray(k * R, (k + 1) * R), record);
      }
    }
    await checkModes(ds, options, device, 3);
  },
);

testEachBackend(
  "ImageFolder with maxSize: variable-size JPEGs cropped on the device",
  async (device) => {
    const root = await Deno.makeTempDir();
    try {
      const r = rng(8);
      // Sizes below, at and above the 40x48 slot (the last two are shrunk to fit).
      const sizes = [[17, 23], [40, 48], [31, 9], [64, 30], [50, 100], [1, 1], [24, 40]];
      for (const [i, [h, w]] of sizes.entries()) {
        const cls = `c${i % 2}`;
        await Deno.mkdir(`${root}/${cls}`, { recursive: true });
        const data = new Uint8Array(h * w * 3);
        for (let y = 0; y < h; y++) {
          for (let x = 0; x < w * 3; x++) data[y * w * 3 + x] = (x * 5 + y * 3 + r() * 40) & 255;
        }
        await Deno.writeFile(
          `${root}/${cls}/${i}.jpg`,
          encodeJpeg({ data, height: h, width: w, channels: 3 }),
        );
      }
      const ds = new ImageFolder(root, { maxSize: [40, 48], verbose: false });
      assert.deepStrictEqual(ds.filledFields!().map((f) => [f.name, f.shape]), [
        ["image", [40, 48, 3]],
        ["imageSize", [2]],
      ]);
      // Each image's size in the ring: its own, or shrunk to fit keeping its aspect ratio.
      await using plain = new DataLoader(ds, { batchSize: 7 });
      const decoder = new ImageDecoder({});
      for await (const raw of plain) {
        const b = raw as RingBatch, got = b.fields.imageSize as Int32Array;
        for (let k = 0; k < b.size; k++) {
          const img = decoder.decode(await Deno.readFile(ds.path(b.indices[k])), {});
          const f = Math.min(1, 40 / img.height, 48 / img.width);
          const want = [
            Math.max(1, Math.round(img.height * f)),
            Math.max(1, Math.round(img.width * f)),
          ];
          assert.deepStrictEqual([got[2 * k], got[2 * k + 1]], want, ds.path(b.indices[k]));
        }
      }
      // A sample twice in one batch gets its size twice.
      await using twice = new DataLoader(ds, { batchSize: 3, sampler: [4, 4, 0] });
      for await (const raw of twice) {
        const got = (raw as RingBatch).fields.imageSize as Int32Array;
        assert.deepStrictEqual([got[0], got[1]], [got[2], got[3]]);
      }
      await checkModes(
        ds,
        {
          batchSize: 3,
          seed: 5,
          geometry: { size: 16, crop: "random-resized-crop" },
          augment: { flip: true },
        },
        device,
        3,
      );
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
);

Deno.test("the geometry option's refusals name what is wrong", () => {
  const image = { data: new Uint8Array(2 * 3 * 8 * 8), shape: [3, 8, 8] };
  const label = { data: new Uint8Array(2), shape: [] };
  assert.throws(
    () =>
      new DataLoader(new TensorDataset({ image, label }), { batchSize: 1, geometry: { size: 2 } }),
    /geometry needs the dataset's images in a u8 field "image" of \[height, width, channels\]/,
  );
  assert.throws(
    () =>
      new DataLoader(new TensorDataset({ image, label }), {
        batchSize: 1,
        geometry: { size: 2, crops: "center-crop" } as never,
      }),
    /crop/,
  );
  assert.throws(
    () => new ImageFileList(["a.jpg"], [0], { maxSize: [4, 4], size: [2, 2], verbose: false }),
    /maxSize \(variable-size images\) excludes size/,
  );
});
