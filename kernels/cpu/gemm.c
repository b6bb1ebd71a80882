/*
 * gemm.c — the CPU backend's fp32 GEMM, and ps_nn_matmul on top of it.
 *
 * Storage is fp16 (activations, gradients, forward weights); all arithmetic is fp32.
 * Everything heavy is this one GEMM, fed by packing routines that convert fp16 -> fp32 while
 * they copy, so the micro-kernel only ever sees fp32 panels (conv.c says how convolutions
 * map onto it). Packing reads rows of 16 and transposes in registers where the operand runs
 * the other way (16x16 AVX-512 transposes, fp16.h), so no orientation is much dearer than
 * another; MR = 14 divides P = 196 and 784 (28x28 and 14x14 feature maps), NR = 32 divides
 * the usual channel counts.
 *
 * Operands are strided views (element (i,j) at p[i*rs + j*cs]) of fp16 or fp32 memory, so
 * transposes cost nothing but a different packing path. Blocking (BLIS style): B is packed
 * in KC x NC blocks into NR-wide k-major panels, A in MC x KC blocks into MR-tall panels; the
 * 14x32 micro-kernel keeps 28 zmm accumulators (of 32 registers) and per k step loads two B
 * vectors and broadcasts 14 A values: 28 FMAs to 16 loads, so two FMA ports stay busy.
 * KC <= 256 keeps one B micro-panel (32 x 256 x 4 B = 32 KiB) in the 48 KiB L1 while the
 * A panels stream from L2.
 *
 * Performance (Xeon Sapphire Rapids, AVX-512, 2 cores at ~2.3-3 GHz; peak 64 fp32
 * FLOP/cycle/core, i.e. ~150-190 GFLOP/s per core). Predicted before tuning: ~60-70% of
 * peak on large square GEMMs (~200 GFLOP/s on 2 cores) and ~50% on the CNN's conv shapes,
 * where im2col and packing are 15-25% of the work.
 *
 * Measured (bench/kernels.ts, 2 threads, batch 128, quiet machine):
 *   matmul 1024^3 -> f32                       ~290 GFLOP/s (as predicted: the micro-kernel
 *                                              runs near peak once packing is amortized)
 *   conv 32->64 3x3 on 14x14: fwd / bwd-data / bwd-weight   ~175 / ~155 / ~175 GFLOP/s
 *   conv 1->32 3x3 on 28x28 (K = 9: tile overhead dominates)  ~70 / ~85 / ~65 GFLOP/s
 * With scalar conversions in the transposing paths (the conv epilogue and packing) those cost
 * more than the FMAs (60 / 87 / 98 GFLOP/s on conv2): hence the 16x16 register transposes
 * and masked short rows.
 * The machine is shared: with other processes on the two cores these numbers drop 2-4x.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "gemm.h"
#include "nn.h"
#include "threads.h"

#define KC_MAX 256
#define MC (MR * 24)
#define NC (NR * 16)

static inline float mat_at(const mat_t *m, int64_t i, int64_t j) {
  int64_t o = i * m->rs + j * m->cs;
  return act_get(m->p, m->dt, o);
}

/* Packs rows [i0, i0+mc) x cols [k0, k0+kc) of A into MR-tall panels, each k-major
 * (dst[panel*MR*kc + k*MR + i]), zero-padding the last panel. */
static void pack_a(float *restrict dst, const mat_t *a, int64_t i0, int64_t mc, int64_t k0,
                   int64_t kc) {
  for (int64_t ip = 0; ip < mc; ip += MR) {
    int64_t rows = mc - ip < MR ? mc - ip : MR;
    float *d = dst + ip * kc;
    if (a->rs == 1) { /* the MR rows of one k are contiguous */
#if defined(__AVX512F__)
      __mmask16 mk = (__mmask16)((1u << rows) - 1u);
      if (a->dt != PS_NN_F32) {
        const uint16_t *s = (const uint16_t *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs)
          _mm512_mask_storeu_ps(d + k * MR, 0x3fff, load16(s, a->dt, rows));
      } else {
        const float *s = (const float *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs)
          _mm512_mask_storeu_ps(d + k * MR, 0x3fff, _mm512_maskz_loadu_ps(mk, s));
      }
      continue;
#elif defined(PS_GEMM_AVX2)
      /* MR = 6 values per k: a masked (f32) or copied (f16) short load, zero past `rows`. */
      const __m256i mk = mask8(MR);
      if (a->dt != PS_NN_F32) {
        const uint16_t *s = (const uint16_t *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs) {
          __m256 v;
          if (rows == MR) { /* 6 halves: 8 bytes + 4 bytes, no read past them */
            int32_t hi;
            memcpy(&hi, s + 4, 4);
            const __m128i h = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)s), hi, 2);
            v = a->dt == PS_NN_F16 ? _mm256_cvtph_ps(h) : b2f8(h);
          } else {
            v = load8(s, a->dt, rows);
          }
          _mm256_maskstore_ps(d + k * MR, mk, v);
        }
      } else {
        const float *s = (const float *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs)
          _mm256_maskstore_ps(d + k * MR, mk, load8(s, PS_NN_F32, rows));
      }
      continue;
