import assert from "node:assert";
import { DataLoader, type DataLoaderOptions } from "../loader/data_loader.ts";
import { type Dataset, sharedArray } from "../loader/dataset.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { AUGMENT_RECORD_LENGTH, augmentFromDraw, augmentRecord } from "../augment/record.ts";
import type { RingBatch, StagingRing } from "../loader/ring.ts";
import { DistributedSampler, SequentialSampler } from "../loader/sampler.ts";
import { FaultyDataset, type FaultySample } from "./loader_fixtures.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** n samples: image u8 [2,2] filled with i & 255, label i32 = i. */
function imageDataset(n: number): TensorDataset {
  const image = new Uint8Array(n * 4);
  for (let i = 0; i < n; i++) image.fill(i & 255, i * 4, i * 4 + 4);
  return new TensorDataset({
    image: { data: image, shape: [1, 2, 2] },
    label: Int32Array.from(range(n)),
  });
}

async function collectRing(loader: DataLoader<RingBatch>) {
  const out: { indices: number[]; labels: number[]; image0: number[]; augment: number[] }[] = [];
  for await (const b of loader) {
    out.push({
      indices: [...b.indices],
      labels: [...b.fields.label],
      image0: range(b.size).map((k) => b.fields.image[k * 4]),
      augment: b.augment ? [...b.augment] : [],
    });
  }
  return out;
}

Deno.test("DataLoader yields the last partial batch unless dropLast (PyTorch batch counts)", async () => {
  for (const n of [10, 12]) {
    for (const dropLast of [false, true]) {
      const ds = { length: n, get: (i: number) => i };
      await using loader = new DataLoader<Float64Array>(ds, { batchSize: 4, dropLast });
      const expected = dropLast ? Math.floor(n / 4) : Math.ceil(n / 4);
      assert.strictEqual(loader.length, expected);
      const batches: number[][] = [];
      for await (const b of loader) batches.push([...b]);
      assert.strictEqual(batches.length, expected, `n=${n} dropLast=${dropLast}`);
      const flat = batches.flat();
      assert.deepStrictEqual(flat, range(dropLast ? expected * 4 : n));
      if (!dropLast && n % 4) assert.strictEqual(batches.at(-1)!.length, n % 4);
    }
  }
});

Deno.test("DataLoader default batchSize is 1 and batchSize null yields single samples", async () => {
  const ds = { length: 3, get: (i: number) => ({ v: i }) };
  await using one = new DataLoader<{ v: Float64Array }>(ds);
  const b1: number[][] = [];
  for await (const b of one) b1.push([...b.v]);
  assert.deepStrictEqual(b1, [[0], [1], [2]]);
  await using none = new DataLoader<{ v: number }>(ds, { batchSize: null });
  const b2: unknown[] = [];
  for await (const s of none) b2.push(s);
  assert.deepStrictEqual(b2, [{ v: 0 }, { v: 1 }, { v: 2 }]);
  assert.strictEqual(none.length, 3);
});

Deno.test("DataLoader zero-copy batches hold the samples' fields, indices and labels", async () => {
  const ds = imageDataset(10);
  await using loader = new DataLoader<RingBatch>(ds, { batchSize: 4 });
  assert.ok(loader.zeroCopy);
  const got = await collectRing(loader);
  assert.deepStrictEqual(got.map((b) => b.indices), [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]);
  assert.deepStrictEqual(got.map((b) => b.labels), got.map((b) => b.indices));
  assert.deepStrictEqual(got.map((b) => b.image0), got.map((b) => b.indices));
});

for (const numWorkers of [0, 2]) {
  Deno.test(`DataLoader zero-copy batches hold fields of every small record size byte for byte (numWorkers ${numWorkers})`, async () => {
    // Records of 1, 2, 3, 5, 7, 8, 16, 17 and 31 bytes, unaligned and aligned: each sample's
    // bytes are a function of (sample, field, byte), so a copy from the wrong sample, offset or
    // length shows.
    const n = 97, sizes = [1, 2, 3, 5, 7, 8, 16, 17, 31];
    const byteOf = (i: number, f: number, j: number) => (i * 31 + f * 7 + j * 13 + 1) & 0xff;
    const fields: Record<string, { data: Uint8Array; shape: number[] }> = {};
    sizes.forEach((rb, f) => {
      const data = sharedArray("u8", n * rb);
      for (let i = 0; i < n; i++) for (let j = 0; j < rb; j++) data[i * rb + j] = byteOf(i, f, j);
      fields[`f${rb}`] = { data, shape: rb === 1 ? [] : [rb] };
    });
    await using loader = new DataLoader<RingBatch>(new TensorDataset(fields), {
      batchSize: 10,
      shuffle: true,
      seed: 5,
      numWorkers,
    });
    assert.ok(loader.zeroCopy);
    let seen = 0;
    for await (const b of loader) {
      sizes.forEach((rb, f) => {
        const got = b.fields[`f${rb}`] as Uint8Array;
        assert.strictEqual(got.length, b.size * rb);
        b.indices.forEach((i, k) => {
          for (let j = 0; j < rb; j++) {
            assert.strictEqual(
              got[k * rb + j],
              byteOf(i, f, j),
              `sample ${i} field ${rb} byte ${j}`,
            );
          }
        });
      });
      seen += b.size;
    }
    assert.strictEqual(seen, n);
  });
}

