// Augment draws under a DistributedSampler (augment/record.ts, "The draw position"): N shards
// of an epoch, run one after another in this process, draw exactly what one process fed the
// combined batch draws: the same samples, the same augment records, the same `ctx.u32()`
// values and, on the device, the same augmented images bit for bit. No two ranks draw for the
// same position.

import assert from "node:assert";
import type { GeometryOptions } from "../augment/geometry.ts";
import { augmentFromDraw } from "../augment/record.ts";
import { AUGMENT_RECORD_LENGTH } from "../augment/record.ts";
import { DataLoader } from "../loader/data_loader.ts";
import type { Dataset, SampleContext } from "../loader/dataset.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import type { RingBatch } from "../loader/ring.ts";
import { DistributedSampler } from "../loader/sampler.ts";
import { DeviceDataset } from "../pipeline/resident.ts";
import { testEachBackend } from "./_backends.ts";

const AUGMENT = {
  padding: 3,
  flip: true,
  vflip: true,
  cutout: 3,
  brightness: 0.4,
  contrast: 0.3,
  saturation: 0.2,
  hue: 0.1,
};
const SEED = 41;
/** Samples per rank per batch. */
const B = 3;

function data(n: number): TensorDataset {
  const images = new Uint8Array(new SharedArrayBuffer(n * 3 * 6 * 5));
  let x = 987;
  for (let i = 0; i < images.length; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    images[i] = x >>> 24;
  }
  const labels = new Int32Array(new SharedArrayBuffer(n * 4)).map((_, i) => i);
  return new TensorDataset({ image: { data: images, shape: [3, 6, 5] }, label: labels });
}

/** One batch as per-sample rows: each sample's values, `per` of them. */
function rows(values: ArrayLike<number>, per: number): number[][] {
  return Array.from(
    { length: values.length / per },
    (_, k) => Array.from({ length: per }, (_, j) => values[k * per + j]),
  );
}

/**
 * The combined batches of N ranks' runs: batch b of rank r holds, at its i-th sample, the
 * sample at i * N + r of the one process's batch b (draw position r + k * N of the epoch).
 */
function interleave(ranks: number[][][][]): number[][][] {
  const n = ranks.length;
  return ranks[0].map((_, b) => {
    const out: number[][] = [];
    for (let i = 0; i < ranks[0][b].length; i++) {
      for (let r = 0; r < n; r++) out.push(ranks[r][b][i]);
    }
    return out;
  });
}

/** A DataLoader's epoch as batches of per-sample [index, ...record] rows. */
async function loaderEpoch(
  loader: DataLoader<RingBatch>,
  epoch: number,
): Promise<number[][][]> {
  loader.setEpoch(epoch);
  const out: number[][][] = [];
  for await (const b of loader) {
    const recs = rows(b.augment!, AUGMENT_RECORD_LENGTH);
    out.push([...b.indices].map((i, k) => [i, ...recs[k]]));
  }
  return out;
}

for (const numWorkers of [0, 2]) {
  Deno.test(`2 and 4 shards' DataLoader batches and augment records are one process's combined batches (numWorkers ${numWorkers})`, async () => {
    const n = 48;
    const ds = data(n);
    for (const world of [2, 4]) {
      await using one = new DataLoader<RingBatch>(ds, {
        batchSize: world * B,
        shuffle: true,
        seed: SEED,
        augment: AUGMENT,
        numWorkers,
      });
      const shards = Array.from({ length: world }, (_, rank) =>
        new DataLoader<RingBatch>(ds, {
          batchSize: B,
          // No loader seed: a sharded loader takes its sampler's, which every rank shares.
          sampler: new DistributedSampler(n, { worldSize: world, rank, seed: SEED }),
          augment: AUGMENT,
          numWorkers,
        }));
      try {
        for (const epoch of [0, 3]) {
          const want = await loaderEpoch(one, epoch);
          const got: number[][][][] = [];
          for (const s of shards) got.push(await loaderEpoch(s, epoch));
          assert.strictEqual(want.length, n / (world * B));
          assert.deepStrictEqual(interleave(got), want, `${world} shards, epoch ${epoch}`);
          // (a) in so many words: the ranks' records at the same place of their shards differ.
          for (let r = 1; r < world; r++) {
            const same = got[r].flat().filter((row, k) =>
              row.slice(1).join() === got[0].flat()[k].slice(1).join()
            );
            assert.strictEqual(same.length, 0, `rank ${r} repeats rank 0's draws`);
          }
        }
      } finally {
        for (const s of shards) await s[Symbol.asyncDispose]();
      }
    }
  });
}

