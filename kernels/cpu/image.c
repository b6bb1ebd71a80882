/*
 * image.c — CPU backend of the PS-SECTION image kernels (the numerical reference of
 * kernels/cuda/image.cu: both must give the same bits).
 *
 * Numerics: the normalize is a fp32 multiply then a fp32 add, each rounded, never a fused
 * multiply-add (ps_image_value in kernels/rules.h; the vector paths below spell it out). GCC
 * contracts a*b+c into an FMA across statements under its default -ffp-contract=fast (also through
 * _mm512_mul_ps/_mm512_add_ps, which are plain vector arithmetic in its headers), so this
 * file turns contraction off for itself; clang's default (contract within one expression
 * only) never fuses two statements. The fp16 cast rounds to nearest even on every path
 * (vcvtps2ph/vcvtps2phx with the default MXCSR, libgcc's soft conversion, or
 * f2h in fp16.h).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSSE3__)
#include <tmmintrin.h>
#endif

#include "../pinstream.h"
#include "common.h"
#include "fp16.h"
#include "threads.h"

/* Converts one gathered channel plane. Kept as a flat loop over the plane so the compiler
 * vectorizes it (u8 -> i32 -> f32, mul, add, -> f16): rows of 32 are too short for that. */
static void plane_to_f16(const uint8_t *t, int64_t len, float s, float b, half *o) {
  int64_t i = 0;
#if defined(__AVX512F__)
  /* GCC 12 leaves the float -> _Float16 loop scalar: spell the 16-wide form out. */
  const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
  for (; i + 16 <= len; i += 16) {
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(t + i))));
    __m512 r = _mm512_add_ps(_mm512_mul_ps(f, vs), vb);
    _mm256_storeu_si256((__m256i *)(o + i),
                        _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
  for (; i + 8 <= len; i += 8) {
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(t + i))));
    __m256 r = _mm256_add_ps(_mm256_mul_ps(f, vs), vb);
    _mm_storeu_si128((__m128i *)(o + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < len; i++) o[i] = f2h(ps_image_value(t[i], s, b));
}

static void plane_to_f32(const uint8_t *t, int64_t len, float s, float b, float *o) {
  for (int64_t i = 0; i < len; i++) o[i] = ps_image_value(t[i], s, b);
}

/* The colour path of one gathered plane: `color` holds ps_image_color of each byte value for
 * the sample (a byte has 256 values, so 256 rule calls per sample, not one per pixel), then
 * ps_image_normalize per pixel. */
static void plane_color(const uint8_t *t, int64_t len, const float *color, float s, float b,
                        int32_t out_dtype, void *o) {
  if (out_dtype == PS_IMAGE_F16) {
    half *oh = o;
    for (int64_t i = 0; i < len; i++) oh[i] = f2h(ps_image_normalize(color[t[i]], s, b));
  } else {
    float *of = o;
    for (int64_t i = 0; i < len; i++) of[i] = ps_image_normalize(color[t[i]], s, b);
  }
}

/* The mixing colour path of one 3-channel sample whose three gathered planes are t (plane
 * bytes apart): per pixel, the contrast and brightness of each byte from `color`, then
 * saturation and hue across the channels (ps_image_mix), then ps_image_normalize. */
static void planes_mix(const uint8_t *t, int64_t plane, const float *color,
                       const ps_image_sample *sm, const float *sc, const float *bi,
                       int32_t out_dtype, void *o) {
  for (int64_t i = 0; i < plane; i++) {
    float r = color[t[i]], g = color[t[plane + i]], b = color[t[2 * plane + i]];
    ps_image_mix(sm, &r, &g, &b);
    r = ps_image_normalize(r, sc[0], bi[0]);
    g = ps_image_normalize(g, sc[1], bi[1]);
    b = ps_image_normalize(b, sc[2], bi[2]);
    if (out_dtype == PS_IMAGE_F16) {
      half *oh = o;
      oh[i] = f2h(r);
      oh[plane + i] = f2h(g);
      oh[2 * plane + i] = f2h(b);
    } else {
      float *of = o;
      of[i] = r;
      of[plane + i] = g;
      of[2 * plane + i] = b;
    }
  }
}

/* The exact integer sum behind a sample's mean grey (ps_image_grey_mean): over the source
 * rows and columns its crop window covers (the flips move pixels, not the sum; pixels outside
 * the image are 0), the weighted grey of each pixel when c == 3, else every byte. */