Deno.test("DataLoader shuffle visits every sample once per epoch, differently each epoch", async () => {
  const ds = imageDataset(50);
  await using loader = new DataLoader<RingBatch>(ds, { batchSize: 8, shuffle: true, seed: 3 });
  const e0 = (await collectRing(loader)).flatMap((b) => b.indices);
  const e1 = (await collectRing(loader)).flatMap((b) => b.indices);
  assert.deepStrictEqual([...e0].sort((a, b) => a - b), range(50));
  assert.deepStrictEqual([...e1].sort((a, b) => a - b), range(50));
  assert.notDeepStrictEqual(e0, e1);
  assert.strictEqual(loader.epoch, 2);
  loader.setEpoch(0);
  assert.deepStrictEqual((await collectRing(loader)).flatMap((b) => b.indices), e0);
});

for (const [numWorkers, persistentWorkers] of [[0, false], [2, true], [2, false]] as const) {
  Deno.test(`DataLoader runs the same epoch again after setEpoch (numWorkers ${numWorkers}, persistent ${persistentWorkers})`, async () => {
    for (const zeroCopy of [true, false]) {
      await using loader = new DataLoader<RingBatch | { x: Float32Array }>(imageDataset(10), {
        batchSize: 2,
        shuffle: true,
        seed: 1,
        numWorkers,
        persistentWorkers,
        zeroCopy,
      });
      const first = await drainCount(loader);
      loader.setEpoch(0);
      assert.deepStrictEqual([first, await drainCount(loader)], [5, 5], `zeroCopy ${zeroCopy}`);
    }
  });
}

Deno.test("a DataLoader iterator stopped by a newer one throws instead of ending quietly", async () => {
  await using loader = new DataLoader<unknown>(imageDataset(10), { batchSize: 2 });
  const first = loader[Symbol.asyncIterator]();
  assert.strictEqual((await first.next()).done, false);
  const second = loader[Symbol.asyncIterator]();
  await assert.rejects(first.next(), /Cannot continue epoch 0: a newer iterator .* epoch 1/);
  let n = 0;
  for await (const _ of second) n++;
  assert.strictEqual(n, 5);
});

async function drainCount(loader: DataLoader<unknown>): Promise<number> {
  let n = 0;
  for await (const _ of loader) n++;
  return n;
}

Deno.test("DataLoader batches are identical for numWorkers 0, 1, 2 and 4 (zero-copy, augment)", async () => {
  const ds = imageDataset(103);
  let reference: unknown;
  for (const numWorkers of [0, 1, 2, 4]) {
    await using loader = new DataLoader<RingBatch>(ds, {
      batchSize: 8,
      shuffle: true,
      seed: 1234,
      numWorkers,
      augment: { padding: 4, flip: true },
    });
    const epochs = [await collectRing(loader), await collectRing(loader)];
    if (reference === undefined) {
      reference = epochs;
      const aug = epochs[0].flatMap((b) => b.augment);
      const R = AUGMENT_RECORD_LENGTH;
      for (let k = 0; k < aug.length; k += R) {
        assert.ok(aug[k] >= 0 && aug[k] <= 8 && aug[k + 1] >= 0 && aug[k + 1] <= 8);
        assert.ok(aug[k + 2] === 0 || aug[k + 2] === 1);
        // The augmentations not asked for are off: no vflip, no cutout, factors 1.0.
        assert.deepStrictEqual(aug.slice(k + 3, k + R), [
          0,
          0,
          0,
          0,
          0x3f800000,
          0x3f800000,
          0x3f800000,
          0,
        ]);
      }
      assert.ok(new Set(aug.filter((_, k) => k % R === 0)).size > 5, "crop offsets vary");
    } else assert.deepStrictEqual(epochs, reference, `numWorkers ${numWorkers}`);
  }
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader generic path gives the same batches and random streams for numWorkers 0, 1, 2, 4", async () => {
  const ds = new FaultyDataset({ length: 37, fault: "none", at: -1 });
  let reference: unknown;
  for (const numWorkers of [0, 1, 2, 4]) {
    await using loader = new DataLoader<{ x: Float32Array; r: Float64Array }>(ds, {
      batchSize: 5,
      shuffle: true,
      seed: 99,
      numWorkers,
    });
    const got: number[][] = [];
    for await (const b of loader) got.push([...b.x], [...b.r]);
    if (reference === undefined) {
      reference = got;
      const draws = got.filter((_, k) => k % 2 === 1).flat();
      assert.strictEqual(new Set(draws).size, 37, "every sample has its own stream");
    } else assert.deepStrictEqual(got, reference, `numWorkers ${numWorkers}`);
  }
});

