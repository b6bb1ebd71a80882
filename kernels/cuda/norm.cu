/*
 * norm.cu — CUDA backend of the per-channel kernels over [n, c, hw] (kernels/cpu/norm.c is the
 * CPU twin): batch normalization, bias add and bias gradient. Reductions use a fixed tree, so
 * results are deterministic.
 *
 * Batch norm in training (ReLU fused in or not) cuts each channel's samples into the groups of
 * rules.h (ps_bn_groups, a partition that depends on the shape only), one block per (group,
 * channel), so a 32-channel layer runs ~1024 blocks instead of 32. Two launches a direction:
 *
 *   statistics   each block reduces its group (forward: its mean, then squared deviations from
 *                it; backward: sum dy and sum dy * xhat) into the workspace;
 *   apply        each block merges its channel's partials in group order (the same fixed order
 *                in every block, so every block gets the same bits), writes its group's output,
 *                and the group-0 block writes the per-channel results.
 *
 * Elements are read 16 bytes at a time when a plane allows it (hw a multiple of 8 fp16 or 4
 * fp32 values and 16-byte aligned tensors), with 32-bit index arithmetic and one 32-bit division
 * per vector, none per element. ReLU acts on the stored value's bits and its gradient on the
 * output's bits (rules.h), as the separate ReLU kernels would.
 */
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include <initializer_list>

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

/* A block per [n, c] plane (grid-stride over planes): the channel's affine once per plane, then
 * the plane's contiguous hw values, all in 32-bit index arithmetic. */
template <class T>
__global__ void bn_eval(const T *x, const float *gamma, const float *beta, const float *run_mean,
                        const float *run_var, T *y, uint32_t planes, uint32_t c, uint32_t hw,
                        float eps) {
  for (uint32_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const uint32_t ch = p % c;
    float a, b;
    ps_bn_eval_affine(gamma[ch], beta[ch], run_mean[ch], run_var[ch], eps, &a, &b);
    const T *xp = x + (int64_t)p * hw;
    T *yp = y + (int64_t)p * hw;
    for (uint32_t j = threadIdx.x; j < hw; j += blockDim.x)
      yp[j] = from_f32<T>(to_f32(xp[j]) * a + b);
  }
}

/* ---- bias ------------------------------------------------------------------------------------ */

template <class T>
__global__ void bias_add(T *y, const void *bias, int32_t bias_dt, int64_t total, int64_t c,
                         int64_t hw) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t ch = (t / hw) % c;
    float b = act_get(bias, bias_dt, ch);
    y[t] = from_f32<T>(to_f32(y[t]) + b);
  }
}

template <class T>
__global__ void bias_grad(const T *dy, void *dbias, int32_t dbias_dt, int64_t n, int64_t c,
                          int64_t hw, int acc) {
  PS_SHARED(float, sh, [32][1]);
  int64_t ch = blockIdx.x;
  float s = channel_sum(dy, ch, c, hw, n * hw, sh);
  if (threadIdx.x == 0) act_set(dbias, dbias_dt, ch, acc ? act_get(dbias, dbias_dt, ch) + s : s);
}

/* ---- batch normalization in training: two phases over a fixed partition ---------------- */

constexpr int BT = EW; /* threads of a batch-norm block (block_sum takes 256) */

/* Stores v as T, then applies the activation to the stored bits. */
__device__ inline __half bn_out(float v, __half, int relu) {
  __half h = __float2half_rn(v);
  return relu ? __ushort_as_half(ps_relu_f16(__half_as_ushort(h))) : h;
}
__device__ inline __nv_bfloat16 bn_out(float v, __nv_bfloat16, int relu) {
  const uint16_t h = ps_bf16_from_f32(v);
  return __ushort_as_bfloat16(relu ? ps_relu_bf16(h) : h);
}
__device__ inline float bn_out(float v, float, int relu) {
  return relu ? __uint_as_float(ps_relu_f32(__float_as_uint(v))) : v;
}

