/*
 * nn.cuh — what the CUDA backend's nn kernel files (gemm.cu, conv.cu, norm.cu, ops.cu) share,
 * as kernels/cpu/nn.h does for their CPU twins: the activation element conversions, the grid
 * size of grid-stride kernels, the dispatch on the activation dtype and the argument checks.
 *
 * Every kernel takes its activations as fp16 (mixed precision) or fp32 (the fp32 path): the
 * element kernels are templates on the type, and the GEMM (gemm.cuh) has a tensor-core form for
 * fp16 and a CUDA-core form for fp32. tests/nn_kernels_test.ts holds both backends to the same
 * float64 references.
 *
 * Internal to each includer (an anonymous namespace): every translation unit instantiates its
 * own templates.
 */
#ifndef PINSTREAM_CUDA_NN_CUH
#define PINSTREAM_CUDA_NN_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"

/* Unrolls the loop that follows (nvcc; the emulator's host compiler decides for itself). */
#if defined(__CUDACC__)
#define PS_UNROLL _Pragma("unroll")
#else
#define PS_UNROLL
#endif

namespace {

/* Activation elements (__half or float) to and from fp32; fp16 rounds to nearest even. */
__device__ inline float to_f32(__half v) { return __half2float(v); }
__device__ inline float to_f32(float v) { return v; }
template <class T>
__device__ inline T from_f32(float v);
template <>
__device__ inline __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline float from_f32<float>(float v) {
  return v;
}

/* Blocks of a grid-stride kernel over n elements, capped (the kernels loop past the cap). */
inline int blocks_for(int64_t n, int block) {
  int64_t g = (n + block - 1) / block;
  return (int)(g < 65535 * 16 ? (g > 0 ? g : 1) : 65535 * 16);
}

/* Runs the statements with T the activation type of dtype (PS_NN_F16: __half, PS_NN_F32: float);
 * the caller has checked dtype. */
#define WITH_ACT(dtype, ...)    \
  do {                          \
    if ((dtype) == PS_NN_F16) { \
      using T = __half;         \
      __VA_ARGS__;              \
    } else {                    \
      using T = float;          \
      __VA_ARGS__;              \
    }                           \
  } while (0)

#define NULL_CHECK(...)                                                                          \
  do {                                                                                           \
    const void *ps_ptrs_[] = {__VA_ARGS__};                                                      \
    for (const void *ps_p_ : ps_ptrs_)                                                           \
      if (!ps_p_)                                                                                \
        PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: null pointer among (%s)", __func__, #__VA_ARGS__); \
  } while (0)
#define CHECK_DTYPE(dt) TRY(ps_check_dtype(__func__, #dt, (dt)))

constexpr int EW = 256; /* threads of elementwise and per-channel kernels */

}  // namespace

#endif /* PINSTREAM_CUDA_NN_CUH */
