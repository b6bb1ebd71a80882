/*
 * ops.c — CPU backend of the element-wise nn kernels (kernels/cuda/ops.cu is the CUDA twin):
 * max pooling, ReLU, the cross-entropy loss, casts, loss scaling (unscale and check, the
 * GradScaler update), the SGD step and the skipped-step rollback. Per-element arithmetic that
 * the two backends must agree on is in kernels/rules.h; the AVX-512 paths here say which rule
 * they spell out.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "nn.h"
#include "threads.h"

/* ---- pooling ------------------------------------------------------------------------- */

#if defined(__AVX512F__)
/* 2x2 stride-2 pooling of one plane, 16 outputs at a time: the even and odd columns of the
 * two input rows are de-interleaved with permutes, then compared in the scalar loop's order
 * ((0,0), (0,1), (1,0), (1,1); strictly greater wins; NaN wins over numbers). */
static void maxpool_2x2_plane(const half *xp, half *yp, int32_t *ip, int64_t w, int64_t oh,
                              int64_t ow) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i lane2 =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (int64_t oy = 0; oy < oh; oy++) {
    const half *r0 = xp + 2 * oy * w, *r1 = r0 + w;
    for (int64_t ox = 0; ox < ow; ox += 16) {
      int64_t cnt = ow - ox < 16 ? ow - ox : 16, in = 2 * cnt;
      __m512 a0 = load16(r0 + 2 * ox, 1, in), a1 = load16(r0 + 2 * ox + 16, 1, in - 16);
      __m512 b0 = load16(r1 + 2 * ox, 1, in), b1 = load16(r1 + 2 * ox + 16, 1, in - 16);
      __m512 v[4] = {_mm512_permutex2var_ps(a0, ev, a1), _mm512_permutex2var_ps(a0, od, a1),
                     _mm512_permutex2var_ps(b0, ev, b1), _mm512_permutex2var_ps(b0, od, b1)};
      __m512i base = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * oy * w + 2 * ox)), lane2);
      const int32_t off[4] = {0, 1, (int32_t)w, (int32_t)w + 1};
      __m512 m = v[0];
      __m512i best = base;
      for (int t = 1; t < 4; t++) {
        __mmask16 gt =
            _mm512_cmp_ps_mask(v[t], m, _CMP_GT_OQ) |
            (_mm512_cmp_ps_mask(v[t], v[t], _CMP_UNORD_Q) & _mm512_cmp_ps_mask(m, m, _CMP_ORD_Q));
        m = _mm512_mask_mov_ps(m, gt, v[t]);
        best = _mm512_mask_mov_epi32(best, gt, _mm512_add_epi32(base, _mm512_set1_epi32(off[t])));
      }
      __mmask16 k = mask16(cnt);
      _mm256_mask_storeu_epi16(yp + oy * ow + ox, k, _mm512_cvtps_ph(m, _MM_FROUND_TO_NEAREST_INT));
      _mm512_mask_storeu_epi32(ip + oy * ow + ox, k, best);
    }
  }
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__F16C__)
#define PS_POOL_AVX2 1
/* maxpool_2x2_plane for AVX2: 8 outputs at a time, the same comparisons in the same order. */
static void maxpool_2x2_plane_avx2(const half *xp, half *yp, int32_t *ip, int64_t w, int64_t oh,
                                   int64_t ow) {
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  for (int64_t oy = 0; oy < oh; oy++) {
    const half *r0 = xp + 2 * oy * w, *r1 = r0 + w;
    for (int64_t ox = 0; ox < ow; ox += 8) {
      int64_t cnt = ow - ox < 8 ? ow - ox : 8, in = 2 * cnt;
      __m256 a0 = load8(r0 + 2 * ox, 1, in), a1 = load8(r0 + 2 * ox + 8, 1, in - 8);
      __m256 b0 = load8(r1 + 2 * ox, 1, in), b1 = load8(r1 + 2 * ox + 8, 1, in - 8);
      /* shuffle_ps takes lanes within 128-bit halves; permute4x64 puts them in order. */
#define PS_EVEN(x, y) \
  _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0x88)), 0xd8))
#define PS_ODD(x, y) \
  _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0xdd)), 0xd8))
      __m256 v[4] = {PS_EVEN(a0, a1), PS_ODD(a0, a1), PS_EVEN(b0, b1), PS_ODD(b0, b1)};
