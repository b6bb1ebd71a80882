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

/**
 * Runs `job` (after the debug signature check when `sigs` is given).
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
