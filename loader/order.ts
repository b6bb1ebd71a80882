/**
 * The order of a loader's epochs: which samples each batch of an epoch holds, and the augment
 * record each sample gets. Both are pure functions of the seed and the epoch (FFCV's
 * traversal order, PyTorch's `_index_sampler`), so the {@linkcode DataLoader}, the
 * {@linkcode DeviceLoader}, a loader per rank over a {@linkcode DistributedSampler}, and a
 * run resumed from a checkpoint at epoch e all see the same batches.
 *
 * @module
 */

import {
  AUGMENT_OFF,
  type AugmentOptions,
  type AugmentSpec,
  resolveAugment,
} from "../augment/options.ts";
import { AUGMENT_RECORD_LENGTH, sampleKey, writeAugmentRecords } from "../augment/record.ts";
import { optionError } from "../internal/options.ts";
import { randomSeed } from "../internal/random.ts";
import {
  BatchSampler,
  type BatchSamplerLike,
  DistributedSampler,
  RandomSampler,
  type Sampler,
  SequentialSampler,
  toIndices,
} from "./sampler.ts";

/** Options of {@linkcode EpochOrder}: PyTorch's DataLoader options that choose the order. */
export interface EpochOrderOptions {
  /** Samples per batch (default 1); `null` disables batching: one sample per item. */
  batchSize?: number | null;
  /** Reshuffle every epoch (a RandomSampler seeded by `seed`). */
  shuffle?: boolean;
  /** Custom order; exclusive with `shuffle`. A plain iterable with `length` also works. */
  sampler?: Sampler | (Iterable<number> & { readonly length: number });
  /** Custom batches; exclusive with batchSize, shuffle, sampler, dropLast. */
  batchSampler?:
    | BatchSamplerLike
    | (Iterable<Iterable<number>> & { readonly length: number });
  /** Drop the last incomplete batch (default false). */
  dropLast?: boolean;
  /**
   * Seed of every random draw (shuffle, per-sample streams). Default: a
   * {@linkcode DistributedSampler}'s seed when the order draws from one, else random.
   */
  seed?: number;
  /** Draw per-sample crop offsets, flips, cutout and colour factors into augment records. */
  augment?: AugmentOptions;
}

/**
 * An epoch order over a dataset of `length` samples: the epoch counter, the sampler and the
 * batch sampler, the batches of an epoch and the augment records of a range of its
 * positions. The batches and records of epoch e are a pure function of (seed, e) whenever the
 * sampler is (every built-in one is); two orders with the same options agree.
 *
 * A sample's position is its place in the epoch (batch after batch, counting from 0), and its
 * augment record is drawn from (seed, epoch, draw position) (augment/record.ts). The draw
 * position is the position itself, except over a {@linkcode DistributedSampler}: there it is
 * the sample's place in the un-sharded order every rank computes alike,
 * `rank + position * worldSize` ({@linkcode EpochOrder.drawPosition}). Ranks with the same
 * seed (the sampler's seed when none is given) then never share draws, and together they
 * draw exactly what one process fed the combined batch draws.
 *
 * @example The same seed and epoch, the same batches and records
 * ```ts
 * import { EpochOrder } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const options = { batchSize: 4, shuffle: true, seed: 7, augment: { padding: 2, flip: true } };
 * const a = new EpochOrder(10, options), b = new EpochOrder(10, options);
 * assert.strictEqual(a.length, 3);
 * assert.deepStrictEqual(a.batches(5), b.batches(5));
 * assert.deepStrictEqual(a.records(5, 0, 10), b.records(5, 0, 10));
 * assert.deepStrictEqual([...a.indices(0)].sort((x, y) => x - y), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
 * ```
 *
 * @example Taking epochs one after another, and resuming at epoch 3
 * ```ts
 * import { EpochOrder } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const order = new EpochOrder(6, { batchSize: 2, shuffle: true, seed: 1 });
 * assert.deepStrictEqual([order.nextEpoch(), order.nextEpoch()], [0, 1]);
 * order.setEpoch(3);
 * assert.strictEqual(order.nextEpoch(), 3);
 * assert.strictEqual(order.epoch, 4);
 * ```
 *
 * @example Two ranks draw what one process draws for the combined batch
 * ```ts
 * import { DistributedSampler, EpochOrder } from "@pinstream/pinstream";
 * import assert from "node:assert";
 *
 * const augment = { padding: 2, flip: true };
 * const one = new EpochOrder(8, { batchSize: 4, shuffle: true, seed: 5, augment });
 * const rank = (r: number) =>
 *   new EpochOrder(8, {
 *     batchSize: 2,
 *     sampler: new DistributedSampler(8, { worldSize: 2, rank: r, seed: 5 }),
 *     augment,
 *   });
 * const r1 = rank(1);
 * assert.deepStrictEqual([r1.seed, r1.drawPosition(0), r1.drawPosition(1)], [5, 1, 3]);
 * // Batch 0 of rank 1 holds positions 1 and 3 of the one process's batch 0.
 * assert.deepStrictEqual([...r1.batches(0)[0]], [one.batches(0)[0][1], one.batches(0)[0][3]]);
 * assert.deepStrictEqual(r1.records(0, 0, 2), new Int32Array([
 *   ...one.records(0, 1, 1), ...one.records(0, 3, 1),
 * ]));
 * ```
 */
