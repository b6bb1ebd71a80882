/*
 * conv.c — CPU backend of the 2-D convolutions (kernels/cuda/conv.cu is the CUDA twin), as
 * im2col + the GEMM of gemm.c:
 *
 *   conv forward       Y^T[P,Co]  = col^T[P,K] . W^T[K,Co]       (P = OH*OW, K = C*kh*kw)
 *   conv backward data dcol[K,P]  = W^T[K,Co] . dY[Co,P], then col2im (scatter-add)
 *   conv backward wt   dW^T[K,Co] += col[K,P] . dY^T[P,Co]       (summed over the batch)
 *
 * Forward and backward-data run one image per task of the thread pool; the weight gradient
 * sums fixed chunks of the batch and adds the chunks in order (reproducible, see nn.h).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "gemm.h"
#include "nn.h"
#include "threads.h"

typedef ps_conv_geo conv_t;

/* Output columns ox whose input column ox*s + kx - pad lies in [0, w): [lo, hi). */
static void ox_range(const conv_t *g, int64_t kx, int64_t *lo, int64_t *hi) {
  int64_t off = kx - g->pad;
  int64_t l = off >= 0 ? 0 : (-off + g->s - 1) / g->s;
  int64_t h = (g->w - 1 - off) < 0 ? 0 : (g->w - 1 - off) / g->s + 1;
  if (h > g->ow) h = g->ow;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

/*
 * "Same" convolutions at stride 1 (ow == w, e.g. 3x3 with padding 1) have a faster im2col:
 * row (c, ky, kx) of col is the input plane shifted by off = (ky - pad)*w + (kx - pad), so
 * output rows [oy_lo, oy_hi) are one contiguous copy, after which the few columns that
 * wrapped around from the neighbouring row (ox < lo or ox >= hi) are zeroed. This replaces
 * one short copy per output row (most of im2col's cost at 14x14) by one long one.
 */
typedef struct {
  int64_t off, q0, q1, qa, qb, lo, hi;
} shift_t;

/* Zeroes n floats inline: the runs here are a row or two, shorter than a memset call is
 * worth (the calls were 6% of a 14x14 convolution's time). */
static inline void zero_f(float *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i < n; i += 16) _mm512_mask_storeu_ps(d + i, mask16(n - i), _mm512_setzero_ps());
#endif
  for (; i < n; i++) d[i] = 0.0f;
}

static int is_same_s1(const conv_t *g) { return g->s == 1 && g->ow == g->w && g->oh == g->h; }

static void shift_of(const conv_t *g, int64_t ky, int64_t kx, shift_t *t) {
  int64_t HW = g->h * g->w;
  int64_t oy_lo = g->pad - ky > 0 ? g->pad - ky : 0;
  int64_t oy_hi = g->h + g->pad - ky < g->oh ? g->h + g->pad - ky : g->oh;
  if (oy_hi < oy_lo) oy_hi = oy_lo;
  t->off = (ky - g->pad) * g->w + (kx - g->pad);
  t->q0 = oy_lo * g->ow;
  t->q1 = oy_hi * g->ow;
  /* the part of [q0, q1) whose source index q + off lies inside the plane */
  t->qa = t->q0 > -t->off ? t->q0 : -t->off;
  t->qb = t->q1 < HW - t->off ? t->q1 : HW - t->off;
  if (t->qb < t->qa) t->qb = t->qa;
  ox_range(g, kx, &t->lo, &t->hi);
}

/* Zeroes the columns of a row of col that wrapped around from the neighbouring image row
 * (ox < lo or ox >= hi) in output rows [q0, q1). */
static inline void zero_wrapped(const conv_t *g, const shift_t *t, float *row) {
  if (t->lo > 0 || t->hi < g->ow)
    for (int64_t q = t->q0; q < t->q1; q += g->ow) {
      for (int64_t ox = 0; ox < t->lo; ox++) row[q + ox] = 0.0f;
      for (int64_t ox = t->hi; ox < g->ow; ox++) row[q + ox] = 0.0f;
    }
}