static uint64_t window_grey_sum(const uint8_t *img, int32_t layout, int32_t c, int32_t h, int32_t w,
                                int32_t oy, int32_t ox) {
  int32_t y0, y1, x0, x1;
  ps_image_window(oy, h, &y0, &y1);
  ps_image_window(ox, w, &x0, &x1);
  const int64_t plane = (int64_t)h * w;
  const int64_t cstep = layout == PS_IMAGE_NCHW ? plane : 1,
                pstep = layout == PS_IMAGE_NCHW ? 1 : c;
  uint64_t sum = 0;
  for (int32_t y = y0; y < y1; y++) {
    const uint8_t *row = img + (int64_t)y * w * pstep;
    if (c == 3) {
      for (int32_t x = x0; x < x1; x++) {
        const uint8_t *px = row + (int64_t)x * pstep;
        sum += ps_image_grey_weighted(px[0], px[cstep], px[2 * cstep]);
      }
    } else {
      for (int32_t ch = 0; ch < c; ch++) {
        uint32_t part = 0; /* at most 255 * 2^24 */
        for (int32_t x = x0; x < x1; x++) part += row[ch * cstep + (int64_t)x * pstep];
        sum += part;
      }
    }
  }
  return sum;
}

/* Writes +0.0 over rows [y0, y1) x columns [x0, x1) in each of a sample's c output planes.
 * Out of line and called only for a sample with a cutout: inlined into augment_range, it made
 * the loop without cutouts ~40% slower on NHWC CIFAR batches. */
static __attribute__((noinline)) void cutout(int32_t y0, int32_t y1, int32_t x0, int32_t x1,
                                             int32_t c, int32_t h, int32_t w, int32_t out_dtype,
                                             void *out) {
  const int32_t run = x1 - x0;
  if (run <= 0 || y1 <= y0) return;
  const size_t esize = out_dtype == PS_IMAGE_F16 ? 2 : 4;
  for (int32_t ch = 0; ch < c; ch++) {
    for (int32_t y = y0; y < y1; y++) {
      const int64_t at = ((int64_t)ch * h + y) * w + x0;
      /* +0.0 is all-zero bits in fp16 and fp32. */
      memset((char *)out + at * (int64_t)esize, 0, (size_t)run * esize);
    }
  }
}

/* Gathers channel `ch` of one sample, cropped and flipped, into the h x w plane `t`. The
 * offsets come from ps_image_offset (|oy| <= h, |ox| <= w), so no sum below overflows. */
