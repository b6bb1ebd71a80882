// The workers of both worker transports: starting them, holding messages until each listens,
// and turning a crash, an unexpected exit, an out-of-memory stop (reported by the worker's
// heap guard, or found by the liveness probe) or a failed start into the loader's failure.
// Batch results ("b", "e") go to the transport that owns the pool.

import { Worker as NodeWorker } from "node:worker_threads";
import type { FromWorker, InitMessage, ToWorker } from "./_protocol.ts";
import { hash4, seedWords, STREAM_WORKER } from "../internal/random.ts";
import { type EngineConfig, WorkerError } from "./_transport.ts";

// The liveness probe. When V8 stops a worker at its heap limit inside a task, Deno 2.9
// reports nothing (no 'error', no 'exit'): it ends the running call and the worker's event
// loop goes on, its task lost. So a worker that holds work and has sent nothing for PROBE_MS
// gets a ping; its answer says whether a synchronous dataset call is still marked as
// running, which an event handler can only see when that call was ended from outside
// (syncCall in _fetch.ts). A worker still inside the call answers when it returns.
// Depending on where V8 ended the call, the worker may answer nothing ever again: one that
// leaves a ping unanswered for SILENT_MS and used no CPU time meanwhile is taken for stopped
// too (a get() blocked that long in one synchronous call, using no CPU, would be as well).
const PROBE_MS = 500;
const SILENT_MS = 5000;

let liveWorkers = 0;
/** Workers started by any DataLoader and not yet terminated. */
export function liveWorkerCount(): number {
  return liveWorkers;
}

export interface WorkerHandle {
  id: number;
  worker: NodeWorker;
  /** Batches sent to this worker and not yet back (push transport). */
  outstanding: number;
  alive: boolean;
  /**
   * Messages held until the worker says "hello". A node worker drops messages that arrive
   * before it listens, and one started through the network bootstrap listens only once its
   * module has been fetched.
   */
  backlog: { m: ToWorker; transfer?: Transferable[] }[] | undefined;
  /** performance.now() of its last message. */
  lastHeard: number;
  /** performance.now() when the unanswered ping went out (-1: none). */
  pingedAt: number;
  /** Its CPU time (user + system, microseconds) when the ping went out, once read. */
  cpuAtPing: number;
  /** Its CPU time at the last probe (-1: not read yet). */
  cpuNow: number;
}

/** What the liveness probe needs of a transport. */
export interface InFlight {
  /** Whether `w` holds work (a batch sent and not back, a task taken). */
  busy(w: WorkerHandle): boolean;
  /** "batch B of epoch E (samples ...)" for a batch in flight. */
  describe(seq: number): string;
  /** What `w` is loading, described as by `describe`. */
  holding(w: WorkerHandle): string;
}

interface CpuUsage {
  user: number;
  system: number;
}

/** "batch B of epoch E (samples i, j, ...)", at most 16 indices. */
export function describeBatch(
  batch: number,
  epoch: number,
  indices: ArrayLike<number>,
): string {
  const shown = Array.from(indices).slice(0, 16).join(", ");
  const more = indices.length > 16 ? `, ... ${indices.length - 16} more` : "";
  return `batch ${batch} of epoch ${epoch} (samples ${shown}${more})`;
}

/** A batch's result from a worker: its value ("b") or its error ("e"). */
export type BatchMessage = Extract<FromWorker, { t: "b" } | { t: "e" }>;

/** The fields of a worker's init message that depend on the transport. */
export type TransportInit = Pick<InitMessage, "control" | "slots" | "tasks" | "batch">;

/** `numWorkers` node workers, each started with `init` and reporting results to `onBatch`. */
export class WorkerPool {
  readonly workers: WorkerHandle[] = [];
  #cfg: EngineConfig;
  #fail: (error: Error) => void;
  #onBatch: (w: WorkerHandle, msg: BatchMessage) => void;
  #inFlight: InFlight;
  #probe: ReturnType<typeof setInterval>;
  #stopped = false;

  constructor(
    cfg: EngineConfig,
    init: TransportInit,
    onBatch: (w: WorkerHandle, msg: BatchMessage) => void,
    fail: (error: Error) => void,
    inFlight: InFlight,
  ) {
    this.#cfg = cfg;
    this.#onBatch = onBatch;
    this.#fail = fail;
    this.#inFlight = inFlight;
    for (let id = 0; id < cfg.numWorkers; id++) this.#start(id, init);
    this.#probe = setInterval(() => this.#ping(), PROBE_MS);
    // The probe alone never keeps the process alive.
    Deno.unrefTimer(this.#probe);
  }

  /** The liveness probe's tick: a ping to each worker that holds work and went quiet. */
  #ping(): void {
    const now = performance.now();
    for (const w of this.workers) {
      // A worker still starting holds its messages in the backlog.
      if (!w.alive || w.backlog || now - w.lastHeard < PROBE_MS) continue;
      if (!this.#inFlight.busy(w)) continue;
      this.#readCpu(w);
      if (w.pingedAt < 0) {
        w.pingedAt = now;
        w.cpuAtPing = w.cpuNow;
        this.send(w, { t: "ping" });
      } else if (
        now - w.pingedAt >= SILENT_MS && w.cpuAtPing >= 0 && w.cpuNow === w.cpuAtPing
      ) {
        return this.#fail(this.#silentError(w, now - w.pingedAt));
      }
    }
  }

  /** Reads the worker's CPU time into cpuNow (it arrives after this tick). */
  #readCpu(w: WorkerHandle): void {
    const worker = w.worker as unknown as {
      cpuUsage?: () => CpuUsage | Promise<CpuUsage>;
    };
    if (typeof worker.cpuUsage !== "function") return;
    try {
      Promise.resolve(worker.cpuUsage()).then((u) => {
        w.cpuNow = u.user + u.system;
        if (w.cpuAtPing < 0 && w.pingedAt >= 0) w.cpuAtPing = w.cpuNow;
      }, () => {});
    } catch {
      // No CPU figure: without it a silent worker is never taken for stopped.
    }
  }

