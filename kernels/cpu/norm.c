/*
 * norm.c — CPU backend of the per-channel kernels over [n, c, hw] (kernels/cuda/norm.cu is the
 * CUDA twin): batch normalization (train, eval, backward) and the bias add and gradient.
 * Each runs a range of channels (or rows) per task of the thread pool; every channel's sums
 * are computed by one task in a fixed order, so results do not depend on the scheduling.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "nn.h"
#include "threads.h"

/* ---- batch normalization ------------------------------------------------------------- */

/* Batch norm walks each channel plane in chunks converted to fp32 with h2f_row, and reduces
 * them in 16 independent float lanes: GCC 12 neither vectorizes _Float16 conversions nor a
 * reduction into one accumulator (a serial chain of dependent adds, in double it was ~10x
 * slower than memory speed). Lane sums cover at most BN_CHUNK values; chunks add up in
 * double, so accuracy does not depend on the batch size. */
#define BN_CHUNK 1024
#define BN_LANES 16

static inline float lanes_total(const float acc[BN_LANES]) {
  float t = 0.0f;
  for (int l = 0; l < BN_LANES; l++) t += acc[l];
  return t;
}

static float chunk_sum(const float *v, int64_t n) {
  float acc[BN_LANES] = {0};
  int64_t j = 0;
  for (; j + BN_LANES <= n; j += BN_LANES)
    for (int l = 0; l < BN_LANES; l++) acc[l] += v[j + l];
  for (; j < n; j++) acc[0] += v[j];
  return lanes_total(acc);
}

static float chunk_sqdev(const float *v, int64_t n, float mean) {
  float acc[BN_LANES] = {0};
  int64_t j = 0;
  for (; j + BN_LANES <= n; j += BN_LANES)
    for (int l = 0; l < BN_LANES; l++) {
      float d = v[j + l] - mean;
      acc[l] += d * d;
    }
  for (; j < n; j++) acc[0] += (v[j] - mean) * (v[j] - mean);
  return lanes_total(acc);
}

/* ReLU in place on m stored activations at element offset `at`, on their bits (rules.h). */
static void relu_stored(void *y, int32_t dt, int64_t at, int64_t m) {
  if (dt == PS_NN_F16) {
    uint16_t *q = (uint16_t *)y + at;
    for (int64_t j = 0; j < m; j++) q[j] = ps_relu_f16(q[j]);
  } else if (dt == PS_NN_BF16) {
    uint16_t *q = (uint16_t *)y + at;
    for (int64_t j = 0; j < m; j++) q[j] = ps_relu_bf16(q[j]);
  } else {
    uint32_t *q = (uint32_t *)y + at;
    for (int64_t j = 0; j < m; j++) q[j] = ps_relu_f32(q[j]);
  }
}

/* y = x * a + b (then ReLU when relu) over the plane of hw values at element offset `at`
 * (dtype dt). The ReLU acts on the stored value, as a separate ReLU would. */
static void plane_affine(const void *x, void *y, int32_t dt, int64_t at, int64_t hw, float a,
                         float b, int relu) {
  float buf[BN_CHUNK];
  for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
    int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
    act_load(x, dt, at + j0, buf, m);
    for (int64_t j = 0; j < m; j++) buf[j] = buf[j] * a + b;
    act_store(buf, y, dt, at + j0, m);
    if (relu) relu_stored(y, dt, at + j0, m);
  }
}

/* dy as fp32, masked by the forward's output y > 0 first when relu (ps_relu_grad on the bits,
 * as ps_nn_relu_backward would have written it). */
static void load_dy(const void *dy, const void *y, int32_t dt, int relu, int64_t at, float *d,
                    int64_t m) {
  if (!relu) {
    act_load(dy, dt, at, d, m);
    return;
  }
  if (dt == PS_NN_F16) {
    uint16_t g[BN_CHUNK];
    const uint16_t *a = (const uint16_t *)dy + at, *o = (const uint16_t *)y + at;
    for (int64_t j = 0; j < m; j++) g[j] = ps_relu_grad_f16(o[j], a[j]);
    h2f_row((const half *)g, d, m);
  } else if (dt == PS_NN_BF16) {
    const uint16_t *a = (const uint16_t *)dy + at, *o = (const uint16_t *)y + at;
    for (int64_t j = 0; j < m; j++) d[j] = ps_bf16_to_f32(ps_relu_grad_bf16(o[j], a[j]));
  } else {
    const uint32_t *a = (const uint32_t *)dy + at, *o = (const uint32_t *)y + at;
    for (int64_t j = 0; j < m; j++) {
      uint32_t v = ps_relu_grad_f32(o[j], a[j]);
      memcpy(d + j, &v, 4);
    }
  }
}

