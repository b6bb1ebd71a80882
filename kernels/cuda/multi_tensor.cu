/*
 * multi_tensor.cu — CUDA backend of the multi-tensor steps (ps_nn_multi_*; kernels/cpu/ops.c is
 * the CPU twin): one launch over a list of tensors kept in device memory, instead of one launch
 * per parameter. Row y of the grid is entry y of the list; its blocks stride over that tensor's
 * elements, each element computed by the same rules.h function as the one-tensor kernels, so the
 * bits are those of one call per tensor.
 *
 * The optimizer step stays two launches (check, then update): skipping a step on inf/NaN needs
 * every gradient checked before any parameter changes, a dependency across the whole grid.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "../pinstream.h"
#include "common.cuh"
#include "nn.cuh"

namespace {

constexpr int MT = 256;        /* threads of a block */
constexpr int MT_MAX_X = 1024; /* blocks of a grid row at most (a row strides past them) */

inline unsigned mt_blocks(int64_t max_count) {
  int64_t g = (max_count + 4 * MT - 1) / (4 * MT);
  return (unsigned)(g < 1 ? 1 : (g > MT_MAX_X ? MT_MAX_X : g));
}

__global__ void multi_unscale_check(const int64_t *list, const float *scale, float inv_value,
                                    int in_place, int32_t *found_inf) {
  const int64_t *e = list + (int64_t)blockIdx.y * PS_MT_SGD_FIELDS;
  void *grad = (void *)(uintptr_t)e[1];
  const int64_t n = e[4];
  const int32_t dt = (int32_t)e[5];
  const float inv = scale ? 1.0f / *scale : inv_value;
  bool bad = false;
  for (int64_t i = blockIdx.x * (int64_t)MT + threadIdx.x; i < n; i += (int64_t)gridDim.x * MT)
    bad |= unscale_element(grad, dt, i, in_place, inv);
  if (bad) *found_inf = 1; /* every writer writes 1: a benign race */
}

__global__ void multi_sgd(const int64_t *list, float lr, float momentum, float dampening, float wd,
                          int nesterov, const float *scale, const int32_t *found_inf,
                          const int32_t *steps_done, const float *hyper) {
  if (found_inf && *found_inf) return;
  const int64_t *e = list + (int64_t)blockIdx.y * PS_MT_SGD_FIELDS;
  float *param = (float *)(uintptr_t)e[0];
  const void *grad = (const void *)(uintptr_t)e[1];
  float *buf = (float *)(uintptr_t)e[2];
  void *half_out = (void *)(uintptr_t)e[3];
  const int64_t n = e[4];
  const int32_t dt = (int32_t)e[5], half_dt = (int32_t)e[6];
  const float inv = scale ? 1.0f / *scale : 1.0f;
  const bool fresh = steps_done && *steps_done == 0;
  if (hyper) {
    lr = hyper[0];
    momentum = buf ? hyper[1] : 0.0f;
  }
  for (int64_t i = blockIdx.x * (int64_t)MT + threadIdx.x; i < n; i += (int64_t)gridDim.x * MT) {
    float g = act_get(grad, dt, i) * inv;
    float p = ps_sgd_element(param[i], g, momentum != 0.0f ? buf + i : nullptr, lr, momentum,
                             dampening, wd, nesterov, fresh);
    param[i] = p;
    if (half_out) act_set(half_out, half_dt, i, p);
  }
}

__global__ void multi_copy_if(const int64_t *list, const int32_t *flag) {
  if (flag && !*flag) return;
  const int64_t *e = list + (int64_t)blockIdx.y * PS_MT_COPY_FIELDS;
  float *dst = (float *)(uintptr_t)e[0];
  const float *src = (const float *)(uintptr_t)e[1];
  const int64_t n = e[2];
  for (int64_t i = blockIdx.x * (int64_t)MT + threadIdx.x; i < n; i += (int64_t)gridDim.x * MT)
    dst[i] = src[i];
}

}  // namespace

extern "C" {

PS_API int ps_nn_multi_unscale_check(const int64_t *list, int32_t n, int64_t max_count,
                                     const float *scale, float inv_scale, int32_t in_place,
                                     int32_t *found_inf, void *stream) {
  TRY(ps_check_multi(__func__, list, n, max_count));
  if (!found_inf) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: null found_inf", __func__);
  if (n == 0) return PS_OK;
  PS_LAUNCH(multi_unscale_check, dim3(mt_blocks(max_count), (unsigned)n), MT, 0,
            (cudaStream_t)stream, list, scale, inv_scale, in_place, found_inf);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_multi_sgd_step(const int64_t *list, int32_t n, int64_t max_count, float lr,
                                float momentum, float dampening, float weight_decay,
                                int32_t nesterov, const float *scale, const int32_t *found_inf,
                                const int32_t *steps_done, const float *hyper, void *stream) {
  TRY(ps_check_multi(__func__, list, n, max_count));
  if (n == 0) return PS_OK;
  PS_LAUNCH(multi_sgd, dim3(mt_blocks(max_count), (unsigned)n), MT, 0, (cudaStream_t)stream, list,
            lr, momentum, dampening, weight_decay, nesterov, scale, found_inf, steps_done, hyper);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_multi_copy_if(const int64_t *list, int32_t n, int64_t max_count,
                               const int32_t *flag, void *stream) {
  TRY(ps_check_multi(__func__, list, n, max_count));
  if (n == 0) return PS_OK;
  PS_LAUNCH(multi_copy_if, dim3(mt_blocks(max_count), (unsigned)n), MT, 0, (cudaStream_t)stream,
            list, flag);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"