#endif
    }
    if (rows < MR)
      for (int64_t k = 0; k < kc; k++)
        for (int64_t i = rows; i < MR; i++) d[k * MR + i] = 0.0f;
    if (a->cs == 1) { /* each row is contiguous along k: transpose while packing */
      int64_t off = (i0 + ip) * a->rs + k0;
      transpose_to_f32(act_at(a->p, a->dt, off), a->dt, a->rs, rows, kc, d, MR);
    } else {
      for (int64_t k = 0; k < kc; k++)
        for (int64_t i = 0; i < rows; i++) d[k * MR + i] = mat_at(a, i0 + ip + i, k0 + k);
    }
  }
}

/* Packs rows [k0, k0+kc) x cols [j0, j0+nc) of B into NR-wide panels, each k-major
 * (dst[panel*NR*kc + k*NR + j]), zero-padding the last panel. */
static void pack_b(float *restrict dst, const mat_t *b, int64_t k0, int64_t kc, int64_t j0,
                   int64_t nc) {
  for (int64_t jp = 0; jp < nc; jp += NR) {
    int64_t cols = nc - jp < NR ? nc - jp : NR;
    float *d = dst + jp * kc;
    if (b->cs == 1) { /* the NR columns of one k are contiguous */
#if defined(__AVX512F__)
      uint32_t bits = cols >= 32 ? 0xffffffffu : ((1u << cols) - 1u);
      __mmask16 m0 = (__mmask16)(bits & 0xffffu), m1 = (__mmask16)(bits >> 16);
      if (b->dt == PS_NN_F16) {
        const half *s = (const half *)b->p + k0 * b->rs + j0 + jp;
        for (int64_t k = 0; k < kc; k++, s += b->rs) {
          _mm512_store_ps(d + k * NR, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, s)));
          _mm512_store_ps(d + k * NR + 16, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, s + 16)));
        }
      } else if (b->dt == PS_NN_BF16) {
        const uint16_t *s = (const uint16_t *)b->p + k0 * b->rs + j0 + jp;
        for (int64_t k = 0; k < kc; k++, s += b->rs) {
          _mm512_store_ps(d + k * NR, b2f16(_mm256_maskz_loadu_epi16(m0, s)));
          _mm512_store_ps(d + k * NR + 16, b2f16(_mm256_maskz_loadu_epi16(m1, s + 16)));
        }
      } else {
        const float *s = (const float *)b->p + k0 * b->rs + j0 + jp;
        for (int64_t k = 0; k < kc; k++, s += b->rs) {
          _mm512_store_ps(d + k * NR, _mm512_maskz_loadu_ps(m0, s));
          _mm512_store_ps(d + k * NR + 16, _mm512_maskz_loadu_ps(m1, s + 16));
        }
      }
      continue;
#elif defined(PS_GEMM_AVX2)
      const void *s0 = act_at(b->p, b->dt, k0 * b->rs + j0 + jp);
      const int64_t es = act_bytes(b->dt), step = b->rs * es;
      for (int64_t k = 0; k < kc; k++) {
        const char *s = (const char *)s0 + k * step;
        _mm256_store_ps(d + k * NR, load8(s, b->dt, cols));
        _mm256_store_ps(d + k * NR + 8, load8(s + 8 * es, b->dt, cols - 8));
      }
      continue;
#else
      for (int64_t k = 0; k < kc; k++) {
        for (int64_t j = 0; j < cols; j++) d[k * NR + j] = mat_at(b, k0 + k, j0 + jp + j);
        for (int64_t j = cols; j < NR; j++) d[k * NR + j] = 0.0f;
      }
      continue;
