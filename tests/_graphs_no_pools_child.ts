// Child process of tests/train_graphs_test.ts, run with PINSTREAM_CUDA_EMULATOR=1 and
// PINSTREAM_EMU_MEMORY_POOLS=0 (read once per process, hence the child): without a
// stream-ordered allocator the convolution's scratch memory comes from cudaMalloc, which a
// capture refuses, so the trainer must fall back to direct steps, say so once, and reach the
// weights of a trainer that never tried. Prints "ok" and the fallback line count; a failure
// throws (non-zero exit, the error on stderr).
import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { assertSameRun, train } from "./_train_graphs.ts";

using cuda = Device.open("cuda");
assert.ok(cuda.props.emulated, "the cuda device is the emulator");
const lines: string[] = [];
const error = console.error;
console.error = (...args: unknown[]) => void lines.push(args.join(" "));
const refused = await train(cuda, "fp16", true, [6, 6, 6, 6], 16);
console.error = error;
const eager = await train(cuda, "fp16", false, [6, 6, 6, 6], 16);
assertSameRun(refused, eager, "refused on cuda");
assert.strictEqual(refused.active, false, "graphs are off after the refusal");
assert.strictEqual(refused.graphsLive, 0);
assert.strictEqual(lines.length, 1, lines.join("\n"));
assert.match(
  lines[0],
  /^pinstream: training without CUDA graphs .*cudaErrorStreamCaptureUnsupported/,
);
console.log("ok");
