/*
 * conv.cu — CUDA backend of the 2-D convolutions (kernels/cpu/conv.c is the CPU twin), as
 * implicit GEMMs over the one GEMM of gemm.cuh (no im2col buffer in device memory):
 *
 *   forward        Y[Co, (n,p)]     = W[Co, K] . col(x)[K, (n,p)]          K = C*kh*kw
 *   backward data  dX[C, (n,iy,ix)] = W'[C, (o,ky,kx)] . dY-gather[(o,ky,kx), (n,iy,ix)]
 *                  (each input pixel gathers the output pixels that read it: no atomics,
 *                  deterministic)
 *   backward wt    dW[Co, K]        = dY[Co, (n,p)] . col(x)^T[(n,p), K], split over (n,p)
 *                  into fp32 partials (gemm.cuh's split-K), then reduced in a fixed order
 *                  (deterministic)
 *
 * Results are written by epilogue functors in fp32 or fp16.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "../pinstream.h"
#include "nn.cuh"
#include "gemm.cuh"

namespace {

/* The loaders keep image and plane extents in 32 bits (the GEMM's own dimensions are checked
 * by gemm()). */
int check_sizes(const char *fn, const ConvGeo &g) {
  if (g.h * g.w > INT_MAX || g.oh * g.ow > INT_MAX)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "%s: planes of %lldx%lld (output %lldx%lld) are too large "
            "(at most 2^31 - 1 elements)",
            fn, (long long)g.h, (long long)g.w, (long long)g.oh, (long long)g.ow);
  return PS_OK;
}

template <class T, bool AlongK>
Im2col<T, AlongK> im2col(const T *x, const ConvGeo &g) {
  return {.x = x,
          .h = (int32_t)g.h,
          .w = (int32_t)g.w,
          .ohw = (int32_t)(g.oh * g.ow),
          .ow = (int32_t)g.ow,
          .khw = g.kh * g.kw,
          .kw = g.kw,
          .s = g.s,
          .pad = g.pad,
          .hw = g.h * g.w,
          .chw = g.c * g.h * g.w};
}

template <class T, bool Unit>
DyGather<T, Unit> dy_gather(const T *dy, const ConvGeo &g) {
  return {.dy = dy,
          .hw = (int32_t)(g.h * g.w),
          .w = (int32_t)g.w,
          .khw = g.kh * g.kw,
          .kw = g.kw,
          .s = g.s,
          .pad = g.pad,
          .oh = (int32_t)g.oh,
          .ow = (int32_t)g.ow,
          .ohw = g.oh * g.ow,
          .cohw = g.co * g.oh * g.ow};
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
  TRY(check_sizes(__func__, g));
  const int64_t K = c * kh * kw, P = g.oh * g.ow;
  int r = PS_OK;
  WITH_ACT(dtype, {
    Strided<T> A{.p = (const T *)w, .rs = K, .cs = 1, .vec = aligned16((const T *)w, K)};
    Im2col<T, false> B = im2col<T, false>((const T *)x, g);
    StoreConvY<T> ep{.y = (T *)y, .P = (int32_t)P, .coP = co * P};
    r = gemm(co, n * P, K, gemm_splits(co, n * P, K), A, B, ep, (cudaStream_t)stream);
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
  TRY(check_sizes(__func__, g));
  const int64_t khw = (int64_t)kh * kw, M = c, N = n * h * w_, K = co * khw;
  int r = PS_OK;
  WITH_ACT(dtype, {
    WeightT<T> A{.w = (const T *)w, .khw = (int32_t)khw, .ckhw = c * khw};
    StoreConvDx<T> ep{.dx = (T *)dx, .HW = (int32_t)(h * w_), .cHW = c * h * w_};
    const int splits = gemm_splits(M, N, K);
    cudaStream_t st = (cudaStream_t)stream;
    r = stride == 1 ? gemm(M, N, K, splits, A, dy_gather<T, true>((const T *)dy, g), ep, st)
                    : gemm(M, N, K, splits, A, dy_gather<T, false>((const T *)dy, g), ep, st);
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
  TRY(check_sizes(__func__, g));
  const int64_t K = c * kh * kw, P = g.oh * g.ow, cols = n * P;
  StoreMat ep{.c = dw, .n = K, .dt = dw_dtype, .acc = accumulate != 0};
  int r = PS_OK;
  WITH_ACT(dtype, {
    DyRows<T> A{
        .dy = (const T *)dy, .P = (int32_t)P, .coP = co * P, .vec = aligned16((const T *)dy, P)};
    Im2col<T, true> B = im2col<T, true>((const T *)x, g);
    r = gemm(co, K, cols, gemm_splits(co, K, cols), A, B, ep, (cudaStream_t)stream);
  });
  return r;
}

}  // extern "C"
