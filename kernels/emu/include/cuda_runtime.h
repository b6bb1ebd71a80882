/*
 * cuda_runtime.h — the part of the CUDA runtime API and of the device language that
 * pinstream's CUDA sources (kernels/cuda/) use, implemented by the emulator (runtime.cc, exec.cc) for the
 * host C++ compiler. The build force-includes it (-include cuda_runtime.h), as nvcc does.
 *
 * Values of enums and error codes are CUDA's own, so messages read the same as on a GPU.
 * Semantics follow the CUDA programming guide where it is strict (memory that the device may
 * use, stream ordering, the legacy default stream, warp collectives needing every named lane,
 * __syncthreads needing every thread of the block) and are deliberately unhelpful where it
 * leaves things unspecified (uninitialized device and shared memory read as 0xff bytes: NaN in
 * fp16/fp32, -1 in integers; the order of threads, blocks and wmma fragment elements).
 */
#ifndef PS_EMU_CUDA_RUNTIME_H
#define PS_EMU_CUDA_RUNTIME_H

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "ps_emu.h"

/* ---- the language's keywords ------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __constant__
/* A by-value kernel parameter read in place (indexed without a local copy on the device). */
#define __grid_constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Shared memory is declared through PS_SHARED & co (kernels/cuda/launch.cuh); a bare
 * __shared__ fails to compile here rather than becoming a per-thread variable. */
#define __shared__ ps_emu_bare_shared_declaration_use_PS_SHARED_of_kernels_cuda_launch_cuh

#define threadIdx (ps_emu_regs->thread_idx)
#define blockIdx (ps_emu_regs->block_idx)
#define blockDim (ps_emu_regs->block_dim)
#define gridDim (ps_emu_regs->grid_dim)
static constexpr int warpSize = 32;

/* ---- errors ------------------------------------------------------------------------------ */

enum cudaError : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorStubLibrary = 34,
  cudaErrorInsufficientDriver = 35,
  cudaErrorDevicesUnavailable = 46,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorAssert = 710,
  cudaErrorHostMemoryAlreadyRegistered = 712,
  cudaErrorHostMemoryNotRegistered = 713,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorSystemDriverMismatch = 803,
  cudaErrorCompatNotSupportedOnDevice = 804,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999,
};

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t err);
/* For an error the emulator raised in a kernel, the message says what, where and in which
 * thread (the same text it printed on stderr when the kernel failed). */
const char *cudaGetErrorString(cudaError_t err);

/* ---- devices ------------------------------------------------------------------------------ */

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
  int asyncEngineCount;
  int unifiedAddressing;
  int canMapHostMemory;
  int integrated;
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMemoryPoolsSupported = 115,
};
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
/* The schedule flags are recorded and read back; the emulator's waits always block. */
#define cudaDeviceScheduleAuto 0x00
#define cudaDeviceScheduleSpin 0x01
#define cudaDeviceScheduleYield 0x02
#define cudaDeviceScheduleBlockingSync 0x04
#define cudaDeviceScheduleMask 0x07
#define cudaDeviceMapHost 0x08
cudaError_t cudaSetDeviceFlags(unsigned int flags);
cudaError_t cudaGetDeviceFlags(unsigned int *flags);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);

/* ---- memory ------------------------------------------------------------------------------- */

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02

cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream = 0);
cudaError_t cudaMemset(void *ptr, int value, size_t count);

typedef struct ps_emu_mem_pool *cudaMemPool_t;
enum cudaMemPoolAttr {
  cudaMemPoolReuseFollowEventDependencies = 0x1,
  cudaMemPoolReuseAllowOpportunistic = 0x2,
  cudaMemPoolReuseAllowInternalDependencies = 0x3,
  cudaMemPoolAttrReleaseThreshold = 0x4,
};
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);

/* The C++ API's typed overloads (cuda_runtime.h declares them for any T**). */
template <class T>
cudaError_t cudaMalloc(T **ptr, size_t size) {
  return cudaMalloc((void **)ptr, size);
}
template <class T>
cudaError_t cudaHostAlloc(T **ptr, size_t size, unsigned int flags) {
  return cudaHostAlloc((void **)ptr, size, flags);
}
template <class T>
cudaError_t cudaMallocHost(T **ptr, size_t size) {
  return cudaMallocHost((void **)ptr, size);
}
template <class T>
cudaError_t cudaMallocAsync(T **ptr, size_t size, cudaStream_t stream) {
  return cudaMallocAsync((void **)ptr, size, stream);
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *value);

/* ---- streams and events ------------------------------------------------------------------- */

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)

typedef struct ps_emu_event *cudaEvent_t;
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