/* dy masked by the forward's output y > 0 (when relu), as fp32. */
__device__ inline float bn_dy(__half dy, __half y, int relu) {
  return relu ? __half2float(
                    __ushort_as_half(ps_relu_grad_f16(__half_as_ushort(y), __half_as_ushort(dy))))
              : __half2float(dy);
}
__device__ inline float bn_dy(__nv_bfloat16 dy, __nv_bfloat16 y, int relu) {
  const uint16_t d = __bfloat16_as_ushort(dy);
  return ps_bf16_to_f32(relu ? ps_relu_grad_bf16(__bfloat16_as_ushort(y), d) : d);
}
__device__ inline float bn_dy(float dy, float y, int relu) {
  return relu ? __uint_as_float(ps_relu_grad_f32(__float_as_uint(y), __float_as_uint(dy))) : dy;
}

/* 16 bytes of elements, loaded and stored whole. */
struct alignas(16) Pack {
  uint32_t w[4];
};

template <class T, int V>
__device__ inline void load_v(const T *p, T (&v)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    Pack k = *reinterpret_cast<const Pack *>(p);
    memcpy(&v, &k, 16);
  } else {
    for (int e = 0; e < V; e++) v[e] = p[e];
  }
}

template <class T, int V>
__device__ inline void store_v(T *p, const T (&v)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    Pack k;
    memcpy(&k, &v, 16);
    *reinterpret_cast<Pack *>(p) = k;
  } else {
    for (int e = 0; e < V; e++) p[e] = v[e];
  }
}

/* Where a block works: channel ch, samples [s0, s1) of its group. */
struct Group {
  int32_t ch, g, s0, s1;
};

__device__ inline Group bn_group(int32_t n, int32_t groups) {
  Group q;
  q.ch = (int32_t)(blockIdx.x / (uint32_t)groups);
  q.g = (int32_t)(blockIdx.x - (uint32_t)q.ch * (uint32_t)groups);
  q.s0 = (int32_t)ps_bn_group_start(n, groups, q.g);
  q.s1 = (int32_t)ps_bn_group_start(n, groups, q.g + 1);
  return q;
}

/* Calls f(offset of the vector's first element, vector index) for the block's share of the
 * V-element vectors of its group's planes: plane i of the group is sample s0 + i, hwv = hw / V
 * vectors each. */
template <int V, class F>
__device__ inline void for_group(const Group &q, int32_t c, int32_t hw, F f) {
  const uint32_t hwv = (uint32_t)hw / V, nv = (uint32_t)(q.s1 - q.s0) * hwv;
  for (uint32_t t = threadIdx.x; t < nv; t += BT) {
    const uint32_t i = t / hwv, j = t - i * hwv;
    f(((int64_t)(q.s0 + (int32_t)i) * c + q.ch) * hw + (int64_t)j * V);
  }
}

template <class T, int V>
__global__ void bn_stats(const T *x, float *work, int32_t n, int32_t c, int32_t hw,
                         int32_t groups) {
  PS_SHARED(float, sh, [BT / 32][1]);
  const Group q = bn_group(n, groups);
  float v[1] = {0.0f};
  for_group<V>(q, c, hw, [&](int64_t at) {
    T e[V];
    load_v<T, V>(x + at, e);
    for (int k = 0; k < V; k++) v[0] += to_f32(e[k]);
  });
  block_sum<1>(v, sh);
  const float mb = v[0] / (float)((int64_t)(q.s1 - q.s0) * hw);
  v[0] = 0.0f;
  for_group<V>(q, c, hw, [&](int64_t at) {
    T e[V];
    load_v<T, V>(x + at, e);
    for (int k = 0; k < V; k++) {
      const float d = to_f32(e[k]) - mb;
      v[0] += d * d;
    }
  });
  block_sum<1>(v, sh);
  if (threadIdx.x == 0) {
    float *w = work + 3 * (int64_t)blockIdx.x;
    w[0] = mb;
    w[1] = v[0];
    w[2] = __int_as_float((int32_t)(q.s1 - q.s0) * hw); /* n * hw fits an int32 */
  }
}

