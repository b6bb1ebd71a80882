// Any batch to the device (pipeline/batch_prefetcher.ts): collated batches of several fields,
// nested batches, ring batches of arbitrary fields; byte-for-byte equality with the host
// batches, buffers freed on an early break, refused leaves named by their path.

import assert from "node:assert";
import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import { DataLoader, type DataLoaderOptions } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { BatchPrefetcher } from "../pipeline/batch_prefetcher.ts";
import { DevicePrefetcher, toDevice } from "../pipeline/prefetcher.ts";
import { testEachBackend } from "./_backends.ts";
import { AudioDataset, FRAMES, MASK, TokenDataset } from "./batch_fixtures.ts";

const FIXTURES = new URL("./batch_fixtures.ts", import.meta.url).href;

/** The bytes of a typed array. */
function bytesOf(v: ArrayBufferView): Uint8Array {
  return new Uint8Array(v.buffer, v.byteOffset, v.byteLength).slice();
}

/** Every typed array of a host batch, by path, as bytes (a deep copy: batches get reused). */
function hostLeaves(v: unknown, path = "batch", out = new Map<string, Uint8Array>()) {
  if (ArrayBuffer.isView(v)) out.set(path, bytesOf(v));
  else if (Array.isArray(v)) v.forEach((x, i) => hostLeaves(x, `${path}[${i}]`, out));
  else if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    // A collate's { data, shape } is one tensor.
    if (Object.keys(o).length === 2 && ArrayBuffer.isView(o.data) && Array.isArray(o.shape)) {
      out.set(path, bytesOf(o.data));
    } else for (const [k, x] of Object.entries(o)) hostLeaves(x, `${path}.${k}`, out);
  }
  return out;
}

/** Every tensor of a device batch, by path, read back as bytes. */
async function deviceLeaves(
  v: unknown,
  path = "batch",
  out = new Map<string, Uint8Array>(),
): Promise<Map<string, Uint8Array>> {
  if (v instanceof Tensor) out.set(path, bytesOf(await v.toHost()));
  else if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) await deviceLeaves(v[i], `${path}[${i}]`, out);
  } else if (v !== null && typeof v === "object") {
    for (const [k, x] of Object.entries(v)) await deviceLeaves(x, `${path}.${k}`, out);
  }
  return out;
}

/** The host batches of a loader built by `make`, every leaf copied. */
async function hostBatches<B>(make: () => DataLoader<B>): Promise<Map<string, Uint8Array>[]> {
  await using loader = make();
  const out = [];
  for await (const b of loader) out.push(hostLeaves(b));
  return out;
}

function audioLoader(options: DataLoaderOptions = {}) {
  return new DataLoader(new AudioDataset(37, 3), {
    batchSize: 8,
    shuffle: true,
    seed: 11,
    numWorkers: 1,
    collate: { module: FIXTURES, export: "audioCollate" },
    ...options,
  });
}

for (const copy of ["auto", "always"] as const) {
  testEachBackend(
    `toDevice moves audio, label and mask batches collated by workers byte for byte (copy: ${copy})`,
    async (device) => {
      const want = await hostBatches(() => audioLoader());
      await using loader = audioLoader();
      await using feed = toDevice(loader, device, { copy, depth: 2 });
      assert.ok(feed instanceof BatchPrefetcher);
      const sizes: number[] = [];
      let k = 0;
      for await (const b of feed) {
        const batch = b as { audio: Tensor; label: Tensor; mask: Tensor };
        const n = batch.label.shape[0];
        sizes.push(n);
        assert.deepStrictEqual(batch.audio.shape, [n, FRAMES]);
        assert.deepStrictEqual(batch.mask.shape, [n, MASK]);
        assert.deepStrictEqual(batch.label.shape, [n]);
        assert.deepStrictEqual(
          [batch.audio.dtype, batch.label.dtype, batch.mask.dtype],
          ["f32", "i32", "u8"],
        );
        const got = await deviceLeaves(batch);
        assert.deepStrictEqual([...got.keys()], [...want[k].keys()]);
        for (const [path, bytes] of want[k]) {
          assert.deepStrictEqual(got.get(path), bytes, `batch ${k}: ${path}`);
        }
        k++;
      }
      assert.deepStrictEqual(sizes, [8, 8, 8, 8, 5]);
      assert.strictEqual(feed.stats?.samples, 37);
      assert.strictEqual(feed.stats?.copyBytes, 37 * (FRAMES * 4 + 4 + MASK));
    },
  );
}

