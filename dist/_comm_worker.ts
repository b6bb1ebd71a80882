/**
 * The communication thread of a process group: it runs the group's collectives one after
 * another, in the order the main thread issued them, so that they overlap with the main
 * thread's compute and so that the main thread can wait on them either blocking
 * (`Atomics.wait`) or not (`Atomics.waitAsync`). Each result goes to a slot of a shared array:
 * `[done, status]`, done set last and notified.
 *
 * MPI allows collectives from a second thread once initialized with `MPI_THREAD_MULTIPLE`;
 * running them all on this one thread, in issue order, keeps every rank's sequence on the
 * communicator identical, which MPI requires.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import { handleOf, type MpiLibrary, openMpi } from "./_mpi.ts";
import type { MpiFlavor } from "./launch_env.ts";
import type { Handle } from "./_mpi_symbols.ts";
import { type CommJob, MISMATCH, SIG_INTS, signatureOf, SLOTS } from "./_protocol.ts";

interface Init {
  path: string;
  flavor: MpiFlavor;
  comm: bigint | number;
  size: number;
  debug: boolean;
  results: SharedArrayBuffer;
  sigs: SharedArrayBuffer;
  progress: SharedArrayBuffer;
}

let lib: MpiLibrary;
let comm: Handle;
let results: Int32Array;
let sigs: Int32Array;
let progress: Int32Array;
let debug = false;

function ptr(v: bigint): Deno.PointerValue {
  return v === 0n ? null : Deno.UnsafePointer.create(v);
}

function dtypeHandle(d: CommJob["dtype"]): Handle {
  return d === "f32" ? lib.c.float : d === "i32" ? lib.c.int : lib.c.byte;
}

function opHandle(o: CommJob["redop"]): Handle {
  return o === "max" ? lib.c.max : o === "min" ? lib.c.min : lib.c.sum;
}

/** Agrees on the job's signature with every rank: MISMATCH when any rank differs. */
function checkSignature(job: CommJob): number {
  const mine = new Int32Array(signatureOf(job));
  const rc = lib.fn.MPI_Allgather(
    Deno.UnsafePointer.of(mine),
    SIG_INTS,
    lib.c.int,
    Deno.UnsafePointer.of(sigs),
    SIG_INTS,
    lib.c.int,
    comm,
  );
  if (rc !== 0) return rc;
  for (let i = 0; i < sigs.length; i++) {
    if (sigs[i] !== mine[i % SIG_INTS]) return MISMATCH;
  }
  return 0;
}

function run(job: CommJob): number {
  if (debug) {
    const rc = checkSignature(job);
    if (rc !== 0) return rc;
  }
  const f = lib.fn;
  const send = job.inPlace ? lib.c.inPlace : ptr(job.send);
  const recv = ptr(job.recv);
  switch (job.op) {
    case "allReduce":
      return f.MPI_Allreduce(
        send,
        recv,
        job.count,
        dtypeHandle(job.dtype),
        opHandle(job.redop),
        comm,
      );
    case "broadcast":
      return f.MPI_Bcast(recv, job.count, dtypeHandle(job.dtype), job.root, comm);
    case "allGather": {
      const t = dtypeHandle(job.dtype);
      return f.MPI_Allgather(send, job.count, t, recv, job.count, t, comm);
    }
    case "reduceScatter":
      return f.MPI_Reduce_scatter_block(
        send,
        recv,
        job.count,
        dtypeHandle(job.dtype),
        opHandle(job.redop),
        comm,
      );
    case "barrier":
      return f.MPI_Barrier(comm);
  }
}

self.onmessage = (e: MessageEvent<Init | CommJob>) => {
  const m = e.data;
  if ("path" in m) {
    lib = openMpi({ path: m.path });
    comm = handleOf(m.comm);
    results = new Int32Array(m.results);
    sigs = new Int32Array(m.sigs);
    progress = new Int32Array(m.progress);
    debug = m.debug;
    return;
  }
  const slot = (m.seq % SLOTS) * 2;
  let status: number;
  try {
    status = run(m);
  } catch {
    status = -3;
  }
  Atomics.store(progress, 1, m.seq + 1);
  Atomics.store(results, slot + 1, status);
  Atomics.store(results, slot, 1);
  Atomics.notify(results, slot);
};
