/*
 * nn.h — what the CPU backend's nn kernel files (gemm.c, conv.c, norm.c, ops.c) share: the
 * checks that stand in for the faults a GPU would raise, and dtype sizes.
 *
 * Parallelism (threads.h): convolutions run one image per task, with no synchronization
 * inside a GEMM; plain matmul splits its output into tile ranges; element-wise kernels split
 * into ranges. Every task writes its own outputs, and the weight gradient sums fixed chunks of
 * the batch in a fixed order, so results are bit-for-bit reproducible from run to run whatever
 * the scheduling (checkpoint/resume tests rely on it).
 */
#ifndef PINSTREAM_CPU_NN_H
#define PINSTREAM_CPU_NN_H

#include <stdint.h>

#include "common.h"

/* Fails unless [ptr, ptr + bytes) lies inside one live allocation (the CUDA backend would
 * report an illegal address, later and less precisely). */
#define CHECK_RANGE(ptr, bytes)                                                                   \
  do {                                                                                            \
    if ((bytes) > 0 && !ps_is_live_range((ptr), (uint64_t)(bytes)))                               \
      PS_FAIL(PS_ERR_INVALID_ARGUMENT,                                                            \
              "%s: %s (%p, %llu bytes) is not inside one live device allocation", __func__, #ptr, \
              (const void *)(ptr), (unsigned long long)(bytes));                                  \
  } while (0)
#define CHECK_DTYPE(dt) TRY(ps_check_dtype(__func__, #dt, (dt)))
#define OOM() PS_FAIL(PS_ERR_OUT_OF_MEMORY, "%s: no memory for a workspace", __func__)

/* Bytes per element of a PS_NN_* dtype. */
static inline int64_t dtsize(int32_t dt) { return dt == PS_NN_F16 || dt == PS_NN_BF16 ? 2 : 4; }

#endif /* PINSTREAM_CPU_NN_H */
