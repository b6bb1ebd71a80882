/*
 * gemm.cuh — the CUDA backend's one GEMM (included by gemm.cu and conv.cu), C[M, N] = A[M, K] .
 * B[K, N] with fp32 accumulation, in three element types:
 *
 *   fp16 operands, and bf16 on sm_80 and newer: WMMA 16x16x16 tensor-core fragments, four warps
 *     in a 2x2 grid over the block tile, three shared-memory stages;
 *   bf16 operands on sm_75 (whose tensor cores have no bf16): the fp32 path's CUDA-core loop
 *     on the bf16 stages, converting each element exactly to fp32;
 *   fp32 operands (the fp32 path): the same block tile on the CUDA cores, each of the 128
 *     threads accumulating a (BM/8)x4 register tile (no TF32: fp32 means fp32, as PyTorch's
 *     default for matmul), two stages.
 *
 * Block tiles are BM x 64 x 32 (M x N x K), with BM = 32 for GEMMs of at most 32 rows (the
 * 32-channel convolutions) and 64 otherwise.
 *
 * Operands come through loaders that split the work of turning an (row, k) pair into an address
 * in two, so that no division runs per element (all of it in 32-bit):
 *   - fixed(g): the coordinate a thread keeps for a whole k-step or block, decomposed once into
 *     registers. The warps of a block run along the operand's contiguous direction: along k for
 *     A (and for B when `kAlongK`), along n for B otherwise;
 *   - entry(g): the coordinates a thread strides over, decomposed into a shared-memory table, once
 *     per block for m or n, once per k-step for k (by 32 threads, one k-step ahead);
 *   - load(f, e): the element, two adds and a range check.
 * The convolutions are implicit GEMMs through these loaders (no im2col buffer in device memory).
 *
 * Pipelining: an A operand that is contiguous along k and 16-byte aligned (weights, the weight
 * gradient's dY) is copied by 16-byte asynchronous copies (cp.async through <cuda_pipeline.h> on
 * sm_80 and newer, a plain 16-byte load and store on sm_75) STAGES - 1 k-steps ahead; the other
 * operands are loaded into registers one k-step ahead, while the tensor cores work on the current
 * stage, and stored to the next stage after it. One __syncthreads() per k-step.
 *
 * Split-K: a GEMM whose output tiles cannot fill the GPU splits K into fixed chunks, each block
 * writing fp32 partials to a workspace; reduce_splits adds them in a fixed order and applies the
 * epilogue, so results are deterministic and do not depend on the GPU model.
 *
 * Epilogues get the column once per thread (col(j)) and then the rows (store(col, i, v)), so the
 * division that splits a convolution's column into (image, pixel) runs once per thread too.
 *
 * Internal to each includer (an anonymous namespace). kernels/cpu/gemm.c is the CPU twin.
 */
#ifndef PINSTREAM_CUDA_GEMM_CUH
#define PINSTREAM_CUDA_GEMM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <limits.h>
#include <mma.h>
#include <stdint.h>

#include <type_traits>

#include "common.cuh"
#include "nn.cuh"

