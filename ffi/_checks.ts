/**
 * Internal: argument checks shared by the ffi wrappers.
 *
 * @module
 */

/** Throws TypeError/RangeError unless `value` is a safe non-negative integer. */
export function checkCount(value: unknown, what: string, action: string): number {
  if (typeof value !== "number") {
    throw new TypeError(`Cannot ${action}: ${what} must be a number, got ${describe(value)}`);
  }
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(
      `Cannot ${action}: ${what} must be a non-negative integer, got ${value}`,
    );
  }
  return value;
}

/** A short description of a value for error messages. */
export function describe(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "object") return value.constructor?.name ?? "object";
  if (typeof value === "string") return JSON.stringify(value);
  return `${typeof value} ${String(value)}`;
}

/** A pointer plus an offset (the offset of a null pointer must be 0). */
export function offsetPointer(ptr: Deno.PointerValue, offset: number): Deno.PointerValue {
  if (offset === 0 || ptr === null) return ptr;
  return Deno.UnsafePointer.offset(ptr, offset);
}
