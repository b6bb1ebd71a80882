// The source rewrite that lets the host C++ compiler build the CUDA sources for the emulator
// (ffi/_cuda_emu.ts): launches and __shared__ declarations become C++, nothing else changes,
// and every line stays where it was.

import assert from "node:assert";
import { rewriteForEmulator } from "../ffi/_cuda_emu.ts";

function lineCount(s: string): number {
  return s.split("\n").length;
}

Deno.test("a launch becomes ps_emu::launch with the kernel, its configuration and its arguments", () => {
  const out = rewriteForEmulator("  k<<<grid, 256, 0, st>>>(a, (int)n);\n");
  assert.strictEqual(
    out,
    '  ::ps_emu::launch(::ps_emu::Site{"k", __FILE__, __LINE__}, ::ps_emu::Config(grid, 256, 0, st), ' +
      "[](auto... ps_emu_a) { k(ps_emu_a...); }, a, (int)n);\n",
  );
});

Deno.test("template kernels, nested brackets and shifts in the configuration are parsed", () => {
  const src =
    "ns::kern<Out, (A > B)><<<blocks_for(n >> 1, EW), dim3(4, 2), 0, (cudaStream_t)s>>>(f(x, y), z);";
  const out = rewriteForEmulator(src);
  assert.match(out, /Site\{"ns::kern<Out, \(A > B\)>", __FILE__, __LINE__\}/);
  assert.match(out, /Config\(blocks_for\(n >> 1, EW\), dim3\(4, 2\), 0, \(cudaStream_t\)s\)/);
  assert.match(out, /\{ ns::kern<Out, \(A > B\)>\(ps_emu_a\.\.\.\); \}, f\(x, y\), z\);$/);
});

Deno.test("a launch without arguments has no trailing comma", () => {
  assert.match(rewriteForEmulator("k<<<1, 1>>>();"), /\{ k\(ps_emu_a\.\.\.\); \}\);$/);
});

Deno.test("a launch over several lines keeps every later line where it was", () => {
  const src = "int a;\nkernel<<<g, b, 0,\n  st>>>(x,\n  y,\n  z);\nint marker;\n";
  const out = rewriteForEmulator(src);
  assert.strictEqual(lineCount(out), lineCount(src));
  assert.strictEqual(out.split("\n").indexOf("int marker;"), 5);
});

Deno.test("comments, strings and character literals are left alone", () => {
  const src = [
    "/* my_kernel<<<grid, block, 0, st>>>(...); */",
    "// k<<<1, 1>>>();",
    'const char *s = "reduce_partials<<<>>> __shared__ int x;";',
    "char q = '\"'; int big = 1'000'000;",
    "k<<<1, 1>>>(q);",
  ].join("\n");
  const out = rewriteForEmulator(src).split("\n");
  assert.deepStrictEqual(out.slice(0, 4), src.split("\n").slice(0, 4));
  assert.match(out[4], /^::ps_emu::launch\(/);
});

Deno.test("__shared__ declarations become the block's instance, aligned as asked", () => {
  const src = [
    "  __shared__ __align__(32) __half As[BM][BK + 8];",
    "  __shared__ float sh[32][1];",
    "  __shared__ unsigned int count;",
    "  extern __shared__ float dyn[];",
  ].join("\n");
  assert.deepStrictEqual(rewriteForEmulator(src).split("\n"), [
    "  auto &As = ::ps_emu::shared_var<__half[BM][BK + 8], 32>([] {});",
    "  auto &sh = ::ps_emu::shared_var<float[32][1], 0>([] {});",
    "  auto &count = ::ps_emu::shared_var<unsigned int, 0>([] {});",
    "  float *const dyn = ::ps_emu::dynamic_shared<float>();",
  ]);
});

Deno.test("a declaration the rewrite cannot take is left for the compiler to refuse", () => {
  // Two declarators: the emulator's __shared__ macro then fails to compile, loudly.
  const src = "__shared__ int a, b;";
  assert.strictEqual(rewriteForEmulator(src), src);
});

Deno.test("a launch that cannot be parsed is a SyntaxError naming where", () => {
  assert.throws(() => rewriteForEmulator("k<<<1, 1;"), /no >>> after the <<< at offset 1/);
  assert.throws(() => rewriteForEmulator("k<<<1, 1>>>;"), /no argument list after the >>>/);
});

Deno.test("the project's CUDA sources rewrite with their line counts intact", async () => {
  for (const file of ["cuda/common.cuh", "cuda/core.cu", "cuda/image.cu", "cuda/nn.cu"]) {
    const src = await Deno.readTextFile(new URL(`../kernels/${file}`, import.meta.url));
    const out = rewriteForEmulator(src);
    assert.strictEqual(lineCount(out), lineCount(src), file);
    assert.ok(!/<<<[^>]*>>>\s*\(/.test(out.replace(/\/\*[\s\S]*?\*\/|"[^"\n]*"/g, "")), file);
    assert.ok(!/^\s*__shared__/m.test(out), file);
  }
});
