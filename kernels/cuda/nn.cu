/*
 * (About 730 lines: the CUDA side of four CPU files, gemm.c, conv.c, norm.c and ops.c. Its
 * pooling, normalization, bias and loss kernels share the block reduction, the per-channel
 * helpers and the launch checks at its top, and the GEMM itself already lives in gemm.cuh, so a
 * split would move those helpers into one more header and save nothing.)
 *
 * nn.cu — CUDA backend of the PS-SECTION nn kernels (kernels/cpu/gemm.c, conv.c, norm.c and ops.c
 * are the reference; tests/nn_kernels_test.ts holds both to the same float64 references).
 *
 * Everything heavy is one tensor-core GEMM template (gemm.cuh), fed by loader functors, so
 * the convolutions are implicit GEMMs (no im2col buffer in device memory):
 *
 *   forward        Y[Co, (n,p)]     = W[Co, K] . col(x)[K, (n,p)]          K = C*kh*kw
 *   backward data  dX[C, (n,iy,ix)] = W'[C, (o,ky,kx)] . dY-gather[(o,ky,kx), (n,iy,ix)]
 *                  (each input pixel gathers the output pixels that read it: no atomics,
 *                  deterministic)
 *   backward wt    dW[Co, K]        = dY[Co, (n,p)] . col(x)^T[(n,p), K], split over (n,p)
 *                  into fp32 partials in a stream-ordered workspace, then reduced in a fixed
 *                  order (deterministic)
 *
 * Results are written by epilogue functors in fp32 or fp16. Reductions (batch norm, bias
 * gradient) use one block per channel with a fixed tree, so results are deterministic too;
 * the loss sum and correct count use atomics (order-dependent in the last bits of the sum).
 *
 * Every kernel takes its activations as fp16 (mixed precision) or fp32 (the fp32 path): the
 * element kernels are templates on the type, and the GEMM has a tensor-core form for fp16 and
 * a CUDA-core form for fp32 (gemm.cuh).
 *
 * Status: compiled with nvcc for sm_80/sm_90; the author had no GPU, so these kernels have
 * not yet run on one (tests/nn_kernels_test.ts runs them wherever Device.open("cuda") works).
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "../pinstream.h"
#include "common.cuh"
#include "gemm.cuh"

namespace {

inline int blocks_for(int64_t n, int block) {
  int64_t g = (n + block - 1) / block;
  return (int)(g < 65535 * 16 ? (g > 0 ? g : 1) : 65535 * 16);
}

/* ---- block reduction --------------------------------------------------------------------- */

template <int N>
__device__ void block_sum(float (&v)[N], float (*sh)[N]) {
  /* blockDim.x == 256: warp shuffles, then one warp over the 8 warp sums. */
  for (int k = 0; k < N; k++)
    for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_down_sync(0xffffffffu, v[k], o);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0)
    for (int k = 0; k < N; k++) sh[warp][k] = v[k];
  __syncthreads();
  if (warp == 0) {
    for (int k = 0; k < N; k++) v[k] = lane < (int)(blockDim.x / 32) ? sh[lane][k] : 0.0f;
    for (int k = 0; k < N; k++)
      for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_down_sync(0xffffffffu, v[k], o);
    if (lane == 0)
      for (int k = 0; k < N; k++) sh[0][k] = v[k];
  }
  __syncthreads();
  for (int k = 0; k < N; k++) v[k] = sh[0][k];
  __syncthreads();
}

/* ---- per-channel sums over [n, c, hw] ----------------------------------------------------- */

/* Index of value t of channel ch (t < n * hw) in an [n, c, hw] tensor. */
__device__ inline int64_t plane_at(int64_t t, int64_t ch, int64_t c, int64_t hw) {
  return ((t / hw) * c + ch) * hw + t % hw;
}

/* The sum of channel ch's cnt = n * hw values of x, in every thread of the block. */
template <class T>
__device__ float channel_sum(const T *x, int64_t ch, int64_t c, int64_t hw, int64_t cnt,
                             float (*sh)[1]) {
  float v[1] = {0.0f};
  for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) v[0] += to_f32(x[plane_at(t, ch, c, hw)]);
  block_sum<1>(v, sh);
  return v[0];
}

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
    atomicAdd(dx + (t / ohw) * hw + at, dy[t]);
  }
}

