// The scheduler behind a DataLoader: plans epochs, hands batches to workers (at most
// prefetchFactor x numWorkers outstanding, one refilled per batch yielded), keeps a reorder
// buffer, and turns every failure (worker throw, worker exit or crash, timeout) into an error
// for the consumer instead of a hang. With numWorkers 0 it loads each batch on demand on the
// main thread through the same code (gather or get + collate).
//
// Two ways to reach workers:
// - zero-copy ("pull"): tasks and free slots go through a shared control block that workers
//   read on their own (see _protocol.ts), so a batch costs the main thread a few stores and
//   no message; measured, this doubled the 2-worker rate over per-batch messages because
//   workers no longer wait for the main thread to be scheduled between batches;
// - generic ("push"): one postMessage per batch each way, the batch transferred back. Only
//   the generic path pushes: a zero-copy loader with workers always pulls.

import { Worker as NodeWorker } from "node:worker_threads";
import { Gatherer, type GatherSpec, SampleError } from "./_gather.ts";
import {
  C_CLAIM,
  C_DOORBELL,
  C_FREE_HEAD,
  C_FREE_TAIL,
  C_HEADER,
  C_PUBLISHED,
  C_SKIP_BELOW,
  C_STOP,
  controlLayout,
  errorFields,
  type FromWorker,
  initControl,
  type InitMessage,
  type ModuleRef,
  resolveRef,
  type ToWorker,
  W_STOPPED,
  W_WAIT_SLOT,
  W_WAIT_TASK,
  WORKER_STATES,
} from "./_protocol.ts";
import { fetchSamples, SampleFailure } from "./_fetch.ts";
import { hash4, seedWords, STREAM_WORKER } from "./_rng.ts";
import type { Dataset, WorkerSpec } from "./dataset.ts";
import { defaultCollate } from "./collate.ts";
import type { StagingRing } from "./ring.ts";

