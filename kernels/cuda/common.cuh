/*
 * common.cuh — error recording shared by the CUDA backend's translation units.
 *
 * Every CUDA runtime call goes through CUDA_CHECK, and every kernel launch (PS_LAUNCH, see
 * launch.cuh) is followed by CUDA_CHECK(cudaGetLastError()):
 *
 *   CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st));
 *   PS_LAUNCH(my_kernel, grid, block, 0, st, ...);
 *   CUDA_CHECK(cudaGetLastError());
 *
 * On failure CUDA_CHECK records "file:line: <expression> failed: <cudaErrorName>: <CUDA's
 * message>" as the thread's last error (ps_last_error()) and returns the matching PS_ERR_*
 * from the enclosing function. PS_FAIL(status, fmt, ...), TRY and PS_REQUIRE, shared with the
 * CPU backend, come from kernels/errors.h. Nothing here throws or exits: no C++ exception may
 * cross the ABI.
 *
 * Symbols declared here are internal to the shared library (hidden visibility).
 */
#ifndef PINSTREAM_CUDA_COMMON_CUH
#define PINSTREAM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "../errors.h"
#include "../pinstream.h"
#include "launch.cuh"

/* 1 when these sources are built by the host compiler against kernels/emu (the build defines
 * it); nothing else may depend on it: the emulator runs the same code as a GPU. */
#ifndef PS_CUDA_EMULATOR
#define PS_CUDA_EMULATOR 0
#endif

/* Records a failed CUDA call and returns the PS_ERR_* it maps to (ps_status_of). */
PS_INTERNAL int ps_record_cuda_error(cudaError_t err, const char *expr, const char *file, int line);

/* cudaErrorInsufficientDriver & co -> PS_ERR_NO_DRIVER, cudaErrorNoDevice -> PS_ERR_NO_DEVICE,
 * cudaErrorInvalidDevice -> PS_ERR_INVALID_DEVICE, cudaErrorMemoryAllocation ->
 * PS_ERR_OUT_OF_MEMORY, cudaErrorNotReady -> PS_ERR_NOT_READY, cudaErrorInvalidValue ->
 * PS_ERR_INVALID_ARGUMENT, anything else -> PS_ERR_BACKEND. */
PS_INTERNAL int ps_status_of(cudaError_t err);

/* What both backends refuse and compute per element; the element rules run on the device. */
#define PS_RULE static __host__ __device__ __forceinline__
#include "../rules.h"

/* Run a CUDA runtime call; on failure record it and return its PS_ERR_* status. */
#define CUDA_CHECK(expr)                                               \
  do {                                                                 \
    cudaError_t ps_err_ = (expr);                                      \
    if (ps_err_ != cudaSuccess) {                                      \
      return ps_record_cuda_error(ps_err_, #expr, __FILE__, __LINE__); \
    }                                                                  \
  } while (0)

/* Kinds of live objects counted by ps_live_objects(). */
enum ps_live_kind { PS_LIVE_ALLOCATION = 0, PS_LIVE_STREAM = 1, PS_LIVE_EVENT = 2 };

/* Adjusts a live-object counter (atomic). A kernel file that keeps long-lived device
 * allocations of its own (workspaces) counts them here so leak tests see them. */
PS_INTERNAL void ps_live_add(ps_live_kind kind, int64_t delta);

/* Device scratch memory for one call's work on stream `st`, returned with ps_scratch_free on
 * the same stream once that work is queued. Stream-ordered (cudaMallocAsync / cudaFreeAsync
 * from the device's default pool) where the device supports memory pools; elsewhere
 * cudaMalloc, and ps_scratch_free waits for `st` before cudaFree. Not counted by
 * ps_live_objects: it never outlives the call. Both record their own failures. */
PS_INTERNAL int ps_scratch_alloc(void **out, size_t bytes, cudaStream_t st);
PS_INTERNAL int ps_scratch_free(void *p, cudaStream_t st);

/* Scratch a call keeps for the next calls on the same stream: one device buffer per (device,
 * stream), grown to the largest request with cudaMalloc and kept, so a steady training step
 * allocates nothing. Calls on one stream run in order, so one buffer serves them all. While
 * `st` is capturing a graph, a request the buffer cannot hold takes stream-ordered scratch
 * (ps_scratch_alloc: the graph owns it); a buffer a capture used is never freed before its
 * stream, so a recorded graph keeps valid memory. ps_stream_scratch_release gives back what
 * was not the stream's. A graph recorded on a stream is replayed on that stream. */
struct ps_stream_scratch {
  void *p;
  bool owned; /* ps_scratch_alloc'd for this call: release frees it */
};
PS_INTERNAL int ps_stream_scratch_get(ps_stream_scratch *out, size_t bytes, cudaStream_t st);
PS_INTERNAL int ps_stream_scratch_release(ps_stream_scratch *s, cudaStream_t st);
/* Frees the buffers of a stream that was just destroyed (cudaFree waits for its work). */
PS_INTERNAL int ps_stream_scratch_drop(cudaStream_t st);

/* A device-to-device copy queued on `st` with memmove's semantics: cudaMemcpyAsync leaves
 * overlapping ranges undefined, so an overlapping copy goes through scratch memory. dst ==
 * src (or 0 bytes) is a no-op. */
PS_INTERNAL int ps_copy_d2d(void *dst, const void *src, size_t bytes, cudaStream_t st);

/* A fault a kernel found in its arguments' contents (an index out of range), where the host
 * cannot check them without a copy and a wait. The record lives in mapped pinned memory, one
 * per process: the first fault wins and the next synchronize (stream, event or device) reports
 * it as that call's error, then clears it. */
struct ps_device_fault {
  int32_t raised;
  int32_t what;
  int64_t a, b, c;
};
enum ps_device_fault_kind { PS_FAULT_GATHER_INDEX = 1 };

/* The process's fault record, allocated on first use (NULL, with the error recorded, when
 * mapped pinned memory cannot be had). */
PS_INTERNAL int ps_device_fault_record(ps_device_fault **out);

/* After a successful synchronize: a raised fault becomes PS_ERR_INVALID_ARGUMENT with its
 * message, and the record is cleared. */
PS_INTERNAL int ps_device_fault_check(void);

/* Raises a fault from a kernel: the first one is kept. */
static __device__ __forceinline__ void ps_device_fault_raise(ps_device_fault *f, int32_t what,
                                                             int64_t a, int64_t b, int64_t c) {
  if (f != nullptr && atomicCAS(&f->raised, 0, 1) == 0) {
    f->what = what;
    f->a = a;
    f->b = b;
    f->c = c;
    __threadfence_system();
  }
}

#endif /* PINSTREAM_CUDA_COMMON_CUH */
