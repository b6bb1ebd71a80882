// EpochOrder (loader/order.ts): the batches and augment records of an epoch are a pure function
// of (seed, epoch), shared by the DataLoader, the DeviceLoader and a loader per rank.

import assert from "node:assert";
import { augmentRecord } from "../augment/record.ts";
import { AUGMENT_RECORD_LENGTH } from "../augment/record.ts";
import { DataLoader } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { EpochOrder, type EpochOrderOptions } from "../loader/order.ts";
import type { RingBatch } from "../loader/ring.ts";
import { DistributedSampler } from "../loader/sampler.ts";

const AUGMENT = { padding: 4, flip: true, vflip: true, cutout: 3, brightness: 0.2, contrast: 0.3 };
const range = (n: number) => Array.from({ length: n }, (_, i) => i);
const sorted = (a: Iterable<number>) => [...a].sort((x, y) => x - y);

/** What an order gives for an epoch, as plain arrays. */
function snapshot(order: EpochOrder, epoch: number, samples: number) {
  return {
    batches: order.batches(epoch).map((b) => [...b]),
    indices: [...order.indices(epoch)],
    records: [...order.records(epoch, 0, samples)],
  };
}

Deno.test("EpochOrder gives the same epoch whenever it is asked, in any order of epochs", () => {
  const order = new EpochOrder(50, { batchSize: 8, shuffle: true, seed: 11, augment: AUGMENT });
  const first = [0, 1, 2, 3].map((e) => snapshot(order, e, 50));
  // Out of sequence, after the counter moved, and again: nothing carries over between calls.
  order.nextEpoch();
  order.setEpoch(7);
  for (const e of [3, 1, 0, 2, 1]) assert.deepStrictEqual(snapshot(order, e, 50), first[e]);
  // Different epochs are different orders and different draws.
  assert.notDeepStrictEqual(first[0].indices, first[1].indices);
  assert.notDeepStrictEqual(first[0].records, first[1].records);
  for (const s of first) assert.deepStrictEqual(sorted(s.indices), range(50));
});

Deno.test("two EpochOrders with the same seed and options agree; another seed differs", () => {
  const cases: EpochOrderOptions[] = [
    { batchSize: 7, shuffle: true, augment: AUGMENT },
    { batchSize: 7, shuffle: true, dropLast: true, augment: { padding: 2 } },
    { batchSize: 5 },
  ];
  for (const options of cases) {
    const a = new EpochOrder(33, { ...options, seed: 5 });
    const b = new EpochOrder(33, { ...options, seed: 5 });
    const c = new EpochOrder(33, { ...options, seed: 6 });
    assert.strictEqual(a.length, b.length);
    for (const e of [0, 4]) {
      assert.deepStrictEqual(snapshot(a, e, 33), snapshot(b, e, 33), JSON.stringify(options));
      if (options.shuffle) {
        assert.notDeepStrictEqual(snapshot(a, e, 33).indices, snapshot(c, e, 33).indices);
      }
    }
  }
});

Deno.test("EpochOrder's indices are its batches one after another, dropLast cutting the tail", () => {
  for (const dropLast of [false, true]) {
    const order = new EpochOrder(23, { batchSize: 5, shuffle: true, seed: 2, dropLast });
    assert.strictEqual(order.length, dropLast ? 4 : 5);
    const batches = order.batches(3);
    assert.strictEqual(batches.length, order.length);
    assert.deepStrictEqual([...order.indices(3)], batches.flatMap((b) => [...b]));
    assert.strictEqual(order.indices(3).length, dropLast ? 20 : 23);
  }
  const bs = { length: 2, batches: (e: number) => [[e, 1], [2, 3, 4]] };
  const custom = new EpochOrder(10, { batchSampler: bs });
  assert.deepStrictEqual([...custom.indices(0)], [0, 1, 2, 3, 4]);
  assert.deepStrictEqual([...custom.indices(6)], [6, 1, 2, 3, 4]);
  assert.strictEqual(custom.maxBatchSize(), 3);
});