export interface EpochPlan {
  epoch: number;
  batches: Int32Array[];
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
  /** The batches of an epoch. */
  plan: (epoch: number) => Int32Array[];
  /** Whether `plan` is a pure function of the epoch (so the next epoch can be prefetched). */
  canPlanAhead: boolean;
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

let liveWorkers = 0;
/** Workers started by any DataLoader and not yet terminated. */
export function liveWorkerCount(): number {
  return liveWorkers;
}

/**
 * A failure loading a sample, rethrown in the consumer when its batch is due, with the
 * sample's dataset index and the original stack (from the worker, or the main thread).
 *
 * @example Catching a sample's failure
 * ```ts
 * import { DataLoader, WorkerError } from "./data_loader.ts";
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

function timeoutError(b: number, epoch: number, seconds: number, what: string): TimeoutError {
  return new TimeoutError(
    `Cannot get batch ${b} of epoch ${epoch}: DataLoader timed out after ${seconds} s ` +
      `(timeout option; ${what})`,
  );
}

/**
 * The error for a sample that failed to load, worded the same on every path: the value
 * thrown is kept as it was (an Error's name and message, or the thrown string, null, ...).
 */
function sampleError(
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

interface WorkerHandle {
  id: number;
  worker: NodeWorker;
  outstanding: number;
  alive: boolean;
  /**
   * Messages held until the worker says "hello". A node worker drops messages that arrive
   * before it listens, and one started through the network bootstrap listens only once its
   * module has been fetched.
   */
  backlog: { m: ToWorker; transfer?: Transferable[] }[] | undefined;
}

interface Pending {
  seq: number;
  plan: EpochPlan;
  batch: number;
  worker: number;
}

export class Engine {
  #cfg: EngineConfig;
  #plans: EpochPlan[] = [];
  #nextSeq = 0;
  #dispatchPlan: EpochPlan | undefined;
  #results = new Map<number, Result>();
  #pending = new Map<number, Pending>();
  #workers: WorkerHandle[] = [];
  #outstanding = 0;
  #rr = 0;
  #failure: Error | undefined;
  #closed = false;
  #wake: (() => void) | undefined;
  #gatherer: Gatherer | undefined;
  #mainCollate: ((s: unknown[]) => unknown) | undefined;
  /** Milliseconds workers spent loading (summed over workers), for stats. */
  busyMs = 0;
  // Zero-copy control block (see _protocol.ts); undefined on the generic path.
  #ctl: Int32Array | undefined;
  #layout: ReturnType<typeof controlLayout> | undefined;
  #published = 0;
  #freeTail = 0;

  constructor(cfg: EngineConfig) {
    this.#cfg = cfg;
    if (cfg.numWorkers === 0 && cfg.gather) this.#gatherer = new Gatherer(cfg.gather);
    if (cfg.numWorkers > 0 && cfg.gather) {
      const slots = cfg.slotState!.length;
      // Published-but-unyielded tasks never exceed the in-flight limit; the margin covers
      // skipped tasks of an abandoned epoch still being read.
      const tasks = 2 * (cfg.prefetchFactor * cfg.numWorkers + slots);
      this.#layout = controlLayout(slots, tasks, cfg.ring!.batchSize, cfg.numWorkers);
      this.#ctl = new Int32Array(new SharedArrayBuffer(this.#layout.ints * 4));
      initControl(this.#ctl, this.#layout);
    }
    for (let id = 0; id < cfg.numWorkers; id++) this.#startWorker(id);
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** @internal The zero-copy control block, for fault-injection tests only. */
  get _control(): Int32Array | undefined {
    return this.#ctl;
  }

  get failure(): Error | undefined {
    return this.#failure;
  }

  #startWorker(id: number): void {
    const cfg = this.#cfg;
    // node:worker_threads, not Web Workers: in Deno 2.9 a Web Worker's terminate() does not
    // stop a worker stuck in a JavaScript loop, and the process then never exits
    // (denoland/deno#35657); a node worker's does. And a Web Worker that runs out of heap
    // aborts the whole process, where a node worker with resourceLimits dies alone with
    // ERR_WORKER_OUT_OF_MEMORY. A node worker takes file: and data: URLs only, so a module
    // loaded from the network (a JSR import) starts through a one-line bootstrap.
    const url = new URL("./worker.ts", import.meta.url);
    const worker = url.protocol === "file:"
      ? new NodeWorker(url, { resourceLimits: cfg.resourceLimits })
      : new NodeWorker(`import(${JSON.stringify(url.href)});`, {
        eval: true,
        resourceLimits: cfg.resourceLimits,
      });
    liveWorkers++;
    const handle: WorkerHandle = { id, worker, outstanding: 0, alive: true, backlog: [] };
    this.#workers.push(handle);
    worker.on("message", (m: FromWorker) => this.#onMessage(handle, m));
    worker.on("error", (e: Error & { code?: string }) => {
      if (!handle.alive) return;
      if (e?.code === "ERR_WORKER_OUT_OF_MEMORY") return this.#fail(this.#oomError(id, ""));
      this.#fail(
        new Error(
          `Cannot load batches: DataLoader worker ${id} crashed: ${e?.message ?? String(e)}`,
        ),
      );
    });
    worker.on("messageerror", () => {
      this.#fail(
        new Error(
          `Cannot load batches: a message from DataLoader worker ${id} failed to deserialize`,
        ),
      );
    });
    worker.on("exit", (code: number) => {
      // A stop we asked for sets alive = false first; anything else is unexpected. An exit
      // the worker announced ("x" message) was reported already (#fail keeps the first).
      if (!handle.alive) return;
      this.#fail(
        new Error(
          `Cannot load batches: DataLoader worker ${id} exited unexpectedly (exit code ${code})`,
        ),
      );
    });
    const [lo, hi] = seedWords(cfg.seed);
    const init: InitMessage = {
      t: "init",
      id,
      numWorkers: cfg.numWorkers,
      seed: cfg.seed,
      // PyTorch draws a new base seed for each iterator: workers started for one epoch get
      // seeds of their own, persistent workers keep theirs (their generators go on).
      workerSeed: hash4(
        lo,
        hi,
        id,
        cfg.persistent ? STREAM_WORKER : hash4(STREAM_WORKER, cfg.firstEpoch, 0, 0),
      ),
      gather: cfg.gather,
      control: this.#ctl?.buffer as SharedArrayBuffer | undefined,
      slots: this.#layout?.ready !== undefined ? cfg.slotState!.length : undefined,
      tasks: this.#layout?.tasks,
      batch: cfg.ring?.batchSize,
      dataset: cfg.gather ? undefined : cfg.workerSpec,
      collate: cfg.collateMode === "main" ? "none" : cfg.collateMode,
      unbatched: cfg.unbatched,
      workerInit: cfg.workerInit,
      heapLimitMb: cfg.resourceLimits.maxOldGenerationSizeMb,
    };
    this.#send(handle, init);
  }

  #oomError(id: number, detail: string): Error {
    const mb = this.#cfg.resourceLimits.maxOldGenerationSizeMb;
    return new Error(
      `Cannot load batches: DataLoader worker ${id} ran out of memory${detail} (its ` +
        `old-generation heap is limited to ${mb} MB by ` +
        "workerResourceLimits.maxOldGenerationSizeMb); the worker was stopped, the process " +
        "goes on. Raise the limit, or keep samples in shared memory (a zero-copy dataset)",
    );
  }

