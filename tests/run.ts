/**
 * `deno task test`: the whole test suite, with the CUDA backend's cases run, not skipped, on
 * every machine.
 *
 * 1. Every test file and documentation example (`deno test --doc` over the sources and the
 *    README). On a machine without a GPU the `cuda` backend is the CUDA emulator
 *    (`PINSTREAM_CUDA_EMULATOR=1`, kernels/emu: the real kernels/cuda sources built with the
 *    host C++ compiler), in the forward thread order, so no `[cuda]` case is ignored.
 * 2. The `[cuda]` cases again on the emulator in the greedy thread order (a warp runs as far as
 *    it can before the next starts: the races the forward order hides), then with deferred
 *    streams in a seeded random order (work runs when the host waits for it, so a missing
 *    event wait gives wrong data instead of passing by luck).
 * 3. Every kernel launch of kernels/cuda must have run in some pass.
 *
 *     deno task test                      # all of the above
 *     deno task test --filter "loader"    # only step 1, with deno test's arguments
 *     PINSTREAM_EMU_SEED=0x5eed deno task test   # another random order in step 2
 *     PINSTREAM_TEST_GPU_ONLY=1 deno task test    # with a GPU: step 1 on it, no emulator passes
 *
 * `deno task test:emulator` runs more emulator passes (reverse orders, random rounds, delays).
 *
 * @module
 */

import { Device } from "../ffi/device.ts";
import { PinstreamError } from "../internal/errors.ts";
import { cudaEmulated } from "../ffi/library.ts";
import { CUDA_CASES, runCovering } from "./run_emulator.ts";

/** What `deno test` covers: the README's test command. */
const SUITE = [
  "test",
  "-A",
  "--lock=deno.lock",
  "--doc",
  "tests/",
  "internal/",
  "augment/",
  "ffi/",
  "ops/",
  "loader/",
  "decode/",
  "pipeline/",
  "nn/",
  "train/",
  "dist/",
  "examples/",
  "mod.ts",
  "README.md",
  "docs/",
];

/** Whether a real GPU answers as the cuda backend here. */
function haveGpu(): boolean {
  if (cudaEmulated()) return false;
  try {
    Device.open("cuda").dispose();
    return true;
  } catch (err) {
    if (err instanceof PinstreamError) return false;
    throw err;
  }
}

/** Runs deno with `args`, its output on this terminal (`output()` would pipe it), its exit code. */
async function deno(args: string[], env: Record<string, string>): Promise<number> {
  const out = new Deno.Command(Deno.execPath(), {
    args,
    env,
    stdout: "inherit",
    stderr: "inherit",
  });
  return (await out.output()).code;
}

async function main(args: string[]): Promise<number> {
  const gpu = haveGpu();
  const seed = Deno.env.get("PINSTREAM_EMU_SEED") ?? "1";
  const emulated: Record<string, string> = gpu
    ? {}
    : { PINSTREAM_CUDA_EMULATOR: "1", PINSTREAM_EMU_ORDER: "forward" };
  console.log(
    gpu
      ? "== a GPU is present: the [cuda] cases run on it, then on the CUDA emulator"
      : "== no GPU here: the [cuda] cases run on the CUDA emulator (kernels/emu)",
  );
  if (args.length > 0) {
    return await deno(["test", "-A", ...args], emulated);
  }
  if (gpu && Deno.env.get("PINSTREAM_TEST_GPU_ONLY") === "1") {
    // The emulator passes are the same on every machine (CI runs them): on a GPU machine
    // with little time, the suite on the GPU alone.
    console.log("== PINSTREAM_TEST_GPU_ONLY=1: the whole suite on the GPU, no emulator passes");
    return await deno(SUITE, {});
  }
  const emu = { PINSTREAM_CUDA_EMULATOR: "1" };
  return await runCovering([
    // On the GPU when there is one: only the later passes force the emulator.
    { what: "the whole suite", env: emulated, args: SUITE },
    {
      what: "[cuda] cases on the emulator, greedy order",
      env: { ...emu, PINSTREAM_EMU_ORDER: "greedy" },
      args: [...CUDA_CASES],
    },
    {
      what: `[cuda] cases on the emulator, deferred streams, random order (seed ${seed})`,
      env: {
        ...emu,
        PINSTREAM_EMU_ORDER: "random",
        PINSTREAM_EMU_SEED: seed,
        PINSTREAM_EMU_STREAMS: "deferred",
      },
      args: [...CUDA_CASES],
    },
  ], {});
}

if (import.meta.main) Deno.exit(await main(Deno.args));
