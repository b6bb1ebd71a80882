// Entry point of a DataLoader worker (a node:worker_threads worker: see _transport_workers.ts
// for why not a Web Worker). It rebuilds the dataset once from its WorkerSpec (or only maps
// the shared fields on the zero-copy path), then serves tasks in the order they arrive.
// Errors travel back as values naming the sample index; an explicit self.close() or
// Deno.exit() is reported before the worker goes, so the loader never waits on a worker that
// is gone.

import v8 from "node:v8";
import { parentPort } from "node:worker_threads";
import { Gatherer, SampleError } from "./_gather.ts";
import { fetchSamples, SampleFailure, syncCall } from "./_fetch.ts";
import { defaultCollate } from "./collate.ts";
import type { Dataset } from "./dataset.ts";
import {
  C_CLAIM,
  C_DOORBELL,
  C_FREE_HEAD,
  C_FREE_TAIL,
  C_PUBLISHED,
  C_SKIP_BELOW,
  C_STOP,
  type CollateTask,
  controlLayout,
  errorFields,
  type FromWorker,
  type InitMessage,
  resolveRef,
  type ToWorker,
  W_GATHER,
  W_STOPPED,
  W_WAIT_SLOT,
  W_WAIT_TASK,
} from "./_protocol.ts";
import { _setWorkerInfo } from "./worker_info.ts";

const port = parentPort!;
const post = (m: FromWorker, transfer?: Transferable[]) =>
  port.postMessage(m, (transfer ?? []) as never[]);

// Dataset code written for Web Workers may use `self` (self.close(), self.name): a
// node:worker_threads worker has no `self`, so give it the global, as a Web Worker has.
const g = globalThis as unknown as { self?: unknown; close?: () => void };
g.self ??= globalThis;
const originalClose = g.close?.bind(globalThis);
g.close = () => {
  post({ t: "x", reason: "the worker called self.close()" });
  if (originalClose) originalClose();
  else Deno.exit(0);
};
const originalExit = Deno.exit;
Deno.exit = ((code?: number) => {
  post({ t: "x", reason: `the worker called Deno.exit(${code ?? 0})` });
  return originalExit(code);
}) as typeof Deno.exit;

// Heap guard (generic path). A worker that exceeds its heap limit inside a task is stopped
// by V8, but Deno 2.9 then reports nothing (no 'error', no 'exit'): the loader would wait
// for its batch until `timeout`. Heap that grows across batches (a cache, a leak) is caught
// here first: over 85% of the old-generation limit after two batches in a row (one could be
// garbage not yet collected), the worker reports it and the loader fails with an
// out-of-memory error. 0.4 us per batch.
let heapHigh = 0;
function heapExhausted(): boolean {
  const used = v8.getHeapStatistics().used_heap_size;
  heapHigh = used > 0.85 * init.heapLimitMb * 2 ** 20 ? heapHigh + 1 : 0;
  if (heapHigh < 2) return false;
  post({ t: "oom", usedMb: Math.round(used / 2 ** 20), limitMb: init.heapLimitMb });
  return true;
}

let init: InitMessage;
let gatherer: Gatherer | undefined;
let dataset: Dataset | undefined;
let collate: ((samples: unknown[]) => unknown) | undefined;
const queue: ToWorker[] = [];
let running = false;
let ready = false;
/** Set once the heap guard reported: take no more tasks (the loader stops this worker). */
let stopped = false;

