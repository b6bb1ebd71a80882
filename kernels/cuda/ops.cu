/*
 * ops.cu — CUDA backend of the element-wise nn kernels (kernels/cpu/ops.c is the CPU twin):
 * pooling, ReLU, casts, the loss, loss scaling and SGD. The loss sum and correct count use
 * atomics (order-dependent in the last bits of the sum).
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "../pinstream.h"
#include "nn.cuh"

namespace {

/* ---- pooling ------------------------------------------------------------------------------ */

template <class T>
__global__ void maxpool_fwd(const T *x, T *y, int32_t *idx, int64_t planes, int64_t h, int64_t w,
                            int64_t oh, int64_t ow, int k, int s) {
  int64_t total = planes * oh * ow;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t ox = t % ow, oy = (t / ow) % oh, pl = t / (oh * ow);
    const T *xp = x + pl * h * w;
    int64_t best = oy * s * w + ox * s;
    float m = to_f32(xp[best]);
    for (int ky = 0; ky < k; ky++)
      for (int kx = 0; kx < k; kx++) {
        int64_t at = (oy * s + ky) * w + ox * s + kx;
        float v = to_f32(xp[at]);
        if (ps_pool_takes(v, m)) m = v, best = at;
      }
    y[t] = from_f32<T>(m);
    if (idx) idx[t] = (int32_t)best;
  }
}

/* One thread per output: adds dy at the recorded input position. Windows that do not
 * overlap (stride >= kernel, the usual case) never share a position, so the result is exact
 * and deterministic; overlapping windows add in fp16 in an unspecified order (as the CPU
 * backend, which adds in output order). */
template <class T>
__global__ void maxpool_bwd(const T *dy, const int32_t *idx, T *dx, int64_t planes, int64_t hw,
                            int64_t ohw) {
  int64_t total = planes * ohw;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int32_t at = idx[t];
    if (at < 0 || at >= hw) continue; /* cannot fail here without a host round trip */
    atomic_add_act(dx + (t / ohw) * hw + at, dy[t]);
  }
}

/* ---- relu, cast ------------------------------------------------------------------------------ */

/* ReLU on the bits of fp16 or bf16 (uint16_t, bf != 0: bf16) or fp32 (uint32_t) elements: the
 * rules.h decisions. */
__device__ inline uint16_t relu_bits(uint16_t x, int bf) {
  return bf ? ps_relu_bf16(x) : ps_relu_f16(x);
}
__device__ inline uint32_t relu_bits(uint32_t x, int) { return ps_relu_f32(x); }
__device__ inline uint16_t relu_grad_bits(uint16_t y, uint16_t dy, int bf) {
  return bf ? ps_relu_grad_bf16(y, dy) : ps_relu_grad_f16(y, dy);
}
__device__ inline uint32_t relu_grad_bits(uint32_t y, uint32_t dy, int) {
  return ps_relu_grad_f32(y, dy);
}

template <class U>
__global__ void relu_fwd(const U *x, U *y, int64_t n, int bf) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    y[i] = relu_bits(x[i], bf);
  }
}

template <class U>
__global__ void relu_bwd(const U *dy, const U *y, U *dx, int64_t n, int bf) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    dx[i] = relu_grad_bits(y[i], dy[i], bf);
  }
}

__global__ void cast_kernel(const void *src, int32_t sdt, void *dst, int32_t ddt, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    act_set(dst, ddt, i, act_get(src, sdt, i));
  }
}

/* ---- loss ------------------------------------------------------------------------------------ */

/* One warp per sample, grid-stride over samples: blocks_for caps the grid at 65535 * 16
 * blocks (8 rows each), so without the loop rows past ~8.4M would be skipped silently. The
 * row is uniform across a warp (blockDim is a multiple of 32), so the full-mask shuffles
 * below always run with all 32 lanes. */