static void gather_plane(const uint8_t *img, int32_t layout, int32_t c, int32_t h, int32_t w,
                         int32_t ch, int32_t oy, int32_t ox, int32_t flip, int32_t vflip,
                         uint8_t *t) {
  /* Output column x reads source column sx = xs + ox (xs = flip ? w-1-x : x); the source
   * columns inside the image form one contiguous output run [x0, x1). */
  int32_t lo = -ox, hi = w - ox; /* xs range with 0 <= sx < w */
  if (lo < 0) lo = 0;
  if (hi > w) hi = w;
  /* Output row y reads source row sy = (vflip ? h-1-y : y) + oy, stepped rather than
   * recomputed per row (a select per row measured ~20% slower on NHWC CIFAR batches). */
  const int32_t sy_step = vflip ? -1 : 1;
  int32_t sy = (vflip ? h - 1 : 0) + oy - sy_step;
  for (int32_t y = 0; y < h; y++) {
    uint8_t *row = t + (int64_t)y * w;
    sy += sy_step;
    if (sy < 0 || sy >= h || lo >= hi) {
      memset(row, 0, (size_t)w);
      continue;
    }
    int32_t x0 = flip ? w - hi : lo, x1 = flip ? w - lo : hi;
    memset(row, 0, (size_t)x0);
    memset(row + x1, 0, (size_t)(w - x1));
    if (layout == PS_IMAGE_NCHW) {
      const uint8_t *srow = img + ((int64_t)ch * h + sy) * w;
      if (!flip) {
        memcpy(row + x0, srow + x0 + ox, (size_t)(x1 - x0));
      } else {
        for (int32_t x = x0; x < x1; x++) row[x] = srow[w - 1 - x + ox];
      }
    } else {
      const uint8_t *srow = img + (int64_t)sy * w * c + ch;
      for (int32_t x = x0; x < x1; x++) {
        int32_t sx = (flip ? w - 1 - x : x) + ox;
        row[x] = srow[(int64_t)sx * c];
      }
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PS_IMAGE_ROW_AVX512 1
/* Widest row of the AVX-512 path (chunks of 16 pixels); wider images take the plane path. */
#define PS_ROW_CHUNKS 64

/* The NCHW fast path for one sample: every output row straight from its source row, 16
 * pixels at a time, with no intermediate plane and no libc calls. Masked byte loads read
 * only the source bytes inside the row (masked-off lanes are not accessed, so they cannot
 * fault) and give 0 for the padding; a flipped chunk is loaded backwards as one 16-byte
 * window and reversed with a byte shuffle. The load windows and masks depend only on the
 * sample's (dx, flip), so they are computed once per sample, not per row.
 *
 * `chunks` is (w + 15) / 16, a constant in the copies for the common widths (sample_dispatch):
 * with the chunk loop unrolled, the windows and masks stay in registers, which made a CIFAR
 * sample (one image in L1) 247-253 ns against 397-415 with `chunks` a variable.
 * `deno run -A bench/pipeline.ts` times the kernel again (its "fused kernel alone" rows).
 *
 * Rows of exactly 32 to fp16 (h even) take a table instead (sample_lut32). */
static inline __attribute__((always_inline)) void sample_nchw_avx512(
    const uint8_t *img, int32_t c, int32_t h, int32_t w, int32_t chunks, int32_t oy, int32_t ox,
    int32_t flip, int32_t vflip, const float *sc, const float *bi, int32_t out_dtype, void *out,
    const char *ahead) {
  const __m128i rev = _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int32_t first[PS_ROW_CHUNKS];
  __mmask16 load[PS_ROW_CHUNKS], store[PS_ROW_CHUNKS];
  for (int32_t j = 0; j < chunks; j++) {
    int32_t x = 16 * j, lanes = w - x < 16 ? w - x : 16;
    /* Source column of output lane k: no flip x + k + ox; flip (w-1-x+ox) - k. The window
     * [first, first + 16) covers those columns; lane k of the load is column first + k. */
    first[j] = flip ? w - 1 - x + ox - 15 : x + ox;
    /* Lane k is wanted when its column is inside the row and its output lane is < lanes
     * (k, or 15 - k when flipped): one contiguous run [lo, hi) of lanes. */
    int32_t lo = -first[j] > 0 ? -first[j] : 0, hi = w - first[j] < 16 ? w - first[j] : 16;
    if (flip) {
      if (lo < 16 - lanes) lo = 16 - lanes;
    } else if (hi > lanes) {
      hi = lanes;
    }
    load[j] = (__mmask16)(lo < hi ? ((1u << hi) - 1u) & ~((1u << lo) - 1u) : 0u);
    store[j] = (__mmask16)((1u << lanes) - 1u);
  }
  const int64_t plane = (int64_t)h * w;
  for (int32_t ch = 0; ch < c; ch++) {
    const __m512 vs = _mm512_set1_ps(sc[ch]), vb = _mm512_set1_ps(bi[ch]);
    /* A padding pixel is the byte 0 through the same multiply and add. */
    const __m512 zero = _mm512_add_ps(_mm512_mul_ps(_mm512_setzero_ps(), vs), vb);
    const uint8_t *src = img + ch * plane;
    for (int32_t y = 0; y < h; y++) {
      /* vflip is a constant of this copy (sample_dispatch): no select per row. */
      const int32_t sy = (vflip ? h - 1 - y : y) + oy;
      const int64_t o = ch * plane + (int64_t)y * w;
      /* The same row of a later gathered image, one line per row: spread over the sample so
       * the misses overlap the arithmetic instead of queueing at its start. */
      if (ahead != NULL) __builtin_prefetch(ahead + o, 0, 3);
      const int inside = sy >= 0 && sy < h;
      const uint8_t *srow = src + (int64_t)sy * w;
      for (int32_t j = 0; j < chunks; j++) {
        __m512 r = zero;
        if (inside && load[j] != 0) {
          /* Only lanes in load[j] are read; lane 0's address may lie outside the row. */
          const uint8_t *p = (const uint8_t *)((uintptr_t)srow + (intptr_t)first[j]);
          __m128i bytes = _mm_maskz_loadu_epi8(load[j], p);
          if (flip) bytes = _mm_shuffle_epi8(bytes, rev);
          __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
          r = _mm512_add_ps(_mm512_mul_ps(f, vs), vb);
        }
        if (out_dtype == PS_IMAGE_F16) {
          __m256i hbits = _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          _mm256_mask_storeu_epi16((uint16_t *)out + o + 16 * j, store[j], hbits);
        } else {
          _mm512_mask_storeu_ps((float *)out + o + 16 * j, store[j], r);
        }
      }
    }
  }
}

/* sample_nchw_avx512 with flip, vflip, the output type, whether to prefetch and, for rows of
 * 1, 2 or 4 chunks (widths up to 16, 32 and 64: MNIST, CIFAR, 64 x 64 images), the chunk count
 * as constants: each combination is its own copy, with no branch on them left in the inner
 * loops. */
static inline __attribute__((always_inline)) void sample_dispatch(
    const uint8_t *img, int32_t c, int32_t h, int32_t w, int32_t oy, int32_t ox, int32_t flip,
    int32_t vflip, const float *sc, const float *bi, int32_t out_dtype, void *so,
    const char *ahead) {
#define PS_S(F, V, D, A)                                                                      \
  switch ((w + 15) / 16) {                                                                    \
    case 1: sample_nchw_avx512(img, c, h, w, 1, oy, ox, F, V, sc, bi, D, so, A); break;       \
    case 2: sample_nchw_avx512(img, c, h, w, 2, oy, ox, F, V, sc, bi, D, so, A); break;       \
    case 4: sample_nchw_avx512(img, c, h, w, 4, oy, ox, F, V, sc, bi, D, so, A); break;       \
    default: sample_nchw_avx512(img, c, h, w, (w + 15) / 16, oy, ox, F, V, sc, bi, D, so, A); \
  }
#define PS_SD(F, V, A)             \
  if (out_dtype == PS_IMAGE_F16) { \
    PS_S(F, V, PS_IMAGE_F16, A);   \
  } else {                         \
    PS_S(F, V, PS_IMAGE_F32, A);   \
  }
#define PS_SV(F, A) \
  if (vflip) {      \
    PS_SD(F, 1, A); \
  } else {          \
    PS_SD(F, 0, A); \
  }
#define PS_SF(A) \
  if (flip) {    \
    PS_SV(1, A); \
  } else {       \
    PS_SV(0, A); \
  }
  if (ahead != NULL) {
    PS_SF(ahead);
  } else {
    PS_SF(NULL);
  }
#undef PS_SF
#undef PS_SV
#undef PS_SD
#undef PS_S
}
#endif

#if defined(PS_IMAGE_ROW_AVX512) && defined(__AVX512VBMI__)
#define PS_IMAGE_LUT32 1
/*
 * Rows of exactly 32 pixels to fp16 (CIFAR, SVHN, 32 x 32 ImageNet), two rows a step, through a
 * table: a channel's output is a function of the byte alone, f16(byte * scale + bias), so its
 * 256 values are computed once per range with the same multiply, add and cast as the row path
 * (the same bits) and split into a low-byte and a high-byte table of 4 registers each. A step
 * loads two 32-byte row windows (masked as in the row path: padding reads as byte 0, whose
 * table entry is the padding value), arranges them with one byte permute (which also does the
 * flip), looks each byte up in both tables (vpermi2b covers 128 entries; the top bit picks the
 * half) and interleaves the bytes into 64 fp16 values: about half the row path's instructions,
 * with no fp32 arithmetic. One thread, 128 CIFAR images to fp16, from a ring of batches in
 * L2 or L3: 21-23 us a batch through the table against 33-34 us through the row path
 * (`deno run -A bench/pipeline.ts`, its "fused kernel alone" rows, measures the kernel again).
 */
typedef struct {
  __m512i lo[4], hi[4];
} lut32_table;

/* The tables of one channel: entry v is f16(v * s + b), as sample_nchw_avx512 computes it. */
static void lut32_build(float s, float b, lut32_table *t) {
  uint8_t lo[256] __attribute__((aligned(64))), hi[256] __attribute__((aligned(64)));
  const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
  const __m512i step = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int32_t v = 0; v < 256; v += 16) {
    const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_set1_epi32(v), step));
    const __m256i h = _mm512_cvtps_ph(_mm512_add_ps(_mm512_mul_ps(f, vs), vb),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_store_si128((__m128i *)(lo + v),
                    _mm256_cvtepi16_epi8(_mm256_and_si256(h, _mm256_set1_epi16(0xff))));
    _mm_store_si128((__m128i *)(hi + v), _mm256_cvtepi16_epi8(_mm256_srli_epi16(h, 8)));
  }
  for (int q = 0; q < 4; q++) {
    t->lo[q] = _mm512_load_si512(lo + 64 * q);
    t->hi[q] = _mm512_load_si512(hi + 64 * q);
  }
}

/* The byte permute of a step: the loaded bytes are [row y: lanes 0-31 | row y + 1: 32-63], lane
 * k holding source column ox + k. unpacklo/unpackhi interleave 8 bytes of each 128-bit lane, so
 * byte 16L + k (k < 8) becomes output pixel 8L + k of row y and byte 16L + 8 + k pixel 8L + k
 * of row y + 1; output pixel x reads lane x, or 31 - x when flipped. */
static __m512i lut32_arrange(int32_t flip) {
  uint8_t idx[64];
  for (int32_t L = 0; L < 4; L++) {
    for (int32_t k = 0; k < 8; k++) {
      const int32_t x = 8 * L + k, lane = flip ? 31 - x : x;
      idx[16 * L + k] = (uint8_t)lane;
      idx[16 * L + 8 + k] = (uint8_t)(32 + lane);
    }
  }
  return _mm512_loadu_si512(idx);
}

static inline __attribute__((always_inline)) __m512i lut32_lookup(const __m512i *t, __m512i v,
                                                                  __mmask64 top) {
  return _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(t[0], v, t[1]),
                                _mm512_permutex2var_epi8(t[2], v, t[3]));
}

