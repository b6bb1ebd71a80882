// Messages between the loader (main thread) and its workers. All small: on the zero-copy
// path the batch itself never travels, only slot numbers.

import type { GatherSpec } from "./_gather.ts";
import type { WorkerSpec } from "./dataset.ts";

/** A function in a module, resolved in the worker. */
export interface ModuleRef {
  module: string;
  export: string;
}

export interface InitMessage {
  t: "init";
  id: number;
  numWorkers: number;
  seed: number;
  workerSeed: number;
  gather?: GatherSpec;
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
  | { t: "d"; seq: number }
  | { t: "b"; seq: number; value: unknown }
  | { t: "e"; seq: number; index: number; name: string; message: string; stack: string }
  | { t: "fatal"; name: string; message: string; stack: string }
  | { t: "x"; reason: string };
