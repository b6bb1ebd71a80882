/**
 * `deno task cuda-report`: the static report of the CUDA build for sm_90, which needs nvcc and
 * no GPU. Each `.cu` file of kernels/cuda is compiled as the backend builds it (`-O3
 * -std=c++20`), for sm_90 alone, with `-Xptxas -v` (per kernel: registers, stack frame, spill
 * stores and loads, shared memory) and its PTX kept (per kernel: 64-bit divisions and
 * remainders, and how many sit inside a loop; per file: the same divisions, `cp.async`,
 * `ldmatrix`, `mma`/`wmma.mma`, `wmma.load` and 16-byte global loads).
 *
 *     deno task cuda-report                      # writes bench/out/cuda-report.md
 *     deno task cuda-report --out report.md      # or there; --json for the raw data
 *
 * HOT_KERNELS lists the kernels whose shape the targets depend on. For each, a stack
 * frame (local-memory arrays), a spill, or a 64-bit division inside a loop is a problem
 * (`hotKernelProblems`); tests/cuda_report_test.ts fails on any. A kernel not yet rewritten
 * carries an `exempt` reason, and the test also fails once an exempt kernel is clean, so the
 * exemption goes.
 *
 * A loop, in PTX, is the span from a label to a later branch back to it; a division there is
 * paid per iteration (per element, for the GEMM loaders), one before the loop once per thread.
 *
 * @module
 */

import { createHash } from "node:crypto";
import { cacheDir, SOURCES } from "../ffi/_build.ts";

/** One kernel (PTX `.entry`) of one file. */
export interface KernelStats {
  /** The source file, relative to kernels/ ("cuda/conv.cu"). */
  file: string;
  /** Demangled, without the anonymous namespace and parameter list. */
  name: string;
  registers: number;
  stackFrame: number;
  spillStores: number;
  spillLoads: number;
  sharedBytes: number;
  /** 64-bit div/rem instructions in the kernel, and how many of them inside a loop. */
  div64: number;
  div64InLoop: number;
}

/** Instruction counts of one file's PTX. */
export interface FileStats {
  file: string;
  div64: number;
  cpAsync: number;
  ldmatrix: number;
  mma: number;
  wmmaLoad: number;
  globalLoadV4: number;
}

/** The whole report. */
export interface CudaReport {
  arch: string;
  nvcc: string;
  kernels: KernelStats[];
  files: FileStats[];
}

/** One row of the hot-kernel table: kernels whose name starts with `prefix`. */
export interface HotKernel {
  prefix: string;
  family: string;
  /** Why it may still fail the checks (not yet rewritten); absent: enforced. */
  exempt?: string;
}

/**
 * The hot kernels. A rewrite that renames one updates its row. An exempt row waits for its
 * kernel's rewrite, which removes the exemption.
 */
export const HOT_KERNELS: readonly HotKernel[] = [
  { prefix: "gemm_kernel<__half,", family: "GEMM main loop, fp16 tensor cores" },
  { prefix: "gemm_kernel<__nv_bfloat16,", family: "GEMM main loop, bf16 tensor cores" },
  { prefix: "gemm_kernel<float,", family: "GEMM main loop, fp32" },
  { prefix: "reduce_splits<", family: "GEMM split-K reduction" },
  { prefix: "bn_stats<", family: "batch norm, forward statistics" },
  { prefix: "bn_apply<", family: "batch norm, forward (ReLU fused)" },
  { prefix: "bn_grad_stats<", family: "batch norm, backward sums" },
  { prefix: "bn_grad_apply<", family: "batch norm, backward (ReLU fused)" },
  { prefix: "bn_eval<", family: "batch norm, evaluation" },
  { prefix: "sgd_kernel", family: "optimizer" },
  { prefix: "multi_sgd", family: "optimizer, all parameters in one launch" },
  { prefix: "unscale_check", family: "loss scaler" },
  { prefix: "multi_unscale_check", family: "loss scaler, all gradients in one launch" },
  { prefix: "multi_copy_if", family: "skipped-step rollback, one launch" },
  { prefix: "augment_kernel", family: "augment kernel, several pixels per thread" },
  { prefix: "grey_mean_kernel", family: "augment kernel's contrast pre-pass, per-image mean" },
  { prefix: "geometry_kernel", family: "crop, resize and rotation, one pixel per thread" },
];