/* One sample, NCHW rows of 32, h even, fp16 out, no colour step (cutout is applied after). */
/* `arrange` is lut32_arrange(flip), made once per range. */
static void sample_lut32(const uint8_t *img, int32_t c, int32_t h, int32_t oy, int32_t ox,
                         __m512i arrange, int32_t vflip, const lut32_table *tables, void *out,
                         const char *ahead) {
  /* Lanes whose source column ox + k lies in [0, 32); none when |ox| >= 32. */
  const int32_t lo = ox < 0 ? -ox : 0, hi = ox > 0 ? 32 - ox : 32;
  const __mmask32 cols =
      lo < hi ? (__mmask32)((((uint64_t)1 << hi) - 1) & ~(((uint64_t)1 << lo) - 1)) : 0;
  const int64_t plane = (int64_t)h * 32;
  for (int32_t ch = 0; ch < c; ch++) {
    const lut32_table *t = &tables[ch];
    const uint8_t *src = img + ch * plane;
    uint16_t *o = (uint16_t *)out + ch * plane;
    for (int32_t y = 0; y < h; y += 2) {
      /* A gathered batch: the same two rows (one line) of the next image, as the row path. */
      if (ahead != NULL) __builtin_prefetch(ahead + ch * plane + (int64_t)y * 32, 0, 3);
      const int32_t sy0 = (vflip ? h - 1 - y : y) + oy, sy1 = (vflip ? h - 2 - y : y + 1) + oy;
      const __mmask32 m0 = sy0 >= 0 && sy0 < h ? cols : 0, m1 = sy1 >= 0 && sy1 < h ? cols : 0;
      /* Only lanes in the mask are read; the window's start may lie outside the image. */
      const __m256i r0 = _mm256_maskz_loadu_epi8(
          m0, (const void *)((uintptr_t)(src + (int64_t)sy0 * 32) + (intptr_t)ox));
      const __m256i r1 = _mm256_maskz_loadu_epi8(
          m1, (const void *)((uintptr_t)(src + (int64_t)sy1 * 32) + (intptr_t)ox));
      const __m512i v =
          _mm512_permutexvar_epi8(arrange, _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1));
      const __mmask64 top = _mm512_movepi8_mask(v);
      const __m512i l = lut32_lookup(t->lo, v, top), hb = lut32_lookup(t->hi, v, top);
      _mm512_storeu_si512(o + (int64_t)y * 32, _mm512_unpacklo_epi8(l, hb));
      _mm512_storeu_si512(o + (int64_t)y * 32 + 32, _mm512_unpackhi_epi8(l, hb));
    }
  }
}
#endif

