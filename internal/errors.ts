/**
 * The one error class for backend failures, {@linkcode PinstreamError}, and its status codes:
 * the names and numbers of kernels/pinstream.h's `PS_ERR_*`. Pure TypeScript, so every floor
 * (the loader included) can throw and test for it without the FFI layer.
 *
 * @module
 */

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