/* ---- batch normalization ------------------------------------------------------------------- */

template <class T>
__global__ void bn_train(const T *x, const float *gamma, const float *beta, T *y, float *save_mean,
                         float *save_invstd, float *run_mean, float *run_var, int64_t n, int64_t c,
                         int64_t hw, float momentum, float eps) {
  PS_SHARED(float, sh, [32][1]);
  int64_t ch = blockIdx.x, cnt = n * hw;
  float mean = channel_sum(x, ch, c, hw, cnt, sh) / (float)cnt;
  float v[1] = {0.0f};
  for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
    float d = to_f32(x[plane_at(t, ch, c, hw)]) - mean;
    v[0] += d * d;
  }
  block_sum<1>(v, sh);
  float ss = v[0], invstd = rsqrtf(ss / (float)cnt + eps);
  if (threadIdx.x == 0) {
    save_mean[ch] = mean;
    save_invstd[ch] = invstd;
    if (run_mean) run_mean[ch] = ps_bn_running(run_mean[ch], mean, momentum);
    if (run_var) {
      float unbiased = cnt > 1 ? ss / (float)(cnt - 1) : ss / (float)cnt;
      run_var[ch] = ps_bn_running(run_var[ch], unbiased, momentum);
    }
  }
  float a, b;
  ps_bn_affine(gamma[ch], beta[ch], mean, invstd, &a, &b);
  for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
    int64_t at = plane_at(t, ch, c, hw);
    y[at] = from_f32<T>(to_f32(x[at]) * a + b);
  }
}

template <class T>
__global__ void bn_eval(const T *x, const float *gamma, const float *beta, const float *run_mean,
                        const float *run_var, T *y, int64_t total, int64_t c, int64_t hw,
                        float eps) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t ch = (t / hw) % c;
    float a, b;
    ps_bn_eval_affine(gamma[ch], beta[ch], run_mean[ch], run_var[ch], eps, &a, &b);
    y[t] = from_f32<T>(to_f32(x[t]) * a + b);
  }
}

template <class T>
__global__ void bn_bwd(const T *dy, const T *x, const float *gamma, const float *save_mean,
                       const float *save_invstd, T *dx, float *dgamma, float *dbeta, int64_t n,
                       int64_t c, int64_t hw) {
  PS_SHARED(float, sh, [32][2]);
  int64_t ch = blockIdx.x, cnt = n * hw;
  float mean = save_mean[ch], is = save_invstd[ch];
  float v[2] = {0.0f, 0.0f};
  for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
    int64_t at = plane_at(t, ch, c, hw);
    float d = to_f32(dy[at]);
    v[0] += d;
    v[1] += d * ((to_f32(x[at]) - mean) * is);
  }
  block_sum<2>(v, sh);
  if (threadIdx.x == 0) {
    dbeta[ch] = v[0];
    dgamma[ch] = v[1];
  }
  float a = gamma[ch] * is, mdy = v[0] / (float)cnt, mdyx = v[1] / (float)cnt;
  for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
    int64_t at = plane_at(t, ch, c, hw);
    dx[at] = from_f32<T>(ps_bn_grad(to_f32(dy[at]), to_f32(x[at]), mean, is, a, mdy, mdyx));
  }
}

/* ---- bias, relu, cast --------------------------------------------------------------------- */

template <class T>
__global__ void bias_add(T *y, const void *bias, int f16, int64_t total, int64_t c, int64_t hw) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t ch = (t / hw) % c;
    float b = f16 ? __half2float(((const __half *)bias)[ch]) : ((const float *)bias)[ch];
    y[t] = from_f32<T>(to_f32(y[t]) + b);
  }
}

template <class T>
__global__ void bias_grad(const T *dy, void *dbias, int f16, int64_t n, int64_t c, int64_t hw,
                          int acc) {
  PS_SHARED(float, sh, [32][1]);
  int64_t ch = blockIdx.x;
  float s = channel_sum(dy, ch, c, hw, n * hw, sh);
  if (threadIdx.x == 0) {
    if (f16) {
      __half *p = (__half *)dbias + ch;
      *p = __float2half_rn(acc ? __half2float(*p) + s : s);
    } else {
      float *p = (float *)dbias + ch;
      *p = acc ? *p + s : s;
    }
  }
}

