/*
 * image.cu — CUDA backend of the PS-SECTION image kernels. kernels/cpu/image.c is the
 * reference: for the same inputs both give the same bits.
 *
 * Numerics: ps_image_value, ps_image_color and ps_image_normalize (kernels/rules.h): float(v)
 * is exact for a byte; then __fmul_rn and __fadd_rn, fp32 roundings that nvcc never contracts
 * into an FMA (a plain `v * s + b` would be fused by default, -fmad=true, and differ from the
 * CPU in the last bit); __float2half_rn rounds to nearest even like the CPU's vcvtps2ph /
 * _Float16 cast.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../pinstream.h"
#include "common.cuh"

namespace {

/* scale/bias travel by value in the kernel parameters (constant bank): no device buffer,
 * no upload, nothing to free. The parameter is __grid_constant__ so that indexing it by a
 * runtime channel reads the bank in place instead of copying the struct to local memory. */
struct Affine {
  float scale[PS_IMAGE_MAX_CHANNELS];
  float bias[PS_IMAGE_MAX_CHANNELS];
};

/* Pixels per thread: one 16-byte store of fp16, two of fp32. */
constexpr int kPix = 8;

/* 16 bytes, the widest store of one thread. */
struct __align__(16) Pack16 {
  uint32_t a, b, c, d;
};

