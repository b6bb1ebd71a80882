/**
 * Internal: building a backend library from the kernel sources into the per-user cache (see
 * ffi/library.ts for when it happens): the sources of each backend and of the CUDA emulator,
 * the compilers and their flags, the cache key (sources, flags, compiler version, and what
 * `-march=native` means on this CPU), one build at a time across processes, and the atomic
 * rename into the cache. library.ts re-exports what is public.
 *
 * @module
 */

import { missingPermission, permissionMessage } from "../internal/permissions.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import { createHash } from "node:crypto";
import { type Backend, cudaEmulated, envSetting as env, LibraryError } from "./_env.ts";

const CUDA_SOURCES = [
  "pinstream.h",
  "errors.h",
  "rules.h",
  "cuda/common.cuh",
  "cuda/gemm.cuh",
  "cuda/launch.cuh",
  "cuda/nn.cuh",
  "cuda/core.cu",
  "cuda/image.cu",
  "cuda/geometry.cu",
  "cuda/gemm.cu",
  "cuda/conv.cu",
  "cuda/norm.cu",
  "cuda/ops.cu",
  "cuda/multi_tensor.cu",
  "cuda/fill.cu",
];

/**
 * The kernel sources of each backend and of the CUDA emulator, relative to kernels/. Files
 * ending in .h/.cuh are copied next to the others (and hashed) but not compiled.
 */
export const SOURCES: {
  readonly cpu: string[];
  readonly cuda: string[];
  readonly emulator: string[];
} = {
  cpu: [
    "pinstream.h",
    "errors.h",
    "rules.h",
    "cpu/common.h",
    "cpu/threads.h",
    "cpu/fp16.h",
    "cpu/gemm.h",
    "cpu/nn.h",
    "cpu/core.c",
    "cpu/threads.c",
    "cpu/gemm.c",
    "cpu/conv.c",
    "cpu/norm.c",
    "cpu/ops.c",
    "cpu/image.c",
    "cpu/geometry.c",
    "cpu/fill.c",
  ],
  cuda: CUDA_SOURCES,
  // The CUDA backend's own sources, and what stands in for CUDA's headers and runtime.
  emulator: [
    ...CUDA_SOURCES,
    "emu/include/ps_emu.h",
    "emu/include/cuda_runtime.h",
    "emu/include/cuda_fp16.h",
    "emu/include/cuda_bf16.h",
    "emu/include/mma.h",
    "emu/include/cuda_pipeline.h",
    "emu/internal.h",
    "emu/runtime.cc",
    "emu/exec.cc",
  ],
};

/**
 * Compiler flags of the CPU build. No OpenMP: the backend runs its parallel kernels on its own
 * thread pool (kernels/cpu/threads.c), which `-pthread` links.
 */
export const CPU_FLAGS: readonly string[] = [
  "-O3",
  "-march=native",
  "-fPIC",
  "-shared",
  "-pthread",
  "-std=gnu11",
  "-fvisibility=hidden",
];

/**
 * Host C++ compiler flags of the CUDA emulator. No contraction into FMAs (`__fmul_rn` and
 * `__fadd_rn` promise separate roundings); the emulator's headers stand in for CUDA's, and are
 * included first as nvcc includes cuda_runtime.h.
 */
export const EMULATOR_FLAGS: readonly string[] = [
  // C++20 as nvcc is given: designated initializers name the kernels' functor fields.
  "-std=c++20",
  "-O2",
  "-fPIC",
  "-shared",
  "-fvisibility=hidden",
  "-ffp-contract=off",
  // A frame larger than a page touches each page from the top: a CUDA thread that outgrows its
  // stack faults in the guard page below it (named as a stack overflow), never past it in
  // another thread's stack or outside the stacks.
  "-fstack-clash-protection",
  "-pthread",
  "-DPS_CUDA_EMULATOR=1",
  "-Iemu/include",
  "-include",
  "cuda_runtime.h",
];

/**
 * What `PINSTREAM_EMU_SANITIZE=1` puts in place of the emulator's `-O2`: AddressSanitizer and
 * UBSan (any UB report is fatal), with frame pointers and debug lines for the reports.
 */
export const EMULATOR_SANITIZE_FLAGS: readonly string[] = [
  "-O1",
  "-g",
  "-fsanitize=address,undefined",
  "-fno-omit-frame-pointer",
  "-fno-sanitize-recover=undefined",
];

