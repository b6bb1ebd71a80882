// The CUDA sources say what the emulator needs (kernels/cuda/launch.cuh): every launch is a
// PS_LAUNCH and every shared variable a PS_SHARED*, so the host C++ compiler builds them as
// they are, with no rewrite step; a bare `<<<` or `__shared__` cannot slip in.

import assert from "node:assert";
import { emulatorCommand, SOURCES } from "../ffi/library.ts";
import { bareCudaSyntax, launchSites } from "./_emu_sources.ts";

const KERNELS = new URL("../kernels/", import.meta.url);

Deno.test("the CUDA sources launch and declare shared memory only through launch.cuh", async () => {
  let launches = 0;
  for (const rel of SOURCES.cuda.filter((p) => /\.cuh?$/.test(p) && p !== "cuda/launch.cuh")) {
    const text = await Deno.readTextFile(new URL(rel, KERNELS));
    assert.deepStrictEqual(bareCudaSyntax(text), [], `${rel}: bare <<< or __shared__`);
    launches += launchSites(text).length;
  }
  // image.cu: 2 augment + 2 labels; gemm.cu, conv.cu, norm.cu, ops.cu: every kernel of the nn ABI.
  assert.ok(launches >= 20, `only ${launches} PS_LAUNCH sites found`);
});

Deno.test("launch sites name the kernel as the preprocessor stringifies it", () => {
  const src = [
    "/* PS_LAUNCH(in_comment, 1, 1, 0, 0); */",
    'const char *s = "PS_LAUNCH(in_string, 1, 1, 0, 0)";',
    "  PS_LAUNCH(plain, blocks_for(n, EW), EW, 0, st, f(a, b), c);",
    "  PS_LAUNCH((tmpl<Out,   PS_IMAGE_NCHW>), grid, 256, 0, st,",
    "            x);",
  ].join("\n");
  assert.deepStrictEqual(launchSites(src), [
    { line: 3, kernel: "plain" },
    { line: 4, kernel: "(tmpl<Out, PS_IMAGE_NCHW>)" },
  ]);
});

Deno.test("the emulator's headers refuse a bare __shared__ declaration", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pinstream-emu-shared-" });
  try {
    await Deno.writeTextFile(
      `${dir}/bare.cu`,
      "__global__ void k(float *out) { __shared__ float s[32]; out[0] = s[0]; }\n",
    );
    const { compiler, args } = emulatorCommand(["bare.cu"], "bare.o");
    const include = new URL("emu/include", KERNELS).pathname;
    const flags = args.filter((a) => a !== "-shared" && !a.startsWith("-Iemu"));
    const out = await new Deno.Command(compiler, {
      args: ["-fsyntax-only", `-I${include}`, ...flags.filter((a) => a !== "-o" && a !== "bare.o")],
      cwd: dir,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.strictEqual(out.success, false);
    assert.match(new TextDecoder().decode(out.stderr), /use_PS_SHARED_of_kernels_cuda_launch_cuh/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
