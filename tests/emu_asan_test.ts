// The sanitized build of the CUDA emulator (PINSTREAM_EMU_SANITIZE=1) finds what it is for:
// tests/emu/sanitize.cu, built with AddressSanitizer and UBSan as the library is, reads past a
// host heap buffer in a kernel and overflows a signed int in a kernel, and each is reported
// with the kernel's source line; a clean kernel that switches fibers a lot is not.
//
// The build takes several seconds, so these run in `deno task test:asan` (which sets
// PINSTREAM_EMU_SANITIZE=1) and are ignored otherwise, and where the compiler has no sanitizer
// runtime.

import assert from "node:assert";
import { buildEmulatorProgram, runEmulatorProgram } from "./_emu_program.ts";
import { emulatorCommand, SOURCES } from "../ffi/library.ts";
import { ASAN_OPTIONS, asanRuntime, SANITIZER_EXIT, UBSAN_OPTIONS } from "./_asan.ts";

const PROGRAM = new URL("./emu/sanitize.cu", import.meta.url);

const runtime = asanRuntime();
const asked = /^(1|true|yes|on)$/i.test(Deno.env.get("PINSTREAM_EMU_SANITIZE") ?? "");

let built: Promise<string> | undefined;

/** Builds tests/emu/sanitize.cu with the sanitizers, once per source version. */
function build(): Promise<string> {
  const ccs = SOURCES.emulator.filter((p) => p.startsWith("emu/") && p.endsWith(".cc"));
  return buildEmulatorProgram(
    "sanitize",
    PROGRAM,
    emulatorCommand(["sanitize.cu", ...ccs], "sanitize", { program: true, sanitize: true }),
  );
}

async function run(name: string, order = "random") {
  built ??= build();
  const exe = await built;
  // The program links the runtime itself: nothing to preload.
  const env = { PINSTREAM_EMU_ORDER: order, ASAN_OPTIONS, UBSAN_OPTIONS, LD_PRELOAD: "" };
  const res = await runEmulatorProgram(exe, name, env);
  assert.doesNotMatch(res.stdout, /unexpected=/, res.stdout + res.stderr);
  return res;
}

function asanTest(name: string, fn: () => Promise<void>) {
  Deno.test({ name: `[emulator, sanitized] ${name}`, ignore: !asked || "missing" in runtime, fn });
}

if ("missing" in runtime && asked) {
  console.error(`emu_asan_test: no sanitizer runtime, tests ignored: ${runtime.missing}`);
}

asanTest("fiber switches give no false reports, in every thread order", async () => {
  for (const order of ["forward", "reverse", "random", "greedy", "greedy-reverse"]) {
    const r = await run("clean", order);
    assert.strictEqual(r.code, 0, `${order}:\n${r.stdout}${r.stderr}`);
    assert.match(r.stdout, /ok=1/);
  }
});

asanTest(
  "a kernel that reads past a host heap buffer is an ASan heap-buffer-overflow",
  async () => {
    const r = await run("host_heap_overflow");
    assert.strictEqual(r.code, SANITIZER_EXIT, r.stdout + r.stderr);
    assert.doesNotMatch(r.stdout, /survived/);
    assert.match(r.stderr, /ERROR: AddressSanitizer: heap-buffer-overflow/);
    assert.match(
      r.stderr,
      /READ of size 4 .*\n\s+#0 0x[0-9a-f]+ in sum_host\(.*\) .*sanitize\.cu:\d+/,
    );
    assert.match(r.stderr, /0 bytes to the right of 64-byte region/);
  },
);

asanTest("a signed int overflow in a kernel is a UBSan runtime error", async () => {
  const r = await run("signed_overflow");
  assert.strictEqual(r.code, SANITIZER_EXIT, r.stdout + r.stderr);
  assert.doesNotMatch(r.stdout, /survived/);
  assert.match(
    r.stderr,
    /sanitize\.cu:\d+:\d+: runtime error: signed integer overflow: \d+ \* 1073741824 cannot be represented in type 'int'/,
  );
  assert.match(r.stderr, /in scaled_index\(int, long long\*\)/);
});