#undef PS_EVEN
#undef PS_ODD
      __m256i base = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(2 * oy * w + 2 * ox)), lane2);
      const int32_t off[4] = {0, 1, (int32_t)w, (int32_t)w + 1};
      __m256 m = v[0];
      __m256i best = base;
      for (int t = 1; t < 4; t++) {
        __m256 gt = _mm256_or_ps(_mm256_cmp_ps(v[t], m, _CMP_GT_OQ),
                                 _mm256_and_ps(_mm256_cmp_ps(v[t], v[t], _CMP_UNORD_Q),
                                               _mm256_cmp_ps(m, m, _CMP_ORD_Q)));
        m = _mm256_blendv_ps(m, v[t], gt);
        best = _mm256_castps_si256(_mm256_blendv_ps(
            _mm256_castsi256_ps(best),
            _mm256_castsi256_ps(_mm256_add_epi32(base, _mm256_set1_epi32(off[t]))), gt));
      }
      __m128i h = _mm256_cvtps_ph(m, _MM_FROUND_TO_NEAREST_INT);
      if (cnt == 8) {
        _mm_storeu_si128((__m128i *)(yp + oy * ow + ox), h);
        _mm256_storeu_si256((__m256i *)(ip + oy * ow + ox), best);
      } else {
        memcpy(yp + oy * ow + ox, &h, (size_t)cnt * 2);
        _mm256_maskstore_epi32(ip + oy * ow + ox, mask8(cnt), best);
      }
    }
  }
}
#endif

/* ps_nn_maxpool2d_forward over planes [p0, p1). */
typedef struct {
  const void *x;
  void *y; /* x and y dtype dt */
  int32_t dt;
  int32_t *idx; /* may be NULL */
  int64_t h, w, oh, ow;
  int32_t kernel, stride;
} maxpool_fwd_ctx;

static void maxpool_fwd_range(void *vctx, int64_t p0, int64_t p1) {
  const maxpool_fwd_ctx *c = vctx;
  int64_t h = c->h, w_ = c->w, oh = c->oh, ow = c->ow;
  int32_t kernel = c->kernel, stride = c->stride;
  const int32_t dt = c->dt;
  const int f16 = dt == PS_NN_F16;
  (void)f16;
  for (int64_t pl = p0; pl < p1; pl++) {
    const int64_t xp = pl * h * w_, yp = pl * oh * ow;
    int32_t *ip = c->idx ? c->idx + pl * oh * ow : NULL;
#if defined(__AVX512F__)
    if (f16 && kernel == 2 && stride == 2 && ip) {
      maxpool_2x2_plane((const half *)c->x + xp, (half *)c->y + yp, ip, w_, oh, ow);
      continue;
    }
#elif defined(PS_POOL_AVX2)
    if (f16 && kernel == 2 && stride == 2 && ip) {
      maxpool_2x2_plane_avx2((const half *)c->x + xp, (half *)c->y + yp, ip, w_, oh, ow);
      continue;
    }
#endif
    for (int64_t oy = 0; oy < oh; oy++)
      for (int64_t ox = 0; ox < ow; ox++) {
        int64_t y0 = oy * stride, x0 = ox * stride, best = y0 * w_ + x0;
        float m = act_get(c->x, dt, xp + best);
        for (int64_t ky = 0; ky < kernel; ky++)
          for (int64_t kx = 0; kx < kernel; kx++) {
            int64_t at = (y0 + ky) * w_ + x0 + kx;
            float v = act_get(c->x, dt, xp + at);
            if (ps_pool_takes(v, m)) m = v, best = at;
          }
        act_set(c->y, dt, yp + oy * ow + ox, m);
        if (ip) ip[oy * ow + ox] = (int32_t)best;
      }
  }
}

#if defined(__AVX512F__)
/* The backward of one plane of 2x2 stride-2 pooling (h == 2*oh, w == 2*ow), 16 outputs at a
 * time: each window gets its dy at the index the forward chose and zeros elsewhere, written
 * row by row instead of a memset and a scatter of scalar conversions. dy goes through the
 * scalar loop's arithmetic (fp32 0 + dy, so -0 becomes +0) and gives the same bits. Returns 0
 * when an index lies outside its own window (not from this pooling): the caller then runs the
 * general loop, which accumulates repeated indices. */
