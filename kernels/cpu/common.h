/*
 * common.h — what the CPU backend's translation units share: error recording (kernels/errors.h,
 * the same module as the CUDA backend's), the argument checks and element rules of
 * kernels/rules.h, and the registry of live objects.
 *
 * Symbols declared here are internal to the shared library (hidden visibility): the ABI is
 * pinstream.h alone.
 */
#ifndef PINSTREAM_CPU_COMMON_H
#define PINSTREAM_CPU_COMMON_H

#include <stdint.h>

#include "../errors.h"
/* What both backends refuse and compute per element (kernels/rules.h). */
#include "../rules.h"

/* Kinds of live objects counted by ps_live_objects(). */
typedef enum { PS_LIVE_ALLOCATION = 0, PS_LIVE_STREAM = 1, PS_LIVE_EVENT = 2 } ps_live_kind;

/* Adjusts a live-object counter (atomic). A kernel file that keeps long-lived native
 * allocations of its own (workspaces, caches) counts them here so leak tests see them. */
PS_INTERNAL void ps_live_add(ps_live_kind kind, int64_t delta);

/* 1 when [ptr, ptr + bytes) lies inside one live allocation of this library (device, pinned
 * or registered host memory); the CPU backend uses it to catch stale or out-of-range pointers
 * that the CUDA backend would report as illegal addresses. */
PS_INTERNAL int ps_is_live_range(const void *ptr, uint64_t bytes);

/* PS_OK when each of the n indices lies in [0, rows); else fails naming `fn` and the first index
 * outside (the gathers of ps_gather_rows and ps_image_augment; CUDA skips such a row). */
PS_INTERNAL int ps_check_row_indices(const char *fn, const int32_t *indices, int32_t n,
                                     int64_t rows);

#endif /* PINSTREAM_CPU_COMMON_H */
