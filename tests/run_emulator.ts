/**
 * `deno task test:emulator`: the CUDA backend's tests on the CUDA emulator (kernels/emu) in every
 * thread order and stream mode, as CI runs them on machines without a GPU.
 *
 * Every `[cuda]` test runs once per thread order, because no one order exposes every race
 * ("forward" keeps warps in step and misses a missing barrier that "reverse" finds; only
 * "greedy" finds a warp that reads a later warp's writes after a shuffle), then with random
 * delays before each stream operation (host code that reads device results without waiting for
 * them reads stale bytes), with deferred streams (work runs when the host waits for it, the
 * newest wait's needs first: a missing cross-stream wait gives wrong data), and the data-path
 * guide's example (docs/guide.md), whose `Device.open("auto")` trains on the emulated GPU. `deno task test` runs a
 * subset of these (greedy, deferred) after the whole suite.
 *
 *     deno task test:emulator                          # the passes above, random seed 1
 *     deno task test:emulator --seed 0x5eed --rounds 5 # five random-order rounds from a seed
 *
 * A failing pass prints the environment that reproduces it. At the end, every kernel launch in
 * the CUDA sources must have run in some pass (the emulator records the launch sites that ran,
 * `PINSTREAM_EMU_LAUNCHES`): a kernel no test reaches fails the run, naming it.
 *
 * @module
 */

import { launchSites } from "./_emu_sources.ts";
import { SOURCES } from "../ffi/library.ts";

/** One run of `deno` with emulator settings. */
export interface Pass {
  /** What it shows, for the log. */
  what: string;
  /** Environment on top of `PINSTREAM_CUDA_EMULATOR=1`. */
  env: Record<string, string>;
  /** Arguments of `deno`. */
  args: string[];
}

/** `deno test` of every `[cuda]` case. */
export const CUDA_CASES: readonly string[] = ["test", "-A", "--filter", "[cuda]", "tests/"];

function parse(args: string[]): { seed: bigint; rounds: number } {
  let seed = 1n, rounds = 1;
  for (let i = 0; i < args.length; i++) {
    const [flag, inline] = args[i].split("=", 2);
    const value = inline ?? args[++i];
    if (flag === "--seed") seed = BigInt(value);
    else if (flag === "--rounds") rounds = Number(value);
    else throw new TypeError(`Cannot run: unknown argument ${args[i]} (use --seed N, --rounds N)`);
    if (!(rounds >= 1 && Number.isInteger(rounds))) {
      throw new RangeError(`Cannot run: --rounds must be a positive integer, got ${value}`);
    }
  }
  return { seed, rounds };
}

/** The passes, in order. */
function passes(seed: bigint, rounds: number): Pass[] {
  const cuda = [...CUDA_CASES];
  const out: Pass[] = [
    { what: "forward order", env: { PINSTREAM_EMU_ORDER: "forward" }, args: cuda },
    { what: "reverse order", env: { PINSTREAM_EMU_ORDER: "reverse" }, args: cuda },
    { what: "greedy order", env: { PINSTREAM_EMU_ORDER: "greedy" }, args: cuda },
    { what: "greedy-reverse order", env: { PINSTREAM_EMU_ORDER: "greedy-reverse" }, args: cuda },
  ];
  for (let r = 0; r < rounds; r++) {
    const s = `0x${(seed + BigInt(r)).toString(16)}`;
    out.push({
      what: `random order, seed ${s}`,
      env: { PINSTREAM_EMU_ORDER: "random", PINSTREAM_EMU_SEED: s },
      args: cuda,
    });
  }
  const s = `0x${seed.toString(16)}`;
  out.push({
    what: `random order and stream delays up to 1 ms, seed ${s}`,
    env: { PINSTREAM_EMU_ORDER: "random", PINSTREAM_EMU_SEED: s, PINSTREAM_EMU_DELAY_US: "1000" },
    args: cuda,
  });
  out.push({
    what: `deferred streams, random order, seed ${s}`,
    env: {
      PINSTREAM_EMU_ORDER: "random",
      PINSTREAM_EMU_SEED: s,
      PINSTREAM_EMU_STREAMS: "deferred",
    },
    args: cuda,
  });
  out.push({
    what: "the data-path guide's example (docs/guide.md) on the emulated GPU",
    env: { PINSTREAM_EMU_ORDER: "random", PINSTREAM_EMU_SEED: s },
    args: ["test", "-A", "--doc", "docs/guide.md"],
  });
  return out;
}

