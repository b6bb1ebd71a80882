/**
 * Starting a job: the `mpirun` command line that runs a Deno script as `n` ranks on this
 * machine, for Open MPI or MPICH (what `deno task launch` runs).
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import type { MpiFlavor } from "./launch_env.ts";

/** Options of {@linkcode mpirunCommand}. */
export interface MpirunOptions {
  /** Number of ranks. */
  n: number;
  /** Which MPI's launcher (default: Open MPI's when installed, else MPICH's). */
  mpi?: MpiFlavor;
  /** Arguments of `deno` after `run` (default `["-A"]`). */
  denoFlags?: string[];
  /** Extra arguments of mpirun, before the program (hosts, network interface...). */
  mpirunArgs?: string[];
}

/** The launcher programs, by family (Debian's names; `mpirun` is whichever is the default). */
const PROGRAMS: Record<MpiFlavor, string> = {
  openmpi: "mpirun.openmpi",
  mpich: "mpirun.mpich",
};

function installed(program: string): boolean {
  try {
    const r = new Deno.Command("which", { args: [program], stdout: "null", stderr: "null" })
      .outputSync();
    return r.success;
  } catch {
    return false;
  }
}

/**
 * The MPI families whose launcher is installed here.
 *
 * @returns E.g. `["openmpi", "mpich"]`.
 * @example
 * ```ts
 * import { availableMpi } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.ok(availableMpi().every((m) => m === "openmpi" || m === "mpich"));
 * ```
 */
export function availableMpi(): MpiFlavor[] {
  return (Object.keys(PROGRAMS) as MpiFlavor[]).filter((f) => installed(PROGRAMS[f]));
}

/**
 * The command that runs `script` as `n` ranks on this machine. Open MPI is told to allow more
 * ranks than cores (`--oversubscribe`) and, when run as root, to accept that
 * (`--allow-run-as-root`); MPICH needs neither.
 *
 * @param script The Deno program and its arguments.
 * @param options Ranks, MPI family, Deno flags, extra mpirun arguments.
 * @returns `[program, ...args]`.
 * @throws {RangeError} When `n` is not a positive integer.
 * @throws {Error} When no MPI launcher is installed.
 * @example
 * ```ts
 * import { mpirunCommand } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const cmd = mpirunCommand(["train.ts", "--epochs", "1"], { n: 2, mpi: "mpich" });
 * assert.deepStrictEqual(cmd.slice(0, 3), ["mpirun.mpich", "-n", "2"]);
 * assert.deepStrictEqual(cmd.slice(-3), ["train.ts", "--epochs", "1"]);
 * ```
 */
export function mpirunCommand(script: string[], options: MpirunOptions): string[] {
  refuseUnknownKeys(options ?? {}, ["n", "mpi", "denoFlags", "mpirunArgs"], "launch ranks");
  const n = options.n;
  if (!Number.isInteger(n) || n < 1) {
    throw new RangeError(`Cannot launch ranks: n must be a positive integer, got ${n}`);
  }
  let mpi = options.mpi;
  if (mpi === undefined) {
    mpi = availableMpi()[0];
    if (mpi === undefined) {
      throw new Error(
        "Cannot launch ranks: no mpirun found; install Open MPI (apt-get install openmpi-bin " +
          "libopenmpi-dev) or MPICH (apt-get install mpich)",
      );
    }
  }
  const args = [PROGRAMS[mpi], "-n", String(n)];
  if (mpi === "openmpi") {
    args.push("--oversubscribe");
    if (Deno.uid() === 0) args.push("--allow-run-as-root");
  }
  args.push(...(options.mpirunArgs ?? []));
  args.push(Deno.execPath(), "run", ...(options.denoFlags ?? ["-A"]), ...script);
  return args;
}
