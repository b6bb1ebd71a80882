/**
 * The typed ops: one wrapper per kernel of kernels/pinstream.h, split by concept as
 * kernels/cpu/ is (gemm, conv, norm, elementwise, loss, optim, image, gather, fill). Each
 * checks dtypes, shapes and devices (TypeError / RangeError naming the offending value) and
 * queues its kernel through the device's backend (ops/backend.ts): the dlopen'd library's
 * {@linkcode NativeBackend} unless {@linkcode useBackend} put another in its place.
 *
 * Every op takes at most two tensors positionally (the operands of `matmul`; otherwise the
 * input and the output, or the incoming and the outgoing gradient, of the data flow) and
 * names the rest in its options object, where a required tensor is a required field: a
 * call with same-typed tensors in the wrong places does not type-check.
 *
 * On the CPU backend the kernels run synchronously on the calling thread plus one helper
 * thread per other CPU (`PINSTREAM_NUM_THREADS`, else `OMP_NUM_THREADS`, caps the total),
 * and every result is bit-for-bit reproducible from run to run on both backends, except the
 * CUDA loss sum (atomics) and max-pool gradients where pooling windows overlap.
 *
 * @module
 */

export * from "./backend.ts";
export * from "./gemm.ts";
export * from "./conv.ts";
export * from "./norm.ts";
export * from "./elementwise.ts";
export * from "./loss.ts";
export * from "./optim.ts";
export * from "./tensor_list.ts";
export * from "./image.ts";
export * from "./gather.ts";
export * from "./fill.ts";
export * from "./combine.ts";
