// numWorkers / prefetchFactor "auto" (loader/_autotune.ts, Tuner): the counts change between
// epochs, the sample order and the augmentation draws never do, every epoch's stats say what
// ran, and the tuner climbs, takes back a step that did not pay, and settles.

import assert from "node:assert";
import { MIN_TRIAL_SECONDS, Tuner } from "../loader/_autotune.ts";
import { DataLoader, type EpochStats } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import type { RingBatch } from "../loader/ring.ts";

function dataset(n: number): TensorDataset {
  const images = new Uint8Array(new SharedArrayBuffer(n * 48)).map((_, i) => i % 251);
  const labels = new Int32Array(new SharedArrayBuffer(n * 4)).map((_, i) => i);
  return new TensorDataset({ image: { data: images, shape: [3, 4, 4] }, label: labels });
}

/** A finished epoch of `seconds` (default 1) at `rate` samples/s with the given counts. */
function stats(
  workers: number,
  prefetch: number,
  rate: number,
  wait: number,
  seconds = 1,
): EpochStats {
  return {
    epoch: 0,
    batches: 10,
    samples: rate * seconds,
    seconds,
    waitSeconds: wait,
    firstBatchSeconds: 0,
    batchesPerSecond: 10,
    samplesPerSecond: rate,
    meanQueueDepth: 0,
    workerBusySeconds: 0,
    numWorkers: workers,
    prefetchFactor: prefetch,
  };
}

Deno.test("the tuner warms up, tries each worker count, then deeper prefetches, and settles on the fastest", () => {
  const t = new Tuner({ min: 0, max: 2 }, { min: 2, max: 8 });
  assert.deepStrictEqual(
    t.next(stats(2, 2, 500, 0.5)),
    { workers: 2, prefetch: 2 },
    "warm-up epoch",
  );
  assert.deepStrictEqual(t.next(stats(2, 2, 1000, 0.2)), { workers: 1, prefetch: 2 });
  assert.deepStrictEqual(t.next(stats(1, 2, 1500, 0.2)), { workers: 0, prefetch: 2 });
  assert.deepStrictEqual(
    t.next(stats(0, 2, 1200, 0.2)),
    { workers: 1, prefetch: 4 },
    "best count, deeper",
  );
  assert.deepStrictEqual(t.next(stats(1, 4, 1600, 0.1)), { workers: 1, prefetch: 8 });
  assert.deepStrictEqual(
    t.next(stats(1, 8, 1550, 0.1)),
    { workers: 1, prefetch: 4 },
    "the fastest",
  );
  assert.deepStrictEqual(
    t.next(stats(1, 4, 100, 0.9)),
    { workers: 1, prefetch: 4 },
    "settled for good",
  );
});

Deno.test("when 0 workers win, deeper prefetches run at the fastest count with workers", () => {
  // Measured in bench/loader.ts: 0 workers beat 2 workers at depth 2, and 2 workers at depth 8
  // beat both; a search that deepened only the winning count settled 8% below the best.
  const t = new Tuner({ min: 0, max: 2 }, { min: 2, max: 8 });
  t.next(stats(2, 2, 100, 0.5));
  assert.deepStrictEqual(t.next(stats(2, 2, 2560, 0.2)), { workers: 1, prefetch: 2 });
  assert.deepStrictEqual(t.next(stats(1, 2, 2030, 0.2)), { workers: 0, prefetch: 2 });
  assert.deepStrictEqual(
    t.next(stats(0, 0, 2690, 0.2)),
    { workers: 2, prefetch: 4 },
    "deeper at 2",
  );
  assert.deepStrictEqual(t.next(stats(2, 4, 2800, 0.1)), { workers: 2, prefetch: 8 });
  assert.deepStrictEqual(
    t.next(stats(2, 8, 2910, 0.1)),
    { workers: 2, prefetch: 8 },
    "2 at 8 wins",
  );
  // When the deeper prefetches do not pay, 0 workers stays.
  const u = new Tuner({ min: 0, max: 1 }, { min: 2, max: 8 });
  u.next(stats(1, 2, 100, 0.5));
  assert.deepStrictEqual(u.next(stats(1, 2, 1000, 0.2)), { workers: 0, prefetch: 2 });
  assert.deepStrictEqual(u.next(stats(0, 0, 2000, 0.2)), { workers: 1, prefetch: 4 });
  assert.deepStrictEqual(u.next(stats(1, 4, 1100, 0.2)), { workers: 1, prefetch: 8 });
  assert.deepStrictEqual(u.next(stats(1, 8, 1200, 0.2)), { workers: 0, prefetch: 2 }, "0 wins");
});

