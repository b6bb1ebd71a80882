/**
 * `deno task launch`: runs a Deno program as n ranks of a data-parallel job on this machine,
 * through mpirun (Open MPI's, or MPICH's with --mpi mpich).
 *
 *     deno task launch -n 2 examples/fashion_mnist.ts --epochs 1
 *     deno task launch -n 4 --mpi mpich examples/cifar.ts --model resnet
 *     deno task launch -n 8 --mpirun "--hostfile hosts --mca btl_tcp_if_include eth0" train.ts
 *
 * A thin wrapper: it adds what this machine needs (more ranks than cores, root), forwards
 * SIGINT and SIGTERM to mpirun, and passes its own pid to the ranks, whose watchdog thread
 * ends them should this process be killed outright (so nothing is left behind). It exits
 * with mpirun's status.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { mpirunCommand } from "../dist/launcher.ts";

const USAGE = "usage: deno task launch -n N [--mpi openmpi|mpich] [--mpirun ARGS] PROGRAM.ts " +
  "[program options]";

/**
 * Splits the launcher's own options from the program and its options.
 *
 * @param argv The command line.
 * @returns The options, the program and its arguments.
 */
export function parseLaunchArgs(
  argv: string[],
): { n: number; mpi?: "openmpi" | "mpich"; mpirunArgs: string[]; program: string[] } {
  const at = argv.findIndex((a) => /\.(ts|js|mjs|mts)$/.test(a) && !a.startsWith("-"));
  if (at < 0) throw new Error(`Cannot launch: no program given\n${USAGE}`);
  const { values } = parseArgs({
    args: argv.slice(0, at),
    options: {
      n: { type: "string", short: "n" },
      mpi: { type: "string" },
      mpirun: { type: "string" },
    },
  });
  const n = Number(values.n);
  if (!Number.isInteger(n) || n < 1) {
    throw new Error(`Cannot launch: -n must be a positive integer, got ${values.n}\n${USAGE}`);
  }
  if (values.mpi !== undefined && values.mpi !== "openmpi" && values.mpi !== "mpich") {
    throw new Error(`Cannot launch: --mpi must be openmpi or mpich, got ${values.mpi}`);
  }
  return {
    n,
    mpi: values.mpi as "openmpi" | "mpich" | undefined,
    mpirunArgs: values.mpirun?.split(/\s+/).filter((s) => s) ?? [],
    program: argv.slice(at),
  };
}

if (import.meta.main) {
  let a;
  try {
    a = parseLaunchArgs(Deno.args);
  } catch (e) {
    console.error((e as Error).message);
    Deno.exit(2);
  }
  const [cmd, ...args] = mpirunCommand(a.program, {
    n: a.n,
    mpi: a.mpi,
    mpirunArgs: a.mpirunArgs,
  });
  const child = new Deno.Command(cmd, {
    args,
    env: { PINSTREAM_LAUNCHER_PID: String(Deno.pid) },
    stdin: "inherit",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  const forward = (sig: Deno.Signal) => () => {
    try {
      child.kill(sig);
    } catch { /* already gone */ }
  };
  for (const sig of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(sig, forward(sig));
  const status = await child.status;
  Deno.exit(status.code);
}
