import { wasmOutputCopies, wasmResizeAvailable } from "../decode/_simd.ts";
import assert from "node:assert";
import { join } from "node:path";
import { DataLoader } from "../loader/data_loader.ts";
import { DistributedSampler } from "../loader/sampler.ts";
import { Subset } from "../loader/datasets/subset.ts";
import { defaultCollate } from "../loader/collate.ts";
import {
  ImageFileList,
  type ImageSample,
  randomResizedCropBox,
} from "../loader/datasets/image_files.ts";
import { ImageFolder } from "../loader/datasets/image_folder.ts";
import { ImageDecoder } from "../decode/mod.ts";
import { fixtures } from "./_image_fixtures.ts";
import { afterLoaderDraws, LOADER_DRAWS, type SharedFieldsOf } from "../loader/dataset.ts";
import { sampleContext } from "../loader/_fetch.ts";
import { GEOMETRY_FIRST_DRAW } from "../augment/geometry.ts";

// The ring batch of an image dataset types its decoded images too.
const typed: SharedFieldsOf<ImageFolder> extends { image: Uint8Array; label: Int32Array } ? true
  : false = true;
void typed;

const dirP = fixtures();
const noFixtures = dirP === undefined;
const nativeWhy = (() => {
  try {
    new ImageDecoder({ backend: "native" });
    return "";
  } catch (e) {
    return (e as Error).message;
  }
})();
const ignore = noFixtures || nativeWhy !== "";
if (noFixtures) {
  console.error("image_files_test: no Python with Pillow: image dataset tests ignored");
} else if (nativeWhy) console.error(`image_files_test: ${nativeWhy}: image dataset tests ignored`);

/**
 * A class folder from the generated images: "a" holds the JPEGs, "b" the PNGs (one PNG
 * renamed .jpg, one JPEG renamed .png: the type comes from the bytes), "c" nested folders;
 * plus files to leave out (text, an unknown extension).
 */
async function makeFolder(src: string): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "pinstream-imagefolder-" });
  for (const c of ["b", "a", "c", "c/deep/er"]) {
    await Deno.mkdir(join(root, c), { recursive: true });
  }
  const cp = (from: string, to: string) => Deno.copyFile(join(src, from), join(root, to));
  await cp("rgb_500x375_s2_q90.jpg", "a/0.jpg");
  await cp("rgb_37x23_s2_q90.jpg", "a/1.JPEG");
  await cp("progressive.jpg", "a/2.jpeg");
  await cp("grey.jpg", "a/3.jpg");
  await cp("cmyk.jpg", "a/4.jpg");
  await cp("rgb.png", "b/0.png");
  await cp("palette.png", "b/1.jpg");
  await cp("rgb_64x48_s0_q95.jpg", "b/2.png");
  await cp("rgba.png", "c/0.png");
  await cp("exif6.jpg", "c/deep/1.jpg");
  await cp("grey16.png", "c/deep/er/2.png");
  await Deno.writeTextFile(join(root, "a", "notes.txt"), "not an image");
  await cp("rgb.png", "b/skip.gif");
  return root;
}

