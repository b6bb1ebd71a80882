/**
 * The lists that the multi-tensor kernels take ({@linkcode multiSgdStep},
 * {@linkcode multiUnscaleAndCheck}, {@linkcode multiCopyIf} in nn/ops.ts): the pointers and sizes
 * of many tensors in one device buffer, so one launch covers every parameter of a model.
 *
 * A list is built from its entries on every step (cheap host work), and uploaded only when they
 * differ from what the device holds: in a training loop the pointers never change, so the upload
 * happens once and a step queues no copy for it.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";

/** One parameter of {@linkcode TensorList.setSgd}. */
export interface SgdEntry {
  /** f32 master weights. */
  param: Tensor;
  /** f16, bf16 or f32 gradient, as many elements. */
  grad: Tensor;
  /** f32 momentum buffer, as many elements (null: none). */
  momentumBuf: Tensor | null;
  /** f16 or bf16 copy written after the update (null: none). */
  paramHalf: Tensor | null;
}

/** One copy of {@linkcode TensorList.setCopies}: `count` f32 values from src into dst. */
export interface CopyEntry {
  /** f32 destination. */
  dst: Tensor;
  /** Element offset in dst (default 0). */
  dstOffset?: number;
  /** f32 source. */
  src: Tensor;
  /** Element offset in src (default 0). */
  srcOffset?: number;
  /** f32 elements (default: all of src after srcOffset). */
  count?: number;
}

/** The kinds of lists: kernels/pinstream.h PS_MT_SGD_FIELDS and PS_MT_COPY_FIELDS. */
export type TensorListKind = "sgd" | "copy";

const FIELDS: Record<TensorListKind, number> = { sgd: 7, copy: 3 };
/** PS_NN_F32, PS_NN_F16 and PS_NN_BF16. */
const DTYPE_CODE = { f32: 0n, f16: 1n, bf16: 3n } as const;

function address(t: Tensor, offset = 0, bytesPer = 4): bigint {
  return BigInt(Deno.UnsafePointer.value(t.pointer)) + BigInt(offset * bytesPer);
}

/**
 * A device-resident list of tensors for the multi-tensor kernels. Dispose it (or let its owner,
 * the optimizer or the module, do so) to free the device buffer.
 *
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { TensorList } from "./tensor_list.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float32Array([1, 2]));
 * using b = Tensor.empty(dev, [2], "f32");
 * using list = new TensorList(dev, "copy");
 * assert.strictEqual(list.setCopies([{ dst: b, src: a }]), true);
 * assert.strictEqual(list.setCopies([{ dst: b, src: a }]), false); // unchanged: no upload
 * assert.strictEqual(list.length, 1);
 * ```
 */
export class TensorList implements Disposable {
  /** The device the tensors live on. */
  readonly device: Device;
  /** What the entries hold. */
  readonly kind: TensorListKind;
  #host: BigInt64Array = new BigInt64Array(0);
  #dev: Tensor | null = null;
  #length = 0;
  #maxCount = 0;
  #disposed = false;

  /**
   * Creates an empty list.
   *
   * @param device The device of every tensor in the list.
   * @param kind "sgd" (parameters) or "copy" (copies).
   */
  constructor(device: Device, kind: TensorListKind) {
    if (kind !== "sgd" && kind !== "copy") {
      throw new TypeError(`Cannot create a TensorList: kind must be "sgd" or "copy", got ${kind}`);
    }
    this.device = device;
    this.kind = kind;
  }

  /** Entries. */
  get length(): number {
    return this.#length;
  }

  /** The largest entry's element count. */
  get maxCount(): number {
    return this.#maxCount;
  }

  /** The device buffer's address (null when empty). */
  get pointer(): Deno.PointerValue {
    this.#check();
    return this.#dev?.pointer ?? null;
  }

  #check(): void {
    if (this.#disposed) throw new TypeError("Cannot use the TensorList: it is disposed");
  }