const DIV64 = /^\s*(?:@!?%p\d+\s+)?(?:div|rem)(?:\.full)?\.[su]64\b/;

/** Splits one PTX file into its kernels: mangled name -> body lines. */
export function ptxEntries(ptx: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let current: string[] | undefined;
  for (const line of ptx.split("\n")) {
    const m = line.match(/^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\(/);
    if (m) {
      current = [];
      out.set(m[1], current);
    } else if (/^\s*(?:\.visible\s+|\.weak\s+)?\.func\b/.test(line)) current = undefined;
    else current?.push(line);
  }
  return out;
}

/**
 * 64-bit div/rem instructions of a kernel body, and those inside a loop: in a basic block that
 * lies on a cycle of the control-flow graph (a strongly connected component of more than one
 * block, or a block that branches to itself).
 */
export function div64Counts(body: string[]): { total: number; inLoop: number } {
  // Basic blocks: a label starts one, a branch, ret or exit ends one.
  const blocks: { lines: string[]; label?: string; to: string[]; falls: boolean }[] = [];
  let cur = {
    lines: [] as string[],
    label: undefined as string | undefined,
    to: [] as string[],
    falls: true,
  };
  const close = () => {
    if (cur.lines.length > 0 || cur.label !== undefined) blocks.push(cur);
  };
  for (const line of body) {
    const label = line.match(/^\s*(\$?[\w$]+):/);
    if (label) {
      close();
      cur = { lines: [], label: label[1], to: [], falls: true };
      continue;
    }
    cur.lines.push(line);
    const bra = line.match(/^\s*(@!?%p\d+\s+)?bra(?:\.uni)?\s+(\$?[\w$]+)\s*;/);
    const end = /^\s*(@!?%p\d+\s+)?(ret|exit|trap)\b/.exec(line);
    if (bra || end) {
      if (bra) cur.to.push(bra[2]);
      cur.falls = (bra ?? end)![1] !== undefined;
      close();
      cur = { lines: [], label: undefined, to: [], falls: true };
    }
  }
  close();
  const index = new Map(blocks.flatMap((b, i) => (b.label ? [[b.label, i] as const] : [])));
  const succ = blocks.map((b, i) => {
    const out = b.to.map((l) => index.get(l)).filter((x): x is number => x !== undefined);
    if (b.falls && i + 1 < blocks.length) out.push(i + 1);
    return out;
  });
  // Tarjan's strongly connected components, iteratively.
  const order = new Int32Array(blocks.length).fill(-1), low = new Int32Array(blocks.length);
  const onStack = new Uint8Array(blocks.length), cyclic = new Uint8Array(blocks.length);
  const stack: number[] = [];
  let next = 0;
  for (let root = 0; root < blocks.length; root++) {
    if (order[root] !== -1) continue;
    const work: [number, number][] = [[root, 0]];
    order[root] = low[root] = next++;
    stack.push(root);
    onStack[root] = 1;
    while (work.length > 0) {
      const top = work[work.length - 1];
      const [v, k] = top;
      if (k < succ[v].length) {
        top[1]++;
        const w = succ[v][k];
        if (w === v) cyclic[v] = 1;
        if (order[w] === -1) {
          order[w] = low[w] = next++;
          stack.push(w);
          onStack[w] = 1;
          work.push([w, 0]);
        } else if (onStack[w]) low[v] = Math.min(low[v], order[w]);
        continue;
      }
      work.pop();
      if (work.length > 0) {
        const u = work[work.length - 1][0];
        low[u] = Math.min(low[u], low[v]);
      }
      if (low[v] === order[v]) {
        const comp: number[] = [];
        let w: number;
        do {
          w = stack.pop()!;
          onStack[w] = 0;
          comp.push(w);
        } while (w !== v);
        if (comp.length > 1) { for (const c of comp) cyclic[c] = 1; }
      }
    }
  }
  let total = 0, inLoop = 0;
  blocks.forEach((b, i) => {
    const n = b.lines.filter((l) => DIV64.test(l)).length;
    total += n;
    if (cyclic[i]) inLoop += n;
  });
  return { total, inLoop };
}

/** Per-file instruction counts of one PTX file. */
export function fileCounts(file: string, ptx: string): FileStats {
  const count = (re: RegExp) => (ptx.match(re) ?? []).length;
  return {
    file,
    div64: ptx.split("\n").filter((l) => DIV64.test(l)).length,
    cpAsync: count(/\bcp\.async\.c[ag]\b/g),
    ldmatrix: count(/\bldmatrix\./g),
    mma: count(/\b(?:wmma\.mma|mma)\.sync\b/g),
    wmmaLoad: count(/\bwmma\.load\./g),
    globalLoadV4: count(/\bld\.global(?:\.\w+)*\.v4\./g),
  };
}

/** ptxas -v output -> per mangled entry: registers, stack frame, spills, shared memory. */
export function parsePtxas(
  text: string,
): Map<string, Omit<KernelStats, "file" | "name" | "div64" | "div64InLoop">> {
  const out = new Map<string, Omit<KernelStats, "file" | "name" | "div64" | "div64InLoop">>();
  let entry: string | undefined, props: string | undefined;
  for (const line of text.split("\n")) {
    let m = line.match(/Compiling entry function '([^']+)'/);
    if (m) {
      entry = m[1];
      out.set(entry, {
        registers: 0,
        stackFrame: 0,
        spillStores: 0,
        spillLoads: 0,
        sharedBytes: 0,
      });
      continue;
    }
    m = line.match(/Function properties for (\S+)/);
    if (m) {
      props = m[1];
      continue;
    }
    m = line.match(/(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads/);
    if (m && props !== undefined && out.has(props)) {
      const k = out.get(props)!;
      k.stackFrame = Number(m[1]);
      k.spillStores = Number(m[2]);
      k.spillLoads = Number(m[3]);
      continue;
    }
    m = line.match(/Used (\d+) registers/);
    if (m && entry !== undefined) {
      const k = out.get(entry)!;
      k.registers = Number(m[1]);
      k.sharedBytes = Number(line.match(/(\d+) bytes smem/)?.[1] ?? 0);
    }
  }
  return out;
}

/** Readable kernel names: c++filt, less the anonymous namespace and the parameter list. */
function demangle(names: string[]): string[] {
  let out = names;
  try {
    const res = new Deno.Command("c++filt", { args: names, stdout: "piped" }).outputSync();
    if (res.success) out = new TextDecoder().decode(res.stdout).trimEnd().split("\n");
  } catch {
    // no c++filt: keep the mangled names
  }
  return out.map((n) => {
    n = n.replaceAll("(anonymous namespace)::", "").replace(/^void /, "");
    if (!n.endsWith(")")) return n;
    let depth = 0;
    for (let i = n.length - 1; i >= 0; i--) {
      if (n[i] === ")") depth++;
      else if (n[i] === "(" && --depth === 0) return n.slice(0, i);
    }
    return n;
  });
}

/** The nvcc to use (NVCC, CUDA_HOME, PATH, /usr/local/cuda), or undefined when there is none. */
export function findNvcc(): { path: string; version: string } | undefined {
  const env = (k: string) => Deno.env.get(k);
  const candidates = [env("NVCC"), "nvcc", env("CUDA_HOME") && `${env("CUDA_HOME")}/bin/nvcc`]
    .concat(["/usr/local/cuda/bin/nvcc"]).filter((p): p is string => !!p);
  for (const path of candidates) {
    try {
      const out = new Deno.Command(path, { args: ["--version"], stdout: "piped" }).outputSync();
      if (out.success) {
        const v = new TextDecoder().decode(out.stdout).match(/release [\d.]+, V[\d.]+/)?.[0];
        return { path, version: v ?? "unknown" };
      }
    } catch {
      // not there
    }
  }
  return undefined;
}

/**
 * Compiles one `.cu` file for `arch` and returns its kernels and counts.
 *
 * @param nvcc Path of nvcc.
 * @param path The source file.
 * @param file Its name in the report.
 * @param arch "90" for sm_90.
 */
export async function compileStats(
  nvcc: string,
  path: string,
  file: string,
  arch = "90",
): Promise<{ kernels: KernelStats[]; counts: FileStats }> {
  const dir = await Deno.makeTempDir({ prefix: "pinstream-cuda-report-" });
  try {
    const out = await new Deno.Command(nvcc, {
      args: [
        "-O3",
        "-std=c++20",
        `-arch=sm_${arch}`,
        "-Xptxas",
        "-v",
        "-keep",
        "-keep-dir",
        dir,
        "-c",
        path,
        "-o",
        `${dir}/out.o`,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const log = new TextDecoder().decode(out.stderr) + new TextDecoder().decode(out.stdout);
    if (!out.success) throw new Error(`Cannot report on ${file}: nvcc failed:\n${log}`);
    const ptxName = [...Deno.readDirSync(dir)].find((e) => e.name.endsWith(".ptx"))?.name;
    if (ptxName === undefined) throw new Error(`Cannot report on ${file}: nvcc kept no PTX`);
    const ptx = await Deno.readTextFile(`${dir}/${ptxName}`);
    const ptxas = parsePtxas(log);
    const entries = ptxEntries(ptx);
    const mangled = [...ptxas.keys()];
    const names = demangle(mangled);
    const kernels = mangled.map((m, i) => {
      const d = div64Counts(entries.get(m) ?? []);
      return { file, name: names[i], ...ptxas.get(m)!, div64: d.total, div64InLoop: d.inLoop };
    });
    return { kernels, counts: fileCounts(file, ptx) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const KERNELS = new URL("../kernels/", import.meta.url);

/**
 * The report of the backend's sources for sm_90, cached per source text, nvcc version and
 * this tool's text (compiling takes about a minute).
 */
export async function cudaReport(
  nvcc: { path: string; version: string },
  options: { cache?: boolean } = {},
): Promise<CudaReport> {
  const hash = createHash("sha256").update(nvcc.version);
  hash.update(Deno.readFileSync(new URL(import.meta.url)));
  for (const rel of SOURCES.cuda) hash.update(rel).update(Deno.readFileSync(new URL(rel, KERNELS)));
  const cached = `${cacheDir()}/cuda-report-${hash.digest("hex").slice(0, 20)}.json`;
  if (options.cache !== false) {
    try {
      return JSON.parse(await Deno.readTextFile(cached));
    } catch {
      // not cached yet
    }
  }
  const report: CudaReport = { arch: "sm_90", nvcc: nvcc.version, kernels: [], files: [] };
  for (const rel of SOURCES.cuda.filter((p) => p.endsWith(".cu"))) {
    const { kernels, counts } = await compileStats(
      nvcc.path,
      new URL(rel, KERNELS).pathname,
      rel,
    );
    report.kernels.push(...kernels);
    report.files.push(counts);
  }
  if (options.cache !== false) {
    await Deno.mkdir(cacheDir(), { recursive: true });
    await Deno.writeTextFile(cached, JSON.stringify(report));
  }
  return report;
}

/** The hot-table row a kernel falls under, if any. */
export function hotRow(name: string, table: readonly HotKernel[] = HOT_KERNELS) {
  return table.find((h) => name.startsWith(h.prefix));
}

function faults(k: KernelStats): string[] {
  const out: string[] = [];
  if (k.stackFrame > 0) out.push(`${k.stackFrame}-byte stack frame`);
  if (k.spillStores + k.spillLoads > 0) {
    out.push(`spills (${k.spillStores} bytes stored, ${k.spillLoads} loaded)`);
  }
  if (k.div64InLoop > 0) out.push(`${k.div64InLoop} 64-bit div/rem inside a loop`);
  return out;
}

/**
 * What fails the check: an enforced hot kernel with a stack frame, spills or a 64-bit division
 * in a loop; an enforced row that matches no kernel; an exempt row whose kernels are all clean
 * (the exemption should go).
 */
export function hotKernelProblems(
  report: CudaReport,
  table: readonly HotKernel[] = HOT_KERNELS,
): string[] {
  const out: string[] = [];
  for (const row of table) {
    const ks = report.kernels.filter((k) => hotRow(k.name, table) === row);
    if (ks.length === 0) {
      if (row.exempt === undefined) {
        out.push(`${row.prefix}: no such kernel in the build (update HOT_KERNELS)`);
      }
      continue;
    }
    const bad = ks.flatMap((k) => faults(k).map((f) => `${k.file} ${k.name}: ${f}`));
    if (row.exempt === undefined) out.push(...bad);
    else if (bad.length === 0) {
      out.push(`${row.prefix}: clean now; remove its exemption ("${row.exempt}") in HOT_KERNELS`);
    }
  }
  return out;
}

/** The report as Markdown. */
export function renderReport(report: CudaReport): string {
  const lines = [
    `# Static report of the CUDA build (${report.arch}, nvcc ${report.nvcc})`,
    "",
    "Written by `deno task cuda-report` (tools/cuda_report.ts).",
    "",
    "## Per file (PTX instructions)",
    "",
    "| file | 64-bit div/rem | cp.async | ldmatrix | mma | wmma.load | ld.global.v4 |",
    "|---|---|---|---|---|---|---|",
    ...report.files.map((f) =>
      `| ${f.file} | ${f.div64} | ${f.cpAsync} | ${f.ldmatrix} | ${f.mma} | ${f.wmmaLoad} | ${f.globalLoadV4} |`
    ),
    "",
    "## Per kernel (ptxas -v; div/rem from the PTX)",
    "",
    "| file | kernel | hot | regs | stack | spill st/ld | smem | div64 (in loops) |",
    "|---|---|---|---|---|---|---|---|",
  ];
  for (const k of report.kernels) {
    const row = hotRow(k.name);
    const hot = row === undefined ? "" : row.exempt === undefined ? "yes" : "exempt";
    const name = k.name.length > 110 ? `${k.name.slice(0, 107)}...` : k.name;
    lines.push(
      `| ${k.file} | \`${name}\` | ${hot} | ${k.registers} | ${k.stackFrame} | ${k.spillStores}/${k.spillLoads} | ${k.sharedBytes} | ${k.div64} (${k.div64InLoop}) |`,
    );
  }
  const problems = hotKernelProblems(report);
  lines.push("", "## Hot-kernel check", "");
  lines.push(...(problems.length === 0 ? ["clean"] : problems.map((p) => `- ${p}`)));
  lines.push("", "Exempt (not yet rewritten):", "");
  for (const h of HOT_KERNELS.filter((h) => h.exempt)) {
    lines.push(`- \`${h.prefix}\` (${h.family}): ${h.exempt}`);
  }
  return lines.join("\n") + "\n";
}

async function main(args: string[]): Promise<number> {
  let out = "bench/out/cuda-report.md", json: string | undefined;
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--out") out = args[++i];
    else if (args[i] === "--json") json = args[++i];
    else throw new TypeError(`Cannot run: unknown argument ${args[i]} (use --out F, --json F)`);
  }
  const nvcc = findNvcc();
  if (nvcc === undefined) {
    console.error("Cannot write the CUDA report: nvcc not found (PATH, NVCC, CUDA_HOME)");
    return 1;
  }
  const report = await cudaReport(nvcc);
  const md = renderReport(report);
  await Deno.mkdir(new URL(".", `file://${Deno.cwd()}/${out}`), { recursive: true });
  await Deno.writeTextFile(out, md);
  if (json !== undefined) await Deno.writeTextFile(json, JSON.stringify(report, null, 2) + "\n");
  console.log(md);
  console.log(`wrote ${out}`);
  return hotKernelProblems(report).length === 0 ? 0 : 2;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