Deno.test({
  name:
    "ImageFolder follows torchvision: sorted classes, classToIndex, sorted recursive files, extensions",
  ignore,
  fn: async () => {
    const root = await makeFolder(await dirP!);
    try {
      const ds = new ImageFolder(root, { verbose: false });
      assert.deepStrictEqual(ds.classes, ["a", "b", "c"]);
      assert.deepStrictEqual(ds.classToIndex, { a: 0, b: 1, c: 2 });
      const rel = Array.from({ length: ds.length }, (_, i) => ds.path(i).slice(root.length + 1));
      assert.deepStrictEqual(rel, [
        "a/0.jpg",
        "a/1.JPEG",
        "a/2.jpeg",
        "a/3.jpg",
        "a/4.jpg",
        "b/0.png",
        "b/1.jpg",
        "b/2.png",
        "c/0.png",
        "c/deep/1.jpg",
        "c/deep/er/2.png",
      ]);
      assert.deepStrictEqual([...ds.labels], [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
      // The type from the bytes: a PNG named .jpg and a JPEG named .png decode.
      const s1 = (await ds.get(6)) as ImageSample, s2 = (await ds.get(7)) as ImageSample;
      assert.deepStrictEqual([s1.height, s1.width, s1.label], [31, 45, 1]);
      assert.deepStrictEqual([s2.height, s2.width, s2.image.length], [48, 64, 48 * 64 * 3]);
      const gif = new ImageFolder(root, { extensions: [".gif"], allowEmpty: true, verbose: false });
      assert.deepStrictEqual(rel.length, 11);
      assert.strictEqual(gif.length, 1);
      const onlyB = new ImageFolder(root, {
        isValidFile: (p) => p.includes("/b/"),
        allowEmpty: true,
        verbose: false,
      });
      assert.deepStrictEqual([...onlyB.labels], [1, 1, 1, 1]);
      assert.throws(
        () => new ImageFolder(root, { extensions: [".gif"], verbose: false }),
        /found no valid file for class folder\(s\) a, c in .*Allowed extensions: \.gif/,
      );
      assert.throws(
        () => new ImageFolder(root, { extensions: [".png"], isValidFile: () => true }),
        /both extensions and isValidFile given/,
      );
      assert.throws(() => new ImageFolder(join(root, "a")), /no class folder found in/);
      assert.throws(() => new ImageFolder(join(root, "nope")), /Cannot read ImageFolder root/);
      assert.throws(
        () => new ImageFolder(root, { chanels: 3 } as never),
        /unknown option "chanels" \(did you mean "channels"\?\)/,
      );
      assert.throws(
        () => new ImageFolder(root, { size: [0, 3] }),
        /size should be \[height, width\]/,
      );
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test({
  name: "ImageFileList from arrays and from a CSV (quoted fields, names or indices)",
  ignore,
  fn: async () => {
    const src = await dirP!;
    const dir = await Deno.makeTempDir({ prefix: "pinstream-filelist-" });
    try {
      await Deno.writeTextFile(
        join(dir, "list.csv"),
        `id,path,label\n1,${join(src, "rgb.png")},cat\n2,"${join(src, "grey.jpg")}",dog\n3,${
          join(src, "rgb.png")
        },"cat"\n`,
      );
      const ds = await ImageFileList.fromCsv(join(dir, "list.csv"), { verbose: false });
      assert.deepStrictEqual(ds.classes, ["cat", "dog"]);
      assert.deepStrictEqual([...ds.labels], [0, 1, 0]);
      const g = (await ds.get(1)) as ImageSample;
      assert.deepStrictEqual([g.height, g.width, g.label], [61, 97, 1]);
      await Deno.writeTextFile(join(dir, "rel.csv"), "file,y\nrgb.png,2\ngrey.jpg,0\n");
      const rel = await ImageFileList.fromCsv(join(dir, "rel.csv"), {
        pathColumn: "file",
        labelColumn: "y",
        root: src,
        verbose: false,
      });
      assert.deepStrictEqual([...rel.labels], [2, 0]);
      assert.deepStrictEqual(rel.classes, ["0", "1", "2"]);
      assert.strictEqual(rel.path(0), join(src, "rgb.png"));
      await assert.rejects(
        ImageFileList.fromCsv(join(dir, "rel.csv")),
        /expected columns "path" and "label" in the header, found "file", "y"/,
      );
      assert.throws(() => new ImageFileList(["a.png"], [0, 1]), /1 paths but 2 labels/);
      assert.throws(
        () => new ImageFileList(["a.png"], ["x"], { classes: ["y"] }),
        /label "x" of a\.png is not one of the classes/,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

/** A short digest of bytes. */
function digest(b: Uint8Array): string {
  let h = 0x811c9dc5;
  for (const v of b) h = Math.imul(h ^ v, 0x01000193);
  return `${b.length}:${(h >>> 0).toString(16)}`;
}

/** The (image digest, label) pairs a loader yields over an epoch, sorted. */
async function epoch(loader: AsyncIterable<unknown>): Promise<string[]> {
  const seen: string[] = [];
  for await (const b of loader) {
    // A RingBatch (zero-copy path: `size` set) has its fields under `fields`, sized `size`.
    const ring = b as { fields?: Record<string, Uint8Array | Int32Array>; size?: number };
    const batch = (ring.fields ?? b) as { image: Uint8Array; label: ArrayLike<number> };
    const n = ring.size ?? batch.label.length;
    const per = batch.image.length / batch.label.length;
    for (let k = 0; k < n; k++) {
      seen.push(`${digest(batch.image.subarray(k * per, (k + 1) * per))} ${batch.label[k]}`);
    }
  }
  return seen.sort();
}

Deno.test({
  name:
    "ImageFolder with a fixed size feeds the DataLoader at 0 and 2 workers, shuffled, and DistributedSampler",
  ignore,
  fn: async () => {
    const root = await makeFolder(await dirP!);
    try {
      const ds = new ImageFolder(root, { size: [40, 48], verbose: false });
      const dec = new ImageDecoder();
      const reference = Array.from({ length: ds.length }, (_, i) => {
        const img = dec.decode(Deno.readFileSync(ds.path(i)), { size: [40, 48] });
        assert.strictEqual(img.data.length, 40 * 48 * 3);
        return `${digest(img.data)} ${ds.labels[i]}`;
      }).sort();
      assert.strictEqual(new Set(reference).size, ds.length);
      const refOf = (i: number) => {
        const img = dec.decode(Deno.readFileSync(ds.path(i)), { size: [40, 48] });
        return `${digest(img.data)} ${ds.labels[i]}`;
      };
      for (const numWorkers of [0, 2]) {
        await using loader = new DataLoader(ds, {
          batchSize: 4,
          numWorkers,
          shuffle: true,
          seed: 3,
        });
        // Decoded straight into the ring's slots.
        assert.ok(loader.zeroCopy);
        assert.deepStrictEqual(loader.ring!.field("image").sampleShape, [40, 48, 3]);
        assert.deepStrictEqual(await epoch(loader), reference, `${numWorkers} workers`);
        assert.deepStrictEqual(await epoch(loader), reference, `${numWorkers} workers, again`);
      }
      // A Subset keeps the zero-copy decode; the generic path (a collate) gives the same.
      const sub = new Subset(ds, [10, 3, 5]);
      await using subLoader = new DataLoader(sub, { batchSize: 2, numWorkers: 2 });
      assert.ok(subLoader.zeroCopy);
      assert.deepStrictEqual(await epoch(subLoader), [10, 3, 5].map(refOf).sort());
      await using generic = new DataLoader(ds, {
        batchSize: 4,
        numWorkers: 2,
        collate: defaultCollate,
      });
      assert.ok(!generic.zeroCopy);
      assert.deepStrictEqual(await epoch(generic), reference);
      const union: string[] = [];
      for (const rank of [0, 1]) {
        const sampler = new DistributedSampler(ds, { worldSize: 2, rank, seed: 5, dropLast: true });
        await using loader = new DataLoader(ds, { batchSize: 3, numWorkers: 2, sampler });
        const part = await epoch(loader);
        assert.strictEqual(part.length, 5);
        union.push(...part);
      }
      // 11 samples over 2 ranks, dropLast: 10 distinct samples, none twice.
      assert.strictEqual(new Set(union).size, 10);
      assert.ok(union.every((u) => reference.includes(u)));
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

/** A folder with one good file per class and the bad files of `bad` (name -> bytes). */
async function badFolder(src: string, bad: Record<string, Uint8Array>): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "pinstream-badimages-" });
  await Deno.mkdir(join(root, "a"));
  await Deno.mkdir(join(root, "b"));
  await Deno.copyFile(join(src, "rgb.png"), join(root, "a", "0.png"));
  await Deno.copyFile(join(src, "rgb_64x48_s0_q95.jpg"), join(root, "a", "1.jpg"));
  await Deno.copyFile(join(src, "grey.png"), join(root, "b", "0.png"));
  for (const [name, bytes] of Object.entries(bad)) await Deno.writeFile(join(root, name), bytes);
  return root;
}

Deno.test({
  name: "bad files fail their batch naming the sample, the file and the reason; the loader goes on",
  ignore,
  fn: async () => {
    const src = await dirP!;
    const jpeg = Deno.readFileSync(join(src, "rgb_500x375_s2_q90.jpg"));
    const corrupt = jpeg.slice();
    corrupt.fill(0x55, 700, 2000);
    const cases: [string, Uint8Array, RegExp, number?][] = [
      ["b/1.jpg", jpeg.subarray(0, 20000), /JPEG data is truncated/],
      ["b/1.jpg", corrupt, /JPEG data is corrupt|JPEG data is truncated/],
      ["b/1.jpg", new Uint8Array(), /the file is empty \(0 bytes\)/],
      ["b/1.jpg", new TextEncoder().encode("<html>"), /not a JPEG or PNG file/],
      ["b/1.jpg", jpeg, /image of 500x375 = 187500 pixels exceeds the limit of 100000/, 100_000],
    ];
    for (const [name, bytes, reason, maxPixels] of cases) {
      const root = await badFolder(src, { [name]: bytes });
      try {
        const ds = new ImageFolder(root, { size: [32, 32], maxPixels, verbose: false });
        const bad = 3; // a/0.png, a/1.jpg, b/0.png, b/1.jpg
        for (const numWorkers of [0, 2]) {
          await using loader = new DataLoader(ds, { batchSize: 2, numWorkers });
          const message = `Cannot load sample ${bad} \\(${join(root, name)}\\): `;
          await assert.rejects(epoch(loader), (e: Error) => {
            assert.match(e.message, new RegExp(message));
            assert.match(e.message, reason);
            assert.strictEqual((e as { index?: number }).index ?? bad, bad);
            return true;
          }, `${name} ${reason} ${numWorkers} workers`);
          // The loader keeps working: with the file mended, the next epoch is whole.
          await Deno.copyFile(join(src, "grey.jpg"), join(root, name));
          assert.strictEqual((await epoch(loader)).length, 4);
          await Deno.writeFile(join(root, name), bytes);
        }
      } finally {
        await Deno.remove(root, { recursive: true });
      }
    }
  },
});

Deno.test({
  name:
    'onError: "skip" leaves bad files out of their batch, counts them across workers and says so',
  ignore,
  fn: async () => {
    const src = await dirP!;
    const jpeg = Deno.readFileSync(join(src, "rgb_500x375_s2_q90.jpg"));
    // In sorted order: a/0.png (removed after the scan: unreadable), a/1.jpg, a/2.jpg (over
    // maxPixels), b/0.png, b/1.jpg (truncated), b/2.png, b/3.png (empty), b/4.png: one good
    // file in each batch of two.
    const root = await badFolder(src, {
      "a/2.jpg": jpeg,
      "b/1.jpg": jpeg.subarray(0, 20000),
      "b/2.png": Deno.readFileSync(join(src, "palette.png")),
      "b/3.png": new Uint8Array(),
      "b/4.png": Deno.readFileSync(join(src, "bilevel.png")),
    });
    try {
      const ds = new ImageFolder(root, {
        size: [32, 32],
        maxPixels: 100_000,
        onError: "skip",
        verbose: false,
      });
      assert.strictEqual(ds.length, 8);
      // A file that vanishes after the scan cannot be read: skipped too.
      await Deno.remove(join(root, "a", "0.png"));
      let count = 0;
      for (const numWorkers of [0, 2]) {
        await using loader = new DataLoader(ds, { batchSize: 2, numWorkers });
        for (let e = 0; e < 2; e++) {
          const sizes: number[] = [];
          for await (const b of loader) sizes.push((b as { label: Float64Array }).label.length);
          assert.deepStrictEqual(sizes, [1, 1, 1, 1], `${numWorkers} workers`);
          count += 4;
          assert.strictEqual(ds.skipped, count);
        }
      }
      // Every sample of a batch skipped: that batch fails, naming its indices.
      await using loader = new DataLoader(ds, { batchSize: 3, sampler: [0, 2, 4, 1, 3, 5, 6, 7] });
      await assert.rejects(
        epoch(loader),
        /the dataset skipped all of its 3 samples \(indices 0, 2, 4\)/,
      );
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test({
  name:
    "without FFI permission the workers decode PNG and JPEG in TypeScript, say so, and give libjpeg-turbo's pixels",
  ignore: noFixtures,
  fn: async () => {
    const src = await dirP!;
    const root = await badFolder(src, {
      "b/1.jpg": Deno.readFileSync(join(src, "progressive.jpg")),
      "b/2.jpg": Deno.readFileSync(join(src, "rgb_500x375_s2_q90.jpg")),
      "b/3.jpg": Deno.readFileSync(join(src, "cmyk.jpg")),
    });
    try {
      // The native decoders' pixels (DCT scaling and the resize), before a file is spoilt.
      const ds = new ImageFolder(root, { size: [24, 20], decoder: "native", verbose: false });
      const want: number[] = [];
      for await (const b of new DataLoader(ds, { batchSize: 2 })) {
        const ring = b as { fields?: Record<string, Uint8Array>; size?: number };
        const image = (ring.fields ?? b as unknown as Record<string, Uint8Array>).image;
        want.push(...image.subarray(0, (ring.size ?? 2) * 24 * 20 * 3));
      }
      const folder = new URL("../loader/datasets/image_folder.ts", import.meta.url).href;
      const loader = new URL("../loader/data_loader.ts", import.meta.url).href;
      const code = `
        import { ImageFolder } from ${JSON.stringify(folder)};
        import { DataLoader } from ${JSON.stringify(loader)};
        const ds = new ImageFolder(${JSON.stringify(root)}, { size: [24, 20] });
        const images = [];
        for await (const b of new DataLoader(ds, { batchSize: 2, numWorkers: 2 })) {
          images.push(...(b.fields?.image ?? b.image).subarray(0, b.size * 24 * 20 * 3));
        }
        console.log(JSON.stringify(images));
        const bad = new ImageFolder(${JSON.stringify(root)}, { verbose: false });
        await Deno.writeFile(bad.path(1), new Uint8Array([0xff, 0xd8, 0xff, 0xc9, 0, 11]));
        try {
          for await (const _ of new DataLoader(bad, { batchSize: 3, numWorkers: 1 })) {}
        } catch (e) { console.error(e.message); }
      `;
      const file = join(root, "main.ts");
      await Deno.writeTextFile(file, code);
      // No --allow-ffi: the workers get the same permissions.
      const r = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--no-check",
          "--no-config",
          "--allow-read",
          "--allow-write",
          "--allow-env",
          file,
        ],
      }).output();
      const out = new TextDecoder().decode(r.stdout), err = new TextDecoder().decode(r.stderr);
      assert.ok(r.success, err);
      // One line, from worker 0 only.
      const lines = err.split("\n").filter((l) => l.includes("image decoders:"));
      assert.strictEqual(lines.length, 1, err);
      assert.match(
        lines[0],
        /JPEG TypeScript fallback \(no FFI permission \(--allow-ffi\) to load libturbojpeg\.so\.0\); PNG TypeScript fallback \(no FFI permission \(--allow-ffi\) to load libspng\.so\.0\)/,
      );
      const got = Uint8Array.from(JSON.parse(out.trim().split("\n")[0]));
      assert.strictEqual(got.length, 6 * 24 * 20 * 3);
      assert.deepStrictEqual(got, Uint8Array.from(want));
      // A file only libjpeg-turbo decodes fails its batch naming the file and what to install.
      assert.match(
        err,
        /Cannot load sample 1 \(.*a\/1\.jpg\): arithmetic-coded JPEG \(SOF9\) is not decoded by the TypeScript fallback \(libjpeg-turbo decodes it: apt-get install libturbojpeg0, and --allow-ffi\)/,
      );
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test({
  name:
    "randomResizedCrop: the sample's stream picks the region, the same on both paths and at any worker count",
  ignore,
  fn: async () => {
    const root = await makeFolder(await dirP!);
    try {
      const rrc = { size: 24 };
      const ds = new ImageFolder(root, { randomResizedCrop: rrc, verbose: false });
      assert.deepStrictEqual(ds.size, [24, 24]);
      const batches = async (o: Record<string, unknown>) => {
        const out: string[] = [];
        await using loader = new DataLoader(ds, { batchSize: 4, seed: 9, ...o });
        for await (const b of loader) {
          const ring = b as { fields?: Record<string, Uint8Array>; size?: number };
          const image = (ring.fields ?? b as unknown as Record<string, Uint8Array>).image;
          out.push(digest(image.subarray(0, (ring.size ?? image.length / 1728) * 1728)));
        }
        return out;
      };
      const copies = wasmOutputCopies();
      const zero = await batches({ numWorkers: 0 });
      // The resize wrote every crop into its ring slot itself: no copy out of its memory.
      if (wasmResizeAvailable()) assert.strictEqual(wasmOutputCopies(), copies);
      assert.deepStrictEqual(await batches({ numWorkers: 2 }), zero);
      assert.deepStrictEqual(await batches({ numWorkers: 1, collate: defaultCollate }), zero);
      // Another seed draws other regions.
      assert.notDeepStrictEqual(await batches({ numWorkers: 0, seed: 10 }), zero);
      // A region that can only be the whole image: the plain resize.
      const whole = new ImageFolder(root, {
        randomResizedCrop: { size: [30, 40], scale: [1, 1], ratio: [4 / 3, 4 / 3] },
        extensions: ["0.jpg"],
        allowEmpty: true,
        verbose: false,
      });
      const plain = new ImageDecoder().decode(Deno.readFileSync(whole.path(0)), { size: [30, 40] });
      assert.strictEqual(digest(((await whole.get(0)) as ImageSample).image), digest(plain.data));
      assert.throws(
        () => new ImageFolder(root, { size: [8, 8], randomResizedCrop: rrc }),
        /both size and randomResizedCrop given/,
      );
      assert.throws(
        () => new ImageFolder(root, { randomResizedCrop: { size: 8, scale: [0, 1] } }),
        /randomResizedCrop\.scale should be \[lo, hi\] with 0 < lo <= hi <= 1/,
      );
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test({
  name: "randomResizedCrop in the workers draws after the loader's records, not with them",
  ignore,
  fn: async () => {
    // The augment record takes draws 0-6 (offsets and flip from draw 0), the geometry record
    // 32 on (one angle, then 4 per crop attempt, 10 attempts): all below LOADER_DRAWS.
    assert.ok(GEOMETRY_FIRST_DRAW + 1 + 4 * 10 <= LOADER_DRAWS);
    const root = await makeFolder(await dirP!);
    try {
      const rrc = { size: 16, scale: [0.1, 0.5] as [number, number] };
      const ds = new ImageFolder(root, { randomResizedCrop: rrc, verbose: false });
      const bytes = Deno.readFileSync(ds.path(0));
      for (let position = 0; position < 6; position++) {
        const ctx = () => sampleContext(9, 2, position, -1);
        const got = ((await ds.get(0, ctx())) as ImageSample).image;
        const box = (from: () => number) => (h: number, w: number) =>
          randomResizedCropBox(h, w, rrc.scale, [3 / 4, 4 / 3], from);
        const decoder = new ImageDecoder();
        const want = decoder.decode(bytes, { size: [16, 16], crop: box(afterLoaderDraws(ctx())) });
        assert.strictEqual(digest(got), digest(want.data), `position ${position}`);
        // The region drawn from the stream's start (the augment record's draws) differs.
        const c0 = ctx();
        const early = decoder.decode(bytes, { size: [16, 16], crop: box(() => c0.random()) });
        assert.notStrictEqual(digest(early.data), digest(got), `position ${position}`);
      }
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});
