/**
 * `getWorkerInfo()`: inside a DataLoader worker, which worker this is (PyTorch's
 * `get_worker_info`).
 *
 * @module
 */

/** Facts about the current DataLoader worker. */
export interface WorkerInfo {
  /** Worker id in [0, numWorkers). */
  readonly id: number;
  /** Number of workers of the loader. */
  readonly numWorkers: number;
  /**
   * This worker's seed, distinct per worker: a hash of (loader seed, id), and of the epoch
   * the worker was started for unless workers persist (as PyTorch's `base_seed + id`).
   */
  readonly seed: number;
  /** The dataset as rebuilt in this worker (undefined on the zero-copy path). */
  readonly dataset: unknown;
}

let current: WorkerInfo | null = null;

/**
 * The current DataLoader worker's facts (PyTorch's `get_worker_info`).
 *
 * @returns the current worker's info inside a DataLoader worker, null elsewhere
 * @example On the main thread
 * ```ts
 * import { getWorkerInfo } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(getWorkerInfo(), null);
 * ```
 */
export function getWorkerInfo(): WorkerInfo | null {
  return current;
}

/** @internal Set by the worker entry point. */
export function _setWorkerInfo(info: WorkerInfo): void {
  current = info;
}
