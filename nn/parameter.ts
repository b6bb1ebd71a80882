/**
 * Parameters and buffers: the tensors a {@linkcode Module} owns. A {@linkcode Parameter} holds an
 * fp32 master weight, an fp16 compute copy under mixed precision and a gradient; a
 * {@linkcode BufferTensor} holds fp32 state the optimizer never touches (batch-norm running
 * statistics). Both start on the host and are uploaded by `to()`, which takes the precision.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import * as ops from "../ops/mod.ts";
/**
 * A model's precision, chosen by {@linkcode Module.to}: `"fp16"` computes in fp16 with fp32
 * accumulation and fp32 master weights (mixed precision, with loss scaling), `"bf16"` the same
 * in bfloat16 (fp32's range: no loss scaling needed), `"fp32"` computes in fp32.
 */
export type Precision = "fp16" | "bf16" | "fp32";

/** The precisions {@linkcode Module.to} accepts. */
const PRECISIONS: readonly Precision[] = ["fp16", "bf16", "fp32"];

/** The half-precision dtype a precision computes in, or "f32" for "fp32". */
export function computeDtypeOf(precision: Precision): "f16" | "bf16" | "f32" {
  return precision === "fp16" ? "f16" : precision === "bf16" ? "bf16" : "f32";
}

/** Options of {@linkcode Parameter}. */
export interface ParameterOptions {
  /**
   * The dtype the forward reads under mixed precision: "f16" keeps a half-precision copy of
   * the fp32 master weight (the default; bf16 under precision "bf16"), "f32" makes the forward
   * read the master weight itself (biases and batch-norm affine parameters, which the kernels
   * take in fp32). With precision "fp32" every parameter is read as f32.
   */
  computeDtype?: "f16" | "f32";
  /** The gradient's dtype under mixed precision (default: the compute dtype); f32 with "fp32". */
  gradDtype?: "f16" | "f32";
}

/** @internal Checks a precision option and returns it (default "fp16"). */
export function checkPrecision(p: unknown, action: string): Precision {
  if (p === undefined) return "fp16";
  if (!PRECISIONS.includes(p as Precision)) {
    throw new TypeError(
      `Cannot ${action}: precision must be "fp16", "bf16" or "fp32", got ${JSON.stringify(p)}`,
    );
  }
  return p as Precision;
}

/**
 * A trainable tensor: initial values on the host until {@linkcode Parameter.to} uploads them,
 * then an fp32 master weight, an optional fp16 compute copy and a gradient on the device.
 *
 * @example
 * ```ts
 * import { Parameter } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const p = new Parameter(new Float32Array([1, 2, 3]), [3]);
 * assert.deepStrictEqual(p.shape, [3]);
 * assert.strictEqual(p.numel, 3);
 * assert.strictEqual(p.device, null);
 * ```
 */
export class Parameter implements Disposable {
  /** The shape (PyTorch's layout: Linear [out, in], Conv2d [out, in, kh, kw]). */
  readonly shape: number[];
  /** The dtypes given at construction: what mixed precision ("fp16") reads and writes. */
  #mixed: { compute: "f16" | "f32"; grad: "f16" | "f32" };
  #precision: Precision = "fp16";
  #host: Float32Array | null;
  #device: Device | null = null;
  #master: Tensor | null = null;
  #half: Tensor | null = null;
  #grad: Tensor | null = null;