/** Whether the emulator is built with the sanitizers: `PINSTREAM_EMU_SANITIZE=1`. */
export function emulatorSanitized(): boolean {
  return /^(1|true|yes|on)$/i.test(env("PINSTREAM_EMU_SANITIZE") ?? "");
}

/** The emulator's flags in this process: {@linkcode EMULATOR_FLAGS}, or the sanitized build's. */
function emulatorFlags(sanitize = emulatorSanitized()): string[] {
  if (!sanitize) return [...EMULATOR_FLAGS];
  return EMULATOR_FLAGS.flatMap((f) => f === "-O2" ? [...EMULATOR_SANITIZE_FLAGS] : [f]);
}

/**
 * CUDA architectures built by default: T4 and RTX 20xx (sm_75), A100 and the 30xx/40xx
 * generations (sm_80, which runs on sm_86 and sm_89 too), H100/H200 (sm_90), plus compute_90
 * PTX that newer GPUs compile at load time.
 */
export const CUDA_ARCHS: readonly string[] = ["75", "80", "90"];

// ---- building ------------------------------------------------------------------------------

const KERNELS = new URL("../kernels/", import.meta.url);

/** The per-user build cache directory. */
export function cacheDir(): string {
  const explicit = env("PINSTREAM_CACHE");
  if (explicit !== undefined) return explicit;
  const xdg = env("XDG_CACHE_HOME");
  if (xdg !== undefined) return `${xdg}/pinstream`;
  const home = env("HOME") ?? env("USERPROFILE");
  if (home === undefined) {
    throw new LibraryError(
      "build-failed",
      "cpu",
      "no cache directory: set PINSTREAM_CACHE, XDG_CACHE_HOME or HOME",
    );
  }
  return `${home}/.cache/pinstream`;
}

interface Compiler {
  path: string;
  version: string;
}

function run(cmd: string, args: string[], cwd?: string): Deno.CommandOutput {
  return new Deno.Command(cmd, { args, cwd, stdout: "piped", stderr: "piped" }).outputSync();
}

/** What is built: a backend, or the cuda backend against the CUDA emulator. */
type Target = Backend | "emulator";

function findCompiler(target: Target): Compiler {
  const backend: Backend = target === "emulator" ? "cuda" : target;
  const candidates: string[] = [];
  if (target === "emulator") {
    const cxx = env("CXX");
    if (cxx !== undefined) candidates.push(cxx);
    candidates.push("c++", "g++", "clang++");
  } else if (backend === "cpu") {
    const cc = env("CC");
    if (cc !== undefined) candidates.push(cc);
    candidates.push("cc", "gcc", "clang");
  } else {
    const nvcc = env("NVCC");
    if (nvcc !== undefined) candidates.push(nvcc);
    candidates.push("nvcc");
    for (const root of [env("CUDA_HOME"), env("CUDA_PATH")]) {
      if (root !== undefined) candidates.push(`${root}/bin/nvcc`);
    }
    candidates.push("/usr/local/cuda/bin/nvcc");
  }
  const tried: string[] = [];
  let denied: unknown;
  for (const path of candidates) {
    try {
      const out = run(path, ["--version"]);
      if (out.success) {
        return { path, version: new TextDecoder().decode(out.stdout).trim() };
      }
      tried.push(`${path} (--version failed)`);
    } catch (err) {
      if (missingPermission(err) !== undefined) denied ??= err;
      tried.push(
        `${path} (${err instanceof Deno.errors.NotFound ? "not found" : (err as Error).message})`,
      );
    }
  }
  if (denied !== undefined) {
    // A compiler may well be there: Deno did not let us run it.
    throw new LibraryError("no-permission", backend, permissionMessage(denied)!, { cause: denied });
  }
  const install = target === "emulator"
    ? "install a C++20 compiler (Debian/Ubuntu: apt-get install g++) or set CXX"
    : backend === "cpu"
    ? "install a C compiler (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install gcc) or set CC"
    : "install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) or set NVCC / CUDA_HOME";
  const override = backend === "cpu" ? "PINSTREAM_LIB_CPU" : "PINSTREAM_LIB_CUDA";
  const what = target === "emulator" ? "C++ compiler" : backend === "cpu" ? "C compiler" : "nvcc";
  throw new LibraryError(
    "no-compiler",
    backend,
    `no ${what} found (tried ${
      tried.join(", ")
    }); ${install}, or point ${override} at a prebuilt library`,
  );
}