/* Copies one NHWC image (h*w pixels of c bytes) into c planes (NCHW), so the NCHW paths
 * (the row path's vector loads, the flat plane conversions) serve NHWC batches too: read with
 * a stride of c per channel, the NHWC plane gather was ~3.5x slower on CIFAR batches. The
 * values are bytes moved, so the result's bits do not depend on the layout. */
#if defined(__SSSE3__)
/* The byte shuffles of a 3-channel de-interleave, 16 pixels (48 bytes, three loads) at a time:
 * [ch][q][L] is where lane L of channel ch (byte 3L + ch) lies in load q, 3L + ch - 16q, or -1
 * (top bit set: the shuffle gives 0) when it lies in another load. */
static const int8_t NHWC3_SHUFFLE[3][3][16] = {
    {{0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13}},
    {{1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14}},
    {{2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15}},
};
#endif

static void nhwc_to_planes(const uint8_t *img, int32_t c, int64_t plane, uint8_t *t) {
  int64_t p = 0;
#if defined(__SSSE3__)
  if (c == 3) {
    __m128i m[3][3];
    for (int ch = 0; ch < 3; ch++) {
      for (int q = 0; q < 3; q++) m[ch][q] = _mm_loadu_si128((const __m128i *)NHWC3_SHUFFLE[ch][q]);
    }
    for (; p + 16 <= plane; p += 16) {
      const __m128i a0 = _mm_loadu_si128((const __m128i *)(img + 3 * p));
      const __m128i a1 = _mm_loadu_si128((const __m128i *)(img + 3 * p + 16));
      const __m128i a2 = _mm_loadu_si128((const __m128i *)(img + 3 * p + 32));
      for (int ch = 0; ch < 3; ch++) {
        __m128i v = _mm_or_si128(
            _mm_or_si128(_mm_shuffle_epi8(a0, m[ch][0]), _mm_shuffle_epi8(a1, m[ch][1])),
            _mm_shuffle_epi8(a2, m[ch][2]));
        _mm_storeu_si128((__m128i *)(t + ch * plane + p), v);
      }
    }
  }
#endif
  for (; p < plane; p++) {
    for (int32_t ch = 0; ch < c; ch++) t[ch * plane + p] = img[p * c + ch];
  }
}

