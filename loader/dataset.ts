/**
 * What a dataset is to the {@linkcode DataLoader}: a length, `get(index)`, and optionally
 * how workers rebuild it (`workerSpec`) and a fixed-size sample layout in shared memory
 * (`sharedFields`) that enables the zero-copy path.
 *
 * @module
 */

/**
 * Element type of a shared dataset field and of a ring field (what workers gather), one per
 * TypedArray kind. Not the device {@linkcode DType} of a Tensor ("u8", "i32", "f16", "f32").
 */
export type FieldDType = "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "f16" | "f32" | "f64";

/** A typed array of one of the {@linkcode FieldDType}s. */
export type TypedArray =
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | Int32Array
  | Float16Array
  | Float32Array
  | Float64Array;

/**
 * The typed array of each {@linkcode FieldDType}: what a shared field of that dtype becomes
 * in a {@linkcode RingBatch}.
 */
export interface FieldArrays {
  /** Bytes. */
  u8: Uint8Array;
  /** Signed bytes. */
  i8: Int8Array;
  /** Unsigned 16-bit integers. */
  u16: Uint16Array;
  /** Signed 16-bit integers. */
  i16: Int16Array;
  /** Unsigned 32-bit integers. */
  u32: Uint32Array;
  /** Signed 32-bit integers. */
  i32: Int32Array;
  /** Half floats. */
  f16: Float16Array;
  /** Floats. */
  f32: Float32Array;
  /** Doubles. */
  f64: Float64Array;
}

/**
 * The typed array of a {@linkcode FieldDType} (`FieldArray<"u8">` is `Uint8Array`); of
 * `FieldDType` itself, any {@linkcode TypedArray}.
 */
export type FieldArray<D extends FieldDType = FieldDType> = FieldArrays[D];

/**
 * The {@linkcode FieldDType} of a typed array type (`DTypeOf<Int32Array>` is `"i32"`), the
 * type-level {@linkcode dtypeOf}; `never` for other types.
 */
export type DTypeOf<A> = {
  [D in FieldDType]: A extends FieldArrays[D] ? D : never;
}[FieldDType];

/**
 * The sample type of a dataset type: what its `get` resolves to (`unknown` when not known).
 *
 * @typeParam D a dataset type
 */
export type SampleOf<D> = D extends { get(index: number, ...rest: never[]): infer T }
  ? Exclude<Awaited<T>, typeof SKIP_SAMPLE>
  : unknown;

/**
 * The batch fields of a zero-copy dataset type: its `sharedFields()` entries by name, each
 * the typed array of its dtype (`{ image: Uint8Array; label: Int32Array }` for
 * {@linkcode CIFAR10}); `Record<string, TypedArray>` when `sharedFields()` returns plain
 * {@linkcode SharedField}s (as a {@linkcode Subset}'s, which it may lack), and `never` for a
 * dataset without `sharedFields()`.
 *
 * @typeParam D a dataset type
 */
export type SharedFieldsOf<D> = D extends { sharedFields?: infer M }
  ? NonNullable<M> extends () => readonly (infer S extends SharedField<string, FieldDType>)[]
    ? D extends { filledFields?: infer F }
      // With fields the dataset fills itself (decoded images): those too.
      ? NonNullable<F> extends () => readonly (infer G extends FilledField<string, FieldDType>)[]
        ? {
          [K in S["name"] | G["name"]]: FieldArray<
            Extract<S | G, { readonly name: K }>["dtype"]
          >;
        }
      : { [K in S["name"]]: FieldArray<Extract<S, { readonly name: K }>["dtype"]> }
    : { [K in S["name"]]: FieldArray<Extract<S, { readonly name: K }>["dtype"]> }
  : never
  : never;

/** A constructor of one of the {@linkcode TypedArray}s. */
export type TypedArrayCtor = {
  new (buffer: ArrayBufferLike, byteOffset?: number, length?: number): TypedArray;
  new (length: number): TypedArray;
  readonly BYTES_PER_ELEMENT: number;
};

