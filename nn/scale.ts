/**
 * A fixed, not learned, factor on a layer's output: the logit scale of fast CIFAR-10 recipes
 * (a small factor after the last linear layer), which keeps the classifier's outputs and
 * gradients small while the learning rate warms up.
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import * as ops from "../ops/mod.ts";
import { type BackwardOptions, Module } from "./module.ts";

/**
 * `y = x * factor` for a fixed `factor` (PyTorch code writes it as a one-line module, or as
 * `model(x) * factor`). The factor is held in the input's dtype (a power of two is exact in
 * fp16; 0.3 becomes fp16's 0.2998), the product is taken in fp32 and rounded once, as
 * {@linkcode ops.mul} does. Its backward is `dx = dy * factor`.
 *
 * `cifarModel` ends with `Scale(0.125)`: without it, the 2,048 non-negative features of its
 * last pooling layer move every logit together, and peak learning rates of 0.02 and more
 * made the loss blow up in the first epoch of short schedules (docs/recipe.md).
 *
 * @example
 * ```ts
 * import { Device, Scale, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using scale = new Scale(0.125).to(device);
 * using x = Tensor.fromHost(device, new Float16Array([8, -2]), [1, 2]);
 * assert.deepStrictEqual([...await scale.forward(x).toHost()], [1, -0.25]);
 * using dy = Tensor.fromHost(device, new Float16Array([1, 4]), [1, 2]);
 * assert.deepStrictEqual([...await scale.backward(dy)!.toHost()], [0.125, 0.5]);
 * ```
 */
export class Scale extends Module {
  /** The factor. */
  readonly factor: number;
  /** The factor tensors already filled (one per shape and dtype, owned by the workspace). */
  #filled = new WeakSet<Tensor>();
  #factorTensor: Tensor | null = null;

  /**
   * Creates the layer (no parameters).
   *
   * @param factor A finite number.
   * @throws {TypeError} When the factor is not a finite number.
   */
  constructor(factor: number) {
    super();
    if (typeof factor !== "number" || !Number.isFinite(factor)) {
      throw new TypeError(`Cannot create Scale: factor must be a finite number, got ${factor}`);
    }
    this.factor = factor;
  }

  /**
   * Runs the layer.
   *
   * @param x Input, f16 or f32, any shape.
   * @returns `x * factor`, the same dtype and shape.
   */
  forward(x: Tensor): Tensor {
    const shape = [...x.shape];
    const f = this.#factorFor(shape, x);
    const y = this.workspace("y", shape, x.dtype);
    ops.mul(x, f, y);
    this.#factorTensor = this.training ? f : null;
    return y;
  }

  /**
   * Back-propagates the output gradient.
   *
   * @param dy Output gradient.
   * @param options Whether to compute the input gradient.
   * @returns `dy * factor`, or null.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    if (!this.#factorTensor) {
      throw new TypeError("Cannot run Scale.backward: no training forward before it");
    }
    if (options.inputGrad === false) return null;
    const shape = [...dy.shape];
    const f = this.#factorFor(shape, dy);
    const dx = this.workspace("dx", shape, dy.dtype);
    ops.mul(dy, f, dx);
    return dx;
  }

  /** The factor as a tensor of `like`'s shape and dtype, filled once when it is first made. */
  #factorFor(shape: number[], like: Tensor): Tensor {
    const f = this.workspace("factor", shape, like.dtype);
    if (!this.#filled.has(f)) {
      ops.fillInPlace(f, this.factor);
      this.#filled.add(f);
    }
    return f;
  }
}