/** The sources of `target`: their texts, and the identity that goes into the cache key. */
function readSources(target: Target): { files: Map<string, string>; identity: string[] } {
  const files = new Map<string, string>();
  const urls = SOURCES[target].map((rel) => new URL(rel, KERNELS));
  if (KERNELS.protocol === "file:") {
    for (const [i, url] of urls.entries()) {
      files.set(SOURCES[target][i], Deno.readTextFileSync(url));
    }
    return { files, identity: [...files].map(([p, text]) => `${p}\0${text}`) };
  }
  // Remote sources (a JSR or https import). A published version never changes, so the URLs
  // are the identity and a cache hit needs no network; on a miss they are fetched by a child
  // Deno process, because fetch is asynchronous and loading a library is not.
  return { files, identity: urls.map((u) => u.href) };
}

function fetchRemote(target: Target): Map<string, string> {
  const backend: Backend = target === "emulator" ? "cuda" : target;
  const rels = SOURCES[target];
  const urls = rels.map((rel) => new URL(rel, KERNELS).href);
  const script = `const out = [];
for (const u of JSON.parse(Deno.env.get("PINSTREAM_FETCH"))) {
  const r = await fetch(u);
  if (!r.ok) throw new Error(u + ": HTTP " + r.status);
  out.push(await r.text());
}
await Deno.stdout.write(new TextEncoder().encode(JSON.stringify(out)));`;
  const out = new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    env: { PINSTREAM_FETCH: JSON.stringify(urls) },
    stdout: "piped",
    stderr: "piped",
  }).outputSync();
  if (!out.success) {
    throw new LibraryError(
      "fetch-failed",
      backend,
      `could not fetch the kernel sources from ${KERNELS.href}: ${
        new TextDecoder().decode(out.stderr).trim()
      }`,
    );
  }
  const texts = JSON.parse(new TextDecoder().decode(out.stdout)) as string[];
  return new Map(rels.map((rel, i) => [rel, texts[i]]));
}

/**
 * What `-march=native` means to `compiler` on this machine: the target CPU and the `-m`
 * feature flags its driver expands it to (`cc -march=native -###`; clang's `-target-cpu` and
 * `-target-feature`), so two CPUs get two builds. Asked of the compiler, not read from
 * /proc/cpuinfo, so the key does not depend on --allow-read (only on the --allow-run the
 * version check needs already), and it is exactly what decides the generated code.
 */
