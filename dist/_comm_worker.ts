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
import { type CommJob, SLOTS } from "./_protocol.ts";
import { runJob } from "./_run_job.ts";

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
    status = runJob(lib, comm, m, debug ? sigs : null);
  } catch {
    status = -3;
  }
  Atomics.store(progress, 1, m.seq + 1);
  Atomics.store(results, slot + 1, status);
  Atomics.store(results, slot, 1);
  Atomics.notify(results, slot);
};
