/**
 * Shared metadata for benchmark result files (commit and machine), so every bench
 * records them the same way. Private to bench/.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";

const ROOT = new URL("..", import.meta.url).pathname;

/**
 * A smoke run (PINSTREAM_BENCH_SMOKE=1): the benchmark's GPU code paths run on the CUDA
 * emulator, so a mistake in them shows here rather than on a machine with a GPU; nothing is
 * written and no timing means anything (tests/bench_smoke_test.ts).
 */
export function smokeRun(): boolean {
  // Read when asked (a benchmark's --help runs without permissions).
  return Deno.env.get("PINSTREAM_BENCH_SMOKE") === "1";
}

/**
 * Throws for a device whose timings would be the CUDA emulator's: it runs the CUDA backend to
 * check correctness (PINSTREAM_CUDA_EMULATOR=1), and its speed says nothing about a GPU.
 * A smoke run lets it through.
 */
export function assertMeasurable(dev: Device): void {
  if (dev.props.emulated && !smokeRun()) {
    throw new Error(
      `Cannot benchmark ${dev} (${dev.props.name}): the CUDA emulator checks correctness and ` +
        "its timings say nothing about a GPU; unset PINSTREAM_CUDA_EMULATOR",
    );
  }
}

/**
 * Runs `git <args>` in the repository root and returns its trimmed stdout, or "" when git is
 * missing or fails.
 */
export async function git(args: string[]): Promise<string> {
  try {
    const o = await new Deno.Command("git", { args, cwd: ROOT, stdout: "piped", stderr: "null" })
      .output();
    return new TextDecoder().decode(o.stdout).trim();
  } catch {
    return "";
  }
}

/**
 * The checked-out commit (short hash), "-dirty" when tracked files under `paths` differ from
 * it (the results files never count), "unknown" without git.
 */
export async function commitStamp(paths: string[] = ["."]): Promise<string> {
  const head = await git(["rev-parse", "--short", "HEAD"]);
  if (head === "") return "unknown";
  const changed = await git([
    "status",
    "--porcelain",
    "--untracked-files=no",
    "--",
    ...paths,
    ":(exclude)bench/results",
  ]);
  return changed ? `${head}-dirty` : head;
}

/** A one-line description of this machine: CPU model, logical cores, OS and Deno version. */
export async function machine(): Promise<string> {
  let cpu = "unknown CPU";
  try {
    const info = await Deno.readTextFile("/proc/cpuinfo");
    cpu = /model name\s*:\s*(.*)/.exec(info)?.[1] ?? cpu;
  } catch { /* not Linux */ }
  return `${cpu}, ${navigator.hardwareConcurrency} logical cores, ${Deno.build.os}, ` +
    `deno ${Deno.version.deno}`;
}

/**
 * Where results go: bench/out/ (untracked) by default, bench/results/ (tracked, the numbers the
 * README quotes) with `--save`.
 *
 * @param save Write to bench/results/.
 * @returns The folder's path, with a trailing slash.
 */
export function resultsDir(save: boolean): string {
  return new URL(save ? "./results/" : "./out/", import.meta.url).pathname;
}

/**
 * Writes a benchmark's result as `<name>.json` and its chart as `<name>.svg` (train/_chart.ts)
 * into {@linkcode resultsDir}, and says where.
 *
 * @param name The benchmark ("loader", "pipeline", ...).
 * @param result What it measured.
 * @param save Write to the tracked bench/results/ instead of bench/out/.
 * @returns The JSON file's path.
 */
export async function writeResult(name: string, result: unknown, save: boolean): Promise<string> {
  if (smokeRun()) {
    console.log(`smoke run: ${name} not written (its timings mean nothing)`);
    return "";
  }
  const dir = resultsDir(save);
  await Deno.mkdir(dir, { recursive: true });
  const path = `${dir}${name}.json`;
  await Deno.writeTextFile(path, JSON.stringify(result, null, 2) + "\n");
  const { writeChart } = await import("../train/_chart.ts");
  const svg = await writeChart(path);
  console.log(
    `wrote ${path}${svg ? ` and ${svg}` : ""}${save ? "" : " (--save writes bench/results/)"}`,
  );
  return path;
}
