/*
 * threads.h — the CPU backend's one thread runtime (threads.c): a small pool that every
 * parallel kernel uses (GEMM, convolutions, element-wise and normalization ops, image
 * augmentation), and per-thread workspaces. Why not OpenMP, and the pool's protocol: see
 * threads.c.
 */
#ifndef PINSTREAM_CPU_THREADS_H
#define PINSTREAM_CPU_THREADS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* One index of a ps_pool_for job. */
typedef void (*ps_task)(void *ctx, int64_t i);
/* One range [begin, end) of a ps_pool_range job. */
typedef void (*ps_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Threads that run a ps_pool_for (the caller and the helpers), for sizing per-thread scratch
 * and splitting work. Starts the helpers on first use. */
PS_INTERNAL int ps_pool_threads(void);

/* Runs fn(ctx, i) for i in [0, n) on the calling thread plus the helpers; returns when every
 * index has run. Indices run in any order and on any thread: each must write its own outputs. */
PS_INTERNAL void ps_pool_for(int64_t n, ps_task fn, void *ctx);

/* fn(ctx, begin, end) over [0, total) in pieces of `grain`; serial (one call) when `work` (a
 * rough count of elements touched) is below `min_work`, too small to pay for waking a helper. */
PS_INTERNAL void ps_pool_range_min(int64_t total, int64_t grain, int64_t work, int64_t min_work,
                                   ps_range_fn fn, void *ctx);

/* A call site's record of stalls for ps_pool_range_adaptive: a zero-initialized static. */
typedef struct {
  _Atomic uint32_t skip;  /* calls still to run serially */
  _Atomic uint32_t level; /* the last backoff was 2^level calls */
} ps_pool_backoff;

/* fn(ctx, begin, end) over [0, total) in pieces of `grain` on the pool, for jobs too short to
 * survive a preempted helper: after a stall (the caller kept waiting for a helper's range) the
 * call site runs its next 2, 4, ... 4096 calls serially, then tries again (threads.c). */
PS_INTERNAL void ps_pool_range_adaptive(int64_t total, int64_t grain, ps_range_fn fn, void *ctx,
                                        ps_pool_backoff *b);

/* ps_pool_range_min with the kernels' usual threshold (64 Ki elements). */
static inline void ps_pool_range(int64_t total, int64_t grain, int64_t work, ps_range_fn fn,
                                 void *ctx) {
  ps_pool_range_min(total, grain, work, 65536, fn, ctx);
}

/* Per-thread workspaces: caches that grow to the largest size seen and are kept for the life
 * of the thread (they are not allocations of pinstream objects, so they are not counted in
 * ps_live_objects). One slot per use, so one task can hold several at once. */
enum { WS_PACK_A, WS_PACK_B, WS_COL, WS_OUT, WS_IMG, WS_MM_PACK, WS_MM_OUT, WS_CALL, WS_COUNT };

/* A 64-byte aligned float buffer of at least n elements for this thread, or NULL. */
PS_INTERNAL float *ps_workspace(int slot, size_t n);

/* The calling thread's scratch for one call's own use outside pool tasks (WS_CALL): like
 * ps_workspace, and each growth counts in ps_scratch_allocations. One per call at a time. */
PS_INTERNAL float *ps_call_scratch(size_t n);

/* Growths of ps_call_scratch so far (ps_scratch_allocations). */
PS_INTERNAL int64_t ps_call_scratch_growths(void);

#endif /* PINSTREAM_CPU_THREADS_H */
