/*
 * gemm.cu — CUDA backend of the plain matrix product, ps_nn_matmul (kernels/cpu/gemm.c is the
 * CPU twin): the one GEMM of gemm.cuh reading both operands through strided loaders.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "../pinstream.h"
#include "gemm.cuh"
#include "nn.cuh"

extern "C" {

PS_API int ps_nn_matmul(const void *a, const void *b, int32_t dtype, void *c, int32_t c_dtype,
                        int64_t m, int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                        int32_t accumulate, void *stream) {
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(c_dtype);
  TRY(ps_check_matmul(m, n, k));
  if (m == 0 || n == 0) return PS_OK;
  /* k == 0: a and b are zero-byte tensors, whose pointers are NULL (zero-byte allocations
   * allocate nothing); c is still written (zeros, or left as is when accumulating), as on
   * the cpu backend. */
  NULL_CHECK(c);
  if (k > 0) NULL_CHECK(a, b);
  cudaStream_t st = (cudaStream_t)stream;
  StoreMat ep{.c = c, .n = n, .dt = c_dtype, .acc = accumulate != 0};
  int r = PS_OK;
  WITH_ACT(dtype, {
    Strided<T> A{.p = (const T *)a,
                 .rs = trans_a ? 1 : k,
                 .cs = trans_a ? m : 1,
                 .vec = !trans_a && aligned16((const T *)a, k)};
    Strided<T> B{.p = (const T *)b, .rs = trans_b ? 1 : n, .cs = trans_b ? k : 1, .vec = false};
    r = gemm(m, n, k, gemm_splits(m, n, k), A, B, ep, st);
  });
  return r;
}

PS_API int ps_nn_matmul_bias_act(const void *a, const void *b, int32_t dtype, void *c,
                                 int32_t c_dtype, int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                 int32_t trans_b, const void *bias, int32_t bias_dtype, int32_t act,
                                 void *stream) {
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(c_dtype);
  CHECK_DTYPE(bias_dtype);
  if (act != PS_ACT_NONE && act != PS_ACT_RELU)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_nn_matmul_bias_act: act %d is not PS_ACT_NONE or PS_ACT_RELU", (int)act);
  TRY(ps_check_matmul(m, n, k));
  if (m == 0 || n == 0) return PS_OK;
  NULL_CHECK(c, bias);
  if (k > 0) NULL_CHECK(a, b);
  cudaStream_t st = (cudaStream_t)stream;
  StoreMatBiasAct ep{.c = c,
                     .bias = bias,
                     .n = n,
                     .dt = c_dtype,
                     .bias_dt = bias_dtype,
                     .relu = act == PS_ACT_RELU};
  int r = PS_OK;
  WITH_ACT(dtype, {
    Strided<T> A{.p = (const T *)a,
                 .rs = trans_a ? 1 : k,
                 .cs = trans_a ? m : 1,
                 .vec = !trans_a && aligned16((const T *)a, k)};
    Strided<T> B{.p = (const T *)b, .rs = trans_b ? 1 : n, .cs = trans_b ? k : 1, .vec = false};
    r = gemm(m, n, k, gemm_splits(m, n, k), A, B, ep, st);
  });
  return r;
}

}  // extern "C"
