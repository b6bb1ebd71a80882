import assert from "node:assert";
import { join } from "node:path";
import { defaultCollate } from "../loader/collate.ts";
import { DataLoader } from "../loader/data_loader.ts";
import { CIFAR10, CIFAR10_RECORD_BYTES, downloadCIFAR10 } from "../loader/datasets/cifar10.ts";
import {
  FASHION_MNIST_DEBIAN_ROOT,
  FashionMNIST,
  MNIST,
  parseIdx,
} from "../loader/datasets/mnist.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { md5Hex } from "../loader/datasets/_files.ts";
import type { RingBatch } from "../loader/ring.ts";
import { gzip, idxBytes, tarBytes, writeCifar10Files, writeIdxFiles } from "./loader_fixtures.ts";

async function tempDir(): Promise<string> {
  return await Deno.makeTempDir({ prefix: "pinstream-test-" });
}

Deno.test("CIFAR10 reads the official binary format (train: 5 files, 50,000 records in order)", async () => {
  const dir = await tempDir();
  try {
    await writeCifar10Files(dir);
    const train = await CIFAR10.load({ root: dir });
    assert.strictEqual(train.length, 50000);
    for (const i of [0, 9999, 10000, 12345, 49999]) {
      const s = train.get(i);
      assert.strictEqual(s.label, i % 10);
      assert.strictEqual(s.image.length, 3072);
      assert.strictEqual(s.image[0], i & 255);
      assert.strictEqual(s.image[1], (i >> 8) & 255);
    }
    const raw = await Deno.readFile(join(dir, "data_batch_2.bin"));
    assert.deepStrictEqual(train.get(10007).image, raw.subarray(7 * 3073 + 1, 8 * 3073));
    const test = await CIFAR10.load({ root: dir, train: false });
    assert.strictEqual(test.length, 10000);
    assert.throws(() => train.get(50000), /out of range/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("CIFAR10 finds files under cifar-10-batches-bin and feeds the zero-copy loader", async () => {
  const dir = await tempDir();
  try {
    await writeCifar10Files(join(dir, "cifar-10-batches-bin"), { train: false });
    const test = await CIFAR10.load({ root: dir, train: false });
    await using loader = new DataLoader<RingBatch>(test, {
      batchSize: 128,
      numWorkers: 2,
      shuffle: true,
      seed: 1,
      augment: { padding: 4, flip: true },
    });
    assert.deepStrictEqual(loader.ring!.field("image").sampleShape, [3, 32, 32]);
    let n = 0;
    for await (const b of loader) {
      for (let k = 0; k < b.size; k++) {
        const i = b.indices[k];
        assert.strictEqual(b.fields.label[k], i % 10);
        assert.strictEqual(b.fields.image[k * 3072], i & 255);
      }
      n += b.size;
    }
    assert.strictEqual(n, 10000);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("CIFAR10 rejects a truncated file naming it with expected and found sizes", async () => {
  const dir = await tempDir();
  try {
    await Deno.writeFile(join(dir, "test_batch.bin"), new Uint8Array(3073 * 10));
    await assert.rejects(
      CIFAR10.load({ root: dir, train: false }),
      /Cannot read CIFAR-10 file .*test_batch\.bin: expected 30730000 bytes \(10000 records of 3073\), found 30730/,
    );
    const bad = new Uint8Array(10000 * CIFAR10_RECORD_BYTES);
    bad[3073 * 5] = 200;
    await Deno.writeFile(join(dir, "test_batch.bin"), bad);
    await assert.rejects(CIFAR10.load({ root: dir, train: false }), /record 5 .* has label 200/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("CIFAR10 without files says how to get them", async () => {
  const dir = await tempDir();
  try {
    await assert.rejects(
      CIFAR10.load({ root: dir }),
      /data_batch_1\.bin not found .* Pass download: true, or point root \(--data\)/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("CIFAR10 download fetches, checks the MD5 and extracts the archive", async () => {
  const dir = await tempDir();
  const test = new Uint8Array(10000 * CIFAR10_RECORD_BYTES);
  test[0] = 4;
  const archive = await gzip(
    tarBytes([{ name: "cifar-10-batches-bin/test_batch.bin", data: test }]),
  );
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    () =>
      new Response(archive as Uint8Array<ArrayBuffer>, {
        headers: { "content-length": String(archive.length) },
      }),
  );
  const url = `http://127.0.0.1:${server.addr.port}/cifar-10-binary.tar.gz`;
  try {
    const ds = await CIFAR10.load({
      root: dir,
      train: false,
      download: true,
      url,
      md5: md5Hex(archive),
      progress: false,
    });
    assert.strictEqual(ds.get(0).label, 4);
    await assert.rejects(
      downloadCIFAR10(join(dir, "again"), { url, md5: "0".repeat(32), progress: false }),
      /MD5 [0-9a-f]{32} does not match the expected 0{32}/,
    );
  } finally {
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("CIFAR10 download without network fails saying so and how to supply the data", async () => {
  const dir = await tempDir();
  try {
    await assert.rejects(
      downloadCIFAR10(dir, { url: "http://127.0.0.1:9/cifar-10-binary.tar.gz", progress: false }),
      /Cannot download CIFAR-10 .*no network or host unreachable.*--data <dir>/s,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

for (const gz of [false, true]) {
  Deno.test(`MNIST reads IDX files (${gz ? "gzip" : "raw"})`, async () => {
    const dir = await tempDir();
    try {
      await writeIdxFiles(dir, { prefix: "t10k", n: 300, gzip: gz });
      const ds = await MNIST.load({ root: dir, train: false });
      assert.strictEqual(ds.length, 300);
      assert.strictEqual(ds.get(123).label, 3);
      assert.strictEqual(ds.get(123).image[0], 123);
      assert.deepStrictEqual(ds.sharedFields()[0].shape, [1, 28, 28]);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

Deno.test("parseIdx rejects malformed and truncated files with file name and sizes", async () => {
  const good = idxBytes([3, 28, 28], new Uint8Array(3 * 784));
  await assert.rejects(
    parseIdx(good.subarray(0, 1000), "imgs", 3),
    /Cannot read IDX file imgs: expected 2368 bytes \(16-byte header \+ 3 x 28 x 28\), found 1000/,
  );
  await assert.rejects(parseIdx(good, "imgs", 1), /magic 0x00000803, expected 0x00000801/);
  await assert.rejects(
    parseIdx(new Uint8Array([0, 0]), "x", 1),
    /expected at least 4 bytes, found 2/,
  );
  const gz = await gzip(good);
  await assert.rejects(
    parseIdx(gz.subarray(0, gz.length - 20), "imgs.gz", 3),
    /Cannot read imgs\.gz: gzip data is truncated or corrupt/,
  );
});

Deno.test("MNIST rejects images and labels of different counts", async () => {
  const dir = await tempDir();
  try {
    await writeIdxFiles(dir, { prefix: "train", n: 20 });
    await Deno.writeFile(join(dir, "train-labels-idx1-ubyte"), idxBytes([19], new Uint8Array(19)));
    await assert.rejects(MNIST.load({ root: dir }), /has 20 images but .* has 19 labels/);
    await assert.rejects(MNIST.load({ root: join(dir, "nope") }), /Cannot load MNIST: none of/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

const haveFashion = await Deno.stat(FASHION_MNIST_DEBIAN_ROOT).then(() => true, () => false);

Deno.test({
  name: "FashionMNIST reads the real Debian dataset (60,000 + 10,000, 6,000 per class)",
  ignore: !haveFashion,
  async fn() {
    const train = await FashionMNIST.load();
    const test = await FashionMNIST.load({ train: false });
    assert.strictEqual(train.length, 60000);
    assert.strictEqual(test.length, 10000);
    const counts = new Array(10).fill(0);
    for (const l of train.labels) counts[l]++;
    assert.deepStrictEqual(counts, new Array(10).fill(6000));
    // The first training image is an ankle boot (label 9), with a black border.
    assert.strictEqual(train.get(0).label, 9);
    assert.strictEqual(train.get(0).image[0], 0);
    let sum = 0;
    for (let i = 0; i < 784; i++) sum += train.get(0).image[i];
    assert.ok(sum > 10000, "not blank");
    await using loader = new DataLoader<RingBatch>(test, { batchSize: 1000, numWorkers: 2 });
    let n = 0;
    for await (const b of loader) n += b.size;
    assert.strictEqual(n, 10000);
  },
});

Deno.test("TensorDataset serves scalar and shaped fields and rebuilds from its state", () => {
  const ds = new TensorDataset({
    image: { data: Uint8Array.from({ length: 12 }, (_, i) => i), shape: [2, 2] },
    label: new Int32Array([7, 8, 9]),
  });
  assert.strictEqual(ds.length, 3);
  const s = ds.get(1) as { image: Uint8Array; label: number };
  assert.deepStrictEqual([...s.image], [4, 5, 6, 7]);
  assert.strictEqual(s.label, 8);
  const again = TensorDataset.fromState(ds.workerSpec().state as never);
  assert.deepStrictEqual(again.get(2), ds.get(2));
  assert.throws(
    () => new TensorDataset({ a: new Int32Array(3), b: new Int32Array(4) }),
    /field "b" has 4 elements/,
  );
  assert.throws(
    () => new TensorDataset({ a: [1, 2] as unknown as Int32Array }),
    /not a typed array/,
  );
});

Deno.test("defaultCollate stacks like PyTorch's default_collate", () => {
  const b = defaultCollate([
    { img: new Float32Array([1, 2]), y: 1, name: "a", t: [true, 1n] },
    { img: new Float32Array([3, 4]), y: 2, name: "b", t: [false, 2n] },
  ]) as { img: Float32Array; y: Float64Array; name: string[]; t: [Uint8Array, BigInt64Array] };
  assert.deepStrictEqual(b.img, new Float32Array([1, 2, 3, 4]));
  assert.deepStrictEqual(b.y, new Float64Array([1, 2]));
  assert.deepStrictEqual(b.name, ["a", "b"]);
  assert.deepStrictEqual(b.t[0], new Uint8Array([1, 0]));
  assert.deepStrictEqual(b.t[1], new BigInt64Array([1n, 2n]));
  assert.throws(
    () => defaultCollate([new Uint8Array(2), new Uint8Array(3)]),
    /sample 0 is a u8\[2\] but sample 1 is u8\[3\]/,
  );
  assert.throws(() => defaultCollate([{ a: 1 }, { b: 1 }]), /sample 1 has no key "a"/);
  assert.throws(() => defaultCollate([1, "x"]), /sample 0 is a number but sample 1 is a string/);
  assert.throws(() => defaultCollate([]), /non-empty/);
});

Deno.test("a download without --allow-net says which flag to add, not that the network is down", async () => {
  const dir = await Deno.makeTempDir();
  const script = `${dir}/get.ts`;
  try {
    await Deno.writeTextFile(
      script,
      `import { CIFAR10 } from ${JSON.stringify(new URL("../mod.ts", import.meta.url).href)};
      try { await CIFAR10.load({ root: ${JSON.stringify(dir)}, download: true, progress: false }); }
      catch (e) { console.log(e.message); }`,
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--no-prompt", "--allow-read", "--allow-write", "--allow-env", script],
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const msg = new TextDecoder().decode(out.stdout);
    assert.match(
      msg,
      /^Cannot download CIFAR-10 from https:\/\/\S+: Deno denied net access to "[^"]+": run with --allow-net \(/,
    );
    assert.doesNotMatch(msg, /no network/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
