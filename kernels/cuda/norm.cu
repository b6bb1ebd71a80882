/*
 * norm.cu — CUDA backend of the per-channel kernels over [n, c, hw] (kernels/cpu/norm.c is the
 * CPU twin): batch normalization, bias add and bias gradient. Reductions use one block per
 * channel with a fixed tree, so results are deterministic.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "../pinstream.h"
#include "nn.cuh"

namespace {

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

/* ---- bias ------------------------------------------------------------------------------------ */

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

}  // namespace

extern "C" {

PS_API int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
                                         void *y, int32_t dtype, float *save_mean,
                                         float *save_invstd, float *run_mean, float *run_var,
                                         int64_t n, int64_t c, int64_t hw, float momentum,
                                         float eps, void *stream) {
  CHECK_DTYPE(dtype);
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
  CHECK_DTYPE(dtype);
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
  CHECK_DTYPE(dtype);
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
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(bias_dtype);
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
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(dbias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  NULL_CHECK(dbias);
  if (n > 0) NULL_CHECK(dy);
  WITH_ACT(dtype, PS_LAUNCH(bias_grad<T>, (unsigned)c, EW, 0, (cudaStream_t)stream, (const T *)dy,
                            dbias, dbias_dtype == PS_NN_F16, n, c, hw, accumulate != 0));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"