namespace {

using namespace nvcuda;

constexpr int BN = 64, BK = 32, THREADS = 128;
/* Blocks a GEMM should have to fill the GPU (about 4 resident on each of 128+ SMs). Fixed, so
 * that split-K, and so the rounding of a result, does not depend on the GPU model. */
constexpr int64_t TARGET_BLOCKS = 512;
constexpr int MAX_SPLITS = 256;

/* A strided coordinate's part of an address; y == BAD marks a coordinate outside the operand. */
struct Entry {
  int64_t off;
  int32_t y, x;
};
constexpr int32_t BAD = INT_MIN;
constexpr Entry BAD_ENTRY{0, BAD, 0};

/* A fixed coordinate's part of an address. */
struct Fixed {
  int64_t off;
  int32_t y, x;
  bool ok;
};

using ConvGeo = ps_conv_geo;

/* ---- operand loaders --------------------------------------------------------------------- */

/* p[row * rs + col * cs]: the matmul operands and the forward weights. Rows are the strided
 * coordinate (entry), columns the fixed one: for A that is (i, k) with the warps along k, for B
 * (k, j) with the warps along j. 16-byte copies when the columns are contiguous and aligned. */
template <class T>
struct Strided {
  using elem = T;
  static constexpr bool kAlongK = false; /* as B: the warps run along n */
  static constexpr bool kVec = true;     /* as A: may be copied 16 bytes at a time */
  const T *p;
  int64_t rs, cs;
  bool vec; /* host: cs == 1, rs and the extent along k multiples of 16 bytes, p aligned */
  __device__ Fixed fixed(int g, bool ok) const { return {(int64_t)g * cs, 0, 0, ok}; }
  __device__ Entry entry(int g, bool ok) const {
    return ok ? Entry{(int64_t)g * rs, 0, 0} : BAD_ENTRY;
  }
  __device__ T load(const Fixed &f, const Entry &e) const { return p[f.off + e.off]; }
  __device__ const T *ptr(const Fixed &f, const Entry &e) const { return p + f.off + e.off; }
};

/* col(x)[kk, col] with kk = (c, ky, kx) and col = (n, oy, ox): B of the forward convolution
 * (warps along col), and, transposed (kAlongK: B(t, kk) = col(x)[kk, t]), B of the weight
 * gradient (warps along t = (n, oy, ox), so they read along a row of x). */
template <class T, bool AlongK>
struct Im2col {
  using elem = T;
  static constexpr bool kAlongK = AlongK;
  const T *x;
  int32_t h, w, ohw, ow, khw, kw, s, pad;
  int64_t hw, chw;
  bool vec = false;
  /* (n, oy, ox): the image's base plus the window's top-left corner. */
  __device__ Fixed fixed(int g, bool ok) const {
    if (!ok) return {0, 0, 0, false};
    int n = g / ohw, p = g - n * ohw, oy = p / ow, ox = p - oy * ow;
    int y = oy * s, xx = ox * s;
    return {n * chw + (int64_t)y * w + xx, y, xx, true};
  }
  /* (c, ky, kx): the channel plane plus the tap's offset from the corner. */
  __device__ Entry entry(int g, bool ok) const {
    if (!ok) return BAD_ENTRY;
    int c = g / khw, r = g - c * khw, ky = r / kw, kx = r - ky * kw;
    return {c * hw + (int64_t)(ky - pad) * w + (kx - pad), ky - pad, kx - pad};
  }
  __device__ T load(const Fixed &f, const Entry &e) const {
    if ((unsigned)(f.y + e.y) >= (unsigned)h || (unsigned)(f.x + e.x) >= (unsigned)w)
      return from_f32<T>(0.0f);
    return x[f.off + e.off];
  }
  __device__ const T *ptr(const Fixed &, const Entry &) const { return nullptr; }
};

/* Weights as A of the data gradient: A(c, kk = (o, ky, kx)) = w[o][c][ky][kx]. */
template <class T>
struct WeightT {
  using elem = T;
  static constexpr bool kVec = false;
  const T *w;
  int32_t khw;
  int64_t ckhw;
  bool vec = false;
  __device__ Fixed fixed(int g, bool ok) const {
    int o = g / khw;
    return {o * ckhw + (g - o * khw), 0, 0, ok};
  }
  __device__ Entry entry(int g, bool ok) const {
    return ok ? Entry{(int64_t)g * khw, 0, 0} : BAD_ENTRY;
  }
  __device__ T load(const Fixed &f, const Entry &e) const { return w[f.off + e.off]; }
  __device__ const T *ptr(const Fixed &, const Entry &) const { return nullptr; }
};

/* dY as A of the weight gradient: A(o, t = (n, p)) = dy[n][o][p]; 16-byte copies along t when
 * the plane size P is a multiple of 16 bytes. */
template <class T>
struct DyRows {
  using elem = T;
  static constexpr bool kVec = true;
  const T *dy;
  int32_t P;
  int64_t coP;
  bool vec;
  __device__ Fixed fixed(int g, bool ok) const {
    int n = g / P;
    return {n * coP + (g - n * P), 0, 0, ok};
  }
  __device__ Entry entry(int g, bool ok) const {
    return ok ? Entry{(int64_t)g * P, 0, 0} : BAD_ENTRY;
  }
  __device__ T load(const Fixed &f, const Entry &e) const { return dy[f.off + e.off]; }
  __device__ const T *ptr(const Fixed &f, const Entry &e) const { return dy + f.off + e.off; }
};

/* B of the data gradient: B(kk = (o, ky, kx), col = (n, iy, ix)) = dy[n][o][oy][ox] where
 * oy*s + ky - pad = iy (and likewise x), or 0 when no output pixel reads that input. Unit:
 * stride 1 (no division per element). */
template <class T, bool Unit>
struct DyGather {
  using elem = T;
  static constexpr bool kAlongK = false;
  const T *dy;
  int32_t hw, w, khw, kw, s, pad, oh, ow;
  int64_t ohw, cohw;
  bool vec = false;
  __device__ Fixed fixed(int g, bool ok) const {
    if (!ok) return {0, 0, 0, false};
    int n = g / hw, q = g - n * hw, iy = q / w, ix = q - iy * w;
    return {n * cohw, iy + pad, ix + pad, true};
  }
  __device__ Entry entry(int g, bool ok) const {
    if (!ok) return BAD_ENTRY;
    int o = g / khw, r = g - o * khw, ky = r / kw, kx = r - ky * kw;
    return {o * ohw, -ky, -kx};
  }
  __device__ T load(const Fixed &f, const Entry &e) const {
    int ty = f.y + e.y, tx = f.x + e.x; /* oy * s, ox * s */
    if (ty < 0 || tx < 0) return from_f32<T>(0.0f);
    if constexpr (!Unit) {
      if (ty % s || tx % s) return from_f32<T>(0.0f);
      ty /= s, tx /= s;
    }
    if (ty >= oh || tx >= ow) return from_f32<T>(0.0f);
    return dy[f.off + e.off + (int64_t)ty * ow + tx];
  }
  __device__ const T *ptr(const Fixed &, const Entry &) const { return nullptr; }
};

/* ---- epilogues ------------------------------------------------------------------------- */

struct StoreMat { /* c[i*n + j] (+)= v, fp32, fp16 or bf16 (dt) */
  void *c;
  int64_t n;
  int32_t dt;
  int acc;
  __device__ int64_t col(int j) const { return j; }
  __device__ void store(int64_t j, int i, float v) const {
    int64_t at = i * n + j;
    act_set(c, dt, at, acc ? act_get(c, dt, at) + v : v);
  }
};

/* c[i*n + j] = act(round(v) + bias[j]): StoreMat's value, then ps_nn_bias_add's fp32 add and
 * rounding, then ps_nn_relu_forward's rule on the bits, so the bits of the three calls. */
struct StoreMatBiasAct {
  void *c;
  const void *bias;
  int64_t n;
  int32_t dt, bias_dt;
  int relu;
  __device__ int64_t col(int j) const { return j; }
  __device__ void store(int64_t j, int i, float v) const {
    const int64_t at = i * n + j;
    float r = v; /* the product as matmul stores it */
    if (dt == PS_NN_F16)
      r = __half2float(__float2half_rn(v));
    else if (dt == PS_NN_BF16)
      r = ps_bf16_to_f32(ps_bf16_from_f32(v));
    act_set(c, dt, at, r + act_get(bias, bias_dt, j));
    if (!relu) return;
    if (dt == PS_NN_F32) {
      uint32_t *p = (uint32_t *)c + at;
      *p = ps_relu_f32(*p);
    } else {
      uint16_t *p = (uint16_t *)c + at;
      *p = dt == PS_NN_F16 ? ps_relu_f16(*p) : ps_relu_bf16(*p);
    }
  }
};

template <class T>
struct StoreConvY { /* y[n][o][p] for (o, col = (n, p)) */
  T *y;
  int32_t P;
  int64_t coP;
  __device__ int64_t col(int j) const {
    int n = j / P;
    return n * coP + (j - n * P);
  }
  __device__ void store(int64_t at, int o, float v) const {
    y[at + (int64_t)o * P] = from_f32<T>(v);
  }
};

template <class T>
struct StoreConvDx { /* dx[n][c][q] for (c, col = (n, q)) */
  T *dx;
  int32_t HW;
  int64_t cHW;
  __device__ int64_t col(int j) const {
    int n = j / HW;
    return n * cHW + (j - n * HW);
  }
  __device__ void store(int64_t at, int ch, float v) const {
    dx[at + (int64_t)ch * HW] = from_f32<T>(v);
  }
};

/* The epilogue of a GEMM, or, when part is set, split-K partials part[z][i][j] for reduce_splits
 * (one kernel per epilogue serves both). */
template <class EP>
struct OrPartial {
  EP ep;
  float *part;
  int64_t m, n;
  __device__ int64_t col(int j) const {
    return part ? ((int64_t)blockIdx.z * m) * n + j : ep.col(j);
  }
  __device__ void store(int64_t at, int i, float v) const {
    if (part)
      part[at + i * n] = v;
    else
      ep.store(at, i, v);
  }
};

/* ---- the GEMM ---------------------------------------------------------------------------- */

/* 16 bytes from global to shared memory, asynchronously where the GPU can (zero-filled when
 * !ok); the caller commits and waits. */
__device__ inline void copy16(void *dst, const void *src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  *(uint4 *)dst = ok ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
#else
  __pipeline_memcpy_async(dst, src, 16, ok ? 0 : 16);
#endif
}

/* Whether this compilation has bf16 tensor cores (wmma's bf16 fragments need sm_80; the host
 * pass and the emulator see them too). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define PS_BF16_MMA 1
#else
#define PS_BF16_MMA 0
#endif

template <class T>
struct Shape {
  static constexpr bool k16 = sizeof(T) == 2; /* fp16 or bf16 elements */
  /* tensor cores: fp16 always, bf16 where the GPU has them */
  static constexpr bool kHalf =
      std::is_same<T, __half>::value || (std::is_same<T, __nv_bfloat16>::value && PS_BF16_MMA);
  static constexpr int STAGES = k16 ? 3 : 2;
  static constexpr int PAD = k16 ? 8 : 4;    /* keeps rows 16-byte multiples, wmma-legal */
  static constexpr int VEC = 16 / sizeof(T); /* elements per 16-byte copy */
};

