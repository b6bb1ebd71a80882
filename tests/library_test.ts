/**
 * Finding, building and loading backend libraries: overrides, the cache key, and the errors
 * for a missing compiler, an unloadable file and a stale ABI. Each case runs in a child Deno
 * process, because a process loads each backend once.
 */

import assert from "node:assert";
import { cudaArchProblem, libraryPath, loadLibrary } from "../ffi/library.ts";

const LIBRARY_URL = new URL("../ffi/library.ts", import.meta.url).href;

interface Outcome {
  path?: string;
  reason?: string;
  message?: string;
}

/** Loads the cpu backend in a child process with `env` and reports what happened. */
async function loadInChild(env: Record<string, string>, url = LIBRARY_URL): Promise<Outcome> {
  const script = `import { libraryPath, loadLibrary } from ${JSON.stringify(url)};
    try { loadLibrary("cpu"); console.log(JSON.stringify({ path: libraryPath("cpu") })); }
    catch (e) { console.log(JSON.stringify({ reason: e.reason, message: e.message })); }`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    env: { NO_COLOR: "1", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, stderr);
  return JSON.parse(new TextDecoder().decode(out.stdout));
}

function builtCpuLibrary(): string {
  loadLibrary("cpu");
  return libraryPath("cpu")!;
}

Deno.test("a missing compiler is one error listing what was tried and what to install", async () => {
  const cache = await Deno.makeTempDir();
  try {
    const got = await loadInChild({
      PATH: "/nonexistent",
      CC: "no-such-cc",
      PINSTREAM_CACHE: cache,
      PINSTREAM_LIB: "",
      PINSTREAM_LIB_CPU: "",
    });
    assert.strictEqual(got.reason, "no-compiler", got.message);
    assert.match(got.message!, /^Cannot load the cpu backend: no C compiler found/);
    assert.match(got.message!, /no-such-cc \(not found\), cc \(not found\), gcc \(not found\)/);
    assert.match(got.message!, /install a C compiler/);
    assert.match(got.message!, /PINSTREAM_LIB_CPU/);
  } finally {
    await Deno.remove(cache, { recursive: true });
  }
});

Deno.test("PINSTREAM_LIB_CPU loads a prebuilt library without any compiler", async () => {
  const path = builtCpuLibrary();
  const got = await loadInChild({ PATH: "/nonexistent", PINSTREAM_LIB_CPU: path });
  assert.deepStrictEqual(got, { path });
});

Deno.test("PINSTREAM_LIB serves the backend it was built for", async () => {
  const path = builtCpuLibrary();
  const got = await loadInChild({ PATH: "/nonexistent", PINSTREAM_LIB: path });
  assert.deepStrictEqual(got, { path });
});

Deno.test("an override that cannot be loaded names the variable", async () => {
  const got = await loadInChild({ PINSTREAM_LIB_CPU: "/nonexistent/libnothing.so" });
  assert.strictEqual(got.reason, "load-failed");
  assert.match(got.message!, /\/nonexistent\/libnothing\.so \(from \$PINSTREAM_LIB_CPU\)/);
});

