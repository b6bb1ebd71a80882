// Subset, ConcatDataset and randomSplit, alone and through the DataLoader on both paths and
// with workers (which rebuild them from the datasets they wrap).

import assert from "node:assert";
import { DataLoader } from "../loader/data_loader.ts";
import { ConcatDataset, randomSplit, Subset } from "../loader/datasets/subset.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import type { RingBatch } from "../loader/ring.ts";
import { FaultyDataset, type FaultySample } from "./loader_fixtures.ts";

/** 30 samples: label i and a 2x2 "image" filled with i. */
function labelled(n = 30): TensorDataset {
  const image = new Uint8Array(n * 4);
  for (let i = 0; i < n; i++) image.fill(i, i * 4, i * 4 + 4);
  return new TensorDataset({
    image: { data: image, shape: [1, 2, 2] },
    label: Int32Array.from({ length: n }, (_, i) => i),
  });
}

Deno.test("Subset serves the wrapped dataset's samples at its indices, and refuses bad ones", () => {
  const base = { length: 5, get: (i: number) => i * 10 };
  const s = new Subset(base, [4, 0, 0, 2]);
  assert.strictEqual(s.length, 4);
  assert.deepStrictEqual([0, 1, 2, 3].map((i) => s.get(i)), [40, 0, 0, 20]);
  assert.throws(() => s.get(4), /Cannot get sample 4: out of range for a Subset of 4/);
  assert.throws(() => new Subset(base, [1, 5]), /indices\[1\] is 5, not an index of .* 5 samples/);
  assert.throws(() => new Subset(base, [0.5]), /indices\[0\] is 0.5/);
  assert.strictEqual(s.workerSpec, undefined, "a plain object cannot be rebuilt in workers");
  assert.strictEqual(s.sharedFields, undefined);
});

for (const numWorkers of [0, 2]) {
  Deno.test(`a Subset of a zero-copy dataset is gathered in place (numWorkers ${numWorkers})`, async () => {
    const base = labelled();
    const picks = [29, 3, 3, 17, 0, 8, 21];
    const sub = new Subset(new Subset(base, [...Array(30).keys()].reverse()), picks); // nested
    await using loader = new DataLoader<RingBatch>(sub, {
      batchSize: 3,
      numWorkers,
      augment: { padding: 1, flip: true },
      seed: 4,
    });
    assert.ok(loader.zeroCopy);
    const labels: number[] = [], pixels: number[] = [];
    for await (const b of loader) {
      labels.push(...(b.fields.label as Int32Array));
      pixels.push(
        ...Array.from({ length: b.size }, (_, k) => (b.fields.image as Uint8Array)[k * 4]),
      );
    }
    const want = picks.map((p) => 29 - p);
    assert.deepStrictEqual(labels, want);
    assert.deepStrictEqual(pixels, want);
  });
}

Deno.test("a Subset's zero-copy batches and augment draws do not depend on numWorkers", async () => {
  const sub = new Subset(labelled(), [5, 9, 1, 28, 14, 2, 7, 7, 0, 11]);
  let first: unknown;
  for (const numWorkers of [0, 1, 2]) {
    await using loader = new DataLoader<RingBatch>(sub, {
      batchSize: 4,
      shuffle: true,
      seed: 11,
      numWorkers,
      augment: { padding: 2, flip: true },
    });
    const got = [];
    for await (const b of loader) {
      got.push([[...(b.fields.label as Int32Array)], [...b.augment!]]);
    }
    if (first === undefined) first = got;
    else assert.deepStrictEqual(got, first, `numWorkers ${numWorkers}`);
  }
});

Deno.test("a Subset and a ConcatDataset rebuild in workers on the generic path", async () => {
  const a = new FaultyDataset({ length: 6, fault: "none", at: -1 });
  const b = new FaultyDataset({ length: 4, fault: "none", at: -1 });
  const sub = new Subset(a, [5, 1]);
  const both = new ConcatDataset<FaultySample>([sub, b]);
  assert.strictEqual(both.length, 6);
  await using loader = new DataLoader<FaultySample[]>(both, {
    batchSize: 3,
    numWorkers: 2,
    collate: { module: new URL("./loader_fixtures.ts", import.meta.url).href, export: "identity" },
  });
  const xs: number[] = [], workers = new Set<number>();
  for await (const batch of loader) {
    for (const s of batch) {
      xs.push(s.x[0]);
      workers.add(s.w);
    }
  }
  assert.deepStrictEqual(xs, [5, 1, 0, 1, 2, 3]);
  assert.ok(!workers.has(-1), "loaded in workers");
});

Deno.test("ConcatDataset finds each index's part and refuses what is not a dataset", () => {
  const parts = [3, 0, 2, 1].map((n, k) => ({ length: n, get: (i: number) => `${k}:${i}` }));
  const c = new ConcatDataset(parts);
  assert.deepStrictEqual(c.cumulativeSizes, [3, 3, 5, 6]);
  assert.deepStrictEqual([...Array(6).keys()].map((i) => c.get(i)), [
    "0:0",
    "0:1",
    "0:2",
    "2:0",
    "2:1",
    "3:0",
  ]);
  assert.throws(() => c.get(6), /out of range for a ConcatDataset of 6/);
  assert.throws(() => new ConcatDataset([]), /non-empty array/);
  assert.throws(() => new ConcatDataset([{} as never]), /expected a dataset/);
});

Deno.test("randomSplit deals counts and fractions as PyTorch does, from a seeded permutation", () => {
  const ds = { length: 11, get: (i: number) => i };
  const parts = randomSplit(ds, [0.5, 0.5], { seed: 1 });
  // floor(5.5) = 5 each, the remaining sample goes to the first part.
  assert.deepStrictEqual(parts.map((p) => p.length), [6, 5]);
  assert.deepStrictEqual(randomSplit(ds, [0.7, 0.2, 0.1], { seed: 1 }).map((p) => p.length), [
    8,
    2,
    1,
  ]);
  const counted = randomSplit(ds, [4, 7], { seed: 1 });
  assert.deepStrictEqual(counted.map((p) => p.length), [4, 7]);
  const all = [...counted[0].indices, ...counted[1].indices].sort((a, b) => a - b);
  assert.deepStrictEqual(all, [...Array(11).keys()], "disjoint and covering");
  assert.deepStrictEqual(
    [...randomSplit(ds, [4, 7], { seed: 1 })[0].indices],
    [...counted[0].indices],
    "a pure function of the seed",
  );
  assert.notDeepStrictEqual(
    [...randomSplit(ds, [11], { seed: 1 })[0].indices],
    [...randomSplit(ds, [11], { seed: 2 })[0].indices],
  );
  assert.throws(() => randomSplit(ds, [4, 6]), /counts summing to its 11 samples/);
  assert.throws(() => randomSplit(ds, [0.5, 0.4]), /fractions summing to 1/);
  assert.throws(() => randomSplit(ds, [-1, 12]), /not a non-negative number/);
});