/* Runs fn(data) on the stream's thread at the host function's position in the stream. */
typedef void (*cudaHostFn_t)(void *data);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* ---- stream capture and graphs --------------------------------------------------------------
 * Work queued on a capturing stream is recorded, not run: cudaStreamEndCapture returns it as a
 * graph of kernel, copy, memset and stream-ordered allocation nodes with the dependencies the
 * streams and events gave them, and each cudaGraphLaunch queues every node again (a kernel
 * node as a fresh grid, with its own block order). Nodes without a dependency path between
 * them run in an order the emulator picks (PINSTREAM_EMU_ORDER: capture order for forward and
 * greedy, the latest-captured ready node first for the reverse orders, a seeded random
 * topological order otherwise), so a join that is missing from the capture changes results. */

typedef struct ps_emu_graph *cudaGraph_t;
typedef struct ps_emu_graph_exec *cudaGraphExec_t;
typedef struct ps_emu_graph_node *cudaGraphNode_t;

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
#define cudaGraphInstantiateFlagAutoFreeOnLaunch 1

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                          unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
/* The node count only: `nodes` must be NULL here. */
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);

/* ---- device functions: synchronization ------------------------------------------------------ */

inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  (void)::ps_emu::block_barrier(::ps_emu::Barrier::plain, 1, file, line);
}
inline int __syncthreads_count(int pred, const char *file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
  return ::ps_emu::block_barrier(::ps_emu::Barrier::count, pred, file, line);
}
inline int __syncthreads_and(int pred, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  return ::ps_emu::block_barrier(::ps_emu::Barrier::all, pred, file, line);
}
inline int __syncthreads_or(int pred, const char *file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return ::ps_emu::block_barrier(::ps_emu::Barrier::any, pred, file, line);
}
inline void __threadfence() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  ::ps_emu::maybe_yield();
}
inline void __threadfence_block() { __threadfence(); }
inline void __threadfence_system() { __threadfence(); }
inline void __trap(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::ps_emu::kernel_fault(cudaErrorLaunchFailure, file, line, "__trap()");
}

/* ---- device functions: warp collectives ----------------------------------------------------- */

namespace ps_emu {

enum class Shfl { idx, up, down, bfly };

inline void shfl_complete(const LaneIn *lanes, unsigned mask, uint64_t *out, const void *ctx) {
  const Shfl mode = *static_cast<const Shfl *>(ctx);
  for (unsigned l = 0; l < 32; l++) {
    if (!(mask >> l & 1u)) continue;
    const LaneIn &in = lanes[l];
    const unsigned width = (unsigned)in.width, base = l & ~(width - 1u), off = l - base;
    unsigned src = l;
    switch (mode) {
      case Shfl::idx: src = base + (in.arg % width); break;
      case Shfl::up: src = off >= in.arg ? l - in.arg : l; break;
      case Shfl::down: src = off + in.arg < width ? l + in.arg : l; break;
      case Shfl::bfly: src = base + ((off ^ in.arg) % width); break;
    }
    /* Reading a lane that does not take part is undefined: it reads as poison. */
    out[l] = (mask >> src & 1u) ? lanes[src].value : ~uint64_t(0);
  }
}

template <class T>
T shfl(Shfl mode, const char *what, unsigned mask, T var, unsigned arg, int width,
       const char *file, int line) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "shuffles move 1, 2, 4 or 8 bytes");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
    kernel_fault(cudaErrorIllegalInstruction, file, line, "%s: width %d is not a power of 2 <= 32",
                 what, width);
  }
  LaneIn in{};
  memcpy(&in.value, &var, sizeof(T));
  in.arg = arg;
  in.width = width;
  static const Shfl modes[] = {Shfl::idx, Shfl::up, Shfl::down, Shfl::bfly};
  uint64_t r = warp_collective(what, mask, 0, in, shfl_complete, &modes[(int)mode], file, line);
  T out;
  memcpy(&out, &r, sizeof(T));
  return out;
}

inline void vote_complete(const LaneIn *lanes, unsigned mask, uint64_t *out, const void *) {
  uint64_t ballot = 0;
  for (unsigned l = 0; l < 32; l++)
    if ((mask >> l & 1u) && lanes[l].value) ballot |= 1ull << l;
  for (unsigned l = 0; l < 32; l++) out[l] = ballot;
}

