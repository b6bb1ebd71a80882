/**
 * The watchdog's responder thread (see _watchdog.ts): answers "how far are you" queries with
 * this rank's collective counts, and ends the process when its launcher is gone.
 *
 * It polls (MPI's blocking receive spins a core) every {@linkcode POLL_MS}.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import { handleOf, type MpiLibrary, openMpi } from "./_mpi.ts";
import { TAG_QUERY, TAG_REPLY } from "./_watchdog.ts";

const POLL_MS = 50;

interface Init {
  path: string;
  comm: bigint | number;
  rank: number;
  progress: SharedArrayBuffer;
  stop: SharedArrayBuffer;
}

const libc = Deno.dlopen("libc.so.6", {
  getppid: { parameters: [], result: "i32" },
  kill: { parameters: ["i32", "i32"], result: "i32" },
  _exit: { parameters: ["i32"], result: "void" },
});

function gone(launcherPid: number, parent: number): string | null {
  const p = libc.symbols.getppid();
  if (p !== parent) return `its parent process ${parent} exited`;
  // kill(pid, 0) checks existence only; ESRCH (-1) means the process is gone.
  if (launcherPid > 0 && libc.symbols.kill(launcherPid, 0) !== 0) {
    return `the launcher (pid ${launcherPid}) exited`;
  }
  return null;
}

function serve(lib: MpiLibrary, m: Init): void {
  const comm = handleOf(m.comm);
  const progress = new Int32Array(m.progress);
  const stop = new Int32Array(m.stop);
  const flag = new Int32Array(1);
  const status = new Int32Array(8);
  const query = new Int32Array(2);
  // Answers and their requests stay referenced until the process ends: the sends complete
  // whenever the asking rank receives, and this thread never waits for them.
  const pending: Int32Array[] = [];
  const launcherPid = Number(Deno.env.get("PINSTREAM_LAUNCHER_PID") ?? 0);
  const parent = libc.symbols.getppid();
  Atomics.store(stop, 1, 1);
  while (Atomics.load(stop, 0) === 0) {
    const why = gone(launcherPid, parent);
    if (why !== null) {
      console.error(`pinstream: rank ${m.rank} exits: ${why}`);
      libc.symbols._exit(1);
    }
    lib.fn.MPI_Iprobe(lib.c.anySource, TAG_QUERY, comm, flag, status);
    if (!flag[0]) {
      Atomics.wait(stop, 0, 0, POLL_MS);
      continue;
    }
    const from = status[lib.c.statusSourceIndex];
    lib.fn.MPI_Recv(
      Deno.UnsafePointer.of(query),
      2,
      lib.c.int,
      from,
      TAG_QUERY,
      comm,
      lib.c.statusIgnore,
    );
    // [rank, MPI collectives issued, completed, NCCL collectives issued, completed]
    const answer = new Int32Array([m.rank, ...[0, 1, 2, 3].map((i) => Atomics.load(progress, i))]);
    const request = new Int32Array(4);
    pending.push(answer, request);
    lib.fn.MPI_Isend(
      Deno.UnsafePointer.of(answer),
      5,
      lib.c.int,
      from,
      TAG_REPLY,
      comm,
      request,
    );
  }
  Atomics.store(stop, 1, 0);
  Atomics.notify(stop, 1);
}

self.onmessage = (e: MessageEvent<Init>) => {
  serve(openMpi({ path: e.data.path }), e.data);
};
