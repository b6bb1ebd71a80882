/*
 * nn.cuh — what the CUDA backend's nn kernel files (gemm.cu, conv.cu, norm.cu, ops.cu) share,
 * as kernels/cpu/nn.h does for their CPU twins: the activation element conversions, the grid
 * size of grid-stride kernels, the dispatch on the activation dtype and the argument checks.
 *
 * Every kernel takes its activations as fp16 or bf16 (mixed precision) or fp32 (the fp32
 * path): the element kernels are templates on the type, and the GEMM (gemm.cuh) has a
 * tensor-core form for fp16 (and bf16 on sm_80+) and a CUDA-core form for fp32 (and bf16 on
 * sm_75). bf16 elements are converted by rules.h's ps_bf16_from_f32 / ps_bf16_to_f32, the
 * CPU backend's rule, never by __float2bfloat16_rn (its NaN differs), so the bits agree.
 * tests/nn_kernels_test.ts holds both backends to the same float64 references.
 *
 * Internal to each includer (an anonymous namespace): every translation unit instantiates its
 * own templates.
 */
#ifndef PINSTREAM_CUDA_NN_CUH
#define PINSTREAM_CUDA_NN_CUH

#include <cuda_bf16.h>
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

/* Activation elements (__half, __nv_bfloat16 or float) to and from fp32; fp16 and bf16 round
 * to nearest even. */
__device__ inline float to_f32(__half v) { return __half2float(v); }
__device__ inline float to_f32(__nv_bfloat16 v) { return ps_bf16_to_f32(__bfloat16_as_ushort(v)); }
__device__ inline float to_f32(float v) { return v; }
template <class T>
__device__ inline T from_f32(float v);
template <>
__device__ inline __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __ushort_as_bfloat16(ps_bf16_from_f32(v));
}
template <>
__device__ inline float from_f32<float>(float v) {
  return v;
}

/* Element i of dtype dt (a PS_NN_* code the caller checked) as fp32, and the store back. */
__device__ inline float act_get(const void *p, int32_t dt, int64_t i) {
  if (dt == PS_NN_F16) return __half2float(((const __half *)p)[i]);
  if (dt == PS_NN_BF16) return ps_bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}
__device__ inline void act_set(void *p, int32_t dt, int64_t i, float v) {
  if (dt == PS_NN_F16)
    ((__half *)p)[i] = __float2half_rn(v);
  else if (dt == PS_NN_BF16)
    ((uint16_t *)p)[i] = ps_bf16_from_f32(v);
  else
    ((float *)p)[i] = v;
}
/* GradScaler's check of gradient element i (dtype dt): whether it is inf or NaN, and when
 * in_place, the element times inv, rounded back to its dtype. */
__device__ inline bool unscale_element(void *grad, int32_t dt, int64_t i, int in_place, float inv) {
  bool bad;
  if (dt == PS_NN_F16) {
    __half *p = (__half *)grad + i;
    bad = ps_f16_nonfinite(__half_as_ushort(*p)) != 0;
    if (in_place) *p = __float2half_rn(__half2float(*p) * inv);
  } else if (dt == PS_NN_BF16) {
    uint16_t *p = (uint16_t *)grad + i;
    bad = ps_bf16_nonfinite(*p) != 0;
    if (in_place) *p = ps_bf16_from_f32(ps_bf16_to_f32(*p) * inv);
  } else {
    float *p = (float *)grad + i;
    bad = !isfinite(*p);
    if (in_place) *p *= inv;
  }
  return bad;
}

/* Bytes of one element of dtype dt. */
inline int64_t act_bytes(int32_t dt) { return dt == PS_NN_F32 ? 4 : 2; }

/* *p += v, atomically. bf16 has no atomic add before sm_80 (and none in the emulator): a
 * compare-and-swap on the aligned 32-bit word that holds it, rounding by the rule. */
__device__ inline void atomic_add_act(float *p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_add_act(__half *p, __half v) { atomicAdd(p, v); }
__device__ inline void atomic_add_act(__nv_bfloat16 *p, __nv_bfloat16 v) {
  unsigned int *w = (unsigned int *)((uintptr_t)p & ~(uintptr_t)3);
  const unsigned int shift = ((uintptr_t)p & 2u) ? 16u : 0u;
  const float add = to_f32(v);
  unsigned int old = atomicAdd(w, 0u), seen;
  do {
    seen = old;
    const uint16_t cur = (uint16_t)(seen >> shift);
    const unsigned int next = ps_bf16_from_f32(ps_bf16_to_f32(cur) + add);
    old = atomicCAS(w, seen, (seen & ~(0xffffu << shift)) | (next << shift));
  } while (old != seen);
}

/* Blocks of a grid-stride kernel over n elements, capped (the kernels loop past the cap). */
inline int blocks_for(int64_t n, int block) {
  int64_t g = (n + block - 1) / block;
  return (int)(g < 65535 * 16 ? (g > 0 ? g : 1) : 65535 * 16);
}

/* Runs the statements with T the activation type of dtype (PS_NN_F16: __half, PS_NN_BF16:
 * __nv_bfloat16, PS_NN_F32: float); the caller has checked dtype. */
#define WITH_ACT(dtype, ...)            \
  do {                                  \
    if ((dtype) == PS_NN_F16) {         \
      using T = __half;                 \
      __VA_ARGS__;                      \
    } else if ((dtype) == PS_NN_BF16) { \
      using T = __nv_bfloat16;          \
      __VA_ARGS__;                      \
    } else {                            \
      using T = float;                  \
      __VA_ARGS__;                      \
    }                                   \
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
