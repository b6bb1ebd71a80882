/**
 * Where this process sits in a distributed job, read from its launcher's environment.
 *
 * @module
 */

import { launcherFlavor } from "./_mpi.ts";

/** An MPI ABI family: Open MPI, or MPICH (and its derivatives). */
export type MpiFlavor = "openmpi" | "mpich";

/** This process's place in the job, and who said so. */
export interface LaunchEnv {
  /** This process's rank (0 when not launched). */
  rank: number;
  /** The number of processes (1 when not launched). */
  size: number;
  /**
   * The launcher: Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`), MPICH's Hydra (`PMI_RANK`,
   * `PMI_SIZE`), a torchrun-style one (`RANK`, `WORLD_SIZE`), or none.
   */
  launcher: MpiFlavor | "torchrun" | "none";
  /** Rendezvous address of a torchrun-style launch (`MASTER_ADDR`, `MASTER_PORT`). */
  master: { addr: string; port: number } | null;
}

function intVar(env: (n: string) => string | undefined, name: string): number | undefined {
  const v = env(name);
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) {
    throw new RangeError(
      `Cannot read the launch environment: ${name} must be a non-negative integer, got "${v}"`,
    );
  }
  return n;
}

/**
 * Reads the launcher's variables: Open MPI's first, then MPICH's, then torchrun's; a process
 * started without any is rank 0 of 1.
 *
 * @param env How to read a variable (default `Deno.env.get`).
 * @returns Rank, size and launcher.
 * @throws {RangeError} When a variable is not an integer or the rank is not below the size.
 * @example
 * ```ts
 * import { launchEnv } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const vars: Record<string, string> = { PMI_RANK: "1", PMI_SIZE: "4" };
 * const e = launchEnv((n) => vars[n]);
 * assert.deepStrictEqual([e.rank, e.size, e.launcher], [1, 4, "mpich"]);
 * assert.strictEqual(launchEnv(() => undefined).size, 1);
 * ```
 */
export function launchEnv(env: (name: string) => string | undefined = Deno.env.get): LaunchEnv {
  const get = (n: string) => env(n);
  const flavor = launcherFlavor(get);
  let rank: number | undefined, size: number | undefined;
  let launcher: LaunchEnv["launcher"] = "none";
  if (flavor === "openmpi") {
    rank = intVar(get, "OMPI_COMM_WORLD_RANK");
    size = intVar(get, "OMPI_COMM_WORLD_SIZE");
    launcher = flavor;
  } else if (flavor === "mpich") {
    rank = intVar(get, "PMI_RANK");
    size = intVar(get, "PMI_SIZE");
    launcher = flavor;
  } else if (get("WORLD_SIZE") !== undefined) {
    rank = intVar(get, "RANK");
    size = intVar(get, "WORLD_SIZE");
    launcher = "torchrun";
  }
  rank ??= 0;
  size ??= 1;
  if (size < 1 || rank >= size) {
    throw new RangeError(
      `Cannot read the launch environment: rank ${rank} is not below the world size ${size}`,
    );
  }
  const addr = get("MASTER_ADDR");
  const port = intVar(get, "MASTER_PORT");
  return {
    rank,
    size,
    launcher,
    master: addr !== undefined && port !== undefined ? { addr, port } : null,
  };
}