template <class T>
__global__ void cross_entropy(const T *logits, const int32_t *labels, T *dlogits, float *loss_sum,
                              int32_t *correct, int64_t n, int64_t k, float scale,
                              const float *device_scale) {
  int lane = threadIdx.x % 32;
  float g = ps_ce_grad_scale(scale, device_scale, n);
  for (int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; row < n;
       row += (int64_t)gridDim.x * blockDim.x / 32) {
    const T *l = logits + row * k;
    int32_t label = labels[row];
    float m = -INFINITY;
    int64_t arg = -1; /* none yet: a lane past k keeps it */
    for (int64_t j = lane; j < k; j += 32) {
      float v = to_f32(l[j]);
      if (ps_argmax_takes(v, j, m, arg)) m = v, arg = j;
    }
    /* the argmax across the warp (the same rule: first maximum, NaN only at index 0) */
    for (int o = 16; o > 0; o >>= 1) {
      float om = __shfl_down_sync(0xffffffffu, m, o);
      int64_t oa = __shfl_down_sync(0xffffffffu, arg, o);
      if (ps_argmax_takes(om, oa, m, arg)) m = om, arg = oa;
    }
    m = __shfl_sync(0xffffffffu, m, 0);
    arg = __shfl_sync(0xffffffffu, arg, 0);
    float s = 0.0f;
    for (int64_t j = lane; j < k; j += 32) s += expf(to_f32(l[j]) - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    s = __shfl_sync(0xffffffffu, s, 0);
    bool ok = label >= 0 && label < k;
    if (lane == 0 && ok) {
      if (loss_sum) atomicAdd(loss_sum, m + logf(s) - to_f32(l[label]));
      if (correct && arg == label) atomicAdd(correct, 1);
    }
    if (dlogits) {
      float inv = 1.0f / s;
      for (int64_t j = lane; j < k; j += 32) {
        float p = expf(to_f32(l[j]) - m) * inv;
        dlogits[row * k + j] = from_f32<T>(ok ? g * (p - (j == label ? 1.0f : 0.0f)) : 0.0f);
      }
    }
  }
}

/* ---- loss scaling, SGD ----------------------------------------------------------------------- */

__global__ void unscale_check(void *grad, int32_t dt, int64_t n, const float *scale,
                              float inv_value, int in_place, int32_t *found_inf) {
  float inv = scale ? 1.0f / *scale : inv_value;
  bool bad = false;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    bad |= unscale_element(grad, dt, i, in_place, inv);
  }
  if (bad) *found_inf = 1; /* every writer writes 1: a benign race */
}

__global__ void sgd_kernel(float *param, const void *grad, int32_t dt, float *buf, void *half_out,
                           int32_t half_dt, int64_t n, float lr, float momentum, float dampening,
                           float wd, int nesterov, const float *scale, const int32_t *found_inf,
                           const int32_t *steps_done, const float *hyper) {
  if (found_inf && *found_inf) return;
  float inv = scale ? 1.0f / *scale : 1.0f;
  bool fresh = steps_done && *steps_done == 0;
  if (hyper) {
    lr = hyper[0];
    momentum = buf ? hyper[1] : 0.0f;
  }
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float g = act_get(grad, dt, i) * inv;
    float p = ps_sgd_element(param[i], g, momentum != 0.0f ? buf + i : nullptr, lr, momentum,
                             dampening, wd, nesterov, fresh);
    param[i] = p;
    if (half_out) act_set(half_out, half_dt, i, p);
  }
}

__global__ void step_count_kernel(int32_t *steps_done, const int32_t *found_inf) {
  if (!(found_inf && *found_inf)) *steps_done += 1;
}

__global__ void scaler_update_kernel(float *scale, int32_t *tracker, const int32_t *found_inf,
                                     float growth, float backoff, int32_t interval) {
  ps_scaler_step(scale, tracker, *found_inf, growth, backoff, interval);
}

}  // namespace

