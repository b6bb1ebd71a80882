/**
 * Samplers: the order in which a {@linkcode DataLoader} visits dataset indices.
 *
 * Every built-in sampler is a pure function of `(seed, epoch)`: `indices(epoch)` gives the
 * same order whenever it is asked, on any thread, so the loader can plan (and prefetch) the
 * next epoch before the current one ends, and the batches do not depend on `numWorkers`.
 * Semantics follow `torch.utils.data` (sizes, `replacement`, `numSamples`, the padding and
 * dropping rules of `DistributedSampler`); the random streams are pinstream's own, so the
 * orders are not PyTorch's numbers.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { permutation, randomSeed, SequenceRandom, STREAM_SAMPLER } from "../internal/random.ts";

/**
 * What a DataLoader needs from a sampler: how many indices an epoch has, and the indices
 * of an epoch. `indices(epoch)` must be a pure function of `epoch` (the loader may call it
 * early to prefetch across the epoch boundary, and more than once).
 */
export interface Sampler {
  /** Indices per epoch. */
  readonly length: number;
  /** The dataset indices of epoch `epoch`, in visiting order. */
  indices(epoch: number): Int32Array | Iterable<number>;
}

/** What a DataLoader needs from a batch sampler: batches per epoch and the batches. */
export interface BatchSamplerLike {
  /** Batches per epoch. */
  readonly length: number;
  /** The batches (lists of dataset indices) of epoch `epoch`; a pure function of `epoch`. */
  batches(epoch: number): Iterable<Int32Array | ArrayLike<number> | Iterable<number>>;
}

function checkInt(name: string, value: unknown, min: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min) {
    throw new RangeError(
      `Cannot create sampler: ${name} must be an integer >= ${min}, got ${String(value)}`,
    );
  }
  return value;
}

function checkSeed(seed: unknown): number {
  if (seed === undefined) return randomSeed();
  if (typeof seed !== "number" || !Number.isInteger(seed) || seed < 0 || seed > 2 ** 53 - 1) {
    throw new RangeError(
      `Cannot create sampler: seed must be an integer in [0, 2^53), got ${String(seed)}`,
    );
  }
  return seed;
}

/**
 * Visits 0, 1, ..., n-1 in order, every epoch.
 *
 * @example Sequential order
 * ```ts
 * import { SequentialSampler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const s = new SequentialSampler(4);
 * assert.deepStrictEqual([...s.indices(0)], [0, 1, 2, 3]);
 * ```
 */
export class SequentialSampler implements Sampler {
  /** Indices per epoch. */
  readonly length: number;

  /**
   * Creates it; see the class documentation.
   *
   * @param length dataset size (or any object with a `length`)
   * @throws {RangeError} when the size is not a non-negative integer
   */
  constructor(length: number | { readonly length: number }) {
    this.length = checkInt("length", typeof length === "number" ? length : length.length, 0);
  }

  /**
   * The dataset indices of one epoch.
   *
   * @param _epoch ignored: the order is the same every epoch
   * @returns 0..length-1
   */
  indices(_epoch = 0): Int32Array {
    const out = new Int32Array(this.length);
    for (let i = 0; i < out.length; i++) out[i] = i;
    return out;
  }
}

/** Options of {@linkcode RandomSampler}. */
export interface RandomSamplerOptions {
  /** Draw with replacement (default false: a permutation). */
  replacement?: boolean;
  /** Indices per epoch (default: the dataset size). Without replacement, cycles permutations. */
  numSamples?: number;
  /** Seed in [0, 2^53) (default: random). The order is a pure function of (seed, epoch). */
  seed?: number;
}

/**
 * Random order. Without replacement each epoch is a fresh permutation (more than n samples
 * concatenate permutations, as PyTorch does); with replacement indices are drawn uniformly.
 *
 * @example Same seed, same epoch, same order
 * ```ts
 * import { RandomSampler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const a = new RandomSampler(10, { seed: 7 });
 * const b = new RandomSampler(10, { seed: 7 });
 * assert.deepStrictEqual(a.indices(3), b.indices(3));
 * assert.deepStrictEqual([...a.indices(0)].sort((x, y) => x - y), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
 * ```
 */
export class RandomSampler implements Sampler {
  /** Indices per epoch. */
  readonly length: number;
  /** Dataset size. */
  readonly size: number;
  /** Whether indices are drawn with replacement. */
  readonly replacement: boolean;
  /** The seed the order derives from. */
  readonly seed: number;

