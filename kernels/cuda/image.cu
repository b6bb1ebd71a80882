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
 * no upload, nothing to free. */
struct Affine {
  float scale[PS_IMAGE_MAX_CHANNELS];
  float bias[PS_IMAGE_MAX_CHANNELS];
};

__device__ __forceinline__ void store(__half *o, int64_t i, float r) { o[i] = __float2half_rn(r); }
__device__ __forceinline__ void store(float *o, int64_t i, float r) { o[i] = r; }

/* blockIdx.y walks the (sample, channel) planes and blockIdx.x/threadIdx.x the pixels of a
 * plane, so the index math is 32-bit (one division by w) and every thread of a block reads
 * the same sample's parameters (one cached load). Consecutive threads write consecutive x:
 * the stores coalesce, and the reads of one source row stay within one or two segments. */
template <typename Out, int Layout>
__global__ void augment_kernel(const uint8_t *__restrict__ src, const int32_t *__restrict__ indices,
                               int64_t rows, const int32_t *__restrict__ params, Affine aff,
                               Out *__restrict__ out, int32_t n, int32_t c, int32_t h, int32_t w,
                               int32_t pad) {
  const int32_t plane = h * w;
  const int64_t planes = (int64_t)n * c;
  for (int64_t pl = blockIdx.y; pl < planes; pl += gridDim.y) {
    const int64_t s = pl / c;
    const int32_t ch = (int32_t)(pl - s * c);
    /* One sample's record, read once per plane (every thread of the block reads the same
     * words: cached loads). */
    int32_t rec[PS_IMAGE_PARAMS];
    if (params != nullptr) {
      for (int k = 0; k < PS_IMAGE_PARAMS; k++) rec[k] = __ldg(params + PS_IMAGE_PARAMS * s + k);
    }
    /* dy - pad can overflow int32: ps_image_offset (in the decode) computes it in 64 bits and
     * clamps it to [-h, h] (resp. [-w, w]), which keeps sy and sx below within int32. */
    ps_image_sample sm;
    ps_image_sample_decode(params != nullptr ? rec : nullptr, pad, h, w, &sm);
    /* A gathered sample whose index is outside the set is skipped (ps_gather_rows' rule):
     * the same value for the whole block, so no thread waits at a barrier it skips. */
    int64_t j = s;
    if (indices != nullptr) {
      j = __ldg(indices + s);
      if (j < 0 || j >= rows) continue;
    }
    const uint8_t *img = src + j * ((int64_t)c * plane);
    const float scale = aff.scale[ch], bias = aff.bias[ch];
    Out *o = out + pl * plane;
    /* int32 is enough: plane <= 2^24 (ps_check_image_augment) and launch_augment's grid.x
     * <= 1024 blocks of 256, so i + the stride stays below 2^25. */
    for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < plane;
         i += gridDim.x * blockDim.x) {
      const int32_t y = i / w, x = i - y * w;
      const int32_t sy = (sm.vflip ? h - 1 - y : y) + sm.oy;
      const int32_t sx = (sm.flip ? w - 1 - x : x) + sm.ox;
      uint32_t v = 0;
      if (sy >= 0 && sy < h && sx >= 0 && sx < w) {
        v = Layout == PS_IMAGE_NCHW ? __ldg(img + (int64_t)ch * plane + sy * w + sx)
                                    : __ldg(img + ((int64_t)sy * w + sx) * c + ch);
      }
      /* The branches are uniform per sample (the whole block takes the same one) except the
       * cutout's, which splits a row at most twice. */
      float r;
      if (ps_image_cut(&sm, y, x)) {
        r = 0.0f;
      } else if (sm.color) {
        r = ps_image_normalize(ps_image_color(v, sm.br, sm.ct, sm.cs), scale, bias);
      } else {
        r = ps_image_value(v, scale, bias);
      }
      store(o, i, r);
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

template <typename Out>
void launch_augment(const uint8_t *src, const int32_t *indices, int64_t rows, int32_t layout,
                    const int32_t *params, const Affine &aff, Out *out, int32_t n, int32_t c,
                    int32_t h, int32_t w, int32_t pad, cudaStream_t st) {
  const int block = 256;
  const int64_t plane = (int64_t)h * w, planes = (int64_t)n * c;
  const dim3 grid(
      (unsigned)((plane + block - 1) / block < 1024 ? (plane + block - 1) / block : 1024),
      (unsigned)(planes < 65535 ? planes : 65535));
  if (layout == PS_IMAGE_NCHW) {
    PS_LAUNCH((augment_kernel<Out, PS_IMAGE_NCHW>), grid, block, 0, st, src, indices, rows, params,
              aff, out, n, c, h, w, pad);
  } else {
    PS_LAUNCH((augment_kernel<Out, PS_IMAGE_NHWC>), grid, block, 0, st, src, indices, rows, params,
              aff, out, n, c, h, w, pad);
  }
}

}  // namespace

extern "C" {

PS_API int ps_image_augment(const void *src, const int32_t *indices, int64_t rows, int32_t layout,
                            int32_t n, int32_t c, int32_t h, int32_t w, int32_t pad,
                            const void *params, const float *scale, const float *bias, void *out,
                            int32_t out_dtype, int32_t flags, void *stream) {
  TRY(ps_check_image_augment(layout, n, c, h, w, pad, out_dtype, flags));
  if (n == 0) return PS_OK;
  TRY(ps_check_image_buffers(src, indices, rows, out, scale, bias));
  Affine aff;
  for (int32_t i = 0; i < PS_IMAGE_MAX_CHANNELS; i++) {
    aff.scale[i] = i < c ? scale[i] : 0.0f;
    aff.bias[i] = i < c ? bias[i] : 0.0f;
  }
  cudaStream_t st = (cudaStream_t)stream;
  const uint8_t *s8 = (const uint8_t *)src;
  const int32_t *prm = (const int32_t *)params;
  if (out_dtype == PS_IMAGE_F16) {
    launch_augment(s8, indices, rows, layout, prm, aff, (__half *)out, n, c, h, w, pad, st);
  } else {
    launch_augment(s8, indices, rows, layout, prm, aff, (float *)out, n, c, h, w, pad, st);
  }
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
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
