// The CUDA backend on a device without memory pools (cudaDevAttrMemoryPoolsSupported = 0:
// some vGPU and MIG setups): the kernels that need per-call scratch memory fall back from
// cudaMallocAsync to cudaMalloc. Only the emulator can play such a device
// (PINSTREAM_EMU_MEMORY_POOLS=0), in a child process because it reads the setting once.

import assert from "node:assert";
import { cudaIsEmulated, runWithoutMemoryPools } from "./_backends.ts";

Deno.test({
  name: "[cuda] conv2d's weight gradient and overlapping copies work without memory pools",
  ignore: !cudaIsEmulated(),
  async fn() {
    const out = await runWithoutMemoryPools(
      new URL("./_no_memory_pools_child.ts", import.meta.url),
    );
    assert.deepStrictEqual(out.split("\n"), [
      "conv2dBackwardWeight f32 ok",
      "conv2dBackwardWeight f16 ok",
      "overlapping copies ok",
    ]);
  },
});
