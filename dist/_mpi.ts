/**
 * Finding and opening an MPI library (Open MPI or MPICH) and calling it through one interface
 * whatever its ABI family: the process group's main thread and its communication worker both
 * open the library through here.
 *
 * @module
 */

import {
  type Handle,
  mpichConstants,
  mpichSymbols,
  type MpiConstants,
  openMpiConstants,
  openMpiSymbols,
} from "./_mpi_symbols.ts";
import type { MpiFlavor } from "./launch_env.ts";

/** The environment variable that names the MPI library to open. */
export const MPI_LIB_ENV = "PINSTREAM_MPI_LIB";

/** The advice printed when no MPI library is found. */
export const MPI_INSTALL_HINT =
  "install Open MPI (apt-get install openmpi-bin libopenmpi-dev) or MPICH (apt-get install " +
  `mpich), or name the library in ${MPI_LIB_ENV}`;

/** Sonames of the distributions' packages, by family. */
const SONAMES: Record<MpiFlavor, readonly string[]> = {
  openmpi: ["libmpi.so.40", "libmpi.so"],
  mpich: ["libmpich.so.12", "libmpi.so.12", "libmpich.so"],
};

// The functions' shared shape: handles are a pointer or an int depending on the family, so the
// calls below go through this loosely typed view of either table.
// deno-lint-ignore no-explicit-any
type AnySymbols = Record<string, (...args: any[]) => any>;

/** An opened MPI library with its family's constants. */
export interface MpiLibrary {
  /** The file that was opened. */
  path: string;
  /** The ABI family. */
  flavor: MpiFlavor;
  /** The functions (handles typed loosely: see {@linkcode Handle}). */
  fn: AnySymbols;
  /** The predefined handles. */
  c: MpiConstants;
  /** Closes the library (never while MPI is initialized: MPI keeps state in it). */
  close(): void;
}

/**
 * Which family the launcher of this process belongs to, from its environment: Open MPI's
 * `mpirun` sets `OMPI_COMM_WORLD_*`, MPICH's Hydra sets `PMI_RANK` (or `PMI_FD`).
 *
 * @param env The environment to read.
 * @returns The family, or null when neither launcher started this process.
 */
export function launcherFlavor(env: (name: string) => string | undefined): MpiFlavor | null {
  if (env("OMPI_COMM_WORLD_SIZE") !== undefined) return "openmpi";
  if (env("PMI_RANK") !== undefined || env("PMI_FD") !== undefined) return "mpich";
  return null;
}

function tryOpen(path: string, flavor: MpiFlavor): MpiLibrary | Error {
  try {
    if (flavor === "openmpi") {
      const lib = Deno.dlopen(path, openMpiSymbols);
      return {
        path,
        flavor,
        fn: lib.symbols as unknown as AnySymbols,
        c: openMpiConstants(lib.symbols),
        close: () => lib.close(),
      };
    }
    const lib = Deno.dlopen(path, mpichSymbols);
    return {
      path,
      flavor,
      fn: lib.symbols as unknown as AnySymbols,
      c: mpichConstants(),
      close: () => lib.close(),
    };
  } catch (e) {
    return e as Error;
  }
}

/**
 * Opens the MPI library: the file named by `PINSTREAM_MPI_LIB` if set, otherwise the
 * distribution's sonames, trying the launcher's family first (a process started by MPICH's
 * `mpirun` must not load Open MPI, whose runtime would not find its own launcher). The
 * family of a named file is recognised by Open MPI's exported globals.
 *
 * @param options `flavor`: the family to prefer; `path`: a file to open instead of the search.
 * @returns The opened library.
 * @throws {Error} Naming every path tried and what to install, when none opens.
 */
export function openMpi(options: { flavor?: MpiFlavor | null; path?: string } = {}): MpiLibrary {
  const tried: string[] = [];
  const path = options.path ?? Deno.env.get(MPI_LIB_ENV);
  if (path) {
    // Open MPI's table needs its globals, so it fails to open on MPICH: try it first.
    const o = tryOpen(path, "openmpi");
    if (!(o instanceof Error)) return o;
    const m = tryOpen(path, "mpich");
    if (!(m instanceof Error)) return m;
    throw new Error(
      `Cannot open the MPI library ${path} (from ${MPI_LIB_ENV}): ` +
        `${m.message.replace(/^(Could not open library: )+/, "")}; ` +
        MPI_INSTALL_HINT,
    );
  }
  const first = options.flavor ?? "openmpi";
  const order: MpiFlavor[] = first === "openmpi" ? ["openmpi", "mpich"] : ["mpich", "openmpi"];
  for (const flavor of order) {
    for (const name of SONAMES[flavor]) {
      const r = tryOpen(name, flavor);
      if (!(r instanceof Error)) return r;
      tried.push(name);
    }
  }
  throw new Error(`Cannot find an MPI library (tried ${tried.join(", ")}): ${MPI_INSTALL_HINT}`);
}

/**
 * The text of an MPI error code.
 *
 * @param lib The library.
 * @param code The code an MPI function returned.
 * @returns The library's message with the code.
 */
export function mpiErrorString(lib: MpiLibrary, code: number): string {
  const buf = new Uint8Array(1024);
  const len = new Int32Array(1);
  if (lib.fn.MPI_Error_string(code, buf, len) !== 0) return `MPI error ${code}`;
  return `${new TextDecoder().decode(buf.subarray(0, len[0]))} (MPI error ${code})`;
}

/**
 * A handle as a plain value that survives `postMessage` (a bigint address or an int).
 *
 * @param h The handle.
 * @returns Its transferable value.
 */
export function handleValue(h: Handle): bigint | number {
  return typeof h === "number" ? h : Deno.UnsafePointer.value(h);
}

/**
 * The handle of a transferred value.
 *
 * @param v A value from {@linkcode handleValue}.
 * @returns The handle.
 */
export function handleOf(v: bigint | number): Handle {
  return typeof v === "number" ? v : Deno.UnsafePointer.create(v);
}

/**
 * Reads a communicator handle written by `MPI_Comm_dup` into an out-buffer.
 *
 * @param lib The library (its family fixes the handle's width).
 * @param out The out-buffer (8 bytes).
 * @returns The handle.
 */
export function readHandle(lib: MpiLibrary, out: BigUint64Array): Handle {
  if (lib.flavor === "mpich") return new Int32Array(out.buffer)[0];
  return Deno.UnsafePointer.create(out[0]);
}
