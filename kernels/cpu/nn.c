/*
 * nn.c — CPU backend of the PS-SECTION nn kernels: the numerical reference of
 * kernels/cuda/nn.cu, and fast enough to train small CNNs on two cores.
 *
 * Storage is fp16 (activations, gradients, forward weights); all arithmetic is fp32.
 * Everything heavy is one fp32 GEMM (gemm_serial below) fed by packing routines that convert
 * fp16 -> fp32 while they copy, so the micro-kernel only ever sees fp32 panels:
 *
 *   conv forward       Y^T[P,Co]  = col^T[P,K] . W^T[K,Co]       (P = OH*OW, K = C*kh*kw)
 *   conv backward data dcol[K,P]  = W^T[K,Co] . dY[Co,P], then col2im (scatter-add)
 *   conv backward wt   dW^T[K,Co] += col[K,P] . dY^T[P,Co]       (summed over the batch)
 *
 * Packing reads rows of 16 and transposes in registers where the operand runs the other way
 * (16x16 AVX-512 transposes), so no orientation is much dearer than another; these are
 * chosen so tile sizes fit the common shapes: MR = 14 divides P = 196 and 784 (28x28 and 14x14
 * feature maps), NR = 32 divides the usual channel counts. Convolutions run one image per
 * OpenMP thread (no synchronization inside a GEMM); plain matmul splits its output in two.
 * Loops whose iterations write disjoint outputs are scheduled dynamically, so a thread that
 * the OS preempts (two cores shared with data-loading workers) does not stall the other;
 * the weight gradient's per-thread partial sums keep a static split, so every result is
 * bit-for-bit reproducible from run to run (checkpoint/resume tests rely on it).
 *
 * Workspaces are per-thread caches that grow to the largest size seen and are kept for the
 * life of the thread (they are not allocations of pinstream objects, so they are not counted
 * in ps_live_objects).
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* dladdr */
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#if defined(__GLIBC__)
#include <dlfcn.h>
#endif
#endif

#include "../pinstream.h"
#include "common.h"

#if defined(_OPENMP)
#define PS_OMP(directive) _Pragma(directive)
static int nthreads(void) { return omp_get_max_threads(); }
static int thread_id(void) { return omp_get_thread_num(); }
#else
#define PS_OMP(directive)
static int nthreads(void) { return 1; }
static int thread_id(void) { return 0; }
#endif

#if defined(_OPENMP) && defined(__GLIBC__)
/* Deno unloads this library when the last Device using it is disposed (dlclose). libgomp's
 * worker threads outlive their parallel regions, asleep inside libgomp: if the dlclose also
 * unmapped libgomp, they would crash the process on wake-up or at exit. Marking libgomp
 * NODELETE keeps it mapped for the life of the process. */
__attribute__((constructor)) static void pin_openmp_runtime(void) {
  Dl_info info;
  if (dladdr((void *)&omp_get_max_threads, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}
#endif

/* ---- fp16 ---------------------------------------------------------------------------- */

#if defined(__FLT16_MAX__)
typedef _Float16 half;
static inline float h2f(half h) { return (float)h; }
static inline half f2h(float f) { return (half)f; } /* round to nearest even */
#else
/* No _Float16 in this compiler: IEEE binary16 bits, converted by hand (RNE). */
typedef uint16_t half;
static inline float h2f(half h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else { /* subnormal: normalize */
    e = 113u;
    while (!(m & 0x400u)) m <<= 1, e--;
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline half f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return (half)(sign | (mag > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (mag >= 0x477ff000u) return (half)(sign | 0x7c00u);
  if (mag < 0x38800000u) {
    if (mag < 0x33000000u) return (half)sign;
    uint32_t e = mag >> 23, m = (mag & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), hf = 1u << (shift - 1u);
    if (rem > hf || (rem == hf && (h & 1u))) h++;
    return (half)(sign | h);
  }
  uint32_t h = (mag - 0x38000000u) >> 13, rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (half)(sign | h);
}
#endif

/* fp16 <-> fp32 rows. GCC 12 leaves these loops scalar, so the 16-wide form is spelled out. */
static void h2f_row(const half *s, float *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
  if (i < n) { /* masked tail: rows here are often shorter than 16 */
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
  }
#else
  for (; i < n; i++) d[i] = h2f(s[i]);
#endif
}
static void f2h_row(const float *s, half *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(d + i, m,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), _MM_FROUND_TO_NEAREST_INT));
  }
#else
  for (; i < n; i++) d[i] = f2h(s[i]);
#endif
}

#if defined(__AVX512F__)
static inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}
/* Up to 16 values of a row (fp16 or fp32) as fp32 lanes, zero past n. */
static inline __m512 load16(const void *p, int f16, int64_t n) {
  __mmask16 m = mask16(n);
  return f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)) : _mm512_maskz_loadu_ps(m, p);
}
/* In-register transpose of 16 rows of 16 floats: r[i] lane j <- r[j] lane i. */
static inline void tr16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; g++) {
    r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  /* r[4g + e], 128-bit lane L, now holds rows 4g..4g+3 of column 4L + e. */
  for (int e = 0; e < 4; e++) {
    __m512 a0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
    __m512 a1 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xdd);
    __m512 a2 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
    __m512 a3 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xdd);
    t[e] = _mm512_shuffle_f32x4(a0, a2, 0x88);      /* column e */
    t[8 + e] = _mm512_shuffle_f32x4(a0, a2, 0xdd);  /* column 8 + e */
    t[4 + e] = _mm512_shuffle_f32x4(a1, a3, 0x88);  /* column 4 + e */
    t[12 + e] = _mm512_shuffle_f32x4(a1, a3, 0xdd); /* column 12 + e */
  }
  for (int i = 0; i < 16; i++) r[i] = t[i];
}
#endif

/* d[j*ldd + i] = (float) s[i*lds + j] for i < rows, j < cols: a transposing copy from fp16
 * or fp32 into fp32, in 16x16 register blocks. */
static void transpose_to_f32(const void *s, int f16, int64_t lds, int64_t rows, int64_t cols,
                             float *d, int64_t ldd) {
#if defined(__AVX512F__)
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    int64_t ri = rows - i0 < 16 ? rows - i0 : 16;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      int64_t cj = cols - j0 < 16 ? cols - j0 : 16;
      __m512 r[16];
      for (int64_t i = 0; i < 16; i++)
        r[i] = i < ri ? load16(f16 ? (const void *)((const half *)s + (i0 + i) * lds + j0)
                                   : (const void *)((const float *)s + (i0 + i) * lds + j0),
                               f16, cj)
                      : _mm512_setzero_ps();
      tr16(r);
      __mmask16 m = mask16(ri);
      for (int64_t j = 0; j < cj; j++) _mm512_mask_storeu_ps(d + (j0 + j) * ldd + i0, m, r[j]);
    }
  }
