/**
 * Finding, building and loading a pinstream backend library.
 *
 * Lookup order for a backend (`"cpu"` or `"cuda"`):
 * 1. `PINSTREAM_LIB_CPU` / `PINSTREAM_LIB_CUDA`: a prebuilt library for that backend;
 * 2. `PINSTREAM_LIB`: a prebuilt library, used for the backend it reports (`ps_backend`);
 * 3. the per-user cache (`$PINSTREAM_CACHE`, else `$XDG_CACHE_HOME/pinstream`, else
 *    `~/.cache/pinstream`), where the library is built on first use from the kernel sources
 *    (read through `import.meta.url`, so a checkout and a JSR import both work) with `cc`
 *    (or `$CC`) or `nvcc` (or `$NVCC`, `$CUDA_HOME/bin/nvcc`, `/usr/local/cuda/bin/nvcc`).
 *    The file name carries a hash of the sources, flags, compiler version and host CPU, so
 *    editing a kernel or switching compilers rebuilds and stale builds are never loaded.
 *
 * With `PINSTREAM_CUDA_EMULATOR=1`, "cuda" is the CUDA emulator instead (kernels/emu): the same
 * CUDA sources built by the host C++ compiler (`$CXX`, else `c++`, `g++` or `clang++`) against
 * an emulation of the CUDA runtime and execution model, so every CUDA path runs on a machine
 * without a GPU (slowly: each CUDA thread is a fiber on a CPU core). With
 * `PINSTREAM_EMU_SANITIZE=1` as well, the emulator is built with AddressSanitizer and UBSan
 * ({@linkcode EMULATOR_SANITIZE_FLAGS}, a cache entry of its own), whose runtime must be
 * preloaded into the process: `deno task test:asan` (tests/run_asan.ts) does both.
 *
 * Each backend is loaded once per process; a failure is remembered too, so "auto" does not
 * retry a failed build on every `Device.open`.
 *
 * @module
 */

import { permissionMessage } from "../internal/permissions.ts";
import { ABI_VERSION, type Library, signatures, symbols } from "./symbols.ts";
import { countCall, opKindOf } from "../internal/op_count.ts";
import { buildLibrary, emulatorSanitized } from "./_build.ts";
import { type Backend, cudaEmulated, envSetting, LibraryError } from "./_env.ts";

export type { Library } from "./symbols.ts";
export {
  type Backend,
  cudaEmulated,
  envSetting,
  LibraryError,
  type LibraryFailure,
} from "./_env.ts";
export {
  buildLibrary,
  type BuildOptions,
  cacheDir,
  CPU_FLAGS,
  CUDA_ARCHS,
  cudaArchProblem,
  EMULATOR_FLAGS,
  EMULATOR_SANITIZE_FLAGS,
  emulatorCommand,
  SOURCES,
} from "./_build.ts";

const loaded = new Map<Backend, { lib: Library; path: string } | LibraryError>();

/**
 * The library with every symbol that queues device work or waits for it counted as it is called
 * (internal/op_count.ts): the profiler's operation counts.
 */
function counted(lib: Library): Library {
  const wrapped: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(lib.symbols)) {
    const kind = opKindOf(name);
    if (kind < 0) {
      wrapped[name] = fn;
      continue;
    }
    // A wrapper of the prototype's arity, as generated source: Deno's fast FFI path needs call
    // sites of fixed arity (ffi/native_backend.ts), which a spread wrapper would lose.
    const n = signatures[name as keyof typeof signatures].params.length;
    const args = Array.from({ length: n }, (_, i) => `a${i}`).join(", ");
    wrapped[name] = new Function(
      "fn",
      "count",
      "kind",
      `return (${args}) => { count(kind); return fn(${args}); };`,
    )(fn, countCall, kind);
  }
  return { symbols: wrapped, close: () => lib.close() } as unknown as Library;
}

/**
 * The backend library, loaded once per process: from an override variable, else from the
 * build cache, building it first if needed.
 *
 * @param backend `"cpu"` or `"cuda"`.
 * @returns The dlopen'd library (`lib.symbols.ps_*`).
 * @throws {LibraryError} When no library can be found, built or loaded; the message lists
 * every path tried and what to install.
 *
 * @example Loading the CPU backend
 * ```ts
 * import { loadLibrary } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const lib = loadLibrary("cpu");
 * const out = new Int32Array(1);
 * assert.strictEqual(lib.symbols.ps_backend(out), 0);
 * assert.strictEqual(out[0], 0);
 * ```
 */
export function loadLibrary(backend: Backend): Library {
  if (backend !== "cpu" && backend !== "cuda") {
    throw new TypeError(`Cannot load backend ${JSON.stringify(backend)}: use "cpu" or "cuda"`);
  }
  let entry = loaded.get(backend);
  if (entry === undefined) {
    try {
      entry = locate(backend);
    } catch (err) {
      const denied = permissionMessage(err);
      if (denied !== undefined) {
        // Not a missing driver or compiler: the flag to add, and why.
        entry = new LibraryError("no-permission", backend, denied, { cause: err });
      } else if (err instanceof LibraryError) {
        entry = err;
      } else {
        throw err;
      }
    }
    loaded.set(backend, entry);
  }
  if (entry instanceof LibraryError) throw entry;
  return entry.lib;
}

/**
 * The path of the backend library loaded in this process, or `undefined` when none is.
 *
 * @param backend `"cpu"` or `"cuda"`.
 * @returns The library file's path.
 *
 * @example
 * ```ts
 * import { libraryPath, loadLibrary } from "./library.ts";
 * import assert from "node:assert";
 * loadLibrary("cpu");
 * assert.ok(libraryPath("cpu")!.length > 0);
 * ```
 */
