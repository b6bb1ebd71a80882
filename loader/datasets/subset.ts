/**
 * `Subset`, `ConcatDataset` and `randomSplit`: PyTorch's `torch.utils.data` helpers for
 * taking part of a dataset, chaining datasets and splitting one into train/validation parts.
 * A Subset of a zero-copy dataset stays zero-copy (workers gather its records in place);
 * both rebuild in workers from the datasets they wrap.
 *
 * @module
 */

import { refuseUnknownKeys } from "../../internal/options.ts";
import { resolveRef } from "../_protocol.ts";
import { permutation, randomSeed, SequenceRandom } from "../../internal/random.ts";
import type {
  Dataset,
  FilledField,
  RecordMap,
  SampleContext,
  SharedField,
  SKIP_SAMPLE,
  WorkerSpec,
} from "../dataset.ts";

/** Stream id of randomSplit's permutation (apart from the samplers' and samples' streams). */
const STREAM_SPLIT = 4;

/** What a worker rebuilds a {@linkcode Subset} from. */
export interface SubsetState {
  /** How to rebuild the wrapped dataset. */
  dataset: WorkerSpec;
  /** The wrapped dataset's index of each sample. */
  indices: Int32Array;
}

/** What a worker rebuilds a {@linkcode ConcatDataset} from. */
export interface ConcatDatasetState {
  /** How to rebuild each part. */
  datasets: WorkerSpec[];
}

async function rebuild(spec: WorkerSpec): Promise<Dataset> {
  const make = await resolveRef(spec);
  return (await make(spec.state)) as Dataset;
}

function checkLength(dataset: Dataset, action: string): number {
  const n = dataset?.length;
  if (typeof dataset?.get !== "function" || !Number.isInteger(n) || n < 0) {
    throw new TypeError(`Cannot ${action}: expected a dataset (length and get), got ${dataset}`);
  }
  return n;
}

/**
 * The samples of `dataset` at `indices`, in that order (PyTorch's `Subset`). Sample i is
 * `dataset.get(indices[i])`. Over a dataset with `sharedFields()` the subset has them too and
 * the DataLoader's zero-copy path gathers its records in place (a RingBatch's `indices` are
 * then positions in the wrapped dataset).
 *
 * @typeParam T the sample type
 * @example The even samples of a TensorDataset, through the zero-copy loader
 * ```ts
 * import { DataLoader, type RingBatch, Subset, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const all = new TensorDataset({ label: Int32Array.from({ length: 10 }, (_, i) => i) });
 * const even = new Subset(all, [0, 2, 4, 6, 8]);
 * await using loader = new DataLoader<RingBatch>(even, { batchSize: 5 });
 * for await (const b of loader) assert.deepStrictEqual([...b.fields.label], [0, 2, 4, 6, 8]);
 * ```
 */
export class Subset<T = unknown> implements Dataset<T> {
  /** The wrapped dataset. */
  readonly dataset: Dataset<T>;
  /** The wrapped dataset's index of each sample. */
  readonly indices: Int32Array;
  /** Sample count (`indices.length`). */
  readonly length: number;
  /** Present when the wrapped dataset has it: its shared fields (zero-copy path). */
  readonly sharedFields?: () => readonly SharedField[];
  /** Present when the wrapped dataset has it: how workers rebuild this subset. */
  readonly workerSpec?: () => WorkerSpec;
  /** Present when the wrapped dataset has them: fields it writes into the ring itself. */
  readonly filledFields?: () => readonly FilledField[];
  /** Present with `filledFields`: writes a record's filled field. */
  readonly fillRecord?: (
    record: number,
    field: number,
    out: Uint8Array,
    context: SampleContext,
  ) => void;
  /** Present with `filledFields`: loads what the fill needs. */
  readonly prepareFill?: () => Promise<void>;
  /** Present with `sharedFields`: where this subset's samples are among the records. */
  readonly records?: () => RecordMap;

