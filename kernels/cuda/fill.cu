/*
 * fill.cu — CUDA backend of ps_tensor_fill (kernels/cpu/fill.c is the CPU twin): element i of
 * the output computed on the device from (mode, a, b, seed, offset + i) by the rules of
 * kernels/rules.h, with every float operation rounded on its own, so both backends write the
 * same bits.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"

namespace {

__global__ void fill_kernel(void *dst, int32_t dtype, int64_t count, int32_t mode, double a,
                            double b, uint64_t seed, uint64_t offset) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x) {
    const uint64_t k = offset + (uint64_t)i;
    if (dtype == PS_FILL_I32) {
      ((int32_t *)dst)[i] = ps_fill_int(mode, a, b, k);
    } else {
      const float v = ps_fill_value(mode, a, b, seed, k);
      if (dtype == PS_NN_F16) {
        ((__half *)dst)[i] = __float2half_rn(v);
      } else {
        ((float *)dst)[i] = v;
      }
    }
  }
}

}  // namespace

PS_API int ps_tensor_fill(void *dst, int32_t dtype, int64_t count, int32_t mode, double a, double b,
                          uint64_t seed, uint64_t offset, void *stream) {
  TRY(ps_check_fill(__func__, dtype, count, mode));
  if (count == 0) return PS_OK;
  if (dst == nullptr) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: dst is NULL", __func__);
  const int block = 256;
  int64_t blocks = (count + block - 1) / block;
  if (blocks > 65535) blocks = 65535;
  PS_LAUNCH(fill_kernel, (unsigned)blocks, block, 0, (cudaStream_t)stream, dst, dtype, count, mode,
            a, b, seed, offset);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}