#endif
    }
    if (cols < NR)
      for (int64_t k = 0; k < kc; k++)
        for (int64_t j = cols; j < NR; j++) d[k * NR + j] = 0.0f;
    if (b->rs == 1) { /* each column contiguous along k: transpose while packing */
      int64_t off = (j0 + jp) * b->cs + k0;
      transpose_to_f32(act_at(b->p, b->dt, off), b->dt, b->cs, cols, kc, d, NR);
    } else {
      for (int64_t k = 0; k < kc; k++)
        for (int64_t j = 0; j < cols; j++) d[k * NR + j] = mat_at(b, k0 + k, j0 + jp + j);
    }
  }
}

/* c[MR x NR] (ldc) = (first ? 0 : c) + a_panel . b_panel over kc (14 x 32 with AVX-512, 6 x 16
 * with AVX2: gemm.h). */
static void kernel_tile(int64_t kc, const float *restrict a, const float *restrict b,
                        float *restrict c, int64_t ldc, int first) {
#if defined(__AVX512F__) || defined(PS_GEMM_AVX2)
  /* One body for both vector ISAs: MR rows, each two vectors of NR / 2 lanes, held in
   * registers for the whole k loop; a[i] is broadcast and multiplied into both. */
#if defined(__AVX512F__)
  typedef __m512 vec;
#define PS_W 16
#define PS_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define PS_ZERO() _mm512_setzero_ps()
#define PS_SET1(p) _mm512_set1_ps(*(p))
#define PS_FMADD(x, y, z) _mm512_fmadd_ps(x, y, z)
#define PS_ADD(x, y) _mm512_add_ps(x, y)
#define PS_LOAD(p) _mm512_load_ps(p)
#define PS_LOADU(p) _mm512_loadu_ps(p)
#define PS_STOREU(p, v) _mm512_storeu_ps(p, v)
#else
  typedef __m256 vec;
#define PS_W 8
#define PS_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define PS_ZERO() _mm256_setzero_ps()
#define PS_SET1(p) _mm256_broadcast_ss(p)
#define PS_FMADD(x, y, z) _mm256_fmadd_ps(x, y, z)
#define PS_ADD(x, y) _mm256_add_ps(x, y)
#define PS_LOAD(p) _mm256_load_ps(p)
#define PS_LOADU(p) _mm256_loadu_ps(p)
#define PS_STOREU(p, v) _mm256_storeu_ps(p, v)
#endif
#define PS_DECL(i) vec c##i##a = PS_ZERO(), c##i##b = PS_ZERO();
#define PS_FMA(i)                        \
  {                                      \
    vec ai = PS_SET1(a + (i));           \
    c##i##a = PS_FMADD(ai, b0, c##i##a); \
    c##i##b = PS_FMADD(ai, b1, c##i##b); \
  }
#define PS_STORE(i)                                  \
  {                                                  \
    float *r = c + (i)*ldc;                          \
    if (!first) {                                    \
      c##i##a = PS_ADD(c##i##a, PS_LOADU(r));        \
      c##i##b = PS_ADD(c##i##b, PS_LOADU(r + PS_W)); \
    }                                                \
    PS_STOREU(r, c##i##a);                           \
    PS_STOREU(r + PS_W, c##i##b);                    \
  }
  PS_ROWS(PS_DECL)
  for (int64_t k = 0; k < kc; k++) {
    vec b0 = PS_LOAD(b), b1 = PS_LOAD(b + PS_W);
    PS_ROWS(PS_FMA)
    a += MR;
    b += NR;
  }
  PS_ROWS(PS_STORE)
#undef PS_W
#undef PS_ROWS
#undef PS_ZERO
#undef PS_SET1
#undef PS_FMADD
#undef PS_ADD
#undef PS_LOAD
#undef PS_LOADU
#undef PS_STOREU
#undef PS_DECL
#undef PS_FMA
#undef PS_STORE
#else
  float acc[MR][NR];
  memset(acc, 0, sizeof acc);
  for (int64_t k = 0; k < kc; k++, a += MR, b += NR)
    for (int i = 0; i < MR; i++)
      for (int j = 0; j < NR; j++) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) c[i * ldc + j] = (first ? 0.0f : c[i * ldc + j]) + acc[i][j];
#endif
}

/* The GEMM proper; pre_a / pre_b, when not NULL, hold A / B already packed over the whole K
 * (ps_gemm_pre in gemm.h), and that operand is not packed here. */
static int gemm(int64_t M, int64_t N, int64_t K, const mat_t *A, const mat_t *B, float *C,
                int64_t ldc, int acc, const float *pre_a, const float *pre_b) {
  if (M <= 0 || N <= 0) return 0;
  if (K <= 0) {
    if (!acc)
      for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
    return 0;
  }
  /* Split K evenly into blocks of at most KC_MAX (288 -> 2 x 144, not 256 + 32). */
  int64_t nkb = (K + KC_MAX - 1) / KC_MAX, kcb = (K + nkb - 1) / nkb;
  int64_t ncap = N < NC ? (N + NR - 1) / NR * NR : NC, mcap = M < MC ? (M + MR - 1) / MR * MR : MC;
  float *pa = pre_a ? NULL : ps_workspace(WS_PACK_A, (size_t)(mcap * kcb)),
        *pb = pre_b ? NULL : ps_workspace(WS_PACK_B, (size_t)(ncap * kcb));
  if ((!pa && !pre_a) || (!pb && !pre_b)) return -1;
  float tile[MR * NR] __attribute__((aligned(64)));
  for (int64_t jc = 0; jc < N; jc += NC) {
    int64_t nc = N - jc < NC ? N - jc : NC;
    for (int64_t pc = 0; pc < K; pc += kcb) {
      int64_t kc = K - pc < kcb ? K - pc : kcb;
      int first = pc == 0 && !acc;
      if (!pre_b) pack_b(pb, B, pc, kc, jc, nc);
      for (int64_t ic = 0; ic < M; ic += MC) {
        int64_t mc = M - ic < MC ? M - ic : MC;
        if (!pre_a) pack_a(pa, A, ic, mc, pc, kc);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          int64_t nr = nc - jr < NR ? nc - jr : NR;
          /* A whole-K packed panel is [K][NR]: block pc starts pc rows in. */
          const float *bp = pre_b ? pre_b + (jc + jr) * K + pc * NR : pb + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t mr = mc - ir < MR ? mc - ir : MR;
            const float *ap = pre_a ? pre_a + (ic + ir) * K + pc * MR : pa + ir * kc;
            float *c = C + (ic + ir) * ldc + jc + jr;
            if (mr == MR && nr == NR) {
              kernel_tile(kc, ap, bp, c, ldc, first);
            } else {
              kernel_tile(kc, ap, bp, tile, NR, 1);
              for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < nr; j++)
                  c[i * ldc + j] = (first ? 0.0f : c[i * ldc + j]) + tile[i * NR + j];
            }
          }
        }
      }
    }
  }
  return 0;
}

