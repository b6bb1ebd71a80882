/*
 * errors.h — how both backends record a failure, written once. The CPU backend includes it as
 * C (kernels/cpu/common.h), the CUDA backend as CUDA C++ (kernels/cuda/common.cuh). Every
 * exported function reports failure the same way:
 *
 *   if (n < 0) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_foo: bad n=%d", n);   // records, returns
 *   PS_REQUIRE(ptr != NULL);          // records "ptr != NULL" with file:line, returns
 *   TRY(ps_check_foo(n));             // returns the status of a check that recorded its own
 *
 * PS_FAIL formats the message, prefixes "file:line: ", stores it in the calling thread's
 * last-error buffer (read by ps_last_error()) and returns `status` from the current function.
 * Nothing here throws or exits: no C++ exception may cross the ABI.
 *
 * Exactly one translation unit per backend (cpu/core.c, cuda/core.cu) defines
 * PS_ERRORS_IMPLEMENTATION and PS_BACKEND_ID (pinstream.h's ps_backend value) before including
 * this header; it then also holds the definitions, and the ABI's ps_last_error,
 * ps_abi_version and ps_backend.
 *
 * Symbols declared PS_INTERNAL are internal to the shared library (hidden visibility): the
 * ABI is pinstream.h alone.
 */
#ifndef PINSTREAM_ERRORS_H
#define PINSTREAM_ERRORS_H

#include <stdint.h>

#include "pinstream.h"

#define PS_INTERNAL __attribute__((visibility("hidden")))

/* Records "file:line: <formatted message>" as the thread's last error and returns `status`. */
PS_INTERNAL int ps_record_error(int status, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Copies the thread's last error into a caller-provided buffer (for [wait] functions, whose
 * caller reads the message from another thread) and returns `status` unchanged. */
PS_INTERNAL int ps_export_error(int status, char *msg, uint64_t msg_cap);

/* Record a failure and return `status` from the enclosing function. */
#define PS_FAIL(status, ...) return ps_record_error((status), __FILE__, __LINE__, __VA_ARGS__)

/* Return the status of `expr` from the enclosing function unless it is PS_OK (a shared check
 * of kernels/rules.h, or a helper that recorded its own failure). */
#define TRY(expr)                       \
  do {                                  \
    int ps_st_ = (expr);                \
    if (ps_st_ != PS_OK) return ps_st_; \
  } while (0)

/* Return PS_ERR_INVALID_ARGUMENT, with the failed condition as the message, unless `cond`. */
#define PS_REQUIRE(cond)                                                                          \
  do {                                                                                            \
    if (!(cond)) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: requirement failed: %s", __func__, #cond); \
  } while (0)

#endif /* PINSTREAM_ERRORS_H */

/* Outside the include guard: core.c / core.cu include this header once through their common
 * header, then again with PS_ERRORS_IMPLEMENTATION defined. */
#if defined(PS_ERRORS_IMPLEMENTATION) && !defined(PINSTREAM_ERRORS_IMPLEMENTED)
#define PINSTREAM_ERRORS_IMPLEMENTED

#include <stdarg.h>
#include <stdio.h>

#if !defined(PS_BACKEND_ID)
#error \
    "define PS_BACKEND_ID (0 cpu, 1 cuda) before including errors.h with PS_ERRORS_IMPLEMENTATION"
#endif

#if defined(__cplusplus)
#define PS_THREAD_LOCAL thread_local
#else
#define PS_THREAD_LOCAL _Thread_local
#endif

/* One message per thread: [wait] functions run on Deno's worker threads while the JS thread
 * makes other calls, and each reads only its own failure. */
static PS_THREAD_LOCAL char ps_tls_error[1024];

int ps_record_error(int status, const char *file, int line, const char *fmt, ...) {
  int n = snprintf(ps_tls_error, sizeof ps_tls_error, "%s:%d: ", file, line);
  if (n < 0 || n >= (int)sizeof ps_tls_error) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ps_tls_error + n, sizeof ps_tls_error - (size_t)n, fmt, ap);
  va_end(ap);
  return status;
}

int ps_export_error(int status, char *msg, uint64_t msg_cap) {
  if (status != PS_OK && msg != NULL && msg_cap > 0) {
    snprintf(msg, (size_t)msg_cap, "%s", ps_tls_error);
  }
  return status;
}

#if defined(__cplusplus)
extern "C" {
#endif

PS_API const char *ps_last_error(void) { return ps_tls_error; }

PS_API int ps_abi_version(int32_t *out) {
  PS_REQUIRE(out != NULL);
  *out = PS_ABI_VERSION;
  return PS_OK;
}

PS_API int ps_backend(int32_t *out) {
  PS_REQUIRE(out != NULL);
  *out = PS_BACKEND_ID;
  return PS_OK;
}

#if defined(__cplusplus)
}  // extern "C"
#endif

#endif /* PS_ERRORS_IMPLEMENTATION */