Deno.test("a library built for another ABI version is refused", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(
      `${dir}/stale.c`,
      `int ps_abi_version(int *o) { *o = 99; return 0; }
       int ps_backend(int *o) { *o = 0; return 0; }`,
    );
    const cc = await new Deno.Command("cc", {
      args: ["-shared", "-fPIC", `${dir}/stale.c`, "-o", `${dir}/libstale.so`],
    }).output();
    assert.ok(cc.success, new TextDecoder().decode(cc.stderr));
    const got = await loadInChild({ PINSTREAM_LIB_CPU: `${dir}/libstale.so` });
    assert.strictEqual(got.reason, "abi-mismatch");
    assert.match(got.message!, /implements ABI 99, this pinstream needs ABI \d+/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("editing a kernel source builds a new library; unchanged sources reuse the cache", async () => {
  // A private copy of internal/, ffi/ and kernels/ so the edit touches nobody else's build.
  const root = await Deno.makeTempDir();
  const cache = `${root}/cache`;
  try {
    for (const dir of ["internal", "ffi", "kernels"]) {
      await copyTree(new URL(`../${dir}/`, import.meta.url), `${root}/${dir}`);
    }
    const url = new URL(`file://${root}/ffi/library.ts`).href;
    const env = { PINSTREAM_CACHE: cache, PINSTREAM_LIB: "", PINSTREAM_LIB_CPU: "" };
    const first = await loadInChild(env, url);
    assert.ok(first.path?.startsWith(cache), JSON.stringify(first));
    const again = await loadInChild(env, url);
    assert.strictEqual(again.path, first.path);
    await Deno.writeTextFile(`${root}/kernels/cpu/core.c`, "\n/* edited */\n", { append: true });
    const edited = await loadInChild(env, url);
    assert.ok(edited.path?.startsWith(cache), JSON.stringify(edited));
    assert.notStrictEqual(edited.path, first.path);
    const names = [...Deno.readDirSync(cache)].map((e) => e.name).filter((n) => !n.startsWith("."));
    assert.strictEqual(names.length, 2, names.join(", ")); // no temporary files left behind
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

async function copyTree(from: URL, to: string): Promise<void> {
  await Deno.mkdir(to, { recursive: true });
  for await (const entry of Deno.readDir(from)) {
    if (entry.isDirectory) await copyTree(new URL(`${entry.name}/`, from), `${to}/${entry.name}`);
    else if (entry.isFile) await Deno.copyFile(new URL(entry.name, from), `${to}/${entry.name}`);
  }
}

Deno.test("a GPU the CUDA library was not built for is named with the setting that fixes it", () => {
  const archs = ["75", "80", "90"];
  assert.strictEqual(cudaArchProblem(7, 5, archs), undefined); // T4: its own cubin
  assert.strictEqual(cudaArchProblem(8, 6, archs), undefined); // RTX 30xx: sm_80's cubin
  assert.strictEqual(cudaArchProblem(8, 9, archs), undefined); // RTX 40xx / L4
  assert.strictEqual(cudaArchProblem(9, 0, archs), undefined); // H100
  assert.strictEqual(cudaArchProblem(10, 0, archs), undefined); // newer: compute_90 PTX
  const why = cudaArchProblem(7, 0, archs); // V100
  assert.match(why!, /sm_70 .*sm_75, sm_80, sm_90.*PINSTREAM_CUDA_ARCHS=70/);
  assert.match(cudaArchProblem(8, 0, ["90"])!, /sm_80/); // an H100-only build on an A100
  assert.strictEqual(cudaArchProblem(9, 0, ["90a"]), undefined);
  assert.match(cudaArchProblem(10, 0, ["90a"])!, /sm_100/); // arch-specific code is not forward-compatible
});

/** Loads the cpu backend in a child with exactly `perms` (no prompt) and reports it. */
/**
 * The child's environment: this process's, less the LD_* variables that change what Deno asks
 * of --allow-run (a GPU machine often sets LD_LIBRARY_PATH), plus `env`.
 */
function childEnv(env: Record<string, string>): Record<string, string> {
  const base = Deno.env.toObject();
  for (const name of Object.keys(base)) if (name.startsWith("LD_")) delete base[name];
  return { ...base, NO_COLOR: "1", ...env };
}

async function loadWithPermissions(perms: string[], env: Record<string, string>): Promise<Outcome> {
  const script = `import { libraryPath, loadLibrary } from ${JSON.stringify(LIBRARY_URL)};
    try { loadLibrary("cpu"); console.log(JSON.stringify({ path: libraryPath("cpu") })); }
    catch (e) { console.log(JSON.stringify({ reason: e.reason, message: e.message, name: e.name })); }`;
  const file = await Deno.makeTempFile({ suffix: ".ts" });
  try {
    await Deno.writeTextFile(file, script);
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--no-prompt", ...perms, file], // loading modules needs no permission
      env: childEnv(env),
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    assert.ok(out.success, new TextDecoder().decode(out.stderr));
    return JSON.parse(stdout.trim().split("\n").at(-1)!);
  } finally {
    await Deno.remove(file);
  }
}

Deno.test("the build cache key does not depend on permissions, and no lock file stays behind", async () => {
  const cache = await Deno.makeTempDir();
  try {
    const env = { PINSTREAM_CACHE: cache, PINSTREAM_LIB: "", PINSTREAM_LIB_CPU: "" };
    const full = await loadWithPermissions(
      ["--allow-read", "--allow-write", "--allow-env", "--allow-run", "--allow-ffi"],
      env,
    );
    assert.ok(full.path?.startsWith(cache), JSON.stringify(full));
    // docs/environment.md's explicit list, with reads limited to the sources and the cache: no
    // /proc/cpuinfo, yet the same key (the compiler says what -march=native means).
    const kernels = new URL("../", import.meta.url).pathname;
    const narrow = await loadWithPermissions([
      `--allow-read=${kernels},${cache}`,
      `--allow-write=${cache}`,
      "--allow-env",
      "--allow-run",
      "--allow-ffi",
    ], env);
    assert.strictEqual(narrow.path, full.path, JSON.stringify(narrow));
    const left = [...Deno.readDirSync(cache)].map((e) => e.name);
    assert.deepStrictEqual(left.filter((n) => n.endsWith(".lock")), [], left.join(", "));
  } finally {
    await Deno.remove(cache, { recursive: true });
  }
});

Deno.test("a missing permission is named with its flag, never as a missing driver or compiler", async () => {
  const cache = await Deno.makeTempDir();
  try {
    const env = { PINSTREAM_CACHE: cache, PINSTREAM_LIB: "", PINSTREAM_LIB_CPU: "" };
    const all = ["--allow-read", "--allow-write", "--allow-env", "--allow-run", "--allow-ffi"];
    const without = (flag: string) => all.filter((p) => p !== flag);
    // A fresh cache: a build is needed, so run and write matter too.
    for (const flag of ["--allow-run", "--allow-write", "--allow-read", "--allow-env"]) {
      const got = await loadWithPermissions(without(flag), env);
      assert.strictEqual(got.reason, "no-permission", `${flag}: ${JSON.stringify(got)}`);
      assert.match(
        got.message!,
        new RegExp(
          `^Cannot load the cpu backend: Deno denied \\w+ access.*: run with ${flag} \\(pinstream `,
        ),
      );
      assert.doesNotMatch(got.message!, /no C compiler|install/);
    }
    // Built now: without --allow-ffi it cannot be loaded.
    assert.ok((await loadWithPermissions(all, env)).path);
    const noFfi = await loadWithPermissions(without("--allow-ffi"), env);
    assert.strictEqual(noFfi.reason, "no-permission", JSON.stringify(noFfi));
    assert.match(
      noFfi.message!,
      /Deno denied ffi access to ".*libpinstream_cpu_.*": run with --allow-ffi \(pinstream loads its native library with Deno.dlopen\)/,
    );
  } finally {
    await Deno.remove(cache, { recursive: true });
  }
});

Deno.test("with LD_LIBRARY_PATH set, a listed or missing --allow-run is named with the variable and both ways out", async () => {
  const cache = await Deno.makeTempDir();
  try {
    // A CUDA machine often sets LD_LIBRARY_PATH; Deno then starts a program only under an
    // unlisted --allow-run, so the compiler (the cache key asks its version) is refused.
    const env = {
      PINSTREAM_CACHE: cache,
      PINSTREAM_LIB: "",
      PINSTREAM_LIB_CPU: "",
      LD_LIBRARY_PATH: "/nonexistent/lib64",
    };
    const rest = ["--allow-read", "--allow-write", "--allow-env", "--allow-ffi"];
    for (const run of [[], ["--allow-run=cc,gcc,clang,nvcc"]]) {
      const got = await loadWithPermissions([...rest, ...run], env);
      assert.strictEqual(got.reason, "no-permission", `${run}: ${JSON.stringify(got)}`);
      assert.match(
        got.message!,
        /^Cannot load the cpu backend: Deno denied run access to a program started while LD_LIBRARY_PATH is set: run with --allow-run without a list of programs, or unset LD_LIBRARY_PATH \(pinstream asks the C\/CUDA compiler/,
      );
    }
    // Unlisted, the same environment builds and loads.
    const ok = await loadWithPermissions([...rest, "--allow-run"], env);
    assert.ok(ok.path?.startsWith(cache), JSON.stringify(ok));
  } finally {
    await Deno.remove(cache, { recursive: true });
  }
});
