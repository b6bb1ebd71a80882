// Messages between the loader (main thread) and its workers. All small: on the zero-copy
// path the batch itself never travels, only slot numbers.

import type { GatherSpec } from "./_gather.ts";
import type { WorkerSpec } from "./dataset.ts";

/** A function in a module, resolved in the worker. */
export interface ModuleRef {
  /** Absolute URL of the module (e.g. `import.meta.url`). */
  module: string;
  /** Dotted path of the function in that module (e.g. "MyDataset.fromState"). */
  export: string;
}

/**
 * Imports `ref.module` and returns the function at the dotted path `ref.export`, bound to its
 * parent (so `"MyDataset.fromState"` keeps its `this`).
 *
 * @throws {TypeError} When the path does not name a function.
 */
export async function resolveRef(ref: ModuleRef): Promise<(arg: unknown) => unknown> {
  const mod = await import(ref.module);
  let parent: unknown = undefined;
  let value: unknown = mod;
  for (const part of ref.export.split(".")) {
    parent = value;
    value = (value as Record<string, unknown>)?.[part];
  }
  if (typeof value !== "function") {
    throw new TypeError(
      `Cannot resolve ${ref.export} in ${ref.module}: expected a function, found ${typeof value}`,
    );
  }
  return (value as (arg: unknown) => unknown).bind(parent);
}

/**
 * What a thrown value says, the same on the main thread and in workers: an Error's name,
 * message and stack; anything else (a string, null, a plain object) as "Error" with the value
 * itself as the message, never "undefined".
 */
export function errorFields(e: unknown): { name: string; message: string; stack: string } {
  if (e instanceof Error) return { name: e.name, message: e.message, stack: e.stack ?? "" };
  let message = String(e);
  if (e !== null && typeof e === "object") {
    try {
      message = JSON.stringify(e) ?? message;
    } catch {
      // Cyclic or with a BigInt: String() it is.
    }
  }
  return { name: "Error", message, stack: "" };
}

// Zero-copy control block (an Int32Array over a SharedArrayBuffer). Workers pull work: each
// claims a free ring slot, then the next published task, gathers into the slot and marks it
// ready; the main thread only publishes tasks, returns released slots to the free queue and
// collects ready slots. Tickets (Atomics.add on a counter) give every worker distinct
// entries; a worker always holds its slot before it claims a task, so the task the consumer
// waits for always has a slot and in-order delivery cannot deadlock on a full ring.
// Workers block in Atomics.wait, the main thread in Atomics.waitAsync on the doorbell.
// postMessage remains for start-up and errors only. The counters are int32 and only grow
// within one engine (one epoch without persistentWorkers): 2^31 batches, weeks at any
// realistic training rate.
//
// Both queues (free slots, tasks) are bounded MPMC rings whose cells carry a stamp, as in
// Vyukov's bounded queue: cell `p % cap` may be written for position p only once its stamp
// equals p, and the worker that read position p - cap sets the stamp to p once it has copied
// the cell out. Without the stamp the main thread overwrote cells whose ticket holder had
// been woken but not yet scheduled (common with more threads than cores): that worker then
// read a slot another worker also held, two batches were gathered into one slot, one of them
// was lost and the in-order consumer waited for it forever with every worker idle.
export const C_DOORBELL = 0;
export const C_STOP = 1;
/** Task tickets taken by workers. */
export const C_CLAIM = 2;
/** Tasks published by the main thread. */
export const C_PUBLISHED = 3;
/** Free-slot tickets taken by workers. */
export const C_FREE_HEAD = 4;
/** Free slots pushed by the main thread. */
export const C_FREE_TAIL = 5;
/** Tasks with a smaller seq belong to an abandoned epoch: skip them. */
export const C_SKIP_BELOW = 6;
export const C_HEADER = 16;

/** What a zero-copy worker is doing (its `state` word), for the loader's stall watchdog. */
export const W_STARTING = 0;
export const W_WAIT_SLOT = 1;
export const W_WAIT_TASK = 2;
export const W_GATHER = 3;
export const W_STOPPED = 4;
/** Names of the worker states, indexed by state. */
export const WORKER_STATES = [
  "starting",
  "waiting for a slot",
  "waiting for a task",
  "gathering",
  "stopped",
];

/**
 * Offsets of the control block's arrays for `slots` ring slots, `tasks` task entries of
 * `batch` indices and `workers` workers. A free-queue cell is `[stamp, slot]`; a task entry is
 * `[stamp, seq, epoch, position, n, indices[batch]]`; a worker has `[state, tasks done]`.
 */
export function controlLayout(slots: number, tasks: number, batch: number, workers: number) {
  const ready = C_HEADER; // per slot: seq + 1 once filled, 0 otherwise
  const busy = ready + slots; // per slot: microseconds spent gathering it
  const worker = busy + slots; // per worker: state, tasks done
  const freeQ = worker + 2 * workers; // free-slot queue cells
  const freeCap = 2 * slots;
  const taskQ = freeQ + 2 * freeCap; // task entries
  const entry = 5 + batch;
  return { ready, busy, worker, freeQ, freeCap, taskQ, entry, tasks, ints: taskQ + tasks * entry };
}

/** Sets every queue cell's stamp to its index (the first position it may hold). */
export function initControl(ctl: Int32Array, L: ReturnType<typeof controlLayout>): void {
  for (let i = 0; i < L.freeCap; i++) ctl[L.freeQ + 2 * i] = i;
  for (let i = 0; i < L.tasks; i++) ctl[L.taskQ + i * L.entry] = i;
}

export interface InitMessage {
  t: "init";
  id: number;
  numWorkers: number;
  seed: number;
  /** The step between a batch's samples' draw positions (EpochOrder.drawStride). */
  drawStride: number;
  workerSeed: number;
  gather?: GatherSpec;
  /** Control block of the zero-copy path: slots, task entries, entry batch size. */
  control?: SharedArrayBuffer;
  slots?: number;
  tasks?: number;
  batch?: number;
  dataset?: WorkerSpec;
  /** "default": defaultCollate; "none": send samples as they are; or a module function. */
  collate: "default" | "none" | ModuleRef;
  /** Batching is off (batchSize null): a module collate gets each sample, not a list of one. */
  unbatched: boolean;
  workerInit?: ModuleRef;
  /** The worker's old-generation heap limit, MB (its heap guard's reference). */
  heapLimitMb: number;
}

/** Generic task: get + collate. */
export interface CollateTask {
  t: "c";
  seq: number;
  idx: Int32Array;
  epoch: number;
  pos: number;
}

/**
 * A liveness probe: a worker whose event loop is free answers "pong" at once (see the probe in
 * _transport_workers.ts).
 */
export interface Ping {
  t: "ping";
}

export type ToWorker = InitMessage | CollateTask | Ping;

export type FromWorker =
  | { t: "hello" }
  | { t: "ready" }
  | { t: "pong" }
  /** The worker's synchronous `call` (get(index), when index >= 0) of batch seq was ended. */
  | { t: "killed"; seq: number; index: number; call: string }
  | { t: "b"; seq: number; value: unknown; busy: number }
  | {
    t: "e";
    seq: number;
    index: number;
    name: string;
    message: string;
    stack: string;
    slot?: number;
  }
  | { t: "fatal"; name: string; message: string; stack: string }
  | { t: "oom"; usedMb: number; limitMb: number }
  | { t: "x"; reason: string };