/* ps_nn_batchnorm_act_forward_train over channels [c0, c1). */
typedef struct {
  const void *x;
  void *y; /* x and y fp16 when dt, else fp32 */
  int32_t dt;
  int relu;
  const float *gamma, *beta;
  float *save_mean, *save_invstd, *run_mean, *run_var; /* run_* may be NULL */
  float *run_backup;                                   /* may be NULL */
  int64_t n, c, hw;
  float momentum, eps;
} bn_train_ctx;

static void bn_train_range(void *vctx, int64_t c0, int64_t c1) {
  const bn_train_ctx *k = vctx;
  const void *xh = k->x;
  void *yh = k->y;
  const int32_t dt = k->dt;
  const float *gamma = k->gamma, *beta = k->beta;
  float *save_mean = k->save_mean, *save_invstd = k->save_invstd;
  float *run_mean = k->run_mean, *run_var = k->run_var, momentum = k->momentum, eps = k->eps;
  int64_t n = k->n, c = k->c, hw = k->hw;
  const int32_t groups = ps_bn_groups(n, c, hw);
  float buf[BN_CHUNK];
  for (int64_t ch = c0; ch < c1; ch++) {
    /* Per group (rules.h): its mean, then its squared deviations from it (two passes: no
     * cancellation); the groups merge in order. */
    int64_t cnt = 0;
    float mean = 0.0f, m2 = 0.0f;
    for (int32_t gi = 0; gi < groups; gi++) {
      const int64_t s0 = ps_bn_group_start(n, groups, gi);
      const int64_t s1 = ps_bn_group_start(n, groups, gi + 1);
      double s = 0.0;
      for (int64_t i = s0; i < s1; i++) {
        const int64_t p = (i * c + ch) * hw;
        for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
          int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
          act_load(xh, dt, p + j0, buf, m);
          s += chunk_sum(buf, m);
        }
      }
      const int64_t cb = (s1 - s0) * hw;
      const float mb = (float)(s / (double)cb);
      double ss = 0.0;
      for (int64_t i = s0; i < s1; i++) {
        const int64_t p = (i * c + ch) * hw;
        for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
          int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
          act_load(xh, dt, p + j0, buf, m);
          ss += chunk_sqdev(buf, m, mb);
        }
      }
      ps_bn_merge(&cnt, &mean, &m2, cb, mb, (float)ss);
    }
    float invstd = ps_bn_invstd(m2, cnt, eps);
    save_mean[ch] = mean;
    save_invstd[ch] = invstd;
    if (k->run_backup) {
      k->run_backup[ch] = run_mean ? run_mean[ch] : 0.0f;
      k->run_backup[c + ch] = run_var ? run_var[ch] : 0.0f;
    }
    if (run_mean) run_mean[ch] = ps_bn_running(run_mean[ch], mean, momentum);
    if (run_var) run_var[ch] = ps_bn_running(run_var[ch], ps_bn_unbiased(m2, cnt), momentum);
    float a, b;
    ps_bn_affine(gamma[ch], beta[ch], mean, invstd, &a, &b);
    for (int64_t i = 0; i < n; i++) plane_affine(xh, yh, dt, (i * c + ch) * hw, hw, a, b, k->relu);
  }
}

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
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  TRY(ps_check_bn_work(__func__, work, work_floats, n, c, hw, act));
  CHECK_RANGE(x, n * c * hw * dtsize(dtype));
  CHECK_RANGE(y, n * c * hw * dtsize(dtype));
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(beta, c * 4);
  CHECK_RANGE(save_mean, c * 4);
  CHECK_RANGE(save_invstd, c * 4);
  if (run_mean) CHECK_RANGE(run_mean, c * 4);
  if (run_var) CHECK_RANGE(run_var, c * 4);
  if (run_backup) CHECK_RANGE(run_backup, 2 * c * 4);
  /* The partials stay in each task's locals: the workspace is checked, not needed. */
  if (work) CHECK_RANGE(work, ps_bn_work_floats(n, c, hw) * 4);
  bn_train_ctx k = {.x = x,
                    .y = y,
                    .dt = dtype,
                    .relu = act == PS_BN_RELU,
                    .gamma = gamma,
                    .beta = beta,
                    .save_mean = save_mean,
                    .save_invstd = save_invstd,
                    .run_mean = run_mean,
                    .run_var = run_var,
                    .run_backup = run_backup,
                    .n = n,
                    .c = c,
                    .hw = hw,
                    .momentum = momentum,
                    .eps = eps};
  ps_pool_range(c, 1, n * c * hw, bn_train_range, &k);
  return PS_OK;
}