static void im2col_same(const conv_t *g, const void *x, int32_t dt, int64_t at, float *col) {
  int64_t P = g->oh * g->ow, HW = g->h * g->w;
  for (int64_t ky = 0; ky < g->kh; ky++)
    for (int64_t kx = 0; kx < g->kw; kx++) {
      shift_t t;
      shift_of(g, ky, kx, &t);
      for (int64_t c = 0; c < g->c; c++) {
        float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        zero_f(row, t.qa);
        act_load(x, dt, at + c * HW + t.qa + t.off, row + t.qa, t.qb - t.qa);
        zero_f(row + t.qb, P - t.qb);
        zero_wrapped(g, &t, row);
      }
    }
}

/* The adjoint of im2col_same; clobbers the wrapped columns of col. */
static void col2im_same(const conv_t *g, float *col, float *img) {
  int64_t P = g->oh * g->ow, HW = g->h * g->w;
  for (int64_t ky = 0; ky < g->kh; ky++)
    for (int64_t kx = 0; kx < g->kw; kx++) {
      shift_t t;
      shift_of(g, ky, kx, &t);
      for (int64_t c = 0; c < g->c; c++) {
        float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        zero_wrapped(g, &t, row);
        float *d = img + c * HW + t.off;
        int64_t q = t.qa;
#if defined(__AVX512F__)
        for (; q + 16 <= t.qb; q += 16)
          _mm512_storeu_ps(d + q, _mm512_add_ps(_mm512_loadu_ps(d + q), _mm512_loadu_ps(row + q)));
#endif
        for (; q < t.qb; q++) d[q] += row[q];
      }
    }
}

/* col[(c*kh + ky)*kw + kx][oy*ow + ox] = x[c][oy*s + ky - pad][ox*s + kx - pad] (0 outside),
 * for the image at element offset `at` of x (dtype dt). */
static void im2col(const conv_t *g, const void *x, int32_t dt, int64_t at, float *col) {
  if (is_same_s1(g)) {
    im2col_same(g, x, dt, at, col);
    return;
  }
  int64_t P = g->oh * g->ow;
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t ky = 0; ky < g->kh; ky++)
      for (int64_t kx = 0; kx < g->kw; kx++) {
        float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        int64_t lo, hi;
        ox_range(g, kx, &lo, &hi);
        for (int64_t oy = 0; oy < g->oh; oy++) {
          float *d = row + oy * g->ow;
          int64_t iy = oy * g->s + ky - g->pad;
          if (iy < 0 || iy >= g->h || lo >= hi) {
            memset(d, 0, (size_t)g->ow * sizeof(float));
            continue;
          }
          int64_t src = at + (c * g->h + iy) * g->w + kx - g->pad;
          for (int64_t ox = 0; ox < lo; ox++) d[ox] = 0.0f;
          if (g->s == 1) {
            act_load(x, dt, src + lo, d + lo, hi - lo);
          } else {
            for (int64_t ox = lo; ox < hi; ox++) d[ox] = act_get(x, dt, src + ox * g->s);
          }
          for (int64_t ox = hi; ox < g->ow; ox++) d[ox] = 0.0f;
        }
      }
}

/* img[c][iy][ix] += col[...] — the adjoint of im2col; img is fp32 [c][h][w]. */
static void col2im(const conv_t *g, float *col, float *img) {
  if (is_same_s1(g)) {
    col2im_same(g, col, img);
    return;
  }
  int64_t P = g->oh * g->ow;
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t ky = 0; ky < g->kh; ky++)
      for (int64_t kx = 0; kx < g->kw; kx++) {
        const float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        int64_t lo, hi;
        ox_range(g, kx, &lo, &hi);
        for (int64_t oy = 0; oy < g->oh; oy++) {
          int64_t iy = oy * g->s + ky - g->pad;
          if (iy < 0 || iy >= g->h) continue;
          float *d = img + (c * g->h + iy) * g->w + kx - g->pad;
          const float *s = row + oy * g->ow;
          if (g->s == 1) {
            int64_t ox = lo;
#if defined(__AVX512F__)
            for (; ox < hi; ox += 16) {
              __mmask16 m = mask16(hi - ox);
              _mm512_mask_storeu_ps(d + ox, m,
                                    _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + ox),
                                                  _mm512_maskz_loadu_ps(m, s + ox)));
            }
#endif
            for (; ox < hi; ox++) d[ox] += s[ox];
          } else {
            for (int64_t ox = lo; ox < hi; ox++) d[ox * g->s] += s[ox];
          }
        }
      }
}