static int maxpool_bwd_2x2_plane(const half *dyp, const int32_t *ip, half *dxp, int64_t w,
                                 int64_t oh, int64_t ow) {
  const __m512i lane2 =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i one = _mm512_set1_epi32(1), wv = _mm512_set1_epi32((int32_t)w);
  for (int64_t oy = 0; oy < oh; oy++) {
    half *r0 = dxp + 2 * oy * w, *r1 = r0 + w;
    for (int64_t ox = 0; ox < ow; ox += 16) {
      int64_t cnt = ow - ox < 16 ? ow - ox : 16;
      __mmask16 k = mask16(cnt);
      __m512i at = _mm512_maskz_loadu_epi32(k, ip + oy * ow + ox);
      __m512 v = _mm512_add_ps(load16(dyp + oy * ow + ox, 1, cnt), _mm512_setzero_ps());
      __m512i b00 = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * oy * w + 2 * ox)), lane2);
      __m512i b10 = _mm512_add_epi32(b00, wv);
      __mmask16 m00 = _mm512_cmpeq_epi32_mask(at, b00),
                m01 = _mm512_cmpeq_epi32_mask(at, _mm512_add_epi32(b00, one)),
                m10 = _mm512_cmpeq_epi32_mask(at, b10),
                m11 = _mm512_cmpeq_epi32_mask(at, _mm512_add_epi32(b10, one));
      if ((__mmask16)((m00 | m01 | m10 | m11) & k) != k) return 0;
      __m512 e0 = _mm512_maskz_mov_ps(m00, v), o0 = _mm512_maskz_mov_ps(m01, v);
      __m512 e1 = _mm512_maskz_mov_ps(m10, v), o1 = _mm512_maskz_mov_ps(m11, v);
      __mmask16 k0 = mask16(2 * cnt), k1 = mask16(2 * cnt - 16);
      _mm256_mask_storeu_epi16(
          r0 + 2 * ox, k0,
          _mm512_cvtps_ph(_mm512_permutex2var_ps(e0, lo, o0), _MM_FROUND_TO_NEAREST_INT));
      _mm256_mask_storeu_epi16(
          r0 + 2 * ox + 16, k1,
          _mm512_cvtps_ph(_mm512_permutex2var_ps(e0, hi, o0), _MM_FROUND_TO_NEAREST_INT));
      _mm256_mask_storeu_epi16(
          r1 + 2 * ox, k0,
          _mm512_cvtps_ph(_mm512_permutex2var_ps(e1, lo, o1), _MM_FROUND_TO_NEAREST_INT));
      _mm256_mask_storeu_epi16(
          r1 + 2 * ox + 16, k1,
          _mm512_cvtps_ph(_mm512_permutex2var_ps(e1, hi, o1), _MM_FROUND_TO_NEAREST_INT));
    }
  }
  return 1;
}
#endif

/* ps_nn_maxpool2d_backward over planes [p0, p1). */
typedef struct {
  const void *dy;
  const int32_t *idx;
  void *dx; /* dy and dx dtype dt */
  int32_t dt;
  int64_t hw, ohw;
  int64_t w, oh, ow; /* w == 2*ow and hw == 2*oh*w: the 2x2 stride-2 fast path may apply */
  int halves;
  _Atomic int bad; /* an index outside its plane */
} maxpool_bwd_ctx;

static void maxpool_bwd_range(void *vctx, int64_t p0, int64_t p1) {
  maxpool_bwd_ctx *c = vctx;
  int64_t hw = c->hw, ohw = c->ohw;
  const int32_t dt = c->dt;
  const int f16 = dt == PS_NN_F16;
  (void)f16;
  for (int64_t pl = p0; pl < p1; pl++) {
    const int64_t dxp = pl * hw, dyp = pl * ohw;
    const int32_t *ip = c->idx + pl * ohw;
#if defined(__AVX512F__)
    if (f16 && c->halves &&
        maxpool_bwd_2x2_plane((const half *)c->dy + dyp, ip, (half *)c->dx + dxp, c->w, c->oh,
                              c->ow))
      continue;
#endif
    memset((char *)c->dx + dxp * act_bytes(dt), 0, (size_t)(hw * act_bytes(dt)));
    for (int64_t i = 0; i < ohw; i++) {
      int32_t at = ip[i];
      if (at < 0 || at >= hw) {
        atomic_store(&c->bad, 1);
        break;
      }
      act_set(c->dx, dt, dxp + at, act_get(c->dx, dt, dxp + at) + act_get(c->dy, dt, dyp + i));
    }
  }
}