  #tensor(t: Tensor, name: string, dtypes: readonly string[], action: string): void {
    if (t.device !== this.device) {
      throw new TypeError(`Cannot ${action}: ${name} is on ${t.device}, not ${this.device}`);
    }
    if (!dtypes.includes(t.dtype)) {
      throw new TypeError(
        `Cannot ${action}: ${name} must be ${dtypes.join(" or ")}, got ${t.dtype}`,
      );
    }
  }

  /**
   * Sets the parameters of an optimizer step.
   *
   * @param entries One per parameter.
   * @returns Whether the list changed (and was uploaded).
   * @throws {TypeError} On a wrong dtype or device.
   * @throws {RangeError} When sizes differ.
   */
  setSgd(entries: readonly SgdEntry[]): boolean {
    this.#check();
    const action = "set a TensorList";
    if (this.kind !== "sgd") throw new TypeError(`Cannot ${action}: it is a ${this.kind} list`);
    const rows = new BigInt64Array(entries.length * FIELDS.sgd);
    let max = 0;
    entries.forEach((e, i) => {
      this.#tensor(e.param, `entry ${i} param`, ["f32"], action);
      this.#tensor(e.grad, `entry ${i} grad`, ["f16", "bf16", "f32"], action);
      const n = e.param.numel;
      for (
        const [t, name, dts] of [[e.grad, "grad", []], [e.momentumBuf, "momentumBuf", ["f32"]], [
          e.paramHalf,
          "paramHalf",
          ["f16", "bf16"],
        ]] as const
      ) {
        if (!t) continue;
        if (dts.length > 0) this.#tensor(t, `entry ${i} ${name}`, dts, action);
        if (t.numel !== n) {
          throw new RangeError(
            `Cannot ${action}: entry ${i} ${name} has ${t.numel} elements, param ${n}`,
          );
        }
      }
      const o = i * FIELDS.sgd;
      rows[o] = address(e.param);
      rows[o + 1] = address(e.grad);
      rows[o + 2] = e.momentumBuf ? address(e.momentumBuf) : 0n;
      rows[o + 3] = e.paramHalf ? address(e.paramHalf) : 0n;
      rows[o + 4] = BigInt(n);
      rows[o + 5] = DTYPE_CODE[e.grad.dtype as "f16" | "bf16" | "f32"];
      rows[o + 6] = e.paramHalf ? DTYPE_CODE[e.paramHalf.dtype as "f16" | "bf16"] : 0n;
      max = Math.max(max, n);
    });
    return this.#set(rows, entries.length, max);
  }

  /**
   * Sets the copies of a multi-tensor copy.
   *
   * @param entries One per copy.
   * @returns Whether the list changed (and was uploaded).
   * @throws {TypeError} On a wrong dtype or device.
   * @throws {RangeError} When a range lies outside its tensor.
   */
  setCopies(entries: readonly CopyEntry[]): boolean {
    this.#check();
    const action = "set a TensorList";
    if (this.kind !== "copy") throw new TypeError(`Cannot ${action}: it is a ${this.kind} list`);
    const rows = new BigInt64Array(entries.length * FIELDS.copy);
    let max = 0;
    entries.forEach((e, i) => {
      this.#tensor(e.dst, `entry ${i} dst`, ["f32"], action);
      this.#tensor(e.src, `entry ${i} src`, ["f32"], action);
      const so = e.srcOffset ?? 0, dso = e.dstOffset ?? 0;
      const n = e.count ?? e.src.numel - so;
      for (const v of [so, dso, n]) {
        if (!Number.isInteger(v) || v < 0) {
          throw new RangeError(`Cannot ${action}: entry ${i} has a bad offset or count ${v}`);
        }
      }
      if (so + n > e.src.numel || dso + n > e.dst.numel) {
        throw new RangeError(
          `Cannot ${action}: entry ${i} copies ${n} values from ${so} of ${e.src.numel} to ` +
            `${dso} of ${e.dst.numel}`,
        );
      }
      const o = i * FIELDS.copy;
      rows[o] = address(e.dst, dso);
      rows[o + 1] = address(e.src, so);
      rows[o + 2] = BigInt(n);
      max = Math.max(max, n);
    });
    return this.#set(rows, entries.length, max);
  }

  #set(rows: BigInt64Array, length: number, max: number): boolean {
    const same = rows.length === this.#host.length && rows.every((v, i) => v === this.#host[i]);
    if (same) return false;
    if (this.#dev && this.#dev.numel !== rows.length * 2) {
      this.#dev.dispose();
      this.#dev = null;
    }
    if (rows.length > 0) {
      // int64 entries as pairs of i32 (the tensor dtypes have no 64-bit integer).
      this.#dev ??= Tensor.empty(this.device, [rows.length * 2], "i32");
      this.#dev.buffer.copyFrom(new Int32Array(rows.buffer));
    }
    this.#host = rows;
    this.#length = length;
    this.#maxCount = max;
    return true;
  }

  /** Frees the device buffer (idempotent). */
  dispose(): void {
    this.#dev?.dispose();
    this.#dev = null;
    this.#disposed = true;
  }

  /** Same as {@linkcode TensorList.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
