/*
 * gemm.cuh — the CUDA backend's one GEMM (included by gemm.cu and conv.cu), in two element types:
 *
 *   fp16 operands: staged in shared memory, WMMA 16x16x16 tensor-core fragments accumulating
 *     in fp32, a 64x64 block tile of four warps (32x32 each);
 *   fp32 operands (the fp32 path): the same 64x64 block tile on the CUDA cores, each of the
 *     128 threads accumulating an 8x4 register tile in fp32 (no TF32: fp32 means fp32, as
 *     PyTorch's default for matmul).
 *
 * Operands are read through small loader functors templated on the element type, so conv.cu's
 * convolutions are implicit GEMMs (no im2col buffer in device memory), and results are
 * written by epilogue functors in fp32 or the activation type; split-K partials are reduced
 * in a fixed order (conv.cu's reduce_partials), so results are deterministic. kernels/cpu/gemm.c is
 * the CPU twin.
 *
 * Internal to each includer (an anonymous namespace): the templates are instantiated
 * there, next to the entry points that choose the loaders.
 */
#ifndef PINSTREAM_CUDA_GEMM_CUH
#define PINSTREAM_CUDA_GEMM_CUH

#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

#include <type_traits>

#include "common.cuh"
#include "nn.cuh"

namespace {

using namespace nvcuda;

constexpr int BM = 64, BN = 64, BK = 32, THREADS = 128;

/* ---- operand loaders (element (i, k) of type T, 0 outside) ---------------------------- */

template <class T>
struct Strided { /* A(i, k) = p[i*rs + k*cs] */
  const T *p;
  int64_t rs, cs;
  __device__ T operator()(int64_t i, int64_t k) const { return p[i * rs + k * cs]; }
};

using ConvGeo = ps_conv_geo;

/* The three indices of v in a [.][h][w] grid, {v / (w*h), (v / w) % h, v % w}, the extents
 * given in the order the divisions use them (w, then h): kk into (c, ky, kx), a column into
 * (n, oy, ox). */
struct Idx3 {
  int64_t outer, row, col;
};
__device__ inline Idx3 split3(int64_t v, int64_t w, int64_t h) {
  int64_t t = v / w;
  return {t / h, t % h, v % w};
}

/* col(x)[kk, col]: kk = (c, ky, kx), col = (n, oy, ox). */
template <class T>
struct Im2col {
  const T *x;
  ConvGeo g;
  __device__ T operator()(int64_t kk, int64_t col) const {
    auto [c, ky, kx] = split3(kk, g.kw, g.kh);
    auto [n, oy, ox] = split3(col, g.ow, g.oh);
    int64_t iy = oy * g.s + ky - g.pad, ix = ox * g.s + kx - g.pad;
    if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return from_f32<T>(0.0f);
    return x[((n * g.c + c) * g.h + iy) * g.w + ix];
  }
};

/* Transposed im2col for the weight gradient: B(t = (n,p), kk) = col(x)[kk, t]. */
template <class T>
struct Im2colT {
  Im2col<T> col;
  __device__ T operator()(int64_t t, int64_t kk) const { return col(kk, t); }
};

/* dY as A of the weight gradient: A(o, t = (n, p)) = dy[n][o][p]. */
template <class T>
struct DyRows {
  const T *dy;
  int64_t co, P;
  __device__ T operator()(int64_t o, int64_t t) const { return dy[((t / P) * co + o) * P + t % P]; }
};

/* Weights as A of the data gradient: A(c, kk = (o, ky, kx)) = w[o][c][ky][kx]. */
template <class T>
struct WeightT {
  const T *w;
  ConvGeo g;
  __device__ T operator()(int64_t c, int64_t kk) const {
    auto [o, ky, kx] = split3(kk, g.kw, g.kh);
    return w[((o * g.c + c) * g.kh + ky) * g.kw + kx];
  }
};

/* B of the data gradient: B(kk = (o, ky, kx), col = (n, iy, ix)) = dy[n][o][oy][ox] where
 * oy*s + ky - pad = iy (and likewise x), or 0 when no output pixel reads that input. */
template <class T>
struct DyGather {
  const T *dy;
  ConvGeo g;
  __device__ T operator()(int64_t kk, int64_t col) const {
    auto [o, ky, kx] = split3(kk, g.kw, g.kh);
    auto [n, iy, ix] = split3(col, g.w, g.h);
    int64_t ty = iy + g.pad - ky, tx = ix + g.pad - kx;
    if (ty < 0 || tx < 0 || ty % g.s || tx % g.s) return from_f32<T>(0.0f);
    int64_t oy = ty / g.s, ox = tx / g.s;
    if (oy >= g.oh || ox >= g.ow) return from_f32<T>(0.0f);
    return dy[((n * g.co + o) * g.oh + oy) * g.ow + ox];
  }
};

/* ---- epilogues ------------------------------------------------------------------------- */

struct StoreMat { /* c[i*n + j] (+)= v, fp32 or fp16 */
  void *c;
  int64_t n;
  int f16, acc;
  __device__ void operator()(int64_t i, int64_t j, float v) const {
    int64_t at = i * n + j;
    if (f16) {
      __half *p = (__half *)c + at;
      *p = __float2half_rn(acc ? __half2float(*p) + v : v);
    } else {
      float *p = (float *)c + at;
      *p = acc ? *p + v : v;
    }
  }
};

template <class T>
struct StoreConvY { /* y[n][o][p] for (o, col = (n, p)) */
  T *y;
  int64_t co, P;
  __device__ void operator()(int64_t o, int64_t col, float v) const {
    y[((col / P) * co + o) * P + col % P] = from_f32<T>(v);
  }
};

template <class T>
struct StoreConvDx { /* dx[n][c][q] for (c, col = (n, q)) */
  T *dx;
  int64_t c, HW;
  __device__ void operator()(int64_t ch, int64_t col, float v) const {
    dx[((col / HW) * c + ch) * HW + col % HW] = from_f32<T>(v);
  }
};

struct StorePartial { /* part[z][i][j] (split-K partials, reduced later) */
  float *part;
  int64_t m, n;
  __device__ void operator()(int64_t i, int64_t j, float v) const {
    part[((int64_t)blockIdx.z * m + i) * n + j] = v;
  }
};

/* ---- the GEMM ---------------------------------------------------------------------------- */

/* C[M, N] = A[M, K] . B[K, N] over k in [z*kchunk, min(K, (z+1)*kchunk)) for blockIdx.z = z,
 * fp16 operands on the tensor cores. */
template <class LA, class LB, class EP>
__global__ void __launch_bounds__(THREADS)
    gemm_kernel(int64_t M, int64_t N, int64_t K, int64_t kchunk, LA la, LB lb, EP ep) {
  PS_SHARED_ALIGNED(32, __half, As, [BM][BK + 8]);
  PS_SHARED_ALIGNED(32, __half, Bs, [BK][BN + 8]);
  PS_SHARED_ALIGNED(32, float, Cs, [BM][BN + 4]);
  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
  const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
  const int64_t k_begin = (int64_t)blockIdx.z * kchunk;
  const int64_t k_end = k_begin + kchunk < K ? k_begin + kchunk : K;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

  const __half zero = __float2half(0.0f);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += BK) {
    for (int e = tid; e < BM * BK; e += THREADS) {
      int i = e / BK, k = e % BK;
      int64_t gi = m0 + i, gk = k0 + k;
      As[i][k] = (gi < M && gk < k_end) ? la(gi, gk) : zero;
    }
    for (int e = tid; e < BK * BN; e += THREADS) {
      int k = e / BN, j = e % BN;
      int64_t gk = k0 + k, gj = n0 + j;
      Bs[k][j] = (gk < k_end && gj < N) ? lb(gk, gj) : zero;
    }
    __syncthreads();
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb[2];
      for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &As[wm + i * 16][kk], BK + 8);
      for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &Bs[kk][wn + j * 16], BN + 8);
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      wmma::store_matrix_sync(&Cs[wm + i * 16][wn + j * 16], acc[i][j], BN + 4,
                              wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < BM * BN; e += THREADS) {
    int i = e / BN, j = e % BN;
    int64_t gi = m0 + i, gj = n0 + j;
    if (gi < M && gj < N) ep(gi, gj, Cs[i][j]);
  }
}