PS_API int ps_nn_maxpool2d_forward(const void *x, void *y, int32_t dtype, int32_t *indices,
                                   int64_t n, int64_t c, int64_t h, int64_t w_, int32_t kernel,
                                   int32_t stride, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_maxpool_forward(n, c, h, w_, kernel, stride));
  int64_t oh = ps_pool_out(h, kernel, stride), ow = ps_pool_out(w_, kernel, stride);
  int64_t planes = n * c;
  if (planes == 0) return PS_OK;
  CHECK_RANGE(x, planes * h * w_ * dtsize(dtype));
  CHECK_RANGE(y, planes * oh * ow * dtsize(dtype));
  if (indices) CHECK_RANGE(indices, planes * oh * ow * 4);
  maxpool_fwd_ctx pc = {.x = x,
                        .y = y,
                        .dt = dtype,
                        .idx = indices,
                        .h = h,
                        .w = w_,
                        .oh = oh,
                        .ow = ow,
                        .kernel = kernel,
                        .stride = stride};
  ps_pool_range(planes, 8, planes * h * w_, maxpool_fwd_range, &pc);
  return PS_OK;
}

PS_API int ps_nn_maxpool2d_backward(const void *dy, const int32_t *indices, void *dx, int32_t dtype,
                                    int64_t n, int64_t c, int64_t h, int64_t w_, int64_t oh,
                                    int64_t ow, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_maxpool_backward(n, c, h, w_, oh, ow));
  int64_t planes = n * c, hw = h * w_, ohw = oh * ow;
  if (planes == 0) return PS_OK;
  CHECK_RANGE(dy, planes * ohw * dtsize(dtype));
  CHECK_RANGE(indices, planes * ohw * 4);
  CHECK_RANGE(dx, planes * hw * dtsize(dtype));
  maxpool_bwd_ctx pc = {.dy = dy,
                        .idx = indices,
                        .dx = dx,
                        .dt = dtype,
                        .hw = hw,
                        .ohw = ohw,
                        .w = w_,
                        .oh = oh,
                        .ow = ow,
                        .halves = h == 2 * oh && w_ == 2 * ow};
  ps_pool_range(planes, 8, planes * hw, maxpool_bwd_range, &pc);
  int bad = atomic_load(&pc.bad);
  if (bad) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_maxpool2d_backward: index out of range");
  return PS_OK;
}
/* ---- relu ----------------------------------------------------------------------------- */

/* ps_nn_relu_forward over elements [i, end), on the fp32, fp16 or bf16 bits. */
typedef struct {
  const void *x;
  void *y;
  int32_t dt;
} relu_fwd_ctx;

static void relu_fwd_range(void *vctx, int64_t i, int64_t end) {
  const relu_fwd_ctx *k = vctx;
  if (k->dt == PS_NN_F32) {
    const uint32_t *s = k->x;
    uint32_t *d = k->y;
    for (; i < end; i++) d[i] = ps_relu_f32(s[i]);
    return;
  }
  if (k->dt == PS_NN_BF16) {
    const uint16_t *s = k->x;
    uint16_t *d = k->y;
    for (; i < end; i++) d[i] = ps_relu_bf16(s[i]);
    return;
  }
  const uint16_t *s = k->x;
  uint16_t *d = k->y;
#if defined(__AVX512BW__)
  /* As int16, exactly the values to zero (-0, negatives, -inf; not negative NaNs) are
   * <= (int16)0xfc00 = -1024. */
  const __m512i lim = _mm512_set1_epi16(-1024);
  for (; i < end; i += 32) {
    __mmask32 m = end - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (end - i)) - 1u);
    __m512i v = _mm512_maskz_loadu_epi16(m, s + i);
    __mmask32 neg = _mm512_cmple_epi16_mask(v, lim);
    _mm512_mask_storeu_epi16(d + i, m, _mm512_maskz_mov_epi16((__mmask32)~neg, v));
  }
#endif
  for (; i < end; i++) {
    d[i] = ps_relu_f16(s[i]);
  }
}

PS_API int ps_nn_relu_forward(const void *x, void *y, int32_t dtype, int64_t count, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  CHECK_RANGE(x, count * dtsize(dtype));
  CHECK_RANGE(y, count * dtsize(dtype));
  /* On the bits: max(x, 0) keeps NaN like torch.relu does not guarantee either way; a
   * negative-sign test maps -0 and negatives to +0 and leaves NaN payloads alone. */
  relu_fwd_ctx k = {.x = x, .y = y, .dt = dtype};
  ps_pool_range(count, 16384, count, relu_fwd_range, &k);
  return PS_OK;
}

/* ps_nn_relu_backward over elements [i, end), on the fp32, fp16 or bf16 bits. */
typedef struct {
  const void *dy, *y;
  void *dx;
  int32_t dt;
} relu_bwd_ctx;