  /**
   * Creates it; see the class documentation.
   *
   * @param dataset The dataset to take samples from.
   * @param indices Its indices, each an integer in [0, dataset.length); repeats allowed.
   * @throws {TypeError} When `dataset` is not a dataset.
   * @throws {RangeError} When an index is not an integer in range, naming its position.
   */
  constructor(dataset: Dataset<T>, indices: ArrayLike<number> | Iterable<number>) {
    const n = checkLength(dataset, "create Subset");
    const list = Array.from(indices as ArrayLike<number>);
    for (const [k, i] of list.entries()) {
      if (!Number.isInteger(i) || i < 0 || i >= n) {
        throw new RangeError(
          `Cannot create Subset: indices[${k}] is ${i}, not an index of a dataset of ${n} samples`,
        );
      }
    }
    this.dataset = dataset;
    this.indices = Int32Array.from(list);
    this.length = this.indices.length;
    if (typeof dataset.sharedFields === "function") {
      this.sharedFields = () => dataset.sharedFields!();
      // Filled fields are written by record, as the shared ones are read: no mapping here.
      if (typeof dataset.filledFields === "function") {
        this.filledFields = () => dataset.filledFields!();
        this.fillRecord = (record, field, out, context) =>
          dataset.fillRecord!(record, field, out, context);
        this.prepareFill = async () => await dataset.prepareFill?.();
      }
      this.records = () => {
        const inner = dataset.records?.();
        const indices = inner === undefined
          ? this.indices.slice()
          : this.indices.map((i) => inner.indices[i]);
        return { indices, count: inner?.count ?? n };
      };
    }
    if (typeof dataset.workerSpec === "function") {
      this.workerSpec = () => ({
        module: import.meta.url,
        export: "Subset.fromState",
        state: { dataset: dataset.workerSpec!(), indices: this.indices } satisfies SubsetState,
      });
    }
  }

  /**
   * Rebuilds a subset in a worker from {@linkcode Subset.workerSpec}'s state.
   *
   * @param state The state.
   * @returns The subset over the rebuilt dataset.
   */
  static async fromState(state: SubsetState): Promise<Subset> {
    return new Subset(await rebuild(state.dataset), state.indices);
  }

  /**
   * Sample `index`: the wrapped dataset's sample `indices[index]`.
   *
   * @param index An integer in [0, length).
   * @param context Passed on to the wrapped dataset.
   * @returns The sample.
   * @throws {RangeError} When `index` is out of range.
   */
  get(
    index: number,
    context?: SampleContext,
  ): T | typeof SKIP_SAMPLE | Promise<T | typeof SKIP_SAMPLE> {
    if (!Number.isInteger(index) || index < 0 || index >= this.length) {
      throw new RangeError(
        `Cannot get sample ${index}: out of range for a Subset of ${this.length} samples`,
      );
    }
    return this.dataset.get(this.indices[index], context);
  }
}

/**
 * Datasets one after another (PyTorch's `ConcatDataset`): samples 0..a-1 are the first
 * dataset's, a..a+b-1 the second's, and so on. Generic path only (its parts' records live in
 * different buffers); with workers, every part needs `workerSpec()`.
 *
 * @typeParam T the sample type
 * @example Two datasets as one
 * ```ts
 * import { ConcatDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const a = { length: 2, get: (i: number) => `a${i}` };
 * const b = { length: 3, get: (i: number) => `b${i}` };
 * const ab = new ConcatDataset([a, b]);
 * assert.strictEqual(ab.length, 5);
 * assert.deepStrictEqual([0, 1, 2, 3, 4].map((i) => ab.get(i)), ["a0", "a1", "b0", "b1", "b2"]);
 * ```
 */
export class ConcatDataset<T = unknown> implements Dataset<T> {
  /** The parts, in order. */
  readonly datasets: readonly Dataset<T>[];
  /** Cumulative sizes: `cumulativeSizes[k]` samples are in parts 0..k. */
  readonly cumulativeSizes: readonly number[];
  /** Total sample count. */
  readonly length: number;
  /** Present when every part has it: how workers rebuild this dataset. */
  readonly workerSpec?: () => WorkerSpec;

  /**
   * Creates it; see the class documentation.
   *
   * @param datasets The parts (at least one).
   * @throws {TypeError} When `datasets` is empty or holds a non-dataset.
   */
  constructor(datasets: readonly Dataset<T>[]) {
    if (!Array.isArray(datasets) || datasets.length === 0) {
      throw new TypeError("Cannot create ConcatDataset: datasets should be a non-empty array");
    }
    let total = 0;
    const sizes: number[] = [];
    for (const d of datasets) {
      total += checkLength(d, "create ConcatDataset");
      sizes.push(total);
    }
    this.datasets = [...datasets];
    this.cumulativeSizes = sizes;
    this.length = total;
    if (datasets.every((d) => typeof d.workerSpec === "function")) {
      this.workerSpec = () => ({
        module: import.meta.url,
        export: "ConcatDataset.fromState",
        state: { datasets: this.datasets.map((d) => d.workerSpec!()) } satisfies ConcatDatasetState,
      });
    }
  }

