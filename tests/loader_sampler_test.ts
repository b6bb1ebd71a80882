import assert from "node:assert";
import {
  BatchSampler,
  DistributedSampler,
  RandomSampler,
  SequentialSampler,
  SubsetRandomSampler,
  WeightedRandomSampler,
} from "../loader/sampler.ts";

const sorted = (xs: Iterable<number>) => [...xs].sort((a, b) => a - b);
const range = (n: number) => Array.from({ length: n }, (_, i) => i);

Deno.test("SequentialSampler visits 0..n-1 every epoch", () => {
  const s = new SequentialSampler(5);
  assert.strictEqual(s.length, 5);
  assert.deepStrictEqual([...s.indices(0)], range(5));
  assert.deepStrictEqual([...s.indices(3)], range(5));
  assert.deepStrictEqual([...new SequentialSampler({ length: 2 }).indices()], [0, 1]);
});

Deno.test("RandomSampler is a permutation that is a pure function of (seed, epoch)", () => {
  const a = new RandomSampler(100, { seed: 42 });
  assert.deepStrictEqual(sorted(a.indices(0)), range(100));
  assert.deepStrictEqual(a.indices(0), new RandomSampler(100, { seed: 42 }).indices(0));
  assert.notDeepStrictEqual(a.indices(0), a.indices(1));
  assert.notDeepStrictEqual(a.indices(0), new RandomSampler(100, { seed: 43 }).indices(0));
  assert.notDeepStrictEqual([...a.indices(0)], range(100));
});

Deno.test("RandomSampler with numSamples > n concatenates permutations (no replacement)", () => {
  const s = new RandomSampler(10, { seed: 1, numSamples: 25 });
  const idx = s.indices(0);
  assert.strictEqual(idx.length, 25);
  assert.deepStrictEqual(sorted(idx.subarray(0, 10)), range(10));
  assert.deepStrictEqual(sorted(idx.subarray(10, 20)), range(10));
  assert.ok([...idx.subarray(20)].every((i) => i >= 0 && i < 10));
  assert.strictEqual(new Set(idx.subarray(20)).size, 5);
});

Deno.test("RandomSampler with replacement draws in range and repeats", () => {
  const s = new RandomSampler(10, { seed: 3, replacement: true, numSamples: 1000 });
  const idx = s.indices(0);
  assert.strictEqual(idx.length, 1000);
  assert.ok(idx.every((i) => i >= 0 && i < 10));
  const counts = new Array(10).fill(0);
  for (const i of idx) counts[i]++;
  assert.ok(counts.every((c) => c > 50 && c < 150), `counts ${counts}`);
});

Deno.test("RandomSampler refuses bad numSamples, replacement and seed", () => {
  assert.throws(() => new RandomSampler(10, { numSamples: 0 }), /numSamples/);
  assert.throws(
    () => new RandomSampler(10, { replacement: 1 as unknown as boolean }),
    /replacement should be a boolean/,
  );
  assert.throws(() => new RandomSampler(10, { seed: -1 }), /seed/);
  assert.throws(() => new RandomSampler(-1), /size/);
  assert.throws(() => new RandomSampler(0, { numSamples: 3 }), /empty dataset/);
});

Deno.test("SubsetRandomSampler shuffles exactly the subset", () => {
  const s = new SubsetRandomSampler([3, 9, 27, 81], { seed: 5 });
  assert.strictEqual(s.length, 4);
  assert.deepStrictEqual(sorted(s.indices(0)), [3, 9, 27, 81]);
  assert.deepStrictEqual(
    s.indices(2),
    new SubsetRandomSampler([3, 9, 27, 81], { seed: 5 }).indices(2),
  );
});

Deno.test("WeightedRandomSampler draws proportionally and never a zero weight", () => {
  const s = new WeightedRandomSampler([1, 0, 3], 4000, { seed: 9 });
  const idx = s.indices(0);
  const counts = [0, 0, 0];
  for (const i of idx) counts[i]++;
  assert.strictEqual(counts[1], 0);
  assert.ok(counts[2] / counts[0] > 2.5 && counts[2] / counts[0] < 3.5, `counts ${counts}`);
});