static void relu_bwd_range(void *vctx, int64_t i, int64_t end) {
  const relu_bwd_ctx *k = vctx;
  if (k->dt == PS_NN_F32) {
    const uint32_t *g = k->dy, *o = k->y;
    uint32_t *d = k->dx;
    for (; i < end; i++) d[i] = ps_relu_grad_f32(o[i], g[i]);
    return;
  }
  if (k->dt == PS_NN_BF16) {
    const uint16_t *g = k->dy, *o = k->y;
    uint16_t *d = k->dx;
    for (; i < end; i++) d[i] = ps_relu_grad_bf16(o[i], g[i]);
    return;
  }
  const uint16_t *g = k->dy, *o = k->y;
  uint16_t *d = k->dx;
#if defined(__AVX512BW__)
  const __m512i zero = _mm512_setzero_si512(), inf = _mm512_set1_epi16(0x7c00);
  for (; i < end; i += 32) {
    __mmask32 m = end - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (end - i)) - 1u);
    __m512i v = _mm512_maskz_loadu_epi16(m, o + i);
    __mmask32 pos = _mm512_cmpgt_epi16_mask(v, zero) & _mm512_cmple_epi16_mask(v, inf);
    _mm512_mask_storeu_epi16(d + i, m, _mm512_maskz_loadu_epi16(pos & m, g + i));
  }
#endif
  for (; i < end; i++) {
    d[i] = ps_relu_grad_f16(o[i], g[i]);
  }
}

PS_API int ps_nn_relu_backward(const void *dy, const void *y, void *dx, int32_t dtype,
                               int64_t count, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  CHECK_RANGE(dy, count * dtsize(dtype));
  CHECK_RANGE(y, count * dtsize(dtype));
  CHECK_RANGE(dx, count * dtsize(dtype));
  /* dx = y > 0 ? dy : 0; y is relu's output, so y > 0 <=> positive sign and nonzero. */
  relu_bwd_ctx k = {.dy = dy, .y = y, .dx = dx, .dt = dtype};
  ps_pool_range(count, 16384, count, relu_bwd_range, &k);
  return PS_OK;
}

/* ---- loss ---------------------------------------------------------------------------- */

PS_API int ps_nn_cross_entropy(const void *logits, const int32_t *labels, void *dlogits,
                               int32_t dtype, float *loss_sum, int32_t *correct, int64_t n,
                               int64_t k, float scale, const float *device_scale, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_cross_entropy(n, k));
  if (n == 0) return PS_OK;
  CHECK_RANGE(logits, n * k * dtsize(dtype));
  CHECK_RANGE(labels, n * 4);
  if (dlogits) CHECK_RANGE(dlogits, n * k * dtsize(dtype));
  if (loss_sum) CHECK_RANGE(loss_sum, 4);
  if (correct) CHECK_RANGE(correct, 4);
  if (device_scale) CHECK_RANGE(device_scale, 4);
  for (int64_t i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= k)
      PS_FAIL(PS_ERR_INVALID_ARGUMENT,
              "ps_nn_cross_entropy: label %d of sample %lld not in [0, %lld)", labels[i],
              (long long)i, (long long)k);
  double loss = 0.0;
  int64_t hits = 0;
  float *row = ps_call_scratch((size_t)k);
  if (!row) OOM();
  float g = ps_ce_grad_scale(scale, device_scale, n);
  for (int64_t i = 0; i < n; i++) {
    int64_t arg = -1;
    float m = 0.0f;
    act_load(logits, dtype, i * k, row, k);
    for (int64_t j = 0; j < k; j++) {
      if (ps_argmax_takes(row[j], j, m, arg)) m = row[j], arg = j;
    }
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) s += expf(row[j] - m);
    float lse = m + logf(s);
    loss += (double)(lse - row[labels[i]]);
    hits += arg == labels[i];
    if (dlogits) {
      float inv = 1.0f / s;
      for (int64_t j = 0; j < k; j++) {
        float p = expf(row[j] - m) * inv;
        act_set(dlogits, dtype, i * k + j, g * (p - (j == labels[i] ? 1.0f : 0.0f)));
      }
    }
  }
  if (loss_sum) *loss_sum += (float)loss;
  if (correct) *correct += (int32_t)hits;
  return PS_OK;
}

/* ---- casts, loss scaling, SGD -------------------------------------------------------- */

