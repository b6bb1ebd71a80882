/*
 * gemm.h — the CPU backend's one fp32 GEMM (gemm.c), which every heavy nn kernel feeds.
 */
#ifndef PINSTREAM_CPU_GEMM_H
#define PINSTREAM_CPU_GEMM_H

#include <stdint.h>

#include "common.h"

/* Micro-tile: MR rows x NR columns (gemm.c says why these sizes): 14 x 32 fills AVX-512's 32
 * zmm registers with 28 accumulators; AVX2 has 16 ymm registers, so 6 x 16 (12 accumulators,
 * two B vectors, one broadcast: the classic Haswell/Zen tile). The portable path keeps 14 x 32
 * (the compiler vectorizes its loops as it can). */
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define PS_GEMM_AVX2 1
#define MR 6
#define NR 16
#else
#define MR 14
#define NR 32
#endif

/* A strided view of memory of dtype dt (PS_NN_F32, PS_NN_F16 or PS_NN_BF16): element (i, j)
 * at p[i*rs + j*cs]. */
typedef struct {
  const void *p;
  int32_t dt;
  int64_t rs, cs;
} mat_t;

/* C[M,N] (fp32, leading dimension ldc) = (acc ? C : 0) + A[M,K] . B[K,N] on the calling
 * thread (callers parallelize over independent outputs); returns 0, or -1 when out of
 * memory for its packing workspaces. */
PS_INTERNAL int ps_gemm(int64_t M, int64_t N, int64_t K, const mat_t *A, const mat_t *B, float *C,
                        int64_t ldc, int acc);

#endif /* PINSTREAM_CPU_GEMM_H */
