/**
 * Internal: what a Deno permission error means for pinstream, in one line naming the flag to
 * add and why pinstream needs it, instead of a raw `NotCapable` or a misleading "install the
 * driver" / "no compiler found".
 *
 * @module
 */

import { PinstreamError } from "./errors.ts";

/** The permissions pinstream uses, and what for. */
export const PERMISSION_USES: Readonly<Record<string, string>> = {
  ffi: "pinstream loads its native library with Deno.dlopen",
  run:
    "pinstream asks the C/CUDA compiler for its version (the build cache key) and builds the native library on first use",
  env:
    "pinstream reads its PINSTREAM_* settings, HOME / XDG_CACHE_HOME for the build cache, and CC / NVCC / CUDA_HOME",
  read: "pinstream reads its kernel sources, the build cache and data sets",
  write: "pinstream writes the native library into its build cache (and checkpoints where asked)",
  net: "pinstream downloads data sets (CIFAR-10) and, imported from JSR, its kernel sources",
  sys: "the benchmarks record the machine's load and memory",
};

/** A permission Deno denied, as {@linkcode missingPermission} reads it. */
interface Missing {
  /** The permission: "ffi", "run", "env", ..., or "unknown". */
  name: string;
  /** What it was denied for (`"\"HOME\""`), or "". */
  target: string;
  /**
   * The environment variable that made Deno refuse to start a program although `--allow-run`
   * lists it: with `LD_LIBRARY_PATH` or `LD_PRELOAD` set, only an unlisted `--allow-run` lets a
   * program start (a CUDA machine often sets `LD_LIBRARY_PATH`).
   */
  variable?: string;
}

/**
 * The permission a Deno error says is missing (`NotCapable`, or `PermissionDenied` from a
 * prompt the user declined), or undefined for any other error.
 *
 * @param err The error.
 * @returns `{ name: "ffi", target: "\"/path/lib.so\"" }` or undefined.
 *
 * @example
 * ```ts
 * import { missingPermission } from "./permissions.ts";
 * import assert from "node:assert";
 * const err = new Deno.errors.NotCapable('Requires env access to "HOME", run again with the --allow-env flag');
 * assert.deepStrictEqual(missingPermission(err), { name: "env", target: '"HOME"' });
 * const ld = new Deno.errors.NotCapable("Requires --allow-run permissions to spawn subprocess with LD_LIBRARY_PATH environment variable. Alternatively, spawn with the environment variable unset.");
 * assert.deepStrictEqual(missingPermission(ld), { name: "run", target: "", variable: "LD_LIBRARY_PATH" });
 * assert.strictEqual(missingPermission(new Error("other")), undefined);
 * ```
 */
export function missingPermission(err: unknown): Missing | undefined {
  if (err instanceof PermissionError) return missingPermission(err.cause);
  if (!(err instanceof Deno.errors.NotCapable || err instanceof Deno.errors.PermissionDenied)) {
    return undefined;
  }
  const m = /Requires (\w+) access(?: to (.+?))?, (?:run again|specify)/.exec(err.message);
  if (m !== null) return { name: m[1], target: m[2] ?? "" };
  // "Requires --allow-run permissions to spawn subprocess with LD_LIBRARY_PATH environment
  // variable": a listed --allow-run does not cover a child that inherits LD_* variables.
  const flag = /Requires --allow-(\w+) permissions?\b(?:.*? with (\w+) environment variable)?/
    .exec(err.message);
  if (flag === null) return { name: "unknown", target: "" };
  return flag[2] === undefined
    ? { name: flag[1], target: "" }
    : { name: flag[1], target: "", variable: flag[2] };
}

/**
 * One line for a missing permission: "Deno denied ffi access to "x": run with --allow-ffi
 * (pinstream loads its native library with Deno.dlopen)".
 *
 * @param err The error.
 * @returns The line, or undefined when `err` is not a permission error.
 *
 * @example
 * ```ts
 * import { permissionMessage } from "./permissions.ts";
 * import assert from "node:assert";
 * const err = new Deno.errors.NotCapable('Requires run access to "cc", run again with the --allow-run flag');
 * assert.match(permissionMessage(err)!, /^Deno denied run access to "cc": run with --allow-run \(pinstream asks/);
 * ```
 */
export function permissionMessage(err: unknown): string | undefined {
  if (err instanceof PermissionError) return err.detail;
  const p = missingPermission(err);
  if (p === undefined) return undefined;
  if (p.name === "unknown") return `Deno denied a permission: ${(err as Error).message}`;
  const why = PERMISSION_USES[p.name];
  if (p.variable !== undefined) {
    return `Deno denied ${p.name} access to a program started while ${p.variable} is set: run with ` +
      `--allow-${p.name} without a list of programs, or unset ${p.variable}` +
      (why ? ` (${why})` : "");
  }
  return `Deno denied ${p.name} access${
    p.target ? ` to ${p.target}` : ""
  }: run with --allow-${p.name}` +
    (why ? ` (${why})` : "");
}

/**
 * A permission Deno denied, reported as what pinstream was doing, the flag to add and why:
 * "Cannot read PINSTREAM_LIB_CPU: Deno denied env access to "PINSTREAM_LIB_CPU": run with
 * --allow-env (...)". A {@linkcode PinstreamError} with code `UNSUPPORTED`.
 *
 * @example
 * ```ts
 * import { PermissionError } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const err = new PermissionError("read HOME", new Deno.errors.NotCapable('Requires env access to "HOME", run again with the --allow-env flag'));
 * assert.strictEqual(err.permission, "env");
 * assert.match(err.message, /^Cannot read HOME: Deno denied env access to "HOME": run with --allow-env/);
 * ```
 */
export class PermissionError extends PinstreamError {
  /** The permission to grant: "ffi", "run", "env", "read", "write", "net", ... */
  readonly permission: string;

  /**
   * Creates the error from Deno's permission error.
   *
   * @param action What was being done, completing "Cannot ...".
   * @param cause Deno's permission error.
   */
  constructor(action: string, cause: unknown) {
    super("UNSUPPORTED", action, permissionMessage(cause) ?? String(cause), { cause });
    this.name = "PermissionError";
    this.permission = missingPermission(cause)?.name ?? "unknown";
  }
}
