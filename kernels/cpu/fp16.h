/*
 * fp16.h — fp16 storage for the CPU backend: the `half` type (_Float16 where the compiler has
 * it, else the IEEE binary16 bits converted by hand), fp16 <-> fp32 rows, AVX-512 helpers and
 * the transposing copies the GEMM's packing uses. All static inline: these run inside the
 * kernels' inner loops, and each translation unit gets its own inlined copy.
 *
 * Every fp32 -> fp16 conversion rounds to nearest even (vcvtps2ph with the default MXCSR,
 * libgcc's soft conversion, or f2h below).
 *
 * bf16 (PS_NN_BF16) is stored as its bits (uint16_t): widening is a shift, and narrowing is
 * rules.h's ps_bf16_from_f32, which the vector forms below spell out lane by lane (the
 * AVX512-BF16 instruction is not used: it flushes subnormals, the rule does not).
 *
 * Helpers that take `dt` take a PS_NN_* dtype: PS_NN_F32, PS_NN_F16 or PS_NN_BF16.
 */
#ifndef PINSTREAM_CPU_FP16_H
#define PINSTREAM_CPU_FP16_H

#include <stdint.h>
#include <string.h>

#include "common.h"
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
#include <immintrin.h>
#endif

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
static inline void h2f_row(const half *s, float *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
  if (i < n) { /* masked tail: rows here are often shorter than 16 */
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++) d[i] = h2f(s[i]);
#else
  for (; i < n; i++) d[i] = h2f(s[i]);
#endif
}
static inline void f2h_row(const float *s, half *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(
        d + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), _MM_FROUND_TO_NEAREST_INT));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) d[i] = f2h(s[i]);
#else
  for (; i < n; i++) d[i] = f2h(s[i]);
#endif
}

/* bf16 <-> fp32: ps_bf16_to_f32 / ps_bf16_from_f32 (rules.h), 16 or 8 lanes at a time. */
#if defined(__AVX512F__)
static inline __m512 b2f16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m256i f2b16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v), hi = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i qnan =
      _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), qnan);
  return _mm512_cvtepi32_epi16(r);
}
#endif
#if defined(__AVX2__)
static inline __m256 b2f8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline __m128i f2b8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v), hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i qnan =
      _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
  r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  /* 32 -> 16 bits (every lane is below 2^16, so the saturating pack is exact) */
  r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(r);
}
#endif

static inline void b2f_row(const uint16_t *s, float *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, b2f16(_mm256_loadu_si256((const __m256i *)(s + i))));
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, b2f8(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
  for (; i < n; i++) d[i] = ps_bf16_to_f32(s[i]);
}
static inline void f2b_row(const float *s, uint16_t *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(d + i), f2b16(_mm512_loadu_ps(s + i)));
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(d + i), f2b8(_mm256_loadu_ps(s + i)));
#endif
  for (; i < n; i++) d[i] = ps_bf16_from_f32(s[i]);
}

/* Bytes of one element of dtype dt. */
static inline int64_t act_bytes(int32_t dt) { return dt == PS_NN_F32 ? 4 : 2; }

/* The first two stages of the in-register transposes tr16 and tr8, as function NAME over N
 * vectors of type V (intrinsics prefix P: _mm512 or _mm256): rows interleaved in pairs, then
 * pairs of pairs, so that u[4g + e], 128-bit lane L, holds rows 4g..4g+3 of column 4L + e.
 * u may be r. */
#define PS_TR_LANE_STAGES(NAME, V, P, N)                                                  \
  static inline void NAME(V r[N], V u[N]) {                                               \
    V t[N];                                                                               \
    for (int i = 0; i < N / 2; i++) {                                                     \
      t[2 * i] = P##_unpacklo_ps(r[2 * i], r[2 * i + 1]);                                 \
      t[2 * i + 1] = P##_unpackhi_ps(r[2 * i], r[2 * i + 1]);                             \
    }                                                                                     \
    for (int g = 0; g < N / 4; g++) {                                                     \
      u[4 * g] = P##_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));         \
      u[4 * g + 1] = P##_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));     \
      u[4 * g + 2] = P##_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0)); \
      u[4 * g + 3] = P##_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2)); \
    }                                                                                     \
  }

