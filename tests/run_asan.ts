/**
 * `deno task test:asan`: the CUDA backend's tests on the CUDA emulator built with
 * AddressSanitizer and UBSan (`PINSTREAM_EMU_SANITIZE=1`: `-O1 -g -fsanitize=address,undefined
 * -fno-sanitize-recover=undefined`, see EMULATOR_SANITIZE_FLAGS in ffi/library.ts).
 *
 * It builds the sanitized library (a cache entry of its own), then runs, with the ASan runtime
 * preloaded into deno (`LD_PRELOAD=$(c++ -print-file-name=libasan.so)`: deno is not built with
 * it, and a sanitized library cannot be dlopen'd otherwise) and the options of tests/_asan.ts:
 *
 *   1. every `[cuda]` test case of tests/ (random thread order, seed 1 unless `--seed N`), so
 *      the kernels of kernels/cuda and the emulator's runtime run instrumented: a heap overflow
 *      in host code, an out-of-bounds access to a host buffer from a kernel, signed overflow,
 *      a bad shift, a misaligned or null pointer dereference, ... ends the run with a report;
 *   2. tests/emu_test.ts and tests/emu_graphs_test.ts, whose programs (tests/emu/selftest.cu,
 *      tests/emu/graphs.cu) are then built with the same sanitizers, and
 *      tests/emu_asan_test.ts, which shows that the sanitizers catch what they should (and that
 *      the emulator's fiber switches give no false reports).
 *
 * Device memory is mmap'd by the emulator and not instrumented (its guard pages catch
 * overruns there, as without the sanitizers). A sanitizer report makes the process exit with
 * code 86 and the run fail; the command that reproduces the failing pass is printed, e.g.
 *
 *     PINSTREAM_CUDA_EMULATOR=1 PINSTREAM_EMU_SANITIZE=1 LD_PRELOAD=/usr/lib/gcc/x86_64-linux-gnu/12/libasan.so \
 *       ASAN_OPTIONS=... UBSAN_OPTIONS=... PINSTREAM_EMU_ORDER=random PINSTREAM_EMU_SEED=0x1 \
 *       deno test -A --filter '[cuda]' tests/
 *
 * (add `--filter 'name of the case'` to run one case). Linux with GCC's or Clang's sanitizer
 * runtime (Debian/Ubuntu: apt-get install g++ libasan8 libubsan1).
 *
 * @module
 */

import { buildLibrary } from "../ffi/library.ts";
import { asanRuntime, sanitizedEnv, SANITIZER_EXIT, SANITIZER_REPORT } from "./_asan.ts";

interface Pass {
  what: string;
  env: Record<string, string>;
  args: string[];
}

function parse(args: string[]): { seed: bigint } {
  let seed = 1n;
  for (let i = 0; i < args.length; i++) {
    const [flag, inline] = args[i].split("=", 2);
    const value = inline ?? args[++i];
    if (flag === "--seed") seed = BigInt(value);
    else throw new TypeError(`Cannot run: unknown argument ${args[i]} (use --seed N)`);
  }
  return { seed };
}

function quote(s: string): string {
  return /^[\w@%+=:,./-]*$/.test(s) ? s : `'${s.replaceAll("'", `'\\''`)}'`;
}

/** Runs `deno <args>`, its output passed through; whether a sanitizer report went by. */
async function runPass(pass: Pass): Promise<{ code: number; reported: boolean }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: pass.args,
    env: pass.env,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let reported = false;
  const tee = async (from: ReadableStream<Uint8Array>, to: typeof Deno.stdout) => {
    const decoder = new TextDecoder();
    let carry = "";
    for await (const chunk of from) {
      await to.write(chunk);
      const text = carry + decoder.decode(chunk, { stream: true });
      if (SANITIZER_REPORT.test(text)) reported = true;
      carry = text.slice(-200);
    }
  };
  const [status] = await Promise.all([
    child.status,
    tee(child.stdout, Deno.stdout),
    tee(child.stderr, Deno.stderr),
  ]);
  return { code: status.code, reported };
}

/** The library that Device.open("cuda") loads in a deno process with `env`, or the error. */
async function preflight(env: Record<string, string>): Promise<string> {
  const device = new URL("../ffi/device.ts", import.meta.url).href;
  const library = new URL("../ffi/library.ts", import.meta.url).href;
  const script = `import { Device } from "${device}";
import { libraryPath } from "${library}";
Device.open("cuda").dispose();
console.log(libraryPath("cuda"));`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.success ? out.stdout : out.stderr).trim();
  return out.success ? text.split("\n").at(-1)! : `exit code ${out.code}: ${text}`;
}

async function main(argv: string[]): Promise<number> {
  const { seed } = parse(argv);
  const runtime = asanRuntime();
  if ("missing" in runtime) {
    console.error(`== no sanitizer runtime: ${runtime.missing}`);
    return 1;
  }
  const env = sanitizedEnv(runtime.path);
  const t0 = performance.now();
  Deno.env.set("PINSTREAM_EMU_SANITIZE", "1");
  const lib = buildLibrary("cuda", { emulator: true });
  console.log(
    `== sanitized emulator library: ${lib} (${((performance.now() - t0) / 1000).toFixed(1)} s)`,
  );
  // The [cuda] cases are skipped, not failed, where Device.open("cuda") fails: make sure that
  // it opens the sanitized build under this environment first.
  const opened = await preflight(env);
  if (opened !== lib) {
    console.error(`== Device.open("cuda") does not open ${lib} under the sanitizers: ${opened}`);
    return 1;
  }
  const s = `0x${seed.toString(16)}`;
  const passes: Pass[] = [
    {
      what: `the [cuda] test cases, random order, seed ${s}`,
      env: { ...env, PINSTREAM_EMU_ORDER: "random", PINSTREAM_EMU_SEED: s },
      args: ["test", "-A", "--filter", "[cuda]", "tests/"],
    },
    {
      what: "the emulator's self-test and the sanitizers' own tests, built with the sanitizers",
      env: { ...env, PINSTREAM_EMU_ORDER: "random", PINSTREAM_EMU_SEED: s },
      args: [
        "test",
        "-A",
        "tests/emu_test.ts",
        "tests/emu_graphs_test.ts",
        "tests/emu_asan_test.ts",
      ],
    },
  ];
  for (const [i, pass] of passes.entries()) {
    console.log(`\n== sanitized pass ${i + 1}/${passes.length}: ${pass.what}`);
    const t = performance.now();
    const { code, reported } = await runPass(pass);
    const secs = ((performance.now() - t) / 1000).toFixed(1);
    if (code !== 0 || reported) {
      const why = code === SANITIZER_EXIT || reported
        ? "AddressSanitizer or UBSan reported an error (see its report above)"
        : `exit code ${code}`;
      const vars = Object.entries(pass.env).map(([k, v]) => `${k}=${quote(v)}`).join(" ");
      console.error(
        `\n== sanitized pass failed (${secs} s): ${why}; reproduce with:\n${vars} deno ${
          pass.args.map(quote).join(" ")
        }`,
      );
      return code !== 0 ? code : 1;
    }
    console.log(`== sanitized pass ${i + 1}/${passes.length} passed (${secs} s)`);
  }
  console.log(`\n== no sanitizer reports (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  return 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