/*
 * Short K (a first layer: C = 1, 3x3 gives K = 9): the GEMM's tiles suit K in the hundreds;
 * with K = 9 a 14x32 tile does 9 FMA steps, then stores 28 vectors of fp32 that a separate
 * pass converts to fp16, and the weight gradient packs (transposes and converts) dY for 9
 * FMAs per element packed. Here the sums run in registers along P, 16 outputs at a time
 * (GCC's generic vectors: AVX-512, AVX2 or SSE, as the build allows), with K a constant of
 * the inlined body for the CNN's K = 9.
 */
#define PS_SMALL_K 12
typedef float v16f __attribute__((vector_size(64)));
/* The same vector at float alignment, for unaligned loads. */
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
#define ld16(p) (*(const v16u *)(p))

/* y[o][p] = sum_k w[o][k] col[k][p] for 4 output channels at a time (w and y dtype dt; y at element
 * offset yat); row: 4*P floats. */
static inline __attribute__((always_inline)) void fwd_small_k_body(const float *col, const void *w,
                                                                   void *y, int32_t dt, int64_t yat,
                                                                   int64_t K, int64_t co, int64_t P,
                                                                   float *row) {
  for (int64_t o0 = 0; o0 < co; o0 += 4) {
    int64_t no = co - o0 < 4 ? co - o0 : 4;
    float wf[4][PS_SMALL_K] = {{0}};
    for (int64_t o = 0; o < no; o++)
      for (int64_t k = 0; k < K; k++) wf[o][k] = act_get(w, dt, (o0 + o) * K + k);
    int64_t p = 0;
    for (; p + 16 <= P; p += 16) {
      v16f c = ld16(col + p);
      v16f a0 = wf[0][0] * c, a1 = wf[1][0] * c, a2 = wf[2][0] * c, a3 = wf[3][0] * c;
      for (int64_t k = 1; k < K; k++) {
        c = ld16(col + k * P + p);
        a0 += wf[0][k] * c, a1 += wf[1][k] * c, a2 += wf[2][k] * c, a3 += wf[3][k] * c;
      }
      memcpy(row + p, &a0, 64), memcpy(row + P + p, &a1, 64);
      memcpy(row + 2 * P + p, &a2, 64), memcpy(row + 3 * P + p, &a3, 64);
    }
    for (; p < P; p++)
      for (int64_t o = 0; o < 4; o++) {
        float a = wf[o][0] * col[p];
        for (int64_t k = 1; k < K; k++) a += wf[o][k] * col[k * P + p];
        row[o * P + p] = a;
      }
    act_store(row, y, dt, yat + o0 * P, no * P);
  }
}

static void fwd_small_k(const float *col, const void *w, void *y, int32_t dt, int64_t yat,
                        int64_t K, int64_t co, int64_t P, float *row) {
  if (K == 9)
    fwd_small_k_body(col, w, y, dt, yat, 9, co, P, row);
  else
    fwd_small_k_body(col, w, y, dt, yat, K, co, P, row);
}

/* acc[k][o] (16 lanes each) += col[k][p] dy[o][p] over p, for the image's dy at element offset
 * `at` (dtype dt); row: P floats of scratch. */