/** Bytes per element and constructor of every {@linkcode FieldDType}. */
export const DTYPES: Readonly<Record<FieldDType, { bytes: number; ctor: TypedArrayCtor }>> = {
  u8: { bytes: 1, ctor: Uint8Array as TypedArrayCtor },
  i8: { bytes: 1, ctor: Int8Array as TypedArrayCtor },
  u16: { bytes: 2, ctor: Uint16Array as TypedArrayCtor },
  i16: { bytes: 2, ctor: Int16Array as TypedArrayCtor },
  u32: { bytes: 4, ctor: Uint32Array as TypedArrayCtor },
  i32: { bytes: 4, ctor: Int32Array as TypedArrayCtor },
  f16: { bytes: 2, ctor: Float16Array as TypedArrayCtor },
  f32: { bytes: 4, ctor: Float32Array as TypedArrayCtor },
  f64: { bytes: 8, ctor: Float64Array as TypedArrayCtor },
};

/**
 * One fixed-size field of every sample, stored contiguously in shared memory: sample `i`'s
 * record is the `product(shape)` elements at `byteOffset + i * recordBytes` of `buffer`.
 * A scalar field (a label) has `shape: []`.
 *
 * A dataset whose `sharedFields()` returns fields with literal names and dtypes
 * (`SharedField<"label", "i32">`) gives the DataLoader typed batch fields
 * (see {@linkcode SharedFieldsOf}).
 *
 * @typeParam N the field name
 * @typeParam D the element type
 */
export interface SharedField<N extends string = string, D extends FieldDType = FieldDType> {
  /** Field name, e.g. "image" or "label"; becomes the batch field name. */
  readonly name: N;
  /** Element type. */
  readonly dtype: D;
  /** Per-sample shape, e.g. [3, 32, 32] (CHW) or [] for a scalar. */
  readonly shape: readonly number[];
  /** Where the records live; every worker maps the same memory. */
  readonly buffer: SharedArrayBuffer;
  /** Byte offset of record 0 (default 0); a multiple of the element size. */
  readonly byteOffset?: number;
}

/**
 * How a worker rebuilds a dataset: `import(module)`, resolve the dotted `export` path
 * (e.g. "CIFAR10.fromState"), call it with `state`. `state` is structured-cloned once per
 * worker at start-up; SharedArrayBuffers inside it are shared, not copied.
 */
export interface WorkerSpec {
  /** Absolute module URL, usually `import.meta.url` of the dataset's module. */
  readonly module: string;
  /** Dotted path of a function in that module returning the dataset (or a promise of it). */
  readonly export: string;
  /** Argument of that function: structured-clonable. */
  readonly state: unknown;
}

/**
 * What a dataset's `get` returns for a sample it skips (a bad file under an explicit skip
 * policy): the sample is left out of its batch, which is then smaller. The dataset counts
 * and reports what it skips; the loader only drops it.
 *
 * @example
 * ```ts
 * import { DataLoader, SKIP_SAMPLE } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ds = { length: 4, get: (i: number) => (i === 2 ? SKIP_SAMPLE : i) };
 * const batches: number[][] = [];
 * for await (const b of new DataLoader(ds, { batchSize: 2 })) batches.push([...b as Float64Array]);
 * assert.deepStrictEqual(batches, [[0, 1], [3]]);
 * ```
 */
export const SKIP_SAMPLE: unique symbol = Symbol.for("pinstream.skipSample") as never;