/* C[M, N] = A[M, K] . B[K, N] over k in [z*kchunk, min(K, (z+1)*kchunk)) for blockIdx.z = z. */
template <class T, int BM, class LA, class LB, class EP>
__global__ void __launch_bounds__(THREADS)
    gemm_kernel(int M, int N, int K, int kchunk, LA la, LB lb, EP ep) {
  using S = Shape<T>;
  constexpr int ST = S::STAGES, LDA = BK + S::PAD, LDB = BN + S::PAD, LDC = BN + 4;
  constexpr int A_STAGE = BM * LDA, B_STAGE = BK * LDB;
  constexpr int A_PER = BM * BK / THREADS, B_PER = BK * BN / THREADS;
  constexpr bool B_ALONG_K = LB::kAlongK;
  constexpr int STAGE_BYTES = ST * (A_STAGE + B_STAGE) * (int)sizeof(T);
  constexpr int C_BYTES = BM * LDC * (int)sizeof(float);
  static_assert(C_BYTES <= STAGE_BYTES, "the output tile reuses the stages");
  /* tables: m (per block), n (per block, B along k) or k (two k-steps, B along n) */
  PS_SHARED_ALIGNED(16, Entry, tab_m, [BM]);
  PS_SHARED_ALIGNED(16, Entry, tab_nk, [B_ALONG_K ? BN : 2 * BK]);
  PS_SHARED_ALIGNED(128, unsigned char, raw, [STAGE_BYTES]);
  T *As = (T *)raw, *Bs = (T *)raw + ST * A_STAGE;
  float *Cs = (float *)raw;

  const int tid = threadIdx.x;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int kb = blockIdx.z * kchunk, ke = K - kb < kchunk ? K : kb + kchunk;
  const int nk = ke > kb ? (ke - kb + BK - 1) / BK : 0;
  const bool vec_a = LA::kVec && la.vec;

  for (int i = tid; i < BM; i += THREADS) tab_m[i] = la.entry(m0 + i, m0 + i < M);
  Fixed fb{};
  if constexpr (B_ALONG_K) {
    for (int j = tid; j < BN; j += THREADS) tab_nk[j] = lb.entry(n0 + j, n0 + j < N);
  } else {
    fb = lb.fixed(n0 + tid % BN, n0 + tid % BN < N);
    if (tid < BK) {
      tab_nk[tid] = lb.entry(kb + tid, kb + tid < ke);
      tab_nk[BK + tid] = lb.entry(kb + BK + tid, kb + BK + tid < ke);
    }
  }
  __syncthreads();

  T ra[A_PER], rb[B_PER];
  const T zero = from_f32<T>(0.0f);
  /* A by 16-byte copies into its stage: chunk = (row, 8 or 4 consecutive k). */
  auto issue_a = [&](int kt) {
    if constexpr (!LA::kVec) return;
    if (kt >= nk) return;
    constexpr int CPR = BK / S::VEC; /* chunks per row */
    const int k = kb + kt * BK + (tid % CPR) * S::VEC;
    const Fixed f = la.fixed(k, k < ke);
    T *st = As + (kt % ST) * A_STAGE;
    PS_UNROLL
    for (int r = 0; r < BM * CPR / THREADS; r++) {
      const int i = tid / CPR + r * (THREADS / CPR);
      const Entry e = tab_m[i];
      const bool ok = f.ok && e.y != BAD;
      copy16(st + i * LDA + (tid % CPR) * S::VEC, ok ? la.ptr(f, e) : la.ptr(Fixed{}, Entry{}), ok);
    }
  };
  /* Operands loaded through registers, one k-step ahead. */
  auto fetch = [&](int kt) {
    const int k0 = kb + kt * BK;
    if (!vec_a) {
      const Fixed f = la.fixed(k0 + tid % BK, k0 + tid % BK < ke);
      PS_UNROLL
      for (int r = 0; r < A_PER; r++) {
        const Entry e = tab_m[tid / BK + r * (THREADS / BK)];
        ra[r] = f.ok && e.y != BAD ? la.load(f, e) : zero;
      }
    }
    if constexpr (B_ALONG_K) {
      const Fixed f = lb.fixed(k0 + tid % BK, k0 + tid % BK < ke);
      PS_UNROLL
      for (int r = 0; r < B_PER; r++) {
        const Entry e = tab_nk[tid / BK + r * (THREADS / BK)];
        rb[r] = f.ok && e.y != BAD ? lb.load(f, e) : zero;
      }
    } else {
      const Entry *tk = tab_nk + (kt % 2) * BK;
      PS_UNROLL
      for (int r = 0; r < B_PER; r++) {
        const Entry e = tk[tid / BN + r * (THREADS / BN)];
        rb[r] = fb.ok && e.y != BAD ? lb.load(fb, e) : zero;
      }
    }
  };
  auto store = [&](int kt) {
    T *sa = As + (kt % ST) * A_STAGE, *sb = Bs + (kt % ST) * B_STAGE;
    if (!vec_a) {
      PS_UNROLL
      for (int r = 0; r < A_PER; r++) sa[(tid / BK + r * (THREADS / BK)) * LDA + tid % BK] = ra[r];
    }
    if constexpr (B_ALONG_K) {
      PS_UNROLL
      for (int r = 0; r < B_PER; r++) sb[(tid % BK) * LDB + tid / BK + r * (THREADS / BK)] = rb[r];
    } else {
      PS_UNROLL
      for (int r = 0; r < B_PER; r++) sb[(tid / BN + r * (THREADS / BN)) * LDB + tid % BN] = rb[r];
    }
  };

  /* accumulators */
  constexpr int FM = BM / 32;        /* fp16: 16x16 fragments per warp along m */
  constexpr int TM = BM / 8, TN = 4; /* fp32: per-thread tile */
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[S::kHalf ? FM : 1][2];
  float facc[S::kHalf ? 1 : TM][TN];
  const int warp = tid / 32, wm = (warp / 2) * (BM / 2), wn = (warp % 2) * 32;
  const int r0 = (tid / 16) * TM, c0 = (tid % 16) * TN;
  if constexpr (S::kHalf) {
    for (int i = 0; i < FM; i++)
      for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
  } else {
    for (int i = 0; i < TM; i++)
      for (int j = 0; j < TN; j++) facc[i][j] = 0.0f;
  }

  /* prologue: A's first ST - 1 stages in flight, the first stage of the rest stored */
  for (int s = 0; s < ST - 1; s++) {
    if (vec_a) issue_a(s);
    __pipeline_commit();
  }
  if (nk > 0) {
    fetch(0);
    store(0);
  }

  for (int kt = 0; kt < nk; kt++) {
    __pipeline_wait_prior(ST - 2); /* this thread's copies of stage kt have landed */
    __syncthreads();               /* everyone's, and every read of stage kt - 1 is done */
    if (vec_a) issue_a(kt + ST - 1);
    __pipeline_commit();
    if (kt + 1 < nk) fetch(kt + 1);
    if constexpr (!B_ALONG_K) {
      /* the k-table of step kt + 2 goes where step kt's was (read before the barrier above) */
      const int k = kb + (kt + 2) * BK + tid;
      if (tid < BK) tab_nk[(kt % 2) * BK + tid] = lb.entry(k, k < ke);
    }
    const T *sa = As + (kt % ST) * A_STAGE, *sb = Bs + (kt % ST) * B_STAGE;
    if constexpr (S::kHalf) {
      PS_UNROLL
      for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[FM];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb2[2];
        for (int i = 0; i < FM; i++)
          wmma::load_matrix_sync(fa[i], sa + (wm + i * 16) * LDA + kk, LDA);
        for (int j = 0; j < 2; j++)
          wmma::load_matrix_sync(fb2[j], sb + kk * LDB + wn + j * 16, LDB);
        for (int i = 0; i < FM; i++)
          for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb2[j], acc[i][j]);
      }
    } else {
      PS_UNROLL
      for (int k = 0; k < BK; k++) {
        float a[TM], b[TN];
        for (int i = 0; i < TM; i++) a[i] = to_f32(sa[(r0 + i) * LDA + k]);
        for (int j = 0; j < TN; j++) b[j] = to_f32(sb[k * LDB + c0 + j]);
        for (int i = 0; i < TM; i++)
          for (int j = 0; j < TN; j++) facc[i][j] += a[i] * b[j];
      }
    }
    if (kt + 1 < nk) store(kt + 1);
  }
  __pipeline_wait_prior(0);
  __syncthreads(); /* the stages become the output tile */
  if constexpr (S::kHalf) {
    for (int i = 0; i < FM; i++)
      for (int j = 0; j < 2; j++)
        wmma::store_matrix_sync(Cs + (wm + i * 16) * LDC + wn + j * 16, acc[i][j], LDC,
                                wmma::mem_row_major);
  } else {
    for (int i = 0; i < TM; i++)
      for (int j = 0; j < TN; j++) Cs[(r0 + i) * LDC + c0 + j] = facc[i][j];
  }
  __syncthreads();
  const int j = tid % BN;
  if (n0 + j < N) {
    const int64_t col = ep.col(n0 + j);
    for (int i = tid / BN; i < BM; i += THREADS / BN)
      if (m0 + i < M) ep.store(col, m0 + i, Cs[i * LDC + j]);
  }
}