/** fp32 of the int32 bits `b`. */
const fromBits = (b: number) => new Float32Array(new Int32Array([b]).buffer)[0];

/**
 * The record the documentation (loader/ring.ts) promises for one sample, computed from its
 * stream's first five draws (`ctx.u32()`), independently of the loader's code.
 */
function documentedRecord(
  draws: number[],
  o: {
    padding: number;
    flip: boolean;
    vflip: boolean;
    cutout: number;
    b: number;
    c: number;
    s: number;
    h: number;
  },
): number[] {
  const [u, v, cut, ub, uc, us, uh] = draws;
  const span = 2 * o.padding + 1;
  const factor = (j: number, d: number) =>
    j === 0 ? 1 : Math.fround(Math.max(0, 1 - j) + (1 + j - Math.max(0, 1 - j)) * (d / 2 ** 32));
  const bits = (x: number) => new Int32Array(new Float32Array([x]).buffer)[0];
  return [
    Math.floor(((u & 0xffff) / 65536) * span),
    Math.floor((((u >>> 16) & 0x7fff) / 32768) * span),
    o.flip ? u >>> 31 : 0,
    o.vflip ? v >>> 31 : 0,
    o.cutout > 0 ? cut & 0xffff : 0,
    o.cutout > 0 ? cut >>> 16 : 0,
    o.cutout,
    bits(factor(o.b, ub)),
    bits(factor(o.c, uc)),
    bits(factor(o.s, us)),
    o.h === 0 ? 0 : bits(Math.fround(-o.h + 2 * o.h * (uh / 2 ** 32))),
  ];
}

Deno.test("DataLoader augment parameters match the sample's stream in get(i, ctx)", async () => {
  // Words 0-2 come from the first draw of the per-sample stream, split as augmentFromDraw
  // says (the same bits as when the record was three words); the others from draws 1-6.
  const ds = imageDataset(20);
  for (
    const o of [
      { padding: 2, flip: true, vflip: false, cutout: 0, b: 0, c: 0, s: 0, h: 0 },
      { padding: 2, flip: true, vflip: true, cutout: 5, b: 0.4, c: 1.5, s: 0.3, h: 0.5 },
      { padding: 0, flip: false, vflip: true, cutout: 0, b: 0, c: 0.2, s: 2, h: 0 },
      { padding: 0, flip: false, vflip: false, cutout: 0, b: 0, c: 0, s: 0, h: 0.05 },
    ]
  ) {
    const augment = {
      padding: o.padding,
      flip: o.flip,
      vflip: o.vflip,
      cutout: o.cutout,
      brightness: o.b,
      contrast: o.c,
      saturation: o.s,
      hue: o.h,
    };
    await using zc = new DataLoader<RingBatch>(ds, {
      batchSize: 6,
      shuffle: true,
      seed: 5,
      augment,
    });
    const zAug = (await collectRing(zc)).flatMap((b) => b.augment);
    const drawing: Dataset = {
      length: 20,
      get: (_i, ctx) => {
        const draws = [0, 1, 2, 3, 4, 5, 6].map(() => ctx!.u32());
        const record = documentedRecord(draws, o);
        assert.deepStrictEqual(record.slice(0, 3), augmentFromDraw(draws[0], o.padding, o.flip));
        return new Int32Array(record);
      },
    };
    await using gen = new DataLoader<Int32Array>(drawing, { batchSize: 6, shuffle: true, seed: 5 });
    const gAug: number[] = [];
    for await (const b of gen) gAug.push(...b);
    assert.deepStrictEqual(zAug, gAug, JSON.stringify(o));
    // augmentRecord gives the same record from (seed, epoch, position).
    const R = AUGMENT_RECORD_LENGTH;
    for (let pos = 0; pos < 20; pos++) {
      assert.deepStrictEqual(
        [...augmentRecord(5, 0, pos, zc.augment!)],
        zAug.slice(R * pos, R * pos + R),
      );
    }
  }
});

