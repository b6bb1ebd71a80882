// Builds the CUDA emulator's nvJPEG stand-in (kernels/emu/nvjpeg_stand_in.c) into a shared
// library with the C compiler the CPU backend is built with, once per test process.

const SOURCE = new URL("../kernels/emu/nvjpeg_stand_in.c", import.meta.url).pathname;
let built: string | undefined;

/**
 * The path of the stand-in library, building it on first use.
 *
 * @returns The .so file, or undefined when no C compiler is installed.
 */
export function nvjpegStandIn(): string | undefined {
  if (built !== undefined) return built;
  const dir = Deno.makeTempDirSync({ prefix: "pinstream-nvjpeg-" });
  const out = `${dir}/libnvjpeg-stand-in.so`;
  for (const cc of [Deno.env.get("CC"), "cc", "gcc", "clang"]) {
    if (!cc) continue;
    try {
      const r = new Deno.Command(cc, {
        args: [
          "-shared",
          "-fPIC",
          "-O2",
          "-Wall",
          "-Werror",
          "-o",
          out,
          SOURCE,
          "-ldl",
          "-lpthread",
        ],
      }).outputSync();
      if (r.success) return built = out;
      throw new Error(
        `${cc} failed to build the nvJPEG stand-in:\n${new TextDecoder().decode(r.stderr)}`,
      );
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    }
  }
  return undefined;
}
