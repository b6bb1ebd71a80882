/**
 * Helpers of the distributed tests: which MPI launchers are installed, and running a child
 * script as n ranks under one of them with a time limit.
 *
 * @module
 */

import { availableMpi, mpirunCommand } from "../dist/launcher.ts";

/** The installed MPI families; a test over MPI skips visibly when this is empty. */
export const MPIS = availableMpi();
if (MPIS.length === 0) {
  console.warn("dist tests skipped: no mpirun (apt-get install openmpi-bin libopenmpi-dev mpich)");
}

/** What a run of ranks printed and how it ended. */
export interface RanksResult {
  code: number;
  stdout: string;
  stderr: string;
  ms: number;
}

/**
 * Runs `script` as `n` ranks and waits at most `limitMs` (then kills the launcher).
 *
 * @param mpi The MPI family.
 * @param n Ranks.
 * @param script The child script (relative to tests/) and its arguments.
 * @param options Extra environment, time limit.
 * @returns Exit code and output.
 */
export async function runRanks(
  mpi: "openmpi" | "mpich",
  n: number,
  script: string[],
  options: { env?: Record<string, string>; limitMs?: number } = {},
): Promise<RanksResult> {
  const path = new URL(script[0], import.meta.url).pathname;
  const [cmd, ...args] = mpirunCommand([path, ...script.slice(1)], { n, mpi });
  const t0 = performance.now();
  const child = new Deno.Command(cmd, {
    args,
    env: { NO_COLOR: "1", ...options.env },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const timer = setTimeout(() => {
    try {
      child.kill("SIGKILL");
    } catch { /* already gone */ }
  }, options.limitMs ?? 120_000);
  const out = await child.output();
  clearTimeout(timer);
  const dec = new TextDecoder();
  return {
    code: out.code,
    stdout: dec.decode(out.stdout),
    stderr: dec.decode(out.stderr),
    ms: performance.now() - t0,
  };
}

/** A TCP port free on the loopback now. */
export function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/**
 * Runs `script` as `n` ranks of a torchrun-style launch (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
 * `MASTER_PORT` on the loopback; no MPI), waiting at most `limitMs`, and joins their output.
 *
 * @param n Ranks.
 * @param script The child script (relative to tests/) and its arguments.
 * @param options Extra environment, time limit, ranks not to start.
 * @returns The first non-zero exit code (or 0) and every rank's output.
 */
export async function runTorchrunStyle(
  n: number,
  script: string[],
  options: { env?: Record<string, string>; limitMs?: number; skip?: number[] } = {},
): Promise<RanksResult> {
  const path = new URL(script[0], import.meta.url).pathname;
  const port = String(freePort());
  const t0 = performance.now();
  const ranks = [...Array(n).keys()].filter((r) => !options.skip?.includes(r));
  const children = ranks.map((r) =>
    new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", path, ...script.slice(1)],
      env: {
        NO_COLOR: "1",
        RANK: String(r),
        LOCAL_RANK: String(r),
        WORLD_SIZE: String(n),
        MASTER_ADDR: "127.0.0.1",
        MASTER_PORT: port,
        ...options.env,
      },
      stdout: "piped",
      stderr: "piped",
    }).spawn()
  );
  const timer = setTimeout(() => {
    for (const c of children) {
      try {
        c.kill("SIGKILL");
      } catch { /* already gone */ }
    }
  }, options.limitMs ?? 120_000);
  const outs = await Promise.all(children.map((c) => c.output()));
  clearTimeout(timer);
  const dec = new TextDecoder();
  return {
    code: outs.find((o) => o.code !== 0)?.code ?? 0,
    stdout: outs.map((o) => dec.decode(o.stdout)).join(""),
    stderr: outs.map((o) => dec.decode(o.stderr)).join(""),
    ms: performance.now() - t0,
  };
}

/**
 * Throws unless every rank printed `ok <rank>` and the run exited 0.
 *
 * @param r The run.
 * @param n Ranks.
 */
export function assertAllOk(r: RanksResult, n: number): void {
  for (let k = 0; k < n; k++) {
    if (r.code !== 0 || !new RegExp(`^ok ${k}\\b`, "m").test(r.stdout)) {
      throw new Error(`rank ${k} did not finish (exit ${r.code}):\n${r.stdout}\n${r.stderr}`);
    }
  }
}