PS_API int ps_nn_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype,
                      int64_t count, void *stream) {
  (void)stream;
  CHECK_DTYPE(src_dtype);
  CHECK_DTYPE(dst_dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  CHECK_RANGE(src, count * dtsize(src_dtype));
  CHECK_RANGE(dst, count * dtsize(dst_dtype));
  if (src_dtype == dst_dtype) {
    memmove(dst, src, (size_t)(count * dtsize(src_dtype)));
  } else if (src_dtype == PS_NN_F32) {
    act_store((const float *)src, dst, dst_dtype, 0, count);
  } else if (dst_dtype == PS_NN_F32) {
    act_load(src, src_dtype, 0, (float *)dst, count);
  } else { /* fp16 <-> bf16 through fp32, a chunk at a time */
    float buf[1024];
    for (int64_t i = 0; i < count; i += 1024) {
      const int64_t m = count - i < 1024 ? count - i : 1024;
      act_load(src, src_dtype, i, buf, m);
      act_store(buf, dst, dst_dtype, i, m);
    }
  }
  return PS_OK;
}

PS_API int ps_nn_unscale_check(void *grad, int32_t grad_dtype, int64_t count, const float *scale,
                               float inv_scale, int32_t in_place, int32_t *found_inf,
                               void *stream) {
  (void)stream;
  CHECK_DTYPE(grad_dtype);
  TRY(ps_check_count(__func__, count));
  CHECK_RANGE(found_inf, 4);
  if (scale) CHECK_RANGE(scale, 4);
  if (count == 0) return PS_OK;
  CHECK_RANGE(grad, count * dtsize(grad_dtype));
  float inv = scale ? 1.0f / *scale : inv_scale;
  int bad = 0;
  if (grad_dtype == PS_NN_F16) {
    uint16_t *g = (uint16_t *)grad;
    for (int64_t i = 0; i < count; i++) bad |= ps_f16_nonfinite(g[i]);
    if (in_place)
      for (int64_t i = 0; i < count; i++) ((half *)grad)[i] = f2h(h2f(((half *)grad)[i]) * inv);
  } else if (grad_dtype == PS_NN_BF16) {
    uint16_t *g = (uint16_t *)grad;
    for (int64_t i = 0; i < count; i++) bad |= ps_bf16_nonfinite(g[i]);
    if (in_place)
      for (int64_t i = 0; i < count; i++) g[i] = ps_bf16_from_f32(ps_bf16_to_f32(g[i]) * inv);
  } else {
    float *g = (float *)grad;
    for (int64_t i = 0; i < count; i++) {
      bad |= !isfinite(g[i]);
      if (in_place) g[i] *= inv;
    }
  }
  if (bad) *found_inf = 1;
  return PS_OK;
}

/* ps_nn_sgd_step over elements [i0, i1). */
typedef struct {
  float *param, *momentum_buf; /* momentum_buf is NULL when momentum == 0 */
  const void *grad;
  void *param_half; /* half_dtype; may be NULL */
  int32_t grad_dtype, half_dtype;
  int nesterov, fresh; /* fresh: the step that creates the momentum buffer */
  float inv, lr, momentum, dampening, weight_decay;
} sgd_ctx;

static void sgd_range(void *vctx, int64_t i0, int64_t i1) {
  const sgd_ctx *k = vctx;
  const void *grad = k->grad;
  int32_t grad_dtype = k->grad_dtype;
  int nesterov = k->nesterov, fresh = k->fresh;
  float *param = k->param, *momentum_buf = k->momentum_buf;
  void *param_half = k->param_half;
  const int32_t half_dtype = k->half_dtype;
  float inv = k->inv, lr = k->lr, momentum = k->momentum, dampening = k->dampening,
        weight_decay = k->weight_decay;
  for (int64_t i = i0; i < i1; i++) {
    float g = act_get(grad, grad_dtype, i) * inv;
    float p = ps_sgd_element(param[i], g, momentum != 0.0f ? momentum_buf + i : NULL, lr, momentum,
                             dampening, weight_decay, nesterov, fresh);
    param[i] = p;
    if (param_half) act_set(param_half, half_dtype, i, p);
  }
}

PS_API int ps_nn_sgd_step(float *param, const void *grad, int32_t grad_dtype, float *momentum_buf,
                          void *param_half, int32_t half_dtype, int64_t count, float lr,
                          float momentum, float dampening, float weight_decay, int32_t nesterov,
                          const float *scale, const int32_t *found_inf, const int32_t *steps_done,
                          const float *hyper, void *stream) {
  (void)stream;
  CHECK_DTYPE(grad_dtype);
  if (param_half) TRY(ps_check_half_dtype(__func__, "half_dtype", half_dtype));
  TRY(ps_check_sgd(count, momentum, momentum_buf));
  if (found_inf) CHECK_RANGE(found_inf, 4);
  if (scale) CHECK_RANGE(scale, 4);
  if (steps_done) CHECK_RANGE(steps_done, 4);
  if (hyper) {
    CHECK_RANGE(hyper, 8);
    lr = hyper[0];
    momentum = momentum_buf ? hyper[1] : 0.0f;
  }
  if (count == 0) return PS_OK;
  CHECK_RANGE(param, count * 4);
  CHECK_RANGE(grad, count * dtsize(grad_dtype));
  if (momentum_buf) CHECK_RANGE(momentum_buf, count * 4);
  if (param_half) CHECK_RANGE(param_half, count * 2);
  if (found_inf && *found_inf) return PS_OK;
  float inv = scale ? 1.0f / *scale : 1.0f;
  int fresh = steps_done && *steps_done == 0;
  sgd_ctx k = {.param = param,
               .momentum_buf = momentum_buf,
               .grad = grad,
               .param_half = param_half,
               .grad_dtype = grad_dtype,
               .half_dtype = half_dtype,
               .nesterov = nesterov != 0,
               .fresh = fresh,
               .inv = inv,
               .lr = lr,
               .momentum = momentum,
               .dampening = dampening,
               .weight_decay = weight_decay};
  ps_pool_range(count, 16384, count, sgd_range, &k);
  return PS_OK;
}

PS_API int ps_nn_step_count(int32_t *steps_done, const int32_t *found_inf, void *stream) {
  (void)stream;
  CHECK_RANGE(steps_done, 4);
  if (found_inf) CHECK_RANGE(found_inf, 4);
  if (!(found_inf && *found_inf)) *steps_done += 1;
  return PS_OK;
}

PS_API int ps_nn_scaler_update(float *scale, int32_t *growth_tracker, const int32_t *found_inf,
                               float growth_factor, float backoff_factor, int32_t growth_interval,
                               void *stream) {
  (void)stream;
  CHECK_RANGE(scale, 4);
  CHECK_RANGE(growth_tracker, 4);
  CHECK_RANGE(found_inf, 4);
  TRY(ps_check_scaler_update(growth_interval));
  ps_scaler_step(scale, growth_tracker, *found_inf, growth_factor, backoff_factor, growth_interval);
  return PS_OK;
}

/* ---- skipped-step rollback ------------------------------------------------------------ */

PS_API int ps_nn_copy_if(float *dst, const float *src, int64_t count, const int32_t *flag,
                         void *stream) {
  (void)stream;
  TRY(ps_check_count(__func__, count));
  CHECK_RANGE(flag, 4);
  if (count == 0) return PS_OK;
  /* Checked whatever the flag says, so a bad call fails on every step, not on a skipped one. */
  CHECK_RANGE(dst, count * 4);
  CHECK_RANGE(src, count * 4);
  if (*flag) memmove(dst, src, (size_t)count * 4);
  return PS_OK;
}

/* ---- multi-tensor steps ---------------------------------------------------------------- */

/* The one-tensor functions on each entry, after checking the list: the same bits, and the
 * same refusals (naming the one-tensor function and its argument) for a bad entry. */

PS_API int ps_nn_multi_unscale_check(const int64_t *list, int32_t n, int64_t max_count,
                                     const float *scale, float inv_scale, int32_t in_place,
                                     int32_t *found_inf, void *stream) {
  TRY(ps_check_multi(__func__, list, n, max_count));
  CHECK_RANGE(found_inf, 4);
  if (n == 0) return PS_OK;
  CHECK_RANGE(list, (int64_t)n * PS_MT_SGD_FIELDS * 8);
  for (int32_t i = 0; i < n; i++) {
    const int64_t *e = list + (int64_t)i * PS_MT_SGD_FIELDS;
    TRY(ps_nn_unscale_check((void *)(uintptr_t)e[1], (int32_t)e[5], e[4], scale, inv_scale,
                            in_place, found_inf, stream));
  }
  return PS_OK;
}

PS_API int ps_nn_multi_sgd_step(const int64_t *list, int32_t n, int64_t max_count, float lr,
                                float momentum, float dampening, float weight_decay,
                                int32_t nesterov, const float *scale, const int32_t *found_inf,
                                const int32_t *steps_done, const float *hyper, void *stream) {
  TRY(ps_check_multi(__func__, list, n, max_count));
  if (n == 0) return PS_OK;
  CHECK_RANGE(list, (int64_t)n * PS_MT_SGD_FIELDS * 8);
  for (int32_t i = 0; i < n; i++) {
    const int64_t *e = list + (int64_t)i * PS_MT_SGD_FIELDS;
    TRY(ps_nn_sgd_step((float *)(uintptr_t)e[0], (const void *)(uintptr_t)e[1], (int32_t)e[5],
                       (float *)(uintptr_t)e[2], (void *)(uintptr_t)e[3], (int32_t)e[6], e[4], lr,
                       momentum, dampening, weight_decay, nesterov, scale, found_inf, steps_done,
                       hyper, stream));
  }
  return PS_OK;
}

PS_API int ps_nn_multi_copy_if(const int64_t *list, int32_t n, int64_t max_count,
                               const int32_t *flag, void *stream) {
  (void)stream;
  TRY(ps_check_multi(__func__, list, n, max_count));
  if (flag) CHECK_RANGE(flag, 4);
  if (n == 0) return PS_OK;
  CHECK_RANGE(list, (int64_t)n * PS_MT_COPY_FIELDS * 8);
  for (int32_t i = 0; i < n; i++) {
    const int64_t *e = list + (int64_t)i * PS_MT_COPY_FIELDS;
    TRY(ps_check_count(__func__, e[2]));
    if (e[2] == 0) continue;
    CHECK_RANGE((float *)(uintptr_t)e[0], e[2] * 4);
    CHECK_RANGE((const float *)(uintptr_t)e[1], e[2] * 4);
  }
  if (flag && !*flag) return PS_OK;
  for (int32_t i = 0; i < n; i++) {
    const int64_t *e = list + (int64_t)i * PS_MT_COPY_FIELDS;
    if (e[2] > 0) memmove((void *)(uintptr_t)e[0], (const void *)(uintptr_t)e[1], (size_t)e[2] * 4);
  }
  return PS_OK;
}

/* ---- cat, stack, add, mul ------------------------------------------------------------ */

typedef struct {
  char *part, *whole;
  int64_t row, stride, at;
  int split;
} concat_ctx;

static void concat_range(void *vctx, int64_t o, int64_t end) {
  const concat_ctx *k = vctx;
  for (; o < end; o++) {
    char *p = k->part + o * k->row, *w = k->whole + o * k->stride + k->at;
    if (k->split)
      memcpy(p, w, (size_t)k->row);
    else
      memcpy(w, p, (size_t)k->row);
  }
}

PS_API int ps_nn_concat(void *part, void *whole, int32_t dtype, int64_t outer, int64_t part_len,
                        int64_t whole_len, int64_t offset, int32_t split, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_concat(outer, part_len, whole_len, offset));
  if (outer == 0 || part_len == 0) return PS_OK;
  const int64_t sz = dtsize(dtype);
  CHECK_RANGE(part, outer * part_len * sz);
  CHECK_RANGE(whole, outer * whole_len * sz);
  concat_ctx k = {.part = part,
                  .whole = whole,
                  .row = part_len * sz,
                  .stride = whole_len * sz,
                  .at = offset * sz,
                  .split = split != 0};
  const int64_t grain = part_len >= 16384 ? 1 : 16384 / part_len;
  ps_pool_range(outer, grain, outer * part_len, concat_range, &k);
  return PS_OK;
}

typedef struct {
  const void *a, *b;
  void *y;
  int32_t dt;
  int mul;
} binary_ctx;

static void binary_range(void *vctx, int64_t i, int64_t end) {
  const binary_ctx *k = vctx;
  for (; i < end; i++) {
    float u = act_get(k->a, k->dt, i), v = act_get(k->b, k->dt, i);
    act_set(k->y, k->dt, i, k->mul ? u * v : u + v);
  }
}

PS_API int ps_nn_binary(const void *a, const void *b, void *y, int32_t dtype, int64_t count,
                        int32_t op, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  TRY(ps_check_binary(count, op));
  if (count == 0) return PS_OK;
  const int64_t bytes = count * dtsize(dtype);
  CHECK_RANGE(a, bytes);
  CHECK_RANGE(b, bytes);
  CHECK_RANGE(y, bytes);
  binary_ctx k = {.a = a, .b = b, .y = y, .dt = dtype, .mul = op == PS_BINARY_MUL};
  ps_pool_range(count, 16384, count, binary_range, &k);
  return PS_OK;
}
