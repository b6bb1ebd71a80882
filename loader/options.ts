/**
 * The options of a {@linkcode DataLoader}: their types, PyTorch's names in TypeScript casing
 * plus a few, and their checks, which turn an options object into the plain values the loader
 * runs with (or an error naming the option).
 *
 * @module
 */

import v8 from "node:v8";
import { optionError, refuseUnknownKeys } from "../internal/options.ts";
import type { WorkerResourceLimits } from "./_transport.ts";
import type { ModuleRef } from "./_protocol.ts";
import type { CollateFn } from "./collate.ts";
import type { Dataset, WorkerSpec } from "./dataset.ts";
import { EpochOrder, type EpochOrderOptions } from "./order.ts";
import type { StagingRing } from "./ring.ts";
import { type GeometryOptions, type GeometrySpec, resolveGeometry } from "../augment/geometry.ts";

/**
 * Options of {@linkcode DataLoader}; PyTorch's names in TypeScript casing, plus a few. The
 * order's options (batchSize, shuffle, sampler, batchSampler, dropLast, seed, augment) are
 * {@linkcode EpochOrderOptions}; `augment` needs the zero-copy path.
 *
 * @typeParam B the batch type a `collate` function returns
 * @typeParam T the sample type a `collate` function receives a list of
 */
