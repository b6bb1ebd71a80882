// The static report of the CUDA build (tools/cuda_report.ts): its parsers on fixed text, its
// check on a kernel compiled to fail it, and the check itself on kernels/cuda for sm_90. The
// last two need nvcc and are skipped, saying so, where there is none.

import assert from "node:assert";
import {
  compileStats,
  type CudaReport,
  cudaReport,
  div64Counts,
  fileCounts,
  findNvcc,
  type HotKernel,
  hotKernelProblems,
  parsePtxas,
  ptxEntries,
} from "../tools/cuda_report.ts";

const NVCC = findNvcc();
const NO_NVCC = NVCC === undefined ? " (skipped: nvcc not found)" : "";

Deno.test("ptxas -v output gives registers, stack frame, spills and shared memory per entry", () => {
  const log = [
    "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'",
    "ptxas info    : Function properties for _Z1kPf",
    "    24 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads",
    "ptxas info    : Used 40 registers, used 1 barriers, 17408 bytes smem, 368 bytes cmem[0]",
    "ptxas info    : Compiling entry function '_Z1gv' for 'sm_90'",
    "ptxas info    : Function properties for _Z1gv",
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
    "ptxas info    : Used 8 registers, used 0 barriers, 352 bytes cmem[0]",
  ].join("\n");
  assert.deepStrictEqual(Object.fromEntries(parsePtxas(log)), {
    _Z1kPf: { registers: 40, stackFrame: 24, spillStores: 8, spillLoads: 4, sharedBytes: 17408 },
    _Z1gv: { registers: 8, stackFrame: 0, spillStores: 0, spillLoads: 0, sharedBytes: 0 },
  });
});

Deno.test("a 64-bit division counts as in a loop only on a cycle of the control flow", () => {
  const ptx = [
    ".visible .entry k(",
    ")",
    "{",
    "\tdiv.s64 \t%rd1, %rd2, %rd3;", // before the loop
    "\tbra.uni \t$L__BB0_3;",
    "$L__BB0_1:", // the exit, laid out before the loop: a branch back to it is no loop
    "\tret;",
    "$L__BB0_3:",
    "\trem.u64 \t%rd4, %rd2, %rd3;", // in the loop
    "\t@%p1 bra \t$L__BB0_1;",
    "\tdiv.u32 \t%r1, %r2, %r3;", // 32-bit: not counted
    "\t@%p2 bra \t$L__BB0_3;",
    "\tbra.uni \t$L__BB0_1;",
    "}",
    ".visible .entry other(",
    ")",
    "{",
    "\tret;",
    "}",
  ].join("\n");
  const entries = ptxEntries(ptx);
  assert.deepStrictEqual([...entries.keys()], ["k", "other"]);
  assert.deepStrictEqual(div64Counts(entries.get("k")!), { total: 2, inLoop: 1 });
  const counts = fileCounts("f.cu", ptx + "\n\tcp.async.cg.shared.global [%r1], [%rd1], 16;\n");
  assert.deepStrictEqual(
    [counts.div64, counts.cpAsync, counts.ldmatrix, counts.mma],
    [2, 1, 0, 0],
  );
});

Deno.test({
  name:
    `the hot-kernel check fails a kernel with a stack frame or a 64-bit division in a loop${NO_NVCC}`,
  ignore: NVCC === undefined,
  fn: async () => {
    const dir = await Deno.makeTempDir();
    try {
      // `bad`: a local array indexed at run time (a stack frame) and an int64 division per
      // iteration; `good`: 32-bit math only.
      await Deno.writeTextFile(
        `${dir}/k.cu`,
        `__global__ void bad(const long long *x, long long *y, long long n, int j) {
  long long t[16];
  for (int i = 0; i < 16; i++) t[i] = x[i];
  for (long long i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] / n + t[(i + j) & 15];
}
__global__ void good(const float *x, float *y, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] * 2.0f;
}
`,
      );
      const { kernels, counts } = await compileStats(NVCC!.path, `${dir}/k.cu`, "k.cu");
      const report: CudaReport = { arch: "sm_90", nvcc: "", kernels, files: [counts] };
      const table: HotKernel[] = [
        { prefix: "bad", family: "test" },
        { prefix: "good", family: "test" },
      ];
      const problems = hotKernelProblems(report, table);
      assert.ok(problems.some((p) => /bad: \d+-byte stack frame/.test(p)), problems.join("\n"));
      assert.ok(problems.some((p) => /bad: \d+ 64-bit div\/rem inside a loop/.test(p)));
      assert.ok(!problems.some((p) => p.includes("good")), problems.join("\n"));
      // An exempt kernel that is clean must lose its exemption; a row that matches nothing fails.
      assert.deepStrictEqual(
        hotKernelProblems(report, [
          { prefix: "good", family: "test", exempt: "pending" },
          { prefix: "gone", family: "test" },
        ]).map((p) => p.split(":")[0]),
        ["good", "gone"],
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name:
    `kernels/cuda for sm_90: no hot kernel has a stack frame, spills or a 64-bit division in a loop${NO_NVCC}`,
  ignore: NVCC === undefined,
  fn: async () => {
    const report = await cudaReport(NVCC!);
    assert.ok(report.kernels.length > 20, `only ${report.kernels.length} kernels reported`);
    assert.deepStrictEqual(hotKernelProblems(report), []);
  },
});