/* Sums the split-K partials part[z][i][j] over z in a fixed order and applies the epilogue:
 * blockIdx.y strides over rows, x over columns. */
template <class EP>
__global__ void reduce_splits(const float *part, int splits, int M, int N, EP ep) {
  const int64_t mn = (int64_t)M * N;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < N; j += gridDim.x * blockDim.x) {
    const int64_t col = ep.col(j);
    for (int i = blockIdx.y; i < M; i += gridDim.y) {
      const float *p = part + (int64_t)i * N + j;
      float s = 0.0f;
      for (int z = 0; z < splits; z++) s += p[z * mn];
      ep.store(col, i, s);
    }
  }
}

template <class T, int BM, class LA, class LB, class EP>
int gemm_launch(int M, int N, int K, int splits, int kchunk, LA la, LB lb, EP ep, cudaStream_t st) {
  dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + BM - 1) / BM), (unsigned)splits);
  PS_LAUNCH((gemm_kernel<T, BM, LA, LB, EP>), grid, THREADS, 0, st, M, N, K, kchunk, la, lb, ep);
  CUDA_CHECK(cudaGetLastError());
  return PS_OK;
}

/* How many chunks of K to split a GEMM into: 1 unless its output tiles leave the GPU less than
 * half full and K has at least 8 k-steps; then enough to reach TARGET_BLOCKS, each chunk at
 * least 4 k-steps. */