Deno.test("2 and 4 shards' geometry records are one process's combined batches", async () => {
  const n = 24, h = 9, w = 11;
  const ds = new TensorDataset({
    image: { data: new Uint8Array(new SharedArrayBuffer(n * h * w * 3)), shape: [h, w, 3] },
    label: new Int32Array(new SharedArrayBuffer(n * 4)).map((_, i) => i),
  });
  const geometry: GeometryOptions = { size: [6, 6], crop: "random-resized-crop", rotation: 20 };
  const epochOf = async (loader: DataLoader<RingBatch>) => {
    const out: number[][][] = [];
    for await (const b of loader) {
      const recs = rows(b.geometry!, b.geometry!.length / b.indices.length);
      out.push([...b.indices].map((i, k) => [i, ...recs[k]]));
    }
    return out;
  };
  for (const world of [2, 4]) {
    await using one = new DataLoader<RingBatch>(ds, {
      batchSize: world * B,
      shuffle: true,
      seed: SEED,
      geometry,
    });
    const want = await epochOf(one);
    const got: number[][][][] = [];
    for (let rank = 0; rank < world; rank++) {
      await using shard = new DataLoader<RingBatch>(ds, {
        batchSize: B,
        sampler: new DistributedSampler(n, { worldSize: world, rank, seed: SEED }),
        geometry,
      });
      got.push(await epochOf(shard));
    }
    assert.deepStrictEqual(interleave(got), want, `${world} shards`);
  }
});

/** A dataset whose samples are what get() saw: its index, its context's position and draws. */
class DrawDataset implements Dataset<number[]> {
  readonly length: number;
  constructor(length: number) {
    this.length = length;
  }
  get(index: number, ctx: SampleContext): number[] {
    return [index, ctx.position, ctx.u32(), ctx.u32()];
  }
}

Deno.test("ctx.u32() and ctx.position in get() are the draw position's, on every shard", async () => {
  const n = 24;
  const ds = new DrawDataset(n);
  const epochOf = async (loader: DataLoader<number[][]>) => {
    const out: number[][][] = [];
    for await (const b of loader) out.push(b);
    return out;
  };
  await using one = new DataLoader(ds, {
    batchSize: 2 * B,
    shuffle: true,
    seed: SEED,
    collate: (s: unknown[]) => s as number[][],
  });
  const want = await epochOf(one);
  const got: number[][][][] = [];
  for (const rank of [0, 1]) {
    await using s = new DataLoader(ds, {
      batchSize: B,
      sampler: new DistributedSampler(n, { worldSize: 2, rank, seed: SEED }),
      collate: (s: unknown[]) => s as number[][],
    });
    got.push(await epochOf(s));
  }
  assert.deepStrictEqual(interleave(got), want);
  // The one process's positions are 0, 1, 2, ...: the global order.
  assert.deepStrictEqual(want.flat().map((s) => s[1]), Array.from({ length: n }, (_, i) => i));
  // The first u32 is the one the augment record's crop and flip take (draw 0).
  await using rec = new DataLoader<RingBatch>(data(n), {
    batchSize: B,
    sampler: new DistributedSampler(n, { worldSize: 2, rank: 1, seed: SEED }),
    augment: { padding: 3, flip: true },
  });
  const records: number[][] = [];
  for await (const b of rec) records.push(...rows(b.augment!, AUGMENT_RECORD_LENGTH));
  assert.deepStrictEqual(
    records.map((r) => r.slice(0, 3)),
    got[1].flat().map((s) => augmentFromDraw(s[2], 3, true)),
  );
});

testEachBackend(
  "2 and 4 DeviceLoader shards augment on the device exactly as one process's combined batch",
  async (dev) => {
    const n = 24;
    const ds = data(n);
    const options = {
      shuffle: true,
      seed: SEED,
      augment: AUGMENT,
      mean: [0.4, 0.5, 0.6],
      std: [0.2, 0.25, 0.3],
      dtype: "f32" as const,
    };
    using resident = new DeviceDataset(dev, ds);
    const epochOf = async (loader: ReturnType<DeviceDataset["loader"]>, epoch: number) => {
      loader.setEpoch(epoch);
      const out: number[][][] = [];
      for await (const b of loader) {
        const labels = [...await b.labels.toHost()];
        const images = rows(await b.images.toHost() as Float32Array, 3 * 6 * 5);
        out.push(labels.map((l, k) => [l, ...images[k].map((v) => v)]));
      }
      return out;
    };
    for (const world of [2, 4]) {
      await using one = resident.loader({ ...options, batchSize: world * B });
      for (const epoch of [0, 1]) {
        const want = await epochOf(one, epoch);
        const got: number[][][][] = [];
        for (let rank = 0; rank < world; rank++) {
          await using shard = resident.loader({ ...options, batchSize: B, worldSize: world, rank });
          got.push(await epochOf(shard, epoch));
        }
        // Float32 values compared as numbers: equal numbers are equal bits here (no NaN, and
        // -0 would differ from 0 under deepStrictEqual's Object.is).
        assert.deepStrictEqual(interleave(got), want, `${world} shards, epoch ${epoch}`);
      }
    }
  },
);