/* How many samples ahead a gathered sample's image is prefetched into the L1, a line per row
 * (or two) as the sample is worked on. Measured on 50,000 CIFAR images, shuffled batches of
 * 128, split over 2 threads: 1 ahead 36-38 us a batch, 2 ahead 39-40, 4 ahead 46-56 (the lines
 * arrive too early for the L1), none 56-57. `deno run -A bench/pipeline.ts` (its
 * DeviceDataset row) measures a setting again. */
#define PS_GATHER_AHEAD 1
/* And how many ahead it is fetched whole into the L2 when a sample starts, so that the L1
 * prefetches above find their lines there rather than in DRAM. Measured the same way (with
 * huge pages): this prefetch 2 ahead together with the table path for gathered rows of 32 took
 * 34-36 us a batch on one thread and 24-26 split over 2, against 47-49 and 27-28 with neither;
 * 3 ahead the same or slower, 5 slower. Without this prefetch the table path was slower than
 * the row path (29-30 against 28-29 us split). */
#define PS_GATHER_FAR 2

/* ps_image_augment over samples [i0, i1). */
typedef struct {
  const uint8_t *src;
  const int32_t *indices; /* sample i reads image indices[i], or NULL: image i */
  const int32_t *params;  /* PS_IMAGE_PARAMS per sample, or NULL: centre crop, nothing else */
  void *out;
  int32_t layout, c, h, w, pad, out_dtype;
  int32_t contrast; /* the records' contrast words count (no PS_IMAGE_NO_CONTRAST) */
  float scale[PS_IMAGE_MAX_CHANNELS], bias[PS_IMAGE_MAX_CHANNELS];
  _Atomic int failed; /* no memory for the gathered plane */
} augment_ctx;

