/**
 * The nccl backend's communicator: NCCL collectives on CUDA device memory, queued on a
 * communication stream that waits for the work queued so far on the device's current stream
 * (an event), and waited for, host and stream, with the group's timeout: past it, or on
 * NCCL's asynchronous error, the communicator is aborted (`ncclCommAbort`) and the wait
 * throws.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { Event, Stream } from "../ffi/stream.ts";
import { captureRefused } from "../ffi/graph.ts";
import { PinstreamError } from "../internal/errors.ts";
import { Tensor } from "../ffi/tensor.ts";
import type { CollectiveOp, ReduceOp } from "./process_group.ts";
import { Work, type WorkOwner } from "./work.ts";
import type { Resolved } from "./_buffers.ts";
import { describeSignature, OPS, SIG_INTS, USER_DTYPES } from "./_protocol.ts";
import {
  NCCL_DTYPES,
  NCCL_OPS,
  ncclErrorString,
  type NcclLibrary,
  UNIQUE_ID_BYTES,
} from "./_nccl.ts";

/** A Work's status when it waited past the timeout. */
const TIMED_OUT = -2;

/** How the communicator reports its progress to the group's watchdog, and asks it. */
export interface NcclWatch {
  /** The collective timeout. */
  timeoutMs: number;
  /** The group's progress counters: slot 2 counts the NCCL collectives issued. */
  progress: Int32Array;
  /** Words a timeout, naming the ranks that never issued collective `seq` (needs MPI). */
  diagnose: ((seq: number, op: string) => string) | null;
  /** Debug mode: every collective's signature is compared across ranks before it runs. */
  debug: boolean;
}

interface Pending {
  done: Event;
  deadline: number;
  keep: unknown;
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4));

/** Which NCCL library may drive which device, in words, or null when they fit. */
function mismatch(lib: NcclLibrary, device: Device): string | null {
  if (device.props.emulated && !lib.standIn) {
    return `${lib.path} is NCCL, which needs a GPU, and ${device} is the CUDA emulator: ` +
      `build the emulator's stand-in (cc -shared -fPIC -o libnccl-stand-in.so ` +
      `kernels/emu/nccl_stand_in.c) and name it in PINSTREAM_NCCL_LIB`;
  }
  if (!device.props.emulated && lib.standIn) {
    return `${lib.path} is the CUDA emulator's NCCL stand-in, and ${device} is a GPU: unset ` +
      `PINSTREAM_NCCL_LIB or name libnccl.so.2 in it`;
  }
  return null;
}

/** One rank's NCCL communicator on one device (see the module documentation). */
export class NcclComm implements WorkOwner, Disposable {
  readonly device: Device;
  readonly rank: number;
  readonly size: number;
  /** The communication stream the collectives run on. */
  readonly stream: Stream;
  #lib: NcclLibrary;
  #comm: Deno.PointerValue = null;
  #timeoutMs: number;
  #watch: NcclWatch;
  #seq = 0;
  #pending = new Map<number, Pending>();
  #failed: Error | null = null;
  #disposed = false;

  /**
   * A fresh unique id (on the rank that sends it to the others).
   *
   * @param lib The library.
   * @returns The id's bytes.
   */
  static uniqueId(lib: NcclLibrary): Uint8Array {
    const id = new Uint8Array(UNIQUE_ID_BYTES);
    const rc = lib.fn.ncclGetUniqueId(id);
    if (rc !== 0) throw new Error(`Cannot make an NCCL unique id: ${ncclErrorString(lib, rc)}`);
    return id;
  }