static inline __attribute__((always_inline)) void bwd_weight_small_k_body(
    const float *col, const void *dy, int32_t dt, int64_t at, v16f *acc, int64_t K, int64_t co,
    int64_t P, float *row, float *tail) {
  for (int64_t o = 0; o < co; o++) {
    act_load(dy, dt, at + o * P, row, P);
    v16f a[PS_SMALL_K];
    for (int64_t k = 0; k < K; k++) a[k] = acc[k * co + o];
    int64_t p = 0;
    for (; p + 16 <= P; p += 16) {
      v16f d = ld16(row + p);
      for (int64_t k = 0; k < K; k++) a[k] += d * ld16(col + k * P + p);
    }
    for (int64_t k = 0; k < K; k++) acc[k * co + o] = a[k];
    for (; p < P; p++)
      for (int64_t k = 0; k < K; k++) tail[k * co + o] += row[p] * col[k * P + p];
  }
}

static void bwd_weight_small_k(const float *col, const void *dy, int32_t dt, int64_t at, v16f *acc,
                               int64_t K, int64_t co, int64_t P, float *row, float *tail) {
  if (K == 9)
    bwd_weight_small_k_body(col, dy, dt, at, acc, 9, co, P, row, tail);
  else
    bwd_weight_small_k_body(col, dy, dt, at, acc, K, co, P, row, tail);
}

/* ps_nn_conv2d_forward: one image per task. */
typedef struct {
  const conv_t *g;
  const void *x, *w; /* x [n][c][h][w]; w [co][K] (dtype dt, as y) */
  const float *wt;   /* W^T [K][co] in fp32 */
  void *y;           /* [n][co][P] */
  int32_t dt;
  _Atomic int failed;
} conv_fwd_ctx;

static void conv_fwd_task(void *vctx, int64_t i) {
  conv_fwd_ctx *x = vctx;
  const conv_t *g = x->g;
  int64_t K = g->c * g->kh * g->kw, P = g->oh * g->ow, co = g->co;
  /* yt: the GEMM's fp32 output, or the short-K path's rows of 4 channels */
  float *col = ps_workspace(WS_COL, (size_t)(K * P)),
        *yt = ps_workspace(WS_OUT, (size_t)(P * (co < 4 ? 4 : co)));
  if (!col || !yt) {
    atomic_store(&x->failed, 1);
    return;
  }
  im2col(g, x->x, x->dt, i * g->c * g->h * g->w, col);
  if (K <= PS_SMALL_K) {
    fwd_small_k(col, x->w, x->y, x->dt, i * co * P, K, co, P, yt);
    return;
  }
  if (K < 64) {
    /* Short K (a first layer): the transposed store would cost more than the GEMM, so
     * compute Y[Co, P] = W . col directly and store it contiguously. */
    const mat_t A = {.p = x->w, .dt = x->dt, .rs = K, .cs = 1};
    const mat_t B = {.p = col, .dt = PS_NN_F32, .rs = P, .cs = 1};
    if (ps_gemm(co, P, K, &A, &B, yt, P, 0)) {
      atomic_store(&x->failed, 1);
      return;
    }
    act_store(yt, x->y, x->dt, i * co * P, co * P);
    return;
  }
  const mat_t A = {.p = col, .dt = PS_NN_F32, .rs = 1, .cs = P};
  const mat_t B = {.p = x->wt, .dt = PS_NN_F32, .rs = co, .cs = 1};
  if (ps_gemm(P, co, K, &A, &B, yt, co, 0)) {
    atomic_store(&x->failed, 1);
    return;
  }
  if (x->dt != PS_NN_F32)
    transpose_to_half(yt, co, P, co, (uint16_t *)x->y + i * co * P, x->dt, P);
  else
    transpose_to_f32(yt, PS_NN_F32, co, P, co, (float *)x->y + i * co * P, P);
}

PS_API int ps_nn_conv2d_forward(const void *x, const void *w, void *y, int32_t dtype, int64_t n,
                                int64_t c, int64_t h, int64_t w_, int64_t co, int32_t kh,
                                int32_t kw, int32_t stride, int32_t pad, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  const int32_t dt = dtype;
  const int64_t es = dtsize(dtype);
  conv_t g;
  int st = ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  if (n == 0) return PS_OK;
  int64_t K = c * kh * kw, P = g.oh * g.ow;
  CHECK_RANGE(x, n * c * h * w_ * es);
  CHECK_RANGE(w, co * K * es);
  CHECK_RANGE(y, n * co * P * es);
  /* W^T [K][Co] in fp32 once, so the B packing reads contiguous rows. */
  float *wt = ps_call_scratch((size_t)(K * co));
  if (!wt) OOM();
  for (int64_t o = 0; o < co; o++)
    for (int64_t k = 0; k < K; k++) wt[k * co + o] = act_get(w, dt, o * K + k);
  conv_fwd_ctx cx = {.g = &g, .x = x, .w = w, .wt = wt, .y = y, .dt = dt};
  ps_pool_for(n, conv_fwd_task, &cx); /* one image per task */
  if (atomic_load(&cx.failed)) OOM();
  return PS_OK;
}