int ps_gemm(int64_t M, int64_t N, int64_t K, const mat_t *A, const mat_t *B, float *C, int64_t ldc,
            int acc) {
  return gemm(M, N, K, A, B, C, ldc, acc, NULL, NULL);
}

/* ---- ps_nn_matmul ---------------------------------------------------------------------- */

/*
 * ps_nn_matmul: `parts` tasks, each a range of whole MR-row (split_m) or NR-column tiles.
 * The operand every task reads in full (B when rows are split, A when columns are) is packed
 * once, over the whole K, by its own parallel pass: before, each of the 4 tasks packed (and
 * converted, and for a transposed operand transposed) all of it, which on the MLP's
 * 128x256x784 layer cost as much as the FMAs. Each task also writes its own part of an fp16
 * output, so no serial conversion pass follows.
 */
typedef struct {
  const mat_t *A, *B;
  float *out;  /* fp32 result [m][n] (the output itself when it is f32) */
  void *out16; /* the fp16 or bf16 output (out_dt), or NULL */
  int32_t out_dt;
  float *pre; /* the shared operand packed over K, or NULL */
  int64_t m, n, k;
  int acc, acc16, split_m;
  int64_t tiles, parts;
  _Atomic int failed;
} matmul_ctx;

/* d = (half) (s + (acc ? d : 0)) for n elements of d, fp16 or bf16 by dt. */
static void f2h_acc_row(const float *s, void *dv, int32_t dt, int64_t n, int acc) {
  if (dt == PS_NN_BF16) {
    uint16_t *d = (uint16_t *)dv;
    if (!acc) {
      f2b_row(s, d, n);
      return;
    }
    for (int64_t i = 0; i < n; i++) d[i] = ps_bf16_from_f32(s[i] + ps_bf16_to_f32(d[i]));
    return;
  }
  half *d = (half *)dv;
  if (!acc) {
    f2h_row(s, d, n);
    return;
  }
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(s + i),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + i))));
    _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