template <class T, int V>
__global__ void bn_apply(const T *x, const float *gamma, const float *beta, T *y, float *save_mean,
                         float *save_invstd, float *run_mean, float *run_var, float *run_backup,
                         const float *work, int32_t n, int32_t c, int32_t hw, int32_t groups,
                         float momentum, float eps, int relu) {
  PS_SHARED(float, ab, [2]);
  const Group q = bn_group(n, groups);
  if (threadIdx.x == 0) {
    int64_t cnt = 0;
    float mean = 0.0f, m2 = 0.0f;
    const float *w = work + 3 * (int64_t)q.ch * groups;
    for (int32_t g = 0; g < groups; g++)
      ps_bn_merge(&cnt, &mean, &m2, __float_as_int(w[3 * g + 2]), w[3 * g], w[3 * g + 1]);
    const float invstd = ps_bn_invstd(m2, cnt, eps);
    if (q.g == 0) {
      save_mean[q.ch] = mean;
      save_invstd[q.ch] = invstd;
      if (run_backup) {
        run_backup[q.ch] = run_mean ? run_mean[q.ch] : 0.0f;
        run_backup[c + q.ch] = run_var ? run_var[q.ch] : 0.0f;
      }
      if (run_mean) run_mean[q.ch] = ps_bn_running(run_mean[q.ch], mean, momentum);
      if (run_var) run_var[q.ch] = ps_bn_running(run_var[q.ch], ps_bn_unbiased(m2, cnt), momentum);
    }
    ps_bn_affine(gamma[q.ch], beta[q.ch], mean, invstd, &ab[0], &ab[1]);
  }
  __syncthreads();
  const float a = ab[0], b = ab[1];
  for_group<V>(q, c, hw, [&](int64_t at) {
    T e[V];
    load_v<T, V>(x + at, e);
    for (int k = 0; k < V; k++) e[k] = bn_out(to_f32(e[k]) * a + b, e[k], relu);
    store_v<T, V>(y + at, e);
  });
}

template <class T, int V>
__global__ void bn_grad_stats(const T *dy, const T *x, const T *y, const float *save_mean,
                              const float *save_invstd, float *work, int32_t n, int32_t c,
                              int32_t hw, int32_t groups, int relu) {
  PS_SHARED(float, sh, [BT / 32][2]);
  const Group q = bn_group(n, groups);
  const float mean = save_mean[q.ch], is = save_invstd[q.ch];
  float v[2] = {0.0f, 0.0f};
  for_group<V>(q, c, hw, [&](int64_t at) {
    T d[V], e[V], o[V];
    load_v<T, V>(dy + at, d);
    load_v<T, V>(x + at, e);
    if (relu) load_v<T, V>(y + at, o);
    for (int k = 0; k < V; k++) {
      const float g = bn_dy(d[k], relu ? o[k] : d[k], relu);
      v[0] += g;
      v[1] += g * ((to_f32(e[k]) - mean) * is);
    }
  });
  block_sum<2>(v, sh);
  if (threadIdx.x == 0) {
    float *w = work + 3 * (int64_t)blockIdx.x;
    w[0] = v[0];
    w[1] = v[1];
  }
}

template <class T, int V>
__global__ void bn_grad_apply(const T *dy, const T *x, const T *y, const float *gamma,
                              const float *save_mean, const float *save_invstd, T *dx,
                              float *dgamma, float *dbeta, const float *work, int32_t n, int32_t c,
                              int32_t hw, int32_t groups, int relu) {
  PS_SHARED(float, sums, [2]);
  const Group q = bn_group(n, groups);
  if (threadIdx.x == 0) {
    float sdy = 0.0f, sdyx = 0.0f;
    const float *w = work + 3 * (int64_t)q.ch * groups;
    for (int32_t g = 0; g < groups; g++) {
      sdy += w[3 * g];
      sdyx += w[3 * g + 1];
    }
    if (q.g == 0) {
      dbeta[q.ch] = sdy;
      dgamma[q.ch] = sdyx;
    }
    sums[0] = sdy;
    sums[1] = sdyx;
  }
  __syncthreads();
  const int64_t cnt = (int64_t)n * hw;
  const float mean = save_mean[q.ch], is = save_invstd[q.ch], a = gamma[q.ch] * is;
  const float mdy = sums[0] / (float)cnt, mdyx = sums[1] / (float)cnt;
  for_group<V>(q, c, hw, [&](int64_t at) {
    T d[V], e[V], o[V];
    load_v<T, V>(dy + at, d);
    load_v<T, V>(x + at, e);
    if (relu) load_v<T, V>(y + at, o);
    for (int k = 0; k < V; k++) {
      const float g = bn_dy(d[k], relu ? o[k] : d[k], relu);
      d[k] = bn_out(ps_bn_grad(g, to_f32(e[k]), mean, is, a, mdy, mdyx), d[k], 0);
    }
    store_v<T, V>(dx + at, d);
  });
}