export function libraryPath(backend: Backend): string | undefined {
  const entry = loaded.get(backend);
  return entry === undefined || entry instanceof LibraryError ? undefined : entry.path;
}

/**
 * Why the CUDA driver cannot be used, or `undefined` when libcuda loads. A cheap check made
 * before building the CUDA library, so a machine without a GPU does not pay for an nvcc build
 * to learn that it has no driver.
 *
 * @returns The reason, or `undefined` when the driver library is present.
 *
 * @example
 * ```ts
 * import { cudaDriverProblem } from "./library.ts";
 * import assert from "node:assert";
 * const why = cudaDriverProblem(); // e.g. "no CUDA driver: libcuda.so.1 not found, ..."
 * assert.ok(why === undefined || why.startsWith("no CUDA driver"));
 * ```
 */
export function cudaDriverProblem(): string | undefined {
  driverProblem ??= { why: findDriverProblem() };
  return driverProblem.why;
}

let driverProblem: { why: string | undefined } | undefined;

function findDriverProblem(): string | undefined {
  if (Deno.build.os === "darwin") return "CUDA is not available on macOS";
  const names = Deno.build.os === "windows" ? ["nvcuda.dll"] : ["libcuda.so.1", "libcuda.so"];
  const errors: string[] = [];
  for (const name of names) {
    try {
      // Left open: the CUDA runtime loads the same library on first use, and unloading a
      // driver library is not something to do casually.
      Deno.dlopen(name, {});
      return undefined;
    } catch (err) {
      const denied = permissionMessage(err);
      if (denied !== undefined) return `cannot look for the CUDA driver: ${denied}`;
      const message = (err as Error).message;
      errors.push(/No such file|not found/i.test(message) ? `${name} not found` : message);
    }
  }
  return `no CUDA driver: ${errors.join(", ")} (install the NVIDIA driver)`;
}

// ---- locating ------------------------------------------------------------------------------

function locate(backend: Backend): { lib: Library; path: string } {
  const variable = backend === "cpu" ? "PINSTREAM_LIB_CPU" : "PINSTREAM_LIB_CUDA";
  const specific = envSetting(variable);
  if (specific !== undefined) {
    return { lib: open(backend, specific, `$${variable}`), path: specific };
  }
  const generic = envSetting("PINSTREAM_LIB");
  // A prebuilt library of the other backend is skipped: this one is built instead.
  if (generic !== undefined && inspect(backend, generic, "$PINSTREAM_LIB").kind === backend) {
    return { lib: open(backend, generic, "$PINSTREAM_LIB"), path: generic };
  }
  if (
    backend === "cuda" && cudaEmulated() && emulatorSanitized() &&
    !/asan/.test(envSetting("LD_PRELOAD") ?? "")
  ) {
    // Loading it would end the process ("ASan runtime does not come first").
    throw new LibraryError(
      "load-failed",
      backend,
      "PINSTREAM_EMU_SANITIZE=1 builds the emulator with AddressSanitizer, whose runtime must be loaded first: run with LD_PRELOAD=$(c++ -print-file-name=libasan.so), as deno task test:asan does",
    );
  }
  const path = buildLibrary(backend);
  return {
    lib: open(
      backend,
      path,
      backend === "cuda" && cudaEmulated() ? "the CUDA emulator build" : "the build cache",
    ),
    path,
  };
}

const PROBE = {
  ps_abi_version: symbols.ps_abi_version,
  ps_backend: symbols.ps_backend,
} as const satisfies Deno.ForeignLibraryInterface;

/**
 * Reads the ABI version and backend of a library through two symbols only, so a stale or
 * foreign library is reported as such rather than as "undefined symbol ps_<newest>". The
 * probe handle is never closed: unloading a library that started OpenMP threads can crash,
 * and the full dlopen of the same file reuses the loaded image anyway.
 */
function inspect(backend: Backend, path: string, from: string): { version: number; kind: Backend } {
  let probe: Deno.DynamicLibrary<typeof PROBE>;
  try {
    probe = Deno.dlopen(path, PROBE);
  } catch (err) {
    const denied = permissionMessage(err);
    if (denied !== undefined) {
      throw new LibraryError("no-permission", backend, denied, { cause: err });
    }
    throw new LibraryError(
      "load-failed",
      backend,
      `${path} (from ${from}) could not be loaded: ${(err as Error).message}`,
      { cause: err },
    );
  }
  const out = new Int32Array(1);
  probe.symbols.ps_abi_version(out);
  const version = out[0];
  probe.symbols.ps_backend(out);
  return { version, kind: out[0] === 1 ? "cuda" : "cpu" };
}

/** dlopen with the full symbol table, after checking the ABI version and the backend. */
function open(backend: Backend, path: string, from: string): Library {
  const { version, kind } = inspect(backend, path, from);
  if (version !== ABI_VERSION) {
    throw new LibraryError(
      "abi-mismatch",
      backend,
      `${path} (from ${from}) implements ABI ${version}, this pinstream needs ABI ${ABI_VERSION}; rebuild it (deno task build) or unset the variable`,
    );
  }
  if (kind !== backend) {
    throw new LibraryError("load-failed", backend, `${path} (from ${from}) is a ${kind} library`);
  }
  try {
    return counted(Deno.dlopen(path, symbols));
  } catch (err) {
    const message = (err as Error).message;
    const hint = /undefined symbol|obtain symbol/.test(message)
      ? " (ffi/symbols.ts names a function the library lacks: is its source file missing from SOURCES in ffi/_build.ts, or is the prebuilt library stale?)"
      : "";
    throw new LibraryError(
      "load-failed",
      backend,
      `${path} (from ${from}) could not be loaded: ${message}${hint}`,
      { cause: err },
    );
  }
}