/* gemm_kernel for fp32 operands, on the CUDA cores: thread t owns rows (t / 16) * 8 + [0, 8) and
 * columns (t % 16) * 4 + [0, 4) of the block tile; A is staged transposed (As[k][i]) so both
 * operands are read along a row of shared memory. */
template <class LA, class LB, class EP>
__global__ void __launch_bounds__(THREADS)
    gemm_kernel_f32(int64_t M, int64_t N, int64_t K, int64_t kchunk, LA la, LB lb, EP ep) {
  PS_SHARED(float, As, [BK][BM + 4]);
  PS_SHARED(float, Bs, [BK][BN + 4]);
  const int tid = threadIdx.x, r0 = (tid / 16) * 8, c0 = (tid % 16) * 4;
  const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
  const int64_t k_begin = (int64_t)blockIdx.z * kchunk;
  const int64_t k_end = k_begin + kchunk < K ? k_begin + kchunk : K;
  float acc[8][4];
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += BK) {
    for (int e = tid; e < BM * BK; e += THREADS) {
      int i = e / BK, k = e % BK;
      int64_t gi = m0 + i, gk = k0 + k;
      As[k][i] = (gi < M && gk < k_end) ? la(gi, gk) : 0.0f;
    }
    for (int e = tid; e < BK * BN; e += THREADS) {
      int k = e / BN, j = e % BN;
      int64_t gk = k0 + k, gj = n0 + j;
      Bs[k][j] = (gk < k_end && gj < N) ? lb(gk, gj) : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < BK; k++) {
      float a[8], b[4];
      for (int i = 0; i < 8; i++) a[i] = As[k][r0 + i];
      for (int j = 0; j < 4; j++) b[j] = Bs[k][c0 + j];
      for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) {
      int64_t gi = m0 + r0 + i, gj = n0 + c0 + j;
      if (gi < M && gj < N) ep(gi, gj, acc[i][j]);
    }
}

template <class LA, class LB, class EP>
int gemm(int64_t M, int64_t N, int64_t K, int splits, LA la, LB lb, EP ep, cudaStream_t st) {
  if (M <= 0 || N <= 0) return PS_OK;
  int64_t gx = (N + BN - 1) / BN, gy = (M + BM - 1) / BM;
  if (gx > 2147483647 || gy > 65535)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "gemm: %lldx%lld output too large", (long long)M,
            (long long)N);
  int64_t kchunk = splits > 1 ? ((K + splits - 1) / splits + BK - 1) / BK * BK : K;
  if (kchunk <= 0) kchunk = 1;
  dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)splits);
  if constexpr (std::is_same<decltype(la(0, 0)), float>::value) {
    PS_LAUNCH(gemm_kernel_f32, grid, THREADS, 0, st, M, N, K, kchunk, la, lb, ep);
  } else {
    PS_LAUNCH(gemm_kernel, grid, THREADS, 0, st, M, N, K, kchunk, la, lb, ep);
  }
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

}  // namespace

#endif /* PINSTREAM_CUDA_GEMM_CUH */
