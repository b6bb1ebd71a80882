// Over 800 lines: one class whose every collective exists blocking and asynchronous, each with
// its documentation and runnable example.
/**
 * `ProcessGroup`: the processes of a data-parallel job and their collectives (all-reduce,
 * broadcast, all-gather, reduce-scatter, barrier) over MPI, each blocking or asynchronous.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { addr, resolve } from "./_buffers.ts";
import { Work } from "./work.ts";
import { handleValue, mpiErrorString, type MpiLibrary, openMpi, readHandle } from "./_mpi.ts";
import type { Handle } from "./_mpi_symbols.ts";
import {
  type CommJob,
  COMPLETED,
  describeSignature,
  DIRECT_OP,
  DIRECT_SEQ,
  ISSUED,
  MISMATCH,
  OPS,
  PROGRESS_INTS,
  SIG_INTS,
  SLOTS,
  USER_DTYPES,
} from "./_protocol.ts";
import { runJob } from "./_run_job.ts";
import { type LaunchEnv, launchEnv } from "./launch_env.ts";
import { diagnoseTimeout, Responder } from "./_watchdog.ts";
import { JobRing } from "./_ring.ts";
import { type NcclLibrary, openNccl } from "./_nccl.ts";
import { NcclComm } from "./_nccl_comm.ts";
import { Tensor } from "../ffi/tensor.ts";
import type { Device } from "../ffi/device.ts";
import { rendezvous, stopRendezvous } from "./_rendezvous.ts";

/** The memory a collective reads and writes: a typed array (any backing) or a cpu tensor. */
export type CollectiveBuffer = Float32Array | Float16Array | Int32Array | Tensor;

/** A collective's name. */
export type CollectiveOp = "allReduce" | "broadcast" | "allGather" | "reduceScatter" | "barrier";

/** A reduction: `"avg"` is the sum divided by the group's size. */
export type ReduceOp = "sum" | "avg" | "max" | "min";

/** Options of {@linkcode ProcessGroup.init}. */
export interface ProcessGroupOptions {
  /**
   * The collective engine: "mpi" (the default) for host and cpu-device memory; "nccl" adds
   * NCCL for CUDA tensors (host memory still goes over MPI, which also carries NCCL's unique
   * id). See docs/distributed.md.
   */
  backend?: "mpi" | "nccl";
  /**
   * How long a collective may wait for the other ranks before the group gives up and names
   * the ranks that did not arrive (default 30 minutes, as PyTorch's DDP): a wait on an
   * asynchronous collective throws; a blocking collective that ran on the calling thread (see
   * the class documentation) cannot be interrupted inside MPI, so the error is printed and
   * the process exits with status 1, as NCCL's watchdog ends a job.
   */
  timeoutMs?: number;
  /**
   * Check before every collective that all ranks issue the same one (op, dtype, count, root)
   * and throw naming the difference, instead of deadlocking or mixing buffers (default: the
   * `PINSTREAM_DIST_DEBUG=1` environment variable). Costs one small all-gather a collective.
   */
  debug?: boolean;
  /** The environment to read the launcher's variables from (default `Deno.env.get`). */
  env?: (name: string) => string | undefined;
  /**
   * The nccl backend's CUDA device: the communicator is made at once on it (by default, on
   * the device of the first collective's CUDA tensor). Needed in a torchrun-style launch
   * (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, no MPI), where NCCL also carries the
   * collectives on host memory.
   */
  device?: Device;
}

/** Options of the reductions. */
export interface ReduceOptions {
  /** The reduction (default "sum"). */
  op?: ReduceOp;
}

/** Options of {@linkcode ProcessGroup.broadcast}. */
export interface BroadcastOptions {
  /** The rank whose buffer is sent (default 0). */
  root?: number;
}

/** The default collective timeout (PyTorch's DDP default). */
export const DEFAULT_TIMEOUT_MS = 30 * 60 * 1000;

