/*
 * core.cu — the CUDA backend of pinstream.h's core section.
 *
 * Linked against the static CUDA runtime (-cudart static), so the library loads on machines
 * without a driver: libcuda is opened lazily by the runtime, and its absence surfaces as
 * cudaErrorInsufficientDriver on the first call, which we report as PS_ERR_NO_DRIVER.
 */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "../pinstream.h"
#include "common.cuh"
/* The error-recording module's definitions, ps_last_error, ps_abi_version and ps_backend. */
#define PS_BACKEND_ID 1
#define PS_ERRORS_IMPLEMENTATION
#include "../errors.h"

/* ---- errors --------------------------------------------------------------------------- */

namespace {
std::atomic<int64_t> live[3];
std::atomic<int64_t> live_graphs{0};
}  // namespace

int ps_status_of(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return PS_OK;
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorInitializationError:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice: return PS_ERR_NO_DRIVER;
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable: return PS_ERR_NO_DEVICE;
    case cudaErrorInvalidDevice: return PS_ERR_INVALID_DEVICE;
    case cudaErrorMemoryAllocation: return PS_ERR_OUT_OF_MEMORY;
    case cudaErrorNotReady: return PS_ERR_NOT_READY;
    case cudaErrorInvalidValue:
    /* The cpu backend's registry refuses these as invalid arguments too. */
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered: return PS_ERR_INVALID_ARGUMENT;
    case cudaErrorNotSupported:
    /* What a capture cannot hold: the caller runs the work without a graph. */
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread: return PS_ERR_UNSUPPORTED;
    default: return PS_ERR_BACKEND;
  }
}

int ps_record_cuda_error(cudaError_t err, const char *expr, const char *file, int line) {
  /* The runtime also keeps a failed call's error as the thread's "last error" until someone
   * reads it: reported here, it is cleared, so the next CUDA_CHECK(cudaGetLastError()) after
   * a launch does not blame that launch for this call. (Sticky errors stay sticky.) */
  (void)cudaGetLastError();
  return ps_record_error(ps_status_of(err), file, line, "%s failed: %s: %s", expr,
                         cudaGetErrorName(err), cudaGetErrorString(err));
}

void ps_live_add(ps_live_kind kind, int64_t delta) {
  live[kind].fetch_add(delta, std::memory_order_relaxed);
}

namespace {
std::atomic<ps_device_fault *> fault_record{nullptr};
std::mutex fault_mutex;
}  // namespace

/* Mapped and portable: every device writes it in place, and the host reads it after a
 * synchronize without a copy. Allocated once and kept for the life of the process. */
int ps_device_fault_record(ps_device_fault **out) {
  *out = fault_record.load(std::memory_order_acquire);
  if (*out != nullptr) return PS_OK;
  std::lock_guard<std::mutex> lock(fault_mutex);
  if ((*out = fault_record.load(std::memory_order_acquire)) != nullptr) return PS_OK;
  void *p = nullptr;
  CUDA_CHECK(
      cudaHostAlloc(&p, sizeof(ps_device_fault), cudaHostAllocMapped | cudaHostAllocPortable));
  memset(p, 0, sizeof(ps_device_fault));
  fault_record.store((ps_device_fault *)p, std::memory_order_release);
  *out = (ps_device_fault *)p;
  return PS_OK;
}

int ps_device_fault_check(void) {
  ps_device_fault *f = fault_record.load(std::memory_order_acquire);
  if (f == nullptr || __atomic_load_n(&f->raised, __ATOMIC_ACQUIRE) == 0) return PS_OK;
  const ps_device_fault seen = *f;
  memset(f, 0, sizeof *f);
  switch (seen.what) {
    case PS_FAULT_GATHER_INDEX:
      PS_FAIL(PS_ERR_INVALID_ARGUMENT,
              "a gather on the device found indices[%lld] = %lld outside [0, %lld); that "
              "row was left unwritten",
              (long long)seen.a, (long long)seen.b, (long long)seen.c);
    default: PS_FAIL(PS_ERR_BACKEND, "a kernel raised device fault %d", (int)seen.what);
  }
}