/* Whether every plane of these tensors starts on a 16-byte boundary. */
inline bool bn_vectors(int64_t hw, int32_t dtype, std::initializer_list<const void *> ptrs) {
  const int64_t v = dtype == PS_NN_F32 ? 4 : 8;
  if (hw % v != 0) return false;
  for (const void *p : ptrs)
    if (p && ((uintptr_t)p & 15u) != 0) return false;
  return true;
}

/* Runs the statements with V = `width` (vectorized) or 1, T already defined. */
#define BN_WIDTH(vec, width, ...) \
  do {                            \
    if (vec) {                    \
      constexpr int V = (width);  \
      __VA_ARGS__;                \
    } else {                      \
      constexpr int V = 1;        \
      __VA_ARGS__;                \
    }                             \
  } while (0)

/* Runs the statements with T the activation type and V the vector width (16 bytes). */
#define BN_DISPATCH(dtype, vec, ...)    \
  do {                                  \
    if ((dtype) == PS_NN_F16) {         \
      using T = __half;                 \
      BN_WIDTH(vec, 8, __VA_ARGS__);    \
    } else if ((dtype) == PS_NN_BF16) { \
      using T = __nv_bfloat16;          \
      BN_WIDTH(vec, 8, __VA_ARGS__);    \
    } else {                            \
      using T = float;                  \
      BN_WIDTH(vec, 4, __VA_ARGS__);    \
    }                                   \
  } while (0)

/* The kernels' 32-bit index arithmetic: a channel's n * hw values fit an int32. */
inline int bn_check_int32(const char *fn, int64_t n, int64_t c, int64_t hw) {
  if (n * hw > INT32_MAX)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: shape n=%lld c=%lld hw=%lld too large", fn, (long long)n,
            (long long)c, (long long)hw);
  return PS_OK;
}

}  // namespace

extern "C" {

PS_API int ps_nn_batchnorm_workspace(int64_t n, int64_t c, int64_t hw, int64_t *floats) {
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  if (!floats) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: null out", __func__);
  *floats = ps_bn_work_floats(n, c, hw);
  return PS_OK;
}

PS_API int ps_nn_batchnorm_act_forward_train(const void *x, const float *gamma, const float *beta,
                                             void *y, int32_t dtype, float *save_mean,
                                             float *save_invstd, float *run_mean, float *run_var,
                                             float *run_backup, float *work, int64_t work_floats,
                                             int64_t n, int64_t c, int64_t hw, float momentum,
                                             float eps, int32_t act, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  TRY(ps_check_bn_work(__func__, work, work_floats, n, c, hw, act));
  TRY(bn_check_int32(__func__, n, c, hw));
  NULL_CHECK(x, gamma, beta, y, save_mean, save_invstd);
  cudaStream_t st = (cudaStream_t)stream;
  const int32_t groups = ps_bn_groups(n, c, hw);
  const unsigned blocks = (unsigned)(c * groups);
  float *w = work;
  if (!w) TRY(ps_scratch_alloc((void **)&w, (size_t)ps_bn_work_floats(n, c, hw) * 4, st));
  const bool vec = bn_vectors(hw, dtype, {x, y});
  const int relu = act == PS_BN_RELU;
  int r = PS_OK;
  BN_DISPATCH(dtype, vec, {
    PS_LAUNCH((bn_stats<T, V>), blocks, BT, 0, st, (const T *)x, w, (int32_t)n, (int32_t)c,
              (int32_t)hw, groups);
    PS_LAUNCH((bn_apply<T, V>), blocks, BT, 0, st, (const T *)x, gamma, beta, (T *)y, save_mean,
              save_invstd, run_mean, run_var, run_backup, (const float *)w, (int32_t)n, (int32_t)c,
              (int32_t)hw, groups, momentum, eps, relu);
  });
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) r = ps_record_cuda_error(e, "bn_stats/bn_apply<<<>>>", __FILE__, __LINE__);
  if (!work) {
    const int fr = ps_scratch_free(w, st);
    if (r == PS_OK) r = fr;
  }
  return r;
}