export interface DataLoaderOptions<B = unknown, T = unknown> extends EpochOrderOptions {
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
  /** Release each ring batch when the next one is requested (default true). */
  autoRelease?: boolean;
  /** Ring slots beyond the in-flight ones for batches the consumer holds (default 2). */
  heldBatches?: number;
  /**
   * Geometric transforms drawn per sample (zero-copy path): Resize, CenterCrop,
   * RandomResizedCrop, RandomRotation to a fixed size ({@linkcode GeometryOptions}). Each
   * batch gets a `geometry` field of one record per sample ({@linkcode writeGeometryRecord})
   * for the image in the dataset's u8 `image` field ([H, W, C]), at the size in its `imageSize`
   * field (int32 [2]) when the dataset has one (variable-size images, e.g. `ImageFolder` with
   * `maxSize`); `toDevice` applies them on the device before the augment kernel.
   */
  geometry?: GeometryOptions;
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

/** A DataLoader's options checked, with defaults filled in. */
export interface ResolvedOptions {
  order: EpochOrder;
  numWorkers: number | "auto";
  prefetchFactor: number | "auto";
  persistentWorkers: boolean;
  inOrder: boolean;
  autoRelease: boolean;
  timeout: number;
  watchdog: number;
  heldBatches: number;
  resourceLimits: WorkerResourceLimits;
  zeroCopy: boolean;
  pinMemory: boolean | ((ring: StagingRing) => Disposable | void);
  /** A collate function run on the main thread, if any. */
  collate: CollateFn<unknown, unknown> | undefined;
  /**
   * Where samples are collated: by defaultCollate in the workers, not at all, on the main
   * thread, or by a module's function in the workers.
   */
  collateMode: "default" | "none" | "main" | ModuleRef;
  workerInit: ModuleRef | undefined;
  /** The geometric transforms drawn per sample, or undefined. */
  geometry: GeometrySpec | undefined;
  /**
   * The dataset's workerSpec(), asked once here (where workers rebuild the dataset) and sent
   * to every worker the loader starts.
   */
  workerSpec: WorkerSpec | undefined;
}

// Every key of DataLoaderOptions, checked by the compiler against the interface.
const OPTION_NAMES = Object.keys(
  {
    batchSize: true,
    shuffle: true,
    sampler: true,
    batchSampler: true,
    numWorkers: true,
    collate: true,
    pinMemory: true,
    dropLast: true,
    timeout: true,
    watchdog: true,
    workerInit: true,
    seed: true,
    prefetchFactor: true,
    persistentWorkers: true,
    inOrder: true,
    zeroCopy: true,
    augment: true,
    autoRelease: true,
    heldBatches: true,
    workerResourceLimits: true,
    geometry: true,
  } satisfies Record<keyof DataLoaderOptions, true>,
);
const LIMIT_KEYS = ["maxOldGenerationSizeMb", "maxYoungGenerationSizeMb", "stackSizeMb"];

const ACTION = "create DataLoader";

/**
 * Checks a DataLoader's options in PyTorch's order and fills in the defaults.
 *
 * @param dataset The dataset (validated by the caller).
 * @param options What the caller passed.
 * @returns The values the loader runs with.
 * @throws {TypeError} / {RangeError} naming the option, for every invalid value or
 * combination PyTorch refuses, and for a dataset workers cannot rebuild.
 */
export function resolveOptions(dataset: Dataset, options: DataLoaderOptions): ResolvedOptions {
  refuseUnknownKeys(options, OPTION_NAMES, ACTION);
  const o = options;
  const numWorkers = o.numWorkers ?? 0;
  if (numWorkers !== "auto" && (!Number.isInteger(numWorkers) || numWorkers < 0)) {
    fail(
      "numWorkers",
      `should be a non-negative integer or "auto", got ${JSON.stringify(numWorkers)}`,
    );
  }
  const timeout = seconds("timeout", o.timeout, 0);
  const watchdog = seconds("watchdog", o.watchdog, 10);
  const prefetchFactor = o.prefetchFactor ?? 2;
  if (o.prefetchFactor !== undefined) {
    if (numWorkers === 0) {
      fail(
        "prefetchFactor",
        "could only be specified with workers; let numWorkers > 0 to enable prefetching",
      );
    }
    if (prefetchFactor !== "auto" && (!Number.isInteger(prefetchFactor) || prefetchFactor < 1)) {
      fail(
        "prefetchFactor",
        `should be a positive integer or "auto", got ${JSON.stringify(prefetchFactor)}`,
      );
    }
  }
  const persistentWorkers = bool("persistentWorkers", o.persistentWorkers, false);
  if (persistentWorkers && numWorkers === 0) fail("persistentWorkers", "requires numWorkers > 0");
  const inOrder = bool("inOrder", o.inOrder, true);
  const autoRelease = bool("autoRelease", o.autoRelease, true);
  const heldBatches = o.heldBatches ?? 2;
  if (!Number.isInteger(heldBatches) || heldBatches < 0) {
    fail("heldBatches", `should be a non-negative integer, got ${String(heldBatches)}`);
  }
  const resourceLimits = workerLimits(o.workerResourceLimits);
  const { batchSize, shuffle, sampler, batchSampler, dropLast, seed, augment } = o;
  const order = new EpochOrder(
    dataset.length,
    { batchSize, shuffle, sampler, batchSampler, dropLast, seed, augment },
    ACTION,
  );
  const zeroCopy = zeroCopyPath(dataset, o, order);
  if (o.augment !== undefined && !zeroCopy) {
    fail(
      "augment",
      "needs the zero-copy path (a dataset with sharedFields(), no collate, batches)",
      "type",
    );
  }
  if (o.geometry !== undefined && !zeroCopy) {
    fail(
      "geometry",
      "needs the zero-copy path (a dataset with sharedFields(), no collate, batches)",
      "type",
    );
  }
  const geometry = o.geometry === undefined ? undefined : resolveGeometry(o.geometry, ACTION);
  if (o.workerInit !== undefined && !isModuleRef(o.workerInit)) {
    fail(
      "workerInit",
      "should be a {module, export} reference: workers are separate isolates and cannot " +
        "receive functions",
      "type",
    );
  }
  // Fields a dataset fills itself (decoded images) are filled in the workers, by the dataset
  // rebuilt there: the zero-copy path then needs the dataset's workerSpec too.
  const rebuilt = !zeroCopy || typeof dataset.filledFields === "function";
  if (rebuilt && numWorkers !== 0 && typeof dataset.workerSpec !== "function") {
    fail(
      "numWorkers",
      `${numWorkers === "auto" ? '"auto"' : numWorkers} needs a dataset that workers can ` +
        "rebuild: implement workerSpec() " +
        `returning { module: import.meta.url, export: "MyDataset.fromState", state } ` +
        "(state structured-clonable; SharedArrayBuffers are shared) or sharedFields() for " +
        "the zero-copy path, or use numWorkers: 0",
      "type",
    );
  }
  let workerSpec: WorkerSpec | undefined;
  if (rebuilt && numWorkers !== 0) {
    // Workers receive the spec by postMessage: a value it cannot clone would throw there, in
    // an event handler, where nothing can catch it.
    const spec = workerSpec = dataset.workerSpec!();
    const bad = uncloneable(spec, "workerSpec()");
    if (bad !== undefined) {
      fail(
        "numWorkers",
        `${
          numWorkers === "auto" ? '"auto"' : numWorkers
        } sends the dataset's ${bad.path} to the workers, but it is ${bad.what}, which cannot ` +
          "be structured-cloned: keep only data in the state (typed arrays, SharedArrayBuffers, " +
          "plain objects) and rebuild the rest in the export it names",
        "type",
      );
    }
  }
  const pinMemory = o.pinMemory ?? false;
  if (typeof pinMemory !== "boolean" && typeof pinMemory !== "function") {
    fail("pinMemory", "should be a boolean or a function (ring) => Disposable", "type");
  }
  const collate = typeof o.collate === "function" ? o.collate : undefined;
  return {
    order,
    numWorkers,
    prefetchFactor,
    persistentWorkers,
    inOrder,
    autoRelease,
    timeout,
    watchdog,
    heldBatches,
    resourceLimits,
    zeroCopy,
    pinMemory,
    collate,
    collateMode: collate !== undefined
      ? "main"
      : o.collate !== undefined
      ? o.collate as ModuleRef
      : order.batchSize === null && o.batchSampler === undefined
      ? "none"
      : "default",
    workerInit: o.workerInit,
    geometry,
    workerSpec,
  };
}

/** Whether batches take the zero-copy path, refusing a `zeroCopy: true` that cannot. */
function zeroCopyPath(dataset: Dataset, o: DataLoaderOptions, order: EpochOrder): boolean {
  const shared = typeof dataset.sharedFields === "function";
  if (o.collate !== undefined && typeof o.collate !== "function" && !isModuleRef(o.collate)) {
    fail("collate", "should be a function or a {module, export} reference", "type");
  }
  if (o.zeroCopy === true) {
    if (!shared) fail("zeroCopy", "needs a dataset with sharedFields()", "type");
    if (o.collate !== undefined) fail("zeroCopy", "is mutually exclusive with collate", "type");
    if (order.batchSize === null) {
      fail(
        "zeroCopy",
        "needs batches (a batchSize, or a batchSampler of equal-size batches)",
        "type",
      );
    }
  }
  return bool("zeroCopy", o.zeroCopy, shared && o.collate === undefined) &&
    shared && o.collate === undefined && order.batchSize !== null;
}

/** The workers' heap limits, the old generation's defaulting to the main thread's. */
function workerLimits(value: DataLoaderOptions["workerResourceLimits"]): WorkerResourceLimits {
  const limits = value ?? {};
  if (typeof limits !== "object" || limits === null) {
    fail("workerResourceLimits", "should be an object", "type");
  }
  refuseUnknownKeys(limits, LIMIT_KEYS, `${ACTION} with workerResourceLimits`);
  for (const key of LIMIT_KEYS) {
    const v = (limits as Record<string, unknown>)[key];
    if (v !== undefined && (typeof v !== "number" || !Number.isInteger(v) || v < 1)) {
      fail(`workerResourceLimits.${key}`, `should be a positive integer (MB), got ${String(v)}`);
    }
  }
  return { ...limits, maxOldGenerationSizeMb: limits.maxOldGenerationSizeMb ?? mainHeapLimitMb() };
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
  optionError(ACTION, option, message, type);
}

function bool(name: string, v: unknown, dflt: boolean): boolean {
  if (v === undefined) return dflt;
  if (typeof v !== "boolean") fail(name, `should be a boolean value, got ${String(v)}`, "type");
  return v;
}

function seconds(name: string, v: unknown, dflt: number): number {
  const s = v ?? dflt;
  if (typeof s !== "number" || !(s >= 0) || !Number.isFinite(s)) {
    fail(name, `should be a non-negative number of seconds, got ${String(s)}`);
  }
  return s;
}

/** Whether `v` is a `{module, export}` reference. */
function isModuleRef(v: unknown): v is ModuleRef {
  return v !== null && typeof v === "object" &&
    typeof (v as ModuleRef).module === "string" && typeof (v as ModuleRef).export === "string";
}

/**
 * The first value under `value` that structured clone refuses (functions, symbols, weak
 * collections, promises, generators), with its path, or undefined when all of it clones.
 * Typed arrays and (Shared)ArrayBuffers are not walked into.
 */
function uncloneable(
  value: unknown,
  path: string,
  seen = new Set<object>(),
): { path: string; what: string } | undefined {
  if (typeof value === "function") return { path, what: "a function" };
  if (typeof value === "symbol") return { path, what: "a symbol" };
  if (value === null || typeof value !== "object" || seen.has(value)) return undefined;
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) return undefined;
  if (value instanceof SharedArrayBuffer) return undefined;
  for (
    const [kind, what] of [
      [WeakMap, "a WeakMap"],
      [WeakSet, "a WeakSet"],
      [WeakRef, "a WeakRef"],
      [Promise, "a Promise"],
    ] as const
  ) {
    if (value instanceof kind) return { path, what };
  }
  seen.add(value);
  if (value instanceof Map) {
    for (const [k, v] of value) {
      const bad = uncloneable(k, `${path} key`, seen) ??
        uncloneable(v, `${path}.get(${JSON.stringify(String(k))})`, seen);
      if (bad) return bad;
    }
    return undefined;
  }
  if (value instanceof Set) {
    for (const v of value) {
      const bad = uncloneable(v, `${path} element`, seen);
      if (bad) return bad;
    }
    return undefined;
  }
  for (const [k, v] of Object.entries(value)) {
    const bad = uncloneable(v, Array.isArray(value) ? `${path}[${k}]` : `${path}.${k}`, seen);
    if (bad) return bad;
  }
  return undefined;
}