Deno.test("short epochs make one trial until they add up to MIN_TRIAL_SECONDS, judged together", () => {
  const t = new Tuner({ min: 1, max: 2 }, { min: 2, max: 2 });
  const ms20 = 0.02;
  t.next(stats(2, 2, 100, 0.5, ms20)); // warm-up
  // 2 workers: one lucky 20 ms epoch at 3000, then 12 at 1000: judged at about 1150, not 3000.
  assert.deepStrictEqual(t.next(stats(2, 2, 3000, 0, ms20)), { workers: 2, prefetch: 2 });
  const epochs = Math.ceil(MIN_TRIAL_SECONDS / ms20) - 1;
  for (let i = 1; i < epochs; i++) {
    assert.deepStrictEqual(t.next(stats(2, 2, 1000, 0, ms20)), { workers: 2, prefetch: 2 }, `${i}`);
  }
  assert.deepStrictEqual(t.next(stats(2, 2, 1000, 0, ms20)), { workers: 1, prefetch: 2 }, "next");
  // 1 worker: steady 1500 over one long epoch wins.
  assert.deepStrictEqual(t.next(stats(1, 2, 1500, 0, 1)), { workers: 1, prefetch: 2 }, "1 wins");
});

Deno.test("a trial is judged after its first batch: starting a worker set costs it nothing", () => {
  const t = new Tuner({ min: 0, max: 1 }, { min: 2, max: 2 });
  t.next(stats(1, 2, 100, 0.5));
  // 1 worker: 1 s epoch, 0.3 s of it waiting for the first batch (workers starting): 1000
  // samples in 0.7 s of steady loading beat 0 workers' 1200 samples/s.
  const slowStart = { ...stats(1, 2, 1000, 0), firstBatchSeconds: 0.3 };
  assert.deepStrictEqual(t.next(slowStart), { workers: 0, prefetch: 2 });
  assert.deepStrictEqual(t.next(stats(0, 0, 1200, 0)), { workers: 1, prefetch: 2 }, "1 wins");
});

Deno.test("the tuner tries no prefetch without any workers, nor beyond a fixed prefetch", () => {
  const t = new Tuner({ min: 0, max: 0 }, { min: 2, max: 8 });
  t.next(stats(0, 0, 100, 0.5));
  assert.deepStrictEqual(t.next(stats(0, 0, 2000, 0.2)), { workers: 0, prefetch: 2 }, "only 0");
  const u = new Tuner({ min: 1, max: 2 }, { min: 3, max: 3 });
  u.next(stats(2, 3, 100, 0.5));
  assert.deepStrictEqual(u.next(stats(2, 3, 1000, 0.2)), { workers: 1, prefetch: 3 });
  assert.deepStrictEqual(
    u.next(stats(1, 3, 900, 0.2)),
    { workers: 2, prefetch: 3 },
    "prefetch fixed",
  );
  const v = new Tuner({ min: 2, max: 2 }, { min: 2, max: 8 });
  v.next(stats(2, 2, 100, 0.5));
  assert.deepStrictEqual(
    v.next(stats(2, 2, 1000, 0.2)),
    { workers: 2, prefetch: 4 },
    "workers fixed",
  );
});

Deno.test('numWorkers "auto": counts change between epochs, the order and draws never do', async () => {
  const ds = dataset(300);
  const options = { batchSize: 16, shuffle: true, seed: 5, augment: { padding: 2, flip: true } };
  await using auto = new DataLoader(ds, {
    ...options,
    numWorkers: "auto",
    prefetchFactor: "auto",
    persistentWorkers: true,
  });
  await using fixed = new DataLoader(ds, { ...options, numWorkers: 0 });
  assert.strictEqual(auto.autotune, true);
  assert.strictEqual(fixed.autotune, false);
  const seen = new Set<string>();
  for (let epoch = 0; epoch < 5; epoch++) {
    auto.setEpoch(epoch);
    fixed.setEpoch(epoch);
    const a: number[][] = [], b: number[][] = [];
    for await (const x of auto) {
      a.push([...(x as RingBatch).indices, ...((x as RingBatch).augment ?? [])]);
      // A slow consumer: the tuner sees waits near 0 and may drop a worker.
      const t = performance.now();
      while (performance.now() - t < 1) { /* compute */ }
    }
    for await (const x of fixed) {
      b.push([...(x as RingBatch).indices, ...((x as RingBatch).augment ?? [])]);
    }
    assert.deepStrictEqual(a, b, `epoch ${epoch}`);
    const s = auto.stats!;
    assert.strictEqual(s.epoch, epoch);
    assert.ok(s.numWorkers >= 1 && s.numWorkers <= Math.max(1, navigator.hardwareConcurrency));
    assert.ok(s.prefetchFactor >= 2 && s.prefetchFactor <= 8);
    seen.add(`${s.numWorkers}/${s.prefetchFactor}`);
  }
  assert.ok(seen.size >= 1);
});

Deno.test('"auto" is checked like any option', () => {
  const ds = dataset(8);
  assert.throws(
    () => new DataLoader(ds, { numWorkers: "autox" as never }),
    /numWorkers option should be a non-negative integer or "auto", got "autox"/,
  );
  assert.throws(
    () => new DataLoader(ds, { prefetchFactor: "auto" }),
    /prefetchFactor option could only be specified with workers/,
  );
  assert.throws(
    () => new DataLoader(ds, { numWorkers: 1, prefetchFactor: 0 }),
    /prefetchFactor option should be a positive integer or "auto", got 0/,
  );
});