  #send(w: WorkerHandle, m: ToWorker, transfer?: Transferable[]): void {
    if (w.backlog) w.backlog.push({ m, transfer });
    else w.worker.postMessage(m, transfer as never[]);
  }

  #onMessage(w: WorkerHandle, msg: FromWorker): void {
    if (this.#closed) return;
    switch (msg.t) {
      case "hello": {
        const backlog = w.backlog ?? [];
        w.backlog = undefined;
        for (const { m, transfer } of backlog) w.worker.postMessage(m, transfer as never[]);
        return;
      }
      case "ready":
        return;
      case "oom":
        return this.#fail(
          this.#oomError(w.id, `: ${msg.usedMb} MB of its heap in use`),
        );
      case "fatal":
        return this.#fail(
          new WorkerError(
            `Cannot start DataLoader worker ${w.id}: ${msg.name}: ${msg.message}`,
            -1,
            w.id,
            msg.stack,
          ),
        );
      case "x":
        return this.#fail(
          new Error(
            `Cannot load batches: DataLoader worker ${w.id} exited unexpectedly (${msg.reason})`,
          ),
        );
      case "e": {
        // Errors travel as values: rethrown when that batch is due, like PyTorch.
        const p = this.#pending.get(msg.seq);
        if (!p) {
          // A task of an abandoned epoch: nobody will see the error, but its slot goes back.
          if (msg.slot !== undefined && msg.slot >= 0) {
            this.#cfg.slotState![msg.slot] = SLOT_FREE;
            this.pump();
          }
          return;
        }
        this.#pending.delete(msg.seq);
        w.outstanding--;
        const error = sampleError(msg.index, p.batch, p.plan.epoch, w.id, msg);
        if (msg.slot !== undefined && msg.slot >= 0) this.#cfg.slotState![msg.slot] = SLOT_FREE;
        if (p.plan.abandoned) {
          this.#outstanding--;
          this.pump();
          return;
        }
        this.#results.set(msg.seq, {
          kind: "error",
          seq: msg.seq,
          error,
          epoch: p.plan.epoch,
          batch: p.batch,
          size: 0,
        });
        this.#wake?.();
        return;
      }
      case "b":
        this.#complete(w, msg.seq, msg.busy, msg.value);
        return;
    }
  }

  /** Generic path: a worker sent a batch's value back. */
  #complete(w: WorkerHandle, seq: number, busy: number, value: unknown): void {
    const p = this.#pending.get(seq);
    if (!p) return;
    this.#pending.delete(seq);
    w.outstanding--;
    this.busyMs += busy;
    const size = p.plan.batches[p.batch].length;
    if (p.plan.abandoned) {
      this.#outstanding--;
      this.pump();
      return;
    }
    const { epoch } = p.plan;
    this.#results.set(seq, { kind: "value", value, seq, epoch, batch: p.batch, size });
    this.#wake?.();
  }

  /** Collects the slots workers marked ready in the control block. */
  #drain(): void {
    const ctl = this.#ctl;
    const L = this.#layout;
    if (!ctl || !L || this.#closed || this.#failure) return;
    const state = this.#cfg.slotState!;
    let freed = false;
    for (let slot = 0; slot < state.length; slot++) {
      const v = Atomics.load(ctl, L.ready + slot);
      if (v === 0) continue;
      ctl[L.ready + slot] = 0;
      const seq = v - 1;
      this.busyMs += ctl[L.busy + slot] / 1000;
      const p = this.#pending.get(seq);
      if (!p) {
        // A task of an abandoned epoch finished after it was dropped: recycle its slot.
        state[slot] = SLOT_FREE;
        freed = true;
        continue;
      }
      this.#pending.delete(seq);
      const size = p.plan.batches[p.batch].length;
      this.#results.set(seq, {
        kind: "slot",
        seq,
        slot,
        epoch: p.plan.epoch,
        batch: p.batch,
        size,
      });
    }
    if (freed) this.#pushFreeSlots();
  }

  /** Hands every free slot to the workers' free queue (pull mode). */
  #pushFreeSlots(): void {
    const ctl = this.#ctl;
    const L = this.#layout;
    if (!ctl || !L) return;
    const state = this.#cfg.slotState!;
    let pushed = false;
    for (let slot = 0; slot < state.length; slot++) {
      if (state[slot] !== SLOT_FREE) continue;
      const cell = L.freeQ + 2 * (this.#freeTail % L.freeCap);
      // Not yet read by the worker holding position freeTail - freeCap: the queue is full
      // for now; the slot stays free and goes out at the next pump (see _protocol.ts).
      if (Atomics.load(ctl, cell) !== this.#freeTail) break;
      state[slot] = SLOT_LOADER;
      ctl[cell + 1] = slot;
      Atomics.store(ctl, cell, this.#freeTail + 1);
      this.#freeTail++;
      pushed = true;
    }
    if (pushed) {
      Atomics.store(ctl, C_FREE_TAIL, this.#freeTail);
      Atomics.notify(ctl, C_FREE_TAIL);
    }
  }

  #fail(error: Error): void {
    if (this.#failure || this.#closed) return;
    this.#failure = error;
    this.#terminateWorkers();
    this.#wake?.();
  }

  #terminateWorkers(): void {
    const ctl = this.#ctl;
    if (ctl) {
      // Ends the workers' Atomics.wait loops and any waitAsync of ours.
      Atomics.store(ctl, C_STOP, 1);
      Atomics.add(ctl, C_DOORBELL, 1);
      Atomics.notify(ctl, C_DOORBELL);
      Atomics.notify(ctl, C_PUBLISHED);
      Atomics.notify(ctl, C_FREE_TAIL);
      // Slots in the free queue or being filled go back to the ring.
      const state = this.#cfg.slotState!;
      for (let s = 0; s < state.length; s++) if (state[s] === SLOT_LOADER) state[s] = SLOT_FREE;
    }
    for (const w of this.#workers) {
      if (!w.alive) continue;
      w.alive = false;
      w.worker.removeAllListeners();
      // An 'error' event with no listener would be thrown on the main thread.
      w.worker.on("error", () => {});
      // Stops the worker's thread even inside a JavaScript loop (see #startWorker).
      w.worker.terminate().catch(() => {});
      liveWorkers--;
    }
    // Slots of results nobody will take go back to the ring (the ones workers were filling
    // went back above).
    const state = this.#cfg.slotState;
    if (state) {
      for (const r of this.#results.values()) if (r.kind === "slot") state[r.slot] = SLOT_FREE;
    }
    this.#pending.clear();
    this.#results.clear();
  }

  /** Stops every worker and frees every slot the engine holds. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#terminateWorkers();
    this.#closed = true;
    this.#wake?.();
  }

  #planEpoch(epoch: number): EpochPlan {
    const batches = this.#cfg.plan(epoch);
    const cap = this.#cfg.ring?.batchSize;
    if (cap !== undefined) {
      for (let b = 0; b < batches.length; b++) {
        if (batches[b].length > cap) {
          throw new RangeError(
            `Cannot plan batch ${b} of epoch ${epoch}: it has ${batches[b].length} indices, ` +
              `the staging ring holds ${cap} per batch (sized from the sampler's length, or ` +
              "a batchSampler's largest batch of epoch 0)",
          );
        }
      }
    }
    const positions = new Array<number>(batches.length);
    let pos = 0;
    for (let b = 0; b < batches.length; b++) {
      positions[b] = pos;
      pos += batches[b].length;
    }
    const plan: EpochPlan = {
      epoch,
      batches,
      positions,
      startSeq: this.#nextSeq,
      dispatched: 0,
      yielded: 0,
      abandoned: false,
    };
    this.#nextSeq += batches.length;
    this.#plans.push(plan);
    return plan;
  }

  /** Makes `epoch` the consumer's epoch, reusing a prefetched plan when it matches. */
  startEpoch(epoch: number): EpochPlan {
    if (this.#failure) throw this.#failure;
    // Only a plan nothing was taken from: one the consumer already went through (an epoch
    // run again after setEpoch) starts over.
    let plan = this.#plans.find((p) => p.epoch === epoch && !p.abandoned && p.yielded === 0);
    // A finished plan needs nothing undone (abandoning one would also wake the workers).
    for (const p of this.#plans) {
      if (p !== plan && p.yielded < p.batches.length) this.#abandon(p);
    }
    if (!plan) {
      plan = this.#planEpoch(epoch);
      this.#dispatchPlan = plan;
    }
    this.#plans = [plan];
    this.pump();
    return plan;
  }

  /** Drops what is left of an epoch (the consumer stopped early). */
  abandon(plan: EpochPlan): void {
    this.#abandon(plan);
    this.#plans = this.#plans.filter((p) => p !== plan);
    if (this.#cfg.persistent && this.#cfg.canPlanAhead && !this.#failure) this.pump();
  }

  #abandon(plan: EpochPlan): void {
    if (plan.abandoned) return;
    plan.abandoned = true;
    const state = this.#cfg.slotState;
    for (const [seq, r] of this.#results) {
      if (r.epoch !== plan.epoch || seq < plan.startSeq) continue;
      if (seq >= plan.startSeq + plan.batches.length) continue;
      this.#results.delete(seq);
      this.#outstanding--;
      if (r.kind === "slot" && state) state[r.slot] = SLOT_FREE;
    }
    if (this.#dispatchPlan === plan) this.#dispatchPlan = undefined;
    if (this.#ctl) {
      // Published tasks of this plan: workers skip the unclaimed ones; the ones being
      // gathered come back as unknown seqs and their slots are recycled by #drain.
      const end = plan.startSeq + plan.batches.length;
      for (const [seq, p] of this.#pending) {
        if (p.plan === plan) {
          this.#pending.delete(seq);
          this.#outstanding--;
        }
      }
      if (Atomics.load(this.#ctl, C_SKIP_BELOW) < end) Atomics.store(this.#ctl, C_SKIP_BELOW, end);
      this.#pushFreeSlots();
    }
  }

  /** The next plan to dispatch from, planning the next epoch ahead when allowed. */
  #nextDispatchPlan(): EpochPlan | undefined {
    const cur = this.#dispatchPlan;
    if (cur && !cur.abandoned && cur.dispatched < cur.batches.length) return cur;
    if (!this.#canPrefetch()) return undefined;
    // Prefetch into the epoch after the consumer's, but never more than one ahead.
    const last = this.#plans[this.#plans.length - 1];
    if (!last) return undefined;
    if (last !== cur && !last.abandoned && last.dispatched < last.batches.length) {
      this.#dispatchPlan = last; // planned ahead while the consumer was waiting
      return last;
    }
    if (this.#plans.length >= 2) return undefined;
    if (last.dispatched < last.batches.length && !last.abandoned) return undefined;
    const next = this.#tryPlan(last.epoch + 1);
    if (!next) return undefined;
    this.#dispatchPlan = next;
    return next.batches.length > 0 ? next : undefined;
  }

  #canPrefetch(): boolean {
    return this.#cfg.persistent && this.#cfg.canPlanAhead && this.#cfg.numWorkers > 0;
  }

  /**
   * Plans the next epoch while the consumer waits anyway, so that crossing the epoch
   * boundary costs no planning (a 50,000-sample shuffle is about half a millisecond).
   */
  #planAhead(): void {
    if (!this.#canPrefetch() || this.#plans.length !== 1) return;
    const cur = this.#plans[0];
    // Not at the start of an epoch: there the consumer's wait is for the boundary batch itself,
    // and planning would delay it by the planning time. Mid-epoch it costs one late batch.
    if (cur.abandoned || cur.yielded < cur.batches.length / 2) return;
    this.#tryPlan(cur.epoch + 1);
  }

  /**
   * Plans an epoch ahead of the consumer. A sampler that fails doing so (bad indices) fails
   * the loader; the consumer gets the error at its next batch, not the caller of release().
   */
  #tryPlan(epoch: number): EpochPlan | undefined {
    try {
      return this.#planEpoch(epoch);
    } catch (e) {
      this.#fail(e as Error);
      return undefined;
    }
  }

  #freeSlot(): number {
    const state = this.#cfg.slotState!;
    for (let s = 0; s < state.length; s++) if (state[s] === SLOT_FREE) return s;
    return -1;
  }

  /** Dispatches tasks until the in-flight limit, the plan's end or the ring's free slots. */
  pump(): void {
    const cfg = this.#cfg;
    if (cfg.numWorkers === 0 || this.#failure || this.#closed) return;
    const limit = cfg.prefetchFactor * cfg.numWorkers;
    if (this.#ctl) return this.#publish(limit);
    // Generic path: one message per batch to the least-loaded worker.
    while (this.#outstanding < limit) {
      const plan = this.#nextDispatchPlan();
      if (!plan) return;
      const b = plan.dispatched++;
      const seq = plan.startSeq + b;
      const indices = plan.batches[b];
      // Least-loaded worker, round-robin among equals.
      let w = this.#workers[this.#rr];
      for (let k = 1; k < this.#workers.length; k++) {
        const c = this.#workers[(this.#rr + k) % this.#workers.length];
        if (c.outstanding < w.outstanding) w = c;
      }
      this.#rr = (w.id + 1) % this.#workers.length;
      w.outstanding++;
      this.#outstanding++;
      this.#pending.set(seq, { seq, plan, batch: b, worker: w.id });
      this.#send(w, { t: "c", seq, idx: indices, epoch: plan.epoch, pos: plan.positions[b] });
    }
  }

  /** Pull mode: returns free slots to the workers and publishes tasks up to the limit. */
  #publish(limit: number): void {
    const ctl = this.#ctl!;
    const L = this.#layout!;
    this.#pushFreeSlots();
    let published = false;
    while (this.#outstanding < limit) {
      const plan = this.#nextDispatchPlan();
      if (!plan) break;
      const e = L.taskQ + (this.#published % L.tasks) * L.entry;
      // The entry's last reader has not copied it out yet: publish at the next pump (that
      // reader rings the doorbell when it has gathered or skipped its task, so it comes).
      if (Atomics.load(ctl, e) !== this.#published) break;
      const b = plan.dispatched++;
      const seq = plan.startSeq + b;
      const indices = plan.batches[b];
      ctl[e + 1] = seq;
      ctl[e + 2] = plan.epoch;
      ctl[e + 3] = plan.positions[b];
      ctl[e + 4] = indices.length;
      ctl.set(indices, e + 5);
      Atomics.store(ctl, e, this.#published + 1);
      this.#published++;
      this.#outstanding++;
      this.#pending.set(seq, { seq, plan, batch: b, worker: -1 });
      published = true;
    }
    if (published) {
      Atomics.store(ctl, C_PUBLISHED, this.#published);
      Atomics.notify(ctl, C_PUBLISHED);
    }
  }

  /** The next result of `plan` for the consumer, or undefined at the end of the epoch. */
  async next(plan: EpochPlan): Promise<Result | undefined> {
    if (this.#failure) throw this.#failure;
    if (this.#closed) throw new Error("Cannot get a batch: the DataLoader was disposed");
    if (plan.yielded >= plan.batches.length) return undefined;
    if (this.#cfg.numWorkers === 0) return await this.#loadInline(plan);
    const t0 = performance.now();
    let depth = -1;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let watchdog: ReturnType<typeof setInterval> | undefined;
    try {
      while (true) {
        this.#drain();
        if (this.#failure) throw this.#failure;
        if (this.#closed) throw new Error("Cannot get a batch: the DataLoader was disposed");
        if (depth < 0) depth = this.#readyCount(plan);
        const r = this.#take(plan);
        if (r?.kind === "error") {
          this.#fail(r.error);
          throw r.error;
        }
        if (r) {
          this.#cfg.onWait((performance.now() - t0) / 1000, depth);
          this.#outstanding--;
          plan.yielded++;
          this.pump();
          return r;
        }
        this.pump();
        this.#checkStarved(plan);
        this.#planAhead();
        if (watchdog === undefined && this.#cfg.watchdog > 0) {
          watchdog = this.#watch(plan);
        }
        if (timer === undefined && this.#cfg.timeout > 0) {
          const b = plan.yielded;
          timer = setTimeout(() => {
            this.#fail(
              timeoutError(
                b,
                plan.epoch,
                this.#cfg.timeout,
                "every worker was stopped, including one stuck in a JavaScript loop",
              ),
            );
          }, this.#cfg.timeout * 1000);
        }
        const woken = new Promise<void>((resolve) => (this.#wake = resolve));
        if (this.#ctl) {
          const ctl = this.#ctl;
          const bell = Atomics.load(ctl, C_DOORBELL);
          this.#drain();
          if (this.#results.size === 0 || !this.#hasDue(plan)) {
            const r = Atomics.waitAsync(ctl, C_DOORBELL, bell);
            if (r.async) await Promise.race([woken, r.value]);
          }
        } else await woken;
        this.#wake = undefined;
      }
    } finally {
      if (timer !== undefined) clearTimeout(timer);
      if (watchdog !== undefined) clearInterval(watchdog);
    }
  }

  /**
   * The stall watchdog of one wait: every quarter of the watchdog period it looks again
   * (drain, pump: a lost wake-up heals here), and when nothing moved for the whole period
   * while every worker sat idle, the loader cannot make progress on its own: that is a bug
   * in the loader, reported with its state instead of waiting forever.
   */
  #watch(plan: EpochPlan): ReturnType<typeof setInterval> {
    const period = this.#cfg.watchdog * 1000;
    let last = "";
    let since = performance.now();
    return setInterval(() => {
      if (this.#failure || this.#closed) return;
      this.#wake?.();
      const idle = this.#workersIdle();
      const now = performance.now();
      const sig = idle ? this.#progressSignature() : "";
      if (!idle || sig !== last) {
        last = sig;
        since = now;
        return;
      }
      if (now - since < period) return;
      this.#fail(
        new Error(
          `Cannot get batch ${plan.yielded} of epoch ${plan.epoch}: the DataLoader made no ` +
            `progress for ${((now - since) / 1000).toFixed(1)} s while every worker was idle. ` +
            "This is a bug in the loader, not in your dataset; please report it with this " +
            `state: ${JSON.stringify(this.debugState(plan))}`,
        ),
      );
    }, Math.max(10, period / 4));
  }

  /** Whether no worker is loading anything (every live one waits for work). */
  #workersIdle(): boolean {
    const ctl = this.#ctl;
    const L = this.#layout;
    if (ctl && L) {
      for (let w = 0; w < this.#cfg.numWorkers; w++) {
        const st = Atomics.load(ctl, L.worker + 2 * w);
        if (st !== W_WAIT_SLOT && st !== W_WAIT_TASK && st !== W_STOPPED) return false;
      }
      return true;
    }
    return this.#pending.size === 0;
  }

  #progressSignature(): string {
    const c = this.#ctl;
    const head = c ? Array.from(c.subarray(0, C_HEADER)).join(",") : "";
    return `${head}|${this.#pending.size}|${this.#results.size}|${this.#outstanding}`;
  }

  /**
   * The engine's bookkeeping, for stall reports: counters of the control block, what each
   * worker is doing, slot states, pending and ready batches of the consumer's epoch.
   */
  debugState(plan?: EpochPlan): Record<string, unknown> {
    const ctl = this.#ctl;
    const L = this.#layout;
    const out: Record<string, unknown> = {
      numWorkers: this.#cfg.numWorkers,
      outstanding: this.#outstanding,
      pending: [...this.#pending.keys()].slice(0, 32),
      ready: [...this.#results.keys()].slice(0, 32),
      slots: this.#cfg.slotState ? Array.from(this.#cfg.slotState) : undefined,
      plans: this.#plans.map((p) => ({
        epoch: p.epoch,
        startSeq: p.startSeq,
        batches: p.batches.length,
        dispatched: p.dispatched,
        yielded: p.yielded,
        abandoned: p.abandoned,
      })),
    };
    if (plan) out.due = plan.startSeq + plan.yielded;
    if (ctl && L) {
      out.control = {
        doorbell: ctl[C_DOORBELL],
        stop: ctl[C_STOP],
        claimed: ctl[C_CLAIM],
        published: ctl[C_PUBLISHED],
        freeHead: ctl[C_FREE_HEAD],
        freeTail: ctl[C_FREE_TAIL],
        skipBelow: ctl[C_SKIP_BELOW],
      };
      out.workers = Array.from({ length: this.#cfg.numWorkers }, (_, w) => ({
        state: WORKER_STATES[ctl[L.worker + 2 * w]] ?? ctl[L.worker + 2 * w],
        done: ctl[L.worker + 2 * w + 1],
      }));
    } else {
      out.workers = this.#workers.map((w) => ({ alive: w.alive, outstanding: w.outstanding }));
    }
    return out;
  }

  #hasDue(plan: EpochPlan): boolean {
    if (this.#cfg.inOrder) return this.#results.has(plan.startSeq + plan.yielded);
    for (const seq of this.#results.keys()) {
      if (seq >= plan.startSeq && seq < plan.startSeq + plan.batches.length) return true;
    }
    return false;
  }

  #readyCount(plan: EpochPlan): number {
    let n = 0;
    for (const r of this.#results.values()) if (r.epoch === plan.epoch) n++;
    return n;
  }

  #take(plan: EpochPlan): Result | undefined {
    if (this.#cfg.inOrder) {
      const seq = plan.startSeq + plan.yielded;
      const r = this.#results.get(seq);
      if (r) this.#results.delete(seq);
      return r;
    }
    for (const [seq, r] of this.#results) {
      if (seq >= plan.startSeq && seq < plan.startSeq + plan.batches.length) {
        this.#results.delete(seq);
        return r;
      }
    }
    return undefined;
  }

  #checkStarved(plan: EpochPlan): void {
    if (!this.#cfg.ring) return;
    if (this.#ctl) {
      const state = this.#cfg.slotState!;
      if (state.every((s) => s === SLOT_CONSUMER) && !this.#hasDue(plan)) {
        throw new Error(
          `Cannot get batch ${plan.yielded} of epoch ${plan.epoch}: all ${state.length} ring ` +
            `slots are held by the consumer (${state.length} unreleased batches); call ` +
            "release() on batches you are done with, or raise the heldBatches option",
        );
      }
      return;
    }
    if (this.#pending.size > 0) return;
    if (plan.dispatched >= plan.batches.length) return;
    if (this.#freeSlot() >= 0) return;
    const state = this.#cfg.slotState!;
    let held = 0;
    for (const s of state) if (s === SLOT_CONSUMER) held++;
    if (held === state.length || this.#results.size === 0) {
      throw new Error(
        `Cannot get batch ${plan.yielded} of epoch ${plan.epoch}: all ${state.length} ring ` +
          `slots are held by the consumer (${held} unreleased batches); call release() on ` +
          "batches you are done with, or raise the heldBatches option",
      );
    }
  }

  /** Waits for a promise from get() at most until the `timeout` deadline of this batch. */
  async #withDeadline<T>(p: Promise<T>, t0: number, b: number, plan: EpochPlan): Promise<T> {
    const limit = this.#cfg.timeout;
    if (!(limit > 0)) return await p;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(timeoutError(b, plan.epoch, limit, "numWorkers 0: get() did not settle")),
        Math.max(0, t0 + limit * 1000 - performance.now()),
      );
    });
    try {
      return await Promise.race([p, expired]);
    } finally {
      clearTimeout(timer);
    }
  }

  #checkDeadline(t0: number, b: number, plan: EpochPlan): void {
    const limit = this.#cfg.timeout;
    if (limit > 0 && performance.now() - t0 > limit * 1000) {
      throw timeoutError(b, plan.epoch, limit, "numWorkers 0: get() returned after the deadline");
    }
  }

  async #loadInline(plan: EpochPlan): Promise<Result> {
    const cfg = this.#cfg;
    const b = plan.yielded;
    const seq = plan.startSeq + b;
    const indices = plan.batches[b];
    const pos = plan.positions[b];
    const t0 = performance.now();
    let result: Result;
    if (cfg.ring) {
      const slot = this.#freeSlot();
      if (slot < 0) {
        this.#checkStarved(plan);
        throw new Error("Cannot get a batch: no free ring slot");
      }
      (cfg.ring.view(slot, "indices", indices.length) as Int32Array).set(indices);
      try {
        this.#gatherer!.gather(slot, indices.length, plan.epoch, pos);
      } catch (e) {
        throw sampleError(
          e instanceof SampleError ? e.index : -1,
          b,
          plan.epoch,
          -1,
          errorFields(e),
        );
      }
      result = { kind: "slot", seq, slot, epoch: plan.epoch, batch: b, size: indices.length };
    } else {
      const deadline = {
        wait: <T>(p: Promise<T>) => this.#withDeadline(p, t0, b, plan),
        check: () => this.#checkDeadline(t0, b, plan),
      };
      const at = { seed: cfg.seed, epoch: plan.epoch, position: pos, workerId: -1 };
      let samples: unknown[];
      try {
        samples = await fetchSamples(cfg.dataset, indices, at, deadline);
      } catch (e) {
        if (!(e instanceof SampleFailure)) throw e;
        throw sampleError(e.index, b, plan.epoch, -1, errorFields(e.thrown));
      }
      let value: unknown = samples;
      const mode = cfg.collateMode;
      if (mode === "default") value = defaultCollate(samples);
      else if (typeof mode === "object") {
        this.#mainCollate ??= (await resolveRef(mode)) as (s: unknown[]) => unknown;
        value = this.#mainCollate(samples);
      }
      result = { kind: "value", seq, value, epoch: plan.epoch, batch: b, size: indices.length };
    }
    plan.dispatched = Math.max(plan.dispatched, b + 1);
    plan.yielded++;
    const dt = performance.now() - t0;
    this.busyMs += dt;
    cfg.onWait(dt / 1000, 0);
    return result;
  }
}
