/*
 * conv.cu — CUDA backend of the 2-D convolutions (kernels/cpu/conv.c is the CPU twin), as
 * implicit GEMMs over the one GEMM of gemm.cuh (no im2col buffer in device memory):
 *
 *   forward        Y[Co, (n,p)]     = W[Co, K] . col(x)[K, (n,p)]          K = C*kh*kw
 *   backward data  dX[C, (n,iy,ix)] = W'[C, (o,ky,kx)] . dY-gather[(o,ky,kx), (n,iy,ix)]
 *                  (each input pixel gathers the output pixels that read it: no atomics,
 *                  deterministic)
 *   backward wt    dW[Co, K]        = dY[Co, (n,p)] . col(x)^T[(n,p), K], split over (n,p)
 *                  into fp32 partials in a stream-ordered workspace, then reduced in a fixed
 *                  order (deterministic)
 *
 * Results are written by epilogue functors in fp32 or fp16.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "../pinstream.h"
#include "nn.cuh"
#include "gemm.cuh"

namespace {

/* dw[o][kk] (+)= sum_z part[z][o][kk], in a fixed order. */
__global__ void reduce_partials(const float *part, int splits, int64_t mn, void *dw, int f16,
                                int acc) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < mn;
       i += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int z = 0; z < splits; z++) s += part[z * mn + i];
    if (f16) {
      __half *p = (__half *)dw + i;
      *p = __float2half_rn(acc ? __half2float(*p) + s : s);
    } else {
      float *p = (float *)dw + i;
      *p = acc ? *p + s : s;
    }
  }
}

}  // namespace

extern "C" {

PS_API int ps_nn_conv2d_forward(const void *x, const void *w, void *y, int32_t dtype, int64_t n,
                                int64_t c, int64_t h, int64_t w_, int64_t co, int32_t kh,
                                int32_t kw, int32_t stride, int32_t pad, void *stream) {
  CHECK_DTYPE(dtype);
  ConvGeo g{}; /* {}: gcc cannot see that ps_conv_geometry fills it before any use */
  TRY(ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad));
  if (n == 0) return PS_OK;
  NULL_CHECK(x, w, y);
  int64_t K = c * kh * kw, P = g.oh * g.ow;
  int r = PS_OK;
  WITH_ACT(dtype, {
    Strided<T> A{.p = (const T *)w, .rs = K, .cs = 1};
    Im2col<T> B{(const T *)x, g};
    StoreConvY<T> ep{.y = (T *)y, .co = co, .P = P};
    r = gemm(co, n * P, K, 1, A, B, ep, (cudaStream_t)stream);
  });
  return r;
}

PS_API int ps_nn_conv2d_backward_data(const void *dy, const void *w, void *dx, int32_t dtype,
                                      int64_t n, int64_t c, int64_t h, int64_t w_, int64_t co,
                                      int32_t kh, int32_t kw, int32_t stride, int32_t pad,
                                      void *stream) {
  CHECK_DTYPE(dtype);
  ConvGeo g{}; /* {}: gcc cannot see that ps_conv_geometry fills it before any use */
  TRY(ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad));
  if (n == 0) return PS_OK;
  NULL_CHECK(dy, w, dx);
  int r = PS_OK;
  WITH_ACT(dtype, {
    WeightT<T> A{.w = (const T *)w, .g = g};
    DyGather<T> B{.dy = (const T *)dy, .g = g};
    StoreConvDx<T> ep{.dx = (T *)dx, .c = c, .HW = h * w_};
    r = gemm(c, n * h * w_, co * kh * kw, 1, A, B, ep, (cudaStream_t)stream);
  });
  return r;
}

PS_API int ps_nn_conv2d_backward_weight(const void *x, const void *dy, int32_t dtype, void *dw,
                                        int32_t dw_dtype, int64_t n, int64_t c, int64_t h,
                                        int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                        int32_t stride, int32_t pad, int32_t accumulate,
                                        void *stream) {
  CHECK_DTYPE(dtype);
  CHECK_DTYPE(dw_dtype);
  ConvGeo g{}; /* {}: gcc cannot see that ps_conv_geometry fills it before any use */
  TRY(ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad));
  /* n == 0 still writes dw (zeros, or unchanged when accumulating), like the cpu backend;
   * x and dy are then empty, NULL pointers, and the GEMM never reads them (T == 0). */
  NULL_CHECK(dw);
  if (n > 0) NULL_CHECK(x, dy);
  cudaStream_t st = (cudaStream_t)stream;
  int64_t K = c * kh * kw, P = g.oh * g.ow, cols = n * P, mn = co * K;
  /* Split the long (n, p) reduction so the few output tiles still fill the GPU: about 2
   * blocks per SM for a typical 100+ SM part, each chunk at least 8 BK steps. */
  int64_t tiles = ((co + BM - 1) / BM) * ((K + BN - 1) / BN);
  int64_t splits = 256 / (tiles > 0 ? tiles : 1);
  int64_t max_splits = cols / (8 * BK);
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  if (splits > 256) splits = 256;
  /* The partial sums live for this call only: ps_scratch_alloc takes them from the device's
   * default memory pool in stream order, or from cudaMalloc on a device without pools. */
  float *part = nullptr;
  TRY(ps_scratch_alloc((void **)&part, (size_t)(splits * mn) * sizeof(float), st));
  StorePartial ep{.part = part, .m = co, .n = K};
  int r = PS_OK;
  WITH_ACT(dtype, {
    DyRows<T> A{.dy = (const T *)dy, .co = co, .P = P};
    Im2colT<T> B{.col = Im2col<T>{.x = (const T *)x, .g = g}};
    r = gemm(co, K, cols, (int)splits, A, B, ep, st);
  });
  if (r == PS_OK) {
    PS_LAUNCH(reduce_partials, blocks_for(mn, EW), EW, 0, st, part, (int)splits, mn, dw,
              dw_dtype == PS_NN_F16, accumulate != 0);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) r = ps_record_cuda_error(e, "reduce_partials<<<>>>", __FILE__, __LINE__);
  }
  const int fr = ps_scratch_free(part, st);
  return r != PS_OK ? r : fr;
}

}  // extern "C"