extern "C" {

PS_API int ps_nn_maxpool2d_forward(const void *x, void *y, int32_t dtype, int32_t *indices,
                                   int64_t n, int64_t c, int64_t h, int64_t w_, int32_t kernel,
                                   int32_t stride, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_maxpool_forward(n, c, h, w_, kernel, stride));
  int64_t oh = ps_pool_out(h, kernel, stride), ow = ps_pool_out(w_, kernel, stride);
  int64_t planes = n * c;
  if (planes == 0) return PS_OK;
  NULL_CHECK(x, y);
  WITH_ACT(dtype,
           PS_LAUNCH(maxpool_fwd<T>, blocks_for(planes * oh * ow, EW), EW, 0, (cudaStream_t)stream,
                     (const T *)x, (T *)y, indices, planes, h, w_, oh, ow, kernel, stride));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_maxpool2d_backward(const void *dy, const int32_t *indices, void *dx, int32_t dtype,
                                    int64_t n, int64_t c, int64_t h, int64_t w_, int64_t oh,
                                    int64_t ow, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_maxpool_backward(n, c, h, w_, oh, ow));
  int64_t planes = n * c;
  if (planes == 0) return PS_OK;
  NULL_CHECK(dy, indices, dx);
  cudaStream_t st = (cudaStream_t)stream;
  CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)(planes * h * w_ * act_bytes(dtype)), st));
  WITH_ACT(dtype, PS_LAUNCH(maxpool_bwd<T>, blocks_for(planes * oh * ow, EW), EW, 0, st,
                            (const T *)dy, indices, (T *)dx, planes, h * w_, oh * ow));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_relu_forward(const void *x, void *y, int32_t dtype, int64_t count, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  NULL_CHECK(x, y);
  if (dtype != PS_NN_F32)
    PS_LAUNCH(relu_fwd<uint16_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint16_t *)x, (uint16_t *)y, count, dtype == PS_NN_BF16);
  else
    PS_LAUNCH(relu_fwd<uint32_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint32_t *)x, (uint32_t *)y, count, 0);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_relu_backward(const void *dy, const void *y, void *dx, int32_t dtype,
                               int64_t count, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  NULL_CHECK(dy, y, dx);
  if (dtype != PS_NN_F32)
    PS_LAUNCH(relu_bwd<uint16_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint16_t *)dy, (const uint16_t *)y, (uint16_t *)dx, count,
              dtype == PS_NN_BF16);
  else
    PS_LAUNCH(relu_bwd<uint32_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint32_t *)dy, (const uint32_t *)y, (uint32_t *)dx, count, 0);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_cross_entropy(const void *logits, const int32_t *labels, void *dlogits,
                               int32_t dtype, float *loss_sum, int32_t *correct, int64_t n,
                               int64_t k, float scale, const float *device_scale, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_cross_entropy(n, k));
  if (n == 0) return PS_OK;
  NULL_CHECK(logits, labels);
  const int per_block = EW / 32;
  WITH_ACT(dtype, PS_LAUNCH(cross_entropy<T>, blocks_for(n, per_block), EW, 0, (cudaStream_t)stream,
                            (const T *)logits, labels, (T *)dlogits, loss_sum, correct, n, k, scale,
                            device_scale));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype,
                      int64_t count, void *stream) {
  CHECK_DTYPE(src_dtype);
  CHECK_DTYPE(dst_dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  NULL_CHECK(src, dst);
  cudaStream_t st = (cudaStream_t)stream;
  if (src_dtype == dst_dtype) {
    /* memmove, as on the cpu backend: src and dst may overlap. */
    return ps_copy_d2d(dst, src, (size_t)(count * act_bytes(src_dtype)), st);
  }
  PS_LAUNCH(cast_kernel, blocks_for(count, EW), EW, 0, st, src, src_dtype, dst, dst_dtype, count);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_unscale_check(void *grad, int32_t grad_dtype, int64_t count, const float *scale,
                               float inv_scale, int32_t in_place, int32_t *found_inf,
                               void *stream) {
  CHECK_DTYPE(grad_dtype);
  TRY(ps_check_count(__func__, count));
  NULL_CHECK(found_inf);
  if (count == 0) return PS_OK;
  NULL_CHECK(grad);
  PS_LAUNCH(unscale_check, blocks_for(count, EW), EW, 0, (cudaStream_t)stream, grad, grad_dtype,
            count, scale, inv_scale, in_place, found_inf);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_sgd_step(float *param, const void *grad, int32_t grad_dtype, float *momentum_buf,
                          void *param_half, int32_t half_dtype, int64_t count, float lr,
                          float momentum, float dampening, float weight_decay, int32_t nesterov,
                          const float *scale, const int32_t *found_inf, const int32_t *steps_done,
                          const float *hyper, void *stream) {
  CHECK_DTYPE(grad_dtype);
  if (param_half) TRY(ps_check_half_dtype(__func__, "half_dtype", half_dtype));
  TRY(ps_check_sgd(count, momentum, momentum_buf));
  if (count == 0) return PS_OK;
  NULL_CHECK(param, grad);
  PS_LAUNCH(sgd_kernel, blocks_for(count, EW), EW, 0, (cudaStream_t)stream, param, grad, grad_dtype,
            momentum_buf, param_half, half_dtype, count, lr, momentum, dampening, weight_decay,
            nesterov, scale, found_inf, steps_done, hyper);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_step_count(int32_t *steps_done, const int32_t *found_inf, void *stream) {
  NULL_CHECK(steps_done);
  PS_LAUNCH(step_count_kernel, 1, 1, 0, (cudaStream_t)stream, steps_done, found_inf);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_scaler_update(float *scale, int32_t *growth_tracker, const int32_t *found_inf,
                               float growth_factor, float backoff_factor, int32_t growth_interval,
                               void *stream) {
  NULL_CHECK(scale, growth_tracker, found_inf);
  TRY(ps_check_scaler_update(growth_interval));
  PS_LAUNCH(scaler_update_kernel, 1, 1, 0, (cudaStream_t)stream, scale, growth_tracker, found_inf,
            growth_factor, backoff_factor, growth_interval);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"

/* ---- skipped-step rollback ------------------------------------------------------------ */

namespace {

/* Every thread reads the flag: a skipped step costs one read, a taken one a copy. */
__global__ void copy_if_kernel(float *dst, const float *src, int64_t n, const int32_t *flag) {
  if (!*flag) return;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

extern "C" {

PS_API int ps_nn_copy_if(float *dst, const float *src, int64_t count, const int32_t *flag,
                         void *stream) {
  TRY(ps_check_count(__func__, count));
  NULL_CHECK(flag);
  if (count == 0) return PS_OK;
  NULL_CHECK(dst, src);
  PS_LAUNCH(copy_if_kernel, blocks_for(count, EW), EW, 0, (cudaStream_t)stream, dst, src, count,
            flag);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"

/* ---- cat, stack, add, mul ------------------------------------------------------------- */

namespace {

/* One thread per element of the part, grid-stride; the row index is a division per element,
 * which the copy's memory traffic hides. */
template <class U>
__global__ void concat_kernel(U *part, U *whole, int64_t outer, int64_t part_len, int64_t whole_len,
                              int64_t offset, int split) {
  const int64_t n = outer * part_len;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t o = i / part_len, j = i - o * part_len;
    U *w = whole + o * whole_len + offset + j;
    if (split)
      part[i] = *w;
    else
      *w = part[i];
  }
}

template <class T>
__global__ void binary_kernel(const T *a, const T *b, T *y, int64_t n, int mul) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float u = to_f32(a[i]), v = to_f32(b[i]);
    y[i] = from_f32<T>(mul ? u * v : u + v);
  }
}

}  // namespace

extern "C" {

PS_API int ps_nn_concat(void *part, void *whole, int32_t dtype, int64_t outer, int64_t part_len,
                        int64_t whole_len, int64_t offset, int32_t split, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_concat(outer, part_len, whole_len, offset));
  if (outer == 0 || part_len == 0) return PS_OK;
  NULL_CHECK(part, whole);
  cudaStream_t st = (cudaStream_t)stream;
  const int s = split != 0;
  if (dtype != PS_NN_F32)
    PS_LAUNCH(concat_kernel<uint16_t>, blocks_for(outer * part_len, EW), EW, 0, st,
              (uint16_t *)part, (uint16_t *)whole, outer, part_len, whole_len, offset, s);
  else
    PS_LAUNCH(concat_kernel<uint32_t>, blocks_for(outer * part_len, EW), EW, 0, st,
              (uint32_t *)part, (uint32_t *)whole, outer, part_len, whole_len, offset, s);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_binary(const void *a, const void *b, void *y, int32_t dtype, int64_t count,
                        int32_t op, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_binary(count, op));
  if (count == 0) return PS_OK;
  NULL_CHECK(a, b, y);
  const int mul = op == PS_BINARY_MUL;
  WITH_ACT(dtype, PS_LAUNCH(binary_kernel<T>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
                            (const T *)a, (const T *)b, (T *)y, count, mul));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"