export class EpochOrder {
  /** Samples per batch, or null without batching (or with a batchSampler). */
  readonly batchSize: number | null;
  /** Whether the last partial batch is dropped. */
  readonly dropLast: boolean;
  /** The seed of every random draw. */
  readonly seed: number;
  /** The sampler (undefined when a batchSampler was given). */
  readonly sampler: Sampler | undefined;
  /** The batch sampler. */
  readonly batchSampler: BatchSamplerLike;
  /**
   * The per-sample augmentation drawn into the records, with defaults filled in and frozen;
   * undefined when none was asked for.
   */
  readonly augment: AugmentSpec | undefined;
  /**
   * Whether an epoch's batches are a pure function of the epoch, so that they can be planned
   * ahead (false for a plain iterable sampler or batch sampler, which may be consumed).
   */
  readonly pure: boolean;
  /**
   * The draw position of position 0 (the rank over a {@linkcode DistributedSampler}, else 0);
   * see {@linkcode EpochOrder.drawPosition}.
   */
  readonly drawOffset: number;
  /**
   * The step between consecutive positions' draw positions (the world size over a
   * {@linkcode DistributedSampler}, else 1).
   */
  readonly drawStride: number;
  #epoch = 0;

  /**
   * Checks the options and builds the order.
   *
   * @param length Samples in the dataset.
   * @param options Batching, order, seed and augmentation.
   * @param action What the caller is doing, for "Cannot <action>: <option> option ...".
   * @throws {TypeError} / {RangeError} naming the option, for every invalid value or
   * combination PyTorch's DataLoader refuses (sampler with shuffle, batchSampler with
   * batchSize/shuffle/sampler/dropLast, dropLast without batching, ...).
   */
  constructor(length: number, options: EpochOrderOptions = {}, action = "create EpochOrder") {
    const o = options;
    const shuffle = checkBool(action, "shuffle", o.shuffle);
    this.dropLast = checkBool(action, "dropLast", o.dropLast);
    if (o.seed !== undefined) {
      if (!Number.isInteger(o.seed) || o.seed < 0 || o.seed > 2 ** 53 - 1) {
        optionError(action, "seed", `should be an integer in [0, 2^53), got ${String(o.seed)}`);
      }
    }
    // The sampler a batchSampler draws from, as nextEpoch looks for it.
    const given = o.sampler ?? (o.batchSampler as { sampler?: unknown } | undefined)?.sampler;
    const shard = given instanceof DistributedSampler ? given : undefined;
    // Every rank must draw from the same key: the sampler's seed is the one they share.
    this.seed = o.seed ?? shard?.seed ?? randomSeed();
    this.drawOffset = shard?.rank ?? 0;
    this.drawStride = shard?.worldSize ?? 1;
    // The same checks, in the same order, as torch.utils.data.DataLoader.
    const batchSize = o.batchSize === undefined ? 1 : o.batchSize;
    if (batchSize !== null && (!Number.isInteger(batchSize) || batchSize < 1)) {
      optionError(
        action,
        "batchSize",
        `should be a positive integer or null, got ${String(batchSize)}`,
      );
    }
    if (o.sampler !== undefined && shuffle) {
      optionError(action, "sampler", "is mutually exclusive with shuffle", "type");
    }
    if (o.batchSampler !== undefined) {
      if (batchSize !== 1 || shuffle || o.sampler !== undefined || this.dropLast) {
        optionError(
          action,
          "batchSampler",
          "is mutually exclusive with batchSize, shuffle, sampler, and dropLast",
          "type",
        );
      }
      this.batchSize = null;
      this.sampler = undefined;
      this.batchSampler = batchSamplerOf(o.batchSampler, action);
    } else {
      if (batchSize === null && this.dropLast) {
        optionError(
          action,
          "dropLast",
          "is mutually exclusive with batchSize null (which disables batching)",
          "type",
        );
      }
      this.batchSize = batchSize;
      this.sampler = o.sampler !== undefined
        ? samplerOf(o.sampler, action)
        : shuffle
        ? new RandomSampler(length, { seed: this.seed })
        : new SequentialSampler(length);
      this.batchSampler = new BatchSampler(this.sampler, {
        batchSize: batchSize ?? 1,
        dropLast: this.dropLast,
      });
    }
    this.pure = !(this.sampler instanceof OnePass || this.batchSampler instanceof OnePass);
    this.augment = o.augment === undefined ? undefined : resolveAugment(o.augment, action);
  }