#elif defined(PS_GEMM_AVX2)
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(s + i),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + i))));
    _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; i++) d[i] = f2h(s[i] + h2f(d[i]));
}

/* Packs part p of the shared operand: a range of whole panels. */
static void matmul_pack_task(void *vctx, int64_t p) {
  matmul_ctx *x = vctx;
  if (x->split_m) { /* B [k][n] into NR-wide panels */
    int64_t panels = (x->n + NR - 1) / NR;
    int64_t j0 = panels * p / x->parts * NR, j1 = panels * (p + 1) / x->parts * NR;
    if (j1 > x->n) j1 = x->n;
    if (j1 > j0) pack_b(x->pre + j0 * x->k, x->B, 0, x->k, j0, j1 - j0);
  } else { /* A [m][k] into MR-tall panels */
    int64_t panels = (x->m + MR - 1) / MR;
    int64_t i0 = panels * p / x->parts * MR, i1 = panels * (p + 1) / x->parts * MR;
    if (i1 > x->m) i1 = x->m;
    if (i1 > i0) pack_a(x->pre + i0 * x->k, x->A, i0, i1 - i0, 0, x->k);
  }
}

static void matmul_task(void *vctx, int64_t p) {
  matmul_ctx *x = vctx;
  int64_t t0 = x->tiles * p / x->parts, t1 = x->tiles * (p + 1) / x->parts;
  int bad;
  if (x->split_m) {
    int64_t i0 = t0 * MR, i1 = t1 * MR < x->m ? t1 * MR : x->m;
    mat_t Ap = *x->A;
    Ap.p = act_at(Ap.p, Ap.dt, i0 * Ap.rs);
    bad = gemm(i1 - i0, x->n, x->k, &Ap, x->B, x->out + i0 * x->n, x->n, x->acc, NULL, x->pre);
    if (!bad && x->out16)
      f2h_acc_row(x->out + i0 * x->n, (uint16_t *)x->out16 + i0 * x->n, x->out_dt, (i1 - i0) * x->n,
                  x->acc16);
  } else {
    int64_t j0 = t0 * NR, j1 = t1 * NR < x->n ? t1 * NR : x->n;
    mat_t Bp = *x->B;
    Bp.p = act_at(Bp.p, Bp.dt, j0 * Bp.cs);
    bad = gemm(x->m, j1 - j0, x->k, x->A, &Bp, x->out + j0, x->n, x->acc, x->pre, NULL);
    if (!bad && x->out16)
      for (int64_t i = 0; i < x->m; i++)
        f2h_acc_row(x->out + i * x->n + j0, (uint16_t *)x->out16 + i * x->n + j0, x->out_dt,
                    j1 - j0, x->acc16);
  }
  if (bad) atomic_store(&x->failed, 1);
}

/* Work done per useful multiply-add when C is m x n: the tiles round m up to MR, n to NR. */
static double tile_waste(int64_t m, int64_t n) {
  return (double)((m + MR - 1) / MR * MR) * (double)((n + NR - 1) / NR * NR) /
         ((double)m * (double)n);
}

/* out[m][n] = (acc ? out : 0) + A . B on the pool; with out16, also out16 = half(out (+
 * out16 when acc16)), fp16 or bf16 by out_dt. Returns nonzero when out of memory. */
