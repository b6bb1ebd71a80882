/**
 * The communication thread of a process group: it runs the group's asynchronous collectives
 * one after another, in the order the main thread issued them, so that they overlap with the
 * main thread's compute and so that the main thread can wait on them either blocking
 * (`Atomics.wait`) or not (`Atomics.waitAsync`). Jobs arrive through a {@linkcode JobRing} in
 * shared memory; each result goes to a slot of a shared array: `[done, status]`, done set
 * last and notified.
 *
 * MPI allows collectives from a second thread once initialized with `MPI_THREAD_MULTIPLE`;
 * the main thread runs a blocking collective itself only once this thread finished every
 * earlier one, so every rank's sequence on the communicator stays the issue order, which MPI
 * requires.
 *
 * While idle, the thread is also the watchdog of the main thread's own collectives: one that
 * has not returned within the group's timeout cannot be interrupted inside MPI, so the thread
 * names the ranks that did not arrive (as a timed-out wait does) and ends the process.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import { handleOf, openMpi } from "./_mpi.ts";
import type { MpiFlavor } from "./launch_env.ts";
import { DIRECT_OP, DIRECT_SEQ, OPS, SLOTS } from "./_protocol.ts";
import { JobRing, type RingMemory } from "./_ring.ts";
import { runJob } from "./_run_job.ts";
import { diagnoseTimeout } from "./_watchdog.ts";

interface Init {
  path: string;
  flavor: MpiFlavor;
  comm: bigint | number;
  watchComm: bigint | number;
  rank: number;
  size: number;
  timeoutMs: number;
  debug: boolean;
  ring: RingMemory;
  results: SharedArrayBuffer;
  sigs: SharedArrayBuffer;
  progress: SharedArrayBuffer;
}

/**
 * How long the thread spins for the next job before it sleeps: backward issues its buckets
 * within this of each other, and a spin of this length costs the computing thread little.
 */
const SPIN_MS = 0.05;

/** How often the idle thread looks at the main thread's collective. */
const POLL_MS = 100;

const libc = Deno.dlopen("libc.so.6", { _exit: { parameters: ["i32"], result: "void" } });

self.onmessage = (e: MessageEvent<Init>) => {
  const m = e.data;
  const lib = openMpi({ path: m.path });
  const comm = handleOf(m.comm);
  const ring = new JobRing(m.ring);
  const results = new Int32Array(m.results);
  const sigs = m.debug ? new Int32Array(m.sigs) : null;
  const progress = new Int32Array(m.progress);
  let watched = 0, since = 0;
  // This loop holds the thread until the group stops the ring; no other message comes.
  for (;;) {
    const job = ring.take(SPIN_MS, POLL_MS);
    if (job === null) break;
    if (job === "idle") {
      const direct = Atomics.load(progress, DIRECT_SEQ);
      if (direct !== watched) [watched, since] = [direct, performance.now()];
      if (direct !== 0 && performance.now() - since > m.timeoutMs) {
        const why = diagnoseTimeout(lib, handleOf(m.watchComm), {
          rank: m.rank,
          size: m.size,
          seq: direct - 1,
          op: OPS[Atomics.load(progress, DIRECT_OP)],
          timeoutMs: m.timeoutMs,
        });
        console.error(`error: ${why}`);
        libc.symbols._exit(1);
      }
      continue;
    }
    const slot = (job.seq % SLOTS) * 2;
    let status: number;
    try {
      status = runJob(lib, comm, job, sigs);
    } catch {
      status = -3;
    }
    Atomics.store(progress, 1, job.seq + 1);
    Atomics.store(results, slot + 1, status);
    Atomics.store(results, slot, 1);
    Atomics.notify(results, slot);
  }
};