/** Launch sites ("cuda/conv.cu:40 gemm_kernel") of the CUDA sources that no pass ran. */
async function notRun(ran: string): Promise<string[]> {
  const seen = new Set((await Deno.readTextFile(ran)).split("\n").filter((l) => l !== ""));
  const missing: string[] = [];
  for (const rel of SOURCES.cuda.filter((p) => p.endsWith(".cu"))) {
    const text = await Deno.readTextFile(new URL(`../kernels/${rel}`, import.meta.url));
    for (const { line, kernel } of launchSites(text)) {
      const site = `${rel}:${line} ${kernel}`;
      if (!seen.has(site)) missing.push(site);
    }
  }
  return missing;
}

/**
 * Runs the passes (see {@linkcode runPasses}), then fails unless every kernel launch of the
 * CUDA sources ran in one of them.
 *
 * @param list The passes.
 * @param base Environment under each pass's own.
 * @returns The first failing pass's exit code, 1 when a launch never ran, else 0.
 */
export async function runCovering(
  list: Pass[],
  base?: Record<string, string>,
): Promise<number> {
  const ran = await Deno.makeTempFile({ prefix: "pinstream-emu-launches-" });
  try {
    const code = await runPasses(list, ran, base);
    if (code !== 0) return code;
    const missing = await notRun(ran);
    if (missing.length > 0) {
      console.error(`\n== kernel launches no emulated test ran:\n${missing.join("\n")}`);
      return 1;
    }
    console.log("\n== every kernel launch of the CUDA backend ran on the emulator");
    return 0;
  } finally {
    await Deno.remove(ran);
  }
}

async function main(argv: string[]): Promise<number> {
  const { seed, rounds } = parse(argv);
  return await runCovering(passes(seed, rounds));
}

/**
 * Runs each pass with `PINSTREAM_CUDA_EMULATOR=1`, stopping at the first that fails (and saying
 * how to reproduce it).
 *
 * @param list The passes.
 * @param ran The file the emulator appends the launch sites that ran to.
 * @param base Environment under each pass's own.
 * @returns The first failing pass's exit code, or 0.
 */
export async function runPasses(
  list: Pass[],
  ran: string,
  base: Record<string, string> = { PINSTREAM_CUDA_EMULATOR: "1" },
): Promise<number> {
  for (const [i, pass] of list.entries()) {
    const env = { ...base, PINSTREAM_EMU_LAUNCHES: ran, ...pass.env };
    console.log(`\n== pass ${i + 1}/${list.length}: ${pass.what}`);
    const t0 = performance.now();
    const { code } = await new Deno.Command(Deno.execPath(), {
      args: pass.args,
      env,
      stdout: "inherit",
      stderr: "inherit",
    }).output();
    const secs = ((performance.now() - t0) / 1000).toFixed(1);
    if (code !== 0) {
      const vars = Object.entries(env).filter(([k]) => k !== "PINSTREAM_EMU_LAUNCHES")
        .map(([k, v]) => `${k}=${v}`).join(" ");
      console.error(
        `\n== pass ${i + 1}/${list.length} failed (${secs} s); reproduce with:\n${vars} deno ${
          pass.args.join(" ")
        }`,
      );
      return code;
    }
    console.log(`== pass ${i + 1}/${list.length} passed (${secs} s)`);
  }
  return 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