__device__ __forceinline__ uint32_t bits(__half lo, __half hi) {
  return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

/* The kPix results of one thread, stored at o[0..kPix). Wide: 16-byte aligned and all kPix in
 * the plane, vector stores; otherwise one element at a time, those below `left` only. */
template <bool Wide>
__device__ __forceinline__ void store8(__half *o, int32_t left, float r0, float r1, float r2,
                                       float r3, float r4, float r5, float r6, float r7) {
  const __half h0 = __float2half_rn(r0), h1 = __float2half_rn(r1), h2 = __float2half_rn(r2),
               h3 = __float2half_rn(r3), h4 = __float2half_rn(r4), h5 = __float2half_rn(r5),
               h6 = __float2half_rn(r6), h7 = __float2half_rn(r7);
  if (Wide) {
    Pack16 p;
    p.a = bits(h0, h1);
    p.b = bits(h2, h3);
    p.c = bits(h4, h5);
    p.d = bits(h6, h7);
    *(Pack16 *)o = p;
  } else {
    if (left > 0) o[0] = h0;
    if (left > 1) o[1] = h1;
    if (left > 2) o[2] = h2;
    if (left > 3) o[3] = h3;
    if (left > 4) o[4] = h4;
    if (left > 5) o[5] = h5;
    if (left > 6) o[6] = h6;
    if (left > 7) o[7] = h7;
  }
}

template <bool Wide>
__device__ __forceinline__ void store8(float *o, int32_t left, float r0, float r1, float r2,
                                       float r3, float r4, float r5, float r6, float r7) {
  if (Wide) {
    Pack16 p, q;
    p.a = __float_as_uint(r0);
    p.b = __float_as_uint(r1);
    p.c = __float_as_uint(r2);
    p.d = __float_as_uint(r3);
    q.a = __float_as_uint(r4);
    q.b = __float_as_uint(r5);
    q.c = __float_as_uint(r6);
    q.d = __float_as_uint(r7);
    ((Pack16 *)o)[0] = p;
    ((Pack16 *)o)[1] = q;
  } else {
    if (left > 0) o[0] = r0;
    if (left > 1) o[1] = r1;
    if (left > 2) o[2] = r2;
    if (left > 3) o[3] = r3;
    if (left > 4) o[4] = r4;
    if (left > 5) o[5] = r5;
    if (left > 6) o[6] = r6;
    if (left > 7) o[7] = r7;
  }
}

/* One sample's view of the launch: what every output pixel of the sample needs. */
struct Plane {
  const uint8_t *img;  /* channel `ch` of the source image: pixel (y, x) at img[(y*w + x)*step] */
  const uint8_t *base; /* channel 0 of the source image; channel k at base + k * cstep */
  int32_t step, cstep, h, w, ch;
  float scale, bias;
};

/* Channel p.ch of output pixel (y, x) of a sample whose colour steps mix its three channels
 * (saturation, hue): the pixel's three bytes through the colour steps and ps_image_mix. The
 * other two channels are computed and dropped: the block's threads for those channels
 * compute them again, reading the same bytes from the cache, not from memory. */
__device__ __forceinline__ float mixed(const Plane &p, const ps_image_sample &sm, int32_t sy,
                                       int32_t sx) {
  uint32_t v0 = 0, v1 = 0, v2 = 0;
  if (sy >= 0 && sy < p.h && sx >= 0 && sx < p.w) {
    const uint8_t *q = p.base + (sy * p.w + sx) * p.step;
    v0 = __ldg(q);
    v1 = __ldg(q + p.cstep);
    v2 = __ldg(q + 2 * p.cstep);
  }
  float r = ps_image_color(v0, sm.ct, sm.cs, sm.br), g = ps_image_color(v1, sm.ct, sm.cs, sm.br),
        b = ps_image_color(v2, sm.ct, sm.cs, sm.br);
  ps_image_mix(&sm, &r, &g, &b);
  return ps_image_normalize(p.ch == 0 ? r : p.ch == 1 ? g : b, p.scale, p.bias);
}

/* Output pixel (y, x) of the sample, then (y, x) moves one pixel along the row-major plane. */
__device__ __forceinline__ float pixel(const Plane &p, const ps_image_sample &sm, int32_t &y,
                                       int32_t &x) {
  const int32_t sy = (sm.vflip ? p.h - 1 - y : y) + sm.oy;
  const int32_t sx = (sm.flip ? p.w - 1 - x : x) + sm.ox;
  /* The branches are uniform per sample (the whole block takes the same one) except the
   * cutout's, which splits a row at most twice. */
  float r;
  if (ps_image_cut(&sm, y, x)) {
    r = 0.0f;
  } else if (sm.mix) {
    r = mixed(p, sm, sy, sx);
  } else {
    uint32_t v = 0;
    if (sy >= 0 && sy < p.h && sx >= 0 && sx < p.w) v = __ldg(p.img + (sy * p.w + sx) * p.step);
    r = sm.color ? ps_image_normalize(ps_image_color(v, sm.ct, sm.cs, sm.br), p.scale, p.bias)
                 : ps_image_value(v, p.scale, p.bias);
  }
  if (++x == p.w) {
    x = 0;
    y++;
  }
  return r;
}

/* Threads of a grey_mean_kernel block. */
constexpr int kMeanThreads = 256;

/* The contrast's pre-pass: means[s] = the mean grey of sample s's crop window
 * (ps_image_grey_mean), for each sample whose contrast factor is not 1 (the others are left as
 * they were, and never read). One block per sample, a warp per source row, lanes along it;
 * the sums are integers, so the result does not depend on the order the threads add in. */
template <int Layout>
__global__ void __launch_bounds__(kMeanThreads)
    grey_mean_kernel(const uint8_t *__restrict__ src, const int32_t *__restrict__ indices,
                     int64_t rows, const int32_t *__restrict__ params, int32_t n, int32_t c,
                     int32_t h, int32_t w, int32_t pad, float *__restrict__ means) {
  PS_SHARED(unsigned long long, part, [kMeanThreads / 32]);
  const int32_t plane = h * w;
  const int32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t cstep = Layout == PS_IMAGE_NCHW ? plane : 1;
  const int32_t pstep = Layout == PS_IMAGE_NCHW ? 1 : c;
  for (uint32_t s = blockIdx.x; s < (uint32_t)n; s += gridDim.x) {
    /* Both skips depend on s alone: the whole block takes them, and no thread waits at a
     * barrier another skipped. */
    const int32_t *q = params + (int64_t)PS_IMAGE_PARAMS * s;
    if (ps_f32_from_bits(__ldg(q + 8)) == 1.0f) continue;
    int64_t j = s;
    if (indices != nullptr) {
      j = __ldg(indices + s);
      if (j < 0 || j >= rows) continue;
    }
    int32_t y0, y1, x0, x1;
    ps_image_window(ps_image_offset(__ldg(q + 0), pad, h), h, &y0, &y1);
    ps_image_window(ps_image_offset(__ldg(q + 1), pad, w), w, &x0, &x1);
    const uint8_t *img = src + j * (int64_t)(c * plane);
    unsigned long long sum = 0;
    for (int32_t y = y0 + warp; y < y1; y += kMeanThreads / 32) {
      const uint8_t *row = img + y * w * pstep;
      if (c == 3) {
        for (int32_t x = x0 + lane; x < x1; x += 32) {
          const uint8_t *px = row + x * pstep;
          sum += ps_image_grey_weighted(__ldg(px), __ldg(px + cstep), __ldg(px + 2 * cstep));
        }
      } else {
        for (int32_t ch = 0; ch < c; ch++) {
          for (int32_t x = x0 + lane; x < x1; x += 32) sum += __ldg(row + ch * cstep + x * pstep);
        }
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) part[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long total = 0;
      for (int k = 0; k < kMeanThreads / 32; k++) total += part[k];
      means[s] = ps_image_grey_mean(total, c, h, w);
    }
    /* part is written again for the block's next sample. */
    __syncthreads();
  }
}

/* blockIdx.y walks the samples and blockIdx.x/threadIdx.x the groups of kPix consecutive
 * pixels of the sample's channel planes: every thread of a block reads the same sample's record
 * (one cached load per word), and the index math is 32-bit, two divisions per group.
 * Neighbouring threads write neighbouring 16-byte pieces, so the stores coalesce. */
template <typename Out, int Layout, bool Wide>
__global__ void augment_kernel(const uint8_t *__restrict__ src, const int32_t *__restrict__ indices,
                               int64_t rows, const int32_t *__restrict__ params,
                               const __grid_constant__ Affine aff, Out *__restrict__ out, int32_t n,
                               int32_t c, int32_t h, int32_t w, int32_t pad,
                               const float *__restrict__ means, const void *__restrict__ labels,
                               int32_t label_bytes, int32_t *__restrict__ labels_out) {
  /* plane <= 2^24 and c <= 16 (ps_check_image_augment): an image's c * plane bytes and the
   * group indices below (grid.x <= 1024 blocks of 256 past the last group) fit int32. */
  const int32_t plane = h * w;
  const int32_t groups = (plane + kPix - 1) / kPix, total = c * groups;
  /* unsigned: s + gridDim.y stays below 2^32 for any s < n <= INT32_MAX. */
  for (uint32_t s = blockIdx.y; s < (uint32_t)n; s += gridDim.y) {
    ps_image_record rec = ps_image_record_plain(pad);
    if (params != nullptr) {
      const int32_t *q = params + (int64_t)PS_IMAGE_PARAMS * s;
      rec.dy = __ldg(q + 0);
      rec.dx = __ldg(q + 1);
      rec.flip = __ldg(q + 2);
      rec.vflip = __ldg(q + 3);
      rec.cut_fy = __ldg(q + 4);
      rec.cut_fx = __ldg(q + 5);
      rec.cut_size = __ldg(q + 6);
      rec.br_bits = __ldg(q + 7);
      /* Without the pre-pass's means (PS_IMAGE_NO_CONTRAST) the contrast word is read as 1. */
      if (means != nullptr) rec.ct_bits = __ldg(q + 8);
      rec.sat_bits = __ldg(q + 9);
      rec.hue_bits = __ldg(q + 10);
    }
    ps_image_sample sm;
    ps_image_record_decode(rec, pad, c, h, w, &sm);
    /* The pre-pass wrote the mean of every sample with ct != 1 (never without params). */
    if (sm.ct != 1.0f) sm.cs = ps_image_contrast_shift(sm.ct, __ldg(means + s));
    /* A gathered sample whose index is outside the set is skipped (ps_gather_rows' rule):
     * the same value for the whole block, so no thread waits at a barrier it skips. */
    int64_t j = s;
    if (indices != nullptr) {
      j = __ldg(indices + s);
      if (j < 0 || j >= rows) continue;
    }
    /* The sample's label, by one thread of its first block. */
    if (labels_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
      labels_out[s] = ps_label_i32(labels, label_bytes, j);
    }
    const uint8_t *img = src + j * (int64_t)(c * plane);
    Out *os = out + (int64_t)s * (c * plane);
    Plane p;
    p.base = img;
    p.step = Layout == PS_IMAGE_NCHW ? 1 : c;
    p.cstep = Layout == PS_IMAGE_NCHW ? plane : 1;
    p.h = h;
    p.w = w;
    for (int32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < total;
         g += gridDim.x * blockDim.x) {
      const int32_t ch = g / groups;
      const int32_t i = (g - ch * groups) * kPix;
      p.img = Layout == PS_IMAGE_NCHW ? img + ch * plane : img + ch;
      p.ch = ch;
      p.scale = aff.scale[ch];
      p.bias = aff.bias[ch];
      int32_t y = i / w, x = i - y * w;
      /* Past the plane's end (a partial last group, never with Wide) the pixels are computed,
       * with any read still inside the image, and not stored. */
      const float r0 = pixel(p, sm, y, x), r1 = pixel(p, sm, y, x), r2 = pixel(p, sm, y, x),
                  r3 = pixel(p, sm, y, x), r4 = pixel(p, sm, y, x), r5 = pixel(p, sm, y, x),
                  r6 = pixel(p, sm, y, x), r7 = pixel(p, sm, y, x);
      store8<Wide>(os + ch * plane + i, plane - i, r0, r1, r2, r3, r4, r5, r6, r7);
    }
  }
}

/* The index is 64-bit: n goes up to INT32_MAX, and an int32 i within one stride (65535 x
 * 256) of it would wrap negative on the last step instead of ending the loop. */
template <typename In>
__global__ void labels_kernel(const In *__restrict__ src, int32_t n, int32_t *__restrict__ out) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = (int32_t)src[i];
  }
}