#else
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++)
      d[j * ldd + i] = f16 ? h2f(((const half *)s)[i * lds + j]) : ((const float *)s)[i * lds + j];
#endif
}

/* d[j*ldd + i] = (fp16) s[i*lds + j] for i < rows, j < cols (fp32 -> fp16, transposed). */
static void transpose_to_f16(const float *s, int64_t lds, int64_t rows, int64_t cols, half *d,
                             int64_t ldd) {
#if defined(__AVX512F__)
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    int64_t ri = rows - i0 < 16 ? rows - i0 : 16;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      int64_t cj = cols - j0 < 16 ? cols - j0 : 16;
      __m512 r[16];
      for (int64_t i = 0; i < 16; i++)
        r[i] = i < ri ? load16(s + (i0 + i) * lds + j0, 0, cj) : _mm512_setzero_ps();
      tr16(r);
      __mmask16 m = mask16(ri);
      for (int64_t j = 0; j < cj; j++)
        _mm256_mask_storeu_epi16(d + (j0 + j) * ldd + i0, m,
                                 _mm512_cvtps_ph(r[j], _MM_FROUND_TO_NEAREST_INT));
    }
  }
#else
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) d[j * ldd + i] = f2h(s[i * lds + j]);
#endif
}

/* Sum of an fp16 row in fp32 (16 lanes, then the lanes: not the sequential order). */
static float sum_row(const half *s, int64_t n) {
  int64_t i = 0;
  float t = 0.0f;
#if defined(__AVX512F__)
  __m512 a = _mm512_setzero_ps();
  for (; i < n; i += 16) a = _mm512_add_ps(a, load16(s + i, 1, n - i));
  t = _mm512_reduce_add_ps(a);
#endif
  for (; i < n; i++) t += h2f(s[i]);
  return t;
}

/* ---- workspaces ---------------------------------------------------------------------- */

enum { WS_PACK_A, WS_PACK_B, WS_COL, WS_OUT, WS_IMG, WS_PART, WS_COUNT };
static __thread float *ws_ptr[WS_COUNT];
static __thread size_t ws_cap[WS_COUNT];

/* A 64-byte aligned float buffer of at least n elements for this thread, or NULL. */
static float *ws(int slot, size_t n) {
  if (n > ws_cap[slot]) {
    free(ws_ptr[slot]);
    size_t bytes = ((n * sizeof(float) + 4095) & ~(size_t)4095) + 256;
    ws_ptr[slot] = aligned_alloc(64, bytes);
    ws_cap[slot] = ws_ptr[slot] ? (bytes - 256) / sizeof(float) : 0;
  }
  return ws_ptr[slot];
}

/* ---- GEMM ---------------------------------------------------------------------------- */

/*
 * C[M,N] (fp32, leading dimension ldc) = (acc ? C : 0) + A[M,K] . B[K,N].
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
 * The first version reached only 60 / 87 / 98 GFLOP/s on conv2: the transposing paths
 * (scalar conversions in the conv epilogue and packing) cost more than the FMAs; 16x16
 * register transposes and masked short rows fixed that (~3x on the forward).
 * The machine is shared: with other processes on the two cores these numbers drop 2-4x.
 */
#define MR 14
#define NR 32
#define KC_MAX 256
#define MC (MR * 24)
#define NC (NR * 16)

typedef struct {
  const void *p;
  int f16;
  int64_t rs, cs;
} mat_t;

static inline float mat_at(const mat_t *m, int64_t i, int64_t j) {
  int64_t o = i * m->rs + j * m->cs;
  return m->f16 ? h2f(((const half *)m->p)[o]) : ((const float *)m->p)[o];
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
      if (a->f16) {
        const half *s = (const half *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs)
          _mm512_mask_storeu_ps(d + k * MR, 0x3fff,
                                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, s)));
      } else {
        const float *s = (const float *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs)
          _mm512_mask_storeu_ps(d + k * MR, 0x3fff, _mm512_maskz_loadu_ps(mk, s));
      }
      continue;
#endif
    }
    if (rows < MR)
      for (int64_t k = 0; k < kc; k++)
        for (int64_t i = rows; i < MR; i++) d[k * MR + i] = 0.0f;
    if (a->cs == 1) { /* each row is contiguous along k: transpose while packing */
      int64_t off = (i0 + ip) * a->rs + k0;
      transpose_to_f32(a->f16 ? (const void *)((const half *)a->p + off)
                              : (const void *)((const float *)a->p + off),
                       a->f16, a->rs, rows, kc, d, MR);
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
      if (b->f16) {
        const half *s = (const half *)b->p + k0 * b->rs + j0 + jp;
        for (int64_t k = 0; k < kc; k++, s += b->rs) {
          _mm512_store_ps(d + k * NR, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, s)));
          _mm512_store_ps(d + k * NR + 16,
                          _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, s + 16)));
        }
      } else {
        const float *s = (const float *)b->p + k0 * b->rs + j0 + jp;
        for (int64_t k = 0; k < kc; k++, s += b->rs) {
          _mm512_store_ps(d + k * NR, _mm512_maskz_loadu_ps(m0, s));
          _mm512_store_ps(d + k * NR + 16, _mm512_maskz_loadu_ps(m1, s + 16));
        }
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
      transpose_to_f32(b->f16 ? (const void *)((const half *)b->p + off)
                              : (const void *)((const float *)b->p + off),
                       b->f16, b->cs, cols, kc, d, NR);
    } else {
      for (int64_t k = 0; k < kc; k++)
        for (int64_t j = 0; j < cols; j++) d[k * NR + j] = mat_at(b, k0 + k, j0 + jp + j);
    }
  }
}