  /**
   * Joins the communicator every rank creates with the same id; blocks until all joined.
   *
   * @param lib The library.
   * @param device The CUDA device.
   * @param rank This rank.
   * @param size The number of ranks.
   * @param id The unique id, the same on every rank.
   * @param watch The timeout and the group's watchdog.
   */
  constructor(
    lib: NcclLibrary,
    device: Device,
    rank: number,
    size: number,
    id: Uint8Array,
    watch: NcclWatch,
  ) {
    const why = mismatch(lib, device);
    if (why) throw new Error(`Cannot create the NCCL communicator: ${why}`);
    this.device = device;
    this.rank = rank;
    this.size = size;
    this.#lib = lib;
    this.#timeoutMs = watch.timeoutMs;
    this.#watch = watch;
    device.makeCurrent();
    const out = new BigUint64Array(1);
    const rc = lib.fn.ncclCommInitRank(out, size, id, rank);
    if (rc !== 0) {
      throw new Error(
        `Cannot create the NCCL communicator (rank ${rank} of ${size}, ${lib.path}): ` +
          ncclErrorString(lib, rc),
      );
    }
    this.#comm = Deno.UnsafePointer.create(out[0]);
    // Non-blocking: the collectives overlap with work on the default stream, ordered by events.
    this.stream = new Stream(device, { nonBlocking: true });
  }

  /** The failure that aborted the communicator, or null. */
  get failure(): Error | null {
    return this.#failed;
  }

  #usable(action: string): void {
    if (this.#disposed) throw new TypeError(`Cannot ${action}: the process group was disposed`);
    if (this.#failed) {
      throw new Error(`Cannot ${action}: the group failed earlier: ${this.#failed.message}`);
    }
  }

