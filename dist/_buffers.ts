/**
 * The memory a collective reads and writes, resolved to an address, an element count, a dtype
 * and a typed view (for fp16 widening and averaging).
 *
 * @module
 */

import { Tensor } from "../ffi/tensor.ts";
import type { CollectiveBuffer } from "./process_group.ts";

/** A buffer resolved for a collective. */
export interface Resolved {
  ptr: bigint;
  count: number;
  dtype: "f32" | "f16" | "i32";
  /** A typed view of the memory, for fp16 conversion and averaging. */
  view: Float32Array | Float16Array | Int32Array;
}

const VIEWS = { f32: Float32Array, f16: Float16Array, i32: Int32Array } as const;

export function resolve(buf: CollectiveBuffer, action: string, name: string): Resolved {
  if (buf instanceof Tensor) {
    if (buf.device.kind !== "cpu") {
      throw new TypeError(
        `Cannot ${action}: ${name} is on ${buf.device}; the mpi backend reduces host memory ` +
          `and cpu tensors`,
      );
    }
    if (buf.dtype !== "f32" && buf.dtype !== "f16" && buf.dtype !== "i32") {
      throw new TypeError(`Cannot ${action}: ${name} has dtype ${buf.dtype}; f32, f16 or i32`);
    }
    const count = buf.numel;
    const p = buf.pointer;
    const bytes = count * (buf.dtype === "f16" ? 2 : 4);
    const view = count === 0
      ? new VIEWS[buf.dtype](0)
      : new VIEWS[buf.dtype](Deno.UnsafePointerView.getArrayBuffer(p!, bytes));
    return { ptr: Deno.UnsafePointer.value(p), count, dtype: buf.dtype, view };
  }
  const dtype = buf instanceof Float32Array
    ? "f32"
    : buf instanceof Float16Array
    ? "f16"
    : buf instanceof Int32Array
    ? "i32"
    : null;
  if (dtype === null) {
    throw new TypeError(
      `Cannot ${action}: ${name} must be a Float32Array, Float16Array, Int32Array or a cpu ` +
        `Tensor, got ${Object.prototype.toString.call(buf)}`,
    );
  }
  const ptr = buf.length === 0 ? 0n : Deno.UnsafePointer.value(Deno.UnsafePointer.of(buf));
  return { ptr, count: buf.length, dtype, view: buf };
}

export function addr(a: Float32Array | Int32Array): bigint {
  return a.length === 0 ? 0n : Deno.UnsafePointer.value(Deno.UnsafePointer.of(a));
}
