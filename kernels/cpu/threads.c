/*
 * threads.c — the CPU backend's thread pool and per-thread workspaces (threads.h).
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* dladdr */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <dlfcn.h>
#endif

#include "threads.h"

/* ---- thread pool --------------------------------------------------------------------- */

/*
 * ps_pool_for(n, fn, ctx) runs fn(ctx, i) for i in [0, n) on the calling thread plus one helper
 * per other CPU. Why not OpenMP: on this project's 2-core machines the kernels share the
 * cores with data-loading workers and other processes, and libgomp's default barrier (spin
 * ~300k iterations, then wait for every thread) made a training step up to 6x slower as soon
 * as a third thread was runnable (measured: 700 vs 4,600 samples/s on the small CNN).
 * Here indices are claimed one at a time from a shared counter, so whichever threads are
 * actually running do the work; the caller waits only for indices already started; idle
 * helpers spin ~20 us and then sleep on a condition variable.
 *
 * Protocol: `ticket` packs (job generation << 32 | next index) and `limit` packs
 * (generation << 32 | n). A helper claims an index with a CAS that also checks the
 * generation; a claimed index below n keeps the job incomplete (done < n), and the caller
 * rewrites fn/ctx only after done == n, so a claimed index always reads its own job's
 * fn/ctx. One caller at a time: a concurrent caller (another JS thread) runs its loop
 * serially instead of waiting.
 */
static struct {
  pthread_once_t once;
  pthread_mutex_t call_mu, sleep_mu;
  pthread_cond_t wake;
  _Atomic uint64_t ticket, limit;
  _Atomic int64_t done;
  _Atomic uint32_t wake_gen;
  ps_task fn;
  void *ctx;
  uint32_t gen;
  int helpers;
} pool = {
    .once = PTHREAD_ONCE_INIT,
    .call_mu = PTHREAD_MUTEX_INITIALIZER,
    .sleep_mu = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claims and runs indices of job `gen` until none are left. */
static void pool_work(uint32_t gen) {
  uint64_t lim = atomic_load_explicit(&pool.limit, memory_order_acquire);
  if ((uint32_t)(lim >> 32) != gen) return;
  uint64_t n = lim & 0xffffffffu;
  uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(t >> 32) != gen || (t & 0xffffffffu) >= n) return;
    if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue;
    pool.fn(pool.ctx, (int64_t)(t & 0xffffffffu));
    atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
  }
}

static void *pool_helper(void *arg) {
  (void)arg;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = atomic_load_explicit(&pool.wake_gen, memory_order_acquire);
    if (g == seen) {
      int64_t until = now_ns() + 20000;
      for (int i = 0; g == seen; i++) {
        cpu_relax();
        g = atomic_load_explicit(&pool.wake_gen, memory_order_acquire);
        if ((i & 63) == 63 && now_ns() > until) break;
      }
      if (g == seen) {
        pthread_mutex_lock(&pool.sleep_mu);
        while ((g = atomic_load_explicit(&pool.wake_gen, memory_order_acquire)) == seen)
          pthread_cond_wait(&pool.wake, &pool.sleep_mu);
        pthread_mutex_unlock(&pool.sleep_mu);
      }
    }
    seen = g;
    pool_work(g);
  }
  return NULL;
}

static void pool_start(void) {
  const char *env = getenv("PINSTREAM_NUM_THREADS");
  if (!env || !*env) env = getenv("OMP_NUM_THREADS");
  long cpus = env && *env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 1) cpus = 1;
  if (cpus > 64) cpus = 64;
#if defined(__GLIBC__)
  /* The helpers run this library's code for the life of the process: keep it mapped when
   * Deno dlcloses it (disposing the last Device), or they would crash on their next wake. */
  Dl_info info;
  if (cpus > 1 && dladdr((void *)&pool_helper, &info) && info.dli_fname &&
      dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == NULL)
    cpus = 1;
#endif
  for (long i = 1; i < cpus; i++) {
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, pool_helper, NULL) == 0) pool.helpers++;
    pthread_attr_destroy(&at);
  }
}

int ps_pool_threads(void) {
  pthread_once(&pool.once, pool_start);
  return pool.helpers + 1;
}

/* ps_pool_for; with `stall_ns`, also how long the caller waited, after running out of indices,
 * for indices that helpers had started (0 when it ran them all itself). */
