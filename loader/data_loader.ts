/**
 * (About 1,400 lines: the public `DataLoader` interface, documented member by member for
 * `deno doc`, the implementation class behind it, its options checking and the epoch
 * iterator; loading itself is in _engine.ts and the _transport_*.ts modules.)
 *
 * `DataLoader`: PyTorch's DataLoader for Deno, with Web Workers, a zero-copy staging ring in
 * shared memory, prefetch across epochs and seeded per-sample augmentation parameters.
 *
 * Two paths:
 *
 * - **Zero-copy** (a dataset with `sharedFields()`, no `collate`): workers gather each batch
 *   straight into a slot of a {@linkcode StagingRing} and the loader yields
 *   {@linkcode RingBatch}es (views into the ring, `release()` when done). Nothing is
 *   structured-cloned; per batch only a slot number crosses threads.
 * - **Generic**: `get(index, ctx)` per sample, then `collate` (default
 *   {@linkcode defaultCollate}); workers rebuild the dataset from its `workerSpec()` and
 *   send each collated batch back (typed arrays transferred, not copied).
 *
 * @module
 */

import { range } from "../internal/trace.ts";
import {
  AUGMENT_OFF,
  type AugmentOptions,
  type AugmentSpec,
  resolveAugment,
} from "../augment/options.ts";
import { AUGMENT_RECORD_LENGTH } from "../augment/record.ts";
import v8 from "node:v8";
import { closest } from "../internal/options.ts";
import {
  Engine,
  type EngineConfig,
  type EpochPlan,
  liveWorkerCount,
  type Result,
  SLOT_CONSUMER,
  SLOT_FREE,
  type WorkerResourceLimits,
} from "./_engine.ts";
import type { GatherSpec } from "./_gather.ts";
import type { ModuleRef } from "./_protocol.ts";
import { randomSeed } from "../internal/random.ts";
import { memoryOf } from "./_wasm_gather.ts";
import type { Collated, CollateFn } from "./collate.ts";
import {
  type Dataset,
  recordBytes,
  type SampleOf,
  type SharedField,
  type SharedFieldsOf,
} from "./dataset.ts";
import { RingBatch, StagingRing } from "./ring.ts";
import {
  BatchSampler,
  type BatchSamplerLike,
  DistributedSampler,
  RandomSampler,
  type Sampler,
  SequentialSampler,
  toIndices,
} from "./sampler.ts";

export { WorkerError } from "./_engine.ts";
export type { AugmentOptions } from "../augment/options.ts";
export type { ModuleRef } from "./_protocol.ts";

/**
 * Options of {@linkcode DataLoader}; PyTorch's names in TypeScript casing, plus a few.
 *
 * @typeParam B the batch type a `collate` function returns
 * @typeParam T the sample type a `collate` function receives a list of
 */
export interface DataLoaderOptions<B = unknown, T = unknown> {
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
  /**
   * Worker count (default 0: load on the main thread), or "auto": tuned between epochs from
   * the measured throughput and input wait, within the cores (like tf.data's AUTOTUNE; the
   * sample order does not depend on it). `loader.numWorkers` and each epoch's stats say
   * what ran.
   */
  numWorkers?: number | "auto";
  /**
   * Turns a list of samples into a batch (generic path). A function runs on the main thread;
   * a `{module, export}` reference runs in the workers. Default: defaultCollate in workers.
   */
  collate?: CollateFn<T, B> | ModuleRef;
  /**
   * Pinning hook for the staging ring (zero-copy path). `true` only records that the
   * consumer will pin `loader.ring` itself; a function is called once with the ring when
   * the loader is built, and the Disposable it returns (e.g. a `HostBuffer.register`
   * result) is disposed when the loader is disposed, after every worker has stopped.
   */
  pinMemory?: boolean | ((ring: StagingRing) => Disposable | void);
  /** Drop the last incomplete batch (default false). */
  dropLast?: boolean;
  /**
   * Seconds to wait for a batch before failing (default 0: no limit). With workers it bounds
   * a `get()` that hangs; with `numWorkers: 0` the main thread runs `get()` itself and can
   * only stop waiting for a `get()` that returns a promise (see the README's "Failure
   * behaviour").
   */
  timeout?: number;
  /**
   * Seconds without any progress while every worker is idle before the loader reports a
   * stall with its internal state (default 10; 0 turns the watchdog off). Such a stall is a
   * loader bug, never a slow dataset: a busy worker is never idle. Independent of `timeout`.
   */
  watchdog?: number;
  /**
   * Runs in each worker before it loads anything: `{module, export}` of a function called
   * with the worker id (PyTorch's worker_init_fn; workers cannot receive functions).
   */
  workerInit?: ModuleRef;
  /** Seed of every random draw (shuffle, per-sample streams). Default: random. */
  seed?: number;
  /**
   * Batches in flight per worker (default 2 when numWorkers > 0), or "auto" (2 to 4, raised
   * between epochs while the consumer still waits for data with every worker busy).
   */
  prefetchFactor?: number | "auto";
  /** Keep workers across epochs and prefetch into the next epoch (default false). */
  persistentWorkers?: boolean;
  /** Yield batches in sampler order (default true); false yields them as they complete. */
  inOrder?: boolean;
  /** Force (true) or refuse (false) the zero-copy path. Default: when the dataset allows. */
  zeroCopy?: boolean;
  /** Draw per-sample crop offsets / flip bits into the batch (zero-copy path). */
  augment?: AugmentOptions;
  /** Release each ring batch when the next one is requested (default true). */
  autoRelease?: boolean;
  /** Ring slots beyond the in-flight ones for batches the consumer holds (default 2). */
  heldBatches?: number;
  /**
   * V8 heap limits of each worker, as node:worker_threads' `resourceLimits`. A worker that
   * exceeds `maxOldGenerationSizeMb` is stopped and the loader fails with an out-of-memory
   * error; the process goes on. Default: the main thread's own heap limit (`--v8-flags=
   * --max-old-space-size` raises both).
   */
  workerResourceLimits?: {
    maxOldGenerationSizeMb?: number;
    maxYoungGenerationSizeMb?: number;
    stackSizeMb?: number;
  };
}

/** What an epoch looked like from the consumer's side. */
export interface EpochStats {
  /** The epoch number. */
  epoch: number;
  /** Batches yielded. */
  batches: number;
  /** Samples yielded. */
  samples: number;
  /** Seconds from the first request to the last batch. */
  seconds: number;
  /** Seconds the consumer spent waiting for data (input-bound when close to `seconds`). */
  waitSeconds: number;
  /** Seconds the consumer waited for the epoch's first batch. */
  firstBatchSeconds: number;
  /** batches / seconds. */
  batchesPerSecond: number;
  /** samples / seconds. */
  samplesPerSecond: number;
  /** Mean number of ready batches found when the consumer asked for one. */
  meanQueueDepth: number;
  /**
   * Seconds spent loading batches, summed over workers (the main thread with numWorkers 0).
   * `workerBusySeconds / (seconds * numWorkers)` near 1 means the workers are the limit.
   */
  workerBusySeconds: number;
  /** Workers that loaded this epoch (what "auto" chose). */
  numWorkers: number;
  /** Batches in flight per worker this epoch (what "auto" chose). */
  prefetchFactor: number;
}