static void augment_range(void *vctx, int64_t i0, int64_t i1) {
  augment_ctx *k = vctx;
  const int32_t layout = k->layout, c = k->c, h = k->h, w = k->w, pad = k->pad;
  const int32_t out_dtype = k->out_dtype;
  const int32_t *prm = k->params;
  /* Local copies: the output stores cannot alias them, so the compiler keeps them in
   * registers (reading them through `k` cost ~4% on a CIFAR batch). */
  float sc[PS_IMAGE_MAX_CHANNELS], bi[PS_IMAGE_MAX_CHANNELS];
  memcpy(sc, k->scale, sizeof sc);
  memcpy(bi, k->bias, sizeof bi);
  void *out = k->out;
  const int64_t plane = (int64_t)h * w, img_bytes = plane * c;
  /* One gathered plane per range and, for NHWC with several channels, the sample as planes;
   * small images (CIFAR: 1 + 3 KiB) stay on the stack. */
  const int64_t planes_bytes = layout == PS_IMAGE_NHWC && c > 1 ? img_bytes : 0;
  uint8_t stack_buf[16384];
  /* Three gathered planes for a 3-channel image (saturation and hue mix the channels). */
  const int64_t gathered = c == 3 ? 3 * plane : plane;
  const int64_t need = gathered + planes_bytes;
  uint8_t *t = need <= (int64_t)sizeof stack_buf ? stack_buf : (uint8_t *)malloc((size_t)need);
  if (t == NULL) {
    atomic_store(&k->failed, 1);
    return;
  }
  uint8_t *planes = planes_bytes > 0 ? t + gathered : NULL;
  /* The layout the sample is read in: NHWC images are made planes first (c == 1 is both). */
  const int32_t read_layout = planes != NULL || c == 1 ? PS_IMAGE_NCHW : layout;
#if defined(PS_IMAGE_LUT32)
  const int lut32 =
      read_layout == PS_IMAGE_NCHW && w == 32 && h % 2 == 0 && out_dtype == PS_IMAGE_F16;
  lut32_table tables[PS_IMAGE_MAX_CHANNELS];
  for (int32_t ch = 0; lut32 && ch < c; ch++) lut32_build(sc[ch], bi[ch], &tables[ch]);
  const __m512i arrange[2] = {lut32_arrange(0), lut32_arrange(1)};
#endif
  for (int64_t i = i0; i < i1; i++) {
    ps_image_sample sm;
    ps_image_sample_decode(prm != NULL ? prm + PS_IMAGE_PARAMS * i : NULL, pad, c, h, w,
                           k->contrast, &sm);
    const int32_t *idx = k->indices;
    const uint8_t *img = k->src + (idx != NULL ? (int64_t)idx[i] : i) * img_bytes;
    /* Gathered images are scattered over a set bigger than the caches, and the hardware
     * prefetcher does not cross into a new image: a later sample's image is fetched ahead. */
    const char *ahead = idx != NULL && i + PS_GATHER_AHEAD < i1
                            ? (const char *)(k->src + (int64_t)idx[i + PS_GATHER_AHEAD] * img_bytes)
                            : NULL;
    if (idx != NULL && i + PS_GATHER_FAR < i1) {
      const char *far = (const char *)(k->src + (int64_t)idx[i + PS_GATHER_FAR] * img_bytes);
      for (int64_t b = 0; b < img_bytes; b += 64) __builtin_prefetch(far + b, 0, 2);
    }
    const int32_t oy = sm.oy, ox = sm.ox, flip = sm.flip, vflip = sm.vflip;
    char *so = (char *)out + i * img_bytes * (out_dtype == PS_IMAGE_F16 ? 2 : 4);
    if (planes != NULL) {
      nhwc_to_planes(img, c, plane, planes);
      img = planes;
    }
#if defined(PS_IMAGE_LUT32)
    if (lut32 && !sm.color) {
      sample_lut32(img, c, h, oy, ox, arrange[flip != 0], vflip, tables, so, ahead);
      if (sm.cut_y1 > sm.cut_y0)
        cutout(sm.cut_y0, sm.cut_y1, sm.cut_x0, sm.cut_x1, c, h, w, out_dtype, so);
      continue;
    }
#endif
#if defined(PS_IMAGE_ROW_AVX512)
    if (read_layout == PS_IMAGE_NCHW && w <= 16 * PS_ROW_CHUNKS && !sm.color) {
      sample_dispatch(img, c, h, w, oy, ox, flip, vflip, sc, bi, out_dtype, so, ahead);
      if (sm.cut_y1 > sm.cut_y0)
        cutout(sm.cut_y0, sm.cut_y1, sm.cut_x0, sm.cut_x1, c, h, w, out_dtype, so);
      continue;
    }
#endif
    if (ahead != NULL) {
      for (int64_t b = 0; b < img_bytes; b += 64) __builtin_prefetch(ahead + b, 0, 3);
    }
    float color[256];
    if (sm.color) {
      if (sm.ct != 1.0f) {
        const uint64_t sum = window_grey_sum(img, read_layout, c, h, w, oy, ox);
        sm.cs = ps_image_contrast_shift(sm.ct, ps_image_grey_mean(sum, c, h, w));
      }
      for (uint32_t v = 0; v < 256; v++) color[v] = ps_image_color(v, sm.ct, sm.cs, sm.br);
    }
    if (sm.mix) {
      for (int32_t ch = 0; ch < 3; ch++) {
        gather_plane(img, read_layout, c, h, w, ch, oy, ox, flip, vflip, t + ch * plane);
      }
      planes_mix(t, plane, color, &sm, sc, bi, out_dtype, so);
      if (sm.cut_y1 > sm.cut_y0)
        cutout(sm.cut_y0, sm.cut_y1, sm.cut_x0, sm.cut_x1, c, h, w, out_dtype, so);
      continue;
    }
    for (int32_t ch = 0; ch < c; ch++) {
      gather_plane(img, read_layout, c, h, w, ch, oy, ox, flip, vflip, t);
      int64_t o = (i * c + ch) * plane;
      if (sm.color) {
        char *po = so + (int64_t)ch * plane * (out_dtype == PS_IMAGE_F16 ? 2 : 4);
        plane_color(t, plane, color, sc[ch], bi[ch], out_dtype, po);
      } else if (out_dtype == PS_IMAGE_F16) {
        plane_to_f16(t, plane, sc[ch], bi[ch], (half *)out + o);
      } else {
        plane_to_f32(t, plane, sc[ch], bi[ch], (float *)out + o);
      }
    }
    if (sm.cut_y1 > sm.cut_y0)
      cutout(sm.cut_y0, sm.cut_y1, sm.cut_x0, sm.cut_x1, c, h, w, out_dtype, so);
  }
  if (t != stack_buf) free(t);
}