  /**
   * Creates it; see the class documentation.
   *
   * @param size dataset size (or an object with a `length`)
   * @param options replacement, numSamples, seed
   * @throws {RangeError} for a negative size, numSamples < 1, or a bad seed
   */
  constructor(size: number | { readonly length: number }, options: RandomSamplerOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["replacement", "numSamples", "seed"], "create RandomSampler");
    this.size = checkInt("size", typeof size === "number" ? size : size.length, 0);
    this.replacement = options.replacement ?? false;
    if (typeof this.replacement !== "boolean") {
      throw new TypeError(
        `Cannot create sampler: replacement should be a boolean value, got ${
          String(options.replacement)
        }`,
      );
    }
    this.length = options.numSamples === undefined
      ? this.size
      : checkInt("numSamples", options.numSamples, 1);
    if (this.size === 0 && this.length > 0) {
      // torch.multinomial / randperm raise on an empty population too.
      throw new RangeError(
        `Cannot create RandomSampler: numSamples ${this.length} drawn from an empty dataset`,
      );
    }
    this.seed = checkSeed(options.seed);
  }

  /**
   * The dataset indices of one epoch.
   *
   * @param epoch the epoch number (0-based)
   * @returns the indices of that epoch
   */
  indices(epoch = 0): Int32Array {
    const rng = new SequenceRandom(this.seed, epoch, STREAM_SAMPLER, 0);
    const out = new Int32Array(this.length);
    if (this.size === 0) return out;
    if (this.replacement) {
      for (let i = 0; i < out.length; i++) out[i] = rng.int(this.size);
      return out;
    }
    let filled = 0;
    for (let round = 0; filled < out.length; round++) {
      const perm = round === 0
        ? permutation(this.size, rng)
        : permutation(this.size, new SequenceRandom(this.seed, epoch, STREAM_SAMPLER, round));
      const take = Math.min(perm.length, out.length - filled);
      out.set(perm.subarray(0, take), filled);
      filled += take;
    }
    return out;
  }
}

/** Options of {@linkcode SubsetRandomSampler}. */
export interface SubsetRandomSamplerOptions {
  /** Seed (default: random). */
  seed?: number;
}

/**
 * A random permutation of the given indices, every epoch.
 *
 * @example Only the subset, shuffled
 * ```ts
 * import { SubsetRandomSampler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const s = new SubsetRandomSampler([5, 7, 9], { seed: 1 });
 * assert.deepStrictEqual([...s.indices(0)].sort(), [5, 7, 9]);
 * ```
 */
export class SubsetRandomSampler implements Sampler {
  /** Indices per epoch. */
  readonly length: number;
  /** The seed the order derives from. */
  readonly seed: number;
  #subset: Int32Array;

  /**
   * Creates it; see the class documentation.
   *
   * @param indices the subset of dataset indices
   * @param options seed
   * @throws {RangeError} for a negative or non-integer index
   */
  constructor(indices: ArrayLike<number>, options: SubsetRandomSamplerOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["seed"], "create SubsetRandomSampler");
    this.#subset = Int32Array.from(indices as ArrayLike<number>, (v) => checkInt("index", v, 0));
    this.length = this.#subset.length;
    this.seed = checkSeed(options.seed);
  }

  /**
   * The dataset indices of one epoch.
   *
   * @param epoch the epoch number
   * @returns the subset in this epoch's order
   */
  indices(epoch = 0): Int32Array {
    const perm = permutation(this.length, new SequenceRandom(this.seed, epoch, STREAM_SAMPLER, 0));
    const out = new Int32Array(this.length);
    for (let i = 0; i < out.length; i++) out[i] = this.#subset[perm[i]];
    return out;
  }
}

/** Options of {@linkcode WeightedRandomSampler}. */
export interface WeightedRandomSamplerOptions {
  /** Draw with replacement (default true, as in PyTorch). */
  replacement?: boolean;
  /** Seed (default: random). */
  seed?: number;
}

/**
 * Draws `numSamples` indices in [0, weights.length) with probability proportional to the
 * weights (which need not sum to 1). Without replacement, `numSamples` must not exceed the
 * number of non-zero weights (PyTorch's multinomial rule).
 *
 * @example Zero weight is never drawn
 * ```ts
 * import { WeightedRandomSampler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const s = new WeightedRandomSampler([0, 1, 3], 100, { seed: 2 });
 * assert.ok([...s.indices(0)].every((i) => i === 1 || i === 2));
 * ```
 */
export class WeightedRandomSampler implements Sampler {
  /** Indices per epoch. */
  readonly length: number;
  /** Whether indices are drawn with replacement. */
  readonly replacement: boolean;
  /** The seed the order derives from. */
  readonly seed: number;
  #cdf: Float64Array;
  #weights: Float64Array;

