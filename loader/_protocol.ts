// Messages between the loader (main thread) and its workers. All small: on the zero-copy
// path the batch itself never travels, only slot numbers.

import type { GatherSpec } from "./_gather.ts";
import type { WorkerSpec } from "./dataset.ts";

/** A function in a module, resolved in the worker. */
export interface ModuleRef {
  module: string;
  export: string;
}

// Zero-copy control block (Int32Array over a SharedArrayBuffer), so that a batch costs no
// message at all: the main thread appends tasks to each worker's ring and notifies it; the
// worker, blocked in Atomics.wait, gathers, appends a completion and rings the doorbell the
// main thread waits on with Atomics.waitAsync. postMessage remains for errors and start-up.
export const CTL_DOORBELL = 0;
export const CTL_STOP = 1;
export const CTL_HEADER = 8;
/** Per-worker block: [tail, head, done, spare, tasks cap x 5, completions cap x 2]. */
export const ctlStride = (cap: number): number => 4 + cap * 7;
export const ctlBase = (w: number, cap: number): number => CTL_HEADER + w * ctlStride(cap);
export const ctlInts = (workers: number, cap: number): number =>
  CTL_HEADER + workers * ctlStride(cap);

export interface InitMessage {
  t: "init";
  id: number;
  numWorkers: number;
  seed: number;
  workerSeed: number;
  gather?: GatherSpec;
  /** Control block of the zero-copy path, and its per-worker ring capacity. */
  control?: SharedArrayBuffer;
  cap?: number;
  dataset?: WorkerSpec;
  /** "default": defaultCollate; "none": send samples as they are; or a module function. */
  collate: "default" | "none" | ModuleRef;
  workerInit?: ModuleRef;
}

/** Zero-copy task: gather `n` samples into `slot` (indices are already in the slot). */
export interface GatherTask {
  t: "g";
  seq: number;
  slot: number;
  n: number;
  epoch: number;
  pos: number;
}

/** Generic task: get + collate. */
export interface CollateTask {
  t: "c";
  seq: number;
  idx: Int32Array;
  epoch: number;
  pos: number;
}

export type ToWorker = InitMessage | GatherTask | CollateTask;

export type FromWorker =
  | { t: "ready" }
  | { t: "d"; seq: number; busy: number }
  | { t: "b"; seq: number; value: unknown; busy: number }
  | { t: "e"; seq: number; index: number; name: string; message: string; stack: string }
  | { t: "fatal"; name: string; message: string; stack: string }
  | { t: "x"; reason: string };