namespace {

/* A query answering "not yet" is not a failure: report it without touching the message, and
 * drop it from the runtime's per-thread last error so the next CUDA_CHECK(cudaGetLastError())
 * after a launch does not mistake it for a launch failure. */
int query_status(cudaError_t err, const char *expr, int line) {
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return PS_ERR_NOT_READY;
  }
  if (err != cudaSuccess) return ps_record_cuda_error(err, expr, __FILE__, line);
  return PS_OK;
}

int device_synchronize(int32_t device) {
  CUDA_CHECK(cudaSetDevice(device));
  /* cudaDeviceSynchronize spins a CPU core while it waits under the runtime's default
   * schedule (fewer contexts than cores), taking it from the loader's workers; the blocking
   * schedule makes it sleep. The flags are the device's: set here, where the wait is. */
  unsigned flags = 0;
  CUDA_CHECK(cudaGetDeviceFlags(&flags));
  if ((flags & cudaDeviceScheduleMask) != cudaDeviceScheduleBlockingSync) {
    CUDA_CHECK(
        cudaSetDeviceFlags((flags & ~cudaDeviceScheduleMask) | cudaDeviceScheduleBlockingSync));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return ps_device_fault_check();
}

int memcpy_async(void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind, void *stream) {
  if (bytes == 0) return PS_OK;
  PS_REQUIRE(dst != nullptr && src != nullptr);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, kind, (cudaStream_t)stream));
  return PS_OK;
}

int bench_loop(void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind, int32_t iters,
               cudaStream_t st, cudaEvent_t start, cudaEvent_t end, float *out_ms) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, kind, st)); /* warm-up, untimed */
  CUDA_CHECK(cudaEventRecord(start, st));
  for (int32_t i = 0; i < iters; i++) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, kind, st));
  }
  CUDA_CHECK(cudaEventRecord(end, st));
  CUDA_CHECK(cudaEventSynchronize(end));
  CUDA_CHECK(cudaEventElapsedTime(out_ms, start, end));
  return PS_OK;
}

int bench_memcpy_loop(void *dst, const void *src, uint64_t bytes, int32_t kind, int32_t iters,
                      void *stream, float *out_ms) {
  PS_REQUIRE(out_ms != nullptr);
  PS_REQUIRE(iters > 0);
  PS_REQUIRE(kind == PS_MEMCPY_H2D || kind == PS_MEMCPY_D2H || kind == PS_MEMCPY_D2D);
  PS_REQUIRE(dst != nullptr && src != nullptr && bytes > 0);
  const cudaMemcpyKind k = kind == PS_MEMCPY_H2D   ? cudaMemcpyHostToDevice
                           : kind == PS_MEMCPY_D2H ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyDeviceToDevice;
  cudaEvent_t start = nullptr, end = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  int st = PS_OK;
  cudaError_t e = cudaEventCreate(&end);
  if (e != cudaSuccess) {
    st = ps_record_cuda_error(e, "cudaEventCreate(&end)", __FILE__, __LINE__);
  } else {
    st = bench_loop(dst, src, bytes, k, iters, (cudaStream_t)stream, start, end, out_ms);
    e = cudaEventDestroy(end);
    if (e != cudaSuccess && st == PS_OK)
      st = ps_record_cuda_error(e, "cudaEventDestroy(end)", __FILE__, __LINE__);
  }
  e = cudaEventDestroy(start);
  if (e != cudaSuccess && st == PS_OK)
    st = ps_record_cuda_error(e, "cudaEventDestroy(start)", __FILE__, __LINE__);
  return st;
}

}  // namespace

/* ---- scratch memory and overlapping copies (common.cuh) ---------------------------------- */

