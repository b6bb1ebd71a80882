/*
 * internal.h — what runtime.cc (memory, streams, events, errors) and exec.cc (grids, blocks,
 * fibers) of the CUDA emulator share. Not seen by kernel code.
 */
#ifndef PS_EMU_INTERNAL_H
#define PS_EMU_INTERNAL_H

#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace ps_emu {

/* How threads within a block, blocks within a grid and wmma fragment elements are ordered. */
enum class Order { forward, reverse, random, greedy, greedy_reverse };

/* Read once from the environment:
 *   PINSTREAM_EMU_ORDER    forward | reverse | random (default) | greedy | greedy-reverse
 *   PINSTREAM_EMU_SEED     seed of the random order (default 1); each launch derives its own
 *   PINSTREAM_EMU_WORKERS  host threads running blocks (default: CPUs - 1, at least 1)
 *   PINSTREAM_EMU_STREAMS  async (default): an operation runs as soon as what it waits for is
 *                          done; deferred: it runs at the latest legal moment, when the host
 *                          waits for it (a synchronize, a query, a blocking copy, a free), one
 *                          operation at a time, the most recently queued runnable one first
 *                          (so work on another stream that lacks a cudaStreamWaitEvent runs
 *                          before what it should have waited for)
 *   PINSTREAM_EMU_DELAY_US async streams: each operation starts after a random delay up to this
 *                          many microseconds (default 0), widening the windows in which host
 *                          code that forgot to wait for the device reads stale results;
 *                          deferred streams: how long the host must have queued and waited
 *                          for nothing new before released work runs (default 2000)
 *   PINSTREAM_EMU_TRACE    1: one line on stderr per stream operation as it runs (#queue order,
 *                          kernel or call, stream), to see the order the streams ran in
 *   PINSTREAM_EMU_MEMORY_MB device memory (default: half the host's, at most 80 GiB)
 *   PINSTREAM_EMU_MEMORY_POOLS 0: the device has no stream-ordered allocator, as on some
 *                          virtualized GPUs and older drivers (cudaDevAttrMemoryPoolsSupported
 *                          is 0 and cudaMallocAsync & co return cudaErrorNotSupported)
 *   PINSTREAM_EMU_LAUNCHES  a file to which the process appends, when it exits, one line per
 *                           launch site that ran ("file:line kernel"): how CI checks that every
 *                           kernel of the CUDA backend ran */
struct EmuConfig {
  Order order;
  uint64_t seed;
  int workers;
  unsigned delay_us;
  bool deferred;
  bool trace;
  uint64_t memory_bytes;
  bool memory_pools;
  const char *launches;
};
PS_EMU_INTERNAL const EmuConfig &config();
PS_EMU_INTERNAL const char *order_name(Order order);

/* splitmix64: the emulator's only random source, so a seed reproduces a run's orders. */
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* One launched grid, from enqueue to completion. A graph's kernel node makes a fresh grid (its
 * own block order) from the same body at every launch of the graph. */
struct Grid;
PS_EMU_INTERNAL std::shared_ptr<Grid> make_grid(const Site &site, const Config &cfg,
                                                std::shared_ptr<const KernelBody> body,
                                                const void *const *pointers, int count);
/* Runs every block (on the calling thread and the worker pool); on a kernel fault returns the
 * error and sets *message to what happened, where. */
PS_EMU_INTERNAL cudaError_t run_grid(Grid &grid, std::string *message);

/* Whether [p, p + bytes) lies inside one live allocation the device may touch: device memory
 * (cudaMalloc, cudaMallocAsync), pinned (cudaHostAlloc) or registered host memory. */
PS_EMU_INTERNAL bool device_accessible(const void *p, size_t bytes);

}  // namespace ps_emu

#endif /* PS_EMU_INTERNAL_H */
