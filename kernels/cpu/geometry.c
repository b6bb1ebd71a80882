/*
 * geometry.c — CPU backend of ps_image_geometry (crop, resize, rotation; kernels/pinstream.h):
 * per sample Pillow's two passes over tables of taps (ps_geo_taps_at, ps_geo_weight), then the
 * rotation (ps_geo_rotate_at, ps_geo_blend). kernels/cuda/geometry.cu computes each output
 * pixel alone from the same rules; the sums are integers, so the bytes are the same.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../pinstream.h"
#include "common.h"
#include "threads.h"

/* One axis's taps for every output position: starts, counts and `width` weights each. */
typedef struct {
  int32_t *lo, *n, *w;
  int32_t width;
} taps_table;

/* NULL arrays when out of memory. The widest tap count bounds every position's. */
static int taps_build(const ps_geo_axis *a, taps_table *t) {
  int32_t width = 1;
  ps_geo_taps tp;
  for (int32_t x = 0; x < a->out; x++) {
    ps_geo_taps_at(a, x, &tp);
    if (tp.n > width) width = tp.n;
  }
  t->width = width;
  t->lo = (int32_t *)malloc(sizeof(int32_t) * (size_t)a->out * (size_t)(2 + width));
  if (t->lo == NULL) return 0;
  t->n = t->lo + a->out;
  t->w = t->n + a->out;
  for (int32_t x = 0; x < a->out; x++) {
    ps_geo_taps_at(a, x, &tp);
    t->lo[x] = tp.lo;
    t->n[x] = tp.n;
    for (int32_t i = 0; i < tp.n; i++) t->w[(int64_t)x * width + i] = ps_geo_weight(a, &tp, i);
  }
  return 1;
}

typedef struct {
  const uint8_t *src;
  int64_t stride;
  const int32_t *params;
  uint8_t *out;
  int32_t c, oh, ow, antialias;
  uint32_t fill;
  atomic_int failed; /* 1: no memory */
} geo_ctx;

/* The box of image `img` (rows of row_bytes) resized to a->out x b->out into `dst`. */
static int resize_sample(const uint8_t *img, int32_t row_bytes, int32_t c, const ps_geo_axis *ay,
                         const ps_geo_axis *ax, uint8_t *dst) {
  const int32_t oh = ay->out, ow = ax->out, box_h = ay->in;
  /* The horizontal pass: the box's rows at ow columns (or the box itself, same size). */
  const uint8_t *mid = img + (int64_t)ay->start * row_bytes + (int64_t)ax->start * c;
  int32_t mid_row = row_bytes;
  uint8_t *tmp = NULL;
  if (ax->in != ax->out) {
    taps_table tx;
    if (!taps_build(ax, &tx)) return 0;
    uint8_t *m = ay->in == ay->out ? dst : (tmp = (uint8_t *)malloc((size_t)box_h * ow * c));
    if (m == NULL) {
      free(tx.lo);
      return 0;
    }
    for (int32_t y = 0; y < box_h; y++) {
      const uint8_t *row = mid + (int64_t)y * row_bytes;
      uint8_t *o = m + (int64_t)y * ow * c;
      for (int32_t x = 0; x < ow; x++) {
        const int32_t *w = tx.w + (int64_t)x * tx.width, n = tx.n[x];
        const uint8_t *p = row + (int64_t)tx.lo[x] * c;
        if (c == 3) {
          /* RGB, the common case: the three sums side by side. */
          int32_t r = PS_GEO_HALF, g = PS_GEO_HALF, b = PS_GEO_HALF;
          for (int32_t i = 0; i < n; i++, p += 3) {
            r += (int32_t)p[0] * w[i];
            g += (int32_t)p[1] * w[i];
            b += (int32_t)p[2] * w[i];
          }
          o[x * 3] = (uint8_t)ps_geo_byte(r);
          o[x * 3 + 1] = (uint8_t)ps_geo_byte(g);
          o[x * 3 + 2] = (uint8_t)ps_geo_byte(b);
          continue;
        }
        for (int32_t ch = 0; ch < c; ch++) {
          int32_t acc = PS_GEO_HALF;
          for (int32_t i = 0; i < n; i++) acc += (int32_t)p[i * c + ch] * w[i];
          o[x * c + ch] = (uint8_t)ps_geo_byte(acc);
        }
      }
    }
    free(tx.lo);
    if (m == dst) return 1;
    mid = m;
    mid_row = ow * c;
  }
  if (ay->in == ay->out) {
    for (int32_t y = 0; y < oh; y++)
      memcpy(dst + (int64_t)y * ow * c, mid + (int64_t)y * mid_row, (size_t)ow * c);
    free(tmp);
    return 1;
  }
  taps_table ty;
  if (!taps_build(ay, &ty)) {
    free(tmp);
    return 0;
  }
  const int32_t len = ow * c;
  for (int32_t y = 0; y < oh; y++) {
    const int32_t *w = ty.w + (int64_t)y * ty.width, n = ty.n[y];
    const uint8_t *base = mid + (int64_t)ty.lo[y] * mid_row;
    uint8_t *o = dst + (int64_t)y * len;
    for (int32_t x = 0; x < len; x++) {
      int32_t acc = PS_GEO_HALF;
      for (int32_t i = 0; i < n; i++) acc += (int32_t)base[(int64_t)i * mid_row + x] * w[i];
      o[x] = (uint8_t)ps_geo_byte(acc);
    }
  }
  free(ty.lo);
  free(tmp);
  return 1;
}