PS_API int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
                                         void *y, int32_t dtype, float *save_mean,
                                         float *save_invstd, float *run_mean, float *run_var,
                                         int64_t n, int64_t c, int64_t hw, float momentum,
                                         float eps, void *stream) {
  /* Checked here so that the refusal names this function. */
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  return ps_nn_batchnorm_act_forward_train(x, gamma, beta, y, dtype, save_mean, save_invstd,
                                           run_mean, run_var, NULL, NULL, 0, n, c, hw, momentum,
                                           eps, 0, stream);
}

/* ps_nn_batchnorm_forward_eval over channels [c0, c1). */
typedef struct {
  const void *x;
  void *y; /* x and y fp16 when dt, else fp32 */
  int32_t dt;
  const float *gamma, *beta, *run_mean, *run_var;
  int64_t n, c, hw;
  float eps;
} bn_eval_ctx;

static void bn_eval_range(void *vctx, int64_t c0, int64_t c1) {
  const bn_eval_ctx *k = vctx;
  const void *x = k->x;
  void *y = k->y;
  const float *gamma = k->gamma, *beta = k->beta, *run_mean = k->run_mean, *run_var = k->run_var;
  float eps = k->eps;
  int64_t n = k->n, c = k->c, hw = k->hw;
  for (int64_t ch = c0; ch < c1; ch++) {
    float a, b;
    ps_bn_eval_affine(gamma[ch], beta[ch], run_mean[ch], run_var[ch], eps, &a, &b);
    for (int64_t i = 0; i < n; i++) plane_affine(x, y, k->dt, (i * c + ch) * hw, hw, a, b, 0);
  }
}

PS_API int ps_nn_batchnorm_forward_eval(const void *x, const float *gamma, const float *beta,
                                        const float *run_mean, const float *run_var, void *y,
                                        int32_t dtype, int64_t n, int64_t c, int64_t hw, float eps,
                                        void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  CHECK_RANGE(x, n * c * hw * dtsize(dtype));
  CHECK_RANGE(y, n * c * hw * dtsize(dtype));
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(beta, c * 4);
  CHECK_RANGE(run_mean, c * 4);
  CHECK_RANGE(run_var, c * 4);
  bn_eval_ctx k = {.x = x,
                   .y = y,
                   .dt = dtype,
                   .gamma = gamma,
                   .beta = beta,
                   .run_mean = run_mean,
                   .run_var = run_var,
                   .n = n,
                   .c = c,
                   .hw = hw,
                   .eps = eps};
  ps_pool_range(c, 1, n * c * hw, bn_eval_range, &k);
  return PS_OK;
}

/* ps_nn_batchnorm_act_backward over channels [c0, c1). */
typedef struct {
  const void *x, *dy, *y;
  void *dx; /* x, dy, y and dx fp16 when dt, else fp32 */
  int32_t dt;
  int relu;
  const float *gamma, *save_mean, *save_invstd;
  float *dgamma, *dbeta;
  int64_t n, c, hw;
} bn_bwd_ctx;