namespace {

/* Per device ordinal below 64: pool_known has its bit once pool_supported is settled for it,
 * pool_ok once it is known to have memory pools (higher ordinals ask every time). */
std::atomic<uint64_t> pool_known{0}, pool_ok{0};

/* Whether the current device has the stream-ordered allocator (cudaDevAttrMemoryPoolsSupported:
 * 0 on some vGPU, MIG and older-driver setups, where cudaMallocAsync fails with
 * cudaErrorNotSupported). The first call per device that finds pools also sets the default
 * pool's release threshold: at 0, every synchronize would hand the pool's memory back to the
 * OS and the next step would map it again, so keep up to 256 MiB cached. */
int pool_supported(bool *out) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
  if (bit != 0 && (pool_known.load(std::memory_order_acquire) & bit)) {
    *out = (pool_ok.load(std::memory_order_relaxed) & bit) != 0;
    return PS_OK;
  }
  int supported = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
  if (supported) {
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t threshold = 256ull << 20;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    pool_ok.fetch_or(bit, std::memory_order_relaxed);
  }
  pool_known.fetch_or(bit, std::memory_order_release);
  *out = supported != 0;
  return PS_OK;
}

}  // namespace

namespace {

/* Allocations made inside calls (ps_scratch_allocations). */
std::atomic<int64_t> scratch_allocations{0};

/* The kept scratch of one (device, stream). `captured`: a graph recorded `cur`'s address, so
 * growing keeps it in `retired` until the stream goes. */
struct stream_arena {
  int dev;
  cudaStream_t st;
  void *cur;
  size_t cap;
  bool captured;
  std::vector<void *> retired;
};
std::mutex arenas_mu;
std::vector<stream_arena> arenas;

}  // namespace

int ps_stream_scratch_get(ps_stream_scratch *out, size_t bytes, cudaStream_t st) {
  out->p = nullptr;
  out->owned = false;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(st, &cs));
  const bool capturing = cs != cudaStreamCaptureStatusNone;
  std::lock_guard<std::mutex> lock(arenas_mu);
  stream_arena *a = nullptr;
  for (auto &e : arenas)
    if (e.dev == dev && e.st == st) a = &e;
  if (a == nullptr) {
    arenas.push_back(stream_arena{dev, st, nullptr, 0, false, {}});
    a = &arenas.back();
  }
  if (bytes <= a->cap) {
    a->captured = a->captured || capturing;
    out->p = a->cur;
    return PS_OK;
  }
  if (capturing) { /* cudaMalloc would end the capture: the graph allocates its own */
    TRY(ps_scratch_alloc(&out->p, bytes, st));
    out->owned = true;
    return PS_OK;
  }
  /* Whole 1 MiB steps, so shapes that differ a little share a buffer. */
  const size_t cap = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
  void *p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, cap));
  scratch_allocations.fetch_add(1, std::memory_order_relaxed);
  if (a->cur != nullptr) {
    if (a->captured) {
      a->retired.push_back(a->cur);
    } else {
      cudaError_t e = cudaFree(a->cur); /* waits for the work that used it */
      if (e != cudaSuccess) {
        (void)cudaFree(p);
        return ps_record_cuda_error(e, "cudaFree(a->cur)", __FILE__, __LINE__);
      }
    }
  }
  a->cur = p;
  a->cap = cap;
  a->captured = false;
  out->p = p;
  return PS_OK;
}

int ps_stream_scratch_release(ps_stream_scratch *s, cudaStream_t st) {
  if (!s->owned) return PS_OK;
  s->owned = false;
  return ps_scratch_free(s->p, st);
}