Deno.test("DataLoader draws every augmentation independently of numWorkers 0, 2 and 3", async () => {
  const ds = imageDataset(57);
  const augment = {
    padding: 3,
    flip: true,
    vflip: true,
    cutout: 4,
    brightness: 0.4,
    contrast: 0.6,
    saturation: 0.5,
    hue: 0.2,
  };
  const R = AUGMENT_RECORD_LENGTH;
  let reference: number[][] | undefined;
  for (const numWorkers of [0, 2, 3]) {
    await using loader = new DataLoader<RingBatch>(ds, {
      batchSize: 5,
      shuffle: true,
      seed: 77,
      numWorkers,
      augment,
    });
    loader.setEpoch(3);
    const got = [(await collectRing(loader)).flatMap((b) => b.augment)];
    got.push((await collectRing(loader)).flatMap((b) => b.augment));
    if (reference === undefined) {
      reference = got;
      for (const [e, aug] of got.entries()) {
        for (let k = 0; k < aug.length; k += R) {
          assert.deepStrictEqual(aug.slice(k, k + R), [
            ...augmentRecord(77, 3 + e, k / R, augment),
          ]);
          assert.ok(aug[k + 3] === 0 || aug[k + 3] === 1);
          assert.ok(aug[k + 4] >= 0 && aug[k + 4] < 65536 && aug[k + 5] >= 0 && aug[k + 5] < 65536);
          assert.strictEqual(aug[k + 6], 4);
          const br = fromBits(aug[k + 7]), ct = fromBits(aug[k + 8]);
          assert.ok(br >= 0.6 && br <= 1.4, `brightness ${br}`);
          assert.ok(ct >= 0.4 && ct <= 1.6, `contrast ${ct}`);
          const sat = fromBits(aug[k + 9]), hue = fromBits(aug[k + 10]);
          assert.ok(sat >= 0.5 && sat <= 1.5, `saturation ${sat}`);
          assert.ok(hue >= -0.2 && hue <= 0.2, `hue ${hue}`);
        }
        const words = (w: number) => new Set(aug.filter((_, k) => k % R === w)).size;
        assert.strictEqual(words(3), 2, "vertical flips vary");
        for (const w of [4, 5, 7, 8, 9, 10]) assert.ok(words(w) > 40, `word ${w} varies`);
      }
      assert.notDeepStrictEqual(got[0], got[1], "each epoch draws anew");
    } else assert.deepStrictEqual(got, reference, `numWorkers ${numWorkers}`);
  }
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader inOrder false yields every batch of the epoch", async () => {
  const ds = imageDataset(64);
  await using loader = new DataLoader<RingBatch>(ds, {
    batchSize: 4,
    numWorkers: 2,
    inOrder: false,
  });
  const got = (await collectRing(loader)).flatMap((b) => b.indices).sort((a, b) => a - b);
  assert.deepStrictEqual(got, range(64));
});

Deno.test("DataLoader persistent workers keep running across epochs and prefetch the next one", async () => {
  const ds = imageDataset(40);
  const plain = new DataLoader<RingBatch>(ds, { batchSize: 4, shuffle: true, seed: 8 });
  const want = [await collectRing(plain), await collectRing(plain), await collectRing(plain)];
  plain.dispose();
  await using loader = new DataLoader<RingBatch>(ds, {
    batchSize: 4,
    shuffle: true,
    seed: 8,
    numWorkers: 2,
    persistentWorkers: true,
    prefetchFactor: 3,
  });
  const got = [await collectRing(loader)];
  assert.strictEqual(loader.workers, 2, "workers survive the end of the epoch");
  got.push(await collectRing(loader));
  // Break in the middle of epoch 2: the rest is dropped, epoch 3 still starts correctly.
  for await (const _ of loader) break;
  got.push(await collectRing(loader));
  assert.deepStrictEqual(got[0], want[0]);
  assert.deepStrictEqual(got[1], want[1]);
  const plain2 = new DataLoader<RingBatch>(ds, { batchSize: 4, shuffle: true, seed: 8 });
  plain2.setEpoch(3);
  assert.deepStrictEqual(got[2], await collectRing(plain2));
  plain2.dispose();
  loader.dispose();
  assert.strictEqual(loader.workers, 0);
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader non-persistent workers stop at the end of each epoch", async () => {
  const ds = imageDataset(20);
  await using loader = new DataLoader<RingBatch>(ds, { batchSize: 4, numWorkers: 2 });
  let during = 0;
  for await (const _ of loader) during = DataLoader.liveWorkers;
  assert.strictEqual(during, 2);
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader.stream() gives one epoch as a ReadableStream", async () => {
  const ds = { length: 7, get: (i: number) => i };
  await using loader = new DataLoader<Float64Array>(ds, { batchSize: 3 });
  const got: number[][] = [];
  for await (const b of loader.stream()) got.push([...b]);
  assert.deepStrictEqual(got, [[0, 1, 2], [3, 4, 5], [6]]);
  const reader = loader.stream().getReader();
  assert.deepStrictEqual([...(await reader.read()).value!], [0, 1, 2]);
  await reader.cancel();
});