/* c[MR x NR] (ldc) = (first ? 0 : c) + a_panel . b_panel over kc. */
static void kernel_14x32(int64_t kc, const float *restrict a, const float *restrict b,
                         float *restrict c, int64_t ldc, int first) {
#if defined(__AVX512F__)
#define PS_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define PS_DECL(i) __m512 c##i##a = _mm512_setzero_ps(), c##i##b = _mm512_setzero_ps();
#define PS_FMA(i)                                                                          \
  {                                                                                        \
    __m512 ai = _mm512_set1_ps(a[i]);                                                      \
    c##i##a = _mm512_fmadd_ps(ai, b0, c##i##a);                                            \
    c##i##b = _mm512_fmadd_ps(ai, b1, c##i##b);                                            \
  }
#define PS_STORE(i)                                                                        \
  {                                                                                        \
    float *r = c + (i) * ldc;                                                              \
    if (!first) {                                                                          \
      c##i##a = _mm512_add_ps(c##i##a, _mm512_loadu_ps(r));                                \
      c##i##b = _mm512_add_ps(c##i##b, _mm512_loadu_ps(r + 16));                           \
    }                                                                                      \
    _mm512_storeu_ps(r, c##i##a);                                                          \
    _mm512_storeu_ps(r + 16, c##i##b);                                                     \
  }
  PS_ROWS(PS_DECL)
  for (int64_t k = 0; k < kc; k++) {
    __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
    PS_ROWS(PS_FMA)
    a += MR;
    b += NR;
  }
  PS_ROWS(PS_STORE)
#undef PS_ROWS
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

/* One thread's GEMM (see the comment above); returns 0, or -1 when out of memory. */
static int gemm_serial(int64_t M, int64_t N, int64_t K, const mat_t *A, const mat_t *B, float *C,
                       int64_t ldc, int acc) {
  if (M <= 0 || N <= 0) return 0;
  if (K <= 0) {
    if (!acc)
      for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
    return 0;
  }
  /* Split K evenly into blocks of at most KC_MAX (288 -> 2 x 144, not 256 + 32). */
  int64_t nkb = (K + KC_MAX - 1) / KC_MAX, kcb = (K + nkb - 1) / nkb;
  int64_t ncap = N < NC ? (N + NR - 1) / NR * NR : NC, mcap = M < MC ? (M + MR - 1) / MR * MR : MC;
  float *pa = ws(WS_PACK_A, (size_t)(mcap * kcb)), *pb = ws(WS_PACK_B, (size_t)(ncap * kcb));
  if (!pa || !pb) return -1;
  float tile[MR * NR] __attribute__((aligned(64)));
  for (int64_t jc = 0; jc < N; jc += NC) {
    int64_t nc = N - jc < NC ? N - jc : NC;
    for (int64_t pc = 0; pc < K; pc += kcb) {
      int64_t kc = K - pc < kcb ? K - pc : kcb;
      int first = pc == 0 && !acc;
      pack_b(pb, B, pc, kc, jc, nc);
      for (int64_t ic = 0; ic < M; ic += MC) {
        int64_t mc = M - ic < MC ? M - ic : MC;
        pack_a(pa, A, ic, mc, pc, kc);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          int64_t nr = nc - jr < NR ? nc - jr : NR;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t mr = mc - ir < MR ? mc - ir : MR;
            float *c = C + (ic + ir) * ldc + jc + jr;
            if (mr == MR && nr == NR) {
              kernel_14x32(kc, pa + ir * kc, pb + jr * kc, c, ldc, first);
            } else {
              kernel_14x32(kc, pa + ir * kc, pb + jr * kc, tile, NR, 1);
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

/* ---- argument checks ----------------------------------------------------------------- */

#define CHECK_RANGE(ptr, bytes)                                                            \
  do {                                                                                     \
    if ((bytes) > 0 && !ps_is_live_range((ptr), (uint64_t)(bytes)))                        \
      PS_FAIL(PS_ERR_INVALID_ARGUMENT,                                                     \
              "%s: %s (%p, %llu bytes) is not inside one live device allocation",         \
              __func__, #ptr, (const void *)(ptr), (unsigned long long)(bytes));           \
  } while (0)
#define CHECK_DTYPE(dt)                                                                    \
  do {                                                                                     \
    if ((dt) != PS_NN_F32 && (dt) != PS_NN_F16)                                            \
      PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad %s %d", __func__, #dt, (int)(dt));          \
  } while (0)
#define OOM() PS_FAIL(PS_ERR_OUT_OF_MEMORY, "%s: no memory for a workspace", __func__)

static int64_t dtsize(int32_t dt) { return dt == PS_NN_F16 ? 2 : 4; }

/* ---- matmul -------------------------------------------------------------------------- */

PS_API int ps_nn_matmul(const void *a, const void *b, void *c, int32_t c_dtype, int64_t m,
                        int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                        int32_t accumulate, void *stream) {
  (void)stream;
  CHECK_DTYPE(c_dtype);
  if (m < 0 || n < 0 || k < 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_matmul: bad shape m=%lld n=%lld k=%lld",
            (long long)m, (long long)n, (long long)k);
  if (m == 0 || n == 0) return PS_OK;
  CHECK_RANGE(a, m * k * 2);
  CHECK_RANGE(b, k * n * 2);
  CHECK_RANGE(c, m * n * dtsize(c_dtype));
  mat_t A = {a, 1, trans_a ? 1 : k, trans_a ? m : 1};
  mat_t B = {b, 1, trans_b ? 1 : n, trans_b ? k : 1};
  /* f32 output is accumulated in place; fp16 output goes through an fp32 buffer. */
  float *out = c_dtype == PS_NN_F32 ? (float *)c : NULL;
  float *tmp = NULL;
  if (!out) {
    tmp = aligned_alloc(64, (((size_t)(m * n) * 4 + 63) & ~(size_t)63));
    if (!tmp) OOM();
    out = tmp;
  }
  int acc = accumulate && c_dtype == PS_NN_F32;
  /* Two threads: split the longer side (in tiles) in halves. */
  int nt = nthreads();
  int64_t mt = (m + MR - 1) / MR, nt_ = (n + NR - 1) / NR;
  int split_m = mt >= nt_;
  int64_t tiles = split_m ? mt : nt_;
  int parts = (double)m * n * k < 1e5 || tiles < 2 ? 1 : (int)(tiles < nt ? tiles : nt);
  int failed = 0;
  PS_OMP("omp parallel for num_threads(parts) schedule(static, 1) reduction(|| : failed)")
  for (int p = 0; p < parts; p++) {
    int64_t t0 = tiles * p / parts, t1 = tiles * (p + 1) / parts;
    if (split_m) {
      int64_t i0 = t0 * MR, i1 = t1 * MR < m ? t1 * MR : m;
      mat_t Ap = A;
      Ap.p = (const half *)a + i0 * A.rs;
      failed = gemm_serial(i1 - i0, n, k, &Ap, &B, out + i0 * n, n, acc) != 0;
    } else {
      int64_t j0 = t0 * NR, j1 = t1 * NR < n ? t1 * NR : n;
      mat_t Bp = B;
      Bp.p = (const half *)b + j0 * B.cs;
      failed = gemm_serial(m, j1 - j0, k, &A, &Bp, out + j0, n, acc) != 0;
    }
  }
  if (!failed && tmp) {
    half *ch = (half *)c;
    int64_t total = m * n;
    if (accumulate) {
      for (int64_t i = 0; i < total; i++) ch[i] = f2h(tmp[i] + h2f(ch[i]));
    } else {
      f2h_row(tmp, ch, total);
    }
  }
  free(tmp);
  if (failed) OOM();
  return PS_OK;
}

/* ---- convolution --------------------------------------------------------------------- */

typedef struct {
  int64_t n, c, h, w, co, oh, ow;
  int32_t kh, kw, s, pad;
} conv_t;

static int conv_shape(conv_t *g, const char *fn, int64_t n, int64_t c, int64_t h, int64_t w,
                      int64_t co, int32_t kh, int32_t kw, int32_t stride, int32_t pad) {
  if (n < 0 || c <= 0 || h <= 0 || w <= 0 || co <= 0 || kh <= 0 || kw <= 0 || stride <= 0 ||
      pad < 0 || h + 2 * pad < kh || w + 2 * pad < kw)
    return ps_record_error(PS_ERR_INVALID_ARGUMENT, __FILE__, __LINE__,
                           "%s: bad shape n=%lld c=%lld h=%lld w=%lld co=%lld k=%dx%d "
                           "stride=%d pad=%d",
                           fn, (long long)n, (long long)c, (long long)h, (long long)w,
                           (long long)co, kh, kw, stride, pad);
  g->n = n, g->c = c, g->h = h, g->w = w, g->co = co, g->kh = kh, g->kw = kw, g->s = stride;
  g->pad = pad;
  g->oh = (h + 2 * pad - kh) / stride + 1;
  g->ow = (w + 2 * pad - kw) / stride + 1;
  return PS_OK;
}

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

static void im2col_same(const conv_t *g, const half *x, float *col) {
  int64_t P = g->oh * g->ow, HW = g->h * g->w;
  for (int64_t ky = 0; ky < g->kh; ky++)
    for (int64_t kx = 0; kx < g->kw; kx++) {
      shift_t t;
      shift_of(g, ky, kx, &t);
      for (int64_t c = 0; c < g->c; c++) {
        float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        memset(row, 0, (size_t)t.qa * sizeof(float));
        h2f_row(x + c * HW + t.qa + t.off, row + t.qa, t.qb - t.qa);
        memset(row + t.qb, 0, (size_t)(P - t.qb) * sizeof(float));
        if (t.lo > 0 || t.hi < g->ow)
          for (int64_t q = t.q0; q < t.q1; q += g->ow) {
            for (int64_t ox = 0; ox < t.lo; ox++) row[q + ox] = 0.0f;
            for (int64_t ox = t.hi; ox < g->ow; ox++) row[q + ox] = 0.0f;
          }
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
        if (t.lo > 0 || t.hi < g->ow)
          for (int64_t q = t.q0; q < t.q1; q += g->ow) {
            for (int64_t ox = 0; ox < t.lo; ox++) row[q + ox] = 0.0f;
            for (int64_t ox = t.hi; ox < g->ow; ox++) row[q + ox] = 0.0f;
          }
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

/* col[(c*kh + ky)*kw + kx][oy*ow + ox] = x[c][oy*s + ky - pad][ox*s + kx - pad] (0 outside). */
static void im2col(const conv_t *g, const half *x, float *col) {
  if (is_same_s1(g)) {
    im2col_same(g, x, col);
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
          const half *src = x + (c * g->h + iy) * g->w + kx - g->pad;
          for (int64_t ox = 0; ox < lo; ox++) d[ox] = 0.0f;
          if (g->s == 1) {
            h2f_row(src + lo, d + lo, hi - lo);
          } else {
            for (int64_t ox = lo; ox < hi; ox++) d[ox] = h2f(src[ox * g->s]);
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
              _mm512_mask_storeu_ps(d + ox, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + ox),
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

PS_API int ps_nn_conv2d_forward(const void *x, const void *w, void *y, int64_t n, int64_t c,
                                int64_t h, int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                int32_t stride, int32_t pad, void *stream) {
  (void)stream;
  conv_t g;
  int st = conv_shape(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  if (n == 0) return PS_OK;
  int64_t K = c * kh * kw, P = g.oh * g.ow;
  CHECK_RANGE(x, n * c * h * w_ * 2);
  CHECK_RANGE(w, co * K * 2);
  CHECK_RANGE(y, n * co * P * 2);
  /* W^T [K][Co] in fp32 once, so the B packing reads contiguous rows. */
  float *wt = aligned_alloc(64, (((size_t)(K * co) * 4 + 63) & ~(size_t)63));
  if (!wt) OOM();
  for (int64_t o = 0; o < co; o++)
    for (int64_t k = 0; k < K; k++) wt[k * co + o] = h2f(((const half *)w)[o * K + k]);
  int failed = 0;
  PS_OMP("omp parallel for schedule(dynamic, 1) reduction(|| : failed)")
  for (int64_t i = 0; i < n; i++) {
    float *col = ws(WS_COL, (size_t)(K * P)), *yt = ws(WS_OUT, (size_t)(P * co));
    if (!col || !yt) {
      failed = 1;
      continue;
    }
    im2col(&g, (const half *)x + i * c * h * w_, col);
    if (K < 64) {
      /* Short K (a first layer): the transposed store would cost more than the GEMM, so
       * compute Y[Co, P] = W . col directly and store it contiguously. */
      mat_t A = {w, 1, K, 1}, B = {col, 0, P, 1};
      if (gemm_serial(co, P, K, &A, &B, yt, P, 0)) {
        failed = 1;
        continue;
      }
      f2h_row(yt, (half *)y + i * co * P, co * P);
      continue;
    }
    mat_t A = {col, 0, 1, P}, B = {wt, 0, co, 1};
    if (gemm_serial(P, co, K, &A, &B, yt, co, 0)) {
      failed = 1;
      continue;
    }
    transpose_to_f16(yt, co, P, co, (half *)y + i * co * P, P);
  }
  free(wt);
  if (failed) OOM();
  return PS_OK;
}

PS_API int ps_nn_conv2d_backward_data(const void *dy, const void *w, void *dx, int64_t n,
                                      int64_t c, int64_t h, int64_t w_, int64_t co,
                                      int32_t kh, int32_t kw, int32_t stride, int32_t pad,
                                      void *stream) {
  (void)stream;
  conv_t g;
  int st = conv_shape(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  if (n == 0) return PS_OK;
  int64_t K = c * kh * kw, P = g.oh * g.ow, HW = h * w_;
  CHECK_RANGE(dy, n * co * P * 2);
  CHECK_RANGE(w, co * K * 2);
  CHECK_RANGE(dx, n * c * HW * 2);
  int failed = 0;
  PS_OMP("omp parallel for schedule(dynamic, 1) reduction(|| : failed)")
  for (int64_t i = 0; i < n; i++) {
    float *dcol = ws(WS_COL, (size_t)(K * P)), *img = ws(WS_IMG, (size_t)(c * HW));
    if (!dcol || !img) {
      failed = 1;
      continue;
    }
    /* dcol[K][P] = W^T . dY: A(kk, o) = w[o*K + kk], B(o, p) = dy[o*P + p]. */
    mat_t A = {w, 1, 1, K}, B = {(const half *)dy + i * co * P, 1, P, 1};
    if (gemm_serial(K, P, co, &A, &B, dcol, P, 0)) {
      failed = 1;
      continue;
    }
    memset(img, 0, (size_t)(c * HW) * sizeof(float));
    col2im(&g, dcol, img);
    f2h_row(img, (half *)dx + i * c * HW, c * HW);
  }
  if (failed) OOM();
  return PS_OK;
}

PS_API int ps_nn_conv2d_backward_weight(const void *x, const void *dy, void *dw,
                                        int32_t dw_dtype, int64_t n, int64_t c, int64_t h,
                                        int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                        int32_t stride, int32_t pad, int32_t accumulate,
                                        void *stream) {
  (void)stream;
  CHECK_DTYPE(dw_dtype);
  conv_t g;
  int st = conv_shape(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  int64_t K = c * kh * kw, P = g.oh * g.ow, HW = h * w_, KK = (int64_t)kh * kw;
  CHECK_RANGE(x, n * c * HW * 2);
  CHECK_RANGE(dy, n * co * P * 2);
  CHECK_RANGE(dw, co * K * dtsize(dw_dtype));
  int nt = nthreads();
  if (nt > n) nt = n > 0 ? (int)n : 1;
  /* Per-thread partial dW^T [K][Co], summed at the end. */
  float *part = aligned_alloc(64, (((size_t)(nt * K * co) * 4 + 63) & ~(size_t)63));
  if (!part) OOM();
  memset(part, 0, (size_t)(nt * K * co) * sizeof(float));
  int failed = 0;
  PS_OMP("omp parallel num_threads(nt) reduction(|| : failed)") {
    int t = thread_id(), T = nt;
#if defined(_OPENMP)
    T = omp_get_num_threads();
#endif
    float *mine = part + (int64_t)t * K * co;
    float *col = ws(WS_COL, (size_t)(K * P));
    if (!col) failed = 1;
    for (int64_t i = (int64_t)n * t / T; !failed && i < (int64_t)n * (t + 1) / T; i++) {
      im2col(&g, (const half *)x + i * c * HW, col);
      /* dW^T[K][Co] += col . dY^T: A(kk, p) = col[kk*P + p], B(p, o) = dy[o*P + p]. */
      mat_t A = {col, 0, P, 1}, B = {(const half *)dy + i * co * P, 1, 1, P};
      if (gemm_serial(K, co, P, &A, &B, mine, co, 1)) failed = 1;
    }
  }
  if (failed) {
    free(part);
    OOM();
  }
  /* dw[o][ci][ky][kx] = sum_t part[t][(ci*kh + ky)*kw + kx][o] */
  for (int64_t o = 0; o < co; o++)
    for (int64_t ci = 0; ci < c; ci++)
      for (int64_t kk = 0; kk < KK; kk++) {
        float s = 0.0f;
        for (int t = 0; t < nt; t++) s += part[(int64_t)t * K * co + (ci * KK + kk) * co + o];
        int64_t di = (o * c + ci) * KK + kk;
        if (dw_dtype == PS_NN_F32) {
          float *d = (float *)dw + di;
          *d = accumulate ? *d + s : s;
        } else {
          half *d = (half *)dw + di;
          *d = f2h(accumulate ? h2f(*d) + s : s);
        }
      }
  free(part);
  return PS_OK;
}

/* ---- pooling ------------------------------------------------------------------------- */

#if defined(__AVX512F__)
/* 2x2 stride-2 pooling of one plane, 16 outputs at a time: the even and odd columns of the
 * two input rows are de-interleaved with permutes, then compared in the scalar loop's order
 * ((0,0), (0,1), (1,0), (1,1); strictly greater wins; NaN wins over numbers). */
static void maxpool_2x2_plane(const half *xp, half *yp, int32_t *ip, int64_t w, int64_t oh,
                              int64_t ow) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
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
        __mmask16 gt = _mm512_cmp_ps_mask(v[t], m, _CMP_GT_OQ) |
                       (_mm512_cmp_ps_mask(v[t], v[t], _CMP_UNORD_Q) &
                        _mm512_cmp_ps_mask(m, m, _CMP_ORD_Q));
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

PS_API int ps_nn_maxpool2d_forward(const void *x, void *y, int32_t *indices, int64_t n,
                                   int64_t c, int64_t h, int64_t w_, int32_t kernel,
                                   int32_t stride, void *stream) {
  (void)stream;
  if (n < 0 || c < 0 || h <= 0 || w_ <= 0 || kernel <= 0 || stride <= 0 || kernel > h ||
      kernel > w_)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_nn_maxpool2d_forward: bad shape n=%lld c=%lld h=%lld w=%lld kernel=%d "
            "stride=%d",
            (long long)n, (long long)c, (long long)h, (long long)w_, kernel, stride);
  int64_t oh = (h - kernel) / stride + 1, ow = (w_ - kernel) / stride + 1, planes = n * c;
  if (planes == 0) return PS_OK;
  CHECK_RANGE(x, planes * h * w_ * 2);
  CHECK_RANGE(y, planes * oh * ow * 2);
  if (indices) CHECK_RANGE(indices, planes * oh * ow * 4);
  PS_OMP("omp parallel for schedule(dynamic, 8) if (planes * h * w_ > 65536)")
  for (int64_t pl = 0; pl < planes; pl++) {
    const half *xp = (const half *)x + pl * h * w_;
    half *yp = (half *)y + pl * oh * ow;
    int32_t *ip = indices ? indices + pl * oh * ow : NULL;
#if defined(__AVX512F__)
    if (kernel == 2 && stride == 2 && ip) {
      maxpool_2x2_plane(xp, yp, ip, w_, oh, ow);
      continue;
    }
#endif
    for (int64_t oy = 0; oy < oh; oy++)
      for (int64_t ox = 0; ox < ow; ox++) {
        int64_t y0 = oy * stride, x0 = ox * stride, best = y0 * w_ + x0;
        float m = h2f(xp[best]);
        for (int64_t ky = 0; ky < kernel; ky++)
          for (int64_t kx = 0; kx < kernel; kx++) {
            int64_t at = (y0 + ky) * w_ + x0 + kx;
            float v = h2f(xp[at]);
            /* NaN propagates (PyTorch): once m is NaN nothing replaces it. */
            if (v > m || (v != v && m == m)) m = v, best = at;
          }
        yp[oy * ow + ox] = f2h(m);
        if (ip) ip[oy * ow + ox] = (int32_t)best;
      }
  }
  return PS_OK;
}

PS_API int ps_nn_maxpool2d_backward(const void *dy, const int32_t *indices, void *dx,
                                    int64_t n, int64_t c, int64_t h, int64_t w_, int64_t oh,
                                    int64_t ow, void *stream) {
  (void)stream;
  if (n < 0 || c < 0 || h <= 0 || w_ <= 0 || oh < 0 || ow < 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_maxpool2d_backward: bad shape");
  int64_t planes = n * c, hw = h * w_, ohw = oh * ow;
  if (planes == 0) return PS_OK;
  CHECK_RANGE(dy, planes * ohw * 2);
  CHECK_RANGE(indices, planes * ohw * 4);
  CHECK_RANGE(dx, planes * hw * 2);
  int bad = 0;
  PS_OMP("omp parallel for schedule(dynamic, 8) if (planes * hw > 65536) reduction(|| : bad)")
  for (int64_t pl = 0; pl < planes; pl++) {
    half *dxp = (half *)dx + pl * hw;
    const half *dyp = (const half *)dy + pl * ohw;
    const int32_t *ip = indices + pl * ohw;
    memset(dxp, 0, (size_t)hw * sizeof(half));
    for (int64_t i = 0; i < ohw; i++) {
      int32_t at = ip[i];
      if (at < 0 || at >= hw) {
        bad = 1;
        break;
      }
      dxp[at] = f2h(h2f(dxp[at]) + h2f(dyp[i]));
    }
  }
  if (bad) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_maxpool2d_backward: index out of range");
  return PS_OK;
}

/* ---- batch normalization ------------------------------------------------------------- */

PS_API int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
                                         void *y, float *save_mean, float *save_invstd,
                                         float *run_mean, float *run_var, int64_t n, int64_t c,
                                         int64_t hw, float momentum, float eps, void *stream) {
  (void)stream;
  if (n <= 0 || c <= 0 || hw <= 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_batchnorm_forward_train: bad shape n=%lld c=%lld hw=%lld",
            (long long)n, (long long)c, (long long)hw);
  CHECK_RANGE(x, n * c * hw * 2);
  CHECK_RANGE(y, n * c * hw * 2);
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(beta, c * 4);
  CHECK_RANGE(save_mean, c * 4);
  CHECK_RANGE(save_invstd, c * 4);
  if (run_mean) CHECK_RANGE(run_mean, c * 4);
  if (run_var) CHECK_RANGE(run_var, c * 4);
  const half *xh = (const half *)x;
  half *yh = (half *)y;
  int64_t cnt = n * hw;
  PS_OMP("omp parallel for schedule(static)")
  for (int64_t ch = 0; ch < c; ch++) {
    /* Two passes in double: exact enough for any batch, and cheap next to the convs. */
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
      const half *p = xh + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; j++) s += h2f(p[j]);
    }
    double mean = s / (double)cnt, ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
      const half *p = xh + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; j++) {
        double d = h2f(p[j]) - mean;
        ss += d * d;
      }
    }
    double var = ss / (double)cnt;
    float invstd = (float)(1.0 / sqrt(var + eps));
    save_mean[ch] = (float)mean;
    save_invstd[ch] = invstd;
    if (run_mean) run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * (float)mean;
    if (run_var) {
      double unbiased = cnt > 1 ? ss / (double)(cnt - 1) : var;
      run_var[ch] = (1.0f - momentum) * run_var[ch] + momentum * (float)unbiased;
    }
    float a = gamma[ch] * invstd, b = beta[ch] - (float)mean * a;
    for (int64_t i = 0; i < n; i++) {
      const half *p = xh + (i * c + ch) * hw;
      half *q = yh + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; j++) q[j] = f2h(h2f(p[j]) * a + b);
    }
  }
  return PS_OK;
}

PS_API int ps_nn_batchnorm_forward_eval(const void *x, const float *gamma, const float *beta,
                                        const float *run_mean, const float *run_var, void *y,
                                        int64_t n, int64_t c, int64_t hw, float eps,
                                        void *stream) {
  (void)stream;
  if (n < 0 || c <= 0 || hw <= 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_batchnorm_forward_eval: bad shape n=%lld c=%lld hw=%lld",
            (long long)n, (long long)c, (long long)hw);
  if (n == 0) return PS_OK;
  CHECK_RANGE(x, n * c * hw * 2);
  CHECK_RANGE(y, n * c * hw * 2);
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(beta, c * 4);
  CHECK_RANGE(run_mean, c * 4);
  CHECK_RANGE(run_var, c * 4);
  PS_OMP("omp parallel for schedule(static) if (n * c * hw > 65536)")
  for (int64_t ch = 0; ch < c; ch++) {
    float a = gamma[ch] / sqrtf(run_var[ch] + eps), b = beta[ch] - run_mean[ch] * a;
    for (int64_t i = 0; i < n; i++) {
      const half *p = (const half *)x + (i * c + ch) * hw;
      half *q = (half *)y + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; j++) q[j] = f2h(h2f(p[j]) * a + b);
    }
  }
  return PS_OK;
}

PS_API int ps_nn_batchnorm_backward(const void *dy, const void *x, const float *gamma,
                                    const float *save_mean, const float *save_invstd, void *dx,
                                    float *dgamma, float *dbeta, int64_t n, int64_t c,
                                    int64_t hw, void *stream) {
  (void)stream;
  if (n <= 0 || c <= 0 || hw <= 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_batchnorm_backward: bad shape n=%lld c=%lld hw=%lld",
            (long long)n, (long long)c, (long long)hw);
  CHECK_RANGE(dy, n * c * hw * 2);
  CHECK_RANGE(x, n * c * hw * 2);
  CHECK_RANGE(dx, n * c * hw * 2);
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(save_mean, c * 4);
  CHECK_RANGE(save_invstd, c * 4);
  CHECK_RANGE(dgamma, c * 4);
  CHECK_RANGE(dbeta, c * 4);
  int64_t cnt = n * hw;
  PS_OMP("omp parallel for schedule(static)")
  for (int64_t ch = 0; ch < c; ch++) {
    float mean = save_mean[ch], is = save_invstd[ch];
    double sdy = 0.0, sdyx = 0.0; /* sum dy, sum dy * xhat */
    for (int64_t i = 0; i < n; i++) {
      const half *g = (const half *)dy + (i * c + ch) * hw;
      const half *p = (const half *)x + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; j++) {
        float d = h2f(g[j]);
        sdy += d;
        sdyx += d * ((h2f(p[j]) - mean) * is);
      }
    }
    dbeta[ch] = (float)sdy;
    dgamma[ch] = (float)sdyx;
    /* dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) */
    float a = gamma[ch] * is, mdy = (float)(sdy / (double)cnt), mdyx = (float)(sdyx / (double)cnt);
    for (int64_t i = 0; i < n; i++) {
      const half *g = (const half *)dy + (i * c + ch) * hw;
      const half *p = (const half *)x + (i * c + ch) * hw;
      half *q = (half *)dx + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; j++) {
        float xhat = (h2f(p[j]) - mean) * is;
        q[j] = f2h(a * (h2f(g[j]) - mdy - xhat * mdyx));
      }
    }
  }
  return PS_OK;
}

/* ---- bias, relu ---------------------------------------------------------------------- */

PS_API int ps_nn_bias_add(void *y, const void *bias, int32_t bias_dtype, int64_t n, int64_t c,
                          int64_t hw, void *stream) {
  (void)stream;
  CHECK_DTYPE(bias_dtype);
  if (n < 0 || c <= 0 || hw <= 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_bias_add: bad shape n=%lld c=%lld hw=%lld",
            (long long)n, (long long)c, (long long)hw);
  if (n == 0) return PS_OK;
  CHECK_RANGE(y, n * c * hw * 2);
  CHECK_RANGE(bias, c * dtsize(bias_dtype));
  int64_t rows = n * c;
  PS_OMP("omp parallel for schedule(dynamic, 64) if (rows * hw > 65536)")
  for (int64_t r = 0; r < rows; r++) {
    int64_t ch = r % c;
    half *q = (half *)y + r * hw;
    if (hw == 1) { /* [N,F]: one value per row of the loop */
      float b = bias_dtype == PS_NN_F16 ? h2f(((const half *)bias)[ch]) : ((const float *)bias)[ch];
      q[0] = f2h(h2f(q[0]) + b);
      continue;
    }
    float b = bias_dtype == PS_NN_F16 ? h2f(((const half *)bias)[ch]) : ((const float *)bias)[ch];
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 vb = _mm512_set1_ps(b);
    for (; j + 16 <= hw; j += 16) {
      __m512 v = _mm512_add_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q + j))), vb);
      _mm256_storeu_si256((__m256i *)(q + j), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; j < hw; j++) q[j] = f2h(h2f(q[j]) + b);
  }
  return PS_OK;
}

PS_API int ps_nn_bias_grad(const void *dy, void *dbias, int32_t dbias_dtype, int64_t n,
                           int64_t c, int64_t hw, int32_t accumulate, void *stream) {
  (void)stream;
  CHECK_DTYPE(dbias_dtype);
  if (n < 0 || c <= 0 || hw <= 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_bias_grad: bad shape n=%lld c=%lld hw=%lld",
            (long long)n, (long long)c, (long long)hw);
  CHECK_RANGE(dy, n * c * hw * 2);
  CHECK_RANGE(dbias, c * dtsize(dbias_dtype));
  float *sum = calloc((size_t)c, sizeof(float));
  if (!sum) OOM();
  if (hw == 1) {
    for (int64_t i = 0; i < n; i++) {
      const half *g = (const half *)dy + i * c;
      for (int64_t ch = 0; ch < c; ch++) sum[ch] += h2f(g[ch]);
    }
  } else {
    PS_OMP("omp parallel for schedule(static) if (n * c * hw > 65536)")
    for (int64_t ch = 0; ch < c; ch++) {
      float s = 0.0f;
      for (int64_t i = 0; i < n; i++) s += sum_row((const half *)dy + (i * c + ch) * hw, hw);
      sum[ch] = s;
    }
  }
  for (int64_t ch = 0; ch < c; ch++) {
    if (dbias_dtype == PS_NN_F32) {
      float *d = (float *)dbias + ch;
      *d = accumulate ? *d + sum[ch] : sum[ch];
    } else {
      half *d = (half *)dbias + ch;
      *d = f2h(accumulate ? h2f(*d) + sum[ch] : sum[ch]);
    }
  }
  free(sum);
  return PS_OK;
}

PS_API int ps_nn_relu_forward(const void *x, void *y, int64_t count, void *stream) {
  (void)stream;
  if (count < 0) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_relu_forward: bad count %lld", (long long)count);
  if (count == 0) return PS_OK;
  CHECK_RANGE(x, count * 2);
  CHECK_RANGE(y, count * 2);
  /* On the bits: max(x, 0) keeps NaN like torch.relu does not guarantee either way; a
   * negative-sign test maps -0 and negatives to +0 and leaves NaN payloads alone. */
  const uint16_t *s = (const uint16_t *)x;
  uint16_t *d = (uint16_t *)y;
  int64_t blocks = (count + 4095) / 4096;
  PS_OMP("omp parallel for schedule(dynamic, 8) if (count > 262144)")
  for (int64_t bk = 0; bk < blocks; bk++) {
    int64_t i = bk * 4096, end = i + 4096 < count ? i + 4096 : count;
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
      uint16_t v = s[i];
      d[i] = ((v & 0x8000u) && (v & 0x7fffu) <= 0x7c00u) ? 0 : v;
    }
  }
  return PS_OK;
}

PS_API int ps_nn_relu_backward(const void *dy, const void *y, void *dx, int64_t count,
                               void *stream) {
  (void)stream;
  if (count < 0) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_relu_backward: bad count %lld", (long long)count);
  if (count == 0) return PS_OK;
  CHECK_RANGE(dy, count * 2);
  CHECK_RANGE(y, count * 2);
  CHECK_RANGE(dx, count * 2);
  const uint16_t *g = (const uint16_t *)dy, *o = (const uint16_t *)y;
  uint16_t *d = (uint16_t *)dx;
  /* dx = y > 0 ? dy : 0; y is relu's output, so y > 0 <=> positive sign and nonzero. */
  int64_t blocks = (count + 4095) / 4096;
  PS_OMP("omp parallel for schedule(dynamic, 8) if (count > 262144)")
  for (int64_t bk = 0; bk < blocks; bk++) {
    int64_t i = bk * 4096, end = i + 4096 < count ? i + 4096 : count;
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
      uint16_t v = o[i];
      d[i] = (!(v & 0x8000u) && v != 0 && v <= 0x7c00u) ? g[i] : 0;
    }
  }
  return PS_OK;
}

/* ---- loss ---------------------------------------------------------------------------- */

PS_API int ps_nn_cross_entropy(const void *logits, const int32_t *labels, void *dlogits,
                               float *loss_sum, int32_t *correct, int64_t n, int64_t k,
                               float scale, void *stream) {
  (void)stream;
  if (n < 0 || k <= 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_cross_entropy: bad shape n=%lld k=%lld",
            (long long)n, (long long)k);
  if (n == 0) return PS_OK;
  CHECK_RANGE(logits, n * k * 2);
  CHECK_RANGE(labels, n * 4);
  if (dlogits) CHECK_RANGE(dlogits, n * k * 2);
  if (loss_sum) CHECK_RANGE(loss_sum, 4);
  if (correct) CHECK_RANGE(correct, 4);
  for (int64_t i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= k)
      PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_cross_entropy: label %d of sample %lld not in [0, %lld)",
              labels[i], (long long)i, (long long)k);
  double loss = 0.0;
  int64_t hits = 0;
  float *row = malloc((size_t)k * sizeof(float));
  if (!row) OOM();
  float g = scale / (float)n;
  for (int64_t i = 0; i < n; i++) {
    const half *l = (const half *)logits + i * k;
    int64_t arg = 0;
    float m = h2f(l[0]);
    for (int64_t j = 0; j < k; j++) {
      row[j] = h2f(l[j]);
      if (row[j] > m) m = row[j], arg = j;
    }
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) s += expf(row[j] - m);
    float lse = m + logf(s);
    loss += (double)(lse - row[labels[i]]);
    hits += arg == labels[i];
    if (dlogits) {
      half *d = (half *)dlogits + i * k;
      float inv = 1.0f / s;
      for (int64_t j = 0; j < k; j++) {
        float p = expf(row[j] - m) * inv;
        d[j] = f2h(g * (p - (j == labels[i] ? 1.0f : 0.0f)));
      }
    }
  }
  free(row);
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
  if (count < 0) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_cast: bad count %lld", (long long)count);
  if (count == 0) return PS_OK;
  CHECK_RANGE(src, count * dtsize(src_dtype));
  CHECK_RANGE(dst, count * dtsize(dst_dtype));
  if (src_dtype == dst_dtype)
    memmove(dst, src, (size_t)(count * dtsize(src_dtype)));
  else if (src_dtype == PS_NN_F16)
    h2f_row((const half *)src, (float *)dst, count);
  else
    f2h_row((const float *)src, (half *)dst, count);
  return PS_OK;
}

PS_API int ps_nn_unscale_check(void *grad, int32_t grad_dtype, int64_t count,
                               const float *scale, float inv_scale, int32_t in_place,
                               int32_t *found_inf, void *stream) {
  (void)stream;
  CHECK_DTYPE(grad_dtype);
  if (count < 0) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_unscale_check: bad count %lld", (long long)count);
  CHECK_RANGE(found_inf, 4);
  if (scale) CHECK_RANGE(scale, 4);
  if (count == 0) return PS_OK;
  CHECK_RANGE(grad, count * dtsize(grad_dtype));
  float inv = scale ? 1.0f / *scale : inv_scale;
  int bad = 0;
  if (grad_dtype == PS_NN_F16) {
    /* Non-finite fp16: exponent bits all ones. */
    uint16_t *g = (uint16_t *)grad;
    for (int64_t i = 0; i < count; i++) bad |= (g[i] & 0x7c00u) == 0x7c00u;
    if (in_place)
      for (int64_t i = 0; i < count; i++) ((half *)grad)[i] = f2h(h2f(((half *)grad)[i]) * inv);
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

PS_API int ps_nn_sgd_step(float *param, const void *grad, int32_t grad_dtype,
                          float *momentum_buf, void *param_half, int64_t count, float lr,
                          float momentum, float dampening, float weight_decay,
                          int32_t nesterov, const float *scale, const int32_t *found_inf,
                          const int32_t *steps_done, void *stream) {
  (void)stream;
  CHECK_DTYPE(grad_dtype);
  if (count < 0) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_sgd_step: bad count %lld", (long long)count);
  if (momentum != 0.0f && !momentum_buf)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_sgd_step: momentum %g needs a momentum buffer", momentum);
  if (found_inf) CHECK_RANGE(found_inf, 4);
  if (scale) CHECK_RANGE(scale, 4);
  if (steps_done) CHECK_RANGE(steps_done, 4);
  if (count == 0) return PS_OK;
  CHECK_RANGE(param, count * 4);
  CHECK_RANGE(grad, count * dtsize(grad_dtype));
  if (momentum_buf) CHECK_RANGE(momentum_buf, count * 4);
  if (param_half) CHECK_RANGE(param_half, count * 2);
  if (found_inf && *found_inf) return PS_OK;
  float inv = scale ? 1.0f / *scale : 1.0f;
  int fresh = steps_done && *steps_done == 0;
  PS_OMP("omp parallel for schedule(static) if (count > 65536)")
  for (int64_t i = 0; i < count; i++) {
    float g = (grad_dtype == PS_NN_F16 ? h2f(((const half *)grad)[i]) : ((const float *)grad)[i]) * inv;
    float p = param[i];
    if (weight_decay != 0.0f) g += weight_decay * p;
    if (momentum != 0.0f) {
      float b = fresh ? g : momentum * momentum_buf[i] + (1.0f - dampening) * g;
      momentum_buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p -= lr * g;
    param[i] = p;
    if (param_half) ((half *)param_half)[i] = f2h(p);
  }
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
                               float growth_factor, float backoff_factor,
                               int32_t growth_interval, void *stream) {
  (void)stream;
  CHECK_RANGE(scale, 4);
  CHECK_RANGE(growth_tracker, 4);
  CHECK_RANGE(found_inf, 4);
  if (growth_interval <= 0)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_scaler_update: bad growth_interval %d", growth_interval);
  /* torch._amp_update_scale_ (aten/src/ATen/native/cuda/AmpKernels.cu). */
  if (*found_inf) {
    *scale *= backoff_factor;
    *growth_tracker = 0;
  } else {
    int32_t successful = *growth_tracker + 1;
    if (successful == growth_interval) {
      float grown = *scale * growth_factor;
      if (isfinite(grown)) *scale = grown;
      *growth_tracker = 0;
    } else {
      *growth_tracker = successful;
    }
  }
  return PS_OK;
}
