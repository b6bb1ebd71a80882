/**
 * What the main thread and the communication worker of a process group exchange: the job
 * message, the result slots and the collective signatures of the debug check.
 *
 * @module
 */

import type { CollectiveOp } from "./process_group.ts";

export type { CollectiveOp };

/** The collectives, in the order of their codes in a signature. */
export const OPS: readonly CollectiveOp[] = [
  "allReduce",
  "broadcast",
  "allGather",
  "reduceScatter",
  "barrier",
];

/** The element types MPI moves: fp16 travels as bytes or is reduced as f32. */
export const WIRE_DTYPES = ["f32", "i32", "byte"] as const;

/** The reductions MPI runs (the average is a sum, divided after). */
export const REDOPS = ["sum", "max", "min"] as const;

/** One collective for the communication worker. */
export interface CommJob {
  /** The group's sequence number of this collective (0, 1, ...). */
  seq: number;
  op: CollectiveOp;
  /** Source address (0 for none). */
  send: bigint;
  /** Destination address (the buffer itself for in-place and broadcast). */
  recv: bigint;
  /** Reduce in place (`MPI_IN_PLACE` as the source). */
  inPlace: boolean;
  /** Elements per rank (allGather, reduceScatter) or in all (allReduce, broadcast). */
  count: number;
  dtype: typeof WIRE_DTYPES[number];
  redop: typeof REDOPS[number];
  root: number;
  /** The user's dtype code (f16 reduced as f32 must still match another rank's f16). */
  userDtype: number;
  /**
   * Issued by an async form: run as a nonblocking MPI collective whose wait yields the CPU,
   * since the main thread computes meanwhile. A blocking form runs MPI's blocking call. MPI
   * does not match a blocking collective with a nonblocking one, so every rank must issue a
   * given collective in the same form (the debug check compares it).
   */
  async: boolean;
}

/**
 * Cells of a group's progress array: MPI collectives issued and completed, the same of NCCL
 * (read by the watchdog's responder), then the MPI collective the main thread runs itself (its
 * sequence number + 1, 0 for none) and its op's index in {@linkcode OPS} (read by the
 * communication thread's watchdog).
 */
export const ISSUED = 0, COMPLETED = 1, DIRECT_SEQ = 4, DIRECT_OP = 5, PROGRESS_INTS = 6;

/** Result slots in the shared array (each `[done, status]`): more than ever outstanding. */
export const SLOTS = 4096;

/** Status of a collective whose signature differed between ranks (debug mode). */
export const MISMATCH = -2;

/** Ints in a collective's signature: sequence, op, dtype, count, root. */
export const SIG_INTS = 5;

/**
 * The signature every rank must agree on before a collective in debug mode.
 *
 * @param job The collective.
 * @returns `[seq, op, dtype, count, root]`.
 */
export function signatureOf(job: CommJob): number[] {
  return [
    job.seq,
    OPS.indexOf(job.op) + (job.async ? ASYNC : 0),
    job.userDtype,
    job.count,
    job.root,
  ];
}

/** Added to the op code of an async collective's signature. */
const ASYNC = 16;

/** The user-facing dtypes, in the order of their codes in a signature. */
export const USER_DTYPES = ["f32", "f16", "i32", "bf16"] as const;

/**
 * A signature in words, for the mismatch error.
 *
 * @param sig `[seq, op, dtype, count, root]`.
 * @returns E.g. `allReduce #3 of 1000 f32`.
 */
export function describeSignature(sig: ArrayLike<number>): string {
  const name = OPS[sig[1] % ASYNC] ?? `op ${sig[1]}`;
  const form = sig[1] >= ASYNC ? " (async)" : "";
  if (name === "barrier") return `barrier #${sig[0]}${form}`;
  const root = name === "broadcast" ? ` from rank ${sig[4]}` : "";
  return `${name} #${sig[0]} of ${sig[3]} ${USER_DTYPES[sig[2]] ?? "?"}${root}${form}`;
}