/* ReLU on the bits of fp16 (uint16_t) or fp32 (uint32_t) elements: the rules.h decisions. */
__device__ inline uint16_t relu_bits(uint16_t x) { return ps_relu_f16(x); }
__device__ inline uint32_t relu_bits(uint32_t x) { return ps_relu_f32(x); }
__device__ inline uint16_t relu_grad_bits(uint16_t y, uint16_t dy) {
  return ps_relu_grad_f16(y, dy);
}
__device__ inline uint32_t relu_grad_bits(uint32_t y, uint32_t dy) {
  return ps_relu_grad_f32(y, dy);
}

template <class U>
__global__ void relu_fwd(const U *x, U *y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    y[i] = relu_bits(x[i]);
  }
}

template <class U>
__global__ void relu_bwd(const U *dy, const U *y, U *dx, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    dx[i] = relu_grad_bits(y[i], dy[i]);
  }
}

__global__ void cast_kernel(const void *src, int sf16, void *dst, int df16, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = sf16 ? __half2float(((const __half *)src)[i]) : ((const float *)src)[i];
    if (df16)
      ((__half *)dst)[i] = __float2half_rn(v);
    else
      ((float *)dst)[i] = v;
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

__global__ void unscale_check(void *grad, int f16, int64_t n, const float *scale, float inv_value,
                              int in_place, int32_t *found_inf) {
  float inv = scale ? 1.0f / *scale : inv_value;
  bool bad = false;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    if (f16) {
      __half *p = (__half *)grad + i;
      bad |= ps_f16_nonfinite(__half_as_ushort(*p)) != 0;
      if (in_place) *p = __float2half_rn(__half2float(*p) * inv);
    } else {
      float *p = (float *)grad + i;
      bad |= !isfinite(*p);
      if (in_place) *p *= inv;
    }
  }
  if (bad) *found_inf = 1; /* every writer writes 1: a benign race */
}

__global__ void sgd_kernel(float *param, const void *grad, int f16, float *buf, __half *half_out,
                           int64_t n, float lr, float momentum, float dampening, float wd,
                           int nesterov, const float *scale, const int32_t *found_inf,
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
    float g = (f16 ? __half2float(((const __half *)grad)[i]) : ((const float *)grad)[i]) * inv;
    float p = ps_sgd_element(param[i], g, momentum != 0.0f ? buf + i : nullptr, lr, momentum,
                             dampening, wd, nesterov, fresh);
    param[i] = p;
    if (half_out) half_out[i] = __float2half_rn(p);
  }
}

__global__ void step_count_kernel(int32_t *steps_done, const int32_t *found_inf) {
  if (!(found_inf && *found_inf)) *steps_done += 1;
}

__global__ void scaler_update_kernel(float *scale, int32_t *tracker, const int32_t *found_inf,
                                     float growth, float backoff, int32_t interval) {
  ps_scaler_step(scale, tracker, *found_inf, growth, backoff, interval);
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
#define DTYPE_CHECK(dt) TRY(ps_check_dtype(__func__, #dt, (dt)))

constexpr int EW = 256; /* threads of elementwise and per-channel kernels */

}  // namespace

