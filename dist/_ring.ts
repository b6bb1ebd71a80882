/**
 * The queue of collectives from a process group's main thread to its communication thread:
 * a ring of fixed-size job records in shared memory with an issue counter the thread waits on.
 * A `postMessage` per collective costs a structured clone and a turn of the receiving event
 * loop; a write into shared memory and one futex wake costs a few microseconds, which at 1 MiB
 * is a tenth of the all-reduce itself.
 *
 * @module
 */

import { type CommJob, OPS, REDOPS, WIRE_DTYPES } from "./_protocol.ts";

/** Job records in the ring: the issuing thread waits once this many are not yet taken. */
export const RING_JOBS = 256;

/** Int32 cells of a record: send (2), recv (2), then the fields below. */
const REC_INTS = 16;
const SEQ = 4, OP = 5, COUNT = 6, DTYPE = 7, REDOP = 8, ROOT = 9, USER = 10, FLAGS = 11;
const IN_PLACE = 1, ASYNC = 2;

/** Control cells: jobs issued, jobs taken by the thread, stop request. */
const ISSUED = 0, TAKEN = 1, STOP = 2;

/** The shared memory of a ring, to hand to the communication thread. */
export interface RingMemory {
  records: SharedArrayBuffer;
  control: SharedArrayBuffer;
}

/** One side's view of a job ring (both sides construct it over the same memory). */
export class JobRing {
  readonly memory: RingMemory;
  #ints: Int32Array;
  #addrs: BigInt64Array;
  #control: Int32Array;
  /** Jobs written (the issuing side) and read (the thread's side). */
  #pushed = 0;
  #taken = 0;

  /**
   * @param memory The ring of the other side, or none to allocate a new one.
   */
  constructor(memory?: RingMemory) {
    this.memory = memory ?? {
      records: new SharedArrayBuffer(RING_JOBS * REC_INTS * 4),
      control: new SharedArrayBuffer(4 * 4),
    };
    this.#ints = new Int32Array(this.memory.records);
    this.#addrs = new BigInt64Array(this.memory.records);
    this.#control = new Int32Array(this.memory.control);
  }

  /**
   * Writes `job` and wakes the thread.
   * Waits while the ring is full, at most `timeoutMs`.
   *
   * @returns False when the ring stayed full for `timeoutMs`.
   */
  push(job: CommJob, timeoutMs: number): boolean {
    const c = this.#control;
    const n = this.#pushed;
    for (;;) {
      const taken = Atomics.load(c, TAKEN);
      if (n - taken < RING_JOBS) break;
      if (Atomics.wait(c, TAKEN, taken, timeoutMs) === "timed-out") return false;
    }
    const r = (n % RING_JOBS) * REC_INTS, i = this.#ints, a = this.#addrs;
    a[r >> 1] = BigInt.asIntN(64, job.send);
    a[(r >> 1) + 1] = BigInt.asIntN(64, job.recv);
    i[r + SEQ] = job.seq;
    i[r + OP] = OPS.indexOf(job.op);
    i[r + COUNT] = job.count;
    i[r + DTYPE] = WIRE_DTYPES.indexOf(job.dtype);
    i[r + REDOP] = REDOPS.indexOf(job.redop);
    i[r + ROOT] = job.root;
    i[r + USER] = job.userDtype;
    i[r + FLAGS] = (job.inPlace ? IN_PLACE : 0) | (job.async ? ASYNC : 0);
    // The store of the count publishes the record (sequentially consistent).
    this.#pushed = n + 1;
    Atomics.store(c, ISSUED, n + 1);
    Atomics.notify(c, ISSUED);
    return true;
  }

  /**
   * Takes the next job once issued: spins about `spinMs` (a burst of collectives, as
   * backward issues, comes faster than a futex wake), then sleeps until woken or `pollMs`
   * passed.
   *
   * @returns The job; "idle" when none came within `pollMs`; null once
   *   {@linkcode JobRing.stop} was called and no job is waiting.
   */
  take(spinMs: number, pollMs: number): CommJob | "idle" | null {
    const c = this.#control;
    const n = this.#taken;
    const t0 = performance.now();
    while (Atomics.load(c, ISSUED) <= n) {
      if (Atomics.load(c, STOP) !== 0) return null;
      if (performance.now() - t0 > spinMs) {
        // The wait is bounded: the stop request's wake may come just before it.
        if (Atomics.wait(c, ISSUED, n, pollMs) === "timed-out") return "idle";
      }
    }
    const r = (n % RING_JOBS) * REC_INTS, i = this.#ints, a = this.#addrs;
    const flags = i[r + FLAGS];
    const job: CommJob = {
      seq: i[r + SEQ],
      op: OPS[i[r + OP]],
      send: BigInt.asUintN(64, a[r >> 1]),
      recv: BigInt.asUintN(64, a[(r >> 1) + 1]),
      inPlace: (flags & IN_PLACE) !== 0,
      count: i[r + COUNT],
      dtype: WIRE_DTYPES[i[r + DTYPE]],
      redop: REDOPS[i[r + REDOP]],
      root: i[r + ROOT],
      userDtype: i[r + USER],
      async: (flags & ASYNC) !== 0,
    };
    this.#taken = n + 1;
    Atomics.store(c, TAKEN, n + 1);
    Atomics.notify(c, TAKEN);
    return job;
  }

  /** Makes the thread's next {@linkcode JobRing.take} return null once no job is waiting. */
  stop(): void {
    Atomics.store(this.#control, STOP, 1);
    Atomics.notify(this.#control, ISSUED);
  }
}
