/**
 * `DataLoader`: PyTorch's DataLoader for Deno, with worker threads, a zero-copy staging ring in
 * shared memory, prefetch across epochs and seeded per-sample augmentation parameters. Its
 * options and their checks are in options.ts, the order of its epochs in order.ts, the tuning
 * of "auto" counts in _autotune.ts, and loading itself in _engine.ts and the _transport_*.ts
 * modules.
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
import type { AugmentSpec } from "../augment/options.ts";
import type { GeometrySpec } from "../augment/geometry.ts";
import { WorkerCounts } from "./_autotune.ts";
import { noteBatchSamples } from "./_batch_samples.ts";
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
import type { ModuleRef } from "./_protocol.ts";
import { type Staging, staging } from "./_staging.ts";
import type { Collated, CollateFn } from "./collate.ts";
import type { Dataset, SampleOf, SharedFieldsOf, WorkerSpec } from "./dataset.ts";
import { type DataLoaderOptions, resolveOptions } from "./options.ts";
import type { EpochOrder } from "./order.ts";
import { RingBatch, type StagingRing } from "./ring.ts";
import type { BatchSamplerLike, Sampler } from "./sampler.ts";

export { WorkerError } from "./_engine.ts";
export type { AugmentOptions } from "../augment/options.ts";
export type { ModuleRef } from "./_protocol.ts";
export type { DataLoaderOptions } from "./options.ts";

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
 * names it. A class cannot give its constructor type parameters of its own, which inferring
 * the batch type from the dataset needs, so the value `DataLoader` is
 * {@linkcode DataLoaderImpl} seen through these signatures (as `Array` is in TypeScript's own
 * declarations); its statics are the class's.
 */
export interface DataLoaderConstructor
  extends Pick<typeof DataLoaderImpl, "prototype" | "liveWorkers"> {
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
  ): DataLoaderImpl<B>;
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
  >(dataset: D, options?: O): DataLoaderImpl<BatchOf<D, O>>;
  /**
   * A loader with the batch type `B` given explicitly (`new DataLoader<RingBatch>(...)`).
   *
   * @param dataset a map-style dataset (`length`, `get`)
   * @param options PyTorch's options in TypeScript casing
   */
  new <B = unknown>(dataset: Dataset, options?: DataLoaderOptions<B>): DataLoaderImpl<B>;
}

/**
 * Iterates a dataset in batches, like `torch.utils.data.DataLoader`. Construct it as
 * `new DataLoader(dataset, options)` ({@linkcode DataLoaderConstructor}), which infers the
 * batch type; `DataLoader<B>` is this class's type.
 *
 * Each `for await` (or `stream()`) is one epoch; `length` is the number of batches per
 * epoch. Workers are `node:worker_threads` workers; with `persistentWorkers` they live across
 * epochs and start on the next epoch while the consumer finishes the current one. Leaving a
 * loop early stops the epoch (and, without persistentWorkers, terminates the workers); dispose
 * the loader (`await using`) to terminate everything. Running workers keep the process alive:
 * a loader with persistent workers, or one whose iterator was left without finishing or
 * `break` (PyTorch's `next(iter(loader))` peek), must be disposed for the program to exit.
 *
 * The batch type `B` is inferred by `new DataLoader(dataset, options)` (see
 * {@linkcode BatchOf}): a dataset with typed shared fields gives
 * `RingBatch<{ image: Uint8Array; label: Int32Array }>`, a plain dataset whose `get` returns
 * `{ x: number; y: Uint8Array }` gives `{ x: Float64Array; y: Uint8Array }`, and a `collate`
 * function gives what it returns. `new DataLoader<B>(...)` still names it explicitly.
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
 * assert.ok(typed instanceof DataLoader);
 * ```
 */
