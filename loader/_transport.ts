// What the engine and its transports share: the epoch plan, the results that fill the reorder
// buffer, the engine's configuration, the errors a batch can end with, and the Transport
// interface through which the engine reaches its workers (_transport_pull.ts: zero-copy,
// workers pull tasks from a shared control block; _transport_push.ts: generic, one message
// per batch each way). Without workers there is no transport: _transport_inline.ts loads each
// batch on demand, as PyTorch's single-process iterator does.

import type { GatherSpec } from "./_gather.ts";
import type { ModuleRef } from "./_protocol.ts";
import type { Dataset, WorkerSpec } from "./dataset.ts";
import type { EpochOrder } from "./order.ts";
import type { StagingRing } from "./ring.ts";

export interface EpochPlan {
  epoch: number;
  batches: Int32Array[];
  /** Each batch's first draw position (EpochOrder.drawPosition); drawStride apart after. */
  positions: number[];
  startSeq: number;
  dispatched: number;
  yielded: number;
  abandoned: boolean;
}

export type Result =
  | { kind: "slot"; seq: number; slot: number; epoch: number; batch: number; size: number }
  | { kind: "value"; seq: number; value: unknown; epoch: number; batch: number; size: number }
  | { kind: "error"; seq: number; error: Error; epoch: number; batch: number; size: number };

export interface EngineConfig {
  dataset: Dataset;
  /** The epoch the engine is started for (seeds the workers unless they persist). */
  firstEpoch: number;
  numWorkers: number;
  prefetchFactor: number;
  inOrder: boolean;
  timeout: number;
  /** Seconds without progress, every worker idle, before a stall is reported (0: never). */
  watchdog: number;
  seed: number;
  /** The batches of each epoch (planned ahead across an epoch boundary when `order.pure`). */
  order: EpochOrder;
  /** Zero-copy: the record of each sample (a Subset), or undefined when sample i is record i. */
  recordMap: Int32Array | undefined;
  persistent: boolean;
  // Zero-copy path:
  ring?: StagingRing;
  gather?: GatherSpec;
  slotState?: Uint8Array;
  // Generic path:
  collateMode: "default" | "none" | "main" | ModuleRef;
  /** V8 heap limits of each worker (node:worker_threads resourceLimits). */
  resourceLimits: WorkerResourceLimits;
  /** batchSize null: each task is one sample, collated (converted) on its own. */
  unbatched: boolean;
  workerSpec?: WorkerSpec;
  workerInit?: ModuleRef;
  onWait: (seconds: number, depth: number) => void;
}

/** Heap limits of a worker, as node:worker_threads' `resourceLimits`. */
export interface WorkerResourceLimits {
  /** Old-generation heap, MB: past it the worker is stopped with an out-of-memory error. */
  maxOldGenerationSizeMb: number;
  /** Young-generation heap, MB (default: V8's). */
  maxYoungGenerationSizeMb?: number;
  /** Stack, MB (default: V8's, 4). */
  stackSizeMb?: number;
}

export const SLOT_FREE = 0;
export const SLOT_LOADER = 1;
export const SLOT_CONSUMER = 2;

/**
 * A failure loading a sample, rethrown in the consumer when its batch is due, with the
 * sample's dataset index and the original stack (from the worker, or the main thread).
 *
 * @example Catching a sample's failure
 * ```ts
 * import { DataLoader, WorkerError } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ds = {
 *   length: 4,
 *   get: (i: number) => {
 *     if (i === 2) throw new Error("bad sample");
 *     return i;
 *   },
 * };
 * await using loader = new DataLoader(ds, { batchSize: 2 });
 * let batches = 0;
 * await assert.rejects(async () => {
 *   for await (const _ of loader) batches++;
 * }, (e) => e instanceof WorkerError && e.index === 2);
 * assert.strictEqual(batches, 1);
 * ```
 */
export class WorkerError extends Error {
  /** Dataset index of the failing sample, or -1 when not tied to a sample. */
  readonly index: number;
  /** The worker, or -1 for the main thread. */
  readonly workerId: number;
  /** The original stack from the worker. */
  readonly workerStack: string;
  /** Creates it; see the class documentation. */
  constructor(message: string, index: number, workerId: number, workerStack: string) {
    super(message);
    this.name = "WorkerError";
    this.index = index;
    this.workerId = workerId;
    this.workerStack = workerStack;
    this.stack =
      `${this.name}: ${message}\n--- original stack in worker ${workerId} ---\n${workerStack}`;
  }
}