int ps_stream_scratch_drop(cudaStream_t st) {
  std::vector<void *> bufs;
  {
    std::lock_guard<std::mutex> lock(arenas_mu);
    for (size_t i = 0; i < arenas.size();) {
      if (arenas[i].st == st) {
        if (arenas[i].cur) bufs.push_back(arenas[i].cur);
        bufs.insert(bufs.end(), arenas[i].retired.begin(), arenas[i].retired.end());
        arenas.erase(arenas.begin() + (std::ptrdiff_t)i);
      } else {
        i++;
      }
    }
  }
  int r = PS_OK;
  for (void *p : bufs) {
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess && r == PS_OK)
      r = ps_record_cuda_error(e, "cudaFree(p)", __FILE__, __LINE__);
  }
  return r;
}

int ps_scratch_alloc(void **out, size_t bytes, cudaStream_t st) {
  *out = nullptr;
  scratch_allocations.fetch_add(1, std::memory_order_relaxed);
  bool pools = false;
  TRY(pool_supported(&pools));
  if (pools) {
    CUDA_CHECK(cudaMallocAsync(out, bytes, st));
  } else {
    CUDA_CHECK(cudaMalloc(out, bytes));
  }
  return PS_OK;
}

int ps_scratch_free(void *p, cudaStream_t st) {
  if (p == nullptr) return PS_OK;
  bool pools = false;
  TRY(pool_supported(&pools));
  if (pools) {
    CUDA_CHECK(cudaFreeAsync(p, st));
    return PS_OK;
  }
  /* Without a pool nothing frees in stream order: wait for the work queued on `st` that uses
   * p (cudaFree may not wait for a non-blocking stream), then free it even if that work
   * failed, so an error does not leak the memory. Correct, not fast. */
  cudaError_t se = cudaStreamSynchronize(st);
  cudaError_t fe = cudaFree(p);
  if (se != cudaSuccess) {
    return ps_record_cuda_error(se, "cudaStreamSynchronize(st)", __FILE__, __LINE__);
  }
  CUDA_CHECK(fe);
  return PS_OK;
}

int ps_copy_d2d(void *dst, const void *src, size_t bytes, cudaStream_t st) {
  if (bytes == 0 || dst == src) return PS_OK;
  const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (d + bytes <= s || s + bytes <= d) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    return PS_OK;
  }
  void *tmp = nullptr;
  TRY(ps_scratch_alloc(&tmp, bytes, st));
  cudaError_t e = cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, st);
  const char *what = "cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, st)";
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, st);
    what = "cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, st)";
  }
  const int r = e == cudaSuccess ? PS_OK : ps_record_cuda_error(e, what, __FILE__, __LINE__);
  const int fr = ps_scratch_free(tmp, st);
  return r != PS_OK ? r : fr;
}

extern "C" {

PS_API int ps_live_objects(int64_t *allocations, int64_t *streams, int64_t *events) {
  if (allocations) *allocations = live[PS_LIVE_ALLOCATION].load(std::memory_order_relaxed);
  if (streams) *streams = live[PS_LIVE_STREAM].load(std::memory_order_relaxed);
  if (events) *events = live[PS_LIVE_EVENT].load(std::memory_order_relaxed);
  return PS_OK;
}

PS_API int ps_scratch_allocations(int64_t *out) {
  PS_REQUIRE(out != nullptr);
  *out = scratch_allocations.load(std::memory_order_relaxed);
  return PS_OK;
}

/* ---- devices -------------------------------------------------------------------------- */

PS_API int ps_device_count(int32_t *out) {
  PS_REQUIRE(out != nullptr);
  *out = 0;
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  *out = n;
  return PS_OK;
}

PS_API int ps_device_props_get(int32_t device, ps_device_props *out) {
  PS_REQUIRE(out != nullptr);
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", p.name);
  out->total_memory = (uint64_t)p.totalGlobalMem;
  out->major = p.major;
  out->minor = p.minor;
  out->multiprocessors = p.multiProcessorCount;
  out->async_engines = p.asyncEngineCount;
  out->unified_addressing = p.unifiedAddressing;
  out->emulated = PS_CUDA_EMULATOR;
  return PS_OK;
}

PS_API int ps_device_set(int32_t device) {
  CUDA_CHECK(cudaSetDevice(device));
  return PS_OK;
}

PS_API int ps_device_get(int32_t *out) {
  PS_REQUIRE(out != nullptr);
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  *out = d;
  return PS_OK;
}

PS_API int ps_device_synchronize(int32_t device, char *msg, uint64_t msg_cap) {
  return ps_export_error(device_synchronize(device), msg, msg_cap);
}

PS_API int ps_mem_info(uint64_t *free_bytes, uint64_t *total_bytes) {
  PS_REQUIRE(free_bytes != nullptr && total_bytes != nullptr);
  size_t f = 0, t = 0;
  CUDA_CHECK(cudaMemGetInfo(&f, &t));
  *free_bytes = f;
  *total_bytes = t;
  return PS_OK;
}

/* ---- host memory ---------------------------------------------------------------------- */

/* Portable: the pinning holds for every device, not only the one current at allocation. */
PS_API int ps_host_alloc(uint64_t bytes, void **out) {
  PS_REQUIRE(out != nullptr);
  *out = nullptr;
  if (bytes == 0) return PS_OK;
  void *p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, (size_t)bytes, cudaHostAllocPortable));
  ps_live_add(PS_LIVE_ALLOCATION, 1);
  *out = p;
  return PS_OK;
}

