/**
 * NCCL (`libnccl.so.2`) bound by FFI: the file named by `PINSTREAM_NCCL_LIB`, the system's
 * soname, or the copy a PyTorch wheel carries under `site-packages/nvidia/nccl/lib`. The CUDA
 * emulator's stand-in (kernels/emu/nccl_stand_in.c) exports the same calls.
 *
 * @module
 */

import { pythonPackageDirs } from "../internal/python_packages.ts";

/** The environment variable that names the NCCL library to open. */
export const NCCL_LIB_ENV = "PINSTREAM_NCCL_LIB";

/** `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`. */
export const UNIQUE_ID_BYTES = 128;
const uniqueId = { struct: Array(UNIQUE_ID_BYTES).fill("u8") } as const;

const symbols = {
  ncclGetVersion: { parameters: ["buffer"], result: "i32" },
  ncclGetUniqueId: { parameters: ["buffer"], result: "i32" },
  // (ncclComm_t *comm, int nranks, ncclUniqueId id, int rank): blocks until every rank joined.
  ncclCommInitRank: { parameters: ["buffer", "i32", uniqueId, "i32"], result: "i32" },
  ncclCommDestroy: { parameters: ["pointer"], result: "i32" },
  ncclCommAbort: { parameters: ["pointer"], result: "i32" },
  ncclCommGetAsyncError: { parameters: ["pointer", "buffer"], result: "i32" },
  ncclGetErrorString: { parameters: ["i32"], result: "pointer" },
  ncclGetLastError: { parameters: ["pointer"], result: "pointer", optional: true },
  // (send, recv, count, datatype, op, comm, stream)
  ncclAllReduce: {
    parameters: ["pointer", "pointer", "usize", "i32", "i32", "pointer", "pointer"],
    result: "i32",
  },
  // (send, recv, count, datatype, root, comm, stream)
  ncclBroadcast: {
    parameters: ["pointer", "pointer", "usize", "i32", "i32", "pointer", "pointer"],
    result: "i32",
  },
  // (send, recv, sendcount, datatype, comm, stream)
  ncclAllGather: {
    parameters: ["pointer", "pointer", "usize", "i32", "pointer", "pointer"],
    result: "i32",
  },
  // (send, recv, recvcount, datatype, op, comm, stream)
  ncclReduceScatter: {
    parameters: ["pointer", "pointer", "usize", "i32", "i32", "pointer", "pointer"],
    result: "i32",
  },
  ncclGroupStart: { parameters: [], result: "i32" },
  ncclGroupEnd: { parameters: [], result: "i32" },
  ps_nccl_stand_in: { parameters: [], result: "i32", optional: true },
} as const satisfies Deno.ForeignLibraryInterface;

/** NCCL's calls. */
export type NcclSymbols = Deno.DynamicLibrary<typeof symbols>["symbols"];

/** `ncclDataType_t` of the dtypes the nccl backend moves. */
export const NCCL_DTYPES = { i32: 2, f16: 6, f32: 7, bf16: 9 } as const;

/** `ncclRedOp_t`. */
export const NCCL_OPS = { sum: 0, prod: 1, max: 2, min: 3, avg: 4 } as const;

/** An opened NCCL library. */
export interface NcclLibrary {
  /** The file opened. */
  path: string;
  /** NCCL's version code (e.g. 21903 for 2.19.3). */
  version: number;
  /** Whether it is the CUDA emulator's stand-in rather than NCCL. */
  standIn: boolean;
  /** The calls. */
  fn: NcclSymbols;
  /** Closes it. */
  close(): void;
}

/**
 * Opens NCCL.
 *
 * @returns The library and its version.
 * @throws {Error} Listing every path tried and how to get NCCL, when none opens.
 */
export function openNccl(): NcclLibrary {
  const named = Deno.env.get(NCCL_LIB_ENV);
  const candidates = named ? [named] : [
    "libnccl.so.2",
    ...pythonPackageDirs().map((d) => `${d}/nvidia/nccl/lib/libnccl.so.2`),
  ];
  const tried: string[] = [];
  for (const path of candidates) {
    let lib: Deno.DynamicLibrary<typeof symbols>;
    try {
      lib = Deno.dlopen(path, symbols);
    } catch {
      tried.push(path);
      continue;
    }
    const v = new Int32Array(1);
    lib.symbols.ncclGetVersion(v);
    return {
      path,
      version: v[0],
      standIn: lib.symbols.ps_nccl_stand_in !== null,
      fn: lib.symbols,
      close: () => lib.close(),
    };
  }
  throw new Error(
    `Cannot find NCCL (tried ${tried.join(", ")}): install it (a PyTorch CUDA wheel carries ` +
      `one under site-packages/nvidia/nccl/lib) or name libnccl.so.2 in ${NCCL_LIB_ENV}`,
  );
}

/**
 * NCCL's words for a result code, with its last error message when it has one.
 *
 * @param lib The library.
 * @param rc The `ncclResult_t`.
 * @param comm The communicator, for `ncclGetLastError`.
 * @returns The message.
 */
export function ncclErrorString(
  lib: NcclLibrary,
  rc: number,
  comm: Deno.PointerValue = null,
): string {
  const read = (p: Deno.PointerValue) => p ? Deno.UnsafePointerView.getCString(p) : "";
  const text = read(lib.fn.ncclGetErrorString(rc)) || `NCCL error ${rc}`;
  const last = lib.fn.ncclGetLastError ? read(lib.fn.ncclGetLastError(comm)) : "";
  return last && last !== text ? `${text} (${last})` : text;
}