extern "C" {

PS_API int ps_nn_matmul(const void *a, const void *b, int32_t dtype, void *c, int32_t c_dtype,
                        int64_t m, int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                        int32_t accumulate, void *stream) {
  DTYPE_CHECK(dtype);
  DTYPE_CHECK(c_dtype);
  TRY(ps_check_matmul(m, n, k));
  if (m == 0 || n == 0) return PS_OK;
  /* k == 0: a and b are zero-byte tensors, whose pointers are NULL (zero-byte allocations
   * allocate nothing); c is still written (zeros, or left as is when accumulating), as on
   * the cpu backend. */
  NULL_CHECK(c);
  if (k > 0) NULL_CHECK(a, b);
  cudaStream_t st = (cudaStream_t)stream;
  StoreMat ep{.c = c, .n = n, .f16 = c_dtype == PS_NN_F16, .acc = accumulate != 0};
  int r = PS_OK;
  WITH_ACT(dtype, {
    Strided<T> A{.p = (const T *)a, .rs = trans_a ? 1 : k, .cs = trans_a ? m : 1};
    Strided<T> B{.p = (const T *)b, .rs = trans_b ? 1 : n, .cs = trans_b ? k : 1};
    r = gemm(m, n, k, 1, A, B, ep, st);
  });
  return r;
}

PS_API int ps_nn_conv2d_forward(const void *x, const void *w, void *y, int32_t dtype, int64_t n,
                                int64_t c, int64_t h, int64_t w_, int64_t co, int32_t kh,
                                int32_t kw, int32_t stride, int32_t pad, void *stream) {
  DTYPE_CHECK(dtype);
  ConvGeo g{}; /* {}: gcc cannot see that ps_conv_geometry fills it before any use */
  TRY(ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad));
  if (n == 0) return PS_OK;
  NULL_CHECK(x, w, y);
  int64_t K = c * kh * kw, P = g.oh * g.ow;
  int r = PS_OK;
  WITH_ACT(dtype, {
    Strided<T> A{.p = (const T *)w, .rs = K, .cs = 1};
    Im2col<T> B{(const T *)x, g};
    StoreConvY<T> ep{.y = (T *)y, .co = co, .P = P};
    r = gemm(co, n * P, K, 1, A, B, ep, (cudaStream_t)stream);
  });
  return r;
}

PS_API int ps_nn_conv2d_backward_data(const void *dy, const void *w, void *dx, int32_t dtype,
                                      int64_t n, int64_t c, int64_t h, int64_t w_, int64_t co,
                                      int32_t kh, int32_t kw, int32_t stride, int32_t pad,
                                      void *stream) {
  DTYPE_CHECK(dtype);
  ConvGeo g{}; /* {}: gcc cannot see that ps_conv_geometry fills it before any use */
  TRY(ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad));
  if (n == 0) return PS_OK;
  NULL_CHECK(dy, w, dx);
  int r = PS_OK;
  WITH_ACT(dtype, {
    WeightT<T> A{.w = (const T *)w, .g = g};
    DyGather<T> B{.dy = (const T *)dy, .g = g};
    StoreConvDx<T> ep{.dx = (T *)dx, .c = c, .HW = h * w_};
    r = gemm(c, n * h * w_, co * kh * kw, 1, A, B, ep, (cudaStream_t)stream);
  });
  return r;
}

PS_API int ps_nn_conv2d_backward_weight(const void *x, const void *dy, int32_t dtype, void *dw,
                                        int32_t dw_dtype, int64_t n, int64_t c, int64_t h,
                                        int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                        int32_t stride, int32_t pad, int32_t accumulate,
                                        void *stream) {
  DTYPE_CHECK(dtype);
  DTYPE_CHECK(dw_dtype);
  ConvGeo g{}; /* {}: gcc cannot see that ps_conv_geometry fills it before any use */
  TRY(ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad));
  /* n == 0 still writes dw (zeros, or unchanged when accumulating), like the cpu backend;
   * x and dy are then empty, NULL pointers, and the GEMM never reads them (T == 0). */
  NULL_CHECK(dw);
  if (n > 0) NULL_CHECK(x, dy);
  cudaStream_t st = (cudaStream_t)stream;
  int64_t K = c * kh * kw, P = g.oh * g.ow, cols = n * P, mn = co * K;
  /* Split the long (n, p) reduction so the few output tiles still fill the GPU: about 2
   * blocks per SM for a typical 100+ SM part, each chunk at least 8 BK steps. */
  int64_t tiles = ((co + BM - 1) / BM) * ((K + BN - 1) / BN);
  int64_t splits = 256 / (tiles > 0 ? tiles : 1);
  int64_t max_splits = cols / (8 * BK);
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  if (splits > 256) splits = 256;
  /* The partial sums live for this call only: ps_scratch_alloc takes them from the device's
   * default memory pool in stream order, or from cudaMalloc on a device without pools. */
  float *part = nullptr;
  TRY(ps_scratch_alloc((void **)&part, (size_t)(splits * mn) * sizeof(float), st));
  StorePartial ep{.part = part, .m = co, .n = K};
  int r = PS_OK;
  WITH_ACT(dtype, {
    DyRows<T> A{.dy = (const T *)dy, .co = co, .P = P};
    Im2colT<T> B{.col = Im2col<T>{.x = (const T *)x, .g = g}};
    r = gemm(co, K, cols, (int)splits, A, B, ep, st);
  });
  if (r == PS_OK) {
    PS_LAUNCH(reduce_partials, blocks_for(mn, EW), EW, 0, st, part, (int)splits, mn, dw,
              dw_dtype == PS_NN_F16, accumulate != 0);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) r = ps_record_cuda_error(e, "reduce_partials<<<>>>", __FILE__, __LINE__);
  }
  const int fr = ps_scratch_free(part, st);
  return r != PS_OK ? r : fr;
}