/** The most batches in flight per worker that prefetchFactor "auto" tries. */
const MAX_AUTO_PREFETCH = 8;

/**
 * The shortest trial "auto" judges by: a trial whose epochs are shorter runs more epochs with
 * the same counts until they add up to this (20 ms epochs of small samples measured up to
 * 20% apart from one epoch to the next; a quarter second of them settles to a few percent).
 */
export const MIN_TRIAL_SECONDS = 0.25;

/**
 * numWorkers / prefetchFactor "auto": a coordinate search on the consumer's samples per
 * second, one trial per finished epoch. The first epoch warms up (workers start, caches fill)
 * and is not counted; then each worker count from the start outwards runs an epoch at a
 * prefetch of 2, then deeper prefetches (4, 8) run at the fastest count, and, when that count
 * is 0 (nothing in flight to deepen), at the fastest count with workers: a deeper prefetch can
 * lift a count that lost at depth 2 past the one that won (measured: 2 workers at depth 8
 * beat 0 workers, which beat 2 workers at depth 2). The fastest trial wins and the search
 * stops there. A trial is one epoch, or as many as make {@linkcode MIN_TRIAL_SECONDS}, judged
 * by their samples over their seconds after each epoch's first batch (a new worker set starts
 * in that wait). With a settled choice nothing changes again. The
 * counts never change the sample order.
 *
 * @internal Exported for its tests.
 */
export class Tuner {
  #trials: { workers: number; prefetch: number }[] = [];
  #results: { workers: number; prefetch: number; rate: number }[] = [];
  #w: { min: number; max: number };
  #p: { min: number; max: number };
  #phase: "warmup" | "workers" | "prefetch" | "settled" = "warmup";
  /** The running trial's epochs so far: samples and seconds. */
  #acc = { samples: 0, seconds: 0 };

  constructor(w: { min: number; max: number }, p: { min: number; max: number }) {
    this.#w = w;
    this.#p = p;
  }