static void pool_for(int64_t n, ps_task fn, void *ctx, int64_t *stall_ns) {
  if (stall_ns) *stall_ns = 0;
  if (n <= 0) return;
  if (n == 1 || n > 0xffffffffLL || ps_pool_threads() == 1 ||
      pthread_mutex_trylock(&pool.call_mu)) {
    for (int64_t i = 0; i < n; i++) fn(ctx, i);
    return;
  }
  uint32_t gen = ++pool.gen;
  if (gen == 0) gen = ++pool.gen; /* 0 is the helpers' initial "seen" */
  pool.fn = fn;
  pool.ctx = ctx;
  atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
  atomic_store_explicit(&pool.limit, ((uint64_t)gen << 32) | (uint64_t)n, memory_order_release);
  atomic_store_explicit(&pool.ticket, (uint64_t)gen << 32, memory_order_release);
  pthread_mutex_lock(&pool.sleep_mu);
  atomic_store_explicit(&pool.wake_gen, gen, memory_order_release);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.sleep_mu);
  pool_work(gen);
  /* Wait for indices that helpers started; yield so a preempted one can finish. */
  const int64_t t0 =
      stall_ns && atomic_load_explicit(&pool.done, memory_order_acquire) < n ? now_ns() : 0;
  for (int i = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < n; i++) {
    if (i < 4096)
      cpu_relax();
    else
      sched_yield();
  }
  if (t0) *stall_ns = now_ns() - t0;
  pthread_mutex_unlock(&pool.call_mu);
}

void ps_pool_for(int64_t n, ps_task fn, void *ctx) { pool_for(n, fn, ctx, NULL); }

typedef struct {
  ps_range_fn fn;
  void *ctx;
  int64_t total, grain;
} range_ctx;

static void range_task(void *vctx, int64_t i) {
  const range_ctx *r = vctx;
  int64_t b = i * r->grain, e = b + r->grain < r->total ? b + r->grain : r->total;
  r->fn(r->ctx, b, e);
}

void ps_pool_range_min(int64_t total, int64_t grain, int64_t work, int64_t min_work, ps_range_fn fn,
                       void *ctx) {
  if (total <= 0) return;
  if (work < min_work || total <= grain) {
    fn(ctx, 0, total);
    return;
  }
  range_ctx r = {.fn = fn, .ctx = ctx, .total = total, .grain = grain};
  ps_pool_for((total + grain - 1) / grain, range_task, &r);
}

/*
 * A short job split over the pool is a gamble on the other cores being free: a helper that is
 * preempted holding a range (a loader worker or another process wanting its core) keeps the
 * caller waiting for a scheduler time slice, milliseconds, where the whole job takes tens of
 * microseconds. Measured on 2 cores with the image kernel (128 CIFAR samples, ~60 us alone):
 * split, a quiet machine gave 1.7-2.2M resident samples/s against 1.2-1.5M serial, and a
 * busy one 0.9-1.0M against 1.0-1.2M. So each call site keeps a backoff: a stall (the caller
 * waited longer than PS_STALL_NS for a started range) runs its next 2, 4, ... 4096 calls
 * serially, the first split call after that probes again, and one without a stall resets it.
 * Under steady contention the probes cost a stall every ~4096 calls; on a quiet machine every
 * call is split.
 */
#define PS_STALL_NS 50000
#define PS_BACKOFF_MAX_LEVEL 12

void ps_pool_range_adaptive(int64_t total, int64_t grain, ps_range_fn fn, void *ctx,
                            ps_pool_backoff *b) {
  if (total <= 0) return;
  if (total <= grain) { /* one range: nothing to split, and no call that counts */
    fn(ctx, 0, total);
    return;
  }
  uint32_t skip = atomic_load_explicit(&b->skip, memory_order_relaxed);
  if (skip > 0) {
    atomic_store_explicit(&b->skip, skip - 1, memory_order_relaxed);
    fn(ctx, 0, total);
    return;
  }
  range_ctx r = {.fn = fn, .ctx = ctx, .total = total, .grain = grain};
  int64_t stall = 0;
  pool_for((total + grain - 1) / grain, range_task, &r, &stall);
  if (stall > PS_STALL_NS) {
    uint32_t level = atomic_load_explicit(&b->level, memory_order_relaxed);
    if (level < PS_BACKOFF_MAX_LEVEL) level++;
    atomic_store_explicit(&b->level, level, memory_order_relaxed);
    atomic_store_explicit(&b->skip, 1u << level, memory_order_relaxed);
  } else {
    atomic_store_explicit(&b->level, 0, memory_order_relaxed);
  }
}

/* ---- workspaces ---------------------------------------------------------------------- */

static __thread float *ws_ptr[WS_COUNT];
static __thread size_t ws_cap[WS_COUNT];

static _Atomic int64_t call_scratch_growths;

float *ps_workspace(int slot, size_t n) {
  if (n > ws_cap[slot]) {
    free(ws_ptr[slot]);
    size_t bytes = ((n * sizeof(float) + 4095) & ~(size_t)4095) + 256;
    ws_ptr[slot] = aligned_alloc(64, bytes);
    ws_cap[slot] = ws_ptr[slot] ? (bytes - 256) / sizeof(float) : 0;
    if (slot == WS_CALL) atomic_fetch_add_explicit(&call_scratch_growths, 1, memory_order_relaxed);
  }
  return ws_ptr[slot];
}

float *ps_call_scratch(size_t n) { return ps_workspace(WS_CALL, n ? n : 1); }

int64_t ps_call_scratch_growths(void) {
  return atomic_load_explicit(&call_scratch_growths, memory_order_relaxed);
}