PS_API int ps_host_free(void *ptr) {
  if (ptr == nullptr) return PS_OK;
  CUDA_CHECK(cudaFreeHost(ptr));
  ps_live_add(PS_LIVE_ALLOCATION, -1);
  return PS_OK;
}

PS_API int ps_host_register(void *ptr, uint64_t bytes) {
  PS_REQUIRE(ptr != nullptr);
  PS_REQUIRE(bytes > 0);
  CUDA_CHECK(cudaHostRegister(ptr, (size_t)bytes, cudaHostRegisterPortable));
  ps_live_add(PS_LIVE_ALLOCATION, 1);
  return PS_OK;
}

PS_API int ps_host_unregister(void *ptr) {
  PS_REQUIRE(ptr != nullptr);
  CUDA_CHECK(cudaHostUnregister(ptr));
  ps_live_add(PS_LIVE_ALLOCATION, -1);
  return PS_OK;
}

/* ---- device memory -------------------------------------------------------------------- */

PS_API int ps_device_alloc(uint64_t bytes, void **out) {
  PS_REQUIRE(out != nullptr);
  *out = nullptr;
  if (bytes == 0) return PS_OK;
  void *p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, (size_t)bytes));
  ps_live_add(PS_LIVE_ALLOCATION, 1);
  *out = p;
  return PS_OK;
}

PS_API int ps_device_free(void *ptr) {
  if (ptr == nullptr) return PS_OK;
  CUDA_CHECK(cudaFree(ptr));
  ps_live_add(PS_LIVE_ALLOCATION, -1);
  return PS_OK;
}

PS_API int ps_memset_async(void *dst, int32_t value, uint64_t bytes, void *stream) {
  if (bytes == 0) return PS_OK;
  PS_REQUIRE(dst != nullptr);
  CUDA_CHECK(cudaMemsetAsync(dst, value, (size_t)bytes, (cudaStream_t)stream));
  return PS_OK;
}

