// ImageFolder's decodeOn "device" end to end: on the CUDA emulator with the nvJPEG stand-in (which
// decodes with libjpeg-turbo, the workers' decoder), toDevice's batches equal the workers' path's
// bit for bit for a folder of JPEGs of different sizes (one grey), with PNGs and a JPEG over
// maxSize among them (those the workers decode, a batch of them alone too), with the loader's
// geometry and augment; a corrupt file is named; leaving early frees every device byte; without
// nvJPEG one line says why and the workers decode (on the CPU backend too).

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { NVJPEG_LIB_ENV } from "../ffi/nvjpeg.ts";
import { DataLoader, type DataLoaderOptions } from "../loader/data_loader.ts";
import { ImageFolder } from "../loader/datasets/image_folder.ts";
import { ImageFileList, type ImageFilesOptions } from "../loader/datasets/image_files.ts";
import { toDevice } from "../pipeline/prefetcher.ts";
import { encodeJpeg } from "../decode/mod.ts";
import { deflateSync } from "node:zlib";
import { cudaIsEmulated } from "./_backends.ts";
import { nvjpegStandIn } from "./_nvjpeg_stand_in.ts";

const LIB = cudaIsEmulated() ? nvjpegStandIn() : undefined;

const SIZES: [number, number][] = [[40, 48], [24, 36], [40, 40], [17, 29], [33, 21], [40, 31], [
  26,
  40,
]];

function pattern(h: number, w: number, k: number): Uint8Array {
  return new Uint8Array(h * w * 3).map((_, i) =>
    ((i % (w * 3)) * 5 + Math.floor(i / (w * 3)) * 7 + ((i >> 4) & 1) * 90 + k * 31) & 255
  );
}

/** An 8-bit RGB PNG. */
function png(h: number, w: number, data: Uint8Array): Uint8Array {
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const chunk = (type: string, body: Uint8Array) => {
    const out = new Uint8Array(12 + body.length), v = new DataView(out.buffer);
    v.setUint32(0, body.length);
    out.set([...type].map((ch) => ch.charCodeAt(0)), 4);
    out.set(body, 8);
    let crc = 0xffffffff;
    for (const b of out.subarray(4, 8 + body.length)) crc = crcTable[(crc ^ b) & 255] ^ (crc >>> 8);
    v.setUint32(8 + body.length, (crc ^ 0xffffffff) >>> 0);
    return out;
  };
  const head = new Uint8Array(13), hv = new DataView(head.buffer);
  hv.setUint32(0, w);
  hv.setUint32(4, h);
  head.set([8, 2, 0, 0, 0], 8);
  const rows = new Uint8Array(h * (1 + w * 3));
  for (let y = 0; y < h; y++) {
    rows.set(data.subarray(y * w * 3, (y + 1) * w * 3), y * (1 + w * 3) + 1);
  }
  const parts = [
    new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", head),
    chunk("IDAT", new Uint8Array(deflateSync(rows))),
    chunk("IEND", new Uint8Array()),
  ];
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  parts.reduce((at, p) => (out.set(p, at), at + p.length), 0);
  return out;
}

/**
 * A folder of RGB JPEGs of SIZES in two classes (patterned, so decoding details matter), and a
 * third class the workers decode even with decodeOn "device": two PNGs and a JPEG larger than
 * maxSize; with a grey JPEG in class1, the last batch of three in file order is [b, c]: the
 * workers decode it all.
 */