#if defined(__AVX512F__)
static inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}
/* Up to 16 values of a row (dtype dt) as fp32 lanes, zero past n. */
static inline __m512 load16(const void *p, int32_t dt, int64_t n) {
  __mmask16 m = mask16(n);
  if (dt == PS_NN_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  if (dt == PS_NN_BF16) return b2f16(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_maskz_loadu_ps(m, p);
}
PS_TR_LANE_STAGES(tr16_lanes, __m512, _mm512, 16)
/* In-register transpose of 16 rows of 16 floats: r[i] lane j <- r[j] lane i. */
static inline void tr16(__m512 r[16]) {
  tr16_lanes(r, r);
  /* r[4g + e], 128-bit lane L, now holds rows 4g..4g+3 of column 4L + e. */
  __m512 t[16];
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

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__F16C__)
/* Lanes [0, n) set (n clamped to [0, 8]), for the masked loads and stores of AVX2. */
static inline __m256i mask8(int64_t n) {
  const int32_t m = (int32_t)(n < 0 ? 0 : n > 8 ? 8 : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* Up to 8 values of a row (dtype dt) as fp32 lanes, zero past n; reads only [0, n). */
static inline __m256 load8(const void *p, int32_t dt, int64_t n) {
  if (dt == PS_NN_F32) return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask8(n));
  __m128i v = _mm_setzero_si128();
  if (n >= 8)
    v = _mm_loadu_si128((const __m128i *)p);
  else if (n > 0)
    memcpy(&v, p, (size_t)n * 2);
  return dt == PS_NN_F16 ? _mm256_cvtph_ps(v) : b2f8(v);
}
PS_TR_LANE_STAGES(tr8_lanes, __m256, _mm256, 8)
/* In-register transpose of 8 rows of 8 floats: r[i] lane j <- r[j] lane i. */
static inline void tr8(__m256 r[8]) {
  __m256 u[8];
  tr8_lanes(r, u);
  /* u[4g + e], 128-bit half L, holds rows 4g..4g+3 of column 4L + e. */
  for (int e = 0; e < 4; e++) {
    r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
    r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
  }
}
#endif

static inline float act_get(const void *p, int32_t dt, int64_t i);

/* d[j*ldd + i] = (float) s[i*lds + j] for i < rows, j < cols: a transposing copy from dtype
 * dt into fp32, in 16x16 (AVX-512) or 8x8 (AVX2) register blocks. */
static inline void transpose_to_f32(const void *s, int32_t dt, int64_t lds, int64_t rows,
                                    int64_t cols, float *d, int64_t ldd) {
  const int64_t es = act_bytes(dt);
#if defined(__AVX512F__)
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    int64_t ri = rows - i0 < 16 ? rows - i0 : 16;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      int64_t cj = cols - j0 < 16 ? cols - j0 : 16;
      __m512 r[16];
      for (int64_t i = 0; i < 16; i++)
        r[i] = i < ri ? load16((const char *)s + ((i0 + i) * lds + j0) * es, dt, cj)
                      : _mm512_setzero_ps();
      tr16(r);
      __mmask16 m = mask16(ri);
      for (int64_t j = 0; j < cj; j++) _mm512_mask_storeu_ps(d + (j0 + j) * ldd + i0, m, r[j]);
    }
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (int64_t i0 = 0; i0 < rows; i0 += 8) {
    int64_t ri = rows - i0 < 8 ? rows - i0 : 8;
    __m256i m = mask8(ri);
    for (int64_t j0 = 0; j0 < cols; j0 += 8) {
      int64_t cj = cols - j0 < 8 ? cols - j0 : 8;
      __m256 r[8];
      for (int64_t i = 0; i < 8; i++)
        r[i] = i < ri ? load8((const char *)s + ((i0 + i) * lds + j0) * es, dt, cj)
                      : _mm256_setzero_ps();
      tr8(r);
      for (int64_t j = 0; j < cj; j++) {
        float *o = d + (j0 + j) * ldd + i0;
        if (ri == 8)
          _mm256_storeu_ps(o, r[j]);
        else
          _mm256_maskstore_ps(o, m, r[j]);
      }
    }
  }
#else
  (void)es;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) d[j * ldd + i] = act_get(s, dt, i * lds + j);
#endif
}

/* d[j*ldd + i] = (half) s[i*lds + j] for i < rows, j < cols (fp32 -> fp16 or bf16 by dt,
 * transposed). */
static inline void transpose_to_half(const float *s, int64_t lds, int64_t rows, int64_t cols,
                                     void *dv, int32_t dt, int64_t ldd) {
  uint16_t *d = (uint16_t *)dv;
  const int bf = dt == PS_NN_BF16;
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
        _mm256_mask_storeu_epi16(
            d + (j0 + j) * ldd + i0, m,
            bf ? f2b16(r[j]) : _mm512_cvtps_ph(r[j], _MM_FROUND_TO_NEAREST_INT));
    }
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (int64_t i0 = 0; i0 < rows; i0 += 8) {
    int64_t ri = rows - i0 < 8 ? rows - i0 : 8;
    for (int64_t j0 = 0; j0 < cols; j0 += 8) {
      int64_t cj = cols - j0 < 8 ? cols - j0 : 8;
      __m256 r[8];
      for (int64_t i = 0; i < 8; i++)
        r[i] = i < ri ? load8(s + (i0 + i) * lds + j0, 0, cj) : _mm256_setzero_ps();
      tr8(r);
      for (int64_t j = 0; j < cj; j++) {
        __m128i h = bf ? f2b8(r[j]) : _mm256_cvtps_ph(r[j], _MM_FROUND_TO_NEAREST_INT);
        uint16_t *o = d + (j0 + j) * ldd + i0;
        if (ri == 8)
          _mm_storeu_si128((__m128i *)o, h);
        else
          memcpy(o, &h, (size_t)ri * 2);
      }
    }
  }
#else
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      const float v = s[i * lds + j];
      if (bf) {
        d[j * ldd + i] = ps_bf16_from_f32(v);
      } else {
        const half h = f2h(v);
        memcpy(d + j * ldd + i, &h, 2);
      }
    }