/** A `timeout` expiry: PyTorch's "DataLoader timed out after N seconds". */
export class TimeoutError extends Error {
  /** Creates it; see the class documentation. */
  constructor(message: string) {
    super(message);
    this.name = "TimeoutError";
  }
}

export function timeoutError(
  b: number,
  epoch: number,
  seconds: number,
  what: string,
): TimeoutError {
  return new TimeoutError(
    `Cannot get batch ${b} of epoch ${epoch}: DataLoader timed out after ${seconds} s ` +
      `(timeout option; ${what})`,
  );
}

/**
 * The error for a sample that failed to load, worded the same on every path: the value
 * thrown is kept as it was (an Error's name and message, or the thrown string, null, ...).
 */
export function sampleError(
  index: number,
  b: number,
  epoch: number,
  workerId: number,
  f: { name: string; message: string; stack: string },
): WorkerError {
  const sample = index >= 0 ? `sample ${index}` : "a sample";
  const where = workerId >= 0 ? `DataLoader worker ${workerId}` : "the main thread";
  return new WorkerError(
    `Cannot load ${sample} (batch ${b} of epoch ${epoch}): caught ${f.name} in ${where}: ` +
      f.message,
    index,
    workerId,
    f.stack,
  );
}

/** The result of batch `p` whose sample `failure.index` failed in worker `workerId`. */
export function errorResult(
  p: Pending,
  workerId: number,
  failure: { index: number; name: string; message: string; stack: string },
): Result {
  const { seq, batch, plan: { epoch } } = p;
  const error = sampleError(failure.index, batch, epoch, workerId, failure);
  return { kind: "error", seq, error, epoch, batch, size: 0 };
}

/** A batch handed to a worker and not yet back. */
export interface Pending {
  seq: number;
  plan: EpochPlan;
  batch: number;
  worker: number;
  /** performance.now() when it went out (the profiler's loader.batch span). */
  dispatchedAt: number;
}

/**
 * What a transport needs of the engine: the reorder buffer it fills, the plans it takes
 * batches from, and the engine's failure and wake-up.
 */
export interface TransportHost {
  readonly cfg: EngineConfig;
  /** The reorder buffer: finished batches by seq, until the consumer takes them. */
  readonly results: Map<number, Result>;
  /** Batches handed out and not yet yielded (or dropped). */
  outstanding(): number;
  /** The plan to dispatch the next batch from, planning an epoch ahead when allowed. */
  nextPlan(): EpochPlan | undefined;
  /** Counts the next batch of `plan` as in flight; returns its batch number. */
  claim(plan: EpochPlan): number;
  /**
   * Batch `p` came back: its result goes into the reorder buffer and wakes the consumer, or,
   * when its epoch was abandoned, it is dropped and another batch goes out.
   */
  settle(p: Pending, result: Result): void;
  /** A batch in flight will never be yielded (its epoch was abandoned). */
  forget(): void;
  /** Dispatches more batches (a slot or an in-flight place came free). */
  pump(): void;
  /** Fails the loader: the consumer gets `error` (the first one) at its next batch. */
  fail(error: Error): void;
  /** Wakes a consumer waiting in Engine.next. */
  wake(): void;
  /** Adds milliseconds workers spent loading, for stats. */
  addBusy(ms: number): void;
}

/**
 * How the engine reaches its workers. The engine keeps planning, the reorder buffer,
 * deadlines and the watchdog; a transport hands batches out, brings finished ones into the
 * reorder buffer and knows what its workers are doing.
 */
export interface Transport {
  /** The zero-copy control block, for fault-injection tests; undefined when pushing. */
  readonly control?: Int32Array;
  /** Hands batches to the workers until `limit` are outstanding or nothing can go out. */
  dispatch(limit: number): void;
  /** Moves finished batches into the reorder buffer (those not delivered on their own). */
  collect(): void;
  /**
   * Waits until a batch may have finished, or `woken` resolves (the engine's wake-up: a
   * message, a failure, the watchdog's tick). `due` says whether the consumer's batch is
   * in the reorder buffer now.
   */
  wait(woken: Promise<void>, due: () => boolean): Promise<void>;
  /** The engine abandoned `plan`: forget its batches in flight. */
  abandon(plan: EpochPlan): void;
  /** Whether no worker is loading anything (every live one waits for work). */
  idle(): boolean;
  /** What changes whenever the transport makes progress, for the watchdog. */
  progress(): string;
  /** Stops every worker; slots they held go back to the ring. Idempotent. */
  stop(): void;
  /** Batches in flight and what the workers do, for stall reports. */
  debugState(): { pending: number[]; control?: Record<string, number>; workers: unknown[] };
}
