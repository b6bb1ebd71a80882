// Builds the CUDA emulator's NCCL stand-in (kernels/emu/nccl_stand_in.c) into a shared library
// with the C compiler the CPU backend is built with, once per test process.

import { Device } from "../ffi/device.ts";
import { CUDA } from "./_backends.ts";

const SOURCE = new URL("../kernels/emu/nccl_stand_in.c", import.meta.url).pathname;
let built: string | undefined;

/**
 * The path of the stand-in library, building it on first use.
 *
 * @returns The .so file, or undefined when no C compiler is installed.
 */
export function ncclStandIn(): string | undefined {
  if (built !== undefined) return built;
  const dir = Deno.makeTempDirSync({ prefix: "pinstream-nccl-" });
  const out = `${dir}/libnccl-stand-in.so`;
  for (const cc of [Deno.env.get("CC"), "cc", "gcc", "clang"]) {
    if (!cc) continue;
    try {
      const r = new Deno.Command(cc, {
        args: ["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", out, SOURCE, "-ldl"],
      }).outputSync();
      if (r.success) return built = out;
      throw new Error(
        `${cc} failed to build the NCCL stand-in:\n${new TextDecoder().decode(r.stderr)}`,
      );
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    }
  }
  return undefined;
}

/**
 * The stand-in for the nccl backend's tests: built where the cuda device is the CUDA emulator
 * (the stand-in drives emulated memory only), else undefined (the tests skip).
 *
 * @returns The .so file, or undefined.
 */
export function emulatedNccl(): string | undefined {
  if (CUDA.ignore) return undefined;
  using d = Device.open("cuda");
  return d.props.emulated ? ncclStandIn() : undefined;
}
