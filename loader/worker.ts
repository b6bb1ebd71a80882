/// <reference lib="deno.worker" />
// Entry point of a DataLoader worker (a Deno Web Worker). It rebuilds the dataset once from
// its WorkerSpec (or only maps the shared fields on the zero-copy path), then serves tasks in
// the order they arrive. Errors travel back as values naming the sample index; an explicit
// self.close() or Deno.exit() is reported before the worker goes, so the loader never waits
// on a worker that is gone.

import { Gatherer, SampleError } from "./_gather.ts";
import { CounterRandom, STREAM_SAMPLE } from "./_rng.ts";
import { defaultCollate } from "./collate.ts";
import type { Dataset, SampleContext } from "./dataset.ts";
import {
  type CollateTask,
  CTL_DOORBELL,
  CTL_STOP,
  ctlBase,
  type FromWorker,
  type GatherTask,
  type InitMessage,
  type ModuleRef,
  type ToWorker,
} from "./_protocol.ts";
import { _setWorkerInfo } from "./worker_info.ts";

const post = (m: FromWorker, transfer?: Transferable[]) =>
  self.postMessage(m, { transfer: transfer ?? [] });

const originalClose = self.close.bind(self);
self.close = () => {
  post({ t: "x", reason: "the worker called self.close()" });
  originalClose();
};
const originalExit = Deno.exit;
Deno.exit = ((code?: number) => {
  post({ t: "x", reason: `the worker called Deno.exit(${code ?? 0})` });
  return originalExit(code);
}) as typeof Deno.exit;

async function resolveRef(ref: ModuleRef): Promise<(arg: unknown) => unknown> {
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

let init: InitMessage;
let gatherer: Gatherer | undefined;
let dataset: Dataset | undefined;
let collate: ((samples: unknown[]) => unknown) | undefined;
const queue: ToWorker[] = [];
let running = false;
let ready = false;

function errorFields(e: unknown): { name: string; message: string; stack: string } {
  if (e instanceof Error) return { name: e.name, message: e.message, stack: e.stack ?? "" };
  return { name: "Error", message: String(e), stack: "" };
}

async function setup(msg: InitMessage): Promise<void> {
  init = msg;
  if (msg.gather) gatherer = new Gatherer(msg.gather);
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

// The zero-copy loop: blocks in Atomics.wait for tasks and never returns to the event loop
// while serving (nothing else arrives by message on this path). Timed waits let a stop flag
// or terminate() end it even if a notify is missed.
function serve(ctl: Int32Array, id: number, cap: number): void {
  const base = ctlBase(id, cap);
  const tasks = base + 4;
  const done = base + 4 + cap * 5;
  let head = 0;
  while (Atomics.load(ctl, CTL_STOP) === 0) {
    if (Atomics.load(ctl, base) === head) {
      Atomics.wait(ctl, base, head, 100);
      continue;
    }
    const e = tasks + (head % cap) * 5;
    const seq = ctl[e];
    const t0 = performance.now();
    try {
      gatherer!.gather(ctl[e + 1], ctl[e + 2], ctl[e + 3], ctl[e + 4]);
    } catch (err) {
      post({
        t: "e",
        seq,
        index: err instanceof SampleError ? err.index : -1,
        ...errorFields(err),
      });
      return;
    }
    const c = done + (head % cap) * 2;
    ctl[c] = seq;
    ctl[c + 1] = Math.round((performance.now() - t0) * 1000);
    head++;
    Atomics.store(ctl, base + 1, head);
    Atomics.store(ctl, base + 2, head);
    Atomics.add(ctl, CTL_DOORBELL, 1);
    Atomics.notify(ctl, CTL_DOORBELL);
  }
}

function runGather(task: GatherTask): void {
  try {
    const t0 = performance.now();
    gatherer!.gather(task.slot, task.n, task.epoch, task.pos);
    post({ t: "d", seq: task.seq, busy: performance.now() - t0 });
  } catch (e) {
    post({
      t: "e",
      seq: task.seq,
      index: e instanceof SampleError ? e.index : -1,
      ...errorFields(e),
    });
  }
}

async function runCollate(task: CollateTask): Promise<void> {
  const samples: unknown[] = new Array(task.idx.length);
  let current = -1;
  const t0 = performance.now();
  try {
    for (let k = 0; k < task.idx.length; k++) {
      current = task.idx[k];
      const rng = new CounterRandom(init.seed, task.epoch, STREAM_SAMPLE, task.pos + k);
      const ctx: SampleContext = {
        epoch: task.epoch,
        position: task.pos + k,
        workerId: init.id,
        random: () => rng.random(),
        int: (n: number) => rng.int(n),
      };
      const s = dataset!.get(current, ctx);
      samples[k] = s instanceof Promise ? await s : s;
    }
    current = -1;
    if (init.collate === "none") {
      post({ t: "b", seq: task.seq, value: samples, busy: performance.now() - t0 });
      return;
    }
    const value = collate!(samples);
    const transfer: Transferable[] = [];
    if (init.collate === "default") transferables(value, transfer);
    post({ t: "b", seq: task.seq, value, busy: performance.now() - t0 }, transfer);
  } catch (e) {
    post({ t: "e", seq: task.seq, index: current, ...errorFields(e) });
  }
}

async function pump(): Promise<void> {
  if (running) return;
  running = true;
  try {
    while (ready && queue.length > 0) {
      const task = queue.shift()!;
      if (task.t === "g") runGather(task);
      else if (task.t === "c") await runCollate(task);
    }
  } finally {
    running = false;
  }
}

self.onmessage = (event: MessageEvent<ToWorker>) => {
  const msg = event.data;
  if (msg.t === "init") {
    setup(msg).then(
      () => {
        ready = true;
        post({ t: "ready" });
        if (msg.control && msg.cap) serve(new Int32Array(msg.control), msg.id, msg.cap);
        else pump();
      },
      (e) => post({ t: "fatal", ...errorFields(e) }),
    );
    return;
  }
  // Fast path: an idle worker handles a gather task synchronously, no promise in between.
  if (ready && !running && queue.length === 0 && msg.t === "g") {
    runGather(msg);
    return;
  }
  queue.push(msg);
  pump();
};