/** Per-sample context passed to `get`: where the sample sits and its own random stream. */
export interface SampleContext {
  /** The epoch being loaded. */
  readonly epoch: number;
  /**
   * The sample's draw position: its place in the epoch's order (0-based, across batches) or,
   * over a DistributedSampler, in the un-sharded order (`rank + k * worldSize` for the
   * rank's k-th sample), so no two ranks see the same one (augment/record.ts).
   */
  readonly position: number;
  /** Worker id in [0, numWorkers), or -1 on the main thread. */
  readonly workerId: number;
  /**
   * A double in [0, 1) from the sample's own stream, a pure function of (seed, epoch,
   * position): the same whatever worker, or rank, loads the sample.
   */
  random(): number;
  /** An integer in [0, n) from the same stream. */
  int(n: number): number;
  /**
   * A uint32 from the same stream. Its first {@linkcode LOADER_DRAWS} draws are the ones the
   * loader's own records take (augment/record.ts: the augment record from draw 0, the geometry
   * record from draw 32): a dataset that draws its own randomness while the loader also augments
   * should start after them ({@linkcode afterLoaderDraws}), or its values follow the loader's.
   */
  u32(): number;
}

/**
 * Draws of a sample's stream that the loader's records may take: 0 ..
 * `LOADER_DRAWS - 1`. A dataset's own randomness that must not follow them starts here.
 */
export const LOADER_DRAWS = 128;

/**
 * A `random()` over the sample's stream after the draws the loader's records take, so a
 * dataset's own random choices (ImageFolder's `randomResizedCrop` in the workers) are
 * independent of the loader's augment and geometry parameters for the same sample.
 *
 * @param context The sample's context.
 * @returns Doubles in [0, 1) from draw {@linkcode LOADER_DRAWS} on.
 * @example
 * ```ts
 * import { afterLoaderDraws, LOADER_DRAWS, type SampleContext } from "./dataset.ts";
 * import assert from "node:assert";
 * let skipped = 0;
 * const ctx = { u32: () => skipped++, random: () => 0.5 } as unknown as SampleContext;
 * const random = afterLoaderDraws(ctx);
 * assert.strictEqual(random(), 0.5);
 * assert.strictEqual(random(), 0.5);
 * assert.strictEqual(skipped, LOADER_DRAWS);
 * ```
 */
export function afterLoaderDraws(context: SampleContext): () => number {
  let skipped = false;
  return () => {
    if (!skipped) {
      for (let i = 0; i < LOADER_DRAWS; i++) context.u32();
      skipped = true;
    }
    return context.random();
  };
}

/**
 * A map-style dataset. `get` may return a promise. For `numWorkers > 0` the dataset must
 * provide `workerSpec()` (generic path) or `sharedFields()` (zero-copy path).
 */
export interface Dataset<T = unknown> {
  /** Number of samples. */
  readonly length: number;
  /** Sample `index`, or {@linkcode SKIP_SAMPLE} to leave it out of its batch. */
  get(
    index: number,
    context?: SampleContext,
  ): T | typeof SKIP_SAMPLE | Promise<T | typeof SKIP_SAMPLE>;
  /** How workers rebuild this dataset. */
  workerSpec?(): WorkerSpec;
  /** The fixed-size shared layout enabling the zero-copy path. */
  sharedFields?(): readonly SharedField[];
  /**
   * Fields the dataset writes straight into the ring slot on the zero-copy path (decoded
   * images of a fixed size), next to its `sharedFields()`: `fillRecord` writes them.
   */
  filledFields?(): readonly FilledField[];
  /**
   * Writes record `record`'s value of filled field `field` (its position in
   * `filledFields()`) into `out` (the sample's place in the ring slot), synchronously, with
   * the sample's context (its random stream, as `get` has it). Throws, naming the record,
   * when it cannot.
   */
  fillRecord?(record: number, field: number, out: Uint8Array, context: SampleContext): void;
  /** Loads what `fillRecord` needs (decoders), once per thread before its first fill. */
  prepareFill?(): Promise<void>;
  /**
   * For a dataset whose samples are records of `sharedFields()` at other positions (a
   * {@linkcode Subset}): sample i is record `indices[i]`, and the fields hold `count` records.
   * Absent: sample i is record i, and the fields hold `length` records.
   */
  records?(): RecordMap;
}

/**
 * A fixed-size field a dataset writes into the ring itself (`Dataset.fillRecord`), e.g. an
 * image decoded to a fixed size: it lands in the shared slot with no copy.
 */
