/*
 * pinstream.h — the one C ABI of pinstream.
 *
 * Two implementations: kernels/cuda/ (nvcc, asynchronous on CUDA streams) and kernels/cpu/
 * (cc, synchronous; the numerical reference). ffi/symbols.ts mirrors this file one-to-one.
 *
 * Conventions (every function):
 *   - returns an int32 status: PS_OK (0) or one of PS_ERR_*;
 *   - writes results through out-parameters, never through the return value;
 *   - on failure records a message (the failing expression, file, line and the backend's
 *     own message) in a thread-local buffer read by ps_last_error();
 *   - never calls exit() and never lets a C++ exception cross the ABI.
 *
 * Handles (streams, events) are opaque pointers. Device pointers are opaque too: on the CPU
 * backend they are host memory, on CUDA they are device addresses; neither is for JS to read.
 * A NULL stream means the backend's default stream.
 *
 * Functions marked [wait] block until the device catches up. The FFI layer calls them as
 * `nonblocking` (on a Deno worker thread), where the thread-local message is out of reach of
 * the calling JS thread: so they take an explicit message buffer (msg, msg_cap) that receives
 * the message on failure (it may be NULL).
 */
#ifndef PINSTREAM_H
#define PINSTREAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PS_API __declspec(dllexport)
#else
#define PS_API __attribute__((visibility("default")))
#endif

/* Bumped on any change of a signature or a struct layout; ffi/ refuses a mismatch. */
#define PS_ABI_VERSION 1

/* ---- status codes ------------------------------------------------------------------- */
#define PS_OK 0
#define PS_ERR_INVALID_ARGUMENT 1 /* a null/zero/out-of-range argument */
#define PS_ERR_NO_DRIVER 2        /* CUDA driver missing or too old for the runtime */
#define PS_ERR_NO_DEVICE 3        /* driver present, no usable device */
#define PS_ERR_INVALID_DEVICE 4   /* device ordinal out of range */
#define PS_ERR_OUT_OF_MEMORY 5    /* device or pinned host allocation failed */
#define PS_ERR_NOT_READY 6        /* ps_event_query / ps_stream_query: work still pending */
#define PS_ERR_BACKEND 7          /* any other backend (CUDA) error; see the message */
#define PS_ERR_UNSUPPORTED 8      /* the backend does not implement this operation */

/* ---- library ------------------------------------------------------------------------- */

/* The ABI version the library was built with (PS_ABI_VERSION). */
PS_API int ps_abi_version(int32_t *out);

/* The backend: 0 = cpu, 1 = cuda. */
PS_API int ps_backend(int32_t *out);

/* The calling thread's last error message; never NULL, "" when none. Valid until the next
 * failing call on the same thread. (The only function that does not return a status.) */
PS_API const char *ps_last_error(void);

/* Number of live allocations made through this library (host pinned, host registered,
 * device) and of live streams and events: the leak tests read it. */
PS_API int ps_live_objects(int64_t *allocations, int64_t *streams, int64_t *events);

/* ---- devices ------------------------------------------------------------------------- */

typedef struct ps_device_props {
  char name[256];
  uint64_t total_memory;     /* bytes */
  int32_t major;             /* compute capability (0 on cpu) */
  int32_t minor;
  int32_t multiprocessors;   /* SMs (logical CPUs on cpu) */
  int32_t async_engines;     /* copy engines (0 on cpu) */
  int32_t unified_addressing;
  int32_t reserved[9];
} ps_device_props;

PS_API int ps_device_count(int32_t *out);
PS_API int ps_device_props_get(int32_t device, ps_device_props *out);
/* Makes `device` current for the calling thread (cudaSetDevice). */
PS_API int ps_device_set(int32_t device);
PS_API int ps_device_get(int32_t *out);
/* [wait] Waits for all work on the current device. */
PS_API int ps_device_synchronize(char *msg, uint64_t msg_cap);
PS_API int ps_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- host memory --------------------------------------------------------------------- */

/* Page-locked host memory (cudaHostAlloc; aligned malloc on cpu). */
PS_API int ps_host_alloc(uint64_t bytes, void **out);
PS_API int ps_host_free(void *ptr);
/* Page-locks existing host memory, e.g. a SharedArrayBuffer that workers write
 * (cudaHostRegister; bookkeeping only on cpu). */
PS_API int ps_host_register(void *ptr, uint64_t bytes);
PS_API int ps_host_unregister(void *ptr);

/* ---- device memory ------------------------------------------------------------------- */

PS_API int ps_device_alloc(uint64_t bytes, void **out);
PS_API int ps_device_free(void *ptr);
PS_API int ps_memset_async(void *dst, int32_t value, uint64_t bytes, void *stream);
PS_API int ps_memcpy_h2d_async(void *dst, const void *src, uint64_t bytes, void *stream);
PS_API int ps_memcpy_d2h_async(void *dst, const void *src, uint64_t bytes, void *stream);
PS_API int ps_memcpy_d2d_async(void *dst, const void *src, uint64_t bytes, void *stream);

/* ---- streams ------------------------------------------------------------------------- */

/* A non-blocking stream (does not synchronize with the legacy default stream). */
PS_API int ps_stream_create(void **out);
PS_API int ps_stream_destroy(void *stream);
/* [wait] */
PS_API int ps_stream_synchronize(void *stream, char *msg, uint64_t msg_cap);
/* PS_OK when all work is done, PS_ERR_NOT_READY otherwise. */
PS_API int ps_stream_query(void *stream);
/* Work queued on `stream` after this call waits for `event` (device-side; the host does not). */
PS_API int ps_stream_wait_event(void *stream, void *event);

/* ---- events -------------------------------------------------------------------------- */

#define PS_EVENT_DEFAULT 0
#define PS_EVENT_DISABLE_TIMING 1
PS_API int ps_event_create(int32_t flags, void **out);
PS_API int ps_event_destroy(void *event);
PS_API int ps_event_record(void *event, void *stream);
/* PS_OK when the recorded work is done, PS_ERR_NOT_READY otherwise. */
PS_API int ps_event_query(void *event);
/* [wait] */
PS_API int ps_event_synchronize(void *event, char *msg, uint64_t msg_cap);
/* Milliseconds between two recorded, completed events. */
PS_API int ps_event_elapsed_ms(void *start, void *end, float *out_ms);

/* ---- image kernels (pipeline/) -------------------------------------------------------- */
/* PS-SECTION image: declarations added by the pipeline work go here. */

/* ---- nn kernels (nn/) ----------------------------------------------------------------- */
/* PS-SECTION nn: declarations added by the training work go here. */

#ifdef __cplusplus
}
#endif

#endif /* PINSTREAM_H */
