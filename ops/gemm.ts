/**
 * Matrix products over the `ps_nn_matmul` kernel: f16 or f32 operands, fp32 accumulation.
 *
 * Each op checks dtypes, shapes and devices (TypeError / RangeError naming the offending
 * value) and then queues the kernel on `options.stream` (default: the device's default
 * stream) through the device's backend (ops/backend.ts). Nothing here waits for the device or
 * reads device memory: results are read with `Tensor.toHost()`.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `matmul(a, b, {out, transA, transB, accumulate})` | a, b f16 or f32 2-D; out f16/f32 [m, n] | out = op(a) @ op(b) (+ out) |
 * | `matmul(a, b, {out, transA, transB, bias, relu})` | bias f16/f32 [n] | out = relu?(op(a) @ op(b) + bias), one call: the bits of `matmul`, `biasAdd` and `reluForward` |
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import { backendOf, type OpOptions } from "./backend.ts";
import { biasAdd } from "./norm.ts";
import { reluForward } from "./elementwise.ts";
import { ACT, activations, code, launch, queue, rank, shape, tensor } from "./_launch.ts";

/** Output and options of {@linkcode matmul}. */
export interface MatmulOptions extends OpOptions {
  /** f16 or f32 [m, n], written (added to with `accumulate`). */
  out: Tensor;
  /** Use `a` transposed (a is [k, m]). */
  transA?: boolean;
  /** Use `b` transposed (b is [n, k]). */
  transB?: boolean;
  /** Add the product to `out` instead of overwriting it. */
  accumulate?: boolean;
  /**
   * f16 or f32 [n], added to every row of the product in the same call (a Linear layer's
   * bias; default none). The bits are those of `matmul` followed by `biasAdd`.
   */
  bias?: Tensor | null;
  /** Apply ReLU after the bias, in the same call (needs `bias`; the bits of `reluForward`). */
  relu?: boolean;
}

/**
 * Matrix product `out = op(a) @ op(b)` (`+ out` when accumulating): f16 or f32 inputs, fp32
 * accumulation, fp16 or fp32 output.
 *
 * @param a f16 or f32 [m, k] ([k, m] with `transA`).
 * @param b f16 or f32 [k, n] ([n, k] with `transB`).
 * @param options out (f16 or f32 [m, n]); transA, transB, accumulate or bias and relu, stream.
 * @throws {TypeError} On a wrong dtype or tensors on different devices.
 * @throws {RangeError} When the shapes do not agree, or `bias` comes with `accumulate`, or
 *   `relu` without `bias`.
 * @example A 2x3 by 3x2 product
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Tensor } from "@pinstream/pinstream";
 * import { matmul } from "./gemm.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float16Array([1, 2, 3, 4, 5, 6]), [2, 3]);
 * using b = Tensor.fromHost(dev, new Float16Array([1, 0, 0, 1, 1, 1]), [3, 2]);
 * using c = Tensor.empty(dev, [2, 2], "f32");
 * matmul(a, b, { out: c });
 * assert.deepStrictEqual([...await c.toHost()], [4, 5, 10, 11]);
 * using bias = Tensor.fromHost(dev, new Float32Array([-6, 0]));
 * matmul(a, b, { out: c, bias, relu: true }); // a Linear layer with its ReLU, in one call
 * assert.deepStrictEqual([...await c.toHost()], [0, 5, 4, 11]);
 * ```
 */
export function matmul(a: Tensor, b: Tensor, options: MatmulOptions): void {
  const action = "run matmul";
  const out = options?.out;
  const dt = activations(action, [a, "a"], [b, "b"]);
  tensor(out, "out", ACT, action);
  rank(a, "a", [2], action);
  rank(b, "b", [2], action);
  const [m, k] = options.transA ? [a.shape[1], a.shape[0]] : [a.shape[0], a.shape[1]];
  const [k2, n] = options.transB ? [b.shape[1], b.shape[0]] : [b.shape[0], b.shape[1]];
  if (k !== k2) {
    throw new RangeError(
      `Cannot ${action}: inner dimensions differ (a [${a.shape}], b [${b.shape}], ` +
        `transA=${!!options.transA}, transB=${!!options.transB})`,
    );
  }
  shape(out, "out", [m, n], action);
  const bias = options.bias ?? null;
  if (bias !== null) {
    tensor(bias, "bias", ACT, action);
    shape(bias, "bias", [n], action);
    if (options.accumulate) {
      throw new RangeError(`Cannot ${action}: accumulate with a bias (add the bias once)`);
    }
  } else if (options.relu) {
    throw new RangeError(`Cannot ${action}: relu needs a bias (else use reluForward)`);
  }
  using launched = launch(action, options, a, b, out, bias);
  const { device, stream } = launched;
  if (bias !== null && backendOf(device).matmulBiasAct === undefined) {
    // A backend without the fused entry (a test or custom one) gets the three calls whose
    // bits the fused one has.
    matmul(a, b, { out, transA: options.transA, transB: options.transB, stream: options.stream });
    biasAdd(out, bias, { stream: options.stream });
    if (options.relu) reluForward(out, out, { stream: options.stream });
    return;
  }
  if (bias !== null) {
    queue(device, "matmulBiasAct", {
      a,
      b,
      dtype: dt,
      c: out,
      c_dtype: code(out),
      m,
      n,
      k,
      trans_a: options.transA ? 1 : 0,
      trans_b: options.transB ? 1 : 0,
      bias,
      bias_dtype: code(bias),
      act: options.relu ? 1 : 0,
      stream,
    }, `${action} [${m}x${k}]x[${k}x${n}] + bias`);
    return;
  }
  queue(device, "matmul", {
    a,
    b,
    dtype: dt,
    c: out,
    c_dtype: code(out),
    m,
    n,
    k,
    trans_a: options.transA ? 1 : 0,
    trans_b: options.transB ? 1 : 0,
    accumulate: options.accumulate ? 1 : 0,
    stream,
  }, `${action} [${m}x${k}]x[${k}x${n}]`);
}
