/*
 * common.h — error recording and bookkeeping shared by the CPU backend's translation units.
 *
 * Every exported function reports failure the same way:
 *
 *   if (n < 0) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_foo: bad n=%d", n);   // records, returns
 *   PS_REQUIRE(ptr != NULL);          // records "ptr != NULL" with file:line, returns
 *
 * PS_FAIL formats the message, prefixes "file:line: ", stores it in the calling thread's
 * last-error buffer (read by ps_last_error()) and returns `status` from the current function.
 *
 * Symbols declared here are internal to the shared library (hidden visibility): the ABI is
 * pinstream.h alone.
 */
#ifndef PINSTREAM_CPU_COMMON_H
#define PINSTREAM_CPU_COMMON_H

#include <stdint.h>

#include "../pinstream.h"

#define PS_INTERNAL __attribute__((visibility("hidden")))

/* Records "file:line: <formatted message>" as the thread's last error and returns `status`. */
PS_INTERNAL int ps_record_error(int status, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* What both backends refuse and compute per element (kernels/rules.h). */
#include "../rules.h"

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
#define PS_REQUIRE(cond)                                                                     \
  do {                                                                                       \
    if (!(cond)) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: requirement failed: %s", __func__, #cond); \
  } while (0)

/* Copies the thread's last error into a caller-provided buffer (for [wait] functions, whose
 * caller reads the message from another thread) and returns `status` unchanged. */
PS_INTERNAL int ps_export_error(int status, char *msg, uint64_t msg_cap);

/* Kinds of live objects counted by ps_live_objects(). */
typedef enum { PS_LIVE_ALLOCATION = 0, PS_LIVE_STREAM = 1, PS_LIVE_EVENT = 2 } ps_live_kind;

/* Adjusts a live-object counter (atomic). A kernel file that keeps long-lived native
 * allocations of its own (workspaces, caches) counts them here so leak tests see them. */
PS_INTERNAL void ps_live_add(ps_live_kind kind, int64_t delta);

/* 1 when [ptr, ptr + bytes) lies inside one live allocation of this library (device, pinned
 * or registered host memory); the CPU backend uses it to catch stale or out-of-range pointers
 * that the CUDA backend would report as illegal addresses. */
PS_INTERNAL int ps_is_live_range(const void *ptr, uint64_t bytes);

#endif /* PINSTREAM_CPU_COMMON_H */