static void bn_bwd_range(void *vctx, int64_t c0, int64_t c1) {
  const bn_bwd_ctx *k = vctx;
  const void *x = k->x, *dy = k->dy, *y = k->y;
  void *dx = k->dx;
  const int32_t dt = k->dt;
  const int relu = k->relu;
  const float *gamma = k->gamma, *save_mean = k->save_mean, *save_invstd = k->save_invstd;
  float *dgamma = k->dgamma, *dbeta = k->dbeta;
  int64_t n = k->n, c = k->c, hw = k->hw, cnt = n * hw;
  const int32_t groups = ps_bn_groups(n, c, hw);
  float gb[BN_CHUNK], xb[BN_CHUNK];
  for (int64_t ch = c0; ch < c1; ch++) {
    float mean = save_mean[ch], is = save_invstd[ch];
    float sdy = 0.0f, sdyx = 0.0f; /* sum dy, sum dy * xhat: per group, then in group order */
    for (int32_t gi = 0; gi < groups; gi++) {
      double gdy = 0.0, gdyx = 0.0;
      const int64_t s1 = ps_bn_group_start(n, groups, gi + 1);
      for (int64_t i = ps_bn_group_start(n, groups, gi); i < s1; i++) {
        const int64_t p = (i * c + ch) * hw;
        for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
          int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
          load_dy(dy, y, dt, relu, p + j0, gb, m);
          act_load(x, dt, p + j0, xb, m);
          float a0[BN_LANES] = {0}, a1[BN_LANES] = {0};
          int64_t j = 0;
          for (; j + BN_LANES <= m; j += BN_LANES)
            for (int l = 0; l < BN_LANES; l++) {
              a0[l] += gb[j + l];
              a1[l] += gb[j + l] * ((xb[j + l] - mean) * is);
            }
          for (; j < m; j++) {
            a0[0] += gb[j];
            a1[0] += gb[j] * ((xb[j] - mean) * is);
          }
          gdy += lanes_total(a0);
          gdyx += lanes_total(a1);
        }
      }
      sdy += (float)gdy;
      sdyx += (float)gdyx;
    }
    dbeta[ch] = sdy;
    dgamma[ch] = sdyx;
    /* dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) */
    float a = gamma[ch] * is, mdy = sdy / (float)cnt, mdyx = sdyx / (float)cnt;
    for (int64_t i = 0; i < n; i++) {
      const int64_t p = (i * c + ch) * hw;
      for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
        int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
        load_dy(dy, y, dt, relu, p + j0, gb, m);
        act_load(x, dt, p + j0, xb, m);
        for (int64_t j = 0; j < m; j++) gb[j] = ps_bn_grad(gb[j], xb[j], mean, is, a, mdy, mdyx);
        act_store(gb, dx, dt, p + j0, m);
      }
    }
  }
}

PS_API int ps_nn_batchnorm_act_backward(const void *dy, const void *x, const void *y,
                                        const float *gamma, const float *save_mean,
                                        const float *save_invstd, void *dx, int32_t dtype,
                                        float *dgamma, float *dbeta, float *work,
                                        int64_t work_floats, int64_t n, int64_t c, int64_t hw,
                                        int32_t act, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  TRY(ps_check_bn_work(__func__, work, work_floats, n, c, hw, act));
  CHECK_RANGE(dy, n * c * hw * dtsize(dtype));
  CHECK_RANGE(x, n * c * hw * dtsize(dtype));
  if (act == PS_BN_RELU) CHECK_RANGE(y, n * c * hw * dtsize(dtype));
  CHECK_RANGE(dx, n * c * hw * dtsize(dtype));
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(save_mean, c * 4);
  CHECK_RANGE(save_invstd, c * 4);
  CHECK_RANGE(dgamma, c * 4);
  CHECK_RANGE(dbeta, c * 4);
  if (work) CHECK_RANGE(work, ps_bn_work_floats(n, c, hw) * 4);
  bn_bwd_ctx k = {.x = x,
                  .dy = dy,
                  .y = y,
                  .dx = dx,
                  .dt = dtype,
                  .relu = act == PS_BN_RELU,
                  .gamma = gamma,
                  .save_mean = save_mean,
                  .save_invstd = save_invstd,
                  .dgamma = dgamma,
                  .dbeta = dbeta,
                  .n = n,
                  .c = c,
                  .hw = hw};
  ps_pool_range(c, 1, n * c * hw, bn_bwd_range, &k);
  return PS_OK;
}