  #silentError(w: WorkerHandle, ms: number): Error {
    const mb = this.#cfg.resourceLimits.maxOldGenerationSizeMb;
    const what = this.#inFlight.holding(w);
    return new Error(
      `Cannot load batches: DataLoader worker ${w.id} stopped while loading ${what}: for ` +
        `${(ms / 1000).toFixed(1)} s it used no CPU time and answered nothing, as when V8 ` +
        `ends it at its heap limit (${mb} MB, workerResourceLimits.maxOldGenerationSizeMb); ` +
        "the worker was stopped, the process goes on. Raise the limit, or find what one " +
        "sample allocates without bound",
    );
  }

  #start(id: number, transportInit: TransportInit): void {
    const cfg = this.#cfg;
    // node:worker_threads, not Web Workers: in Deno 2.9 a Web Worker's terminate() does not
    // stop a worker stuck in a JavaScript loop, and the process then never exits
    // (denoland/deno#35657); a node worker's does. And a Web Worker that runs out of heap
    // aborts the whole process, where a node worker with resourceLimits dies alone with
    // ERR_WORKER_OUT_OF_MEMORY. A node worker takes file: and data: URLs only, so a module
    // loaded from the network (a JSR import) starts through a one-line bootstrap.
    // `env: {}`: node's default copies process.env into each worker, which reads the whole
    // environment and so asks for env permission once per worker where it is not granted.
    // Workers read no process.env (Deno.env is process-wide and permission-checked as usual).
    const url = new URL("./worker.ts", import.meta.url);
    const options = { resourceLimits: cfg.resourceLimits, env: {} };
    const worker = url.protocol === "file:"
      ? new NodeWorker(url, options)
      : new NodeWorker(`import(${JSON.stringify(url.href)});`, { ...options, eval: true });
    liveWorkers++;
    const handle: WorkerHandle = {
      id,
      worker,
      outstanding: 0,
      alive: true,
      backlog: [],
      lastHeard: performance.now(),
      pingedAt: -1,
      cpuAtPing: -1,
      cpuNow: -1,
    };
    this.workers.push(handle);
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
      // the worker announced ("x" message) was reported already (the engine keeps the first).
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
      drawStride: cfg.order.drawStride,
      // PyTorch draws a new base seed for each iterator: workers started for one epoch get
      // seeds of their own, persistent workers keep theirs (their generators go on).
      workerSeed: hash4(
        lo,
        hi,
        id,
        cfg.persistent ? STREAM_WORKER : hash4(STREAM_WORKER, cfg.firstEpoch, 0, 0),
      ),
      gather: cfg.gather,
      ...transportInit,
      // The zero-copy path maps shared fields only, unless the dataset fills fields itself.
      dataset: cfg.gather && !cfg.gather.filled?.length ? undefined : cfg.workerSpec,
      collate: cfg.collateMode === "main" ? "none" : cfg.collateMode,
      unbatched: cfg.unbatched,
      workerInit: cfg.workerInit,
      heapLimitMb: cfg.resourceLimits.maxOldGenerationSizeMb,
    };
    this.send(handle, init);
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

  /** Posts `m` to the worker, or holds it until the worker listens. */
  send(w: WorkerHandle, m: ToWorker, transfer?: Transferable[]): void {
    if (w.backlog) w.backlog.push({ m, transfer });
    else w.worker.postMessage(m, transfer as never[]);
  }

  #onMessage(w: WorkerHandle, msg: FromWorker): void {
    if (this.#stopped) return;
    w.lastHeard = performance.now();
    w.pingedAt = -1;
    switch (msg.t) {
      case "hello": {
        const backlog = w.backlog ?? [];
        w.backlog = undefined;
        try {
          for (const { m, transfer } of backlog) w.worker.postMessage(m, transfer as never[]);
        } catch (err) {
          // A value postMessage cannot clone (the constructor refuses the known ones): a
          // loader error, not an exception thrown out of this event handler.
          this.#fail(
            new Error(`Cannot load batches: DataLoader worker ${w.id} could not be sent its work`, {
              cause: err,
            }),
          );
        }
        return;
      }
      case "ready":
        return;
      case "pong":
        return;
      case "killed": {
        const mb = this.#cfg.resourceLimits.maxOldGenerationSizeMb;
        const call = msg.index >= 0 ? `get(${msg.index})` : msg.call;
        return this.#fail(
          new Error(
            `Cannot load batches: DataLoader worker ${w.id} stopped while loading ` +
              `${this.#inFlight.describe(msg.seq)}: V8 ended its ${call} at the worker's heap ` +
              `limit (${mb} MB, workerResourceLimits.maxOldGenerationSizeMb); the worker was ` +
              "stopped, the process goes on. Raise the limit, or find what that call " +
              "allocates without bound",
          ),
        );
      }
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
      case "e":
      case "b":
        return this.#onBatch(w, msg);
    }
  }

  /** Terminates every worker, even one inside a JavaScript loop. Idempotent. */
  stop(): void {
    this.#stopped = true;
    clearInterval(this.#probe);
    for (const w of this.workers) {
      if (!w.alive) continue;
      w.alive = false;
      w.worker.removeAllListeners();
      // An 'error' event with no listener would be thrown on the main thread.
      w.worker.on("error", () => {});
      // Stops the worker's thread even inside a JavaScript loop (see #start).
      w.worker.terminate().catch(() => {});
      liveWorkers--;
    }
  }
}