PS_API int ps_nn_batchnorm_act_backward(const void *dy, const void *x, const void *y,
                                        const float *gamma, const float *save_mean,
                                        const float *save_invstd, void *dx, int32_t dtype,
                                        float *dgamma, float *dbeta, float *work,
                                        int64_t work_floats, int64_t n, int64_t c, int64_t hw,
                                        int32_t act, void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  TRY(ps_check_bn_work(__func__, work, work_floats, n, c, hw, act));
  TRY(bn_check_int32(__func__, n, c, hw));
  NULL_CHECK(dy, x, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  const int relu = act == PS_BN_RELU;
  if (relu) NULL_CHECK(y);
  cudaStream_t st = (cudaStream_t)stream;
  const int32_t groups = ps_bn_groups(n, c, hw);
  const unsigned blocks = (unsigned)(c * groups);
  float *w = work;
  if (!w) TRY(ps_scratch_alloc((void **)&w, (size_t)ps_bn_work_floats(n, c, hw) * 4, st));
  const bool vec = bn_vectors(hw, dtype, {dy, x, relu ? y : nullptr, dx});
  int r = PS_OK;
  BN_DISPATCH(dtype, vec, {
    PS_LAUNCH((bn_grad_stats<T, V>), blocks, BT, 0, st, (const T *)dy, (const T *)x, (const T *)y,
              save_mean, save_invstd, w, (int32_t)n, (int32_t)c, (int32_t)hw, groups, relu);
    PS_LAUNCH((bn_grad_apply<T, V>), blocks, BT, 0, st, (const T *)dy, (const T *)x, (const T *)y,
              gamma, save_mean, save_invstd, (T *)dx, dgamma, dbeta, (const float *)w, (int32_t)n,
              (int32_t)c, (int32_t)hw, groups, relu);
  });
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    r = ps_record_cuda_error(e, "bn_grad_stats/bn_grad_apply<<<>>>", __FILE__, __LINE__);
  if (!work) {
    const int fr = ps_scratch_free(w, st);
    if (r == PS_OK) r = fr;
  }
  return r;
}

PS_API int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
                                         void *y, int32_t dtype, float *save_mean,
                                         float *save_invstd, float *run_mean, float *run_var,
                                         int64_t n, int64_t c, int64_t hw, float momentum,
                                         float eps, void *stream) {
  /* Checked here so that the refusal names this function. */
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  return ps_nn_batchnorm_act_forward_train(x, gamma, beta, y, dtype, save_mean, save_invstd,
                                           run_mean, run_var, nullptr, nullptr, 0, n, c, hw,
                                           momentum, eps, 0, stream);
}

PS_API int ps_nn_batchnorm_forward_eval(const void *x, const float *gamma, const float *beta,
                                        const float *run_mean, const float *run_var, void *y,
                                        int32_t dtype, int64_t n, int64_t c, int64_t hw, float eps,
                                        void *stream) {
  CHECK_DTYPE(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  NULL_CHECK(x, gamma, beta, run_mean, run_var, y);
  if (n * c > UINT32_MAX || hw > UINT32_MAX)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: shape n=%lld c=%lld hw=%lld too large", __func__,
            (long long)n, (long long)c, (long long)hw);
  WITH_ACT(dtype, PS_LAUNCH(bn_eval<T>, (unsigned)(n * c < 65535 * 16 ? n * c : 65535 * 16), EW, 0,
                            (cudaStream_t)stream, (const T *)x, gamma, beta, run_mean, run_var,
                            (T *)y, (uint32_t)(n * c), (uint32_t)c, (uint32_t)hw, eps));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

PS_API int ps_nn_batchnorm_backward(const void *dy, const void *x, const float *gamma,
                                    const float *save_mean, const float *save_invstd, void *dx,
                                    int32_t dtype, float *dgamma, float *dbeta, int64_t n,
                                    int64_t c, int64_t hw, void *stream) {
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  return ps_nn_batchnorm_act_backward(dy, x, nullptr, gamma, save_mean, save_invstd, dx, dtype,
                                      dgamma, dbeta, nullptr, 0, n, c, hw, 0, stream);
}

PS_API int ps_nn_bias_add(void *y, int32_t dtype, const void *bias, int32_t bias_dtype, int64_t n,
                          int64_t c, int64_t hw, void *stream) {
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(bias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  NULL_CHECK(y, bias);
  WITH_ACT(dtype, PS_LAUNCH(bias_add<T>, blocks_for(n * c * hw, EW), EW, 0, (cudaStream_t)stream,
                            (T *)y, bias, bias_dtype, n * c * hw, c, hw));
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
                            dbias, dbias_dtype, n, c, hw, accumulate != 0));
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"