Deno.test("DataLoader with autoRelease false keeps batches until release()", async () => {
  const ds = imageDataset(40);
  await using loader = new DataLoader<RingBatch>(ds, {
    batchSize: 4,
    numWorkers: 1,
    autoRelease: false,
    heldBatches: 2,
  });
  const held: RingBatch[] = [];
  for await (const b of loader) {
    held.push(b);
    if (held.length > 2) held.shift()!.release();
    // Slots the consumer holds are never overwritten.
    for (const h of held) assert.deepStrictEqual([...h.fields.label], [...h.indices]);
  }
  for (const h of held) h.release();
  assert.ok(held.every((h) => h.released));
});

Deno.test("DataLoader fails clearly when the consumer holds every ring slot", async () => {
  const ds = imageDataset(40);
  await using loader = new DataLoader<RingBatch>(ds, {
    batchSize: 4,
    autoRelease: false,
    heldBatches: 1,
  });
  await assert.rejects(async () => {
    for await (const _ of loader) { /* never release */ }
  }, /ring slots are held by the consumer/);
});

Deno.test("DataLoader pinMemory hook gets the ring once and its Disposable is disposed last", async () => {
  const ds = imageDataset(8);
  const events: string[] = [];
  let ring: StagingRing | undefined;
  const loader = new DataLoader<RingBatch>(ds, {
    batchSize: 4,
    numWorkers: 1,
    pinMemory: (r) => {
      ring = r;
      events.push("pin");
      return { [Symbol.dispose]: () => events.push(`unpin live=${DataLoader.liveWorkers}`) };
    },
  });
  assert.strictEqual(loader.ring, ring);
  assert.ok(ring!.buffer instanceof SharedArrayBuffer);
  assert.strictEqual(ring!.slotOffset(1), ring!.slotBytes);
  assert.strictEqual(ring!.field("image").sampleBytes, 4);
  for await (const b of loader) assert.strictEqual(b.ring, ring);
  await loader[Symbol.asyncDispose]();
  loader.dispose();
  assert.deepStrictEqual(events, ["pin", "unpin live=0"]);
  assert.throws(() => loader[Symbol.asyncIterator](), /disposed/);
});

Deno.test("DataLoader records per-epoch stats", async () => {
  const ds = imageDataset(30);
  await using loader = new DataLoader<RingBatch>(ds, { batchSize: 4, numWorkers: 1 });
  for await (const _ of loader) { /* drain */ }
  const s = loader.stats!;
  assert.strictEqual(s.epoch, 0);
  assert.strictEqual(s.batches, 8);
  assert.strictEqual(s.samples, 30);
  assert.ok(s.seconds > 0 && s.samplesPerSecond > 0 && s.batchesPerSecond > 0);
  assert.ok(s.waitSeconds >= 0 && s.waitSeconds <= s.seconds);
  assert.ok(s.meanQueueDepth >= 0 && s.workerBusySeconds > 0);
  assert.strictEqual(loader.history.length, 1);
});

Deno.test("DataLoader runs workerInit in every worker and exposes getWorkerInfo()", async () => {
  const ds = new FaultyDataset({ length: 12, fault: "none", at: -1 });
  await using loader = new DataLoader<FaultySample[]>(ds, {
    batchSize: 3,
    numWorkers: 2,
    collate: { module: new URL("./loader_fixtures.ts", import.meta.url).href, export: "identity" },
    workerInit: {
      module: new URL("./loader_fixtures.ts", import.meta.url).href,
      export: "recordWorkerId",
    },
  });
  const seen = new Set<number>();
  for await (const batch of loader) {
    for (const s of batch) {
      assert.strictEqual(s.init, s.w, "workerInit ran with the worker id");
      seen.add(s.w);
    }
  }
  assert.deepStrictEqual([...seen].sort(), [0, 1]);
});

