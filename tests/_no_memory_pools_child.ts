// Child process of tests/nn_no_memory_pools_test.ts, run with PINSTREAM_CUDA_EMULATOR=1 and
// PINSTREAM_EMU_MEMORY_POOLS=0 (read once per process, hence the child): the emulated device
// has no stream-ordered allocator, so cudaMallocAsync fails with cudaErrorNotSupported. The
// CUDA calls that need scratch memory (conv2d's weight gradient, overlapping same-type
// copies) must still work and agree with the cpu backend. Prints one line per check; a
// failure throws (non-zero exit, the error on stderr).
import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { loadLibrary } from "../ffi/library.ts";
import { Tensor } from "../mod.ts";
import * as ops from "../ops/mod.ts";
import { rng } from "./_image_reference.ts";
import { assertClose } from "./_nn_reference.ts";
import { checkOverlappingCopies } from "./_overlap_copy.ts";

using cuda = Device.open("cuda");
using cpu = Device.open("cpu");
assert.ok(cuda.props.emulated, "the cuda device is the emulator");

// n * oh * ow = 1024 reduction terms: the CUDA kernel splits them 4 ways (scratch partials).
const n = 4, c = 8, h = 16, w = 16, co = 16, k = 3;
const r = rng(5);
const x = Float16Array.from({ length: n * c * h * w }, () => r() * 2 - 1);
const dy = Float16Array.from({ length: n * co * h * w }, () => r() * 2 - 1);
const terms = n * h * w;
for (const dtype of ["f32", "f16"] as const) {
  const out: number[][] = [];
  for (const dev of [cuda, cpu]) {
    using tx = Tensor.fromHost(dev, x, [n, c, h, w]);
    using tdy = Tensor.fromHost(dev, dy, [n, co, h, w]);
    using tdw = Tensor.empty(dev, [co, c, k, k], dtype);
    ops.conv2dBackwardWeight(tdy, tdw, { x: tx, padding: 1 });
    ops.conv2dBackwardWeight(tdy, tdw, { x: tx, padding: 1, accumulate: true });
    out.push([...await tdw.toHost()]);
  }
  // The tolerances of tests/nn_kernels_test.ts (accumulated twice: 2 * terms for f32).
  const [atol, rtol] = dtype === "f32" ? [2e-6 * terms, 1e-4] : [2e-3, 2e-3];
  assertClose(out[0], out[1], atol, rtol, `conv2dBackwardWeight ${dtype}, cuda against cpu`);
  console.log(`conv2dBackwardWeight ${dtype} ok`);
}

await checkOverlappingCopies(loadLibrary("cuda"));
console.log("overlapping copies ok");