async function setup(msg: InitMessage): Promise<void> {
  init = msg;
  if (msg.dataset) {
    const make = await resolveRef(msg.dataset);
    dataset = (await make(msg.dataset.state)) as Dataset;
    if (dataset === null || typeof dataset !== "object" || typeof dataset.get !== "function") {
      throw new TypeError(
        `Cannot rebuild the dataset in a worker: ${msg.dataset.export} returned no dataset`,
      );
    }
  }
  if (typeof msg.collate === "object") {
    collate = (await resolveRef(msg.collate)) as (s: unknown[]) => unknown;
  } else if (msg.collate === "default") {
    collate = defaultCollate;
  }
  _setWorkerInfo({
    id: msg.id,
    numWorkers: msg.numWorkers,
    seed: msg.workerSeed,
    dataset,
  });
  if (msg.workerInit) {
    const fn = await resolveRef(msg.workerInit);
    await fn(msg.id);
  }
  if (msg.gather) {
    // After the worker info is set: the dataset may ask which worker it is in.
    if (msg.gather.filled?.length) await dataset?.prepareFill?.();
    gatherer = new Gatherer(msg.gather, dataset, msg.id, msg.drawStride);
  }
}

function transferables(value: unknown, out: Transferable[]): void {
  if (ArrayBuffer.isView(value)) {
    const buf = value.buffer;
    // Only whole, unshared buffers: they were allocated by defaultCollate for this batch.
    if (buf instanceof ArrayBuffer && buf.byteLength === value.byteLength && !out.includes(buf)) {
      out.push(buf);
    }
  } else if (Array.isArray(value)) {
    for (const v of value) transferables(v, out);
  } else if (value !== null && typeof value === "object") {
    for (const v of Object.values(value)) transferables(v, out);
  }
}

// The zero-copy loop (see _protocol.ts): claim a free slot, claim the next task, gather,
// mark the slot ready. It never returns to the event loop while serving; timed waits let the
// stop flag (or terminate()) end it even if a notify is missed.
function waitAbove(ctl: Int32Array, at: number, ticket: number): boolean {
  while (true) {
    const v = Atomics.load(ctl, at);
    if (v > ticket) return true;
    if (Atomics.load(ctl, C_STOP) !== 0) return false;
    Atomics.wait(ctl, at, v, 100);
  }
}

function serve(ctl: Int32Array, slots: number, tasks: number, batch: number): void {
  const L = controlLayout(slots, tasks, batch, init.numWorkers);
  const spec = init.gather!;
  const ring32 = new Int32Array(spec.ring, 0, spec.ring.byteLength >>> 2);
  const me = L.worker + 2 * init.id;
  const ring = () => {
    Atomics.add(ctl, C_DOORBELL, 1);
    Atomics.notify(ctl, C_DOORBELL);
  };
  let slot = -1;
  try {
    while (Atomics.load(ctl, C_STOP) === 0) {
      if (slot < 0) {
        Atomics.store(ctl, me, W_WAIT_SLOT);
        const ticket = Atomics.add(ctl, C_FREE_HEAD, 1);
        if (!waitAbove(ctl, C_FREE_TAIL, ticket)) return;
        const cell = L.freeQ + 2 * (ticket % L.freeCap);
        slot = ctl[cell + 1];
        // The cell may now hold position ticket + freeCap (see _protocol.ts).
        Atomics.store(ctl, cell, ticket + L.freeCap);
      }
      Atomics.store(ctl, me, W_WAIT_TASK);
      const t = Atomics.add(ctl, C_CLAIM, 1);
      if (!waitAbove(ctl, C_PUBLISHED, t)) return;
      Atomics.store(ctl, me, W_GATHER);
      const e = L.taskQ + (t % L.tasks) * L.entry;
      const seq = ctl[e + 1];
      const epoch = ctl[e + 2];
      const pos = ctl[e + 3];
      const n = ctl[e + 4];
      const skip = seq < Atomics.load(ctl, C_SKIP_BELOW);
      // The gather reads the indices from the slot: copy them before the entry is released.
      if (!skip) {
        ring32.set(
          ctl.subarray(e + 5, e + 5 + n),
          (slot * spec.slotBytes + spec.indicesOffset) >>> 2,
        );
      }
      Atomics.store(ctl, e, t + L.tasks);
      if (skip) {
        // An abandoned epoch's task: keep the slot. The main thread may be waiting to publish
        // into the entry just released: ring so that it looks again.
        ring();
        continue;
      }
      const t0 = performance.now();
      syncCall.seq = seq;
      syncCall.index = -1;
      syncCall.call = "gather";
      syncCall.active = true;
      try {
        gatherer!.gather(slot, n, epoch, pos);
      } catch (err) {
        syncCall.active = false;
        post({
          t: "e",
          seq,
          slot,
          index: err instanceof SampleError ? err.index : -1,
          ...errorFields(err),
        });
        // The error travels as a value (the engine frees the slot); keep serving: the batch
        // may belong to an epoch the consumer abandons, and later epochs need this worker.
        slot = -1;
        continue;
      }
      syncCall.active = false;
      ctl[L.busy + slot] = Math.round((performance.now() - t0) * 1000);
      Atomics.store(ctl, L.ready + slot, seq + 1);
      slot = -1;
      Atomics.add(ctl, me + 1, 1);
      ring();
    }
  } finally {
    Atomics.store(ctl, me, W_STOPPED);
  }
}