/* ps_nn_conv2d_backward_data: one image per task. */
typedef struct {
  const conv_t *g;
  const void *w, *dy; /* w [co][K]; dy [n][co][P] (dtype dt, as dx) */
  void *dx;           /* [n][c][h][w] */
  int32_t dt;
  _Atomic int failed;
} conv_bwd_data_ctx;

static void conv_bwd_data_task(void *vctx, int64_t i) {
  conv_bwd_data_ctx *x = vctx;
  const conv_t *g = x->g;
  int64_t K = g->c * g->kh * g->kw, P = g->oh * g->ow, HW = g->h * g->w, co = g->co;
  float *dcol = ps_workspace(WS_COL, (size_t)(K * P)),
        *img = ps_workspace(WS_IMG, (size_t)(g->c * HW));
  if (!dcol || !img) {
    atomic_store(&x->failed, 1);
    return;
  }
  /* dcol[K][P] = W^T . dY: A(kk, o) = w[o*K + kk], B(o, p) = dy[o*P + p]. */
  const mat_t A = {.p = x->w, .dt = x->dt, .rs = 1, .cs = K};
  const mat_t B = {.p = act_at(x->dy, x->dt, i * co * P), .dt = x->dt, .rs = P, .cs = 1};
  if (ps_gemm(K, P, co, &A, &B, dcol, P, 0)) {
    atomic_store(&x->failed, 1);
    return;
  }
  memset(img, 0, (size_t)(g->c * HW) * sizeof(float));
  col2im(g, dcol, img);
  act_store(img, x->dx, x->dt, i * g->c * HW, g->c * HW);
}

PS_API int ps_nn_conv2d_backward_data(const void *dy, const void *w, void *dx, int32_t dtype,
                                      int64_t n, int64_t c, int64_t h, int64_t w_, int64_t co,
                                      int32_t kh, int32_t kw, int32_t stride, int32_t pad,
                                      void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  const int64_t es = dtsize(dtype);
  conv_t g;
  int st = ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  if (n == 0) return PS_OK;
  int64_t K = c * kh * kw, P = g.oh * g.ow, HW = h * w_;
  CHECK_RANGE(dy, n * co * P * es);
  CHECK_RANGE(w, co * K * es);
  CHECK_RANGE(dx, n * c * HW * es);
  conv_bwd_data_ctx cx = {.g = &g, .w = w, .dy = dy, .dx = dx, .dt = dtype};
  ps_pool_for(n, conv_bwd_data_task, &cx); /* one image per task */
  if (atomic_load(&cx.failed)) OOM();
  return PS_OK;
}

/* ps_nn_conv2d_backward_weight: one fixed chunk of the batch per task. */
typedef struct {
  const conv_t *g;
  const void *x, *dy; /* x [n][c][h][w]; dy [n][co][P] (dtype dt) */
  int32_t dt;
  float *part;    /* one [K][co] partial per chunk */
  int64_t chunks; /* images split into this many fixed chunks */
  _Atomic int failed;
} conv_bwd_weight_ctx;