Deno.test("without batching, a collate gets each sample itself in workers and on the main thread", async () => {
  const ds = new FaultyDataset({ length: 3, fault: "none", at: -1 });
  const identity = {
    module: new URL("./loader_fixtures.ts", import.meta.url).href,
    export: "identity",
  };
  for (const collate of [identity, (s: unknown) => s]) {
    await using loader = new DataLoader<FaultySample>(ds, {
      batchSize: null,
      numWorkers: typeof collate === "function" ? 0 : 1,
      collate: collate as DataLoaderOptions<FaultySample>["collate"],
    });
    const got: number[] = [];
    for await (const s of loader) got.push(s.x[0]);
    assert.deepStrictEqual(got, [0, 1, 2]);
  }
});

for (const numWorkers of [0, 2]) {
  Deno.test(`overlapping next() calls get successive batches, as from an async generator (numWorkers ${numWorkers})`, async () => {
    await using loader = new DataLoader<RingBatch>(imageDataset(10), {
      batchSize: 2,
      numWorkers,
      autoRelease: false,
      heldBatches: 5, // the test holds every batch of the epoch at once
    });
    const it = loader[Symbol.asyncIterator]();
    const rs = await Promise.all([
      it.next(),
      it.next(),
      it.next(),
      it.next(),
      it.next(),
      it.next(),
    ]);
    assert.deepStrictEqual(rs.map((r) => r.done), [false, false, false, false, false, true]);
    assert.deepStrictEqual(rs.slice(0, 5).map((r) => (r.value as RingBatch).index), [
      0,
      1,
      2,
      3,
      4,
    ]);
    for (const r of rs.slice(0, 5)) (r.value as RingBatch).release();
  });
}

Deno.test("worker seeds differ per worker, and per epoch unless the workers persist", async () => {
  const ds = new FaultyDataset({ length: 8, fault: "none", at: -1 });
  const collate = {
    module: new URL("./loader_fixtures.ts", import.meta.url).href,
    export: "identity",
  };
  for (const persistentWorkers of [false, true]) {
    await using loader = new DataLoader<FaultySample[]>(ds, {
      batchSize: 2,
      numWorkers: 2,
      seed: 5,
      persistentWorkers,
      collate,
    });
    const epochs: Map<number, number>[] = [];
    for (let e = 0; e < 2; e++) {
      const byWorker = new Map<number, number>();
      for await (const batch of loader) for (const s of batch) byWorker.set(s.w, s.seed);
      assert.strictEqual(byWorker.size, 2);
      assert.notStrictEqual(byWorker.get(0), byWorker.get(1));
      epochs.push(byWorker);
    }
    const same = epochs[0].get(0) === epochs[1].get(0) && epochs[0].get(1) === epochs[1].get(1);
    assert.strictEqual(same, persistentWorkers, `persistentWorkers ${persistentWorkers}`);
  }
});

Deno.test("DataLoader collate: a function runs on the main thread, a module reference in workers", async () => {
  const ds = new FaultyDataset({ length: 10, fault: "none", at: -1 });
  for (const numWorkers of [0, 2]) {
    await using fn = new DataLoader<number>(ds, {
      batchSize: 4,
      numWorkers,
      collate: (s) => (s as FaultySample[]).length,
    });
    const sizes: number[] = [];
    for await (const n of fn) sizes.push(n);
    assert.deepStrictEqual(sizes, [4, 4, 2]);
    await using ref = new DataLoader<number>(ds, {
      batchSize: 4,
      numWorkers,
      collate: {
        module: new URL("./loader_fixtures.ts", import.meta.url).href,
        export: "sumCollate",
      },
    });
    const sums: number[] = [];
    for await (const n of ref) sums.push(n);
    assert.deepStrictEqual(sums, [6, 22, 17]);
  }
});