testEachBackend(
  "a nested batch { inputs: { ids, mask }, target, names } arrives nested, shaped and equal",
  async (device) => {
    const make = () =>
      new DataLoader(new TokenDataset(10), {
        batchSize: 4,
        numWorkers: 1,
        collate: { module: FIXTURES, export: "tokenCollate" },
      });
    const want = await hostBatches(make);
    await using loader = make();
    await using feed = toDevice(loader, device, { batch: "any", copy: "always", depth: 1 });
    let k = 0;
    for await (const b of feed) {
      const batch = b as {
        inputs: { ids: Tensor; mask: Tensor };
        target: Tensor;
        names: string[];
      };
      const n = k < 2 ? 4 : 2;
      assert.deepStrictEqual(batch.inputs.ids.shape, [n, 3, 4]);
      assert.deepStrictEqual(batch.inputs.mask.shape, [n, 12]);
      assert.deepStrictEqual(batch.target.shape, [n]);
      assert.strictEqual(batch.target.dtype, "f16");
      // Strings pass through unchanged.
      assert.deepStrictEqual(batch.names, [...Array(n)].map((_, i) => `sample${k * 4 + i}`));
      const got = await deviceLeaves(batch);
      // The host's { data, shape } is one tensor in place of the pair.
      assert.deepStrictEqual(got.get("batch.inputs.ids"), want[k].get("batch.inputs.ids"));
      assert.deepStrictEqual(got.get("batch.inputs.mask"), want[k].get("batch.inputs.mask"));
      assert.deepStrictEqual(got.get("batch.target"), want[k].get("batch.target"));
      k++;
    }
    assert.strictEqual(k, 3);
  },
);

testEachBackend(
  "ring batches of fields other than images go through the any-batch path",
  async (device) => {
    const n = 10;
    const x = new Float32Array(n * 6).map((_, i) => i * 0.5 - 3);
    const y = new Int32Array(n).map((_, i) => i * 1001 - 4000);
    const ds = new TensorDataset({
      x: { data: x, shape: [2, 3] },
      y: { data: y, shape: [] },
    });
    await using loader = new DataLoader(ds, { batchSize: 4, autoRelease: false });
    assert.ok(loader.ring !== undefined);
    await using feed = toDevice(loader, device, { copy: "always" });
    assert.ok(feed instanceof BatchPrefetcher);
    let at = 0;
    for await (const b of feed) {
      const m = b.y.shape[0];
      assert.deepStrictEqual(b.x.shape, [m, 2, 3]);
      assert.deepStrictEqual([...await b.x.toHost()], [...x.subarray(at * 6, (at + m) * 6)]);
      assert.deepStrictEqual([...await b.y.toHost()], [...y.subarray(at, at + m)]);
      at += m;
    }
    assert.strictEqual(at, n);
    // An image ring still takes the image path, unless asked otherwise.
    const images = new TensorDataset({
      image: { data: new Uint8Array(4 * 3 * 4 * 4), shape: [3, 4, 4] },
      label: { data: new Int32Array(4), shape: [] },
    });
    await using l2 = new DataLoader(images, { batchSize: 2, autoRelease: false });
    const fast = toDevice(l2, device);
    assert.ok(fast instanceof DevicePrefetcher);
    await fast.dispose();
    await using raw = toDevice(l2, device, { batch: "any" });
    for await (const b of raw) assert.strictEqual(b.image.dtype, "u8");
  },
);