  /**
   * Creates it; see the class documentation.
   *
   * @param weights non-negative, finite weights, at least one positive
   * @param numSamples indices per epoch
   * @param options replacement, seed
   * @throws {RangeError} for a negative/non-finite weight, all-zero weights, numSamples < 1,
   *   or more samples than non-zero weights without replacement
   */
  constructor(
    weights: ArrayLike<number>,
    numSamples: number,
    options: WeightedRandomSamplerOptions = {},
  ) {
    refuseUnknownKeys(options ?? {}, ["replacement", "seed"], "create WeightedRandomSampler");
    this.length = checkInt("numSamples", numSamples, 1);
    this.replacement = options.replacement ?? true;
    this.seed = checkSeed(options.seed);
    this.#weights = Float64Array.from(weights as ArrayLike<number>);
    this.#cdf = new Float64Array(this.#weights.length);
    let sum = 0;
    let positive = 0;
    for (let i = 0; i < this.#weights.length; i++) {
      const w = this.#weights[i];
      if (!(w >= 0) || !Number.isFinite(w)) {
        throw new RangeError(
          `Cannot create sampler: weights must be finite and non-negative, got ${w} at ${i}`,
        );
      }
      if (w > 0) positive++;
      sum += w;
      this.#cdf[i] = sum;
    }
    if (sum <= 0) {
      throw new RangeError("Cannot create sampler: weights must contain a positive value");
    }
    if (!this.replacement && numSamples > positive) {
      throw new RangeError(
        `Cannot create sampler: numSamples ${numSamples} exceeds the ${positive} non-zero ` +
          "weights without replacement",
      );
    }
  }

  /**
   * The dataset indices of one epoch.
   *
   * @param epoch the epoch number
   * @returns the drawn indices of that epoch
   */
  indices(epoch = 0): Int32Array {
    const rng = new SequenceRandom(this.seed, epoch, STREAM_SAMPLER, 0);
    const out = new Int32Array(this.length);
    const cdf = this.#cdf;
    const total = cdf[cdf.length - 1];
    if (this.replacement) {
      for (let k = 0; k < out.length; k++) {
        const u = rng.random() * total;
        let lo = 0;
        let hi = cdf.length - 1;
        while (lo < hi) {
          const mid = (lo + hi) >>> 1;
          if (cdf[mid] > u) hi = mid;
          else lo = mid + 1;
        }
        // Skip zero-weight entries that share the cumulative value.
        while (this.#weights[lo] === 0) lo++;
        out[k] = lo;
      }
      return out;
    }
    // Without replacement: Efraimidis-Spirakis keys u^(1/w), take the largest numSamples.
    const keys: { i: number; key: number }[] = [];
    for (let i = 0; i < this.#weights.length; i++) {
      const w = this.#weights[i];
      if (w > 0) keys.push({ i, key: Math.log(1 - rng.random()) / w });
    }
    keys.sort((a, b) => b.key - a.key);
    for (let k = 0; k < out.length; k++) out[k] = keys[k].i;
    return out;
  }
}

/** Options of {@linkcode DistributedSampler}. */
export interface DistributedSamplerOptions {
  /** Number of processes (replicas). */
  worldSize: number;
  /** This process's rank in [0, worldSize). */
  rank: number;
  /** Shuffle each epoch (default true). */
  shuffle?: boolean;
  /** Seed shared by every rank (default 0, as in PyTorch: all ranks must agree). */
  seed?: number;
  /** Drop the tail so every rank gets the same count (default false: pad by repeating). */
  dropLast?: boolean;
}

/**
 * Shards a dataset across `worldSize` ranks, as `torch.utils.data.DistributedSampler`:
 * every rank gets `ceil(n / worldSize)` indices (padding by repeating indices from the
 * start) or, with `dropLast`, `floor(n / worldSize)` (dropping the tail). All ranks shuffle
 * with the same permutation of `(seed, epoch)` so their shards are disjoint.
 *
 * Driven by a DataLoader, the epoch is the loader's epoch count (what PyTorch users get by
 * calling `set_epoch(epoch)` every epoch), so calling `setEpoch` is optional; when it is
 * called (PyTorch's habit, or to resume at epoch e), the loader's next epoch is that one.
 * `setEpoch` also sets the epoch used when iterating the sampler directly.
 *
 * @example Two ranks cover the dataset once
 * ```ts
 * import { DistributedSampler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const r0 = new DistributedSampler(6, { worldSize: 2, rank: 0, seed: 3 });
 * const r1 = new DistributedSampler(6, { worldSize: 2, rank: 1, seed: 3 });
 * const all = [...r0.indices(0), ...r1.indices(0)].sort();
 * assert.deepStrictEqual(all, [0, 1, 2, 3, 4, 5]);
 * ```
 */
export class DistributedSampler implements Sampler, Iterable<number> {
  /** Indices per epoch on this rank. */
  readonly length: number;
  /** Dataset size. */
  readonly size: number;
  /** Indices over all ranks (length * worldSize). */
  readonly totalSize: number;
  /** Number of ranks. */
  readonly worldSize: number;
  /** This rank. */
  readonly rank: number;
  /** Whether each epoch is shuffled. */
  readonly shuffle: boolean;
  /** The shared seed. */
  readonly seed: number;
  /** Whether the tail is dropped instead of padded. */
  readonly dropLast: boolean;
  /** The epoch used by direct iteration; see {@linkcode DistributedSampler.setEpoch}. */
  epoch = 0;
  #epochSet = false;