PS_API int ps_nn_maxpool2d_forward(const void *x, void *y, int32_t dtype, int32_t *indices,
                                   int64_t n, int64_t c, int64_t h, int64_t w_, int32_t kernel,
                                   int32_t stride, void *stream) {
  DTYPE_CHECK(dtype);
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
  DTYPE_CHECK(dtype);
  TRY(ps_check_maxpool_backward(n, c, h, w_, oh, ow));
  int64_t planes = n * c;
  if (planes == 0) return PS_OK;
  NULL_CHECK(dy, indices, dx);
  cudaStream_t st = (cudaStream_t)stream;
  CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)(planes * h * w_) * (dtype == PS_NN_F16 ? 2 : 4), st));
  WITH_ACT(dtype, PS_LAUNCH(maxpool_bwd<T>, blocks_for(planes * oh * ow, EW), EW, 0, st,
                            (const T *)dy, indices, (T *)dx, planes, h * w_, oh * ow));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
                                         void *y, int32_t dtype, float *save_mean,
                                         float *save_invstd, float *run_mean, float *run_var,
                                         int64_t n, int64_t c, int64_t hw, float momentum,
                                         float eps, void *stream) {
  DTYPE_CHECK(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  NULL_CHECK(x, gamma, beta, y, save_mean, save_invstd);
  WITH_ACT(dtype, PS_LAUNCH(bn_train<T>, (unsigned)c, EW, 0, (cudaStream_t)stream, (const T *)x,
                            gamma, beta, (T *)y, save_mean, save_invstd, run_mean, run_var, n, c,
                            hw, momentum, eps));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_batchnorm_forward_eval(const void *x, const float *gamma, const float *beta,
                                        const float *run_mean, const float *run_var, void *y,
                                        int32_t dtype, int64_t n, int64_t c, int64_t hw, float eps,
                                        void *stream) {
  DTYPE_CHECK(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  NULL_CHECK(x, gamma, beta, run_mean, run_var, y);
  WITH_ACT(dtype,
           PS_LAUNCH(bn_eval<T>, blocks_for(n * c * hw, EW), EW, 0, (cudaStream_t)stream,
                     (const T *)x, gamma, beta, run_mean, run_var, (T *)y, n * c * hw, c, hw, eps));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_batchnorm_backward(const void *dy, const void *x, const float *gamma,
                                    const float *save_mean, const float *save_invstd, void *dx,
                                    int32_t dtype, float *dgamma, float *dbeta, int64_t n,
                                    int64_t c, int64_t hw, void *stream) {
  DTYPE_CHECK(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  NULL_CHECK(dy, x, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  WITH_ACT(dtype, PS_LAUNCH(bn_bwd<T>, (unsigned)c, EW, 0, (cudaStream_t)stream, (const T *)dy,
                            (const T *)x, gamma, save_mean, save_invstd, (T *)dx, dgamma, dbeta, n,
                            c, hw));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_bias_add(void *y, int32_t dtype, const void *bias, int32_t bias_dtype, int64_t n,
                          int64_t c, int64_t hw, void *stream) {
  DTYPE_CHECK(dtype);
  DTYPE_CHECK(bias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  NULL_CHECK(y, bias);
  WITH_ACT(dtype, PS_LAUNCH(bias_add<T>, blocks_for(n * c * hw, EW), EW, 0, (cudaStream_t)stream,
                            (T *)y, bias, bias_dtype == PS_NN_F16, n * c * hw, c, hw));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_bias_grad(const void *dy, int32_t dtype, void *dbias, int32_t dbias_dtype,
                           int64_t n, int64_t c, int64_t hw, int32_t accumulate, void *stream) {
  DTYPE_CHECK(dtype);
  DTYPE_CHECK(dbias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  NULL_CHECK(dbias);
  if (n > 0) NULL_CHECK(dy);
  WITH_ACT(dtype, PS_LAUNCH(bias_grad<T>, (unsigned)c, EW, 0, (cudaStream_t)stream, (const T *)dy,
                            dbias, dbias_dtype == PS_NN_F16, n, c, hw, accumulate != 0));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_relu_forward(const void *x, void *y, int32_t dtype, int64_t count, void *stream) {
  DTYPE_CHECK(dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  NULL_CHECK(x, y);
  if (dtype == PS_NN_F16)
    PS_LAUNCH(relu_fwd<uint16_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint16_t *)x, (uint16_t *)y, count);
  else
    PS_LAUNCH(relu_fwd<uint32_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint32_t *)x, (uint32_t *)y, count);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_relu_backward(const void *dy, const void *y, void *dx, int32_t dtype,
                               int64_t count, void *stream) {
  DTYPE_CHECK(dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  NULL_CHECK(dy, y, dx);
  if (dtype == PS_NN_F16)
    PS_LAUNCH(relu_bwd<uint16_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint16_t *)dy, (const uint16_t *)y, (uint16_t *)dx, count);
  else
    PS_LAUNCH(relu_bwd<uint32_t>, blocks_for(count, EW), EW, 0, (cudaStream_t)stream,
              (const uint32_t *)dy, (const uint32_t *)y, (uint32_t *)dx, count);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_cross_entropy(const void *logits, const int32_t *labels, void *dlogits,
                               int32_t dtype, float *loss_sum, int32_t *correct, int64_t n,
                               int64_t k, float scale, const float *device_scale, void *stream) {
  DTYPE_CHECK(dtype);
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
  DTYPE_CHECK(src_dtype);
  DTYPE_CHECK(dst_dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  NULL_CHECK(src, dst);
  cudaStream_t st = (cudaStream_t)stream;
  if (src_dtype == dst_dtype) {
    /* memmove, as on the cpu backend: src and dst may overlap. */
    return ps_copy_d2d(dst, src, (size_t)count * (src_dtype == PS_NN_F16 ? 2 : 4), st);
  }
  PS_LAUNCH(cast_kernel, blocks_for(count, EW), EW, 0, st, src, src_dtype == PS_NN_F16, dst,
            dst_dtype == PS_NN_F16, count);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_unscale_check(void *grad, int32_t grad_dtype, int64_t count, const float *scale,
                               float inv_scale, int32_t in_place, int32_t *found_inf,
                               void *stream) {
  DTYPE_CHECK(grad_dtype);
  TRY(ps_check_count(__func__, count));
  NULL_CHECK(found_inf);
  if (count == 0) return PS_OK;
  NULL_CHECK(grad);
  PS_LAUNCH(unscale_check, blocks_for(count, EW), EW, 0, (cudaStream_t)stream, grad,
            grad_dtype == PS_NN_F16, count, scale, inv_scale, in_place, found_inf);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_sgd_step(float *param, const void *grad, int32_t grad_dtype, float *momentum_buf,
                          void *param_half, int64_t count, float lr, float momentum,
                          float dampening, float weight_decay, int32_t nesterov, const float *scale,
                          const int32_t *found_inf, const int32_t *steps_done, const float *hyper,
                          void *stream) {
  DTYPE_CHECK(grad_dtype);
  TRY(ps_check_sgd(count, momentum, momentum_buf));
  if (count == 0) return PS_OK;
  NULL_CHECK(param, grad);
  PS_LAUNCH(sgd_kernel, blocks_for(count, EW), EW, 0, (cudaStream_t)stream, param, grad,
            grad_dtype == PS_NN_F16, momentum_buf, (__half *)param_half, count, lr, momentum,
            dampening, weight_decay, nesterov, scale, found_inf, steps_done, hyper);
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