#endif
}

/* Activations of dtype dt (PS_NN_F32, PS_NN_F16 or PS_NN_BF16) at element offset `at`, as
 * fp32 rows and elements: the paths that are not specialized read and write through these. */
static inline const void *act_at(const void *p, int32_t dt, int64_t at) {
  return (const char *)p + at * act_bytes(dt);
}
static inline void act_load(const void *s, int32_t dt, int64_t at, float *d, int64_t n) {
  if (dt == PS_NN_F16)
    h2f_row((const half *)s + at, d, n);
  else if (dt == PS_NN_BF16)
    b2f_row((const uint16_t *)s + at, d, n);
  else
    memcpy(d, (const float *)s + at, (size_t)n * sizeof(float));
}
static inline void act_store(const float *s, void *d, int32_t dt, int64_t at, int64_t n) {
  if (dt == PS_NN_F16)
    f2h_row(s, (half *)d + at, n);
  else if (dt == PS_NN_BF16)
    f2b_row(s, (uint16_t *)d + at, n);
  else
    memcpy((float *)d + at, s, (size_t)n * sizeof(float));
}
static inline float act_get(const void *p, int32_t dt, int64_t i) {
  if (dt == PS_NN_F16) return h2f(((const half *)p)[i]);
  if (dt == PS_NN_BF16) return ps_bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}
static inline void act_set(void *p, int32_t dt, int64_t i, float v) {
  if (dt == PS_NN_F16)
    ((half *)p)[i] = f2h(v);
  else if (dt == PS_NN_BF16)
    ((uint16_t *)p)[i] = ps_bf16_from_f32(v);
  else
    ((float *)p)[i] = v;
}

/* Sum of a half row (fp16 or bf16 by dt) in fp32 (16 lanes, then the lanes: not the
 * sequential order). */
static inline float sum_row(const void *sv, int32_t dt, int64_t n) {
  const uint16_t *s = (const uint16_t *)sv;
  int64_t i = 0;
  float t = 0.0f;
#if defined(__AVX512F__)
  __m512 a = _mm512_setzero_ps();
  for (; i < n; i += 16) a = _mm512_add_ps(a, load16(s + i, dt, n - i));
  t = _mm512_reduce_add_ps(a);
#elif defined(__AVX2__) && defined(__F16C__)
  __m256 a = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) a = _mm256_add_ps(a, load8(s + i, dt, 8));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  t = _mm_cvtss_f32(q);
#endif
  for (; i < n; i++) t += act_get(s, dt, i);
  return t;
}

#endif /* PINSTREAM_CPU_FP16_H */
