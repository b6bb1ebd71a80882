/**
 * How the ranks of a torchrun-style launch (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
 * `MASTER_PORT`, no MPI) agree on NCCL's unique id: a small TCP exchange, run on a worker
 * thread while the calling thread waits, bounded by the group's timeout.
 *
 * @module
 */

/** The first word of a rank's hello. */
export const MAGIC = 0x50534e43;

/** What the rendezvous thread is given. */
export interface RendezvousJob {
  addr: string;
  port: number;
  rank: number;
  size: number;
  timeoutMs: number;
  /** The id's 128 bytes: rank 0's to hand out, the others' to fill. */
  id: SharedArrayBuffer;
  /** [0]: 0 while under way, 1 done, -1 failed. */
  state: SharedArrayBuffer;
  /** The failure, as UTF-8. */
  message: SharedArrayBuffer;
}

let server: Worker | null = null;

/**
 * Exchanges the id: rank 0 hands out `id`, the others receive it into `id`. Rank 0 returns at
 * once, serving the others from its thread until all came (or the timeout passed).
 *
 * @param master `MASTER_ADDR` and `MASTER_PORT`.
 * @param rank This rank.
 * @param size The number of ranks.
 * @param id The id (rank 0) or where to put it.
 * @param timeoutMs How long to wait for rank 0.
 * @throws {Error} When rank 0 cannot be reached in time, naming the address.
 */
export function rendezvous(
  master: { addr: string; port: number },
  rank: number,
  size: number,
  id: Uint8Array,
  timeoutMs: number,
): void {
  const shared = new Uint8Array(new SharedArrayBuffer(id.length));
  shared.set(id);
  const job: RendezvousJob = {
    ...master,
    rank,
    size,
    timeoutMs,
    id: shared.buffer as SharedArrayBuffer,
    state: new SharedArrayBuffer(4),
    message: new SharedArrayBuffer(512),
  };
  const worker = new Worker(new URL("./_rendezvous_worker.ts", import.meta.url), {
    type: "module",
  });
  worker.postMessage(job);
  const state = new Int32Array(job.state);
  Atomics.wait(state, 0, 0, timeoutMs + 5000);
  const code = Atomics.load(state, 0);
  if (rank === 0 && code === 1) {
    server = worker; // serves until every rank came; ends with the process otherwise
    return;
  }
  worker.terminate();
  if (code !== 1) {
    const text = new TextDecoder().decode(new Uint8Array(job.message)).replace(/\0+$/, "");
    throw new Error(
      `Cannot join the nccl group through ${master.addr}:${master.port} (MASTER_ADDR, ` +
        `MASTER_PORT) as rank ${rank} of ${size}: ${text || "no answer"}`,
    );
  }
  id.set(shared);
}

/** Stops rank 0's rendezvous thread (when the group is disposed). */
export function stopRendezvous(): void {
  server?.terminate();
  server = null;
}
