/**
 * `deno task build`: builds (or finds in the cache) both backend libraries now instead of on
 * first use, and prints their paths.
 *
 *     deno task build                      # build what can be built; fail only if cpu fails
 *     deno task build --require cpu,cuda   # fail unless both build (CI: the CUDA library
 *                                          # must compile and link even without a GPU)
 *
 * A path printed here can be exported as PINSTREAM_LIB_CPU / PINSTREAM_LIB_CUDA to skip the
 * lookup on machines that share the library.
 *
 * @module
 */

import { type Backend, libraryPath, loadLibrary } from "./library.ts";

/**
 * Builds the backend libraries and reports each one.
 *
 * @param args Command-line arguments: `--require <backend,...>`.
 * @returns The process exit code: 0 when every required backend loaded.
 */
export function main(args: string[] = []): number {
  let required: Backend[] = ["cpu"];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    const value = arg.startsWith("--require=")
      ? arg.slice(10)
      : arg === "--require"
      ? args[++i]
      : undefined;
    if (value === undefined) {
      throw new TypeError(
        `Cannot build: unknown argument ${JSON.stringify(arg)} (use --require cpu,cuda)`,
      );
    }
    required = value.split(",").map((s) => s.trim()).filter((s) => s !== "") as Backend[];
    for (const b of required) {
      if (b !== "cpu" && b !== "cuda") {
        throw new TypeError(`Cannot build: unknown backend ${JSON.stringify(b)} in --require`);
      }
    }
  }
  let code = 0;
  for (const backend of ["cpu", "cuda"] as const) {
    const t0 = performance.now();
    try {
      loadLibrary(backend);
      const secs = ((performance.now() - t0) / 1000).toFixed(1);
      console.log(`${backend}: ${libraryPath(backend)} (${secs} s)`);
    } catch (err) {
      const must = required.includes(backend);
      console.error(`${backend}: ${must ? "FAILED" : "not available"}: ${(err as Error).message}`);
      if (must) code = 1;
    }
  }
  return code;
}

if (import.meta.main) Deno.exit(main(Deno.args));