export interface FilledField<N extends string = string, D extends FieldDType = FieldDType> {
  /** Field name; becomes the batch field name. */
  readonly name: N;
  /** Element type. */
  readonly dtype: D;
  /** Per-sample shape, e.g. [224, 224, 3] (HWC). */
  readonly shape: readonly number[];
}

/** Where a dataset's samples are among the records of its shared fields. */
export interface RecordMap {
  /** Record of each sample. */
  readonly indices: Int32Array;
  /** Records the shared fields hold. */
  readonly count: number;
}

import { allocShared } from "./_wasm_gather.ts";

/**
 * Bytes of one record of a field.
 *
 * @param field dtype and shape
 * @returns element size times the product of the shape
 * @example Bytes of a CIFAR image
 * ```ts
 * import { recordBytes } from "./dataset.ts";
 * import assert from "node:assert";
 * assert.strictEqual(recordBytes({ dtype: "u8", shape: [3, 32, 32] }), 3072);
 * ```
 */
export function recordBytes(field: { dtype: FieldDType; shape: readonly number[] }): number {
  return DTYPES[field.dtype].bytes * field.shape.reduce((a, b) => a * b, 1);
}

/**
 * Allocates a SharedArrayBuffer-backed typed array of `length` elements.
 *
 * @param dtype element type
 * @param length number of elements
 * @returns the array; its buffer is shared by every worker it is sent to. The buffer is the
 *   memory of a shared WebAssembly.Memory (up to 4 GiB, rounded up to 64 KiB), which lets
 *   the zero-copy path gather it with `memory.copy`; datasets should allocate with this.
 * @throws {TypeError} dtype is not a {@linkcode FieldDType} ("u8", not "uint8").
 * @throws {RangeError} length is not a non-negative integer.
 * @example Shared labels
 * ```ts
 * import { sharedArray, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const images = sharedArray("u8", 10 * 3 * 8 * 8); // a Uint8Array
 * const labels = sharedArray("i32", 10); // an Int32Array
 * assert.ok(labels.buffer instanceof SharedArrayBuffer);
 * const ds = new TensorDataset({ image: { data: images, shape: [3, 8, 8] }, label: labels });
 * assert.strictEqual(ds.length, 10);
 * ```
 */
export function sharedArray<D extends FieldDType>(dtype: D, length: number): FieldArray<D> {
  if (!Object.hasOwn(DTYPES, dtype)) {
    throw new TypeError(
      `Cannot allocate a shared array: dtype must be one of ${Object.keys(DTYPES).join(", ")}, ` +
        `got ${JSON.stringify(dtype)}`,
    );
  }
  if (!Number.isSafeInteger(length) || length < 0) {
    throw new RangeError(
      `Cannot allocate a shared array: length must be a non-negative integer, got ${length}`,
    );
  }
  const { bytes, ctor } = DTYPES[dtype];
  return new ctor(allocShared(length * bytes), 0, length) as FieldArray<D>;
}

/**
 * The dtype of a typed array, or undefined for other values.
 *
 * @param value any value
 * @returns its FieldDType or undefined
 * @example
 * ```ts
 * import { dtypeOf } from "./dataset.ts";
 * import assert from "node:assert";
 * assert.strictEqual(dtypeOf(new Float32Array(1)), "f32");
 * assert.strictEqual(dtypeOf([1]), undefined);
 * ```
 */
export function dtypeOf(value: unknown): FieldDType | undefined {
  if (value instanceof Uint8Array) return "u8";
  if (value instanceof Int8Array) return "i8";
  if (value instanceof Uint16Array) return "u16";
  if (value instanceof Int16Array) return "i16";
  if (value instanceof Uint32Array) return "u32";
  if (value instanceof Int32Array) return "i32";
  if (value instanceof Float16Array) return "f16";
  if (value instanceof Float32Array) return "f32";
  if (value instanceof Float64Array) return "f64";
  return undefined;
}