function nativeTarget(compiler: string): string {
  let text: string;
  try {
    const out = run(compiler, ["-march=native", "-###", "-x", "c", "-c", "-", "-o", "/dev/null"]);
    text = new TextDecoder().decode(out.stderr);
  } catch (err) {
    if (missingPermission(err) !== undefined) throw err;
    return Deno.build.arch;
  }
  const tokens = (text.match(/"[^"]*"|\S+/g) ?? []).map((t) => t.replace(/^"|"$/g, ""));
  const keep: string[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (t === "-target-cpu" || t === "-target-feature") keep.push(`${t}=${tokens[++i]}`);
    else if (/^-m(arch|tune|cpu)=/.test(t) || /^-m(no-)?[a-z0-9][a-z0-9.-]*$/.test(t)) keep.push(t);
  }
  return [...new Set(keep)].sort().join(" ");
}

/**
 * Why a GPU of compute capability `major.minor` cannot run a library built for `archs`, or
 * undefined when it can: a cubin for sm_XY runs on X.Y and later minors of X; the PTX of the
 * newest arch runs on that capability and every later one.
 *
 * @param major Compute capability major version.
 * @param minor Compute capability minor version.
 * @param archs The built architectures (default: the ones a first-use build uses now).
 * @returns The reason, or undefined.
 */
export function cudaArchProblem(
  major: number,
  minor: number,
  archs: readonly string[] = cudaArchs(),
): string | undefined {
  const cc = major * 10 + minor;
  const plain = archs.filter((a) => !a.endsWith("a")).map(Number);
  const runs = plain.some((a) => Math.floor(a / 10) === major && a % 10 <= minor) ||
    archs.some((a) => Number(a.replace("a", "")) === cc) ||
    (plain.length > 0 && cc >= Math.max(...plain));
  if (runs) return undefined;
  return `the GPU is sm_${cc} and the library is built for ${
    archs.map((a) => `sm_${a}`).join(", ")
  }: set PINSTREAM_CUDA_ARCHS=${cc} (or add it to the list) to build for it`;
}

function cudaArchs(): string[] {
  const spec = env("PINSTREAM_CUDA_ARCHS");
  if (spec === undefined) return [...CUDA_ARCHS];
  const archs = spec.split(/[\s,]+/).filter((s) => s !== "");
  for (const a of archs) {
    if (!/^\d+a?$/.test(a)) {
      throw new TypeError(`Cannot build the cuda backend: bad PINSTREAM_CUDA_ARCHS entry "${a}"`);
    }
  }
  return archs;
}

/** nvcc flags: one SASS per arch, plus PTX of the newest for GPUs newer than all of them. */
function cudaFlags(archs: string[]): string[] {
  // C++20: designated initializers name the kernels' functor fields (kernels/cuda/conv.cu).
  const flags = [
    "-O3",
    "-std=c++20",
    "-shared",
    "-Xcompiler",
    "-fPIC,-fvisibility=hidden",
    "-cudart",
    "static",
    // One thread per -gencode target: the GEMM's instantiations make each arch a long compile.
    "--threads",
    "0",
  ];
  for (const a of archs) flags.push("-gencode", `arch=compute_${a},code=sm_${a}`);
  const newest = archs[archs.length - 1];
  flags.push("-gencode", `arch=compute_${newest},code=compute_${newest}`);
  return flags;
}

const LIB_EXT = Deno.build.os === "windows" ? "dll" : Deno.build.os === "darwin" ? "dylib" : "so";

/** Options of {@linkcode buildLibrary}. */
export interface BuildOptions {
  /**
   * Build the cuda backend against the CUDA emulator (kernels/emu) with the host C++ compiler
   * instead of nvcc. Default: {@linkcode cudaEmulated}() for "cuda".
   */
  emulator?: boolean;
}

/**
 * Builds the backend library from the kernel sources into the cache (unless an up-to-date
 * build is there) and returns its path, ignoring the PINSTREAM_LIB* overrides. Does not load
 * it.
 *
 * @param backend `"cpu"` or `"cuda"`.
 * @param options `emulator`: build "cuda" against the CUDA emulator.
 * @returns The path of the built library.
 * @throws {LibraryError} When the compiler is missing or the build fails.
 *
 * @example
 * ```ts
 * import { buildLibrary } from "./_build.ts";
 * import assert from "node:assert";
 * assert.match(buildLibrary("cpu"), /libpinstream_cpu_/);
 * ```
 */
export function buildLibrary(backend: Backend, options: BuildOptions = {}): string {
  refuseUnknownKeys(options ?? {}, ["emulator"], "build the library");
  const target: Target = backend === "cuda" && (options.emulator ?? cudaEmulated())
    ? "emulator"
    : backend;
  const compiler = findCompiler(target);
  const flags = target === "cpu"
    ? [...CPU_FLAGS]
    : target === "emulator"
    ? emulatorFlags()
    : cudaFlags(cudaArchs());
  const { files, identity } = readSources(target);
  const hash = createHash("sha256");
  const cpu = flags.includes("-march=native") ? nativeTarget(compiler.path) : "";
  for (const part of [target, compiler.version, flags.join(" "), cpu, ...identity]) {
    hash.update(part).update("\0");
  }
  const dir = cacheDir();
  const tag = target === "emulator" ? "cuda_emulator" : target;
  const name = `libpinstream_${tag}_${hash.digest("hex").slice(0, 20)}`;
  const final = `${dir}/${name}.${LIB_EXT}`;
  if (exists(final)) return final;
  Deno.mkdirSync(dir, { recursive: true });
  // One build per library at a time across processes (parallel test files on a cold cache
  // would otherwise each run nvcc): an flock, released by the OS if a builder dies.
  const lockPath = `${dir}/.${name}.lock`;
  const lock = lockFile(lockPath);
  try {
    if (exists(final)) return final; // built by the process we waited for
    // A first build takes seconds (cc) to a minute (nvcc): say so rather than look hung.
    const what = target === "emulator"
      ? `cuda backend on the CUDA emulator${emulatorSanitized() ? " (ASan + UBSan)" : ""}`
      : `${backend} backend`;
    console.error(`pinstream: building the ${what} with ${compiler.path} into ${dir}`);
    compile(target, compiler, flags, files, dir, final);
  } finally {
    // Removed while held, so no empty lock file stays behind; a process that opened it before
    // and waits on it sees that it is gone when it gets the lock, and finds the library.
    try {
      Deno.removeSync(lockPath);
    } catch {
      // another holder removed it, or the cache is read-only: harmless
    }
    lock.close();
  }
  return final;
}

/**
 * Opens and flocks `path`, retrying when the file was removed (by the previous holder) while
 * this process waited: holding a lock on a file no longer at `path` would let two builders
 * in at once.
 */
function lockFile(path: string): Deno.FsFile {
  for (;;) {
    const file = Deno.openSync(path, { create: true, write: true });
    file.lockSync(true);
    try {
      if (Deno.statSync(path).ino === file.statSync().ino) return file;
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) {
        file.close();
        throw err;
      }
    }
    file.close();
  }
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return false;
    throw err;
  }
}