int grid_for(int64_t total, int block) {
  int64_t g = (total + block - 1) / block;
  /* Grid-stride beyond this: enough blocks to fill any current GPU many times over. */
  return (int)(g < 65535 ? (g > 0 ? g : 1) : 65535);
}

template <typename Out, int Layout>
void launch_layout(const uint8_t *src, const int32_t *indices, int64_t rows, const int32_t *params,
                   const Affine &aff, Out *out, int32_t n, int32_t c, int32_t h, int32_t w,
                   int32_t pad, const float *means, const void *labels, int32_t label_bytes,
                   int32_t *labels_out, cudaStream_t st) {
  /* A sample's groups, in blocks of at most 256 threads: a small image (CIFAR: 3 x 128
   * groups) fills whole warps without idle halves of a block. */
  const int64_t groups = c * (((int64_t)h * w + kPix - 1) / kPix);
  const int block = groups >= 256 ? 256 : (int)((groups + 31) / 32 * 32);
  const dim3 grid(
      (unsigned)((groups + block - 1) / block < 1024 ? (groups + block - 1) / block : 1024),
      (unsigned)(n < 65535 ? n : 65535));
  /* Every plane starts on a 16-byte boundary when the plane holds whole groups and out is
   * aligned: the vector stores need both. */
  const bool wide = ((int64_t)h * w) % kPix == 0 && ((uintptr_t)out & 15) == 0;
  if (wide) {
    PS_LAUNCH((augment_kernel<Out, Layout, true>), grid, block, 0, st, src, indices, rows, params,
              aff, out, n, c, h, w, pad, means, labels, label_bytes, labels_out);
  } else {
    PS_LAUNCH((augment_kernel<Out, Layout, false>), grid, block, 0, st, src, indices, rows, params,
              aff, out, n, c, h, w, pad, means, labels, label_bytes, labels_out);
  }
}