export class DataLoaderImpl<B = unknown> implements AsyncIterable<B>, AsyncDisposable, Disposable {
  /** The dataset. */
  readonly dataset: Dataset;
  /**
   * The order of the loader's epochs: seed, epoch counter, sampler, and the batches and
   * augment records of each epoch (what a loader over the same dataset with the same options,
   * a DeviceLoader, or a resumed run shares).
   */
  readonly order: EpochOrder;
  /** Whether workers persist across epochs. */
  readonly persistentWorkers: boolean;
  /** Whether batches come in sampler order. */
  readonly inOrder: boolean;
  /** Seconds to wait for a batch (0: forever). */
  readonly timeout: number;
  /** Stall watchdog period in seconds (0: off). */
  readonly watchdog: number;
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
  /** Every finished epoch's stats, oldest first. */
  readonly history: EpochStats[] = [];
  readonly #counts: WorkerCounts;
  readonly #staging: Staging | undefined;
  readonly #resourceLimits: WorkerResourceLimits;
  readonly #collateFn: CollateFn<unknown, unknown> | undefined;
  readonly #collateMode: EngineConfig["collateMode"];
  readonly #workerInit: ModuleRef | undefined;
  readonly #geometry: GeometrySpec | undefined;
  readonly #workerSpec: WorkerSpec | undefined;
  #pinned: Disposable | undefined;
  #engine: Engine | undefined;
  #active: EpochIterator<B> | undefined;
  #disposed = false;

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
    const o = resolveOptions(dataset, options);
    this.dataset = dataset;
    this.order = o.order;
    this.persistentWorkers = o.persistentWorkers;
    this.inOrder = o.inOrder;
    this.timeout = o.timeout;
    this.watchdog = o.watchdog;
    this.zeroCopy = o.zeroCopy;
    this.pinMemory = o.pinMemory !== false;
    this.autoRelease = o.autoRelease;
    this.#resourceLimits = o.resourceLimits;
    this.#collateFn = o.collate;
    this.#collateMode = o.collateMode;
    this.#workerInit = o.workerInit;
    this.#geometry = o.geometry;
    this.#workerSpec = o.workerSpec;
    const cores = Math.max(1, navigator.hardwareConcurrency || 1);
    const counts = new WorkerCounts(o.numWorkers, o.prefetchFactor, cores, o.persistentWorkers);
    this.#counts = counts;
    if (o.zeroCopy) {
      // Sized for the most workers and prefetch "auto" may choose.
      const { maxWorkers: w, maxPrefetch: p } = counts;
      this.#staging = staging(dataset, o.order, w, w === 0 ? 0 : p, o.heldBatches, o.geometry);
      if (typeof o.pinMemory === "function") {
        const d = o.pinMemory(this.#staging.ring);
        if (d && typeof d[Symbol.dispose] === "function") this.#pinned = d;
      }
    }
  }

  /** Samples per batch, or null without batching. */
  get batchSize(): number | null {
    return this.order.batchSize;
  }

  /** Whether the last partial batch is dropped. */
  get dropLast(): boolean {
    return this.order.dropLast;
  }

  /** The seed of every random draw. */
  get seed(): number {
    return this.order.seed;
  }

  /** The sampler (undefined when a batchSampler was given). */
  get sampler(): Sampler | undefined {
    return this.order.sampler;
  }

  /** The batch sampler. */
  get batchSampler(): BatchSamplerLike {
    return this.order.batchSampler;
  }

  /** Worker count (the next epoch's, when tuned: see {@linkcode DataLoaderOptions.numWorkers}). */
  get numWorkers(): number {
    return this.#counts.workers;
  }

  /** Batches in flight per worker (0 without workers). */
  get prefetchFactor(): number {
    return this.#counts.prefetch;
  }

  /** Whether numWorkers or prefetchFactor is tuned between epochs ("auto"). */
  get autotune(): boolean {
    return this.#counts.tuned;
  }

  /** Batches per epoch (PyTorch's `len(loader)`). */
  get length(): number {
    return this.order.length;
  }