PS_API int ps_memcpy_h2d_async(void *dst, const void *src, uint64_t bytes, void *stream) {
  return memcpy_async(dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

PS_API int ps_memcpy_d2h_async(void *dst, const void *src, uint64_t bytes, void *stream) {
  return memcpy_async(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
}

PS_API int ps_memcpy_d2d_async(void *dst, const void *src, uint64_t bytes, void *stream) {
  return memcpy_async(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

/* ---- streams -------------------------------------------------------------------------- */

/* By default a blocking stream: work on the legacy default (NULL) stream waits for it and it
 * waits for the NULL stream, so the wrappers' default-stream conveniences (Tensor.fromHost,
 * toHost, a copy without { stream }) are ordered with every stream without explicit events.
 * A copy stream that must overlap compute on the NULL stream asks for PS_STREAM_NON_BLOCKING
 * and orders itself with events. */
PS_API int ps_stream_create(int32_t flags, void **out) {
  PS_REQUIRE(out != nullptr);
  PS_REQUIRE(flags == PS_STREAM_DEFAULT || flags == PS_STREAM_NON_BLOCKING);
  *out = nullptr;
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(
      &s, flags == PS_STREAM_NON_BLOCKING ? cudaStreamNonBlocking : cudaStreamDefault));
  ps_live_add(PS_LIVE_STREAM, 1);
  *out = (void *)s;
  return PS_OK;
}

PS_API int ps_stream_destroy(void *stream) {
  PS_REQUIRE(stream != nullptr);
  CUDA_CHECK(cudaStreamDestroy((cudaStream_t)stream));
  ps_live_add(PS_LIVE_STREAM, -1);
  return ps_stream_scratch_drop((cudaStream_t)stream);
}

static int stream_synchronize(int32_t device, void *stream) {
  /* This runs on a waiting thread whose current device is its own: select the stream's
   * device first, or the NULL stream would be device 0's. */
  CUDA_CHECK(cudaSetDevice(device));
  /* cudaStreamSynchronize spins a CPU core for as long as the wait lasts (the runtime's
   * default schedule while the process has fewer contexts than cores), taking it from the
   * loader's workers. An event recorded after the stream's work and waited on with blocking
   * sync waits for the same work, sleeping; it reports the same asynchronous errors. */
  cudaEvent_t done = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventBlockingSync | cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(done, (cudaStream_t)stream);
  const char *expr = "cudaEventRecord(done, stream)";
  if (e == cudaSuccess) {
    e = cudaEventSynchronize(done);
    expr = "cudaEventSynchronize(done)";
  }
  cudaError_t de = cudaEventDestroy(done);
  if (e != cudaSuccess) return ps_record_cuda_error(e, expr, __FILE__, __LINE__);
  CUDA_CHECK(de);
  return ps_device_fault_check();
}

PS_API int ps_stream_synchronize(int32_t device, void *stream, char *msg, uint64_t msg_cap) {
  return ps_export_error(stream_synchronize(device, stream), msg, msg_cap);
}

PS_API int ps_stream_query(void *stream) {
  return query_status(cudaStreamQuery((cudaStream_t)stream), "cudaStreamQuery(stream)", __LINE__);
}

PS_API int ps_stream_wait_event(void *stream, void *event) {
  PS_REQUIRE(event != nullptr);
  CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
  return PS_OK;
}

/* ---- events --------------------------------------------------------------------------- */

PS_API int ps_event_create(int32_t flags, void **out) {
  PS_REQUIRE(out != nullptr);
  PS_REQUIRE((flags & ~(PS_EVENT_DISABLE_TIMING | PS_EVENT_BLOCKING_SYNC)) == 0);
  *out = nullptr;
  cudaEvent_t e = nullptr;
  unsigned cuda_flags = cudaEventDefault;
  if (flags & PS_EVENT_DISABLE_TIMING) cuda_flags |= cudaEventDisableTiming;
  if (flags & PS_EVENT_BLOCKING_SYNC) cuda_flags |= cudaEventBlockingSync;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cuda_flags));
  ps_live_add(PS_LIVE_EVENT, 1);
  *out = (void *)e;
  return PS_OK;
}

PS_API int ps_event_destroy(void *event) {
  PS_REQUIRE(event != nullptr);
  CUDA_CHECK(cudaEventDestroy((cudaEvent_t)event));
  ps_live_add(PS_LIVE_EVENT, -1);
  return PS_OK;
}

PS_API int ps_event_record(void *event, void *stream) {
  PS_REQUIRE(event != nullptr);
  CUDA_CHECK(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
  return PS_OK;
}

PS_API int ps_event_query(void *event) {
  if (event == nullptr) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_event_query: NULL event");
  return query_status(cudaEventQuery((cudaEvent_t)event), "cudaEventQuery(event)", __LINE__);
}

PS_API int ps_event_synchronize(void *event, char *msg, uint64_t msg_cap) {
  int st = PS_OK;
  if (event == nullptr) {
    st = ps_record_error(PS_ERR_INVALID_ARGUMENT, __FILE__, __LINE__,
                         "ps_event_synchronize: NULL event");
  } else {
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)event);
    if (e != cudaSuccess) {
      st = ps_record_cuda_error(e, "cudaEventSynchronize(event)", __FILE__, __LINE__);
    } else {
      st = ps_device_fault_check();
    }
  }
  return ps_export_error(st, msg, msg_cap);
}

PS_API int ps_event_elapsed_ms(void *start, void *end, float *out_ms) {
  PS_REQUIRE(start != nullptr && end != nullptr && out_ms != nullptr);
  CUDA_CHECK(cudaEventElapsedTime(out_ms, (cudaEvent_t)start, (cudaEvent_t)end));
  return PS_OK;
}

/* ---- graphs --------------------------------------------------------------------------- */

/* Thread-local mode: the capture refuses unsafe calls (cudaMalloc, a synchronize) made on the
 * capturing thread, which would otherwise run once at capture time and never at replay, while
 * waits that other threads make meanwhile (a loader's event synchronizes) stay legal. */
PS_API int ps_graph_capture_begin(void *stream) {
  if (stream == nullptr) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "ps_graph_capture_begin: the default (NULL) stream cannot capture; use a created "
            "stream");
  }
  CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
  return PS_OK;
}