Deno.test("EpochOrder's records of a range are augmentRecord's, position by position", () => {
  const order = new EpochOrder(40, { batchSize: 8, seed: 9, augment: AUGMENT });
  const R = AUGMENT_RECORD_LENGTH;
  const all = order.records(2, 0, 40);
  for (let p = 0; p < 40; p++) {
    assert.deepStrictEqual(
      [...all.subarray(p * R, (p + 1) * R)],
      [...augmentRecord(9, 2, p, order.augment!)],
    );
  }
  // A window, written at an offset of a bigger array, is the same words.
  const out = new Int32Array(10 * R).fill(-7);
  order.records(2, 13, 5, out, 2 * R);
  assert.deepStrictEqual([...out.subarray(2 * R, 7 * R)], [...all.subarray(13 * R, 18 * R)]);
  assert.deepStrictEqual([...out.subarray(0, 2 * R)], new Array(2 * R).fill(-7));
  assert.throws(() => order.records(2, 0, 9, out, 2 * R), /need 121 words, the array has 110/);
  // Without augment: the identity record (every option off).
  const plain = new EpochOrder(4, { seed: 9 }).records(0, 0, 1);
  assert.deepStrictEqual(
    [...plain.subarray(2)],
    [0, 0, 0, 0, 0, 0x3f800000, 0x3f800000, 0x3f800000, 0],
  );
});

Deno.test("the ranks of a DistributedSampler partition an epoch (disjoint, covering)", () => {
  for (const [n, worldSize, dropLast] of [[30, 3, false], [31, 4, false], [31, 4, true]] as const) {
    for (const epoch of [0, 1, 5]) {
      const shards = range(worldSize).map((rank) => {
        const sampler = new DistributedSampler(n, { worldSize, rank, seed: 3, dropLast });
        // A per-rank seed for the draws: the sampler's shared seed keeps the shards disjoint.
        return new EpochOrder(n, { batchSize: 4, sampler, seed: 100 + rank }).indices(epoch);
      });
      const all = shards.flatMap((s) => [...s]);
      const per = dropLast ? Math.floor(n / worldSize) : Math.ceil(n / worldSize);
      for (const s of shards) assert.strictEqual(s.length, per);
      if (n % worldSize === 0 || dropLast) {
        assert.strictEqual(new Set(all).size, all.length, "disjoint");
      }
      if (dropLast) assert.ok(all.every((i) => i >= 0 && i < n));
      else assert.deepStrictEqual(sorted(new Set(all)), range(n), "covering");
    }
  }
});

Deno.test("EpochOrder.nextEpoch counts epochs and takes a DistributedSampler's setEpoch", () => {
  const sampler = new DistributedSampler(8, { worldSize: 2, rank: 1, seed: 1 });
  const order = new EpochOrder(8, { batchSize: 2, sampler });
  assert.deepStrictEqual([order.nextEpoch(), order.nextEpoch()], [0, 1]);
  sampler.setEpoch(9);
  assert.deepStrictEqual([order.nextEpoch(), order.nextEpoch()], [9, 10]);
  assert.throws(() => order.setEpoch(-1), /Cannot set epoch: expected a non-negative integer/);
});

Deno.test("a DataLoader's batches and records are its EpochOrder's", async () => {
  const n = 21;
  const ds = new TensorDataset({
    image: { data: new Uint8Array(n * 4), shape: [1, 2, 2] },
    label: Int32Array.from(range(n)),
  });
  const options = { batchSize: 4, shuffle: true, seed: 8, augment: AUGMENT };
  await using loader = new DataLoader<RingBatch>(ds, { ...options, numWorkers: 2 });
  const order = new EpochOrder(n, options);
  for (let e = 0; e < 2; e++) {
    const seen: number[] = [], records: number[] = [];
    for await (const b of loader) {
      seen.push(...b.indices);
      records.push(...b.augment!);
    }
    assert.deepStrictEqual(seen, [...order.indices(e)]);
    assert.deepStrictEqual(records, [...order.records(e, 0, n)]);
    assert.deepStrictEqual(loader.order.batches(e), order.batches(e));
  }
});

Deno.test("EpochOrder names the caller and the option it refuses", () => {
  assert.throws(
    () => new EpochOrder(10, { batchSize: 0 }, "create a DeviceLoader"),
    /Cannot create a DeviceLoader: batchSize option should be a positive integer/,
  );
  assert.throws(
    () => new EpochOrder(10, { augment: { cutout: -1 } }),
    /Cannot create EpochOrder: augment\.cutout option should be an integer/,
  );
  assert.throws(
    () => new EpochOrder(10, { shuffle: true, sampler: [1, 2] as never }),
    /sampler option is mutually exclusive with shuffle/,
  );
});

Deno.test("an EpochOrder over a plain iterable sampler is not pure: it is not planned ahead", () => {
  const once = Object.assign([3, 1, 2], { length: 3 });
  assert.strictEqual(new EpochOrder(4, { sampler: once }).pure, false);
  assert.strictEqual(new EpochOrder(4, { shuffle: true }).pure, true);
  const order = new EpochOrder(4, { sampler: once, batchSize: 2 });
  assert.deepStrictEqual(order.batches(0).map((b) => [...b]), [[3, 1], [2]]);
});