  /** The staging ring (zero-copy path), or undefined on the generic path. */
  get ring(): StagingRing | undefined {
    return this.#staging?.ring;
  }

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
   *   saturation: 0,
   *   hue: 0,
   * });
   * assert.ok(Object.isFrozen(loader.augment));
   * ```
   */
  get augment(): AugmentSpec | undefined {
    return this.order.augment;
  }

  /**
   * The geometric transforms this loader draws (zero-copy path), checked and frozen;
   * undefined when it draws none. Each batch's `geometry` field holds one record per sample
   * ({@linkcode writeGeometryRecord}); `toDevice` applies them before the augment kernel.
   *
   * @example RandomResizedCrop to 4x4 of 8x8 images
   * ```ts
   * import { DataLoader, TensorDataset } from "@pinstream/pinstream";
   * import assert from "node:assert";
   *
   * const ds = new TensorDataset({
   *   image: { data: new Uint8Array(4 * 8 * 8 * 3), shape: [8, 8, 3] },
   *   label: { data: new Uint8Array(4), shape: [] },
   * });
   * await using loader = new DataLoader(ds, {
   *   batchSize: 2,
   *   geometry: { size: 4, crop: "random-resized-crop" },
   * });
   * assert.strictEqual(loader.geometry?.crop, "random-resized-crop");
   * for await (const batch of loader) {
   *   const r = batch.geometry!; // [h, w, top, left, cropH, cropW, cos, sin] per sample
   *   assert.deepStrictEqual([r[0], r[1]], [8, 8]);
   *   break;
   * }
   * ```
   */
  get geometry(): GeometrySpec | undefined {
    return this.#geometry;
  }

  /** The epoch the next iteration will load (0-based). */
  get epoch(): number {
    return this.order.epoch;
  }

  /**
   * Sets the epoch the next iteration loads (to resume, or to mirror
   * `DistributedSampler.set_epoch`). Order is a pure function of (seed, epoch).
   *
   * @param epoch a non-negative integer
   * @throws {RangeError} for anything else
   */
  setEpoch(epoch: number): void {
    this.order.setEpoch(epoch);
  }

  /**
   * Zero-copy path: ring batches a consumer may keep unreleased without starving the loader
   * (the ring less the slots its loading needs: `heldBatches` with workers, one less without,
   * at least 1); 0 on the generic path. A consumer that holds batches (see `autoRelease`)
   * waits for one of them to go back before it asks for more than this.
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
  get maxHeldBatches(): number {
    return this.#staging?.maxHeldBatches ?? 0;
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
    const epoch = this.order.nextEpoch();
    this.#active?.stop(epoch);
    const it = new EpochIterator<B>(epoch, {
      numWorkers: this.numWorkers,
      prefetchFactor: this.prefetchFactor,
      autoRelease: this.autoRelease,
      engine: () => this._engine(epoch),
      wrap: (r) => this.#wrap(r),
      finish: (it, plan, stats) => this.#finish(it, plan, stats),
    });
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

  /**
   * @internal The loader's engine, started for `epoch` unless one runs (tests reach its
   * control block).
   */
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
      order: this.order,
      recordMap: this.#staging?.recordMap,
      persistent: this.persistentWorkers,
      ring: this.#staging?.ring,
      gather: this.#staging?.gather,
      slotState: this.#staging?.slotState,
      collateMode: this.#collateMode,
      unbatched: this.batchSize === null && this.sampler !== undefined,
      workerSpec: this.zeroCopy && !this.#staging?.gather.filled?.length
        ? undefined
        : this.#workerSpec,
      workerInit: this.#workerInit,
      resourceLimits: this.#resourceLimits,
      onWait: (s, d) => this.#active?.onWait(s, d),
    });
    return this.#engine;
  }

  /** An epoch ended, early or not (`stats` when it finished). */
  #finish(it: EpochIterator<B>, plan: EpochPlan | undefined, stats: EpochStats | undefined) {
    if (stats !== undefined) this.history.push(stats);
    if (this.#active === it) this.#active = undefined;
    const engine = this.#engine;
    // New counts start a new engine next epoch (the sample order does not depend on them).
    if ((stats !== undefined && this.#counts.next(stats)) || engine?.failure) {
      engine?.close();
      this.#engine = undefined;
      return;
    }
    if (!engine) return;
    // Without workers the engine holds no thread: keep it (and its compiled gather).
    if (!this.persistentWorkers && this.numWorkers > 0) {
      engine.close();
      this.#engine = undefined;
    } else if (plan && stats === undefined) {
      engine.abandon(plan);
    }
  }

  #wrap(r: Result): B {
    if (r.kind === "slot") {
      const staged = this.#staging!;
      staged.slotState[r.slot] = SLOT_CONSUMER;
      return new RingBatch(staged.ring, r.slot, r.epoch, r.batch, r.size, (b) => {
        if (this.#disposed) return;
        staged.slotState[b.slot] = SLOT_FREE;
        this.#engine?.pump();
      }) as B;
    }
    if (r.kind === "error") throw r.error;
    const collate = this.#collateFn;
    if (this.#collateMode !== "main" && this.#collateMode !== "none") return r.value as B;
    const samples = r.value as unknown[];
    if (this.batchSize === null && this.sampler !== undefined) {
      return (collate ? (collate as (s: unknown) => unknown)(samples[0]) : samples[0]) as B;
    }
    return (collate ? collate(samples) : samples) as B;
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
    this.#staging?.slotState.fill(SLOT_FREE);
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

/** What an epoch's iterator needs of its loader. */
interface EpochHost<B> {
  readonly numWorkers: number;
  readonly prefetchFactor: number;
  readonly autoRelease: boolean;
  /** The engine to load the epoch with. */
  engine(): Engine;
  /** A result as the batch the consumer gets. */
  wrap(r: Result): B;
  /** The epoch ended: with its stats when it finished, without when it stopped early. */
  finish(it: EpochIterator<B>, plan: EpochPlan | undefined, stats: EpochStats | undefined): void;
}

/** One epoch of a DataLoader. */
class EpochIterator<B> implements AsyncIterableIterator<B> {
  #loader: EpochHost<B>;
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

  constructor(epoch: number, loader: EpochHost<B>) {
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

  /** The consumer waited `seconds` for a batch and found `depth` ready. */
  onWait(seconds: number, depth: number): void {
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
        this.#engine = this.#loader.engine();
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
      const value = this.#loader.wrap(r);
      noteBatchSamples(value, r.size);
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
    this.#loader.finish(this, this.#plan, complete ? s : undefined);
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
 * Iterates a dataset in batches, like `torch.utils.data.DataLoader`: the class
 * {@linkcode DataLoaderImpl} through the constructor signatures of
 * {@linkcode DataLoaderConstructor}, which infer the batch type from the dataset and the
 * options.
 */
export const DataLoader = DataLoaderImpl as DataLoaderConstructor;

/**
 * A DataLoader whose batches are of type `B` (the instances of {@linkcode DataLoader}; see
 * {@linkcode DataLoaderImpl} for their members).
 *
 * @typeParam B the batch type: `RingBatch` on the zero-copy path, the collated value else
 */
export type DataLoader<B = unknown> = DataLoaderImpl<B>;
