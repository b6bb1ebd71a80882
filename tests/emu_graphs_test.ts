// Stream capture on the CUDA emulator (tests/emu/graphs.cu): a graph captured over two streams
// replays the same results in every thread and node order and in deferred-stream mode, nothing
// runs while capturing, and each call a capture cannot hold fails with CUDA's error and
// invalidates the capture in the modes where CUDA does. One process per case.

import assert from "node:assert";
import { emulatorCommand, LibraryError, SOURCES } from "../ffi/library.ts";
import { buildEmulatorProgram, runEmulatorProgram } from "./_emu_program.ts";

const PROGRAM = new URL("./emu/graphs.cu", import.meta.url);

function command(): { compiler: string; args: string[] } | undefined {
  try {
    return emulatorCommand(
      ["graphs.cu", ...SOURCES.emulator.filter((p) => p.startsWith("emu/") && p.endsWith(".cc"))],
      "graphs",
      { program: true },
    );
  } catch (err) {
    if (err instanceof LibraryError) return undefined;
    throw err;
  }
}

const COMMAND = command();
let built: Promise<string> | undefined;

async function run(
  name: string,
  env: Record<string, string> = {},
): Promise<Record<string, string>> {
  built ??= buildEmulatorProgram("graphs", PROGRAM, COMMAND!);
  const { code, stdout, stderr } = await runEmulatorProgram(await built, name, {
    PINSTREAM_EMU_ORDER: "random",
    ...env,
  });
  assert.strictEqual(code, 0, stdout + stderr);
  const out: Record<string, string> = {};
  for (const line of stdout.split("\n")) {
    for (const m of line.matchAll(/(\w+)=(\S+)/g)) out[m[1]] ??= m[2];
  }
  assert.ok(!("unexpected" in out), stdout + stderr);
  return out;
}

function emuTest(name: string, fn: () => Promise<void>) {
  Deno.test({ name: `[emulator] ${name}`, ignore: COMMAND === undefined, fn });
}

const ORDERS = ["forward", "reverse", "random", "greedy", "greedy-reverse"];
const MODES = ["global", "thread_local", "relaxed"];

emuTest(
  "a graph captured over two streams replays right in every order and stream mode",
  async () => {
    for (const streams of ["async", "deferred"]) {
      for (const order of ORDERS) {
        for (const mode of streams === "async" && order === "random" ? MODES : ["thread_local"]) {
          const r = await run(`replay:${mode}`, {
            PINSTREAM_EMU_ORDER: order,
            PINSTREAM_EMU_STREAMS: streams,
            PINSTREAM_EMU_SEED: String(7 + order.length),
          });
          const what = `${order}, ${streams}, ${mode}`;
          assert.strictEqual(r.status, "active", what);
          assert.strictEqual(r.side_before, "none", what);
          assert.strictEqual(r.side_joined, "active", "a stream waiting on a captured event joins");
          assert.strictEqual(r.query_captured, "cudaErrorCapturedEvent", what);
          assert.strictEqual(r.status_after, "none", what);
          assert.strictEqual(r.side_after, "none", what);
          assert.strictEqual(r.nodes, "6", "3 kernels, 2 copies and a memset");
          assert.strictEqual(r.ran_while_capturing, "0", what);
          assert.strictEqual(r.wrong, "0", what);
          assert.strictEqual(
            r.wrong_two_launches,
            "0",
            `${what}: launches of one graph run in turn`,
          );
        }
      }
    }
  },
);

emuTest("a fork that is not joined back fails the capture's end", async () => {
  const r = await run("unjoined");
  assert.strictEqual(r.end, "cudaErrorStreamCaptureUnjoined");
  assert.strictEqual(r.graph_null, "1");
  assert.strictEqual(r.b_after, "none", "the forked stream leaves the capture");
  assert.strictEqual(r.last, "cudaErrorStreamCaptureUnjoined");
  assert.strictEqual(r.after, "cudaSuccess", "capture errors are not sticky");
});

// call -> [error in global and thread-local mode, error in relaxed mode]
const REFUSED: Record<string, [string, string]> = {
  malloc: ["cudaErrorStreamCaptureUnsupported", "cudaSuccess"],
  memcpy: ["cudaErrorStreamCaptureUnsupported", "cudaSuccess"],
  memset: ["cudaErrorStreamCaptureUnsupported", "cudaSuccess"],
  device_sync: ["cudaErrorStreamCaptureUnsupported", "cudaSuccess"],
  stream_sync: ["cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureUnsupported"],
  query: ["cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureUnsupported"],
  pageable: ["cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureUnsupported"],
  wait_outside: ["cudaErrorStreamCaptureIsolation", "cudaErrorStreamCaptureIsolation"],
  free_outside: ["cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureUnsupported"],
};

emuTest("a call a capture cannot hold is refused and invalidates it, by capture mode", async () => {
  for (const [call, [strict, relaxed]] of Object.entries(REFUSED)) {
    for (const mode of MODES) {
      const r = await run(`refused-${call}:${mode}`);
      const expected = mode === "relaxed" ? relaxed : strict;
      const what = `${call} in ${mode} mode`;
      assert.strictEqual(r.call, expected, what);
      if (expected === "cudaSuccess") {
        assert.strictEqual(r.status, "active", what);
        assert.strictEqual(r.launch_after, "cudaSuccess", what);
        assert.strictEqual(r.end, "cudaSuccess", what);
        assert.strictEqual(r.graph_null, "0", what);
      } else {
        assert.strictEqual(r.status, "invalidated", what);
        assert.strictEqual(r.launch_after, "cudaErrorStreamCaptureInvalidated", what);
        assert.strictEqual(r.end, "cudaErrorStreamCaptureInvalidated", what);
        assert.strictEqual(r.graph_null, "1", what);
      }
      assert.strictEqual(r.sync_after, "cudaSuccess", `${what}: the context stays usable`);
    }
  }
});

emuTest("another thread is refused unsafe calls only during a global-mode capture", async () => {
  const expected: Record<string, string> = {
    global: "cudaErrorStreamCaptureUnsupported",
    thread_local: "cudaSuccess",
    relaxed: "cudaSuccess",
  };
  for (const mode of MODES) {
    const r = await run(`other_thread:${mode}`);
    assert.strictEqual(r.other, expected[mode], mode);
    assert.strictEqual(r.other_relaxed, "cudaSuccess", mode);
    assert.strictEqual(
      r.end,
      mode === "global" ? "cudaErrorStreamCaptureInvalidated" : "cudaSuccess",
      mode,
    );
  }
});

emuTest("the legacy stream cannot capture nor run beside a capturing blocking stream", async () => {
  const r = await run("legacy");
  assert.strictEqual(r.begin_legacy, "cudaErrorStreamCaptureUnsupported");
  assert.strictEqual(r.begin_again, "cudaErrorIllegalState");
  assert.strictEqual(r.launch_legacy, "cudaErrorStreamCaptureImplicit");
  assert.strictEqual(r.end, "cudaErrorStreamCaptureInvalidated");
  assert.strictEqual(r.end_again, "cudaErrorIllegalState");
});

emuTest(
  "stream-ordered allocations in a capture are the graph's, poisoned at each launch",
  async () => {
    for (const streams of ["async", "deferred"]) {
      const r = await run("alloc_nodes", { PINSTREAM_EMU_STREAMS: streams });
      assert.strictEqual(r.poisoned, String(2 * 256), streams);
      assert.strictEqual(r.wrong, "0", streams);
    }
  },
);