static void rotate_sample(const uint8_t *img, const ps_geo_sample *s, int32_t oh, int32_t ow,
                          int32_t c, uint32_t fill, uint8_t *dst) {
  const int32_t row = ow * c;
  for (int32_t y = 0; y < oh; y++) {
    for (int32_t x = 0; x < ow; x++) {
      uint8_t *o = dst + (int64_t)y * row + x * c;
      ps_geo_rot r;
      if (!ps_geo_rotate_at(s->cs, s->sn, oh, ow, y, x, &r)) {
        for (int32_t ch = 0; ch < c; ch++) o[ch] = (uint8_t)(fill >> (8 * ch));
        continue;
      }
      const uint8_t *a = img + r.y0 * row, *b = img + r.y1 * row;
      for (int32_t ch = 0; ch < c; ch++) {
        o[ch] = (uint8_t)ps_geo_blend(&r, a[r.x0 * c + ch], a[r.x1 * c + ch], b[r.x0 * c + ch],
                                      b[r.x1 * c + ch]);
      }
    }
  }
}

static void geometry_range(void *ctx, int64_t i0, int64_t i1) {
  geo_ctx *k = (geo_ctx *)ctx;
  const int32_t c = k->c, oh = k->oh, ow = k->ow;
  const int64_t out_bytes = (int64_t)oh * ow * c;
  uint8_t *rotated = NULL;
  int ok = 1;
  for (int64_t i = i0; i < i1 && ok; i++) {
    const int32_t *q = k->params + PS_IMAGE_GEOMETRY_PARAMS * i;
    const ps_geo_record r = {q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]};
    ps_geo_sample s;
    ps_geo_sample_init(r, oh, ow, k->antialias, &s);
    uint8_t *o = k->out + i * out_bytes;
    if (s.rotate && rotated == NULL && (rotated = (uint8_t *)malloc((size_t)out_bytes)) == NULL) {
      ok = 0;
      break;
    }
    ok = resize_sample(k->src + i * k->stride, r.w * c, c, &s.ay, &s.ax, s.rotate ? rotated : o);
    if (ok && s.rotate) rotate_sample(rotated, &s, oh, ow, c, k->fill, o);
  }
  free(rotated);
  if (!ok) atomic_store(&k->failed, 1);
}

PS_API int ps_image_geometry(const void *src, int64_t src_stride, int32_t n, int32_t c,
                             const int32_t *params, int32_t oh, int32_t ow, int32_t fill, void *out,
                             int32_t flags, void *stream) {
  (void)stream; /* the cpu backend is synchronous */
  TRY(ps_check_image_geometry(src_stride, n, c, oh, ow, flags));
  if (n == 0) return PS_OK;
  const int64_t out_bytes = (int64_t)oh * ow * c;
  if (src == NULL || params == NULL || out == NULL || src_stride > INT64_MAX / n ||
      !ps_is_live_range(src, (uint64_t)(src_stride * n)) ||
      !ps_is_live_range(params, (uint64_t)n * 4u * PS_IMAGE_GEOMETRY_PARAMS) ||
      !ps_is_live_range(out, (uint64_t)(out_bytes * n))) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_image_geometry: src, params or out is not a live buffer of the batch's size "
            "(n=%d c=%d out %dx%d src_stride=%lld)",
            n, c, oh, ow, (long long)src_stride);
  }
  for (int32_t i = 0; i < n; i++) {
    const int32_t *q = params + PS_IMAGE_GEOMETRY_PARAMS * (int64_t)i;
    const ps_geo_record r = {q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]};
    if (!ps_geo_record_ok(r, src_stride, c)) {
      PS_FAIL(PS_ERR_INVALID_ARGUMENT,
              "ps_image_geometry: sample %d's record is outside its slot: image %dx%d, box "
              "(%d, %d) %dx%d, %d channels in %lld bytes",
              i, r.h, r.w, r.top, r.left, r.crop_h, r.crop_w, c, (long long)src_stride);
    }
  }
  geo_ctx k = {.src = (const uint8_t *)src,
               .stride = src_stride,
               .params = params,
               .out = (uint8_t *)out,
               .c = c,
               .oh = oh,
               .ow = ow,
               .antialias = (flags & PS_IMAGE_ANTIALIAS) != 0,
               .fill = (uint32_t)fill};
  atomic_init(&k.failed, 0);
  /* A sample per range: resizing one is thousands of multiply-adds per output pixel row. */
  if (flags & PS_IMAGE_SERIAL) {
    geometry_range(&k, 0, n);
  } else {
    ps_pool_range(n, 1, n * out_bytes * 8, geometry_range, &k);
  }
  if (atomic_load(&k.failed))
    PS_FAIL(PS_ERR_OUT_OF_MEMORY, "ps_image_geometry: no memory for a sample's tables");
  return PS_OK;
}