async function leaksAfter(device: Device, body: () => Promise<void>): Promise<void> {
  const objects = device.liveObjects(), bytes = device.memoryAllocated();
  await body();
  assert.deepStrictEqual(device.liveObjects(), objects);
  assert.strictEqual(device.memoryAllocated(), bytes);
}

testEachBackend(
  "leaving the loop early frees every pinned and device buffer of the any-batch path",
  async (device) => {
    for (const copy of ["auto", "always"] as const) {
      await leaksAfter(device, async () => {
        await using loader = audioLoader({ numWorkers: 0 });
        await using feed = toDevice(loader, device, { batch: "any", copy, depth: 3 });
        let k = 0;
        for await (const b of feed) {
          assert.ok(b !== undefined);
          // Mid-epoch the prefetcher holds its buffers.
          assert.ok(device.liveObjects().allocations > 0);
          if (++k === 2) break;
        }
        assert.strictEqual(k, 2);
      });
    }
  },
);

testEachBackend(
  "numbers the default collate made a Float64Array arrive as f32, each rounded to the nearest float32",
  async (device) => {
    const weight = (i: number) => i / 3 + 1e-9;
    const dataset = {
      length: 5,
      get: (i: number) => ({
        x: new Float32Array([i, i + 0.5]),
        weight: weight(i),
        // Past float32's range: rounds to Infinity, as Math.fround does.
        big: i === 3 ? -1e300 : i * 1e30,
      }),
    };
    await leaksAfter(device, async () => {
      await using loader = new DataLoader(dataset, { batchSize: 2 });
      await using feed = toDevice(loader, device);
      const weights: number[] = [], bigs: number[] = [];
      for await (const b of feed) {
        const batch = b as unknown as Record<string, Tensor>;
        assert.strictEqual(batch.weight.dtype, "f32");
        assert.deepStrictEqual(batch.weight.shape, [batch.x.shape[0]]);
        weights.push(...await batch.weight.toHost() as Float32Array);
        bigs.push(...await batch.big.toHost() as Float32Array);
      }
      const want = [0, 1, 2, 3, 4];
      assert.deepStrictEqual(weights, want.map((i) => Math.fround(weight(i))));
      assert.deepStrictEqual(bigs, [
        0,
        Math.fround(1e30),
        Math.fround(2e30),
        -Infinity,
        Math.fround(4e30),
      ]);
    });
  },
);

