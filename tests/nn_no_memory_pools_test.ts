// The CUDA backend on a device without memory pools (cudaDevAttrMemoryPoolsSupported = 0:
// some vGPU and MIG setups): the kernels that need per-call scratch memory fall back from
// cudaMallocAsync to cudaMalloc. Only the emulator can play such a device
// (PINSTREAM_EMU_MEMORY_POOLS=0), in a child process because it reads the setting once.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { CUDA } from "./_backends.ts";

function cudaIsEmulated(): boolean {
  if (CUDA.ignore) return false;
  using dev = Device.open("cuda");
  return dev.props.emulated;
}

Deno.test({
  name: "[cuda] conv2d's weight gradient and overlapping copies work without memory pools",
  ignore: !cudaIsEmulated(),
  async fn() {
    const child = new URL("./_no_memory_pools_child.ts", import.meta.url).pathname;
    const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", child],
      env: { PINSTREAM_CUDA_EMULATOR: "1", PINSTREAM_EMU_MEMORY_POOLS: "0" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const out = new TextDecoder().decode(stdout), err = new TextDecoder().decode(stderr);
    assert.strictEqual(code, 0, `child exited with ${code}:\n${out}\n${err}`);
    assert.deepStrictEqual(out.trim().split("\n"), [
      "conv2dBackwardWeight f32 ok",
      "conv2dBackwardWeight f16 ok",
      "overlapping copies ok",
    ]);
  },
});