  #tensor(t: unknown, action: string, name: string): Tensor {
    if (!(t instanceof Tensor) || String(t.device) !== String(this.device)) {
      throw new TypeError(
        `Cannot ${action}: ${name} must be a tensor on ${this.device}, the device of the ` +
          `group's NCCL communicator`,
      );
    }
    if (!(t.dtype in NCCL_DTYPES)) {
      throw new TypeError(
        `Cannot ${action}: ${name} has dtype ${t.dtype}; f32, f16, bf16 or i32`,
      );
    }
    return t;
  }

  /**
   * Queues `calls` (one NCCL group) on the communication stream, after the work queued so far
   * on the device's current stream.
   */
  #run(
    op: CollectiveOp,
    calls: (comm: Deno.PointerValue, stream: Deno.PointerValue) => number[],
    keep: unknown,
    finish: (() => void) | null,
    sig: { dtype: string; count: number; root: number },
  ): Work {
    const current = this.device.currentStream;
    this.device.makeCurrent();
    {
      using ready = new Event(this.device);
      ready.record(current);
      try {
        // Fails on a stream that records a CUDA graph, before anything reaches NCCL: the
        // completion of a collective is waited for on the host, which a graph cannot replay.
        ready.query();
      } catch (err) {
        if (!captureRefused(err)) throw err;
        throw new PinstreamError(
          "UNSUPPORTED",
          `queue ${op}`,
          "a collective of the nccl backend cannot be recorded in a CUDA graph (the host " +
            "waits for it)",
          { cause: err },
        );
      }
      this.stream.waitEvent(ready);
    }
    // After the graph check: a capture is refused with its own error, not the debug gather's.
    if (this.#watch.debug) this.#agree(op, sig.dtype, sig.count, sig.root);
    const f = this.#lib.fn;
    let rc = f.ncclGroupStart();
    if (rc === 0) {
      const results = calls(this.#comm, this.stream.handle);
      const end = f.ncclGroupEnd();
      rc = results.find((r) => r !== 0) ?? end;
    }
    if (rc !== 0) {
      throw new Error(`Cannot queue ${op} on rank ${this.rank}: ${this.#describe(rc)}`);
    }
    const done = new Event(this.device);
    done.record(this.stream);
    const seq = this.#seq++;
    Atomics.store(this.#watch.progress, 2, seq + 1);
    this.#pending.set(seq, { done, deadline: Date.now() + this.#timeoutMs, keep });
    return new Work(this, seq, op, finish, keep);
  }

  /**
   * Debug mode: all-gathers the signature of collective `op` over NCCL itself (so that it works
   * without MPI as well) and throws, naming every rank's collective, where they differ. A rank
   * that skipped a collective meets the others in this small gather of the next one, instead
   * of pairing its data with a different collective of theirs.
   */
  #agree(op: CollectiveOp, dtype: string, count: number, root: number): void {
    const seq = this.#seq;
    const n = SIG_INTS;
    const mine = new Int32Array([
      seq,
      OPS.indexOf(op),
      (USER_DTYPES as readonly string[]).indexOf(dtype),
      count,
      root,
    ]);
    const all = new Int32Array(n * this.size);
    using tin = Tensor.fromHost(this.device, mine, [n]);
    using tout = Tensor.empty(this.device, [all.length], "i32");
    {
      using ready = new Event(this.device);
      ready.record(this.device.currentStream);
      this.stream.waitEvent(ready);
    }
    const f = this.#lib.fn;
    let rc = f.ncclGroupStart();
    if (rc === 0) {
      const r = f.ncclAllGather(
        tin.pointer,
        tout.pointer,
        BigInt(n),
        NCCL_DTYPES.i32,
        this.#comm,
        this.stream.handle,
      );
      const end = f.ncclGroupEnd();
      rc = r !== 0 ? r : end;
    }
    if (rc !== 0) {
      throw new Error(
        `Cannot compare ${op} #${seq} across ranks on rank ${this.rank}: ${this.#describe(rc)}`,
      );
    }
    const work = new Work(this, seq, op, null, null);
    {
      const done = new Event(this.device);
      done.record(this.stream);
      this.#pending.set(-1, { done, deadline: Date.now() + this.#timeoutMs, keep: null });
      const status = this._waitSync(new Work(this, -1, op, null, null));
      if (status !== 0) {
        this.#pending.get(-1)?.done.dispose();
        this.#pending.delete(-1);
        throw this._failure(work, status);
      }
    }
    tout.buffer.copyTo(all, { stream: this.stream });
    using copied = new Event(this.device);
    copied.record(this.stream);
    for (let ms = 0.05; !copied.query(); ms = Math.min(ms * 2, 2)) {
      Atomics.wait(sleepCell, 0, 0, ms);
    }
    if (all.every((v, i) => v === mine[i % n])) return;
    const lines: string[] = [];
    for (let r = 0; r < this.size; r++) {
      lines.push(`rank ${r}: ${describeSignature(all.subarray(r * n, (r + 1) * n))}`);
    }
    this.#abort();
    this.#failed = new Error(
      `Cannot run ${op} #${seq}: the ranks issued different collectives (${lines.join("; ")})`,
    );
    throw this.#failed;
  }

  #describe(rc: number): string {
    return `NCCL: ${ncclErrorString(this.#lib, rc, this.#comm)}`;
  }

  /** Checks the dtype and op of a reduction; returns NCCL's codes. */
  #reduction(t: Tensor, op: ReduceOp, action: string): [number, number] {
    if (op === "avg" && t.dtype === "i32") {
      throw new TypeError(`Cannot ${action}: avg of i32 would round; reduce with sum instead`);
    }
    if (op === "avg" && this.#lib.version < 21000) {
      throw new Error(`Cannot ${action}: avg needs NCCL 2.10 or later, ${this.#lib.path} is older`);
    }
    return [NCCL_DTYPES[t.dtype as keyof typeof NCCL_DTYPES], NCCL_OPS[op]];
  }

  allReduce(
    tensors: readonly Tensor[],
    op: ReduceOp,
    action: string,
    finish: (() => void) | null = null,
  ): Work {
    this.#usable(action);
    const codes = tensors.map((t) =>
      this.#reduction(this.#tensor(t, action, "the buffer"), op, action)
    );
    const f = this.#lib.fn;
    return this.#run(
      "allReduce",
      (comm, stream) =>
        tensors.map((t, i) =>
          f.ncclAllReduce(
            t.pointer,
            t.pointer,
            BigInt(t.numel),
            codes[i][0],
            codes[i][1],
            comm,
            stream,
          )
        ),
      tensors,
      finish,
      { dtype: tensors[0].dtype, count: tensors.reduce((a, t) => a + t.numel, 0), root: 0 },
    );
  }

  broadcast(t: Tensor, root: number, finish: (() => void) | null = null): Work {
    const action = "broadcast";
    this.#usable(action);
    this.#tensor(t, action, "the buffer");
    const dtype = NCCL_DTYPES[t.dtype as keyof typeof NCCL_DTYPES];
    const f = this.#lib.fn;
    return this.#run(
      "broadcast",
      (comm, stream) => [
        f.ncclBroadcast(t.pointer, t.pointer, BigInt(t.numel), dtype, root, comm, stream),
      ],
      t,
      finish,
      { dtype: t.dtype, count: t.numel, root },
    );
  }

  allGather(input: Tensor, output: Tensor, finish: (() => void) | null = null): Work {
    const action = "all-gather";
    this.#usable(action);
    this.#tensor(input, action, "the input");
    this.#tensor(output, action, "the output");
    if (input.dtype !== output.dtype || output.numel !== input.numel * this.size) {
      throw new RangeError(
        `Cannot all-gather: the output must hold ${this.size} x ${input.numel} ${input.dtype} ` +
          `(the input's length times the group's size), got ${output.numel} ${output.dtype}`,
      );
    }
    const dtype = NCCL_DTYPES[input.dtype as keyof typeof NCCL_DTYPES];
    const f = this.#lib.fn;
    return this.#run(
      "allGather",
      (comm, stream) => [
        f.ncclAllGather(input.pointer, output.pointer, BigInt(input.numel), dtype, comm, stream),
      ],
      [input, output],
      finish,
      { dtype: input.dtype, count: input.numel, root: 0 },
    );
  }

  reduceScatter(
    input: Tensor,
    output: Tensor,
    op: ReduceOp,
    finish: (() => void) | null = null,
  ): Work {
    const action = "reduce-scatter";
    this.#usable(action);
    this.#tensor(input, action, "the input");
    this.#tensor(output, action, "the output");
    if (input.dtype !== output.dtype || input.numel !== output.numel * this.size) {
      throw new RangeError(
        `Cannot reduce-scatter: the input must hold ${this.size} x ${output.numel} ` +
          `${output.dtype} (the output's length times the group's size), got ${input.numel} ` +
          `${input.dtype}`,
      );
    }
    const [dtype, redop] = this.#reduction(input, op, action);
    const f = this.#lib.fn;
    return this.#run(
      "reduceScatter",
      (comm, stream) => [
        f.ncclReduceScatter(
          input.pointer,
          output.pointer,
          BigInt(output.numel),
          dtype,
          redop,
          comm,
          stream,
        ),
      ],
      [input, output],
      finish,
      { dtype: output.dtype, count: output.numel, root: 0 },
    );
  }

  /**
   * A collective on host memory in a group without MPI (a torchrun-style launch): the buffers
   * are copied to the device, reduced there by NCCL, and the result copied back when a wait
   * returns.
   *
   * @param op The collective.
   * @param input The input (in place for allReduce and broadcast).
   * @param output The output of allGather and reduceScatter.
   * @param redop The reduction.
   * @param root The root of a broadcast.
   * @returns The collective in flight.
   */
  host(
    op: CollectiveOp,
    input: Resolved | null,
    output: Resolved | null,
    redop: ReduceOp,
    root: number,
  ): Work {
    const action = `run ${op} on host memory`;
    // A barrier, or an empty buffer, is an all-reduce of one integer.
    if (input === null || input.count === 0 || (output !== null && output.count === 0)) {
      input = { ptr: 0n, count: 1, dtype: "i32", view: new Int32Array(1) };
      output = null;
      op = op === "barrier" ? "barrier" : "allReduce";
    }
    const up = (r: Resolved) => Tensor.fromHost(this.device, r.view as Float32Array, [r.count]);
    const tin = up(input);
    const tout = output ? Tensor.empty(this.device, [output.count], output.dtype) : null;
    const dst = output ?? input;
    const finish = () => {
      (tout ?? tin).buffer.copyTo(dst.view);
      // A pinned destination is written asynchronously: wait for the copy's event.
      using done = new Event(this.device);
      done.record();
      for (let ms = 0.05; !done.query(); ms = Math.min(ms * 2, 2)) {
        Atomics.wait(sleepCell, 0, 0, ms);
      }
      tin.dispose();
      tout?.dispose();
    };
    switch (op) {
      case "broadcast":
        return this.broadcast(tin, root, finish);
      case "allGather":
        return this.allGather(tin, tout!, finish);
      case "reduceScatter":
        return this.reduceScatter(tin, tout!, redop, finish);
      default:
        return this.allReduce([tin], op === "barrier" ? "sum" : redop, action, finish);
    }
  }

  // ---- waiting (Work's owner)

  /** 0 when done, an NCCL code on an asynchronous error, TIMED_OUT past the deadline, else null. */
  #poll(work: Work): number | null {
    const p = this.#pending.get(work.seq);
    if (!p) return 0;
    const done = p.done.query();
    // Read after the query: a collective that failed also completes on its stream (a kernel
    // that gave up, a host function that returned), and its error was set before that.
    const err = new Int32Array(1);
    if (this.#comm !== null) this.#lib.fn.ncclCommGetAsyncError(this.#comm, err);
    if (err[0] !== 0) return err[0];
    if (done) {
      // The host saw it done, so whatever it queues next, on any stream, reads the result.
      this.#pending.delete(work.seq);
      p.done.dispose();
      return 0;
    }
    return Date.now() > p.deadline ? TIMED_OUT : null;
  }

  /** @internal */
  _query(work: Work): boolean {
    const p = this.#pending.get(work.seq);
    return !p || p.done.query();
  }

  /** @internal Blocks, polling with a backoff up to 2 ms, until done, failed or timed out. */
  _waitSync(work: Work): number {
    for (let ms = 0.05;; ms = Math.min(ms * 2, 2)) {
      const s = this.#poll(work);
      if (s !== null) return s;
      Atomics.wait(sleepCell, 0, 0, ms);
    }
  }

  /** @internal As _waitSync, without blocking the event loop. */
  async _wait(work: Work): Promise<number> {
    for (let ms = 0.05;; ms = Math.min(ms * 2, 2)) {
      const s = this.#poll(work);
      if (s !== null) return s;
      await new Promise((r) => setTimeout(r, ms));
    }
  }

  /** @internal Aborts the communicator (NCCL's rule after a failure) and words the error. */
  _failure(work: Work, status: number): Error {
    const aborted = "the NCCL communicator was aborted";
    let msg: string;
    if (status === TIMED_OUT && this.#watch.diagnose) {
      msg = `${this.#watch.diagnose(work.seq, work.op)}; ${aborted}`;
    } else {
      const why = status === TIMED_OUT
        ? `no progress within ${this.#timeoutMs} ms (a rank died, hangs or skipped it)`
        : this.#describe(status);
      msg = `Cannot finish ${work.op} #${work.seq} on rank ${this.rank}: ${why}; ${aborted}`;
    }
    this.#abort();
    this.#failed = new Error(msg);
    return this.#failed;
  }

  #abort(): void {
    if (this.#comm === null) return;
    this.#lib.fn.ncclCommAbort(this.#comm);
    this.#comm = null;
  }

  /**
   * Waits for the collectives in flight (at most the timeout each), then destroys the
   * communicator; a failed one was aborted already. Idempotent.
   */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const seq of [...this.#pending.keys()]) {
      const work = new Work(this, seq, "barrier", null, null);
      const s = this.#failed ? 0 : this._waitSync(work);
      if (s !== 0) this._failure(work, s);
      this.#pending.get(seq)?.done.dispose();
      this.#pending.delete(seq);
    }
    this.#pending.clear();
    if (this.#comm !== null) this.#lib.fn.ncclCommDestroy(this.#comm);
    this.#comm = null;
    this.stream.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
