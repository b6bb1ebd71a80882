/*
 * geometry.cu — CUDA backend of ps_image_geometry (crop, resize, rotation; kernels/pinstream.h).
 * kernels/cpu/geometry.c runs Pillow's two passes over tables; here each thread computes one
 * output pixel (all its channels) alone from the same rules (kernels/rules.h): the taps and
 * weights of its row and column, the horizontal sums of the rows it needs rounded to bytes as
 * the first pass would, then the vertical sum. The sums are integers and the weights fp64
 * operations that are never contracted (PS_D*), so the bytes equal the CPU backend's.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "../pinstream.h"
#include "common.cuh"

namespace {

/* Byte k of `v`. */
__device__ __forceinline__ uint32_t byte_of(uint32_t v, int k) { return (v >> (8 * k)) & 255u; }

/* Pixel (y, x) of the sample's box resized to oh x ow, channel k in byte k. An axis whose size
 * does not change reads its input directly: its one tap has weight one (the rule's weights
 * are exactly 2^22 and 0 there), so the bytes are the same. */
__device__ uint32_t resized(const uint8_t *__restrict__ img, int32_t row, int32_t c,
                            const ps_geo_sample &s, int32_t y, int32_t x) {
  const bool same_y = s.ay.in == s.ay.out, same_x = s.ax.in == s.ax.out;
  ps_geo_taps ty, tx;
  if (same_y) {
    ty.lo = y;
    ty.n = 1;
  } else {
    ps_geo_taps_at(&s.ay, y, &ty);
  }
  if (same_x) {
    tx.lo = x;
    tx.n = 1;
  } else {
    ps_geo_taps_at(&s.ax, x, &tx);
  }
  const uint8_t *base = img + (s.ay.start + ty.lo) * row + (s.ax.start + tx.lo) * c;
  int32_t v0 = PS_GEO_HALF, v1 = PS_GEO_HALF, v2 = PS_GEO_HALF, v3 = PS_GEO_HALF;
  for (int32_t j = 0; j < ty.n; j++) {
    const uint8_t *p = base + j * row;
    uint32_t b0, b1 = 0, b2 = 0, b3 = 0;
    if (same_x) {
      b0 = __ldg(p);
      if (c > 1) b1 = __ldg(p + 1);
      if (c > 2) b2 = __ldg(p + 2);
      if (c > 3) b3 = __ldg(p + 3);
    } else {
      int32_t h0 = PS_GEO_HALF, h1 = PS_GEO_HALF, h2 = PS_GEO_HALF, h3 = PS_GEO_HALF;
      for (int32_t i = 0; i < tx.n; i++) {
        const int32_t w = ps_geo_weight(&s.ax, &tx, i);
        const uint8_t *q = p + i * c;
        h0 += (int32_t)__ldg(q) * w;
        if (c > 1) h1 += (int32_t)__ldg(q + 1) * w;
        if (c > 2) h2 += (int32_t)__ldg(q + 2) * w;
        if (c > 3) h3 += (int32_t)__ldg(q + 3) * w;
      }
      b0 = ps_geo_byte(h0);
      b1 = ps_geo_byte(h1);
      b2 = ps_geo_byte(h2);
      b3 = ps_geo_byte(h3);
    }
    if (same_y) return b0 | b1 << 8 | b2 << 16 | b3 << 24;
    const int32_t w = ps_geo_weight(&s.ay, &ty, j);
    v0 += (int32_t)b0 * w;
    v1 += (int32_t)b1 * w;
    v2 += (int32_t)b2 * w;
    v3 += (int32_t)b3 * w;
  }
  return ps_geo_byte(v0) | ps_geo_byte(v1) << 8 | ps_geo_byte(v2) << 16 | ps_geo_byte(v3) << 24;
}

/* blockIdx.y walks the samples (every thread of a block reads the same record) and
 * blockIdx.x/threadIdx.x the output pixels: neighbouring threads read neighbouring source
 * pixels. 32-bit index math: oh * ow <= 2^28. */
