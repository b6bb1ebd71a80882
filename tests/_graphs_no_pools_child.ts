// Child process of tests/train_graphs_test.ts, run with PINSTREAM_CUDA_EMULATOR=1 and
// PINSTREAM_EMU_MEMORY_POOLS=0 (read once per process, hence the child): without a
// stream-ordered allocator a capture refuses any allocation, and the step makes none: the
// split-K partial sums of the convolutions come from scratch the library keeps per stream,
// sized by the direct step before the recording. So the trainer records and replays, says
// nothing, and reaches the weights of a trainer that never tried. Prints "ok"; a failure
// throws (non-zero exit, the error on stderr).
import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { assertSameRun, train } from "./_train_graphs.ts";

using cuda = Device.open("cuda");
assert.ok(cuda.props.emulated, "the cuda device is the emulator");
const lines: string[] = [];
const error = console.error;
console.error = (...args: unknown[]) => void lines.push(args.join(" "));
const recorded = await train(cuda, "fp16", true, [6, 6, 6, 6], 16);
console.error = error;
const eager = await train(cuda, "fp16", false, [6, 6, 6, 6], 16);
assertSameRun(recorded, eager, "recorded without memory pools");
assert.strictEqual(recorded.active, true, "the step was recorded");
assert.strictEqual(recorded.graphsLive, 1);
assert.strictEqual(lines.length, 0, lines.join("\n"));
console.log("ok");