Deno.test("WeightedRandomSampler without replacement gives distinct indices", () => {
  const s = new WeightedRandomSampler([5, 1, 1, 0, 2], 4, { replacement: false, seed: 1 });
  const idx = [...s.indices(0)];
  assert.strictEqual(new Set(idx).size, 4);
  assert.ok(!idx.includes(3));
  assert.throws(
    () => new WeightedRandomSampler([1, 0, 1], 3, { replacement: false }),
    /exceeds the 2 non-zero weights/,
  );
  assert.throws(() => new WeightedRandomSampler([1, -1], 1), /non-negative/);
  assert.throws(() => new WeightedRandomSampler([0, 0], 1), /positive/);
});

// PyTorch's DistributedSampler.__iter__ with shuffle=False, transcribed.
function torchDistributed(n: number, world: number, rank: number, dropLast: boolean): number[] {
  const numSamples = dropLast && n % world !== 0
    ? Math.max(0, Math.ceil((n - world) / world))
    : Math.ceil(n / world);
  const total = numSamples * world;
  let indices = range(n);
  if (!dropLast) {
    const pad = total - indices.length;
    if (pad <= indices.length) indices = indices.concat(indices.slice(0, pad));
    else {
      let rep: number[] = [];
      for (let k = 0; k < Math.ceil(pad / indices.length); k++) rep = rep.concat(indices);
      indices = indices.concat(rep.slice(0, pad));
    }
  } else indices = indices.slice(0, total);
  return indices.filter((_, i) => i % world === rank).slice(0, numSamples);
}

Deno.test("DistributedSampler matches PyTorch's padding and dropping rules", () => {
  for (const [n, world] of [[10, 3], [12, 4], [5, 8], [1, 3], [7, 2]]) {
    for (const dropLast of [false, true]) {
      for (let rank = 0; rank < world; rank++) {
        const s = new DistributedSampler(n, { worldSize: world, rank, shuffle: false, dropLast });
        const want = torchDistributed(n, world, rank, dropLast);
        assert.strictEqual(s.length, want.length, `n=${n} world=${world} drop=${dropLast}`);
        assert.deepStrictEqual([...s.indices(0)], want, `n=${n} world=${world} rank=${rank}`);
      }
    }
  }
});

Deno.test("DistributedSampler ranks shuffle with one permutation and partition it", () => {
  const world = 3;
  const shards = range(world).map((rank) =>
    new DistributedSampler(30, { worldSize: world, rank, seed: 11 }).indices(4)
  );
  assert.deepStrictEqual(sorted(shards.flatMap((s) => [...s])), range(30));
  const again = new DistributedSampler(30, { worldSize: world, rank: 1, seed: 11 });
  assert.deepStrictEqual(again.indices(4), shards[1]);
  assert.notDeepStrictEqual(again.indices(5), shards[1]);
});

Deno.test("DistributedSampler.setEpoch drives direct iteration", () => {
  const s = new DistributedSampler(20, { worldSize: 2, rank: 0, seed: 1 });
  const e0 = [...s];
  s.setEpoch(1);
  assert.deepStrictEqual([...s], [...s.indices(1)]);
  assert.notDeepStrictEqual([...s], e0);
});

Deno.test("DistributedSampler refuses a rank outside [0, worldSize)", () => {
  assert.throws(() => new DistributedSampler(10, { worldSize: 2, rank: 2 }), /invalid rank 2/);
  assert.throws(() => new DistributedSampler(10, { worldSize: 2, rank: -1 }), /invalid rank/);
  assert.throws(() => new DistributedSampler(10, { worldSize: 0, rank: 0 }), /worldSize/);
});

Deno.test("BatchSampler yields ceil or floor(n / batchSize) batches", () => {
  const cases: [number, number, boolean, number[]][] = [
    [10, 4, false, [4, 4, 2]],
    [10, 4, true, [4, 4]],
    [12, 4, false, [4, 4, 4]],
    [12, 4, true, [4, 4, 4]],
    [3, 4, false, [3]],
    [3, 4, true, []],
  ];
  for (const [n, bs, dropLast, sizes] of cases) {
    const b = new BatchSampler(new SequentialSampler(n), { batchSize: bs, dropLast });
    assert.strictEqual(b.length, sizes.length, `n=${n} bs=${bs} drop=${dropLast}`);
    assert.deepStrictEqual(b.batches(0).map((x) => x.length), sizes);
  }
  const b = new BatchSampler(new SequentialSampler(5), { batchSize: 2 });
  assert.deepStrictEqual(b.batches(0).map((x) => [...x]), [[0, 1], [2, 3], [4]]);
  assert.throws(() => new BatchSampler(new SequentialSampler(5), { batchSize: 0 }), /batchSize/);
});