PS_API int ps_nn_batchnorm_backward(const void *dy, const void *x, const float *gamma,
                                    const float *save_mean, const float *save_invstd, void *dx,
                                    int32_t dtype, float *dgamma, float *dbeta, int64_t n,
                                    int64_t c, int64_t hw, void *stream) {
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  return ps_nn_batchnorm_act_backward(dy, x, NULL, gamma, save_mean, save_invstd, dx, dtype, dgamma,
                                      dbeta, NULL, 0, n, c, hw, 0, stream);
}

/* ---- bias ----------------------------------------------------------------------------- */

/* ps_nn_bias_add over rows [r0, r1) of [n*c][hw]. */
typedef struct {
  void *y; /* dtype dt */
  int32_t dt;
  const void *bias;
  int32_t bias_dtype;
  int64_t c, hw;
} bias_add_ctx;

/* bias_add_range for fp32 y: plain loops, which GCC vectorizes (y + b is one fp32 rounding, as
 * in the fp16 path before its cast). */
static void bias_add_range_f32(const bias_add_ctx *k, int64_t r0, int64_t r1) {
  float *y = k->y;
  const int32_t bdt = k->bias_dtype;
  int64_t c = k->c, hw = k->hw;
  for (int64_t r = r0; r < r1; r++) {
    if (hw == 1) {
      float *q = y + r * c;
      for (int64_t ch = 0; ch < c; ch++) q[ch] += act_get(k->bias, bdt, ch);
    } else {
      float *q = y + r * hw, b = act_get(k->bias, bdt, r % c);
      for (int64_t j = 0; j < hw; j++) q[j] += b;
    }
  }
}

/* bias_add_range for bf16 y: through fp32 chunks, each element y + b rounded once. */
static void bias_add_range_bf16(const bias_add_ctx *k, int64_t r0, int64_t r1) {
  float buf[256];
  const int64_t c = k->c, hw = k->hw, len = hw == 1 ? c : hw;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t j0 = 0; j0 < len; j0 += 256) {
      const int64_t m = len - j0 < 256 ? len - j0 : 256, at = r * len + j0;
      act_load(k->y, PS_NN_BF16, at, buf, m);
      for (int64_t j = 0; j < m; j++)
        buf[j] += act_get(k->bias, k->bias_dtype, hw == 1 ? j0 + j : r % c);
      act_store(buf, k->y, PS_NN_BF16, at, m);
    }
}

static void bias_add_range(void *vctx, int64_t r0, int64_t r1) {
  const bias_add_ctx *k = vctx;
  if (k->dt == PS_NN_F32) {
    bias_add_range_f32(k, r0, r1);
    return;
  }
  if (k->dt == PS_NN_BF16) {
    bias_add_range_bf16(k, r0, r1);
    return;
  }
  half *y = k->y;
  const void *bias = k->bias;
  int32_t bias_dtype = k->bias_dtype;
  int64_t c = k->c, hw = k->hw;
  if (hw == 1) { /* [N,F] (a Linear): rows [r0, r1) are samples, the bias runs along each */
    float *bf = ps_workspace(WS_OUT, (size_t)c);
    if (!bf) { /* no scratch: the same sums, one channel at a time */
      for (int64_t r = r0; r < r1; r++)
        for (int64_t ch = 0; ch < c; ch++) {
          float b = act_get(bias, bias_dtype, ch);
          y[r * c + ch] = f2h(h2f(y[r * c + ch]) + b);
        }
      return;
    }
    act_load(bias, bias_dtype, 0, bf, c);
    for (int64_t r = r0; r < r1; r++) {
      half *q = y + r * c;
      int64_t j = 0;
#if defined(__AVX512F__)
      for (; j + 16 <= c; j += 16) {
        __m512 v = _mm512_add_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q + j))),
                                 _mm512_loadu_ps(bf + j));
        _mm256_storeu_si256((__m256i *)(q + j), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      }
#elif defined(__AVX2__) && defined(__F16C__)
      for (; j + 8 <= c; j += 8) {
        __m256 v = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q + j))),
                                 _mm256_loadu_ps(bf + j));
        _mm_storeu_si128((__m128i *)(q + j), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      }