template <typename Out>
void launch_augment(const uint8_t *src, const int32_t *indices, int64_t rows, int32_t layout,
                    const int32_t *params, const Affine &aff, Out *out, int32_t n, int32_t c,
                    int32_t h, int32_t w, int32_t pad, const float *means, const void *labels,
                    int32_t label_bytes, int32_t *labels_out, cudaStream_t st) {
  if (layout == PS_IMAGE_NCHW) {
    launch_layout<Out, PS_IMAGE_NCHW>(src, indices, rows, params, aff, out, n, c, h, w, pad, means,
                                      labels, label_bytes, labels_out, st);
  } else {
    launch_layout<Out, PS_IMAGE_NHWC>(src, indices, rows, params, aff, out, n, c, h, w, pad, means,
                                      labels, label_bytes, labels_out, st);
  }
}

/* Queues the contrast's pre-pass (grey_mean_kernel) of a batch with records into `means`. */
void launch_means(const uint8_t *src, const int32_t *indices, int64_t rows, int32_t layout,
                  const int32_t *params, int32_t n, int32_t c, int32_t h, int32_t w, int32_t pad,
                  float *means, cudaStream_t st) {
  const unsigned grid = (unsigned)(n < 65535 ? n : 65535);
  if (layout == PS_IMAGE_NCHW) {
    PS_LAUNCH(grey_mean_kernel<PS_IMAGE_NCHW>, grid, kMeanThreads, 0, st, src, indices, rows,
              params, n, c, h, w, pad, means);
  } else {
    PS_LAUNCH(grey_mean_kernel<PS_IMAGE_NHWC>, grid, kMeanThreads, 0, st, src, indices, rows,
              params, n, c, h, w, pad, means);
  }
}