/**
 * The processes of a job and their collectives (PyTorch's `torch.distributed` process
 * group). Create it once a process with {@linkcode ProcessGroup.init}: it reads the rank and
 * size from the launcher (`mpirun` of Open MPI or MPICH; see {@linkcode launchEnv}) and
 * initializes MPI with `MPI_THREAD_MULTIPLE`. A process started without a launcher is rank 0
 * of a group of 1, which needs no MPI.
 *
 * Every collective exists blocking (`allReduce`) and asynchronous (`allReduceAsync`, returning
 * a {@linkcode Work}). All ranks must issue the same collectives in the same order. The
 * asynchronous ones run in that order on the group's communication thread, so they overlap
 * with whatever the main thread does until its `wait`. A blocking one waits behind those
 * still in flight; with none in flight the calling thread runs it itself, at the speed of a C
 * program calling MPI.
 *
 * Half-precision reductions are computed in fp32 (MPI has no half type): the values are
 * widened, reduced and rounded once, which is both more accurate than summing in fp16 and
 * free of a user-defined MPI operation, which would call back into JavaScript from MPI's
 * thread. Broadcast and all-gather move fp16 as bytes.
 *
 * @example A group of one
 * ```ts
 * import { ProcessGroup } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using group = ProcessGroup.init();
 * assert.deepStrictEqual([group.rank, group.size], [0, 1]);
 * const out = new Float32Array(2);
 * group.allGather(new Float32Array([3, 4]), out);
 * assert.deepStrictEqual([...out], [3, 4]);
 * ```
 */
export class ProcessGroup implements Disposable {
  /** This process's rank. */
  readonly rank: number;
  /** The number of processes. */
  readonly size: number;
  /** The collective engine. */
  readonly backend: "mpi" | "nccl";
  /** The MPI library in use ("openmpi" or "mpich"), or null in a group of one. */
  readonly mpi: "openmpi" | "mpich" | null;
  /** The collective timeout. */
  readonly timeoutMs: number;
  /** Whether every collective's signature is checked across ranks first. */
  readonly debug: boolean;
  #lib: MpiLibrary | null = null;
  #comm: Handle | null = null;
  #watchComm: Handle | null = null;
  #worker: Worker | null = null;
  #ring = new JobRing();
  #responder: Responder | null = null;
  #results = new Int32Array(new SharedArrayBuffer(SLOTS * 2 * 4));
  #sigs: Int32Array;
  /**
   * [issued, completed] MPI collectives, then NCCL ones, read by the watchdog responder; then
   * the MPI collective this thread runs itself (see _protocol.ts).
   */
  #progress = new Int32Array(new SharedArrayBuffer(PROGRESS_INTS * 4));
  #seq = 0;
  #failed: Error | null = null;
  #disposed = false;
  #ownsInit = false;
  #onUnload: (() => void) | null = null;
  #ncclLib: NcclLibrary | null = null;
  #nccl: NcclComm | null = null;
  /** A torchrun-style launch's rendezvous address (nccl backend, no MPI). */
  #master: { addr: string; port: number } | null = null;

