/**
 * The collective watchdog: when a collective waits past the group's timeout, the waiting rank
 * asks every other rank how far it got, over a communicator of its own, and names the ranks
 * that never issued the collective or never answered. Each rank answers through a
 * {@linkcode Responder}, a thread of its own that keeps answering while the main thread is
 * stuck in user code and the communication thread inside a collective.
 *
 * The responder also ends the process when the launcher is gone (its parent process changed,
 * or the pid in `PINSTREAM_LAUNCHER_PID` died), so that killing the launcher leaves no rank
 * behind.
 *
 * @module
 */

import { handleValue, type MpiLibrary } from "./_mpi.ts";
import type { Handle } from "./_mpi_symbols.ts";

/** Tag of a "how far are you" query, and of its answer. */
export const TAG_QUERY = 0x5057;
export const TAG_REPLY = 0x5058;

/** How long the waiting rank collects answers. */
const ANSWER_MS = 3000;

/** The responder thread of one rank (see the module documentation). */
export class Responder {
  #worker: Worker;
  #stop = new Int32Array(new SharedArrayBuffer(8));

  /**
   * Starts the thread.
   *
   * @param lib The MPI library.
   * @param comm The watchdog's communicator.
   * @param rank This rank.
   * @param progress `[issued, completed]` MPI collectives of this rank, then the same of its
   *   NCCL collectives, kept current by the group.
   */
  constructor(lib: MpiLibrary, comm: Handle, rank: number, progress: Int32Array) {
    this.#worker = new Worker(new URL("./_responder_worker.ts", import.meta.url), {
      type: "module",
    });
    this.#worker.postMessage({
      path: lib.path,
      comm: handleValue(comm),
      rank,
      progress: progress.buffer,
      stop: this.#stop.buffer,
    });
  }

  /** Stops the thread and waits until it left MPI (before MPI_Finalize). */
  stop(): void {
    Atomics.store(this.#stop, 0, 1);
    Atomics.notify(this.#stop, 0);
    // The thread acknowledges in slot 1 once out of its polling loop; before it started
    // polling there is nothing to wait for.
    if (Atomics.load(this.#stop, 1) === 1) Atomics.wait(this.#stop, 1, 1, 5000);
    this.#worker.terminate();
  }
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4));
function sleepMs(ms: number): void {
  Atomics.wait(sleepCell, 0, 0, ms);
}

/** What the waiting rank knows about the collective that timed out. */
export interface Stalled {
  rank: number;
  size: number;
  seq: number;
  op: string;
  timeoutMs: number;
  /** Whose sequence `seq` counts: the group's MPI collectives (default) or its NCCL ones. */
  engine?: "mpi" | "nccl";
}

/**
 * Asks every other rank how far it got and words the timeout error.
 *
 * @param lib The MPI library.
 * @param comm The watchdog's communicator.
 * @param s The collective that timed out.
 * @returns The error message, naming the ranks that did not arrive.
 */
export function diagnoseTimeout(lib: MpiLibrary, comm: Handle, s: Stalled): string {
  const f = lib.fn;
  const query = new Int32Array([s.rank, s.seq]);
  const requests = new BigUint64Array(s.size);
  for (let r = 0; r < s.size; r++) {
    if (r === s.rank) continue;
    // Never waited for: a dead rank would leave the send pending, and the process exits soon.
    f.MPI_Isend(
      Deno.UnsafePointer.of(query),
      2,
      lib.c.int,
      r,
      TAG_QUERY,
      comm,
      requests.subarray(r, r + 1),
    );
  }
  const answers = new Map<number, { issued: number; completed: number }>();
  const flag = new Int32Array(1);
  const status = new Int32Array(8);
  const reply = new Int32Array(5);
  const at = s.engine === "nccl" ? 3 : 1;
  const deadline = Date.now() + ANSWER_MS;
  while (answers.size < s.size - 1 && Date.now() < deadline) {
    f.MPI_Iprobe(lib.c.anySource, TAG_REPLY, comm, flag, status);
    if (!flag[0]) {
      sleepMs(10);
      continue;
    }
    const from = status[lib.c.statusSourceIndex];
    f.MPI_Recv(
      Deno.UnsafePointer.of(reply),
      5,
      lib.c.int,
      from,
      TAG_REPLY,
      comm,
      lib.c.statusIgnore,
    );
    answers.set(reply[0], { issued: reply[at], completed: reply[at + 1] });
  }
  const notIssued: string[] = [], silent: string[] = [], waiting: number[] = [];
  for (let r = 0; r < s.size; r++) {
    if (r === s.rank) continue;
    const a = answers.get(r);
    if (!a) silent.push(`rank ${r}`);
    else if (a.issued <= s.seq) {
      notIssued.push(
        `rank ${r} never issued it (${
          a.issued === 0 ? "it issued no collective" : `its last was #${a.issued - 1}`
        })`,
      );
    } else waiting.push(r);
  }
  const parts: string[] = [...notIssued];
  if (silent.length) {
    parts.push(
      `${silent.join(", ")} did not answer within ${ANSWER_MS / 1000} s (the process died ` +
        `or is frozen)`,
    );
  }
  if (waiting.length) parts.push(`rank ${waiting.join(", ")} issued it and wait too`);
  return `Cannot finish ${s.op} #${s.seq} on rank ${s.rank}: no progress within ` +
    `${s.timeoutMs} ms: ${parts.join("; ") || "every rank issued it (a network fault?)"}`;
}