  /** Batches per epoch (PyTorch's `len(loader)`). */
  get length(): number {
    return this.batchSampler.length;
  }

  /** The epoch {@linkcode EpochOrder.nextEpoch} takes next (0-based). */
  get epoch(): number {
    return this.#epoch;
  }

  /**
   * Sets the epoch {@linkcode EpochOrder.nextEpoch} takes next (to resume, or to mirror
   * `DistributedSampler.set_epoch`).
   *
   * @param epoch A non-negative integer.
   * @throws {RangeError} For anything else.
   */
  setEpoch(epoch: number): void {
    if (!Number.isInteger(epoch) || epoch < 0) {
      throw new RangeError(`Cannot set epoch: expected a non-negative integer, got ${epoch}`);
    }
    this.#epoch = epoch;
  }

  /**
   * The epoch to run now, moving the counter past it. A {@linkcode DistributedSampler} given
   * `setEpoch(e)` since the last call picks `e` (PyTorch's `sampler.set_epoch(e)` before each
   * epoch).
   *
   * @returns The epoch.
   */
  nextEpoch(): number {
    const source = this.sampler ?? (this.batchSampler as { sampler?: unknown }).sampler;
    const set = source instanceof DistributedSampler ? source._takeSetEpoch() : undefined;
    if (set !== undefined) this.#epoch = set;
    return this.#epoch++;
  }

  /**
   * The batches of an epoch: dataset indices, checked (an index that is not an integer in
   * [0, 2^31) is refused, naming its batch).
   *
   * @param epoch The epoch.
   * @returns One Int32Array per batch.
   * @throws {RangeError} / {TypeError} For an index the sampler should not have given.
   */
  batches(epoch: number): Int32Array[] {
    return Array.from(this.batchSampler.batches(epoch), (b, k) => toIndices(b, epoch, Infinity, k));
  }

  /**
   * The samples of an epoch in position order: its batches one after another.
   *
   * @param epoch The epoch.
   * @returns The dataset index at each position.
   * @throws {RangeError} / {TypeError} For an index the sampler should not have given.
   */
  indices(epoch: number): Int32Array {
    const b = this.batchSize;
    if (b !== null && this.sampler !== undefined) {
      // A sampler's order is the positions' order; dropLast cuts its tail.
      const all = toIndices(this.sampler.indices(epoch), epoch, b);
      return this.dropLast ? all.subarray(0, this.length * b) : all;
    }
    const batches = this.batches(epoch);
    const out = new Int32Array(batches.reduce((n, x) => n + x.length, 0));
    let at = 0;
    for (const x of batches) {
      out.set(x, at);
      at += x.length;
    }
    return out;
  }

  /**
   * The draw position of a position: where the sample sits in the epoch's global order, the
   * key of its augment record and of `ctx.u32()` in `get(index, ctx)` (augment/record.ts).
   *
   * @param position A position of this order's epoch.
   * @returns `drawOffset + position * drawStride`.
   */
  drawPosition(position: number): number {
    return this.drawOffset + position * this.drawStride;
  }