Deno.test("DataLoader accepts custom samplers, plain iterables and batch samplers", async () => {
  const ds = { length: 10, get: (i: number) => i };
  await using a = new DataLoader<Float64Array>(ds, {
    batchSize: 3,
    sampler: { length: 4, indices: () => [9, 8, 7, 6] },
  });
  const got: number[][] = [];
  for await (const b of a) got.push([...b]);
  assert.deepStrictEqual(got, [[9, 8, 7], [6]]);
  await using b = new DataLoader<Float64Array>(ds, {
    batchSampler: { length: 2, batches: () => [[1, 2], [3]] },
  });
  const got2: number[][] = [];
  for await (const x of b) got2.push([...x]);
  assert.deepStrictEqual(got2, [[1, 2], [3]]);
  const iterable = Object.assign([5, 4], { length: 2 });
  await using c = new DataLoader<Float64Array>(ds, { sampler: iterable, batchSize: 2 });
  for await (const x of c) assert.deepStrictEqual([...x], [5, 4]);
});

Deno.test("DistributedSampler.setEpoch picks the DataLoader's next epoch (PyTorch's set_epoch, resuming)", async () => {
  const ds = imageDataset(40);
  const sampler = new DistributedSampler(ds, { worldSize: 2, rank: 1, seed: 9 });
  await using loader = new DataLoader<RingBatch>(ds, { batchSize: 5, sampler });
  const order = async () => (await collectRing(loader)).flatMap((b) => b.indices);
  sampler.setEpoch(5); // resume at epoch 5
  assert.deepStrictEqual(await order(), [...sampler.indices(5)]);
  assert.deepStrictEqual(await order(), [...sampler.indices(6)], "then it counts on");
  for (const e of [2, 2]) {
    sampler.setEpoch(e); // the habit of calling it every epoch
    assert.deepStrictEqual(await order(), [...sampler.indices(e)]);
  }
  assert.notDeepStrictEqual([...sampler.indices(5)], [...sampler.indices(6)]);
});

Deno.test("DataLoader with a DistributedSampler loads this rank's shard, reshuffled per epoch", async () => {
  const ds = imageDataset(20);
  const shard = (rank: number) =>
    new DataLoader<RingBatch>(ds, {
      batchSize: 5,
      numWorkers: 1,
      sampler: new DistributedSampler(ds, { worldSize: 2, rank, seed: 4 }),
    });
  await using r0 = shard(0);
  await using r1 = shard(1);
  const a = (await collectRing(r0)).flatMap((b) => b.indices);
  const b = (await collectRing(r1)).flatMap((b) => b.indices);
  assert.deepStrictEqual([...a, ...b].sort((x, y) => x - y), range(20));
  const a1 = (await collectRing(r0)).flatMap((b) => b.indices);
  assert.notDeepStrictEqual(a1, a);
});

