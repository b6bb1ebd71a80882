// The DataLoader's batch type is inferred from the dataset and the options (issue 11, item 6).
// The checks are mostly at the type level: `deno test` type-checks this file, so a regression
// in the inference fails it (an `Expect<Equal<...>>` turns false, or a `@ts-expect-error`
// line stops being an error). The runtime parts show the inferred types are what the loader
// yields.

import assert from "node:assert";
import { type Collated, defaultCollate } from "../loader/collate.ts";
import { type BatchOf, DataLoader } from "../loader/data_loader.ts";
import { type Dataset, sharedArray, type SharedFieldsOf } from "../loader/dataset.ts";
import type { CIFAR10 } from "../loader/datasets/cifar10.ts";
import type { FashionMNIST, MNIST } from "../loader/datasets/mnist.ts";
import { Subset } from "../loader/datasets/subset.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { RingBatch } from "../loader/ring.ts";
import type { DevicePrefetcher, toDevice } from "../pipeline/prefetcher.ts";

/** True when A and B are the same type (not merely assignable both ways). */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true
  : false;
/** Compiles only for `true`. */
function expectType<T extends true>(_check?: T): void {}

type BatchOfLoader<L> = L extends DataLoader<infer B> ? B : never;

function images(n: number) {
  return new TensorDataset({
    image: { data: new Uint8Array(n * 3 * 2 * 2), shape: [3, 2, 2] },
    label: Int32Array.from({ length: n }, (_, i) => i),
  });
}

Deno.test("A TensorDataset's loader yields RingBatches with its field names and arrays", async () => {
  await using loader = new DataLoader(images(4), { batchSize: 2 });
  expectType<
    Equal<BatchOfLoader<typeof loader>, RingBatch<{ image: Uint8Array; label: Int32Array }>>
  >(true);
  const labels: number[] = [];
  for await (const batch of loader) {
    assert.ok(batch instanceof RingBatch);
    const image: Uint8Array = batch.fields.image;
    const label: Int32Array = batch.fields.label;
    assert.strictEqual(image.length, batch.size * 12);
    labels.push(...label);
    // @ts-expect-error a misspelt field name is a type error, not an undefined at run time
    assert.strictEqual(batch.fields.lable, undefined);
    // @ts-expect-error a RingBatch is not a collated object: the label is batch.fields.label
    assert.strictEqual(batch.label, undefined);
  }
  assert.deepStrictEqual(labels, [0, 1, 2, 3]);
});

Deno.test("CIFAR10, MNIST and FashionMNIST loaders yield their typed RingBatch", () => {
  type Fields = { image: Uint8Array; label: Int32Array };
  expectType<Equal<SharedFieldsOf<CIFAR10>, Fields>>(true);
  expectType<Equal<BatchOf<CIFAR10, { batchSize: 128 }>, RingBatch<Fields>>>(true);
  expectType<Equal<BatchOf<MNIST>, RingBatch<Fields>>>(true);
  expectType<Equal<BatchOf<FashionMNIST, { shuffle: true }>, RingBatch<Fields>>>(true);
  // The generic path over the same dataset collates its samples.
  expectType<
    Equal<BatchOf<CIFAR10, { zeroCopy: false }>, { image: Uint8Array; label: Float64Array }>
  >(true);
  // A dataset that may be either of two gives either of their batches (here alike).
  const either: RingBatch<Fields> = null! as BatchOf<CIFAR10 | MNIST>;
  const back: BatchOf<CIFAR10 | MNIST> = either;
  void back;
});

Deno.test("A generic dataset's loader yields what defaultCollate makes of its samples", async () => {
  const dataset = {
    length: 5,
    get: (i: number) => ({ x: i * 10, y: new Uint8Array([i]), name: `s${i}`, pair: [i, true] }),
  };
  await using loader = new DataLoader(dataset, { batchSize: 2 });
  type Batch = {
    x: Float64Array;
    y: Uint8Array;
    name: string[];
    pair: (Float64Array | Uint8Array)[];
  };
  expectType<Equal<BatchOfLoader<typeof loader>, Batch>>(true);
  const xs: number[][] = [];
  for await (const b of loader) {
    xs.push([...b.x]);
    assert.ok(b.y instanceof Uint8Array);
    assert.ok(Array.isArray(b.name));
    // @ts-expect-error a collated batch has no ring fields
    assert.strictEqual(b.fields, undefined);
  }
  assert.deepStrictEqual(xs, [[0, 10], [20, 30], [40]]);

  // Tuples collate per position; numbers, bigints, booleans, strings as defaultCollate does.
  expectType<Equal<Collated<[number, Int32Array]>, [Float64Array, Int32Array]>>(true);
  expectType<Equal<Collated<bigint>, BigInt64Array>>(true);
  expectType<Equal<Collated<boolean>, Uint8Array>>(true);
  expectType<Equal<Collated<{ s: string }>, { s: string[] }>>(true);
  expectType<Equal<Collated<unknown>, unknown>>(true);
  expectType<Equal<Collated<null>, never>>(true);
  const collated = defaultCollate([{ a: 1, b: new Float32Array(2) }]);
  expectType<Equal<typeof collated, { a: Float64Array; b: Float32Array }>>(true);
  assert.ok(collated.b instanceof Float32Array);

  // A promise-returning get collates what it resolves to.
  const asyncDs = { length: 2, get: (i: number) => Promise.resolve(i) };
  expectType<Equal<BatchOf<typeof asyncDs>, Float64Array>>(true);
});