inline int gemm_splits(int64_t M, int64_t N, int64_t K) {
  const int64_t bm = M <= 32 ? 32 : 64;
  const int64_t tiles = ((N + BN - 1) / BN) * ((M + bm - 1) / bm), steps = (K + BK - 1) / BK;
  if (tiles * 2 >= TARGET_BLOCKS || steps < 8) return 1;
  int64_t s = (TARGET_BLOCKS + tiles - 1) / tiles;
  if (s > steps / 4) s = steps / 4;
  if (s > MAX_SPLITS) s = MAX_SPLITS;
  /* no empty chunk: as many as chunks of whole k-steps need */
  const int64_t per = (steps + s - 1) / s;
  return (int)((steps + per - 1) / per);
}

/* C = A . B through the loaders, with `splits` chunks of K (gemm_splits; 1: no split). The
 * loaders' `vec` must already say whether A may be copied 16 bytes at a time. */
template <class LA, class LB, class EP>
int gemm(int64_t M, int64_t N, int64_t K, int splits, LA la, LB lb, EP ep, cudaStream_t st) {
  using T = typename LA::elem;
  if (M <= 0 || N <= 0) return PS_OK;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || (M + 31) / 32 > 65535)
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "gemm: %lldx%lldx%lld is too large (at most 2^31 - 1 per "
            "dimension, 2097120 rows)",
            (long long)M, (long long)N, (long long)K);
  const int64_t steps = (K + BK - 1) / BK;
  if (splits < 1) splits = 1;
  const int per = (int)((steps + splits - 1) / (splits > 0 ? splits : 1));
  const int kchunk = splits > 1 ? per * BK : (int)(K > 0 ? K : 1);
  if (splits > 1) splits = (int)((steps + per - 1) / per);
  const bool small = M <= 32;
  OrPartial<EP> out{.ep = ep, .part = nullptr, .m = M, .n = N};
  if (splits == 1) {
    return small ? gemm_launch<T, 32>((int)M, (int)N, (int)K, 1, kchunk, la, lb, out, st)
                 : gemm_launch<T, 64>((int)M, (int)N, (int)K, 1, kchunk, la, lb, out, st);
  }
  /* The partial sums go to the stream's kept scratch: it is read back by reduce_splits before
   * the next call on the stream can use it again. */
  ps_stream_scratch scratch;
  TRY(ps_stream_scratch_get(&scratch, (size_t)splits * (size_t)(M * N) * sizeof(float), st));
  float *part = (float *)scratch.p;
  out.part = part;
  int r = small ? gemm_launch<T, 32>((int)M, (int)N, (int)K, splits, kchunk, la, lb, out, st)
                : gemm_launch<T, 64>((int)M, (int)N, (int)K, splits, kchunk, la, lb, out, st);
  if (r == PS_OK) {
    const int gx = (int)((N + 255) / 256), gy = (int)(M < 65535 ? M : 65535);
    PS_LAUNCH(reduce_splits<EP>, dim3((unsigned)gx, (unsigned)gy), 256, 0, st, part, splits, (int)M,
              (int)N, ep);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) r = ps_record_cuda_error(e, "reduce_splits<<<>>>", __FILE__, __LINE__);
  }
  const int fr = ps_stream_scratch_release(&scratch, st);
  return r != PS_OK ? r : fr;
}

/* Whether p can be read 16 bytes at a time at element offsets that are multiples of `mult`. */
template <class T>
inline bool aligned16(const T *p, int64_t mult) {
  return ((uintptr_t)p % 16) == 0 && (mult * (int64_t)sizeof(T)) % 16 == 0;
}

}  // namespace

#endif /* PINSTREAM_CUDA_GEMM_CUH */
