/*
 * cuda_pipeline.h — the emulator's asynchronous copy primitives (CUDA's <cuda_pipeline.h>,
 * cp.async on sm_80 and newer): __pipeline_memcpy_async, __pipeline_commit and
 * __pipeline_wait_prior.
 *
 * Semantics are the legal extreme that breaks the most code: a copy's destination in shared
 * memory reads as poison (0xff bytes: NaN in fp16 and fp32) from the moment it is issued, and
 * the data lands only when the issuing thread waits for its batch (__pipeline_wait_prior), never
 * earlier, and never because of __syncthreads(). Code that reads a stage before waiting and
 * synchronizing, or issues into a stage another thread still reads, sees NaN. The source is read
 * when the copy is issued.
 *
 * Refused (the grid stops, as a GPU faults): a size other than 4, 8 or 16 bytes, zfill larger
 * than the size, a destination outside the block's shared memory, pointers not aligned to the
 * size.
 */
#ifndef PS_EMU_CUDA_PIPELINE_H
#define PS_EMU_CUDA_PIPELINE_H

#include <stddef.h>

#include "ps_emu.h"

namespace ps_emu {

PS_EMU_INTERNAL void pipeline_copy(void *dst, const void *src, size_t size, size_t zfill,
                                   const char *file, int line);
PS_EMU_INTERNAL void pipeline_commit();
PS_EMU_INTERNAL void pipeline_wait_prior(size_t prior);

}  // namespace ps_emu

/* Copies size - zfill bytes from src (global) to dst (shared) and zeroes the last zfill. */
inline void __pipeline_memcpy_async(void *dst_shared, const void *src_global, size_t size_and_align,
                                    size_t zfill = 0, const char *file = __builtin_FILE(),
                                    int line = __builtin_LINE()) {
  ::ps_emu::pipeline_copy(dst_shared, src_global, size_and_align, zfill, file, line);
}

/* Closes the batch of this thread's copies issued since the last commit. */
inline void __pipeline_commit() { ::ps_emu::pipeline_commit(); }

/* Waits until at most `prior` of this thread's committed batches are still in flight: the
 * older ones land now. */
inline void __pipeline_wait_prior(size_t prior) { ::ps_emu::pipeline_wait_prior(prior); }

#endif /* PS_EMU_CUDA_PIPELINE_H */
