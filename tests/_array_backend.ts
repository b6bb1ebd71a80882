// A kernel backend written in TypeScript over ArrayBuffers: a test double that shows a second
// backend slots in under ops/ (ops/backend.ts) without any change above it. It serves a CPU
// device, whose memory the host addresses, and implements a few entry points: fills (constant
// and arange), matmul, biasAdd, reluForward and cast; the ops it lacks fail in ops/ with
// "not implemented by the array backend".

import { PinstreamError } from "../internal/errors.ts";
import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import type { KernelArgs, KernelBackend, KernelName, Operand } from "../ops/backend.ts";

/** The kernels' dtype codes (PS_NN_F32, PS_NN_F16, PS_FILL_I32). */
const F32 = 0, F16 = 1, I32 = 2;
const BYTES = [4, 2, 4];

/** The bytes of a memory operand, as an ArrayBuffer over the CPU device's memory. */
function bytesOf(op: Operand, bytes: number): ArrayBuffer {
  if (op === null) throw new TypeError("array backend: a NULL operand where memory is needed");
  let ptr: Deno.PointerValue;
  if (op instanceof Tensor) ptr = op.pointer;
  else if ("memory" in op) ptr = op.memory.pointerAt(op.offset, "read an operand");
  else ptr = op as Deno.PointerObject;
  if (bytes === 0) return new ArrayBuffer(0);
  return Deno.UnsafePointerView.getArrayBuffer(ptr!, bytes);
}

/** `count` elements of dtype `code` at `op`. */
function elements(
  op: Operand,
  code: number,
  count: number,
): Float32Array | Float16Array | Int32Array {
  const buf = bytesOf(op, count * BYTES[code]);
  if (code === F32) return new Float32Array(buf);
  if (code === F16) return new Float16Array(buf);
  if (code === I32) return new Int32Array(buf);
  throw new PinstreamError("INVALID_ARGUMENT", "read an operand", `unknown dtype code ${code}`);
}

/** The array backend's kernels: plain loops, fp32 accumulation as the native kernels do. */
export class ArrayBackend implements KernelBackend {
  readonly name = "array";
  /** The entry points called, in order: what a test checks ran here and not natively. */
  readonly calls: KernelName[] = [];

  constructor(device: Device) {
    if (device.kind !== "cpu") {
      throw new TypeError(`array backend: needs host-addressable memory, got ${device}`);
    }
  }

  tensorFill(a: KernelArgs<"tensorFill">, action: string): void {
    this.calls.push("tensorFill");
    if (a.mode !== 0 && a.mode !== 1) {
      throw new PinstreamError(
        "UNSUPPORTED",
        action,
        `fill mode ${a.mode} is not implemented by the array backend`,
      );
    }
    const count = Number(a.count), offset = Number(a.offset);
    const out = elements(a.dst, a.dtype, count);
    for (let i = 0; i < count; i++) {
      const v = a.mode === 0 ? a.a : a.a + (offset + i) * a.b;
      out[i] = a.dtype === I32 ? Math.trunc(v) : v;
    }
  }

  matmul(a: KernelArgs<"matmul">): void {
    this.calls.push("matmul");
    const m = Number(a.m), n = Number(a.n), k = Number(a.k);
    const A = elements(a.a, a.dtype, m * k), B = elements(a.b, a.dtype, k * n);
    const C = elements(a.c, a.c_dtype, m * n);
    for (let i = 0; i < m; i++) {
      for (let j = 0; j < n; j++) {
        let s = a.accumulate ? C[i * n + j] : 0;
        for (let p = 0; p < k; p++) {
          const x = a.trans_a ? A[p * m + i] : A[i * k + p];
          const y = a.trans_b ? B[j * k + p] : B[p * n + j];
          s = Math.fround(s + Math.fround(x * y));
        }
        C[i * n + j] = s;
      }
    }
  }

  biasAdd(a: KernelArgs<"biasAdd">): void {
    this.calls.push("biasAdd");
    const n = Number(a.n), c = Number(a.c), hw = Number(a.hw);
    const y = elements(a.y, a.dtype, n * c * hw), bias = elements(a.bias, a.bias_dtype, c);
    for (let i = 0; i < n * c * hw; i++) {
      y[i] = Math.fround(y[i] + bias[Math.floor(i / hw) % c]);
    }
  }

  reluForward(a: KernelArgs<"reluForward">): void {
    this.calls.push("reluForward");
    const count = Number(a.count);
    const x = elements(a.x, a.dtype, count), y = elements(a.y, a.dtype, count);
    for (let i = 0; i < count; i++) y[i] = x[i] > 0 ? x[i] : 0;
  }

  cast(a: KernelArgs<"cast">): void {
    this.calls.push("cast");
    const count = Number(a.count);
    const src = elements(a.src, a.src_dtype, count), dst = elements(a.dst, a.dst_dtype, count);
    dst.set(src);
  }
}
