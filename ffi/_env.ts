/**
 * Internal: what both the loading (library.ts) and the building (_build.ts) of a backend
 * library need: the backend names, the settings read from the environment, and the error a
 * failed load or build throws.
 *
 * @module
 */

import { missingPermission, PermissionError } from "../internal/permissions.ts";
import { PinstreamError } from "../internal/errors.ts";

/** A backend: the synchronous CPU reference or CUDA. */
export type Backend = "cpu" | "cuda";

/**
 * Whether "cuda" means the CUDA emulator in this process: `PINSTREAM_CUDA_EMULATOR` is set to
 * `1` (or `true`, `yes`, `on`).
 *
 * @returns true when the cuda backend is built from kernels/emu.
 *
 * @example
 * ```ts
 * import { cudaEmulated } from "./_env.ts";
 * import assert from "node:assert";
 * assert.strictEqual(cudaEmulated(), /^(1|true|yes|on)$/i.test(Deno.env.get("PINSTREAM_CUDA_EMULATOR") ?? ""));
 * ```
 */
export function cudaEmulated(): boolean {
  return /^(1|true|yes|on)$/i.test(envSetting("PINSTREAM_CUDA_EMULATOR") ?? "");
}

/** Why a backend library is not available. */
export type LibraryFailure =
  | "no-compiler"
  | "build-failed"
  | "load-failed"
  | "abi-mismatch"
  | "fetch-failed"
  | "no-permission";

/**
 * A backend library could not be found, built or loaded. `reason` says which step failed;
 * the message lists everything that was tried.
 *
 * @example
 * ```ts
 * import { LibraryError } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const err = new LibraryError("no-compiler", "cuda", "nvcc not found");
 * assert.strictEqual(err.reason, "no-compiler");
 * assert.match(err.message, /^Cannot load the cuda backend: nvcc not found/);
 * ```
 */
export class LibraryError extends PinstreamError {
  /** Which step failed. */
  readonly reason: LibraryFailure;
  /** The backend that was asked for. */
  readonly backend: Backend;

  /**
   * Creates the error; the message reads "Cannot load the <backend> backend: <detail>".
   *
   * @param reason Which step failed.
   * @param backend The backend that was asked for.
   * @param detail What was tried and what to do about it.
   * @param options Standard error options (`cause`).
   */
  constructor(reason: LibraryFailure, backend: Backend, detail: string, options?: ErrorOptions) {
    super("UNSUPPORTED", `load the ${backend} backend`, detail, options);
    this.name = "LibraryError";
    this.reason = reason;
    this.backend = backend;
  }
}

/**
 * Internal: an environment setting, undefined when unset or empty; a denied `--allow-env` is a
 * {@linkcode PermissionError} naming the variable and the flag.
 *
 * @param name The variable.
 * @returns Its value.
 */
export function envSetting(name: string): string | undefined {
  let value: string | undefined;
  try {
    value = Deno.env.get(name);
  } catch (err) {
    if (missingPermission(err) !== undefined) throw new PermissionError(`read ${name}`, err);
    throw err;
  }
  return value === undefined || value === "" ? undefined : value;
}