  /**
   * Creates it; see the class documentation.
   *
   * @param size dataset size (or an object with a `length`)
   * @param options worldSize, rank, shuffle, seed, dropLast
   * @throws {RangeError} for a rank outside [0, worldSize) or a bad worldSize
   */
  constructor(size: number | { readonly length: number }, options: DistributedSamplerOptions) {
    refuseUnknownKeys(
      options ?? {},
      ["worldSize", "rank", "shuffle", "seed", "dropLast"],
      "create DistributedSampler",
    );
    this.size = checkInt("size", typeof size === "number" ? size : size.length, 0);
    this.worldSize = checkInt("worldSize", options.worldSize, 1);
    const rank = options.rank;
    if (typeof rank !== "number" || !Number.isInteger(rank) || rank < 0 || rank >= this.worldSize) {
      throw new RangeError(
        `Cannot create sampler: invalid rank ${String(rank)}, rank should be in the interval ` +
          `[0, ${this.worldSize - 1}]`,
      );
    }
    this.rank = rank;
    this.shuffle = options.shuffle ?? true;
    this.seed = options.seed === undefined ? 0 : checkSeed(options.seed);
    this.dropLast = options.dropLast ?? false;
    this.length = this.dropLast && this.size % this.worldSize !== 0
      ? Math.max(0, Math.ceil((this.size - this.worldSize) / this.worldSize))
      : Math.ceil(this.size / this.worldSize);
    this.totalSize = this.length * this.worldSize;
  }

  /**
   * Sets the epoch (PyTorch's `set_epoch`): used by `[Symbol.iterator]`, and by the next
   * epoch of a DataLoader that draws from this sampler.
   *
   * @param epoch the epoch number
   */
  setEpoch(epoch: number): void {
    this.epoch = checkInt("epoch", epoch, 0);
    this.#epochSet = true;
  }

  /** @internal The epoch given to setEpoch since the last call, if any (DataLoader). */
  _takeSetEpoch(): number | undefined {
    if (!this.#epochSet) return undefined;
    this.#epochSet = false;
    return this.epoch;
  }

  /**
   * The dataset indices of one epoch.
   *
   * @param epoch the epoch number (a DataLoader passes its epoch count)
   * @returns this rank's indices of that epoch
   */
  indices(epoch: number = this.epoch): Int32Array {
    const n = this.size;
    let all: Int32Array;
    if (this.shuffle) {
      all = permutation(n, new SequenceRandom(this.seed, epoch, STREAM_SAMPLER, 0));
    } else {
      all = new Int32Array(n);
      for (let i = 0; i < n; i++) all[i] = i;
    }
    const full = new Int32Array(this.totalSize);
    if (this.totalSize <= n) {
      full.set(all.subarray(0, this.totalSize));
    } else {
      // Pad by repeating from the start, as often as needed (PyTorch's rule).
      for (let i = 0; i < this.totalSize; i++) full[i] = all[i % n];
    }
    const out = new Int32Array(this.length);
    for (let k = 0; k < this.length; k++) out[k] = full[this.rank + k * this.worldSize];
    return out;
  }

  /** Iterates the indices of `this.epoch`. */
  [Symbol.iterator](): Iterator<number> {
    return this.indices(this.epoch)[Symbol.iterator]();
  }
}

/** Options of {@linkcode BatchSampler}. */
export interface BatchSamplerOptions {
  /** Indices per batch. */
  batchSize: number;
  /** Drop the last batch when smaller than batchSize (default false). */
  dropLast?: boolean;
}

/**
 * Groups a sampler's indices into batches of `batchSize`; the last one is smaller unless
 * `dropLast`. `length` is `floor(n / batchSize)` with dropLast, else `ceil(n / batchSize)`.
 *
 * @example Ten indices in batches of four
 * ```ts
 * import { BatchSampler, SequentialSampler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const b = new BatchSampler(new SequentialSampler(10), { batchSize: 4 });
 * assert.strictEqual(b.length, 3);
 * assert.deepStrictEqual([...b.batches(0)].map((x) => x.length), [4, 4, 2]);
 * ```
 */
export class BatchSampler implements BatchSamplerLike {
  /** The underlying sampler. */
  readonly sampler: Sampler;
  /** Indices per batch. */
  readonly batchSize: number;
  /** Whether the last partial batch is dropped. */
  readonly dropLast: boolean;