inline void no_complete(const LaneIn *, unsigned, uint64_t *, const void *) {}

}  // namespace ps_emu

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ps_emu::shfl(::ps_emu::Shfl::idx, "__shfl_sync", mask, var, (unsigned)src_lane, width,
                        file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ps_emu::shfl(::ps_emu::Shfl::up, "__shfl_up_sync", mask, var, delta, width, file,
                        line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ps_emu::shfl(::ps_emu::Shfl::down, "__shfl_down_sync", mask, var, delta, width, file,
                        line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::ps_emu::shfl(::ps_emu::Shfl::bfly, "__shfl_xor_sync", mask, var, (unsigned)lane_mask,
                        width, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  ::ps_emu::LaneIn in{};
  in.value = pred != 0;
  return (unsigned)::ps_emu::warp_collective("__ballot_sync", mask, 0, in,
                                             ::ps_emu::vote_complete, nullptr, file, line);
}
inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return __ballot_sync(mask, pred, file, line) != 0;
}
inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return __ballot_sync(mask, pred, file, line) == mask;
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::ps_emu::LaneIn in{};
  (void)::ps_emu::warp_collective("__syncwarp", mask, 0, in, ::ps_emu::no_complete, nullptr,
                                  file, line);
}

/* ---- device functions: atomics (relaxed, device scope) ------------------------------------- */

#define PS_EMU_ATOMIC_INT(T)                                                              \
  inline T atomicAdd(T *p, T v) {                                                         \
    ::ps_emu::maybe_yield();                                                              \
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);                                    \
  }                                                                                       \
  inline T atomicSub(T *p, T v) {                                                         \
    ::ps_emu::maybe_yield();                                                              \
    return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);                                    \
  }                                                                                       \
  inline T atomicExch(T *p, T v) {                                                        \
    ::ps_emu::maybe_yield();                                                              \
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);                                   \
  }                                                                                       \
  inline T atomicAnd(T *p, T v) {                                                         \
    ::ps_emu::maybe_yield();                                                              \
    return __atomic_fetch_and(p, v, __ATOMIC_RELAXED);                                    \
  }                                                                                       \
  inline T atomicOr(T *p, T v) {                                                          \
    ::ps_emu::maybe_yield();                                                              \
    return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);                                     \
  }                                                                                       \
  inline T atomicXor(T *p, T v) {                                                         \
    ::ps_emu::maybe_yield();                                                              \
    return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED);                                    \
  }                                                                                       \
  inline T atomicCAS(T *p, T expected, T desired) {                                       \
    ::ps_emu::maybe_yield();                                                              \
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED,           \
                                __ATOMIC_RELAXED);                                        \
    return expected;                                                                      \
  }                                                                                       \
  inline T atomicMax(T *p, T v) {                                                         \
    ::ps_emu::maybe_yield();                                                              \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                         \
    while (old < v &&                                                                     \
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                     \
    return old;                                                                           \
  }                                                                                       \
  inline T atomicMin(T *p, T v) {                                                         \
    ::ps_emu::maybe_yield();                                                              \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                         \
    while (v < old &&                                                                     \
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                     \
    return old;                                                                           \
  }
PS_EMU_ATOMIC_INT(int)
PS_EMU_ATOMIC_INT(unsigned int)
PS_EMU_ATOMIC_INT(unsigned long long)
#undef PS_EMU_ATOMIC_INT

namespace ps_emu {
template <class F, class U>
F atomic_float_add(F *p, F v) {
  static_assert(sizeof(F) == sizeof(U), "bit width");
  maybe_yield();
  U *bits = reinterpret_cast<U *>(p);
  U old = __atomic_load_n(bits, __ATOMIC_RELAXED), next;
  F f;
  do {
    memcpy(&f, &old, sizeof f);
    f += v;
    memcpy(&next, &f, sizeof f);
  } while (!__atomic_compare_exchange_n(bits, &old, next, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
  memcpy(&f, &old, sizeof f);
  return f;
}
}  // namespace ps_emu

inline float atomicAdd(float *p, float v) { return ::ps_emu::atomic_float_add<float, uint32_t>(p, v); }
inline double atomicAdd(double *p, double v) {
  return ::ps_emu::atomic_float_add<double, uint64_t>(p, v);
}

/* ---- device functions: loads, bit casts, math ------------------------------------------------ */

template <class T>
inline T __ldg(const T *p) {
  return *p;
}

/* Rounded fp32 operations: separate functions and -ffp-contract=off in the emulator build, so
 * the compiler never fuses them into an FMA (which is what these intrinsics promise). */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline float __expf(float a) { return expf(a); }
inline float __logf(float a) { return logf(a); }
inline float __saturatef(float a) { return a != a ? 0.0f : a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }

inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, 4);
  return i;
}
inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) { return (unsigned)__float_as_int(f); }
inline float __uint_as_float(unsigned u) { return __int_as_float((int)u); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

#endif /* PS_EMU_CUDA_RUNTIME_H */