Deno.test("A collate function gives its return type, batchSize null the sample type", async () => {
  const dataset = { length: 4, get: (i: number) => ({ v: i }) };
  // The collate function's samples are typed from the dataset.
  await using summed = new DataLoader(dataset, {
    batchSize: 2,
    collate: (samples) => samples.reduce((a, s) => a + s.v, 0),
  });
  expectType<Equal<BatchOfLoader<typeof summed>, number>>(true);
  const sums: number[] = [];
  for await (const s of summed) sums.push(s);
  assert.deepStrictEqual(sums, [1, 5]);

  await using single = new DataLoader(dataset, { batchSize: null });
  expectType<Equal<BatchOfLoader<typeof single>, { v: number }>>(true);
  for await (const s of single) assert.strictEqual(typeof s.v, "number");

  // zeroCopy: false over a zero-copy dataset: the collated samples.
  await using generic = new DataLoader(images(2), { batchSize: 2, zeroCopy: false });
  expectType<
    Equal<BatchOfLoader<typeof generic>, { image: Uint8Array; label: Float64Array }>
  >(true);
  for await (const b of generic) assert.deepStrictEqual([...b.label], [0, 1]);
});

Deno.test("Explicit batch types keep compiling, and typed loaders are DataLoader<RingBatch>", async () => {
  const ds = images(2);
  await using explicit = new DataLoader<RingBatch>(ds, { batchSize: 2 });
  expectType<Equal<typeof explicit, DataLoader<RingBatch>>>(true);
  await using opaque = new DataLoader<unknown>(ds);
  expectType<Equal<typeof opaque, DataLoader<unknown>>>(true);
  await using inferred = new DataLoader(ds, { batchSize: 2 });
  // Covariant in the batch type: a typed loader goes where a RingBatch (or any) loader does,
  // as the DevicePrefetcher and toDevice take it.
  const asRing: DataLoader<RingBatch> = inferred;
  const asUnknown: DataLoader<unknown> = inferred;
  type PrefetcherLoader = ConstructorParameters<typeof DevicePrefetcher>[0];
  const forPrefetcher: PrefetcherLoader = inferred;
  const forToDevice: Parameters<typeof toDevice>[0] = inferred;
  assert.ok(asRing === asUnknown && forPrefetcher === forToDevice);
  assert.ok(inferred instanceof DataLoader);
  // A RingBatch with typed fields is a RingBatch.
  for await (const b of inferred) {
    const plain: RingBatch = b;
    assert.ok(plain.fields.image instanceof Uint8Array);
  }
  // A dataset typed only as Dataset may take either path: the batch is not known.
  const loose: Dataset = ds;
  await using unknownLoader = new DataLoader(loose, { batchSize: 2 });
  expectType<Equal<BatchOfLoader<typeof unknownLoader>, unknown>>(true);
  // A Subset of a zero-copy dataset may be zero-copy (its sharedFields is optional).
  await using sub = new DataLoader(new Subset(ds, [1]), { batchSize: 1 });
  for await (const b of sub) {
    assert.ok(b instanceof RingBatch);
    assert.deepStrictEqual([...b.fields.label], [1]);
  }
});

Deno.test("sharedArray returns the dtype's typed array on shared memory and refuses a bad dtype or length", () => {
  const images = sharedArray("u8", 3 * 32 * 32);
  expectType<Equal<typeof images, Uint8Array>>(true);
  const labels = sharedArray("i32", 10);
  expectType<Equal<typeof labels, Int32Array>>(true);
  const f16 = sharedArray("f16", 4);
  expectType<Equal<typeof f16, Float16Array>>(true);
  assert.ok(images instanceof Uint8Array && images.length === 3072);
  assert.ok(labels instanceof Int32Array && labels.length === 10);
  assert.ok(labels.buffer instanceof SharedArrayBuffer);
  assert.strictEqual(sharedArray("f64", 0).length, 0);
  // Spelled as PyTorch or NumPy would: named, with the accepted spellings.
  for (const bad of ["uint8", "float32", "", "U8"]) {
    assert.throws(
      // @ts-expect-error: not a FieldDType
      () => sharedArray(bad, 4),
      (e: Error) =>
        e instanceof TypeError &&
        e.message ===
          `Cannot allocate a shared array: dtype must be one of u8, i8, u16, i16, u32, i32, f16, f32, f64, got ${
            JSON.stringify(bad)
          }`,
    );
  }
  for (const bad of [-1, 1.5, NaN, Infinity]) {
    assert.throws(
      () => sharedArray("u8", bad),
      (e: Error) =>
        e instanceof RangeError &&
        e.message ===
          `Cannot allocate a shared array: length must be a non-negative integer, got ${bad}`,
    );
  }
});