int augment(const void *src, const int32_t *indices, int64_t rows, int32_t layout, int32_t n,
            int32_t c, int32_t h, int32_t w, int32_t pad, const void *params, const float *scale,
            const float *bias, void *out, int32_t out_dtype, int32_t flags, const void *labels,
            int32_t label_bytes, int32_t *labels_out, void *stream) {
  TRY(ps_check_image_buffers(src, indices, rows, out, scale, bias));
  Affine aff;
  for (int32_t i = 0; i < PS_IMAGE_MAX_CHANNELS; i++) {
    aff.scale[i] = i < c ? scale[i] : 0.0f;
    aff.bias[i] = i < c ? bias[i] : 0.0f;
  }
  cudaStream_t st = (cudaStream_t)stream;
  const uint8_t *s8 = (const uint8_t *)src;
  const int32_t *prm = (const int32_t *)params;
  /* The samples' mean greys (only with records whose contrast counts: without, no sample has
   * contrast) live for this call only, in stream order like the split-K partial sums of the
   * GEMM. */
  float *means = nullptr;
  if (prm != nullptr && !(flags & PS_IMAGE_NO_CONTRAST)) {
    TRY(ps_scratch_alloc((void **)&means, (size_t)n * sizeof(float), st));
    launch_means(s8, indices, rows, layout, prm, n, c, h, w, pad, means, st);
  }
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    if (out_dtype == PS_IMAGE_F16) {
      launch_augment(s8, indices, rows, layout, prm, aff, (__half *)out, n, c, h, w, pad, means,
                     labels, label_bytes, labels_out, st);
    } else {
      launch_augment(s8, indices, rows, layout, prm, aff, (float *)out, n, c, h, w, pad, means,
                     labels, label_bytes, labels_out, st);
    }
    e = cudaGetLastError();
  }
  int r = e == cudaSuccess ? PS_OK
                           : ps_record_cuda_error(e, "augment_kernel<<<>>>", __FILE__, __LINE__);
  if (means != nullptr) {
    const int fr = ps_scratch_free(means, st);
    if (r == PS_OK) r = fr;
  }
  return r;
}

}  // namespace

extern "C" {

PS_API int ps_image_augment(const void *src, const int32_t *indices, int64_t rows, int32_t layout,
                            int32_t n, int32_t c, int32_t h, int32_t w, int32_t pad,
                            const void *params, const float *scale, const float *bias, void *out,
                            int32_t out_dtype, int32_t flags, void *stream) {
  TRY(ps_check_image_augment(layout, n, c, h, w, pad, out_dtype, flags));
  if (n == 0) return PS_OK;
  return augment(src, indices, rows, layout, n, c, h, w, pad, params, scale, bias, out, out_dtype,
                 flags, nullptr, 4, nullptr, stream);
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
  return augment(src, indices, rows, layout, n, c, h, w, pad, params, scale, bias, out, out_dtype,
                 flags, labels, label_bytes, labels_out, stream);
}

PS_API int ps_image_labels_i32(const void *src, int32_t src_bytes, int32_t n, void *out,
                               void *stream) {
  TRY(ps_check_image_labels(src_bytes, n));
  if (n == 0) return PS_OK;
  TRY(ps_check_labels_buffers(src, out));
  cudaStream_t st = (cudaStream_t)stream;
  if (src_bytes == 4) {
    /* memmove, as on the cpu backend: src and out may overlap. */
    return ps_copy_d2d(out, src, (size_t)n * 4, st);
  }
  const int block = 256, grid = grid_for(n, block);
  if (src_bytes == 1) {
    PS_LAUNCH(labels_kernel, grid, block, 0, st, (const uint8_t *)src, n, (int32_t *)out);
  } else {
    PS_LAUNCH(labels_kernel, grid, block, 0, st, (const uint16_t *)src, n, (int32_t *)out);
  }
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // extern "C"
