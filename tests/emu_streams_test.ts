// The emulator's deferred stream mode (PINSTREAM_EMU_STREAMS=deferred) turns host code that
// forgets a wait from "passes by luck" into "fails every time": a missing cudaStreamWaitEvent
// between a copy stream and a compute stream, a pinned buffer overwritten before its copy's
// event, device results read before a synchronize, and the real prefetcher with its
// cross-stream waits taken out. The same code with its waits passes in both stream modes.
// Each case runs in a child process (tests/_stream_order_child.ts): the mode is read once.

import assert from "node:assert";
import { emulatorCommand, LibraryError } from "../ffi/library.ts";

function haveCompiler(): boolean {
  try {
    emulatorCommand([], "x");
    return true;
  } catch (err) {
    if (err instanceof LibraryError) return false;
    throw err;
  }
}

const CHILD = new URL("./_stream_order_child.ts", import.meta.url).pathname;

async function wrong(name: string, streams: string, skip: boolean): Promise<number> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CHILD, name, ...(skip ? ["--skip"] : [])],
    env: {
      PINSTREAM_CUDA_EMULATOR: "1",
      PINSTREAM_EMU_STREAMS: streams,
      PINSTREAM_EMU_ORDER: "forward",
    },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(out.stdout);
  const stderr = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, `${name} (${streams}${skip ? ", --skip" : ""}): ${stdout}${stderr}`);
  return JSON.parse(stdout.trim().split("\n").at(-1)!).wrong;
}

for (
  const name of [
    "wait-event",
    "pinned-reuse",
    "read-early",
    "prefetcher",
    "any-batch",
    "any-batch-reuse",
  ]
) {
  Deno.test({
    name: `[emulator] deferred streams: ${name} with its wait is right, without it wrong`,
    ignore: !haveCompiler(),
    async fn() {
      assert.strictEqual(await wrong(name, "deferred", false), 0, "with the wait, deferred");
      assert.strictEqual(await wrong(name, "async", false), 0, "with the wait, async");
      // Without the wait the result depends on when the emulator's threads get to the work;
      // deferred mode makes the race likely, not certain, on a loaded machine: a few tries.
      let bad = 0;
      for (let tries = 0; tries < 5 && bad === 0; tries++) {
        bad = await wrong(name, "deferred", true);
      }
      assert.ok(bad > 0, `without the wait, deferred mode must expose ${name} (5 tries)`);
    },
  });
}