async function runCollate(task: CollateTask): Promise<void> {
  const t0 = performance.now();
  try {
    const at = {
      seed: init.seed,
      epoch: task.epoch,
      position: task.pos,
      stride: init.drawStride,
      workerId: init.id,
    };
    syncCall.seq = task.seq;
    const samples = await fetchSamples(dataset!, task.idx, at);
    if (init.collate === "none") {
      post({ t: "b", seq: task.seq, value: samples, busy: performance.now() - t0 });
      if (heapExhausted()) stopped = true;
      return;
    }
    syncCall.index = -1;
    syncCall.call = "collate";
    syncCall.active = true;
    // Without batching a collate gets the sample itself, as PyTorch's with batch_size=None.
    const value = init.unbatched
      ? (collate as (s: unknown) => unknown)(samples[0])
      : collate!(samples);
    syncCall.active = false;
    const transfer: Transferable[] = [];
    if (init.collate === "default") transferables(value, transfer);
    post({ t: "b", seq: task.seq, value, busy: performance.now() - t0 }, transfer);
    if (heapExhausted()) stopped = true;
  } catch (e) {
    syncCall.active = false;
    // A collate that throws is tied to no sample (index -1).
    const failure = e instanceof SampleFailure ? e : new SampleFailure(-1, e);
    post({ t: "e", seq: task.seq, index: failure.index, ...errorFields(failure.thrown) });
  }
}

async function pump(): Promise<void> {
  if (running) return;
  running = true;
  try {
    while (ready && !stopped && queue.length > 0) {
      const task = queue.shift()!;
      if (task.t === "c") await runCollate(task);
    }
  } finally {
    running = false;
  }
}

port.on("message", (msg: ToWorker) => {
  if (msg.t === "init") {
    setup(msg).then(
      () => {
        ready = true;
        post({ t: "ready" });
        if (msg.control) serve(new Int32Array(msg.control), msg.slots!, msg.tasks!, msg.batch!);
        else pump();
      },
      (e) => post({ t: "fatal", ...errorFields(e) }),
    );
    return;
  }
  if (msg.t === "ping") {
    // Inside a synchronous call this handler cannot run, unless V8 ended that call at the heap
    // limit (see syncCall): report it, and take no more tasks.
    if (!syncCall.active) return post({ t: "pong" });
    stopped = true;
    return post({ t: "killed", seq: syncCall.seq, index: syncCall.index, call: syncCall.call });
  }
  queue.push(msg);
  // Dataset code runs in a promise job, never inside the message dispatch: when V8 ends a
  // call at the heap limit inside the dispatch, the worker stops receiving messages for
  // good, where inside a promise job only that call ends and the ping can report it.
  queueMicrotask(pump);
});

// Listening now: the loader holds every message until it hears this (see
// _transport_workers.ts).
post({ t: "hello" });