PS_API int ps_graph_capture_end(void *stream, void **out) {
  PS_REQUIRE(stream != nullptr && out != nullptr);
  *out = nullptr;
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture((cudaStream_t)stream, &graph));
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaError_t de = cudaGraphDestroy(graph); /* the executable keeps what it needs */
  if (e != cudaSuccess) {
    return ps_record_cuda_error(e, "cudaGraphInstantiate(&exec, graph, 0)", __FILE__, __LINE__);
  }
  if (de != cudaSuccess) {
    (void)cudaGraphExecDestroy(exec);
    return ps_record_cuda_error(de, "cudaGraphDestroy(graph)", __FILE__, __LINE__);
  }
  live_graphs.fetch_add(1, std::memory_order_relaxed);
  *out = (void *)exec;
  return PS_OK;
}

PS_API int ps_graph_launch(void *graph, void *stream) {
  PS_REQUIRE(graph != nullptr);
  CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, (cudaStream_t)stream));
  return PS_OK;
}

PS_API int ps_graph_destroy(void *graph) {
  PS_REQUIRE(graph != nullptr);
  CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
  live_graphs.fetch_sub(1, std::memory_order_relaxed);
  return PS_OK;
}

PS_API int ps_graph_live(int64_t *out) {
  PS_REQUIRE(out != nullptr);
  *out = live_graphs.load(std::memory_order_relaxed);
  return PS_OK;
}

/* ---- benchmark helper ----------------------------------------------------------------- */

static int bench_memcpy_loop_on(int32_t device, void *dst, const void *src, uint64_t bytes,
                                int32_t kind, int32_t iters, void *stream, float *out_ms) {
  CUDA_CHECK(cudaSetDevice(device)); /* a waiting thread: see stream_synchronize */
  return bench_memcpy_loop(dst, src, bytes, kind, iters, stream, out_ms);
}

PS_API int ps_bench_memcpy_loop(int32_t device, void *dst, const void *src, uint64_t bytes,
                                int32_t kind, int32_t iters, void *stream, float *out_ms, char *msg,
                                uint64_t msg_cap) {
  return ps_export_error(bench_memcpy_loop_on(device, dst, src, bytes, kind, iters, stream, out_ms),
                         msg, msg_cap);
}

}  // extern "C"