  /**
   * Creates a parameter from its initial values.
   *
   * @param init Initial values (copied), row-major.
   * @param shape The shape; its product must equal `init.length`.
   * @param options Compute and gradient dtypes.
   * @throws {RangeError} When `init.length` does not match the shape.
   */
  constructor(init: Float32Array, shape: number[], options: ParameterOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["computeDtype", "gradDtype"], "create a parameter");
    const numel = shape.reduce((a, b) => a * b, 1);
    if (init.length !== numel) {
      throw new RangeError(
        `Cannot create a parameter: ${init.length} values for shape [${shape}]`,
      );
    }
    this.shape = [...shape];
    this.#host = init.slice();
    const compute = options.computeDtype ?? "f16";
    this.#mixed = { compute, grad: options.gradDtype ?? compute };
  }

  /** The dtype the forward reads (f32 for every parameter of an "fp32" model). */
  get computeDtype(): "f16" | "bf16" | "f32" {
    return this.#precision === "fp32" || this.#mixed.compute === "f32"
      ? "f32"
      : computeDtypeOf(this.#precision);
  }

  /** The gradient's dtype (f32 for every parameter of an "fp32" model). */
  get gradDtype(): "f16" | "bf16" | "f32" {
    return this.#precision === "fp32" || this.#mixed.grad === "f32"
      ? "f32"
      : computeDtypeOf(this.#precision);
  }

  /** Number of elements. */
  get numel(): number {
    return this.shape.reduce((a, b) => a * b, 1);
  }

  /** The device the parameter lives on, or null before {@linkcode Parameter.to}. */
  get device(): Device | null {
    return this.#device;
  }

  #need(what: string): never {
    throw new TypeError(`Cannot use the parameter's ${what}: it is not on a device (call to())`);
  }

  /** The fp32 master weight (the optimizer's). */
  get master(): Tensor {
    return this.#master ?? this.#need("master weight");
  }

  /** The tensor the forward reads: the fp16 copy, or the master weight when computeDtype is f32. */
  get value(): Tensor {
    return this.#half ?? this.#master ?? this.#need("value");
  }

  /** The half-precision compute copy (f16 or bf16), or null when the forward reads the master weight. */
  get half(): Tensor | null {
    return this.#half;
  }

  /** The gradient, written by the owning layer's backward (overwritten, not accumulated). */
  get grad(): Tensor {
    return this.#grad ?? this.#need("gradient");
  }

  /**
   * Uploads the parameter to `device` (a no-op when already there with the same precision).
   *
   * @param device The device.
   * @param precision "fp16" (default: the compute and gradient dtypes given at construction),
   *   "bf16" (the same in bf16) or "fp32" (the forward reads the master weight, the gradient is
   *   f32, no half copy).
   * @returns This parameter.
   * @throws {TypeError} When the parameter already lives on another device, or on this one
   *   with the other precision's dtypes.
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Parameter } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * const p = new Parameter(new Float32Array([0.5, -1]), [2]).to(device);
   * assert.deepStrictEqual([...await p.master.toHost()], [0.5, -1]);
   * assert.deepStrictEqual([...await p.value.toHost()], [0.5, -1]);
   * p.dispose();
   * ```
   */
  to(device: Device, precision: Precision = "fp16"): this {
    const action = "move a parameter";
    precision = checkPrecision(precision, action);
    if (this.#device !== null) {
      if (this.#device !== device) {
        throw new TypeError(`Cannot ${action}: it already lives on another device`);
      }
      if (precision !== this.#precision) {
        throw new TypeError(
          `Cannot ${action}: it is already on ${device} with the other precision ` +
            `(a model's precision is chosen once, by its first to())`,
        );
      }
      return this;
    }
    this.#precision = precision;
    const host = this.#host!;
    this.#master = Tensor.fromHost(device, host, this.shape);
    if (this.computeDtype !== "f32") {
      this.#half = Tensor.empty(device, this.shape, this.computeDtype);
      ops.cast(this.#master, this.#half);
    }
    this.#grad = Tensor.empty(device, this.shape, this.gradDtype);
    this.#grad.buffer.fill(0);
    this.#device = device;
    this.#host = null;
    return this;
  }

  /**
   * Recomputes the fp16 copy from the master weight (after loading weights).
   *
   * @example
   * ```ts
   * import { Parameter } from "@pinstream/pinstream";
   * new Parameter(new Float32Array(1), [1]).syncHalf(); // no-op on the host
   * ```
   */
  syncHalf(): void {
    if (this.#half && this.#master) ops.cast(this.#master, this.#half);
  }

  /**
   * The master weight's values on the host.
   *
   * @returns A copy of the fp32 values.
   * @example
   * ```ts
   * import { Parameter } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const p = new Parameter(new Float32Array([3]), [1]);
   * assert.deepStrictEqual([...await p.read()], [3]);
   * ```
   */
  async read(): Promise<Float32Array> {
    if (this.#master) return (await this.#master.toHost()) as Float32Array;
    return this.#host!.slice();
  }

  /**
   * Overwrites the master weight (and its fp16 copy) with `values`.
   *
   * @param values fp32 values, `numel` of them.
   * @throws {RangeError} When the length does not match.
   * @example
   * ```ts
   * import { Parameter } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const p = new Parameter(new Float32Array(2), [2]);
   * p.write(new Float32Array([1, 2]));
   * assert.deepStrictEqual([...await p.read()], [1, 2]);
   * ```
   */
  write(values: Float32Array): void {
    if (values.length !== this.numel) {
      throw new RangeError(
        `Cannot write a parameter of shape [${this.shape}]: got ${values.length} values`,
      );
    }
    if (this.#master) {
      this.#master.buffer.copyFrom(values);
      this.syncHalf();
    } else {
      this.#host!.set(values);
    }
  }

  /**
   * Frees the device tensors (idempotent).
   *
   * @example
   * ```ts
   * import { Parameter } from "@pinstream/pinstream";
   * const p = new Parameter(new Float32Array(1), [1]);
   * p.dispose();
   * p.dispose();
   * ```
   */
  dispose(): void {
    this.#master?.dispose();
    this.#half?.dispose();
    this.#grad?.dispose();
    this.#master = this.#half = this.#grad = null;
  }

  /**
   * Same as `dispose()`.
   *
   * @example Freed at the end of its scope
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Parameter } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const before = dev.liveObjects().allocations;
   * {
   *   using p = new Parameter(new Float32Array(4), [4]).to(dev);
   *   assert.ok(dev.liveObjects().allocations > before);
   * }
   * assert.strictEqual(dev.liveObjects().allocations, before);
   * ```
   */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * A non-trainable fp32 state tensor (batch-norm running statistics): saved in checkpoints,
 * never touched by the optimizer.
 *
 * @example
 * ```ts
 * import { BufferTensor, Device } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using b = new BufferTensor(new Float32Array([1, 2]), [2]).to(dev);
 * assert.deepStrictEqual([...await b.read()], [1, 2]);
 * ```
 */
export class BufferTensor implements Disposable {
  /** The shape. */
  readonly shape: number[];
  #host: Float32Array | null;
  #tensor: Tensor | null = null;

  /**
   * Creates a buffer from its initial values.
   *
   * @param init Initial values (copied).
   * @param shape The shape.
   */
  constructor(init: Float32Array, shape: number[]) {
    this.shape = [...shape];
    this.#host = init.slice();
  }

  /** The device tensor. */
  get tensor(): Tensor {
    if (!this.#tensor) {
      throw new TypeError("Cannot use the buffer: it is not on a device (call to())");
    }
    return this.#tensor;
  }

  /**
   * Uploads to `device`.
   *
   * @param device The device.
   * @returns This buffer.
   */
  to(device: Device): this {
    if (this.#tensor) return this;
    this.#tensor = Tensor.fromHost(device, this.#host!, this.shape);
    this.#host = null;
    return this;
  }

  /**
   * Reads the values.
   *
   * @returns A copy of the values.
   */
  async read(): Promise<Float32Array> {
    if (this.#tensor) return (await this.#tensor.toHost()) as Float32Array;
    return this.#host!.slice();
  }

  /**
   * Overwrites the values.
   *
   * @param values The new values.
   */
  write(values: Float32Array): void {
    if (this.#tensor) this.#tensor.buffer.copyFrom(values);
    else this.#host!.set(values);
  }

  /** Frees the device tensor (idempotent). */
  dispose(): void {
    this.#tensor?.dispose();
    this.#tensor = null;
  }

  /**
   * Same as `dispose()`.
   *
   * @example Freed at the end of its scope
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { BufferTensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const before = dev.liveObjects().allocations;
   * {
   *   using b = new BufferTensor(new Float32Array([1, 2]), [2]).to(dev);
   *   assert.deepStrictEqual([...await b.read()], [1, 2]);
   * }
   * assert.strictEqual(dev.liveObjects().allocations, before);
   * ```
   */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