testEachBackend("a leaf without a device dtype is refused, naming its path", async (device) => {
  const cases: [unknown, RegExp][] = [
    [
      { inputs: { ids: new BigInt64Array(4) } },
      /Cannot move batch\.inputs\.ids to the device: a BigInt64Array has no device dtype/,
    ],
    [{ y: [new Float32Array(2), new Uint16Array(2)] }, /batch\.y\[1\].*a Uint16Array/],
    [{ raw: new ArrayBuffer(8) }, /batch\.raw.*an untyped ArrayBuffer/],
    [{ x: new Float32Array(3) }, /batch\.x.*3 elements are not a multiple of the batch's 2/],
    [{ x: { data: new Uint8Array(6), shape: [2, 4] } }, /batch\.x.*shape \[2, 4\] does not hold/],
  ];
  for (const [batch, re] of cases) {
    await leaksAfter(device, async () => {
      await using loader = new DataLoader({ length: 4, get: (i: number) => i }, {
        batchSize: 2,
        collate: () => batch,
      });
      await using feed = toDevice(loader, device);
      await assert.rejects(async () => {
        for await (const _ of feed) { /* the first batch throws */ }
      }, re);
    });
  }
});

Deno.test("[cpu] toDevice refuses image options on the any-batch path and unknown keys", async () => {
  const { Device } = await import("../ffi/device.ts");
  using device = Device.open("cpu");
  await using loader = new DataLoader({ length: 4, get: (i: number) => i }, { batchSize: 2 });
  assert.throws(
    () => toDevice(loader, device, { batch: "any", mean: [0.5] } as never),
    /mean is an option of the image path, which batch: "any" does not take/,
  );
  assert.throws(
    () => new BatchPrefetcher(loader, device, { dept: 2 } as never),
    /dept.*depth/,
  );
  assert.throws(() => toDevice(loader, device, { batch: "all" } as never), /batch must be one of/);
});

testEachBackend(
  "batches of changing sizes: staging grows to the largest, a persistent feed reuses it next epoch",
  async (device) => {
    const sizes = [2, 6, 3, 6, 1];
    const batches: number[][] = [];
    for (let at = 0, k = 0; k < sizes.length; at += sizes[k++]) {
      batches.push([...Array(sizes[k])].map((_, i) => at + i));
    }
    const length = batches.flat().length;
    const dataset = {
      length,
      get: (i: number) => ({ x: new Float32Array(100).map((_, j) => i * 1000 + j), y: i }),
    };
    const before = device.liveObjects(), bytes = device.memoryAllocated();
    await using loader = new DataLoader(dataset, {
      batchSampler: { length: batches.length, [Symbol.iterator]: () => batches.values() },
      collate: (s: { x: Float32Array; y: number }[]) => ({
        x: new Float32Array(s.flatMap((v) => [...v.x])),
        y: new Int32Array(s.map((v) => v.y)),
      }),
    });
    await using feed = toDevice(loader, device, { copy: "always", depth: 1, persistent: true });
    const after: { objects: unknown; bytes: number }[] = [];
    for (let epoch = 0; epoch < 2; epoch++) {
      let k = 0;
      for await (const b of feed) {
        assert.deepStrictEqual(b.x.shape, [sizes[k], 100]);
        assert.deepStrictEqual([...await b.y.toHost()], batches[k]);
        const x = await b.x.toHost();
        assert.deepStrictEqual(
          [x[0], x[x.length - 1]],
          [batches[k][0] * 1000, batches[k].at(-1)! * 1000 + 99],
        );
        k++;
      }
      assert.strictEqual(k, sizes.length);
      after.push({ objects: device.liveObjects(), bytes: device.memoryAllocated() });
    }
    // The second epoch allocated nothing the first did not already hold.
    assert.deepStrictEqual(after[1], after[0]);
    await feed.dispose();
    assert.deepStrictEqual(device.liveObjects(), before);
    assert.strictEqual(device.memoryAllocated(), bytes);
  },
);

testEachBackend(
  "without batching (batchSize: null) a sample's arrays keep their length",
  async (device) => {
    const dataset = { length: 3, get: (i: number) => ({ x: new Float32Array(5).fill(i), i }) };
    await using loader = new DataLoader(dataset, { batchSize: null });
    await using feed = toDevice(loader, device, { copy: "always" });
    let k = 0;
    for await (const b of feed) {
      assert.deepStrictEqual(b.x.shape, [5]);
      assert.deepStrictEqual([...await b.x.toHost()], [k, k, k, k, k]);
      assert.strictEqual(b.i, k++);
    }
    assert.strictEqual(k, 3);
  },
);

testEachBackend(
  "stats and history name each epoch the loader ran, from its first",
  async (device) => {
    const dataset = { length: 5, get: (i: number) => ({ x: new Float32Array(4).fill(i) }) };
    await using loader = new DataLoader(dataset, { batchSize: 2 });
    loader.setEpoch(3);
    await using feed = new BatchPrefetcher(loader, device, { copy: "always" });
    for (let e = 0; e < 2; e++) {
      for await (const _ of feed) assert.strictEqual(feed.stats?.epoch, 3 + e);
    }
    assert.deepStrictEqual(feed.history.map((s) => [s.epoch, s.batches, s.samples]), [
      [3, 3, 5],
      [4, 3, 5],
    ]);
  },
);
