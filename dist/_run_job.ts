/**
 * Runs one collective job on an MPI communicator: the communication worker's loop body.
 *
 * @module
 */

import type { MpiLibrary } from "./_mpi.ts";
import type { Handle } from "./_mpi_symbols.ts";
import { type CommJob, MISMATCH, SIG_INTS, signatureOf } from "./_protocol.ts";

function ptr(v: bigint): Deno.PointerValue {
  return v === 0n ? null : Deno.UnsafePointer.create(v);
}

/** Agrees on the job's signature with every rank: MISMATCH when any rank differs. */
function checkSignature(lib: MpiLibrary, comm: Handle, sigs: Int32Array, job: CommJob): number {
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

/** Sleeps of the back-off, on a cell nobody notifies. */
const cell = new Int32Array(new SharedArrayBuffer(4));

/**
 * Waits for a started nonblocking collective: `MPI_Test` in a loop for about as long as the
 * transfer should take at 4 GB/s (at least 0.2 ms), then with sleeps doubling from 20 us to
 * 1 ms in between. MPI's blocking calls spin until done, which on a host with fewer free cores
 * than busy threads takes the CPU from the ranks still computing, the very ranks the waiting
 * one waits for: measured on 2 oversubscribed ranks under load, a 0.8 MB all-reduce after
 * 2 ms of compute took 64-72 ms at the median blocking, 26 ms with this back-off.
 */
function finish(lib: MpiLibrary, request: BigUint64Array, bytes: number): number {
  const flag = new Int32Array(1);
  const spinMs = Math.max(0.2, bytes / 4e6);
  const t0 = performance.now();
  let sleep = 0.02;
  for (;;) {
    const rc = lib.fn.MPI_Test(request, flag, lib.c.statusIgnore);
    if (rc !== 0 || flag[0]) return rc;
    if (performance.now() - t0 > spinMs) {
      Atomics.wait(cell, 0, 0, sleep);
      sleep = Math.min(sleep * 2, 1);
    }
  }
}

/**
 * Runs `job` (after the debug signature check when `sigs` is given): a blocking form as MPI's
 * blocking call, at full speed while the main thread waits; an async one as a nonblocking
 * collective waited for by `finish`, which leaves the CPU to the main thread's compute.
 *
 * @param lib The MPI library.
 * @param comm The group's communicator.
 * @param job The collective.
 * @param sigs Where every rank's signature goes, in debug mode; null otherwise.
 * @returns MPI's status, or MISMATCH.
 */
export function runJob(
  lib: MpiLibrary,
  comm: Handle,
  job: CommJob,
  sigs: Int32Array | null,
): number {
  if (sigs) {
    const rc = checkSignature(lib, comm, sigs, job);
    if (rc !== 0) return rc;
  }
  const f = lib.fn, c = lib.c;
  const type = job.dtype === "f32" ? c.float : job.dtype === "i32" ? c.int : c.byte;
  const op = job.redop === "max" ? c.max : job.redop === "min" ? c.min : c.sum;
  const send = job.inPlace ? c.inPlace : ptr(job.send);
  const recv = ptr(job.recv);
  if (!job.async) {
    switch (job.op) {
      case "allReduce":
        return f.MPI_Allreduce(send, recv, job.count, type, op, comm);
      case "broadcast":
        return f.MPI_Bcast(recv, job.count, type, job.root, comm);
      case "allGather":
        return f.MPI_Allgather(send, job.count, type, recv, job.count, type, comm);
      case "reduceScatter":
        return f.MPI_Reduce_scatter_block(send, recv, job.count, type, op, comm);
      case "barrier":
        return f.MPI_Barrier(comm);
    }
  }
  const req = new BigUint64Array(1);
  let rc: number;
  switch (job.op) {
    case "allReduce":
      rc = f.MPI_Iallreduce(send, recv, job.count, type, op, comm, req);
      break;
    case "broadcast":
      rc = f.MPI_Ibcast(recv, job.count, type, job.root, comm, req);
      break;
    case "allGather":
      rc = f.MPI_Iallgather(send, job.count, type, recv, job.count, type, comm, req);
      break;
    case "reduceScatter":
      rc = f.MPI_Ireduce_scatter_block(send, recv, job.count, type, op, comm, req);
      break;
    case "barrier":
      rc = f.MPI_Ibarrier(comm, req);
      break;
  }
  if (rc !== 0) return rc;
  return finish(lib, req, job.count * (job.dtype === "byte" ? 1 : 4));
}
