// What the sanitized build of the CUDA emulator (PINSTREAM_EMU_SANITIZE=1) needs at run time,
// shared by tests/run_asan.ts and tests/emu_asan_test.ts.

import { emulatorCommand, LibraryError } from "../ffi/library.ts";

/**
 * AddressSanitizer's options. A report ends the process with exit code 86 (halt_on_error, and
 * a code of its own so a sanitizer report is told apart from a failed test); no leak check
 * (deno's and V8's allocations go through ASan's malloc when it is preloaded, and the emulator
 * keeps per-thread state for the life of the process; and the compilers that the tests run
 * inherit LD_PRELOAD, so a leak report at their exit fails their `--version` and the tests
 * skip cuda as "no compiler"); the emulator installs its own SIGSEGV handler, which names the
 * faulting CUDA thread and then chains to ASan's (allow_user_segv_handler, GCC 12's default,
 * made explicit); no fake stacks for use-after-return (the emulator's fiber switches
 * are annotated for them, but kernels return nothing by reference, and they cost memory).
 */
export const ASAN_OPTIONS = [
  "detect_leaks=0",
  "halt_on_error=1",
  "exitcode=86",
  "allow_user_segv_handler=1",
  "detect_stack_use_after_return=0",
].join(":");

/** UBSan's options: a stack trace, and any report ends the process with exit code 86. */
export const UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1:exitcode=86";

/** The exit code of a process that a sanitizer stopped. */
export const SANITIZER_EXIT = 86;

/** A sanitizer report in a process's output. */
export const SANITIZER_REPORT =
  /ERROR: AddressSanitizer|runtime error: |SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)/;

/**
 * The ASan runtime of the emulator's C++ compiler (to preload into deno, which is not built
 * with it), or undefined with the reason when there is no compiler or no runtime.
 */
export function asanRuntime(): { path: string } | { missing: string } {
  let compiler: string;
  try {
    compiler = emulatorCommand([], "probe").compiler;
  } catch (err) {
    if (err instanceof LibraryError) return { missing: err.message };
    throw err;
  }
  const paths: string[] = [];
  for (const name of ["libasan.so", "libubsan.so"]) {
    const out = new Deno.Command(compiler, { args: [`-print-file-name=${name}`], stderr: "null" })
      .outputSync();
    const path = new TextDecoder().decode(out.stdout).trim();
    // A compiler without the file prints its bare name.
    if (!out.success || !path.startsWith("/") || !exists(path)) {
      return {
        missing: `${compiler} has no ${name} (Debian/Ubuntu: apt-get install libasan8 libubsan1)`,
      };
    }
    paths.push(path);
  }
  return { path: paths[0] };
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/** The environment that runs the sanitized emulator: preloaded runtime, options, the build. */
export function sanitizedEnv(runtime: string): Record<string, string> {
  return {
    PINSTREAM_CUDA_EMULATOR: "1",
    PINSTREAM_EMU_SANITIZE: "1",
    LD_PRELOAD: runtime,
    ASAN_OPTIONS,
    UBSAN_OPTIONS,
  };
}