  private constructor(
    env: LaunchEnv,
    options: { backend: "mpi" | "nccl"; timeoutMs: number; debug: boolean },
  ) {
    this.rank = env.rank;
    this.size = env.size;
    this.backend = options.backend;
    this.timeoutMs = options.timeoutMs;
    this.debug = options.debug;
    this.#sigs = new Int32Array(new SharedArrayBuffer(env.size * SIG_INTS * 4));
    if (env.launcher === "none") {
      this.mpi = null;
      return;
    }
    if (env.launcher === "torchrun" && (options.backend === "nccl" || env.size === 1)) {
      if (env.size > 1 && env.master === null) {
        throw new Error(
          `Cannot create a ProcessGroup: RANK/WORLD_SIZE say rank ${env.rank} of ${env.size}, ` +
            `but MASTER_ADDR and MASTER_PORT, where the ranks meet, are not set`,
        );
      }
      this.mpi = null;
      this.#master = env.master;
      return;
    }
    if (env.launcher === "torchrun") {
      throw new Error(
        `Cannot create a ProcessGroup: RANK/WORLD_SIZE say rank ${env.rank} of ${env.size}, ` +
          `but the mpi backend needs MPI's launcher: start the job with mpirun -n ${env.size} ` +
          `(or deno task launch), or use the nccl backend`,
      );
    }
    const lib = openMpi({ flavor: env.launcher });
    this.#lib = lib;
    this.mpi = lib.flavor;
    this.#initMpi(lib, env);
    this.#worker = new Worker(new URL("./_comm_worker.ts", import.meta.url), { type: "module" });
    this.#worker.postMessage({
      path: lib.path,
      flavor: lib.flavor,
      comm: handleValue(this.#comm!),
      watchComm: handleValue(this.#watchComm!),
      rank: this.rank,
      size: this.size,
      timeoutMs: this.timeoutMs,
      debug: this.debug,
      ring: this.#ring.memory,
      results: this.#results.buffer,
      sigs: this.#sigs.buffer,
      progress: this.#progress.buffer,
    });
    this.#responder = new Responder(lib, this.#watchComm!, this.rank, this.#progress);
    // A rank that exits while still in the job makes the launcher stop the others, and some
    // launchers (MPICH's) name only a pid: this line names the rank.
    this.#onUnload = () => {
      if (this.#disposed) return;
      console.error(
        `pinstream: rank ${this.rank} of ${this.size} exits (status ${Deno.exitCode}) ` +
          `without leaving its process group: the launcher stops the other ranks`,
      );
    };
    globalThis.addEventListener("unload", this.#onUnload);
  }

  #initMpi(lib: MpiLibrary, env: LaunchEnv): void {
    const f = lib.fn;
    const flag = new Int32Array(1);
    this.#check(f.MPI_Initialized(flag), "check whether MPI is initialized");
    if (!flag[0]) {
      const provided = new Int32Array(1);
      // MPI_THREAD_MULTIPLE is 3 in both families: the communication and watchdog threads
      // call MPI beside the main thread.
      this.#check(f.MPI_Init_thread(null, null, 3, provided), "initialize MPI");
      this.#ownsInit = true;
      if (provided[0] < 3) {
        throw new Error(
          `Cannot create a ProcessGroup: ${lib.path} provides thread level ${provided[0]}, ` +
            `not MPI_THREAD_MULTIPLE (3)`,
        );
      }
    }
    // Failures come back as codes, turned into errors here, rather than aborting the job.
    this.#check(f.MPI_Comm_set_errhandler(lib.c.commWorld, lib.c.errorsReturn), "set errors");
    const rank = new Int32Array(1), size = new Int32Array(1);
    this.#check(f.MPI_Comm_rank(lib.c.commWorld, rank), "read the rank");
    this.#check(f.MPI_Comm_size(lib.c.commWorld, size), "read the size");
    if (rank[0] !== env.rank || size[0] !== env.size) {
      throw new Error(
        `Cannot create a ProcessGroup: ${lib.path} says rank ${rank[0]} of ${size[0]}, the ` +
          `launcher's environment rank ${env.rank} of ${env.size} (is the library from the ` +
          `same MPI as mpirun?)`,
      );
    }
    // Own communicators: the group's collectives never interleave with other MPI users of
    // the world communicator, and the watchdog's messages never with the collectives.
    const out = new BigUint64Array(1);
    this.#check(f.MPI_Comm_dup(lib.c.commWorld, out), "duplicate the world communicator");
    this.#comm = readHandle(lib, out);
    this.#check(f.MPI_Comm_dup(lib.c.commWorld, out), "duplicate the world communicator");
    this.#watchComm = readHandle(lib, out);
  }