  /**
   * Creates it; see the class documentation.
   *
   * @param sampler where the indices come from
   * @param options batchSize, dropLast
   * @throws {RangeError} for a batchSize that is not a positive integer
   */
  constructor(sampler: Sampler, options: BatchSamplerOptions) {
    refuseUnknownKeys(options ?? {}, ["batchSize", "dropLast"], "create BatchSampler");
    this.sampler = sampler;
    this.batchSize = checkInt("batchSize", options.batchSize, 1);
    this.dropLast = options.dropLast ?? false;
    if (typeof this.dropLast !== "boolean") {
      throw new TypeError(
        `Cannot create sampler: dropLast should be a boolean value, got ${
          String(options.dropLast)
        }`,
      );
    }
  }

  /** Batches per epoch. */
  get length(): number {
    const n = this.sampler.length;
    return this.dropLast ? Math.floor(n / this.batchSize) : Math.ceil(n / this.batchSize);
  }

  /**
   * The batches of one epoch.
   *
   * @param epoch the epoch number
   * @returns the batches of that epoch
   */
  batches(epoch = 0): Int32Array[] {
    const raw = this.sampler.indices(epoch);
    const all = toIndices(raw, epoch, this.batchSize);
    const out: Int32Array[] = [];
    for (let i = 0; i < all.length; i += this.batchSize) {
      if (this.dropLast && i + this.batchSize > all.length) break;
      out.push(all.subarray(i, Math.min(i + this.batchSize, all.length)));
    }
    return out;
  }
}

/**
 * Sampler indices as an Int32Array, refusing what an Int32Array would silently turn into
 * another sample: fractions, NaN, negative values, 2^31 and beyond, and non-numbers. Errors
 * name the value, its batch (position / `batchSize`) and its position in that batch.
 *
 * @param values the indices of an epoch (or of one batch, with `batchSize` its length)
 * @param epoch the epoch, for the message
 * @param batchSize indices per batch, to name the batch; `firstBatch` numbers the first one
 * @param firstBatch the batch number of `values[0]`
 * @returns the indices
 * @throws {RangeError} for a number that is not an integer in [0, 2^31)
 * @throws {TypeError} for a value that is not a number
 * @example
 * ```ts
 * import { toIndices } from "./sampler.ts";
 * import assert from "node:assert";
 * assert.deepStrictEqual(toIndices([3, 1], 0, 2), new Int32Array([3, 1]));
 * assert.throws(() => toIndices([0, 1, 2, 1.5], 0, 2), /batch 1 of epoch 0.*index 1\.5/);
 * ```
 */
export function toIndices(
  values: Int32Array | Iterable<number> | ArrayLike<number>,
  epoch: number,
  batchSize: number,
  firstBatch = 0,
): Int32Array {
  const bad = (v: unknown, at: number): never => {
    const shown = typeof v === "string" ? JSON.stringify(v) : String(v);
    const text =
      `Cannot plan batch ${firstBatch + Math.floor(at / batchSize)} of epoch ${epoch}: ` +
      `the sampler gave index ${shown} (${typeof v}) at position ${at % batchSize}; indices ` +
      "must be integers in [0, 2^31)";
    throw typeof v === "number" ? new RangeError(text) : new TypeError(text);
  };
  if (values instanceof Int32Array) {
    for (let k = 0; k < values.length; k++) if (values[k] < 0) bad(values[k], k);
    return values;
  }
  if (values === null || typeof values !== "object") {
    throw new TypeError(
      `Cannot plan batch ${firstBatch} of epoch ${epoch}: the sampler gave ${
        String(values)
      } instead of a list of indices`,
    );
  }
  const list: ArrayLike<unknown> = Symbol.iterator in values
    ? Array.from(values as Iterable<unknown>)
    : values;
  const out = new Int32Array(list.length);
  for (let k = 0; k < list.length; k++) {
    const v = list[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 0x7fffffff) bad(v, k);
    out[k] = v as number;
  }
  return out;
}