async function folder(): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "pinstream-jpeg-loader-" });
  for (const [k, [h, w]] of SIZES.entries()) {
    const dir = `${root}/class${k % 2}`;
    await Deno.mkdir(dir, { recursive: true });
    const data = pattern(h, w, k);
    await Deno.writeFile(`${dir}/${k}.jpg`, encodeJpeg({ data, height: h, width: w, channels: 3 }));
  }
  // A grey JPEG: nvJPEG and the workers both give RGB.
  const grey = pattern(23, 27, 11).subarray(0, 23 * 27);
  await Deno.writeFile(
    `${root}/class1/7.jpg`,
    encodeJpeg({ data: grey, height: 23, width: 27, channels: 1 }),
  );
  await Deno.mkdir(`${root}/class2`);
  await Deno.writeFile(`${root}/class2/a.png`, png(30, 22, pattern(30, 22, 8)));
  await Deno.writeFile(`${root}/class2/b.png`, png(12, 40, pattern(12, 40, 9)));
  const big = pattern(56, 50, 10);
  await Deno.writeFile(
    `${root}/class2/c.jpg`,
    encodeJpeg({ data: big, height: 56, width: 50, channels: 3 }),
  );
  return root;
}

const LOADER: DataLoaderOptions = {
  batchSize: 3,
  shuffle: true,
  seed: 7,
  autoRelease: false,
  geometry: { size: 20, crop: "random-resized-crop", rotation: 10 },
  augment: { flip: true, brightness: 0.2, contrast: 0.2 },
};

/** Every batch of `epochs` epochs, on the host. */
async function epoch(
  root: string,
  device: Device,
  ds: ImageFilesOptions,
  loaderOptions: DataLoaderOptions = LOADER,
  epochs = 1,
): Promise<{ images: number[][]; labels: number[][]; deviceBytes: boolean; samples?: number }> {
  const dataset = new ImageFolder(root, { maxSize: [40, 48], verbose: false, ...ds });
  await using loader = new DataLoader(dataset, loaderOptions);
  await using batches = toDevice(loader, device, {
    mean: [0.5, 0.4, 0.3],
    std: [0.2, 0.25, 0.3],
    dtype: "f32",
  });
  const images: number[][] = [], labels: number[][] = [];
  let deviceBytes = false;
  for (let e = 0; e < epochs; e++) {
    for await (const b of batches) {
      deviceBytes ||= dataset.deviceBytes;
      images.push([...await b.images.toHost() as Float32Array]);
      labels.push([...await b.labels.toHost() as Int32Array]);
    }
  }
  return { images, labels, deviceBytes, samples: batches.stats?.samples };
}

/** Runs `fn` with console.error's lines collected. */
async function lines<T>(fn: () => Promise<T>): Promise<[T, string[]]> {
  const seen: string[] = [], original = console.error;
  console.error = (...args: unknown[]) => seen.push(args.join(" "));
  try {
    return [await fn(), seen];
  } finally {
    console.error = original;
  }
}