  #check(rc: number, action: string): void {
    if (rc !== 0) throw new Error(`Cannot ${action}: ${mpiErrorString(this.#lib!, rc)}`);
  }

  /**
   * Joins the job this process was launched into (see the class documentation).
   *
   * @param options Backend, timeout, debug mode.
   * @returns The group.
   * @throws {Error} When MPI is needed but absent (naming what to install), or fails to
   *   initialize.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using group = ProcessGroup.init({ timeoutMs: 60_000 });
   * assert.strictEqual(group.rank, 0);
   * ```
   */
  static init(options: ProcessGroupOptions = {}): ProcessGroup {
    refuseUnknownKeys(
      options ?? {},
      ["backend", "timeoutMs", "debug", "env", "device"],
      "create a group",
    );
    const backend = options.backend ?? "mpi";
    if (backend !== "mpi" && backend !== "nccl") {
      throw new TypeError(
        `Cannot create a ProcessGroup: unknown backend ${JSON.stringify(backend)}`,
      );
    }
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
      throw new RangeError(`Cannot create a ProcessGroup: timeoutMs must be > 0, got ${timeoutMs}`);
    }
    const env = options.env ?? ((n: string) => Deno.env.get(n));
    const debug = options.debug ?? env("PINSTREAM_DIST_DEBUG") === "1";
    // The library first: a missing NCCL fails before MPI starts.
    const lib = backend === "nccl" ? openNccl() : null;
    const where = launchEnv(env);
    if (where.launcher === "torchrun" && where.size > 1 && backend === "nccl" && !options.device) {
      throw new TypeError(
        `Cannot create a ProcessGroup: a torchrun-style launch of the nccl backend needs ` +
          `{ device }, the CUDA device of this rank (NCCL carries its host collectives too)`,
      );
    }
    let group: ProcessGroup;
    try {
      group = new ProcessGroup(where, { backend, timeoutMs, debug });
    } catch (err) {
      lib?.close();
      throw err;
    }
    group.#ncclLib = lib;
    if (options.device) {
      try {
        group.#connect(options.device, "create a group");
      } catch (err) {
        group.dispose();
        throw err;
      }
    }
    return group;
  }

  /** Whether host memory goes over NCCL: a torchrun-style launch of several ranks. */
  get #staged(): boolean {
    return this.#master !== null && this.size > 1;
  }

  /** The NCCL communicator for `t`'s device, made by the first collective on a CUDA tensor. */
  #device(t: CollectiveBuffer, action: string): NcclComm | null {
    if (!(t instanceof Tensor) || t.device.kind !== "cuda") return null;
    this.#usable(action);
    if (this.#ncclLib === null) {
      throw new TypeError(
        `Cannot ${action}: the tensor is on ${t.device}; the mpi backend reduces host memory ` +
          `and cpu tensors: create the group with { backend: "nccl" } for CUDA tensors`,
      );
    }
    return this.#connect(t.device, action);
  }

  /** The NCCL communicator on `device`, made on first use. */
  #connect(device: Device, action: string): NcclComm {
    if (this.#nccl !== null) {
      if (String(this.#nccl.device) !== String(device)) {
        throw new TypeError(
          `Cannot ${action}: the tensor is on ${device}, the group's NCCL communicator on ` +
            `${this.#nccl.device} (one device a process)`,
        );
      }
      return this.#nccl;
    }
    if (this.#ncclLib === null) {
      throw new TypeError(`Cannot ${action}: a device is for the nccl backend`);
    }
    // Rank 0 makes the id; MPI, or the TCP rendezvous of a torchrun-style launch, carries it
    // to the others (every rank reaches this point in the same collective).
    const id = this.rank === 0 ? NcclComm.uniqueId(this.#ncclLib) : new Uint8Array(128);
    if (this.#staged) rendezvous(this.#master!, this.rank, this.size, id, this.timeoutMs);
    else if (this.size > 1) this.broadcast(new Int32Array(id.buffer), { root: 0 });
    this.#nccl = new NcclComm(this.#ncclLib, device, this.rank, this.size, id, {
      timeoutMs: this.timeoutMs,
      debug: this.debug,
      progress: this.#progress,
      // Past the timeout, the MPI watchdog asks the other ranks how far their NCCL got.
      diagnose: this.#lib === null
        ? null
        : (seq, op) =>
          diagnoseTimeout(this.#lib!, this.#watchComm!, {
            rank: this.rank,
            size: this.size,
            seq,
            op,
            timeoutMs: this.timeoutMs,
            engine: "nccl",
          }),
    });
    return this.#nccl;
  }

  /**
   * @internal All-reduces CUDA tensors in place as one NCCL group (DataParallel's buckets).
   *
   * @param tensors Tensors on the group's CUDA device.
   * @param op The reduction.
   * @returns The collective in flight.
   */
  _allReduceTensorsAsync(tensors: readonly Tensor[], op: ReduceOp): Work {
    const action = "all-reduce";
    if (tensors.length === 0) return this.barrierAsync();
    return this.#device(tensors[0], action)!.allReduce(tensors, op, action);
  }

  #usable(action: string): void {
    if (this.#disposed) throw new TypeError(`Cannot ${action}: the process group was disposed`);
    if (this.#failed) {
      throw new Error(`Cannot ${action}: the group failed earlier: ${this.#failed.message}`);
    }
  }

  /** Issues one collective; `finish` runs once it completed (fp16 rounding, averaging). */
  #issue(
    job: Omit<CommJob, "seq">,
    finish: (() => void) | null,
    keep: unknown,
  ): Work {
    const seq = this.#seq++;
    const work = new Work(this, seq, job.op, finish, keep);
    if (this.#worker === null) {
      // A group of one: the result is the input, already in place.
      work.waitSync();
      return work;
    }
    const slot = (seq % SLOTS) * 2;
    Atomics.store(this.#results, slot, 0);
    Atomics.store(this.#progress, ISSUED, seq + 1);
    if (!job.async && Atomics.load(this.#progress, COMPLETED) === seq) {
      // Nothing in flight: this thread, which would only wait, runs the collective itself,
      // as fast as a C program calling MPI (a hand-off to the communication thread and
      // back costs two thread wake-ups, a tenth of a 1 MiB all-reduce). The communication
      // thread, idle, watches it for the timeout.
      const p = this.#progress;
      Atomics.store(p, DIRECT_OP, OPS.indexOf(job.op));
      Atomics.store(p, DIRECT_SEQ, seq + 1);
      let status: number;
      try {
        status = runJob(this.#lib!, this.#comm!, { ...job, seq }, this.debug ? this.#sigs : null);
      } catch {
        status = -3;
      }
      Atomics.store(p, DIRECT_SEQ, 0);
      Atomics.store(p, COMPLETED, seq + 1);
      Atomics.store(this.#results, slot + 1, status);
      Atomics.store(this.#results, slot, 1);
      return work;
    }
    // Behind collectives still in flight, or asynchronous: the communication thread runs it
    // in issue order, and a blocked main thread stays free to run the watchdog.
    if (!this.#ring.push({ ...job, seq }, this.timeoutMs)) this.#timedOut(work);
    return work;
  }

  /** @internal Whether `work` ran on the communication thread. */
  _query(work: Work): boolean {
    if (this.#worker === null) return true;
    return Atomics.load(this.#results, (work.seq % SLOTS) * 2) === 1;
  }

  /** @internal Blocks until `work` finished or the timeout passed; returns its status. */
  _waitSync(work: Work): number {
    if (this.#worker === null) return 0;
    const slot = (work.seq % SLOTS) * 2;
    const r = Atomics.wait(this.#results, slot, 0, this.timeoutMs);
    if (r === "timed-out") this.#timedOut(work);
    return this.#collect(slot);
  }

  /** @internal Waits without blocking until `work` finished or the timeout passed. */
  async _wait(work: Work): Promise<number> {
    if (this.#worker === null) return 0;
    const slot = (work.seq % SLOTS) * 2;
    const w = Atomics.waitAsync(this.#results, slot, 0, this.timeoutMs);
    const r = w.async ? await w.value : w.value;
    if (r === "timed-out") this.#timedOut(work);
    return this.#collect(slot);
  }

  #collect(slot: number): number {
    return Atomics.load(this.#results, slot + 1);
  }

  #timedOut(work: Work): never {
    const why = diagnoseTimeout(this.#lib!, this.#watchComm!, {
      rank: this.rank,
      size: this.size,
      seq: work.seq,
      op: work.op,
      timeoutMs: this.timeoutMs,
    });
    this.#failed = new Error(why);
    throw this.#failed;
  }

  /** @internal The error of a failed collective (and the group is unusable after it). */
  _failure(work: Work, status: number): Error {
    let msg: string;
    if (status === MISMATCH) {
      const lines: string[] = [];
      for (let r = 0; r < this.size; r++) {
        lines.push(`rank ${r}: ${describeSignature(this.#sigs.subarray(r * SIG_INTS))}`);
      }
      msg = `Cannot run ${work.op} #${work.seq}: the ranks issued different collectives ` +
        `(${lines.join("; ")})`;
    } else {
      msg = `Cannot run ${work.op} #${work.seq} on rank ${this.rank}: ` +
        (status === -3 ? "the communication thread failed" : mpiErrorString(this.#lib!, status));
    }
    this.#failed = new Error(msg);
    return this.#failed;
  }

  // ---- the collectives

  #reduce(action: string, buf: CollectiveBuffer, options: ReduceOptions, async: boolean): Work {
    this.#usable(action);
    refuseUnknownKeys(options ?? {}, ["op"], action);
    const op = options.op ?? "sum";
    if (!["sum", "avg", "max", "min"].includes(op)) {
      throw new TypeError(`Cannot ${action}: op must be sum, avg, max or min, got ${String(op)}`);
    }
    const dev = this.#device(buf, action);
    if (dev) return dev.allReduce([buf as Tensor], op, action);
    const b = resolve(buf, action, "the buffer");
    if (op === "avg" && b.dtype === "i32") {
      throw new TypeError(`Cannot ${action}: avg of i32 would round; reduce with sum instead`);
    }
    if (this.#staged) return this.#nccl!.host("allReduce", b, null, op, 0);
    const n = this.size;
    // fp16 is reduced as fp32 in a scratch array (see the class documentation).
    const wide = b.dtype === "f16" ? Float32Array.from(b.view as Float16Array) : null;
    const target = wide ?? (b.view as Float32Array | Int32Array);
    const finish = wide || op === "avg"
      ? () => {
        if (op === "avg") {
          const t = target as Float32Array;
          for (let i = 0; i < t.length; i++) t[i] /= n;
        }
        if (wide) b.view.set(wide);
      }
      : null;
    return this.#issue(
      {
        op: "allReduce",
        send: 0n,
        recv: wide ? addr(wide) : b.ptr,
        inPlace: true,
        count: b.count,
        dtype: b.dtype === "i32" ? "i32" : "f32",
        redop: op === "avg" ? "sum" : op,
        root: 0,
        userDtype: USER_DTYPES.indexOf(b.dtype),
        async,
      },
      finish,
      [buf, wide],
    );
  }

  /**
   * Reduces `buf` over all ranks, in place: every rank ends with the same result.
   *
   * @param buf f32, f16 or i32 values (typed array or cpu tensor); the same length on every
   *   rank.
   * @param options The reduction: sum (default), avg, max or min.
   * @throws {TypeError} On an unsupported buffer or op (avg of i32).
   * @throws {Error} When the collective fails or times out (see `timeoutMs`).
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using group = ProcessGroup.init();
   * const x = new Float16Array([1.5, -2]);
   * group.allReduce(x, { op: "max" });
   * assert.deepStrictEqual([...x], [1.5, -2]);
   * ```
   */
  allReduce(buf: CollectiveBuffer, options: ReduceOptions = {}): void {
    this.#reduce("all-reduce", buf, options, false).waitSync();
  }

  /**
   * {@linkcode ProcessGroup.allReduce} without waiting.
   *
   * @param buf As allReduce.
   * @param options As allReduce.
   * @returns The collective in flight.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using group = ProcessGroup.init();
   * const x = new Int32Array([7]);
   * await group.allReduceAsync(x).wait();
   * assert.strictEqual(x[0], 7);
   * ```
   */
  allReduceAsync(buf: CollectiveBuffer, options: ReduceOptions = {}): Work {
    return this.#reduce("all-reduce", buf, options, true);
  }

  #broadcast(buf: CollectiveBuffer, options: BroadcastOptions, async: boolean): Work {
    const action = "broadcast";
    this.#usable(action);
    refuseUnknownKeys(options ?? {}, ["root"], action);
    const root = options.root ?? 0;
    if (!Number.isInteger(root) || root < 0 || root >= this.size) {
      throw new RangeError(`Cannot broadcast: root must be a rank below ${this.size}, got ${root}`);
    }
    const dev = this.#device(buf, action);
    if (dev) return dev.broadcast(buf as Tensor, root);
    const b = resolve(buf, action, "the buffer");
    if (this.#staged) return this.#nccl!.host("broadcast", b, null, "sum", root);
    return this.#issue(
      {
        op: "broadcast",
        send: 0n,
        recv: b.ptr,
        inPlace: false,
        count: b.dtype === "f16" ? b.count * 2 : b.count,
        dtype: b.dtype === "f16" ? "byte" : b.dtype,
        redop: "sum",
        root,
        userDtype: USER_DTYPES.indexOf(b.dtype),
        async,
      },
      null,
      buf,
    );
  }

  /**
   * Copies `root`'s buffer into every other rank's.
   *
   * @param buf The buffer; the same length and dtype on every rank.
   * @param options `root` (default 0).
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using group = ProcessGroup.init();
   * const x = new Float32Array([5]);
   * group.broadcast(x, { root: 0 });
   * assert.strictEqual(x[0], 5);
   * ```
   */
  broadcast(buf: CollectiveBuffer, options: BroadcastOptions = {}): void {
    this.#broadcast(buf, options, false).waitSync();
  }

  /**
   * {@linkcode ProcessGroup.broadcast} without waiting.
   *
   * @param buf As broadcast.
   * @param options As broadcast.
   * @returns The collective in flight.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * using group = ProcessGroup.init();
   * await group.broadcastAsync(new Float32Array(4)).wait();
   * ```
   */
  broadcastAsync(buf: CollectiveBuffer, options: BroadcastOptions = {}): Work {
    return this.#broadcast(buf, options, true);
  }

  #allGather(input: CollectiveBuffer, output: CollectiveBuffer, async: boolean): Work {
    const action = "all-gather";
    this.#usable(action);
    const dev = this.#device(input, action);
    if (dev) return dev.allGather(input as Tensor, output as Tensor);
    const i = resolve(input, action, "the input");
    const o = resolve(output, action, "the output");
    if (i.dtype !== o.dtype || o.count !== i.count * this.size) {
      throw new RangeError(
        `Cannot all-gather: the output must hold ${this.size} x ${i.count} ${i.dtype} ` +
          `(the input's length times the group's size), got ${o.count} ${o.dtype}`,
      );
    }
    if (this.#staged) return this.#nccl!.host("allGather", i, o, "sum", 0);
    const bytes = i.dtype === "f16";
    const outFinish = this.#worker === null ? () => o.view.set(i.view as never) : null;
    return this.#issue(
      {
        op: "allGather",
        send: i.ptr,
        recv: o.ptr,
        inPlace: false,
        count: bytes ? i.count * 2 : i.count,
        dtype: bytes ? "byte" : i.dtype as "f32" | "i32",
        redop: "sum",
        root: 0,
        userDtype: USER_DTYPES.indexOf(i.dtype),
        async,
      },
      outFinish,
      [input, output],
    );
  }

  /**
   * Concatenates every rank's `input`, in rank order, into every rank's `output`.
   *
   * @param input This rank's part.
   * @param output size x input.length elements of the same dtype.
   * @throws {RangeError} When the output's length or dtype does not fit.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using group = ProcessGroup.init();
   * const out = new Int32Array(1);
   * group.allGather(new Int32Array([9]), out);
   * assert.strictEqual(out[0], 9);
   * ```
   */
  allGather(input: CollectiveBuffer, output: CollectiveBuffer): void {
    this.#allGather(input, output, false).waitSync();
  }

  /**
   * {@linkcode ProcessGroup.allGather} without waiting.
   *
   * @param input As allGather.
   * @param output As allGather.
   * @returns The collective in flight.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * using group = ProcessGroup.init();
   * await group.allGatherAsync(new Float32Array(2), new Float32Array(2)).wait();
   * ```
   */
  allGatherAsync(input: CollectiveBuffer, output: CollectiveBuffer): Work {
    return this.#allGather(input, output, true);
  }

  #reduceScatter(
    input: CollectiveBuffer,
    output: CollectiveBuffer,
    options: ReduceOptions,
    async: boolean,
  ): Work {
    const action = "reduce-scatter";
    this.#usable(action);
    refuseUnknownKeys(options ?? {}, ["op"], action);
    const op = options.op ?? "sum";
    if (!["sum", "avg", "max", "min"].includes(op)) {
      throw new TypeError(`Cannot ${action}: op must be sum, avg, max or min, got ${String(op)}`);
    }
    const dev = this.#device(input, action);
    if (dev) return dev.reduceScatter(input as Tensor, output as Tensor, op);
    const i = resolve(input, action, "the input");
    const o = resolve(output, action, "the output");
    if (i.dtype !== o.dtype || i.count !== o.count * this.size) {
      throw new RangeError(
        `Cannot reduce-scatter: the input must hold ${this.size} x ${o.count} ${o.dtype} ` +
          `(the output's length times the group's size), got ${i.count} ${i.dtype}`,
      );
    }
    if (op === "avg" && i.dtype === "i32") {
      throw new TypeError(`Cannot ${action}: avg of i32 would round; reduce with sum instead`);
    }
    if (this.#staged) return this.#nccl!.host("reduceScatter", i, o, op, 0);
    const n = this.size;
    const half = i.dtype === "f16";
    const wideIn = half ? Float32Array.from(i.view as Float16Array) : null;
    const wideOut = half ? new Float32Array(o.count) : null;
    const single = this.#worker === null;
    const finish = () => {
      // In a group of one the reduction of the input is the input itself.
      if (single) (wideOut ?? o.view).set((wideIn ?? i.view) as never);
      if (op === "avg") {
        const t = (wideOut ?? o.view) as Float32Array;
        for (let k = 0; k < t.length; k++) t[k] /= n;
      }
      if (wideOut) o.view.set(wideOut);
    };
    return this.#issue(
      {
        op: "reduceScatter",
        send: wideIn ? addr(wideIn) : i.ptr,
        recv: wideOut ? addr(wideOut) : o.ptr,
        inPlace: false,
        count: o.count,
        dtype: i.dtype === "i32" ? "i32" : "f32",
        redop: op === "avg" ? "sum" : op,
        root: 0,
        userDtype: USER_DTYPES.indexOf(i.dtype),
        async,
      },
      finish,
      [input, output, wideIn, wideOut],
    );
  }

  /**
   * Reduces every rank's `input` and leaves block `rank` of the result in `output`.
   *
   * @param input size x output.length elements.
   * @param output This rank's block of the reduction.
   * @param options The reduction (default sum).
   * @throws {RangeError} When the lengths or dtypes do not fit.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using group = ProcessGroup.init();
   * const out = new Float32Array(2);
   * group.reduceScatter(new Float32Array([1, 2]), out);
   * assert.deepStrictEqual([...out], [1, 2]);
   * ```
   */
  reduceScatter(
    input: CollectiveBuffer,
    output: CollectiveBuffer,
    options: ReduceOptions = {},
  ): void {
    this.#reduceScatter(input, output, options, false).waitSync();
  }

  /**
   * {@linkcode ProcessGroup.reduceScatter} without waiting.
   *
   * @param input As reduceScatter.
   * @param output As reduceScatter.
   * @param options As reduceScatter.
   * @returns The collective in flight.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * using group = ProcessGroup.init();
   * await group.reduceScatterAsync(new Float32Array(1), new Float32Array(1)).wait();
   * ```
   */
  reduceScatterAsync(
    input: CollectiveBuffer,
    output: CollectiveBuffer,
    options: ReduceOptions = {},
  ): Work {
    return this.#reduceScatter(input, output, options, true);
  }

  /**
   * Returns once every rank called it.
   *
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * using group = ProcessGroup.init();
   * group.barrier();
   * ```
   */
  barrier(): void {
    this.#barrier(false).waitSync();
  }

  /**
   * {@linkcode ProcessGroup.barrier} without waiting.
   *
   * @returns The collective in flight.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * using group = ProcessGroup.init();
   * await group.barrierAsync().wait();
   * ```
   */
  barrierAsync(): Work {
    return this.#barrier(true);
  }

  #barrier(async: boolean): Work {
    this.#usable("run a barrier");
    if (this.#staged) return this.#nccl!.host("barrier", null, null, "sum", 0);
    return this.#issue(
      {
        op: "barrier",
        send: 0n,
        recv: 0n,
        inPlace: false,
        count: 0,
        dtype: "byte",
        redop: "sum",
        root: 0,
        userDtype: 0,
        async,
      },
      null,
      null,
    );
  }

  /** Whether the group was disposed. */
  get disposed(): boolean {
    return this.#disposed;
  }

  /**
   * Leaves the job: stops the communication and watchdog threads and finalizes MPI (when
   * this group initialized it). Every rank must dispose; collectives still in flight are
   * waited for first. A group that failed skips MPI's finalize, which would wait for the
   * ranks that did not arrive. Idempotent.
   */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#nccl?.dispose();
    stopRendezvous();
    // MPI's finalize would wait for the ranks that made NCCL fail.
    this.#failed ??= this.#nccl?.failure ?? null;
    this.#nccl = null;
    // The NCCL library stays loaded: an aborted communicator's collectives may still be queued
    // on a stream, and NCCL's own threads outlive its communicators.
    this.#ncclLib = null;
    if (this.#worker === null) return;
    if (this.#onUnload) globalThis.removeEventListener("unload", this.#onUnload);
    if (!this.#failed && this.#seq > 0) {
      const last = ((this.#seq - 1) % SLOTS) * 2;
      Atomics.wait(this.#results, last, 0, this.timeoutMs);
    }
    this.#responder?.stop();
    this.#ring.stop();
    this.#worker.terminate();
    this.#worker = null;
    if (this.#failed || !this.#lib) return;
    const f = this.#lib.fn;
    const out = new BigUint64Array(1);
    for (const c of [this.#comm, this.#watchComm]) {
      if (c === null) continue;
      out[0] = typeof c === "number" ? BigInt(c) : Deno.UnsafePointer.value(c);
      f.MPI_Comm_free(out);
    }
    if (this.#ownsInit) f.MPI_Finalize();
  }

  /** Same as {@linkcode ProcessGroup.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
