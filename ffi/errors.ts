/**
 * `unwrap`, which turns a status returned by a pinstream C function into a thrown
 * {@linkcode PinstreamError} (the class and its codes live in internal/errors.ts).
 *
 * @module
 */

import type { Library } from "./symbols.ts";
import { PinstreamError, statusName } from "../internal/errors.ts";

export {
  PinstreamError,
  type PinstreamErrorCode,
  Status,
  STATUS_NAMES,
  statusName,
} from "../internal/errors.ts";

/** Reads the calling thread's last error message of `lib`. */
export function lastError(lib: Library): string {
  const ptr = lib.symbols.ps_last_error();
  return ptr === null ? "" : new Deno.UnsafePointerView(ptr).getCString();
}

/**
 * Throws a {@linkcode PinstreamError} when `status` is not 0, with the library's thread-local
 * message (or `message`, for [wait] calls that received theirs in a buffer).
 *
 * @param lib The library that returned `status`.
 * @param status The returned status.
 * @param action What was being done, completing "Cannot ...".
 * @param message The message to use instead of `ps_last_error()`: a [wait] call's buffer.
 * @throws {PinstreamError} When `status` is not 0.
 *
 * @example Turning a status into an error
 * ```ts
 * import { PinstreamError, unwrap } from "./errors.ts";
 * import type { Library } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const lib = {} as Library; // not read: a message is given
 * unwrap(lib, 0, "copy"); // 0 is success
 * assert.throws(() => unwrap(lib, 5, "allocate 1 GiB", "out of memory"), PinstreamError);
 * ```
 */
export function unwrap(
  lib: Library,
  status: number,
  action: string,
  message?: Uint8Array | string,
): void {
  if (status === 0) return;
  let detail: string;
  if (typeof message === "string") detail = message;
  else if (message !== undefined) detail = cString(message);
  else detail = lastError(lib);
  throw new PinstreamError(statusName(status), action, detail || `status ${status}`);
}

/** Decodes a NUL-terminated C string held in `bytes`. */
export function cString(bytes: Uint8Array): string {
  const end = bytes.indexOf(0);
  return new TextDecoder().decode(end < 0 ? bytes : bytes.subarray(0, end));
}