Deno.test("DataLoader rejects invalid options, naming the option", () => {
  const ds = imageDataset(8);
  const generic = { length: 8, get: (i: number) => i };
  const cases: [Dataset, DataLoaderOptions, RegExp][] = [
    [ds, { numWorkers: -1 }, /numWorkers option should be a non-negative integer/],
    [ds, { numWorkers: 1.5 }, /numWorkers/],
    [ds, { timeout: -1 }, /timeout option/],
    [ds, { prefetchFactor: 2 }, /prefetchFactor option could only be specified with workers/],
    [ds, { numWorkers: 1, prefetchFactor: 0 }, /prefetchFactor option should be a positive/],
    [ds, { persistentWorkers: true }, /persistentWorkers option requires numWorkers > 0/],
    [
      ds,
      { sampler: new SequentialSampler(8), shuffle: true },
      /sampler option is mutually exclusive with shuffle/,
    ],
    [
      ds,
      { batchSampler: { length: 1, batches: () => [[0]] }, batchSize: 2 },
      /batchSampler option is mutually exclusive/,
    ],
    [
      ds,
      { batchSampler: { length: 1, batches: () => [[0]] }, shuffle: true },
      /batchSampler option is mutually exclusive/,
    ],
    [
      ds,
      { batchSampler: { length: 1, batches: () => [[0]] }, dropLast: true },
      /batchSampler option is mutually exclusive/,
    ],
    [
      ds,
      { batchSampler: { length: 1, batches: () => [[0]] }, sampler: new SequentialSampler(8) },
      /batchSampler option is mutually exclusive/,
    ],
    [
      ds,
      { batchSize: null, dropLast: true },
      /dropLast option is mutually exclusive with batchSize null/,
    ],
    [ds, { batchSize: 0 }, /batchSize option/],
    [ds, { shuffle: "yes" as unknown as boolean }, /shuffle option should be a boolean/],
    [ds, { seed: -3 }, /seed option/],
    [ds, { sampler: 5 as unknown as SequentialSampler }, /sampler option/],
    [ds, { collate: 3 as unknown as () => void }, /collate option/],
    [
      ds,
      { workerInit: (() => {}) as unknown as { module: string; export: string } },
      /workerInit option should be a \{module, export\}/,
    ],
    [ds, { pinMemory: "yes" as unknown as boolean }, /pinMemory option/],
    [ds, { heldBatches: -1 }, /heldBatches option/],
    [
      ds,
      { augment: { padding: -1 } },
      /augment\.padding option should be a non-negative integer, got -1/,
    ],
    [
      ds,
      { augment: { vflip: 1 as unknown as boolean } },
      /augment\.vflip option should be a boolean value, got 1/,
    ],
    [
      ds,
      { augment: { cutout: -2 } },
      /augment\.cutout option should be an integer in 0\.\.2147483647 \(the square's side in pixels, 0: off\), got -2/,
    ],
    [ds, { augment: { cutout: 2.5 } }, /augment\.cutout option should be an integer/],
    [
      ds,
      { augment: { cutout: 2 ** 31 } },
      /augment\.cutout option should be an integer in 0\.\.2147483647/,
    ],
    [
      ds,
      { augment: { brightness: -0.1 } },
      /augment\.brightness option should be a finite number >= 0 \(factors drawn in \[max\(0, 1 - j\), 1 \+ j\]\), got -0\.1/,
    ],
    [
      ds,
      { augment: { brightness: Infinity } },
      /augment\.brightness option should be a finite number >= 0/,
    ],
    [
      ds,
      { augment: { contrast: NaN } },
      /augment\.contrast option should be a finite number >= 0.*got NaN/,
    ],
    [
      ds,
      { augment: { contrast: "0.4" as unknown as number } },
      /augment\.contrast option should be a number \(a jitter j >= 0\), got 0\.4/,
    ],
    [
      ds,
      { augment: { saturation: -0.1 } },
      /augment\.saturation option should be a finite number >= 0.*got -0\.1/,
    ],
    [
      ds,
      { augment: { hue: 0.6 } },
      /augment\.hue option should be a number in \[0, 0\.5\].*got 0\.6/,
    ],
    [
      ds,
      { augment: { hue: NaN } },
      /augment\.hue option should be a number in \[0, 0\.5\].*got NaN/,
    ],
    [
      ds,
      { augment: { saturaton: 0.2 } as unknown as { cutout: number } },
      /unknown option "saturaton" \(did you mean "saturation"\?\)/,
    ],
    [
      ds,
      { augment: { cutuot: 4 } as unknown as { cutout: number } },
      /Cannot create DataLoader with augment: unknown option "cutuot" \(did you mean "cutout"\?\); options are padding, flip, vflip, cutout, brightness, contrast, saturation, hue/,
    ],
    [generic, { augment: { padding: 4 } }, /augment option needs the zero-copy path/],
    [generic, { zeroCopy: true }, /zeroCopy option needs a dataset with sharedFields/],
    [
      ds,
      { zeroCopy: true, collate: (s: unknown[]) => s },
      /zeroCopy option is mutually exclusive with collate/,
    ],
    [
      generic,
      { numWorkers: 2 },
      /numWorkers option 2 needs a dataset that workers can rebuild: implement workerSpec\(\)/,
    ],
    [
      ds,
      { batch_size: 4 } as unknown as DataLoaderOptions,
      /Cannot create DataLoader: unknown option "batch_size" \(did you mean "batchSize"\?\); options are batchSize, shuffle/,
    ],
    [
      ds,
      { workerResourceLimits: { stackSize: 4 } } as unknown as DataLoaderOptions,
      /Cannot create DataLoader with workerResourceLimits: unknown option "stackSize" \(did you mean "stackSizeMb"\?\)/,
    ],
  ];
  for (const [dataset, options, pattern] of cases) {
    assert.throws(() => new DataLoader(dataset, options), pattern, JSON.stringify(options));
  }
  assert.throws(() => new DataLoader({} as Dataset), /dataset must have a numeric length/);
  const fields = (buffer: ArrayBufferLike) => ({
    length: 4,
    get: (i: number) => i,
    sharedFields:
      () => [{ name: "x", dtype: "f32" as const, shape: [2], buffer: buffer as SharedArrayBuffer }],
  });
  assert.throws(
    () => new DataLoader(fields(new ArrayBuffer(32))),
    /"x" is not in a SharedArrayBuffer/,
  );
  assert.throws(
    () => new DataLoader(fields(new SharedArrayBuffer(16))),
    /"x" needs 32 bytes for 4 samples, its buffer has 16/,
  );
});
