// What the raw-memory ops share: the bounds check of a buffer operand, and integer checks
// with a range.

import { DeviceBuffer, HostBuffer } from "../ffi/memory.ts";
import type { Device } from "../ffi/device.ts";
import type { Operand } from "./backend.ts";

/** The largest int32, the bound of the kernels' int32 counts. */
export const I32_MAX = 2 ** 31 - 1;

export function intIn(v: unknown, name: string, min: number, max: number, action: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
    throw new RangeError(
      `Cannot ${action}: ${name} must be an integer in ${min}..${max}, got ${v}`,
    );
  }
  return v;
}

/**
 * The memory `offset` bytes into `mem` for a kernel, after checking that `bytes` bytes from
 * there lie inside it (a buffer) and that it is usable from `device`.
 */
export function region(
  mem: unknown,
  name: string,
  offset: unknown,
  bytes: number,
  device: Device,
  action: string,
): Operand {
  if (mem instanceof DeviceBuffer || mem instanceof HostBuffer) {
    if (mem.device.kind !== device.kind) {
      throw new TypeError(`Cannot ${action}: ${name} is on ${mem.device}, not ${device.kind}`);
    }
    if (mem instanceof DeviceBuffer && mem.device !== device) {
      throw new TypeError(`Cannot ${action}: ${name} is on ${mem.device}, not ${device}`);
    }
    const at = intIn(offset ?? 0, `${name} offset`, 0, Number.MAX_SAFE_INTEGER, action);
    if (at + bytes > mem.bytes) {
      throw new RangeError(
        `Cannot ${action}: ${name} must hold ${bytes} bytes from offset ${at}, ` +
          `got a buffer of ${mem.bytes}`,
      );
    }
    return { memory: mem, offset: at };
  }
  if (offset !== undefined && offset !== 0) {
    throw new TypeError(
      `Cannot ${action}: ${name} offset ${offset} needs a DeviceBuffer or HostBuffer, ` +
        `not a bare pointer`,
    );
  }
  if (mem === null) {
    if (bytes === 0) return null;
    throw new TypeError(`Cannot ${action}: ${name} must be a buffer or pointer, got null`);
  }
  if (typeof mem !== "object") {
    throw new TypeError(
      `Cannot ${action}: ${name} must be a DeviceBuffer, HostBuffer or pointer, got ${mem}`,
    );
  }
  return mem as Deno.PointerObject;
}
