/*
 * fill.cu — CUDA backend of ps_tensor_fill (kernels/cpu/fill.c is the CPU twin): element i of
 * the output computed on the device from (mode, a, b, seed, offset + i) by the rules of
 * kernels/rules.h, with every float operation rounded on its own, so both backends write the
 * same bits; and ps_gather_rows, the batch gather of a device-resident dataset.
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
      } else if (dtype == PS_NN_BF16) {
        ((uint16_t *)dst)[i] = ps_bf16_from_f32(v);
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

/* ---- gathering rows of a device-resident dataset ------------------------------------------- */

namespace {

/* One block per output row (grid-strided), its threads striding over the row's bytes, by 4
 * when the rows are 4-byte aligned. */
__global__ void gather_kernel(const uint8_t *__restrict__ src, int64_t rows, int64_t row_bytes,
                              const int32_t *__restrict__ indices, int32_t n,
                              uint8_t *__restrict__ dst, ps_device_fault *fault) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int32_t i = indices[k];
    if (i < 0 || i >= rows) {
      /* The CPU backend refuses such an index at the call; here it is found on the device, so
       * the next synchronize reports it (and the row is left unwritten). */
      if (threadIdx.x == 0) ps_device_fault_raise(fault, PS_FAULT_GATHER_INDEX, k, i, rows);
      continue;
    }
    const uint8_t *s = src + (int64_t)i * row_bytes;
    uint8_t *d = dst + k * row_bytes;
    if (row_bytes % 4 == 0 && (uintptr_t)src % 4 == 0 && (uintptr_t)dst % 4 == 0) {
      for (int64_t j = threadIdx.x; j < row_bytes / 4; j += blockDim.x)
        ((uint32_t *)d)[j] = ((const uint32_t *)s)[j];
    } else {
      for (int64_t j = threadIdx.x; j < row_bytes; j += blockDim.x) d[j] = s[j];
    }
  }
}

}  // namespace

PS_API int ps_gather_rows(const void *src, int64_t rows, int64_t row_bytes, const int32_t *indices,
                          int32_t n, void *dst, void *stream) {
  TRY(ps_check_gather(__func__, rows, row_bytes, n));
  if (n == 0) return PS_OK;
  if (src == nullptr || indices == nullptr || dst == nullptr)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: src, indices and dst must not be NULL", __func__);
  ps_device_fault *fault = nullptr;
  TRY(ps_device_fault_record(&fault));
  const unsigned blocks = (unsigned)(n < 65535 ? n : 65535);
  PS_LAUNCH(gather_kernel, blocks, 128, 0, (cudaStream_t)stream, (const uint8_t *)src, rows,
            row_bytes, indices, n, (uint8_t *)dst, fault);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}
