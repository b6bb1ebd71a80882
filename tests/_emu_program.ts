/**
 * Builds a test program against the CUDA emulator (kernels/emu and kernels/cuda/launch.cuh),
 * once per source version and compile line, cached next to the libraries: the self-test
 * (tests/emu_test.ts) and the sanitizer proofs (tests/emu_asan_test.ts).
 *
 * @module
 */

import assert from "node:assert";
import { createHash } from "node:crypto";
import { cacheDir, SOURCES } from "../ffi/library.ts";

const KERNELS = new URL("../kernels/", import.meta.url);

/**
 * Compiles `program` (a .cu file) with the emulator's runtime into an executable and returns
 * its path; a build with the same sources and command is reused.
 *
 * @param name The executable's name (and the .cu file's name in the build folder).
 * @param program The .cu file.
 * @param command The compiler and its arguments (`emulatorCommand([name + ".cu", ...ccs],
 * name, { program: true })`), run in the build folder.
 * @returns The executable's path.
 */
export async function buildEmulatorProgram(
  name: string,
  program: URL,
  command: { compiler: string; args: string[] },
): Promise<string> {
  const files = new Map<string, string>();
  for (const rel of SOURCES.emulator.filter((p) => p.startsWith("emu/"))) {
    files.set(rel, await Deno.readTextFile(new URL(rel, KERNELS)));
  }
  files.set("cuda/launch.cuh", await Deno.readTextFile(new URL("cuda/launch.cuh", KERNELS)));
  files.set(`${name}.cu`, await Deno.readTextFile(program));
  const { compiler, args } = command;
  const hash = createHash("sha256").update(compiler).update(args.join(" "));
  for (const [rel, text] of files) hash.update(rel).update("\0").update(text).update("\0");
  const dir = `${cacheDir()}/emu-${name}-${hash.digest("hex").slice(0, 16)}`;
  const exe = `${dir}/${name}`;
  try {
    await Deno.stat(exe);
    return exe;
  } catch {
    // not built yet
  }
  const tmp = `${dir}.tmp-${Deno.pid}`;
  for (const [rel, text] of files) {
    await Deno.mkdir(`${tmp}/${rel.slice(0, rel.lastIndexOf("/") + 1)}`, { recursive: true });
    await Deno.writeTextFile(`${tmp}/${rel}`, text);
  }
  const out = await new Deno.Command(compiler, { args, cwd: tmp, stderr: "piped" }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  await Deno.rename(tmp, dir).catch(async () => await Deno.remove(tmp, { recursive: true }));
  return exe;
}

/**
 * Runs one case of a program built by {@link buildEmulatorProgram}, with `env` added to the
 * environment, and returns its exit code and decoded output.
 *
 * @param exe The executable's path.
 * @param name The case to run (the program's one argument).
 * @param env Variables set for the run (the thread order, sanitizer options, ...).
 * @returns The exit code, stdout and stderr.
 */
export async function runEmulatorProgram(
  exe: string,
  name: string,
  env: Record<string, string>,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const res = await new Deno.Command(exe, {
    args: [name],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return { code: res.code, stdout: text.decode(res.stdout), stderr: text.decode(res.stderr) };
}