static void conv_bwd_weight_task(void *vctx, int64_t chunk) {
  conv_bwd_weight_ctx *x = vctx;
  const conv_t *g = x->g;
  int64_t K = g->c * g->kh * g->kw, P = g->oh * g->ow, HW = g->h * g->w, co = g->co;
  float *mine = x->part + chunk * K * co;
  float *col = ps_workspace(WS_COL, (size_t)(K * P));
  if (!col) {
    atomic_store(&x->failed, 1);
    return;
  }
  int64_t i0 = g->n * chunk / x->chunks, i1 = g->n * (chunk + 1) / x->chunks;
  if (K <= PS_SMALL_K) {
    /* 16-lane sums per (k, o) over the chunk's images, reduced once at the end; the P % 16
     * columns of each row go to `tail`. Fixed order: still reproducible. */
    float *ws = ps_workspace(WS_OUT, (size_t)(K * co * 17 + P));
    if (!ws) {
      atomic_store(&x->failed, 1);
      return;
    }
    v16f *acc = (v16f *)ws; /* 64-byte aligned workspace */
    float *tail = ws + K * co * 16, *row = tail + K * co;
    memset(ws, 0, (size_t)(K * co * 17) * sizeof(float));
    for (int64_t i = i0; i < i1; i++) {
      im2col(g, x->x, x->dt, i * g->c * HW, col);
      bwd_weight_small_k(col, x->dy, x->dt, i * co * P, acc, K, co, P, row, tail);
    }
    for (int64_t r = 0; r < K * co; r++) {
      float t = tail[r];
      for (int l = 0; l < 16; l++) t += acc[r][l];
      mine[r] = t;
    }
    return;
  }
  for (int64_t i = i0; i < i1; i++) {
    im2col(g, x->x, x->dt, i * g->c * HW, col);
    /* dW^T[K][Co] (+)= col . dY^T: A(kk, p) = col[kk*P + p], B(p, o) = dy[o*P + p]. */
    const mat_t A = {.p = col, .dt = PS_NN_F32, .rs = P, .cs = 1};
    const mat_t B = {.p = act_at(x->dy, x->dt, i * co * P), .dt = x->dt, .rs = 1, .cs = P};
    if (ps_gemm(K, co, P, &A, &B, mine, co, i > i0)) {
      atomic_store(&x->failed, 1);
      return;
    }
  }
}

PS_API int ps_nn_conv2d_backward_weight(const void *x, const void *dy, int32_t dtype, void *dw,
                                        int32_t dw_dtype, int64_t n, int64_t c, int64_t h,
                                        int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                        int32_t stride, int32_t pad, int32_t accumulate,
                                        void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(dw_dtype);
  const int64_t es = dtsize(dtype);
  conv_t g;
  int st = ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  int64_t K = c * kh * kw, P = g.oh * g.ow, HW = h * w_;
  CHECK_RANGE(x, n * c * HW * es);
  CHECK_RANGE(dy, n * co * P * es);
  CHECK_RANGE(dw, co * K * dtsize(dw_dtype));
  /* The batch is cut into a fixed number of chunks, each summed into its own partial and the
   * partials added in chunk order: the result does not depend on which thread ran what, so
   * it is bit-for-bit reproducible. Several chunks per thread keep a preempted thread from
   * holding the others up for long. */
  int64_t chunks = 4 * (int64_t)ps_pool_threads();
  if (chunks > n) chunks = n;
  if (chunks < 1) chunks = 1;
  float *part = ps_call_scratch((size_t)(chunks * K * co));
  if (!part) OOM();
  if (n == 0) memset(part, 0, (size_t)(K * co) * sizeof(float));
  conv_bwd_weight_ctx cx = {.g = &g, .x = x, .dy = dy, .dt = dtype, .part = part, .chunks = chunks};
  ps_pool_for(n > 0 ? chunks : 0, conv_bwd_weight_task, &cx);
  if (atomic_load(&cx.failed)) OOM();
  /* dw[o][ci][ky][kx] = sum over chunks of part[chunk][(ci*kh + ky)*kw + kx][o] */
  for (int64_t o = 0; o < co; o++)
    for (int64_t r = 0; r < K; r++) {
      float s = 0.0f;
      for (int64_t t = 0; t < chunks; t++) s += part[t * K * co + r * co + o];
      int64_t di = o * K + r;
      act_set(dw, dw_dtype, di, accumulate ? act_get(dw, dw_dtype, di) + s : s);
    }
  return PS_OK;
}
