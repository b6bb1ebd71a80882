/**
 * Shared metadata for benchmark result files (commit and machine), so every bench
 * records them the same way. Private to bench/.
 *
 * @module
 */

/** Runs `git <args>` and returns its trimmed stdout, or "" when git is missing or fails. */
export async function git(args: string[]): Promise<string> {
  try {
    const o = await new Deno.Command("git", { args, stdout: "piped", stderr: "null" }).output();
    return new TextDecoder().decode(o.stdout).trim();
  } catch {
    return "";
  }
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
