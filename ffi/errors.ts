/**
 * The one error class for backend failures, and `unwrap`, which turns a status returned by a
 * pinstream C function into a thrown {@linkcode PinstreamError}.
 *
 * @module
 */

import type { Library } from "./symbols.ts";

/** A failure status name: `PS_ERR_<code>` in kernels/pinstream.h. */
export type PinstreamErrorCode =
  | "INVALID_ARGUMENT"
  | "NO_DRIVER"
  | "NO_DEVICE"
  | "INVALID_DEVICE"
  | "OUT_OF_MEMORY"
  | "NOT_READY"
  | "BACKEND"
  | "UNSUPPORTED";

/** Names of the status codes of kernels/pinstream.h (`PS_ERR_<name>`), by value. */
export const STATUS_NAMES: readonly ("OK" | PinstreamErrorCode)[] = [
  "OK",
  "INVALID_ARGUMENT",
  "NO_DRIVER",
  "NO_DEVICE",
  "INVALID_DEVICE",
  "OUT_OF_MEMORY",
  "NOT_READY",
  "BACKEND",
  "UNSUPPORTED",
];

/** Status values of kernels/pinstream.h, by name. */
export const Status = {
  OK: 0,
  INVALID_ARGUMENT: 1,
  NO_DRIVER: 2,
  NO_DEVICE: 3,
  INVALID_DEVICE: 4,
  OUT_OF_MEMORY: 5,
  NOT_READY: 6,
  BACKEND: 7,
  UNSUPPORTED: 8,
} as const;

/**
 * A failure reported by a backend library (or by finding/building one): `code` names the
 * status (`"NO_DRIVER"`, `"OUT_OF_MEMORY"`, ...), `status` is its number, and the message
 * reads "Cannot <action>: <the backend's message>", the backend's message naming the failing
 * expression, file and line.
 *
 * @example Catching a specific failure
 * ```ts
 * import { PinstreamError } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const err = new PinstreamError("NO_DEVICE", "open cuda device 0", "no CUDA device");
 * assert.strictEqual(err.code, "NO_DEVICE");
 * assert.strictEqual(err.status, 3);
 * assert.strictEqual(err.name, "PinstreamError");
 * assert.strictEqual(err.message, "Cannot open cuda device 0: no CUDA device");
 * ```
 */
export class PinstreamError extends Error {
  /** The status name, `PS_ERR_<code>` in kernels/pinstream.h. */
  readonly code: PinstreamErrorCode;
  /** The numeric status returned by the C function. */
  readonly status: number;
  /** The backend's own message, without the "Cannot <action>: " prefix. */
  readonly detail: string;

  /**
   * Creates the error; the message reads "Cannot <action>: <detail>".
   *
   * @param code The status name.
   * @param action What was being done, completing "Cannot ...".
   * @param detail The backend's message.
   * @param options Standard error options (`cause`).
   */
  constructor(code: PinstreamErrorCode, action: string, detail: string, options?: ErrorOptions) {
    super(`Cannot ${action}: ${detail}`, options);
    this.name = "PinstreamError";
    this.code = code;
    this.status = Status[code];
    this.detail = detail;
  }
}

/** The status name of a numeric status (`"BACKEND"` for values the table does not know). */
export function statusName(status: number): PinstreamErrorCode {
  const name = STATUS_NAMES[status];
  return name === undefined || name === "OK" ? "BACKEND" : name;
}

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