  /**
   * The counts of the next epoch, given the one that just finished.
   *
   * @param s The finished epoch's stats (with the counts it ran).
   * @returns The next epoch's counts.
   */
  next(s: EpochStats): { workers: number; prefetch: number } {
    const cur = { workers: s.numWorkers, prefetch: s.prefetchFactor || this.#p.min };
    if (this.#phase === "settled") return cur;
    if (this.#phase === "warmup") {
      this.#phase = "workers";
      // The start first (again, now warm), then outwards: +1, -1, +2, -2, ...
      const out: number[] = [cur.workers];
      for (let d = 1; d <= this.#w.max - this.#w.min; d++) {
        if (cur.workers + d <= this.#w.max) out.push(cur.workers + d);
        if (cur.workers - d >= this.#w.min) out.push(cur.workers - d);
      }
      const prefetch = Math.max(this.#p.min, Math.min(2, this.#p.max));
      this.#trials = out.map((workers) => ({ workers, prefetch }));
    } else {
      // Steady-state rate: the wait for the first batch is left out, since it holds the start
      // of a new worker set whenever a trial changes the count (tens of ms, which in short
      // epochs made every trial with workers lose to 0 workers).
      this.#acc.samples += s.samples;
      this.#acc.seconds += Math.max(0, s.seconds - s.firstBatchSeconds);
      // A short trial runs another epoch with the same counts.
      if (this.#acc.seconds < MIN_TRIAL_SECONDS) return cur;
      this.#results.push({ ...cur, rate: this.#acc.samples / this.#acc.seconds });
      this.#acc = { samples: 0, seconds: 0 };
    }
    if (this.#trials.length === 0 && this.#phase === "workers") {
      this.#phase = "prefetch";
      // Deeper at the fastest count; with no workers (nothing in flight) at the fastest count
      // that has some.
      const withWorkers = this.#results.filter((r) => r.workers > 0);
      const at = this.#best().workers > 0
        ? this.#best()
        : withWorkers.length > 0
        ? withWorkers.reduce((a, b) => (b.rate > a.rate ? b : a))
        : undefined;
      this.#trials = at === undefined ? [] : [4, 8]
        .filter((p) => p > at.prefetch && p >= this.#p.min && p <= this.#p.max)
        .map((prefetch) => ({ workers: at.workers, prefetch }));
    }
    const trial = this.#trials.shift();
    if (trial !== undefined) return trial;
    this.#phase = "settled";
    const best = this.#best();
    return { workers: best.workers, prefetch: best.prefetch };
  }

  #best(): { workers: number; prefetch: number; rate: number } {
    return this.#results.reduce((a, b) => (b.rate > a.rate ? b : a));
  }
}

const OPTION_NAMES = new Set([
  "batchSize",
  "shuffle",
  "sampler",
  "batchSampler",
  "numWorkers",
  "collate",
  "pinMemory",
  "dropLast",
  "timeout",
  "watchdog",
  "workerInit",
  "seed",
  "prefetchFactor",
  "persistentWorkers",
  "inOrder",
  "zeroCopy",
  "augment",
  "autoRelease",
  "heldBatches",
  "workerResourceLimits",
]);

const LIMIT_KEYS = ["maxOldGenerationSizeMb", "maxYoungGenerationSizeMb", "stackSizeMb"];

/** " (did you mean X?)" for a near miss among `names`, else "" (the shared rule of internal/options.ts). */
function didYouMean(key: string, names: Iterable<string>): string {
  const near = closest(key, [...names]);
  return near === undefined ? "" : ` (did you mean ${near}?)`;
}

/** Refuses keys of `value` outside `allowed`, naming the option path and the key. */
function checkKeys(option: string, value: object, allowed: readonly string[]): void {
  for (const key of Object.keys(value)) {
    if (!allowed.includes(key)) {
      fail(
        `${option}.${key}`,
        `is unknown${didYouMean(key, allowed)}; ${option} takes ${allowed.join(", ")}`,
        "type",
      );
    }
  }
}

/** The main thread's V8 heap limit in MB: the default heap limit of each worker. */
function mainHeapLimitMb(): number {
  try {
    return Math.floor(v8.getHeapStatistics().heap_size_limit / 2 ** 20);
  } catch {
    return 4096;
  }
}

function fail(option: string, message: string, type: "type" | "range" = "range"): never {
  const text = `Cannot create DataLoader: ${option} option ${message}`;
  throw type === "type" ? new TypeError(text) : new RangeError(text);
}

function checkBool(name: string, v: unknown, dflt: boolean): boolean {
  if (v === undefined) return dflt;
  if (typeof v !== "boolean") fail(name, `should be a boolean value, got ${String(v)}`, "type");
  return v;
}

function isModuleRef(v: unknown): v is ModuleRef {
  return v !== null && typeof v === "object" &&
    typeof (v as ModuleRef).module === "string" && typeof (v as ModuleRef).export === "string";
}

/**
 * The batch type of a {@linkcode DataLoader} over a dataset of type `D` with options of type
 * `O`, following the loader's own rules:
 *
 * - a `collate` function: what it returns (`unknown` for a `{module, export}` reference);
 * - `batchSize: null` (no batching): the sample type, {@linkcode SampleOf}`<D>`;
 * - the zero-copy path (a dataset with `sharedFields()`, no `collate`, no `batchSampler`,
 *   `zeroCopy` not `false`): {@linkcode RingBatch}`<`{@linkcode SharedFieldsOf}`<D>>`,
 *   `RingBatch<{ image: Uint8Array; label: Int32Array }>` for CIFAR-10;
 * - else what {@linkcode defaultCollate} makes of the samples: {@linkcode Collated}`<SampleOf<D>>`.
 *
 * Where the types cannot tell (an option typed `boolean`, a dataset whose `sharedFields` is
 * optional), the batch is the union of the possibilities.
 *
 * @typeParam D the dataset type
 * @typeParam O the options type
 */
export type BatchOf<D, O = Record<never, never>> = D extends unknown ? [
    // What the options say: collate, batchSize, zeroCopy, batchSampler (undefined when absent).
    "collate" extends keyof O ? O["collate" & keyof O] : undefined,
    "batchSize" extends keyof O ? O["batchSize" & keyof O] : undefined,
    "zeroCopy" extends keyof O ? O["zeroCopy" & keyof O] : undefined,
    "batchSampler" extends keyof O ? O["batchSampler" & keyof O] : undefined,
    // Whether the dataset has shared fields.
    D extends { sharedFields(): unknown } ? "yes" : "sharedFields" extends keyof D ? "maybe" : "no",
  ] extends [infer C, infer S, infer Z, infer BS, infer H]
    ? [C] extends [undefined] ? [S] extends [null] ? SampleOf<D>
      :
        | ([Extract<S, null>] extends [never] ? never : SampleOf<D>)
        | {
          yes: RingBatch<SharedFieldsOf<D>>;
          maybe: RingBatch<SharedFieldsOf<D>> | Collated<SampleOf<D>>;
          no: Collated<SampleOf<D>>;
        }[
          // The zero-copy path (the constructor's rule): shared fields, zeroCopy not false,
          // no batchSampler; "maybe" where the types cannot tell.
          H extends "no" ? "no"
            : [Z] extends [false] ? "no"
            : [Extract<BS, undefined>] extends [never] ? "no"
            : [Exclude<BS, undefined>] extends [never]
              ? H extends "yes" ? [Extract<Z, false>] extends [never] ? "yes" : "maybe" : "maybe"
            : "maybe"
        ]
    : [C] extends [(samples: never) => infer B] ? B
    : unknown
  : never
  : never;

/**
 * The constructor of {@linkcode DataLoader}: `new DataLoader(dataset, options)` infers the
 * batch type from the dataset and the options ({@linkcode BatchOf}); `new DataLoader<B>(...)`
 * names it.
 */
export interface DataLoaderConstructor {
  /**
   * A loader whose batches are what `options.collate` returns; `collate` receives the
   * dataset's samples.
   *
   * @param dataset a map-style dataset (`length`, `get`)
   * @param options the options, with a collate function
   */
  new <D extends Dataset<unknown>, B>(
    dataset: D,
    options: DataLoaderOptions<B, SampleOf<D>> & { collate: CollateFn<SampleOf<D>, B> },
  ): DataLoader<B>;
  /**
   * A loader whose batch type is inferred from the dataset and the options: a typed
   * {@linkcode RingBatch} on the zero-copy path, the collated sample else ({@linkcode BatchOf}).
   *
   * @param dataset a map-style dataset (`length`, `get`)
   * @param options PyTorch's options in TypeScript casing, plus zeroCopy/augment/
   *   autoRelease/heldBatches
   */
  new <
    D extends Dataset<unknown>,
    const O extends DataLoaderOptions<unknown, SampleOf<D>> = Record<never, never>,
  >(dataset: D, options?: O): DataLoader<BatchOf<D, O>>;
  /**
   * A loader with the batch type `B` given explicitly (`new DataLoader<RingBatch>(...)`).
   *
   * @param dataset a map-style dataset (`length`, `get`)
   * @param options PyTorch's options in TypeScript casing
   */
  new <B = unknown>(dataset: Dataset, options?: DataLoaderOptions<B>): DataLoader<B>;
  /** The prototype of every DataLoader. */
  readonly prototype: DataLoader<unknown>;
  /** Workers started by any DataLoader in this isolate and not yet terminated. */
  readonly liveWorkers: number;
}

/**
 * Iterates a dataset in batches, like `torch.utils.data.DataLoader`.
 *
 * Each `for await` (or `stream()`) is one epoch; `length` is the number of batches per
 * epoch. Workers are Deno Web Workers; with `persistentWorkers` they live across epochs
 * and start on the next epoch while the consumer finishes the current one. Leaving a loop
 * early stops the epoch (and, without persistentWorkers, terminates the workers); dispose
 * the loader (`await using`) to terminate everything. Running workers keep the process alive
 * (a Web Worker cannot be unref'd): a loader with persistent workers, or one whose iterator
 * was left without finishing or `break` (PyTorch's `next(iter(loader))` peek), must be
 * disposed for the program to exit.
 *
 * The batch type `B` is inferred by `new DataLoader(dataset, options)` (see
 * {@linkcode BatchOf}): a dataset with typed shared fields gives
 * `RingBatch<{ image: Uint8Array; label: Int32Array }>`, a plain dataset whose `get` returns
 * `{ x: number; y: Uint8Array }` gives `{ x: Float64Array; y: Uint8Array }`, and a `collate`
 * function gives what it returns. `new DataLoader<B>(...)` still names it explicitly.
 *
 * The {@linkcode DataLoaderConstructor} is the value `DataLoader`; this interface is the type
 * of its instances (`loader instanceof DataLoader` holds).
 *
 * @typeParam B the batch type: `RingBatch` on the zero-copy path, the collated value else
 * @example Generic path with the default collate
 * ```ts
 * import { DataLoader } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const dataset = { length: 5, get: (i: number) => ({ x: i * 10, y: new Uint8Array([i]) }) };
 * await using loader = new DataLoader(dataset, { batchSize: 2 });
 * const typed: DataLoader<{ x: Float64Array; y: Uint8Array }> = loader;
 * const batches = [];
 * for await (const b of loader) batches.push([...b.x]);
 * assert.deepStrictEqual(batches, [[0, 10], [20, 30], [40]]);
 * assert.strictEqual(loader.length, 3);
 * ```
 */
export interface DataLoader<B = unknown> extends AsyncIterable<B>, AsyncDisposable, Disposable {
  /** The dataset. */
  readonly dataset: Dataset;
  /** Samples per batch, or null without batching. */
  readonly batchSize: number | null;
  /** Worker count (the next epoch's, when tuned: see {@linkcode DataLoaderOptions.numWorkers}). */
  readonly numWorkers: number;
  /** Batches in flight per worker (0 without workers). */
  readonly prefetchFactor: number;
  /** Whether numWorkers or prefetchFactor is tuned between epochs ("auto"). */
  readonly autotune: boolean;
  /** Whether workers persist across epochs. */
  readonly persistentWorkers: boolean;
  /** Whether batches come in sampler order. */
  readonly inOrder: boolean;
  /** Whether the last partial batch is dropped. */
  readonly dropLast: boolean;
  /** Seconds to wait for a batch (0: forever). */
  readonly timeout: number;
  /** Stall watchdog period in seconds (0: off). */
  readonly watchdog: number;
  /** The seed of every random draw. */
  readonly seed: number;
  /** Whether batches are RingBatches in the staging ring. */
  readonly zeroCopy: boolean;
  /** Whether the ring is pinned (or meant to be pinned) for the device. */
  readonly pinMemory: boolean;
  /**
   * Whether asking for the next batch releases the previous RingBatch (zero-copy path). A
   * consumer that keeps batches past the next request (the DevicePrefetcher, until their
   * copies fired) must release them itself when this is false, and must be done with each
   * one by the next request when it is true.
   */
  readonly autoRelease: boolean;
  /** The sampler (undefined when a batchSampler was given). */
  readonly sampler: Sampler | undefined;
  /** The batch sampler. */
  readonly batchSampler: BatchSamplerLike;
  /** Every finished epoch's stats, oldest first. */
  readonly history: EpochStats[];
  /** Batches per epoch (PyTorch's `len(loader)`). */
  readonly length: number;
  /** The staging ring (zero-copy path), or undefined on the generic path. */
  readonly ring: StagingRing | undefined;
  /**
   * The per-sample augmentation this loader draws (zero-copy path), with defaults filled in
   * and frozen; undefined when it draws none. Each batch's `augment` field holds one record
   * per sample ({@linkcode augmentRecord}): crop offsets `dy, dx` in [0, 2 * padding], flip
   * bits, the cutout square and the colour factors. Whoever applies them (the
   * DevicePrefetcher takes its crop padding from here) must crop with this padding.
   *
   * @example The configuration, with defaults filled in
   * ```ts
   * import { DataLoader, TensorDataset } from "@pinstream/pinstream";
   * import assert from "node:assert";
   *
   * const ds = new TensorDataset({
   *   image: { data: new Uint8Array(4 * 3 * 8 * 8), shape: [3, 8, 8] },
   *   label: { data: new Uint8Array(4), shape: [] },
   * });
   * await using loader = new DataLoader(ds, { batchSize: 2, augment: { padding: 2 } });
   * assert.deepStrictEqual(loader.augment, {
   *   padding: 2,
   *   flip: false,
   *   vflip: false,
   *   cutout: 0,
   *   brightness: 0,
   *   contrast: 0,
   * });
   * assert.ok(Object.isFrozen(loader.augment));
   * ```
   */
  readonly augment: AugmentSpec | undefined;
  /** The epoch the next iteration will load (0-based). */
  readonly epoch: number;
  /**
   * Sets the epoch the next iteration loads (to resume, or to mirror
   * `DistributedSampler.set_epoch`). Order is a pure function of (seed, epoch).
   *
   * @param epoch a non-negative integer
   * @throws {RangeError} for anything else
   */
  setEpoch(epoch: number): void;
  /**
   * Zero-copy path: ring batches a consumer may keep unreleased without starving the loader
   * (the ring less the slots its loading needs: `heldBatches` with workers, one less without,
   * at least 1); 0 on the generic path. A consumer that holds batches (see `autoRelease`) waits for one of
   * them to go back before it asks for more than this.
   *
   * @example What a consumer may hold
   * ```ts
   * import { DataLoader, RingBatch, TensorDataset } from "@pinstream/pinstream";
   * import assert from "node:assert";
   *
   * const ds = new TensorDataset({ x: { data: new Uint8Array(8), shape: [] } });
   * await using loader = new DataLoader(ds, { batchSize: 2, autoRelease: false });
   * assert.strictEqual(loader.autoRelease, false);
   * // heldBatches (default 2) less the slot the main thread loads into (no workers)
   * assert.strictEqual(loader.maxHeldBatches, 1);
   * const held: RingBatch[] = [];
   * for await (const batch of loader) {
   *   assert.ok(batch instanceof RingBatch);
   *   held.push(batch);
   *   if (held.length === loader.maxHeldBatches) held.shift()!.release();
   * }
   * for (const b of held) b.release();
   * ```
   */
  readonly maxHeldBatches: number;
  /** The last finished epoch's stats (or undefined before the first one finishes). */
  readonly stats: EpochStats | undefined;
  /** Workers of this loader currently running. */
  readonly workers: number;
  /**
   * Starts the next epoch. A second iterator stops the first, whose next `next()` then throws
   * (iterate one epoch at a time; PyTorch resets its single iterator likewise).
   *
   * @returns an async iterator over the epoch's batches
   * @throws {Error} when the loader was disposed
   */
  [Symbol.asyncIterator](): AsyncIterableIterator<B>;
  /**
   * One epoch as a ReadableStream; cancelling it stops the epoch like `break`.
   *
   * @returns a stream of the next epoch's batches
   */
  stream(): ReadableStream<B>;
  /** @internal The loader's engine (tests reach its control block). */
  _engine(epoch: number): Engine;
  /** Stops every worker, frees the ring and unpins it. Idempotent; later use throws. */
  dispose(): void;
  /** Same as `dispose()`. */
  [Symbol.dispose](): void;
  /** Same as `dispose()`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** The implementation of {@linkcode DataLoader} (see the interface for the documentation). */
class DataLoaderImpl<B = unknown> implements DataLoader<B> {
  // The public members are documented once, on the DataLoader interface above.
  readonly dataset: Dataset;
  readonly batchSize: number | null;
  get numWorkers(): number {
    return this.#workers;
  }
  get prefetchFactor(): number {
    return this.#workers === 0 ? 0 : this.#prefetch;
  }
  get autotune(): boolean {
    return this.#tuner !== undefined;
  }
  #workers = 0;
  #prefetch = 2;
  #tuner: Tuner | undefined;
  #autoWorkers = false;
  #autoPrefetch = false;
  readonly persistentWorkers: boolean;
  readonly inOrder: boolean;
  readonly dropLast: boolean;
  readonly timeout: number;
  readonly watchdog: number;
  readonly seed: number;
  readonly zeroCopy: boolean;
  readonly pinMemory: boolean;
  readonly autoRelease: boolean;
  #maxHeldBatches = 0;
  readonly sampler: Sampler | undefined;
  readonly batchSampler: BatchSamplerLike;
  readonly history: EpochStats[] = [];

  #ring: StagingRing | undefined;
  #slotState: Uint8Array | undefined;
  #resourceLimits!: WorkerResourceLimits;
  #gather: GatherSpec | undefined;
  #pinned: Disposable | undefined;
  #engine: Engine | undefined;
  #epoch = 0;
  #active: EpochIterator<B> | undefined;
  #disposed = false;
  #collateFn: CollateFn<unknown, B> | undefined;
  #collateMode: EngineConfig["collateMode"];
  /** Zero-copy: record of each sample (a Subset), or undefined when sample i is record i. */
  #recordMap: Int32Array | undefined;
  /** Zero-copy: records the shared fields hold. */
  #recordCount = 0;
  #workerInit: ModuleRef | undefined;
  #canPlanAhead: boolean;
  #augment: AugmentSpec | undefined;

  /**
   * Creates it; see the class documentation.
   *
   * @param dataset a map-style dataset (`length`, `get`)
   * @param options PyTorch's options in TypeScript casing, plus zeroCopy/augment/
   *   autoRelease/heldBatches
   * @throws {TypeError} / {RangeError} naming the option, for every invalid value or
   *   combination PyTorch refuses (sampler with shuffle, batchSampler with batchSize/
   *   shuffle/sampler/dropLast, prefetchFactor or persistentWorkers without workers, ...)
   *   and for a dataset workers cannot rebuild
   */
  constructor(dataset: Dataset, options: DataLoaderOptions<B> = {}) {
    if (
      dataset === null || typeof dataset !== "object" || typeof dataset.get !== "function" ||
      typeof dataset.length !== "number"
    ) {
      throw new TypeError(
        "Cannot create DataLoader: dataset must have a numeric length and a get(index) method",
      );
    }
    for (const key of Object.keys(options)) {
      if (!OPTION_NAMES.has(key)) {
        fail(
          key,
          `is unknown${didYouMean(key, OPTION_NAMES)}; options are ${[...OPTION_NAMES].join(", ")}`,
          "type",
        );
      }
    }
    this.dataset = dataset;
    const o = options;
    const autoWorkers = o.numWorkers === "auto";
    const autoPrefetch = o.prefetchFactor === "auto";
    this.#autoWorkers = autoWorkers;
    this.#autoPrefetch = autoPrefetch;
    const cores = Math.max(1, navigator.hardwareConcurrency || 1);
    // "auto": sized for the most it may choose, started at min(2, cores).
    const numWorkers = autoWorkers ? cores : o.numWorkers ?? 0;
    if (typeof numWorkers !== "number" || !Number.isInteger(numWorkers) || numWorkers < 0) {
      fail(
        "numWorkers",
        `should be a non-negative integer or "auto", got ${JSON.stringify(o.numWorkers)}`,
      );
    }
    this.#workers = numWorkers;
    const timeout = o.timeout ?? 0;
    if (typeof timeout !== "number" || !(timeout >= 0) || !Number.isFinite(timeout)) {
      fail("timeout", `should be a non-negative number of seconds, got ${String(timeout)}`);
    }
    this.timeout = timeout;
    const watchdog = o.watchdog ?? 10;
    if (typeof watchdog !== "number" || !(watchdog >= 0) || !Number.isFinite(watchdog)) {
      fail("watchdog", `should be a non-negative number of seconds, got ${String(watchdog)}`);
    }
    this.watchdog = watchdog;
    if (o.prefetchFactor !== undefined) {
      if (numWorkers === 0) {
        fail(
          "prefetchFactor",
          "could only be specified with workers; let numWorkers > 0 to enable prefetching",
        );
      }
      if (
        !autoPrefetch && (!Number.isInteger(o.prefetchFactor) || (o.prefetchFactor as number) < 1)
      ) {
        fail(
          "prefetchFactor",
          `should be a positive integer or "auto", got ${JSON.stringify(o.prefetchFactor)}`,
        );
      }
    }
    this.#prefetch = autoPrefetch
      ? MAX_AUTO_PREFETCH
      : (o.prefetchFactor as number | undefined) ?? 2;
    this.persistentWorkers = checkBool("persistentWorkers", o.persistentWorkers, false);
    if (this.persistentWorkers && numWorkers === 0) {
      fail("persistentWorkers", "requires numWorkers > 0");
    }
    const shuffle = checkBool("shuffle", o.shuffle, false);
    this.dropLast = checkBool("dropLast", o.dropLast, false);
    this.inOrder = checkBool("inOrder", o.inOrder, true);
    this.autoRelease = checkBool("autoRelease", o.autoRelease, true);
    if (o.seed !== undefined) {
      if (!Number.isInteger(o.seed) || o.seed < 0 || o.seed > 2 ** 53 - 1) {
        fail("seed", `should be an integer in [0, 2^53), got ${String(o.seed)}`);
      }
    }
    this.seed = o.seed ?? randomSeed();
    const heldBatches = o.heldBatches ?? 2;
    if (!Number.isInteger(heldBatches) || heldBatches < 0) {
      fail("heldBatches", `should be a non-negative integer, got ${String(heldBatches)}`);
    }
    const limits = o.workerResourceLimits ?? {};
    if (typeof limits !== "object" || limits === null) {
      fail("workerResourceLimits", "should be an object", "type");
    }
    checkKeys("workerResourceLimits", limits, LIMIT_KEYS);
    for (const key of LIMIT_KEYS) {
      const v = (limits as Record<string, unknown>)[key];
      if (v !== undefined && (typeof v !== "number" || !Number.isInteger(v) || v < 1)) {
        fail(`workerResourceLimits.${key}`, `should be a positive integer (MB), got ${String(v)}`);
      }
    }
    this.#resourceLimits = {
      ...limits,
      maxOldGenerationSizeMb: limits.maxOldGenerationSizeMb ?? mainHeapLimitMb(),
    };

    // Batching: the same checks, in the same order, as torch.utils.data.DataLoader.
    const batchSize = o.batchSize === undefined ? 1 : o.batchSize;
    if (batchSize !== null && (!Number.isInteger(batchSize) || batchSize < 1)) {
      fail("batchSize", `should be a positive integer or null, got ${String(batchSize)}`);
    }
    if (o.sampler !== undefined && shuffle) {
      fail("sampler", "is mutually exclusive with shuffle", "type");
    }
    if (o.batchSampler !== undefined) {
      if (batchSize !== 1 || shuffle || o.sampler !== undefined || this.dropLast) {
        fail(
          "batchSampler",
          "is mutually exclusive with batchSize, shuffle, sampler, and dropLast",
          "type",
        );
      }
    } else if (batchSize === null && this.dropLast) {
      fail(
        "dropLast",
        "is mutually exclusive with batchSize null (which disables batching)",
        "type",
      );
    }

    let canPlanAhead = true;
    if (o.batchSampler !== undefined) {
      this.batchSize = null;
      this.sampler = undefined;
      const bs = o.batchSampler;
      if (typeof bs !== "object" || bs === null || typeof bs.length !== "number") {
        fail(
          "batchSampler",
          "should have a numeric length and batches(epoch) or be iterable",
          "type",
        );
      }
      if (typeof (bs as BatchSamplerLike).batches === "function") {
        this.batchSampler = bs as BatchSamplerLike;
      } else if (Symbol.iterator in bs) {
        canPlanAhead = false;
        const it = bs as Iterable<Iterable<number>> & { length: number };
        this.batchSampler = {
          get length() {
            return it.length;
          },
          batches: () => it,
        };
      } else {
        fail("batchSampler", "should have batches(epoch) or be iterable", "type");
      }
    } else {
      this.batchSize = batchSize;
      let sampler: Sampler;
      if (o.sampler !== undefined) {
        const s = o.sampler;
        if (typeof s !== "object" || s === null || typeof s.length !== "number") {
          fail("sampler", "should have a numeric length and indices(epoch) or be iterable", "type");
        }
        if (typeof (s as Sampler).indices === "function") sampler = s as Sampler;
        else if (Symbol.iterator in s) {
          canPlanAhead = false;
          const it = s as Iterable<number> & { length: number };
          sampler = {
            get length() {
              return it.length;
            },
            indices: () => it,
          };
        } else fail("sampler", "should have indices(epoch) or be iterable", "type");
      } else if (shuffle) {
        sampler = new RandomSampler(dataset.length, { seed: this.seed });
      } else {
        sampler = new SequentialSampler(dataset.length);
      }
      this.sampler = sampler;
      this.batchSampler = new BatchSampler(sampler, {
        batchSize: batchSize ?? 1,
        dropLast: this.dropLast,
      });
    }
    this.#canPlanAhead = canPlanAhead;

    // Path selection.
    const shared = typeof dataset.sharedFields === "function";
    if (o.collate !== undefined && typeof o.collate !== "function" && !isModuleRef(o.collate)) {
      fail("collate", "should be a function or a {module, export} reference", "type");
    }
    if (o.zeroCopy === true) {
      if (!shared) fail("zeroCopy", "needs a dataset with sharedFields()", "type");
      if (o.collate !== undefined) fail("zeroCopy", "is mutually exclusive with collate", "type");
      if (this.batchSize === null) {
        fail(
          "zeroCopy",
          "needs batches (a batchSize, or a batchSampler of equal-size batches)",
          "type",
        );
      }
    }
    this.zeroCopy = checkBool("zeroCopy", o.zeroCopy, shared && o.collate === undefined) &&
      shared && o.collate === undefined && this.batchSize !== null;
    if (o.augment !== undefined) {
      if (!this.zeroCopy) {
        fail(
          "augment",
          "needs the zero-copy path (a dataset with sharedFields(), no collate, batches)",
          "type",
        );
      }
      // Frozen: the public `augment` getter hands out this very object.
      this.#augment = resolveAugment(o.augment, "create DataLoader");
    }
    if (o.workerInit !== undefined && !isModuleRef(o.workerInit)) {
      fail(
        "workerInit",
        "should be a {module, export} reference: workers are separate isolates and cannot " +
          "receive functions",
        "type",
      );
    }
    this.#workerInit = o.workerInit;
    if (typeof o.collate === "function") {
      this.#collateFn = o.collate;
      this.#collateMode = "main";
    } else if (o.collate !== undefined) {
      this.#collateMode = o.collate;
    } else {
      this.#collateMode = this.batchSize === null && o.batchSampler === undefined
        ? "none"
        : "default";
    }
    if (!this.zeroCopy && numWorkers > 0 && typeof dataset.workerSpec !== "function") {
      fail(
        "numWorkers",
        `${autoWorkers ? '"auto"' : numWorkers} needs a dataset that workers can rebuild: ` +
          "implement workerSpec() " +
          `returning { module: import.meta.url, export: "MyDataset.fromState", state } ` +
          "(state structured-clonable; SharedArrayBuffers are shared) or sharedFields() for " +
          "the zero-copy path, or use numWorkers: 0",
        "type",
      );
    }

    const pin = o.pinMemory ?? false;
    if (typeof pin !== "boolean" && typeof pin !== "function") {
      fail("pinMemory", "should be a boolean or a function (ring) => Disposable", "type");
    }
    this.pinMemory = pin !== false;

    if (this.zeroCopy) {
      const fields = dataset.sharedFields!();
      const records = dataset.records?.();
      if (records !== undefined) {
        if (!(records.indices instanceof Int32Array) || records.indices.length !== dataset.length) {
          throw new TypeError(
            `Cannot create DataLoader: dataset.records() should map each of the ${dataset.length} ` +
              "samples to a record (an Int32Array of that length)",
          );
        }
        for (const r of records.indices) {
          if (!(r >= 0 && r < records.count)) {
            throw new RangeError(
              `Cannot create DataLoader: dataset.records() maps a sample to record ${r}, ` +
                `outside the ${records.count} records of its shared fields`,
            );
          }
        }
      }
      this.#recordMap = records?.indices;
      this.#recordCount = records?.count ?? dataset.length;
      this.#setupRing(fields, heldBatches);
      if (typeof pin === "function") {
        const d = pin(this.#ring!);
        if (d && typeof d[Symbol.dispose] === "function") this.#pinned = d;
      }
    }
    this.#startTuner();
  }

  /** numWorkers / prefetchFactor "auto": sized for the most, started lower. */
  #startTuner(): void {
    if (this.#autoWorkers || this.#autoPrefetch) {
      // The ring holds the most "auto" may use; start lower and let the tuner climb.
      const min = this.persistentWorkers ? 1 : 0, max = this.#workers;
      this.#tuner = new Tuner(
        this.#autoWorkers
          ? { min, max: this.#workers }
          : { min: this.#workers, max: this.#workers },
        this.#autoPrefetch
          ? { min: 2, max: MAX_AUTO_PREFETCH }
          : { min: this.#prefetch, max: this.#prefetch },
      );
      this.#workers = this.#autoWorkers ? Math.max(min, Math.min(2, max)) : this.#workers;
      this.#prefetch = this.#autoPrefetch ? 2 : this.#prefetch;
    }
  }

  #setupRing(fields: readonly SharedField[], heldBatches: number): void {
    for (const f of fields) {
      if (f.name === "indices" || f.name === "augment") {
        throw new RangeError(
          `Cannot create DataLoader: dataset field name "${f.name}" is reserved for the ring`,
        );
      }
      if (!(f.buffer instanceof SharedArrayBuffer)) {
        throw new TypeError(
          `Cannot create DataLoader: shared field "${f.name}" is not in a SharedArrayBuffer ` +
            "(allocate it with sharedArray())",
        );
      }
      const need = (f.byteOffset ?? 0) + this.#recordCount * recordBytes(f);
      if (need > f.buffer.byteLength) {
        throw new RangeError(
          `Cannot create DataLoader: shared field "${f.name}" needs ${need} bytes for ` +
            `${this.#recordCount} ${this.#recordMap ? "records" : "samples"}, its buffer has ` +
            `${f.buffer.byteLength}`,
        );
      }
    }
    const ringFields = [
      ...fields.map((f) => ({ name: f.name, dtype: f.dtype, shape: f.shape })),
      { name: "indices", dtype: "i32" as const, shape: [] },
      ...(this.#augment
        ? [{ name: "augment", dtype: "i32" as const, shape: [AUGMENT_RECORD_LENGTH] }]
        : []),
    ];
    let maxBatch = this.batchSize ?? 0;
    if (this.batchSize !== null && this.sampler !== undefined) {
      // A batch never holds more indices than an epoch has: batchSize 1e6 on 10 samples
      // needs slots of 10 records, not of a million (a sampler that yields more than its
      // length is refused when the epoch is planned).
      maxBatch = Math.min(maxBatch, Math.max(1, this.sampler.length));
    }
    if (this.batchSize === null) {
      // A batchSampler: size slots for its largest batch of epoch 0.
      let k = 0;
      for (const b of this.batchSampler.batches(0)) {
        maxBatch = Math.max(maxBatch, toIndices(b, 0, Infinity, k++).length);
      }
    }
    // In flight + held by the consumer + one per worker: a worker takes its next slot before
    // it takes its next task, so an idle worker holds one.
    const slots = this.prefetchFactor * Math.max(1, this.numWorkers) + Math.max(1, heldBatches) +
      this.numWorkers;
    let ring: StagingRing;
    try {
      ring = new StagingRing(ringFields, Math.max(1, maxBatch), slots);
    } catch (e) {
      const perSample = ringFields.reduce((n, f) => n + recordBytes(f), 0);
      throw new RangeError(
        `Cannot create DataLoader: the staging ring needs about ${
          ((slots * Math.max(1, maxBatch) * perSample) / 2 ** 20).toFixed(0)
        } MiB (${slots} slots of ${maxBatch} samples of ${perSample} bytes) and could not be ` +
          `allocated (${(e as Error)?.message ?? e}); lower batchSize, prefetchFactor, ` +
          "numWorkers or heldBatches",
      );
    }
    // Loading needs a free slot per batch in flight and per idle worker (one without workers).
    this.#maxHeldBatches = Math.max(
      1,
      slots - Math.max(1, this.prefetchFactor * this.numWorkers + this.numWorkers),
    );
    this.#ring = ring;
    this.#slotState = new Uint8Array(slots);
    this.#gather = {
      ring: ring.buffer,
      ringMemory: ring.memory,
      slotBytes: ring.slotBytes,
      sources: fields.map((f) => {
        const rf = ring.field(f.name);
        return {
          buffer: f.buffer,
          memory: memoryOf(f.buffer),
          byteOffset: f.byteOffset ?? 0,
          recordBytes: rf.sampleBytes,
          slotFieldOffset: rf.byteOffset,
        };
      }),
      indicesOffset: ring.field("indices").byteOffset,
      augmentOffset: this.#augment ? ring.field("augment").byteOffset : -1,
      augment: { ...(this.#augment ?? AUGMENT_OFF) },
      length: this.#recordCount,
      seed: this.seed,
    };
  }

  /** Batches per epoch (PyTorch's `len(loader)`). */
  get length(): number {
    return this.batchSampler.length;
  }

  /** The staging ring (zero-copy path), or undefined on the generic path. */
  get ring(): StagingRing | undefined {
    return this.#ring;
  }

  /** See {@linkcode DataLoader.augment}. */
  get augment(): AugmentSpec | undefined {
    return this.#augment;
  }

  /** The epoch the next iteration will load (0-based). */
  get epoch(): number {
    return this.#epoch;
  }

  /**
   * Sets the epoch the next iteration loads (to resume, or to mirror
   * `DistributedSampler.set_epoch`). Order is a pure function of (seed, epoch).
   *
   * @param epoch a non-negative integer
   * @throws {RangeError} for anything else
   */
  setEpoch(epoch: number): void {
    if (!Number.isInteger(epoch) || epoch < 0) {
      throw new RangeError(`Cannot set epoch: expected a non-negative integer, got ${epoch}`);
    }
    this.#epoch = epoch;
  }

  /** See {@linkcode DataLoader.maxHeldBatches}. */
  get maxHeldBatches(): number {
    return this.#maxHeldBatches;
  }

  /** The last finished epoch's stats (or undefined before the first one finishes). */
  get stats(): EpochStats | undefined {
    return this.history[this.history.length - 1];
  }

  /** Workers of this loader currently running. */
  get workers(): number {
    return this.#engine && !this.#engine.closed && !this.#engine.failure ? this.numWorkers : 0;
  }

  /** Workers started by any DataLoader in this isolate and not yet terminated. */
  static get liveWorkers(): number {
    return liveWorkerCount();
  }

  /**
   * Starts the next epoch. A second iterator stops the first, whose next `next()` then throws
   * (iterate one epoch at a time; PyTorch resets its single iterator likewise).
   *
   * @returns an async iterator over the epoch's batches
   * @throws {Error} when the loader was disposed
   */
  [Symbol.asyncIterator](): AsyncIterableIterator<B> {
    if (this.#disposed) throw new Error("Cannot iterate: the DataLoader was disposed");
    // PyTorch's `sampler.set_epoch(e)` before each epoch (or once, to resume) picks the epoch.
    const source = this.sampler ?? (this.batchSampler as { sampler?: unknown }).sampler;
    const set = source instanceof DistributedSampler ? source._takeSetEpoch() : undefined;
    if (set !== undefined) this.#epoch = set;
    const epoch = this.#epoch++;
    this.#active?.stop(epoch);
    const it = new EpochIterator<B>(this, epoch);
    this.#active = it;
    return it;
  }

  /**
   * One epoch as a ReadableStream; cancelling it stops the epoch like `break`.
   *
   * @returns a stream of the next epoch's batches
   */
  stream(): ReadableStream<B> {
    const it = this[Symbol.asyncIterator]();
    return new ReadableStream<B>({
      async pull(controller) {
        try {
          const r = await it.next();
          if (r.done) controller.close();
          else controller.enqueue(r.value);
        } catch (e) {
          controller.error(e);
        }
      },
      async cancel() {
        await it.return!();
      },
    }, { highWaterMark: 0 });
  }

  /** @internal */
  _engine(epoch: number): Engine {
    if (this.#engine && !this.#engine.closed && !this.#engine.failure) return this.#engine;
    this.#engine = new Engine({
      dataset: this.dataset,
      firstEpoch: epoch,
      numWorkers: this.numWorkers,
      prefetchFactor: this.prefetchFactor,
      inOrder: this.inOrder,
      timeout: this.timeout,
      watchdog: this.watchdog,
      seed: this.seed,
      plan: (epoch) => {
        const batches = Array.from(
          this.batchSampler.batches(epoch),
          (b, k) => toIndices(b, epoch, Infinity, k),
        );
        const map = this.#recordMap;
        if (map === undefined) return batches;
        // Sample -> record; an index outside the dataset becomes -1, which the gather
        // reports as out of range.
        return batches.map((b) => b.map((i) => (i >= 0 && i < map.length ? map[i] : -1)));
      },
      canPlanAhead: this.#canPlanAhead,
      persistent: this.persistentWorkers,
      ring: this.#ring,
      gather: this.#gather,
      slotState: this.#slotState,
      collateMode: this.#collateMode,
      unbatched: this.batchSize === null && this.sampler !== undefined,
      workerSpec: this.zeroCopy ? undefined : this.dataset.workerSpec?.(),
      workerInit: this.#workerInit,
      resourceLimits: this.#resourceLimits,
      onWait: (s, d) => this.#active?._onWait(s, d),
    });
    return this.#engine;
  }

  /** @internal Called when an epoch ends, early or not. */
  _finish(it: EpochIterator<B>, plan: EpochPlan | undefined, complete: boolean): void {
    if (this.#active === it) this.#active = undefined;
    const engine = this.#engine;
    if (complete && this.#tuner !== undefined && this.stats !== undefined) {
      const next = this.#tuner.next(this.stats);
      if (next.workers !== this.#workers || next.prefetch !== this.#prefetch) {
        // The next epoch starts an engine with the new counts (the sample order does not
        // depend on them).
        this.#workers = next.workers;
        this.#prefetch = next.prefetch;
        if (engine) {
          engine.close();
          this.#engine = undefined;
        }
        return;
      }
    }
    if (!engine) return;
    // Without workers the engine holds no thread: keep it (and its compiled gather).
    if ((!this.persistentWorkers && this.numWorkers > 0) || engine.failure) {
      engine.close();
      this.#engine = undefined;
    } else if (plan && !complete) {
      engine.abandon(plan);
    }
  }

  /** @internal */
  _wrap(r: Result): B {
    if (r.kind === "slot") {
      this.#slotState![r.slot] = SLOT_CONSUMER;
      return new RingBatch(this.#ring!, r.slot, r.epoch, r.batch, r.size, (b) => {
        if (this.#disposed) return;
        this.#slotState![b.slot] = SLOT_FREE;
        this.#engine?.pump();
      }) as B;
    }
    if (r.kind === "error") throw r.error;
    let value = r.value;
    if (this.#collateMode === "main" || this.#collateMode === "none") {
      const samples = value as unknown[];
      if (this.batchSize === null && this.sampler !== undefined) {
        value = this.#collateFn ? (this.#collateFn as (s: unknown) => B)(samples[0]) : samples[0];
      } else if (this.#collateFn) value = this.#collateFn(samples);
    }
    return value as B;
  }

  /** Stops every worker, frees the ring and unpins it. Idempotent; later use throws. */
  dispose(): void {
    if (this.#disposed) return;
    this.#active?.stop();
    this.#engine?.close();
    this.#engine = undefined;
    this.#disposed = true;
    this.#pinned?.[Symbol.dispose]();
    this.#pinned = undefined;
    this.#slotState?.fill(SLOT_FREE);
  }

  /** Same as `dispose()`. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Same as `dispose()`. */
  [Symbol.asyncDispose](): Promise<void> {
    this.dispose();
    return Promise.resolve();
  }
}

/** One epoch of a DataLoader. */
class EpochIterator<B> implements AsyncIterableIterator<B> {
  #loader: DataLoaderImpl<B>;
  #epoch: number;
  #plan: EpochPlan | undefined;
  #engine: Engine | undefined;
  #done = false;
  /** Set when a newer iterator took over: continuing this one is a mistake, not an end. */
  #supersededBy: number | undefined;
  #last: B | undefined;
  #t0 = 0;
  #stats: EpochStats;
  #depthSum = 0;
  #requests = 0;
  #busy0 = 0;

  constructor(loader: DataLoaderImpl<B>, epoch: number) {
    this.#loader = loader;
    this.#epoch = epoch;
    this.#stats = {
      epoch,
      batches: 0,
      samples: 0,
      seconds: 0,
      waitSeconds: 0,
      firstBatchSeconds: 0,
      batchesPerSecond: 0,
      samplesPerSecond: 0,
      meanQueueDepth: 0,
      workerBusySeconds: 0,
      numWorkers: loader.numWorkers,
      prefetchFactor: loader.prefetchFactor,
    };
  }

  _onWait(seconds: number, depth: number): void {
    if (this.#stats.batches === 0) this.#stats.firstBatchSeconds = seconds;
    this.#stats.waitSeconds += seconds;
    this.#depthSum += depth;
    this.#requests++;
  }

  #releaseLast(): void {
    const last = this.#last;
    this.#last = undefined;
    if (last instanceof RingBatch && this.#loader.autoRelease) last.release();
  }

  #superseded(): Error {
    return new Error(
      `Cannot continue epoch ${this.#epoch}: a newer iterator of this DataLoader started epoch ` +
        `${this.#supersededBy} and stopped it (iterate one epoch at a time)`,
    );
  }

  /** The previous next() call: calls run one after another, as an async generator's do. */
  #queue: Promise<unknown> = Promise.resolve();

  next(): Promise<IteratorResult<B>> {
    const r = this.#queue.then(() => this.#next());
    this.#queue = r.catch(() => {});
    return r;
  }

  async #next(): Promise<IteratorResult<B>> {
    if (this.#supersededBy !== undefined) throw this.#superseded();
    if (this.#done) return { done: true, value: undefined };
    using _ = range("loader.next");
    this.#releaseLast();
    try {
      if (!this.#plan) {
        this.#t0 = performance.now();
        this.#engine = this.#loader._engine(this.#epoch);
        this.#busy0 = this.#engine.busyMs;
        this.#plan = this.#engine.startEpoch(this.#epoch);
      }
      const r = await this.#engine!.next(this.#plan);
      if (this.#supersededBy !== undefined) throw this.#superseded();
      if (this.#done) return { done: true, value: undefined };
      if (!r) {
        this.#end(true);
        return { done: true, value: undefined };
      }
      const value = this.#loader._wrap(r);
      this.#stats.batches++;
      this.#stats.samples += r.size;
      this.#last = value;
      return { done: false, value };
    } catch (e) {
      this.#end(false);
      throw e;
    }
  }

  #end(complete: boolean): void {
    if (this.#done) return;
    this.#done = true;
    this.#releaseLast();
    const s = this.#stats;
    s.seconds = this.#t0 > 0 ? (performance.now() - this.#t0) / 1000 : 0;
    s.batchesPerSecond = s.seconds > 0 ? s.batches / s.seconds : 0;
    s.samplesPerSecond = s.seconds > 0 ? s.samples / s.seconds : 0;
    s.meanQueueDepth = this.#requests > 0 ? this.#depthSum / this.#requests : 0;
    if (this.#engine) s.workerBusySeconds = (this.#engine.busyMs - this.#busy0) / 1000;
    if (complete) this.#loader.history.push(s);
    this.#loader._finish(this, this.#plan, complete);
  }

  /**
   * Stops the epoch early: dispose (`next()` then reports the end), or a newer iterator
   * (`next()` then throws, naming it).
   */
  stop(newerEpoch?: number): void {
    if (newerEpoch !== undefined && !this.#done) this.#supersededBy = newerEpoch;
    this.#end(false);
  }

  return(): Promise<IteratorResult<B>> {
    this.#end(false);
    return Promise.resolve({ done: true, value: undefined });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<B> {
    return this;
  }
}

/**
 * Iterates a dataset in batches, like `torch.utils.data.DataLoader`; see the
 * {@linkcode DataLoader} interface, and {@linkcode DataLoaderConstructor} for how the batch
 * type is inferred. A value and a type of one name, as `Array` and `Map` are in TypeScript's
 * own declarations: a class cannot give its constructor type parameters of its own, which
 * inferring the batch type from the dataset needs.
 */
export const DataLoader: DataLoaderConstructor = DataLoaderImpl as unknown as DataLoaderConstructor;