  /**
   * Rebuilds it in a worker from {@linkcode ConcatDataset.workerSpec}'s state.
   *
   * @param state The state.
   * @returns The dataset over the rebuilt parts.
   */
  static async fromState(state: ConcatDatasetState): Promise<ConcatDataset> {
    return new ConcatDataset(await Promise.all(state.datasets.map(rebuild)));
  }

  /**
   * Sample `index`, from the part it falls in.
   *
   * @param index An integer in [0, length).
   * @param context Passed on to the part.
   * @returns The sample.
   * @throws {RangeError} When `index` is out of range.
   */
  get(
    index: number,
    context?: SampleContext,
  ): T | typeof SKIP_SAMPLE | Promise<T | typeof SKIP_SAMPLE> {
    if (!Number.isInteger(index) || index < 0 || index >= this.length) {
      throw new RangeError(
        `Cannot get sample ${index}: out of range for a ConcatDataset of ${this.length} samples`,
      );
    }
    // Binary search for the first part whose cumulative size exceeds index.
    let lo = 0, hi = this.cumulativeSizes.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.cumulativeSizes[mid] > index) hi = mid;
      else lo = mid + 1;
    }
    const start = lo === 0 ? 0 : this.cumulativeSizes[lo - 1];
    return this.datasets[lo].get(index - start, context);
  }
}

/** Options of {@linkcode randomSplit}. */
export interface RandomSplitOptions {
  /** Seed of the permutation (PyTorch's `generator`). Default: random. */
  seed?: number;
}

/**
 * Splits a dataset into non-overlapping random {@linkcode Subset}s (PyTorch's
 * `random_split`). `lengths` are sample counts summing to `dataset.length`, or fractions
 * summing to 1: each part gets `floor(fraction * n)` and the remainder is dealt one sample at a
 * time to the parts in order, as PyTorch does. The permutation is a pure function of `seed`
 * (not the same numbers as `torch.randperm`).
 *
 * @typeParam T the sample type
 * @param dataset The dataset to split.
 * @param lengths Counts or fractions, one per part.
 * @param options `seed`.
 * @returns One Subset per entry of `lengths`.
 * @throws {RangeError} When the counts do not sum to the dataset's length, or the fractions
 * to 1, or one is negative.
 * @example A 90/10 train/validation split
 * ```ts
 * import { randomSplit, TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ds = new TensorDataset({ x: new Float32Array(50) });
 * const [train, val] = randomSplit(ds, [0.9, 0.1], { seed: 42 });
 * assert.deepStrictEqual([train.length, val.length], [45, 5]);
 * assert.strictEqual(new Set([...train.indices, ...val.indices]).size, 50);
 * ```
 */
export function randomSplit<T>(
  dataset: Dataset<T>,
  lengths: readonly number[],
  options: RandomSplitOptions = {},
): Subset<T>[] {
  refuseUnknownKeys(options ?? {}, ["seed"], "split a dataset");
  const n = checkLength(dataset, "split a dataset");
  if (!Array.isArray(lengths) || lengths.length === 0) {
    throw new RangeError("Cannot split a dataset: lengths should be a non-empty array");
  }
  for (const l of lengths) {
    if (typeof l !== "number" || !(l >= 0) || !Number.isFinite(l)) {
      throw new RangeError(`Cannot split a dataset: length ${l} is not a non-negative number`);
    }
  }
  let counts: number[];
  const total = lengths.reduce((a, b) => a + b, 0);
  if (lengths.every((l) => l <= 1) && Math.abs(total - 1) < 1e-9 && total !== n) {
    counts = lengths.map((f) => Math.floor(n * f));
    const rest = n - counts.reduce((a, b) => a + b, 0);
    for (let k = 0; k < rest; k++) counts[k % counts.length]++;
  } else {
    if (!lengths.every(Number.isInteger) || total !== n) {
      throw new RangeError(
        `Cannot split a dataset: lengths [${lengths}] should be counts summing to its ` +
          `${n} samples, or fractions summing to 1`,
      );
    }
    counts = [...lengths];
  }
  const seed = options.seed ?? randomSeed();
  if (!Number.isInteger(seed) || seed < 0 || seed > 2 ** 53 - 1) {
    throw new RangeError(
      `Cannot split a dataset: seed should be an integer in [0, 2^53), got ${seed}`,
    );
  }
  const perm = permutation(n, new SequenceRandom(seed, 0, STREAM_SPLIT, 0));
  const out: Subset<T>[] = [];
  let at = 0;
  for (const c of counts) {
    out.push(new Subset(dataset, perm.subarray(at, at + c)));
    at += c;
  }
  return out;
}
