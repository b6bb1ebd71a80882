/**
 * Finding NCCL (`libnccl.so.2`) at run time: the file named by `PINSTREAM_NCCL_LIB`, the
 * system's soname, or the copy a PyTorch wheel carries under `site-packages/nvidia/nccl/lib`.
 *
 * @module
 */

/** The environment variable that names the NCCL library to open. */
export const NCCL_LIB_ENV = "PINSTREAM_NCCL_LIB";

/** What the nccl backend needs first: the library, and its version to report. */
const symbols = {
  // ncclResult_t ncclGetVersion(int *version);
  ncclGetVersion: { parameters: ["buffer"], result: "i32" },
} as const satisfies Deno.ForeignLibraryInterface;

/** An opened NCCL library. */
export interface NcclLibrary {
  /** The file opened. */
  path: string;
  /** NCCL's version code (e.g. 21903 for 2.19.3). */
  version: number;
  /** Closes it. */
  close(): void;
}

/** Python package directories where a PyTorch wheel may have put `nvidia/nccl/lib`. */
function wheelDirs(): string[] {
  const roots = ["/usr/local/lib", "/usr/lib"];
  const home = Deno.env.get("HOME");
  if (home) roots.push(`${home}/.local/lib`);
  const out: string[] = [];
  for (const root of roots) {
    let entries: Deno.DirEntry[] = [];
    try {
      entries = [...Deno.readDirSync(root)];
    } catch {
      continue;
    }
    for (const e of entries) {
      if (!/^python3(\.\d+)?$/.test(e.name)) continue;
      for (const sub of ["site-packages", "dist-packages"]) {
        out.push(`${root}/${e.name}/${sub}/nvidia/nccl/lib/libnccl.so.2`);
      }
    }
  }
  return out;
}

/**
 * Opens NCCL.
 *
 * @returns The library and its version.
 * @throws {Error} Listing every path tried and how to get NCCL, when none opens.
 */
export function openNccl(): NcclLibrary {
  const named = Deno.env.get(NCCL_LIB_ENV);
  const candidates = named ? [named] : ["libnccl.so.2", ...wheelDirs()];
  const tried: string[] = [];
  for (const path of candidates) {
    try {
      const lib = Deno.dlopen(path, symbols);
      const v = new Int32Array(1);
      lib.symbols.ncclGetVersion(v);
      return { path, version: v[0], close: () => lib.close() };
    } catch {
      tried.push(path);
    }
  }
  throw new Error(
    `Cannot find NCCL (tried ${tried.join(", ")}): install it (a PyTorch CUDA wheel carries ` +
      `one under site-packages/nvidia/nccl/lib) or name libnccl.so.2 in ${NCCL_LIB_ENV}`,
  );
}