#endif
      for (; j < c; j++) q[j] = f2h(h2f(q[j]) + bf[j]);
    }
    return;
  }
  for (int64_t r = r0; r < r1; r++) {
    int64_t ch = r % c;
    half *q = y + r * hw;
    float b = act_get(bias, bias_dtype, ch);
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 vb = _mm512_set1_ps(b);
    for (; j + 16 <= hw; j += 16) {
      __m512 v = _mm512_add_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q + j))), vb);
      _mm256_storeu_si256((__m256i *)(q + j), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#elif defined(__AVX2__) && defined(__F16C__)
    __m256 vb = _mm256_set1_ps(b);
    for (; j + 8 <= hw; j += 8) {
      __m256 v = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q + j))), vb);
      _mm_storeu_si128((__m128i *)(q + j), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; j < hw; j++) q[j] = f2h(h2f(q[j]) + b);
  }
}

PS_API int ps_nn_bias_add(void *y, int32_t dtype, const void *bias, int32_t bias_dtype, int64_t n,
                          int64_t c, int64_t hw, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(bias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  CHECK_RANGE(y, n * c * hw * dtsize(dtype));
  CHECK_RANGE(bias, c * dtsize(bias_dtype));
  /* hw == 1 (a Linear's [N,F]) splits by samples, the channel maps by (sample, channel). */
  int64_t rows = hw == 1 ? n : n * c;
  bias_add_ctx k = {.y = y, .dt = dtype, .bias = bias, .bias_dtype = bias_dtype, .c = c, .hw = hw};
  ps_pool_range(rows, hw == 1 ? 8 : 64, n * c * hw, bias_add_range, &k);
  return PS_OK;
}

/* ps_nn_bias_grad's per-channel sums over channels [c0, c1). */
typedef struct {
  const void *dy; /* dtype dt */
  int32_t dt;
  float *sum;
  int64_t n, c, hw;
} bias_grad_ctx;

static void bias_grad_range(void *vctx, int64_t c0, int64_t c1) {
  const bias_grad_ctx *k = vctx;
  float *sum = k->sum;
  int64_t n = k->n, c = k->c, hw = k->hw;
  for (int64_t ch = c0; ch < c1; ch++) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
      int64_t at = (i * c + ch) * hw;
      s += k->dt != PS_NN_F32 ? sum_row(act_at(k->dy, k->dt, at), k->dt, hw)
                              : chunk_sum((const float *)k->dy + at, hw);
    }
    sum[ch] = s;
  }
}

PS_API int ps_nn_bias_grad(const void *dy, int32_t dtype, void *dbias, int32_t dbias_dtype,
                           int64_t n, int64_t c, int64_t hw, int32_t accumulate, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(dbias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  const int32_t dt = dtype;
  CHECK_RANGE(dy, n * c * hw * dtsize(dtype));
  CHECK_RANGE(dbias, c * dtsize(dbias_dtype));
  float *sum = ps_call_scratch((size_t)c);
  if (!sum) OOM();
  memset(sum, 0, (size_t)c * sizeof(float));
  float *row = hw == 1 ? ps_workspace(WS_OUT, (size_t)c) : NULL;
  if (hw == 1 && row) { /* [N,F]: convert a row with the vector helper, then add it */
    for (int64_t i = 0; i < n; i++) {
      act_load(dy, dt, i * c, row, c);
      for (int64_t ch = 0; ch < c; ch++) sum[ch] += row[ch];
    }
  } else if (hw == 1) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t ch = 0; ch < c; ch++) sum[ch] += act_get(dy, dt, i * c + ch);
  } else {
    bias_grad_ctx k = {.dy = dy, .dt = dt, .sum = sum, .n = n, .c = c, .hw = hw};
    ps_pool_range(c, 1, n * c * hw, bias_grad_range, &k);
  }
  for (int64_t ch = 0; ch < c; ch++) {
    act_set(dbias, dbias_dtype, ch,
            accumulate ? act_get(dbias, dbias_dtype, ch) + sum[ch] : sum[ch]);
  }
  return PS_OK;
}