Deno.test({
  name: 'ImageFolder decodeOn "device": batches equal the workers\' path bit for bit [cuda]',
  ignore: LIB === undefined,
  async fn() {
    const root = await folder();
    const env = Deno.env.get(NVJPEG_LIB_ENV);
    Deno.env.set(NVJPEG_LIB_ENV, LIB!);
    try {
      using device = Device.open("cuda");
      for (const numWorkers of [0, 1]) {
        const options = { ...LOADER, numWorkers, shuffle: numWorkers === 1 };
        // Two epochs: the second one's shuffle and records differ, the decoder is reused.
        const want = await epoch(root, device, {}, options, 2);
        const [got, said] = await lines(() =>
          epoch(root, device, { decodeOn: "device" }, options, 2)
        );
        assert.deepStrictEqual(said, []);
        assert.ok(got.deviceBytes, "the workers handed the bytes on");
        assert.strictEqual(got.images.length, 8); // 11 files: 3 + 3 + 3 + 2, twice
        assert.deepStrictEqual(got.labels, want.labels);
        assert.deepStrictEqual(got.images, want.images);
        assert.strictEqual(got.samples, 11);
      }
      // No library: one line naming the reason, and the workers decode.
      Deno.env.set(NVJPEG_LIB_ENV, "/nonexistent/libnvjpeg.so");
      const want = await epoch(root, device, {});
      const [got, said] = await lines(() => epoch(root, device, { decodeOn: "device" }));
      assert.strictEqual(said.length, 1);
      assert.match(
        said[0],
        /^pinstream: decodeOn "device": JPEG decoding stays on the workers: .*nonexistent/,
      );
      assert.ok(!got.deviceBytes);
      assert.deepStrictEqual(got, want);
    } finally {
      if (env === undefined) Deno.env.delete(NVJPEG_LIB_ENV);
      else Deno.env.set(NVJPEG_LIB_ENV, env);
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test({
  name: 'ImageFolder decodeOn "device": bad files are named; leaving early frees it all [cuda]',
  ignore: LIB === undefined,
  async fn() {
    const root = await folder();
    const env = Deno.env.get(NVJPEG_LIB_ENV);
    Deno.env.set(NVJPEG_LIB_ENV, LIB!);
    try {
      using device = Device.open("cuda");
      const before = device.memoryAllocated();
      {
        const dataset = new ImageFolder(root, { maxSize: [40, 48], decodeOn: "device" });
        await using loader = new DataLoader(dataset, { ...LOADER, shuffle: false });
        await using batches = toDevice(loader, device, { dtype: "f32" });
        let seen = 0;
        for await (const _ of batches) if (++seen === 1) break;
        assert.strictEqual(seen, 1);
        assert.strictEqual(device.memoryAllocated(), before);
      }
      // The header intact, the data cut short: nvJPEG (the stand-in) refuses it on the device.
      const cut = `${root}/class0/0.jpg`, bytes = await Deno.readFile(cut);
      await Deno.writeFile(cut, bytes.slice(0, Math.floor(bytes.length * 0.6)));
      await assert.rejects(
        () => epoch(root, device, { decodeOn: "device" }, { ...LOADER, shuffle: false }),
        /Cannot decode sample 0 \(.*class0\/0\.jpg\) on the device/,
      );
      assert.strictEqual(device.memoryAllocated(), before);
      // A broken PNG goes to the workers' decoder, which names it as on the workers' path.
      await Deno.writeFile(cut, new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
      await assert.rejects(
        () => epoch(root, device, { decodeOn: "device" }, { ...LOADER, shuffle: false }),
        /Cannot load sample 0 \(.*class0\/0\.jpg\): .*PNG/,
      );
      assert.strictEqual(device.memoryAllocated(), before);
    } finally {
      if (env === undefined) Deno.env.delete(NVJPEG_LIB_ENV);
      else Deno.env.set(NVJPEG_LIB_ENV, env);
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test('ImageFolder decodeOn "device": without nvJPEG one line, and the workers decode', async () => {
  const root = await folder();
  const env = Deno.env.get(NVJPEG_LIB_ENV);
  Deno.env.set(NVJPEG_LIB_ENV, "/nonexistent/libnvjpeg.so");
  try {
    using device = Device.open("cpu");
    const want = await epoch(root, device, {});
    const [got, said] = await lines(() => epoch(root, device, { decodeOn: "device" }));
    assert.strictEqual(said.length, 1);
    assert.match(said[0], /^pinstream: decodeOn "device": JPEG decoding stays on the workers: /);
    assert.ok(!got.deviceBytes);
    assert.deepStrictEqual(got, want);
  } finally {
    if (env === undefined) Deno.env.delete(NVJPEG_LIB_ENV);
    else Deno.env.set(NVJPEG_LIB_ENV, env);
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test('ImageFolder decodeOn "device": options it cannot take are refused', () => {
  assert.throws(
    () => new ImageFileList(["a.jpg"], [0], { decodeOn: "device" }),
    /decodeOn "device" needs maxSize/,
  );
  assert.throws(
    () =>
      new ImageFileList(["a.jpg"], [0], { decodeOn: "device", maxSize: [8, 8], onError: "skip" }),
    /decodeOn "device" needs onError "raise"/,
  );
  assert.throws(
    () => new ImageFileList(["a.jpg"], [0], { decodeOn: "gpu" as "device", maxSize: [8, 8] }),
    /decodeOn should be "workers" or "device"/,
  );
});