PS_API int ps_image_augment(const void *src, const int32_t *indices, int64_t rows, int32_t layout,
                            int32_t n, int32_t c, int32_t h, int32_t w, int32_t pad,
                            const void *params, const float *scale, const float *bias, void *out,
                            int32_t out_dtype, int32_t flags, void *stream) {
  (void)stream; /* the cpu backend is synchronous */
  TRY(ps_check_image_augment(layout, n, c, h, w, pad, out_dtype, flags));
  if (n == 0) return PS_OK;
  TRY(ps_check_image_buffers(src, indices, rows, out, scale, bias));
  const int64_t plane = (int64_t)h * w, img_bytes = plane * c;
  const int64_t src_images = indices != NULL ? rows : n;
  /* Catches stale or short device buffers here, where CUDA would fault mid-kernel (the
   * product overflows only past 2^63 bytes: rows of at most 2^24 * 16 bytes). */
  if ((indices != NULL &&
       (rows > INT64_MAX / img_bytes || !ps_is_live_range(indices, (uint64_t)n * 4u))) ||
      !ps_is_live_range(src, (uint64_t)(src_images * img_bytes)) ||
      !ps_is_live_range(out, (uint64_t)(n * img_bytes) * (out_dtype == PS_IMAGE_F16 ? 2u : 4u)) ||
      (params != NULL && !ps_is_live_range(params, (uint64_t)n * 4u * PS_IMAGE_PARAMS))) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_image_augment: src, indices, params or out is not a live buffer of the batch's "
            "size (n=%d c=%d h=%d w=%d, src images %lld)",
            n, c, h, w, (long long)src_images);
  }
  if (indices != NULL) TRY(ps_check_row_indices("ps_image_augment", indices, n, rows));
  augment_ctx k = {.src = src,
                   .indices = indices,
                   .params = params,
                   .out = out,
                   .layout = layout,
                   .c = c,
                   .h = h,
                   .w = w,
                   .pad = pad,
                   .out_dtype = out_dtype,
                   .contrast = !(flags & PS_IMAGE_NO_CONTRAST)};
  memcpy(k.scale, scale, sizeof(float) * (size_t)c);
  memcpy(k.bias, bias, sizeof(float) * (size_t)c);
  /* Split over the pool when a batch has at least 64 KiB of pixels (a CIFAR batch of 128:
   * 384 KiB), about 8 ranges per thread so a late helper holds little, unless the caller says
   * the other cores are busy (PS_IMAGE_SERIAL: the prefetcher, when the loader's workers own
   * them). ps_pool_range_adaptive backs off when a helper keeps this call waiting anyway
   * (threads.c). Measured on 2 cores, the streamed pipeline with 1 worker: 1.22-1.54M
   * samples/s serial against 0.65-0.98M split (the helper took the worker's core); the
   * resident set, no workers: split 1.50-1.86M against 1.09-1.41M serial. */
  static ps_pool_backoff backoff;
  const int64_t ranges = 8 * (int64_t)ps_pool_threads();
  const int64_t grain =
      (flags & PS_IMAGE_SERIAL) || n * img_bytes < 65536 ? n : (n + ranges - 1) / ranges;
  ps_pool_range_adaptive(n, grain, augment_range, &k, &backoff);
  if (atomic_load(&k.failed))
    PS_FAIL(PS_ERR_OUT_OF_MEMORY, "ps_image_augment: no memory for a %lld-byte plane",
            (long long)plane);
  return PS_OK;
}

PS_API int ps_image_augment_labeled(const void *src, const int32_t *indices, int64_t rows,
                                    int32_t layout, int32_t n, int32_t c, int32_t h, int32_t w,
                                    int32_t pad, const void *params, const float *scale,
                                    const float *bias, void *out, int32_t out_dtype, int32_t flags,
                                    const void *labels, int32_t label_bytes, int32_t *labels_out,
                                    void *stream) {
  TRY(ps_check_image_augment(layout, n, c, h, w, pad, out_dtype, flags));
  if (n == 0) return PS_OK;
  TRY(ps_check_augment_labels(labels, label_bytes, labels_out));
  TRY(ps_image_augment(src, indices, rows, layout, n, c, h, w, pad, params, scale, bias, out,
                       out_dtype, flags, stream));
  const int64_t src_labels = indices != NULL ? rows : n;
  if (!ps_is_live_range(labels, (uint64_t)src_labels * (uint64_t)label_bytes) ||
      !ps_is_live_range(labels_out, (uint64_t)n * 4u)) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_image_augment_labeled: labels or labels_out is not a live buffer of the batch's "
            "size (n=%d, src labels %lld)",
            n, (long long)src_labels);
  }
  /* ps_image_augment has checked every index against rows. */
  for (int32_t i = 0; i < n; i++) {
    const int64_t j = indices != NULL ? indices[i] : i;
    labels_out[i] = ps_label_i32(labels, label_bytes, j);
  }
  return PS_OK;
}

PS_API int ps_image_labels_i32(const void *src, int32_t src_bytes, int32_t n, void *out,
                               void *stream) {
  (void)stream;
  TRY(ps_check_image_labels(src_bytes, n));
  if (n == 0) return PS_OK;
  TRY(ps_check_labels_buffers(src, out));
  if (!ps_is_live_range(src, (uint64_t)n * (uint64_t)src_bytes) ||
      !ps_is_live_range(out, (uint64_t)n * 4u)) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_image_labels_i32: src or out is not a live buffer of %d labels", n);
  }
  int32_t *o = (int32_t *)out;
  if (src_bytes == 1) {
    for (int32_t i = 0; i < n; i++) o[i] = ((const uint8_t *)src)[i];
  } else if (src_bytes == 2) {
    for (int32_t i = 0; i < n; i++) o[i] = ((const uint16_t *)src)[i];
  } else {
    memmove(o, src, (size_t)n * 4);
  }
  return PS_OK;
}