function compile(
  target: Target,
  compiler: Compiler,
  flags: string[],
  files: Map<string, string>,
  dir: string,
  final: string,
): void {
  const backend: Backend = target === "emulator" ? "cuda" : target;
  const sources = files.size > 0 ? files : fetchRemote(target);
  // Each build gets its own temporary directory in the cache (same filesystem, so the final
  // rename is atomic): concurrent first uses (parallel test files) never see a partial file.
  const tmp = Deno.makeTempDirSync({ dir, prefix: `.build-${target}-` });
  try {
    for (const [rel, text] of sources) {
      const path = `${tmp}/src/${rel}`;
      Deno.mkdirSync(path.slice(0, path.lastIndexOf("/")), { recursive: true });
      Deno.writeTextFileSync(path, text);
    }
    const compiled = [...sources.keys()].filter((p) => !/\.(h|cuh)$/.test(p));
    const out = `${tmp}/lib.${LIB_EXT}`;
    // Relative paths from src/, so messages recorded with __FILE__ read "cpu/core.c:123".
    const args = target === "emulator"
      ? emulatorArgs(compiled, out, false, flags)
      : [...flags, ...compiled, "-o", out];
    if (target === "cpu") args.push("-lm");
    const result = run(compiler.path, args, `${tmp}/src`);
    if (!result.success) {
      const log = new TextDecoder().decode(result.stderr).trim();
      throw new LibraryError(
        "build-failed",
        backend,
        `${compiler.path} ${args.join(" ")} failed:\n${log.slice(0, 8000)}`,
      );
    }
    Deno.renameSync(out, final);
  } finally {
    try {
      Deno.removeSync(tmp, { recursive: true });
    } catch {
      // best effort: a leftover .build-* directory is harmless
    }
  }
}

/** The emulator's compile line: .cu files as C++ ("-x none" ends that for its .cc files). */
function emulatorArgs(
  compiled: readonly string[],
  out: string,
  program: boolean,
  flags: readonly string[] = emulatorFlags(),
): string[] {
  return [
    ...flags.filter((f) => !program || f !== "-shared"),
    "-x",
    "c++",
    ...compiled.filter((p) => p.endsWith(".cu")),
    "-x",
    "none",
    ...compiled.filter((p) => !p.endsWith(".cu")),
    "-o",
    out,
  ];
}

/**
 * The host C++ compiler and arguments that build sources for the CUDA emulator, to run in the
 * directory that holds them: `.cu` files (launches and shared memory written with the macros
 * of kernels/cuda/launch.cuh), next to kernels/emu's files under `emu/`. Builds a shared library like
 * the cuda backend's, or with `program` an executable (a test program with its own `main`).
 * With `sanitize` (default: `PINSTREAM_EMU_SANITIZE=1`), {@linkcode EMULATOR_SANITIZE_FLAGS}
 * replace `-O2`, as in the library's sanitized build.
 *
 * @param sources Paths of the files to compile (`.cu`, `.cc`), relative to that directory.
 * @param out The output path.
 * @param options `program`: link an executable instead of a shared library; `sanitize`: build
 * with AddressSanitizer and UBSan.
 * @returns The compiler and its arguments.
 * @throws {LibraryError} When no C++ compiler is found (reason "no-compiler").
 *
 * @example
 * ```ts
 * import { emulatorCommand } from "./_build.ts";
 * import assert from "node:assert";
 * const { args } = emulatorCommand(["t.cu", "emu/exec.cc"], "t", { program: true });
 * assert.deepStrictEqual(args.slice(-8), ["-x", "c++", "t.cu", "-x", "none", "emu/exec.cc", "-o", "t"]);
 * assert.ok(!args.includes("-shared"));
 * ```
 */
export function emulatorCommand(
  sources: readonly string[],
  out: string,
  options: { program?: boolean; sanitize?: boolean } = {},
): { compiler: string; args: string[] } {
  return {
    compiler: findCompiler("emulator").path,
    args: emulatorArgs(sources, out, options.program ?? false, emulatorFlags(options.sanitize)),
  };
}