static int run_matmul(const mat_t *A, const mat_t *B, int64_t m, int64_t n, int64_t k, float *out,
                      void *out16, int32_t out_dt, int acc, int acc16) {
  /* Split the longer side, in whole tiles, into about 2 parts per thread. */
  int64_t mt = (m + MR - 1) / MR, ntl = (n + NR - 1) / NR;
  int split_m = mt >= ntl;
  int64_t tiles = split_m ? mt : ntl, want = 2 * (int64_t)ps_pool_threads();
  int64_t parts = (double)m * n * k < 1e5 || tiles < 2 ? 1 : (tiles < want ? tiles : want);
  /* The shared operand is packed once when more than one task would read it. */
  float *pre = NULL;
  if (parts > 1) {
    size_t len = split_m ? (size_t)(ntl * NR * k) : (size_t)(mt * MR * k);
    pre = ps_workspace(WS_MM_PACK, len);
    if (!pre) return -1;
  }
  matmul_ctx mc = {.A = A,
                   .B = B,
                   .out = out,
                   .out16 = out16,
                   .out_dt = out_dt,
                   .pre = pre,
                   .m = m,
                   .n = n,
                   .k = k,
                   .acc = acc,
                   .acc16 = acc16,
                   .split_m = split_m,
                   .tiles = tiles,
                   .parts = parts};
  if (pre) ps_pool_for(parts, matmul_pack_task, &mc);
  ps_pool_for(parts, matmul_task, &mc);
  return atomic_load(&mc.failed);
}

PS_API int ps_nn_matmul(const void *a, const void *b, int32_t dtype, void *c, int32_t c_dtype,
                        int64_t m, int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                        int32_t accumulate, void *stream) {
  (void)stream;
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(c_dtype);
  TRY(ps_check_matmul(m, n, k));
  if (m == 0 || n == 0) return PS_OK;
  CHECK_RANGE(a, m * k * dtsize(dtype));
  CHECK_RANGE(b, k * n * dtsize(dtype));
  CHECK_RANGE(c, m * n * dtsize(c_dtype));
  const mat_t A = {.p = a, .dt = dtype, .rs = trans_a ? 1 : k, .cs = trans_a ? m : 1};
  const mat_t B = {.p = b, .dt = dtype, .rs = trans_b ? 1 : n, .cs = trans_b ? k : 1};
  if (tile_waste(n, m) < 0.8 * tile_waste(m, n)) {
    /* A narrow output (a classifier's 10 columns: 10 of each 32-wide tile used) runs as
     * C^T[n][m] = B^T A^T, where the short side is the MR-tall one, then is transposed back
     * (m x n is small here). */
    const mat_t At = {.p = b, .dt = dtype, .rs = B.cs, .cs = B.rs};
    const mat_t Bt = {.p = a, .dt = dtype, .rs = A.cs, .cs = A.rs};
    float *t = ps_workspace(WS_MM_OUT, (size_t)(m * n));
    if (!t || run_matmul(&At, &Bt, n, m, k, t, NULL, PS_NN_F32, 0, 0)) OOM();
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float v = t[j * m + i];
        act_set(c, c_dtype, i * n + j, accumulate ? act_get(c, c_dtype, i * n + j) + v : v);
      }
    return PS_OK;
  }
  /* f32 output is accumulated in place; fp16 output goes through an fp32 buffer (this
   * thread's workspace: the tasks only write their own parts of it). */
  float *out = c_dtype == PS_NN_F32 ? (float *)c : ps_workspace(WS_MM_OUT, (size_t)(m * n));
  if (!out) OOM();
  if (run_matmul(&A, &B, m, n, k, out, c_dtype == PS_NN_F32 ? NULL : c, c_dtype,
                 accumulate && c_dtype == PS_NN_F32, accumulate && c_dtype != PS_NN_F32))
    OOM();
  return PS_OK;
}

/* The product, the bias and the activation in one call: the CPU has no launch to save, so this
 * runs the three kernels' code one after the other, which gives their bits by construction. */
PS_API int ps_nn_matmul_bias_act(const void *a, const void *b, int32_t dtype, void *c,
                                 int32_t c_dtype, int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                 int32_t trans_b, const void *bias, int32_t bias_dtype, int32_t act,
                                 void *stream) {
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(c_dtype);
  CHECK_DTYPE(bias_dtype);
  if (act != PS_ACT_NONE && act != PS_ACT_RELU)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_nn_matmul_bias_act: act %d is not PS_ACT_NONE or PS_ACT_RELU", (int)act);
  TRY(ps_check_matmul(m, n, k));
  if (m == 0 || n == 0) return PS_OK;
  CHECK_RANGE(bias, n * dtsize(bias_dtype));
  TRY(ps_nn_matmul(a, b, dtype, c, c_dtype, m, n, k, trans_a, trans_b, 0, stream));
  TRY(ps_nn_bias_add(c, c_dtype, bias, bias_dtype, m, n, 1, stream));
  if (act == PS_ACT_RELU) TRY(ps_nn_relu_forward(c, c, c_dtype, m * n, stream));
  return PS_OK;
}