__global__ void geometry_kernel(const uint8_t *__restrict__ src, int64_t stride,
                                const int32_t *__restrict__ params, uint8_t *__restrict__ out,
                                int32_t n, int32_t c, int32_t oh, int32_t ow, int32_t antialias,
                                uint32_t fill) {
  const int32_t plane = oh * ow;
  for (uint32_t s = blockIdx.y; s < (uint32_t)n; s += gridDim.y) {
    const int32_t *q = params + (int64_t)PS_IMAGE_GEOMETRY_PARAMS * s;
    ps_geo_record r;
    r.h = __ldg(q + 0);
    r.w = __ldg(q + 1);
    r.top = __ldg(q + 2);
    r.left = __ldg(q + 3);
    r.crop_h = __ldg(q + 4);
    r.crop_w = __ldg(q + 5);
    r.cos = __ldg(q + 6);
    r.sin = __ldg(q + 7);
    /* A record outside its slot: the sample is skipped (the kernel cannot fail), the same
     * for the whole block. */
    if (!ps_geo_record_ok(r, stride, c)) continue;
    ps_geo_sample sm;
    ps_geo_sample_init(r, oh, ow, antialias, &sm);
    const uint8_t *img = src + (int64_t)s * stride;
    uint8_t *o = out + (int64_t)s * plane * c;
    const int32_t row = r.w * c;
    for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < plane;
         i += gridDim.x * blockDim.x) {
      const int32_t y = i / ow, x = i - y * ow;
      uint32_t px;
      ps_geo_rot rt;
      if (!sm.rotate) {
        px = resized(img, row, c, sm, y, x);
      } else if (!ps_geo_rotate_at(sm.cs, sm.sn, oh, ow, y, x, &rt)) {
        px = fill;
      } else {
        const uint32_t a = resized(img, row, c, sm, rt.y0, rt.x0);
        const uint32_t b = resized(img, row, c, sm, rt.y0, rt.x1);
        const uint32_t cc = rt.has_y1 ? resized(img, row, c, sm, rt.y1, rt.x0) : a;
        const uint32_t d = rt.has_y1 ? resized(img, row, c, sm, rt.y1, rt.x1) : b;
        px = 0;
        for (int k = 0; k < PS_IMAGE_GEOMETRY_MAX_CHANNELS; k++) {
          px |= ps_geo_blend(&rt, byte_of(a, k), byte_of(b, k), byte_of(cc, k), byte_of(d, k))
                << (8 * k);
        }
      }
      uint8_t *po = o + i * c;
      po[0] = (uint8_t)px;
      if (c > 1) po[1] = (uint8_t)(px >> 8);
      if (c > 2) po[2] = (uint8_t)(px >> 16);
      if (c > 3) po[3] = (uint8_t)(px >> 24);
    }
  }
}

}  // namespace

extern "C" {

PS_API int ps_image_geometry(const void *src, int64_t src_stride, int32_t n, int32_t c,
                             const int32_t *params, int32_t oh, int32_t ow, int32_t fill, void *out,
                             int32_t flags, void *stream) {
  TRY(ps_check_image_geometry(src_stride, n, c, oh, ow, flags));
  if (n == 0) return PS_OK;
  if (src == nullptr || params == nullptr || out == nullptr) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_geometry: null src, params or out");
  }
  const int64_t plane = (int64_t)oh * ow;
  const int block = 256;
  const dim3 grid(
      (unsigned)((plane + block - 1) / block < 1024 ? (plane + block - 1) / block : 1024),
      (unsigned)(n < 65535 ? n : 65535));
  PS_LAUNCH(geometry_kernel, grid, block, 0, (cudaStream_t)stream, (const uint8_t *)src, src_stride,
            params, (uint8_t *)out, n, c, oh, ow, (flags & PS_IMAGE_ANTIALIAS) != 0,
            (uint32_t)fill);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"