  /**
   * The augment records of `count` positions of an epoch from `from` on, written one after
   * another from `out[at]` (the identity record, every option off, without `augment`); each
   * drawn at its {@linkcode EpochOrder.drawPosition}.
   *
   * @param epoch The epoch.
   * @param from The first position.
   * @param count Positions.
   * @param out Where to write (default: a new array of exactly the records).
   * @param at The first word in `out`.
   * @returns `out`.
   */
  records(
    epoch: number,
    from: number,
    count: number,
    out: Int32Array = new Int32Array(count * AUGMENT_RECORD_LENGTH),
    at = 0,
  ): Int32Array {
    if (at + count * AUGMENT_RECORD_LENGTH > out.length) {
      throw new RangeError(
        `Cannot draw augment records: ${count} records from word ${at} need ` +
          `${at + count * AUGMENT_RECORD_LENGTH} words, the array has ${out.length}`,
      );
    }
    const key = sampleKey(this.seed, epoch);
    writeAugmentRecords(
      out,
      at,
      key,
      this.drawPosition(from),
      count,
      this.augment ?? AUGMENT_OFF,
      this.drawStride,
    );
    return out;
  }

  /**
   * The most samples one batch of this order holds: `batchSize` capped at the sampler's
   * length (a batch never holds more than an epoch), or a batchSampler's largest batch of
   * epoch 0.
   *
   * @returns At least 1.
   */
  maxBatchSize(): number {
    if (this.batchSize !== null) {
      return Math.max(1, Math.min(this.batchSize, this.sampler?.length ?? this.batchSize));
    }
    let most = 0, k = 0;
    for (const b of this.batchSampler.batches(0)) {
      most = Math.max(most, toIndices(b, 0, Infinity, k++).length);
    }
    return Math.max(1, most);
  }
}

/**
 * A plain iterable with a length as a sampler or a batch sampler: every epoch iterates it
 * again, so an epoch is not a pure function of its number (a generator is spent after one).
 */
class OnePass<T> implements Sampler, BatchSamplerLike {
  readonly #it: Iterable<T> & { readonly length: number };
  constructor(it: Iterable<T> & { readonly length: number }) {
    this.#it = it;
  }
  get length(): number {
    return this.#it.length;
  }
  indices(): Iterable<number> {
    return this.#it as Iterable<number>;
  }
  batches(): Iterable<Iterable<number>> {
    return this.#it as Iterable<Iterable<number>>;
  }
}

function checkBool(action: string, name: string, v: unknown): boolean {
  if (v === undefined) return false;
  if (typeof v !== "boolean") {
    optionError(action, name, `should be a boolean value, got ${String(v)}`, "type");
  }
  return v;
}

/** The `sampler` option as a Sampler: itself, or a plain iterable with a length wrapped. */
function samplerOf(s: NonNullable<EpochOrderOptions["sampler"]>, action: string): Sampler {
  if (typeof s !== "object" || s === null || typeof s.length !== "number") {
    optionError(
      action,
      "sampler",
      "should have a numeric length and indices(epoch) or be iterable",
      "type",
    );
  }
  if (typeof (s as Sampler).indices === "function") return s as Sampler;
  if (!(Symbol.iterator in s)) {
    optionError(action, "sampler", "should have indices(epoch) or be iterable", "type");
  }
  return new OnePass(s as Iterable<number> & { length: number });
}

/** The `batchSampler` option as a BatchSamplerLike: itself, or a plain iterable wrapped. */
function batchSamplerOf(
  bs: NonNullable<EpochOrderOptions["batchSampler"]>,
  action: string,
): BatchSamplerLike {
  if (typeof bs !== "object" || bs === null || typeof bs.length !== "number") {
    optionError(
      action,
      "batchSampler",
      "should have a numeric length and batches(epoch) or be iterable",
      "type",
    );
  }
  if (typeof (bs as BatchSamplerLike).batches === "function") return bs as BatchSamplerLike;
  if (!(Symbol.iterator in bs)) {
    optionError(action, "batchSampler", "should have batches(epoch) or be iterable", "type");
  }
  return new OnePass(bs as Iterable<Iterable<number>> & { length: number });
}
