/*
 * nn.c — CPU backend of the PS-SECTION nn kernels: the numerical reference of
 * kernels/cuda/nn.cu, and fast enough to train small CNNs on two cores.
 *
 * Storage is fp16 (activations, gradients, forward weights); all arithmetic is fp32.
 * Everything heavy is one fp32 GEMM (gemm_serial below) fed by packing routines that convert
 * fp16 -> fp32 while they copy, so the micro-kernel only ever sees fp32 panels:
 *
 *   conv forward       Y^T[P,Co]  = col^T[P,K] . W^T[K,Co]       (P = OH*OW, K = C*kh*kw)
 *   conv backward data dcol[K,P]  = W^T[K,Co] . dY[Co,P], then col2im (scatter-add)
 *   conv backward wt   dW^T[K,Co] += col[K,P] . dY^T[P,Co]       (summed over the batch)
 *
 * Packing reads rows of 16 and transposes in registers where the operand runs the other way
 * (16x16 AVX-512 transposes), so no orientation is much dearer than another; these are
 * chosen so tile sizes fit the common shapes: MR = 14 divides P = 196 and 784 (28x28 and 14x14
 * feature maps), NR = 32 divides the usual channel counts. Parallelism comes from a small
 * thread pool (par_for below): convolutions run one image per task, with no synchronization
 * inside a GEMM; plain matmul splits its output into tile ranges; elementwise kernels split
 * into ranges. Every task writes its own outputs, and the weight gradient sums fixed chunks
 * of the batch in a fixed order, so results are bit-for-bit reproducible from run to run
 * whatever the scheduling (checkpoint/resume tests rely on it).
 *
 * Workspaces are per-thread caches that grow to the largest size seen and are kept for the
 * life of the thread (they are not allocations of pinstream objects, so they are not counted
 * in ps_live_objects).
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* dladdr */
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <dlfcn.h>
#endif

#include "../pinstream.h"
#include "common.h"

/* ---- thread pool --------------------------------------------------------------------- */

/*
 * par_for(n, fn, ctx) runs fn(ctx, i) for i in [0, n) on the calling thread plus one helper
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
typedef void (*ps_task)(void *ctx, int64_t i);

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
} pool = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL, 0, 0};

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

#if defined(_OPENMP) && defined(__GLIBC__)
#include <omp.h>
/* image.c uses OpenMP. libgomp's worker threads outlive their parallel regions, asleep
 * inside libgomp: if Deno's dlclose of this library (disposing the last Device) also
 * unmapped libgomp, they would crash the process on wake-up or at exit. NODELETE keeps
 * libgomp mapped for the life of the process. */
__attribute__((constructor)) static void pin_openmp_runtime(void) {
  Dl_info info;
  if (dladdr((void *)&omp_get_max_threads, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}
#endif

/* Threads that run a par_for (for sizing per-thread scratch). */
static int nthreads(void) {
  pthread_once(&pool.once, pool_start);
  return pool.helpers + 1;
}

static void par_for(int64_t n, ps_task fn, void *ctx) {
  if (n <= 0) return;
  if (n == 1 || n > 0xffffffffLL || nthreads() == 1 || pthread_mutex_trylock(&pool.call_mu)) {
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
  for (int i = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < n; i++) {
    if (i < 4096)
      cpu_relax();
    else
      sched_yield();
  }
  pthread_mutex_unlock(&pool.call_mu);
}

typedef void (*ps_range_fn)(void *ctx, int64_t begin, int64_t end);
typedef struct {
  ps_range_fn fn;
  void *ctx;
  int64_t total, grain;
} range_ctx_t;

static void range_task(void *vctx, int64_t i) {
  range_ctx_t *r = vctx;
  int64_t b = i * r->grain, e = b + r->grain < r->total ? b + r->grain : r->total;
  r->fn(r->ctx, b, e);
}

/* fn(ctx, begin, end) over [0, total) in pieces of `grain`; serial when `work` (a rough
 * count of elements touched) is too small to pay for waking a helper. */
static void par_range(int64_t total, int64_t grain, int64_t work, ps_range_fn fn, void *ctx) {
  if (total <= 0) return;
  if (work < 65536 || total <= grain) {
    fn(ctx, 0, total);
    return;
  }
  range_ctx_t r = {fn, ctx, total, grain};
  par_for((total + grain - 1) / grain, range_task, &r);
}

/* ---- fp16 ---------------------------------------------------------------------------- */

#if defined(__FLT16_MAX__)
typedef _Float16 half;
static inline float h2f(half h) { return (float)h; }
static inline half f2h(float f) { return (half)f; } /* round to nearest even */
#else
/* No _Float16 in this compiler: IEEE binary16 bits, converted by hand (RNE). */
typedef uint16_t half;
static inline float h2f(half h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else { /* subnormal: normalize */
    e = 113u;
    while (!(m & 0x400u)) m <<= 1, e--;
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline half f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return (half)(sign | (mag > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (mag >= 0x477ff000u) return (half)(sign | 0x7c00u);
  if (mag < 0x38800000u) {
    if (mag < 0x33000000u) return (half)sign;
    uint32_t e = mag >> 23, m = (mag & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), hf = 1u << (shift - 1u);
    if (rem > hf || (rem == hf && (h & 1u))) h++;
    return (half)(sign | h);
  }
  uint32_t h = (mag - 0x38000000u) >> 13, rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (half)(sign | h);
}
#endif

/* fp16 <-> fp32 rows. GCC 12 leaves these loops scalar, so the 16-wide form is spelled out. */
static void h2f_row(const half *s, float *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
  if (i < n) { /* masked tail: rows here are often shorter than 16 */
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
  }
#else
  for (; i < n; i++) d[i] = h2f(s[i]);
#endif
}
static void f2h_row(const float *s, half *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(d + i, m,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), _MM_FROUND_TO_NEAREST_INT));
  }
#else
  for (; i < n; i++) d[i] = f2h(s[i]);
#endif
}

#if defined(__AVX512F__)
static inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}
/* Up to 16 values of a row (fp16 or fp32) as fp32 lanes, zero past n. */
static inline __m512 load16(const void *p, int f16, int64_t n) {
  __mmask16 m = mask16(n);
  return f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)) : _mm512_maskz_loadu_ps(m, p);
}
/* In-register transpose of 16 rows of 16 floats: r[i] lane j <- r[j] lane i. */
static inline void tr16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; g++) {
    r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  /* r[4g + e], 128-bit lane L, now holds rows 4g..4g+3 of column 4L + e. */
  for (int e = 0; e < 4; e++) {
    __m512 a0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
    __m512 a1 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xdd);
    __m512 a2 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
    __m512 a3 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xdd);
    t[e] = _mm512_shuffle_f32x4(a0, a2, 0x88);      /* column e */
    t[8 + e] = _mm512_shuffle_f32x4(a0, a2, 0xdd);  /* column 8 + e */
    t[4 + e] = _mm512_shuffle_f32x4(a1, a3, 0x88);  /* column 4 + e */
    t[12 + e] = _mm512_shuffle_f32x4(a1, a3, 0xdd); /* column 12 + e */
  }
  for (int i = 0; i < 16; i++) r[i] = t[i];
}
#endif

/* d[j*ldd + i] = (float) s[i*lds + j] for i < rows, j < cols: a transposing copy from fp16
 * or fp32 into fp32, in 16x16 register blocks. */
static void transpose_to_f32(const void *s, int f16, int64_t lds, int64_t rows, int64_t cols,
                             float *d, int64_t ldd) {
#if defined(__AVX512F__)
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    int64_t ri = rows - i0 < 16 ? rows - i0 : 16;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      int64_t cj = cols - j0 < 16 ? cols - j0 : 16;
      __m512 r[16];
      for (int64_t i = 0; i < 16; i++)
        r[i] = i < ri ? load16(f16 ? (const void *)((const half *)s + (i0 + i) * lds + j0)
                                   : (const void *)((const float *)s + (i0 + i) * lds + j0),
                               f16, cj)
                      : _mm512_setzero_ps();
      tr16(r);
      __mmask16 m = mask16(ri);
      for (int64_t j = 0; j < cj; j++) _mm512_mask_storeu_ps(d + (j0 + j) * ldd + i0, m, r[j]);
    }
  }
#else
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++)
      d[j * ldd + i] = f16 ? h2f(((const half *)s)[i * lds + j]) : ((const float *)s)[i * lds + j];
#endif
}

/* d[j*ldd + i] = (fp16) s[i*lds + j] for i < rows, j < cols (fp32 -> fp16, transposed). */
static void transpose_to_f16(const float *s, int64_t lds, int64_t rows, int64_t cols, half *d,
                             int64_t ldd) {
#if defined(__AVX512F__)
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    int64_t ri = rows - i0 < 16 ? rows - i0 : 16;
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      int64_t cj = cols - j0 < 16 ? cols - j0 : 16;
      __m512 r[16];
      for (int64_t i = 0; i < 16; i++)
        r[i] = i < ri ? load16(s + (i0 + i) * lds + j0, 0, cj) : _mm512_setzero_ps();
      tr16(r);
      __mmask16 m = mask16(ri);
      for (int64_t j = 0; j < cj; j++)
        _mm256_mask_storeu_epi16(d + (j0 + j) * ldd + i0, m,
                                 _mm512_cvtps_ph(r[j], _MM_FROUND_TO_NEAREST_INT));
    }
  }
#else
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) d[j * ldd + i] = f2h(s[i * lds + j]);
#endif
}

/* Sum of an fp16 row in fp32 (16 lanes, then the lanes: not the sequential order). */
static float sum_row(const half *s, int64_t n) {
  int64_t i = 0;
  float t = 0.0f;
#if defined(__AVX512F__)
  __m512 a = _mm512_setzero_ps();
  for (; i < n; i += 16) a = _mm512_add_ps(a, load16(s + i, 1, n - i));
  t = _mm512_reduce_add_ps(a);
#endif
  for (; i < n; i++) t += h2f(s[i]);
  return t;
}

/* ---- workspaces ---------------------------------------------------------------------- */

enum { WS_PACK_A, WS_PACK_B, WS_COL, WS_OUT, WS_IMG, WS_PART, WS_COUNT };
static __thread float *ws_ptr[WS_COUNT];
static __thread size_t ws_cap[WS_COUNT];

/* A 64-byte aligned float buffer of at least n elements for this thread, or NULL. */
static float *ws(int slot, size_t n) {
  if (n > ws_cap[slot]) {
    free(ws_ptr[slot]);
    size_t bytes = ((n * sizeof(float) + 4095) & ~(size_t)4095) + 256;
    ws_ptr[slot] = aligned_alloc(64, bytes);
    ws_cap[slot] = ws_ptr[slot] ? (bytes - 256) / sizeof(float) : 0;
  }
  return ws_ptr[slot];
}

/* ---- GEMM ---------------------------------------------------------------------------- */

/*
 * C[M,N] (fp32, leading dimension ldc) = (acc ? C : 0) + A[M,K] . B[K,N].
 *
 * Operands are strided views (element (i,j) at p[i*rs + j*cs]) of fp16 or fp32 memory, so
 * transposes cost nothing but a different packing path. Blocking (BLIS style): B is packed
 * in KC x NC blocks into NR-wide k-major panels, A in MC x KC blocks into MR-tall panels; the
 * 14x32 micro-kernel keeps 28 zmm accumulators (of 32 registers) and per k step loads two B
 * vectors and broadcasts 14 A values: 28 FMAs to 16 loads, so two FMA ports stay busy.
 * KC <= 256 keeps one B micro-panel (32 x 256 x 4 B = 32 KiB) in the 48 KiB L1 while the
 * A panels stream from L2.
 *
 * Performance (Xeon Sapphire Rapids, AVX-512, 2 cores at ~2.3-3 GHz; peak 64 fp32
 * FLOP/cycle/core, i.e. ~150-190 GFLOP/s per core). Predicted before tuning: ~60-70% of
 * peak on large square GEMMs (~200 GFLOP/s on 2 cores) and ~50% on the CNN's conv shapes,
 * where im2col and packing are 15-25% of the work.
 *
 * Measured (bench/kernels.ts, 2 threads, batch 128, quiet machine):
 *   matmul 1024^3 -> f32                       ~290 GFLOP/s (as predicted: the micro-kernel
 *                                              runs near peak once packing is amortized)
 *   conv 32->64 3x3 on 14x14: fwd / bwd-data / bwd-weight   ~175 / ~155 / ~175 GFLOP/s
 *   conv 1->32 3x3 on 28x28 (K = 9: tile overhead dominates)  ~70 / ~85 / ~65 GFLOP/s
 * The first version reached only 60 / 87 / 98 GFLOP/s on conv2: the transposing paths
 * (scalar conversions in the conv epilogue and packing) cost more than the FMAs; 16x16
 * register transposes and masked short rows fixed that (~3x on the forward).
 * The machine is shared: with other processes on the two cores these numbers drop 2-4x.
 */
#define MR 14
#define NR 32
#define KC_MAX 256
#define MC (MR * 24)
#define NC (NR * 16)

typedef struct {
  const void *p;
  int f16;
  int64_t rs, cs;
} mat_t;

static inline float mat_at(const mat_t *m, int64_t i, int64_t j) {
  int64_t o = i * m->rs + j * m->cs;
  return m->f16 ? h2f(((const half *)m->p)[o]) : ((const float *)m->p)[o];
}

/* Packs rows [i0, i0+mc) x cols [k0, k0+kc) of A into MR-tall panels, each k-major
 * (dst[panel*MR*kc + k*MR + i]), zero-padding the last panel. */
static void pack_a(float *restrict dst, const mat_t *a, int64_t i0, int64_t mc, int64_t k0,
                   int64_t kc) {
  for (int64_t ip = 0; ip < mc; ip += MR) {
    int64_t rows = mc - ip < MR ? mc - ip : MR;
    float *d = dst + ip * kc;
    if (a->rs == 1) { /* the MR rows of one k are contiguous */
#if defined(__AVX512F__)
      __mmask16 mk = (__mmask16)((1u << rows) - 1u);
      if (a->f16) {
        const half *s = (const half *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs)
          _mm512_mask_storeu_ps(d + k * MR, 0x3fff,
                                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, s)));
      } else {
        const float *s = (const float *)a->p + (i0 + ip) + k0 * a->cs;
        for (int64_t k = 0; k < kc; k++, s += a->cs)
          _mm512_mask_storeu_ps(d + k * MR, 0x3fff, _mm512_maskz_loadu_ps(mk, s));
      }
      continue;
#endif
    }
    if (rows < MR)
      for (int64_t k = 0; k < kc; k++)
        for (int64_t i = rows; i < MR; i++) d[k * MR + i] = 0.0f;
    if (a->cs == 1) { /* each row is contiguous along k: transpose while packing */
      int64_t off = (i0 + ip) * a->rs + k0;
      transpose_to_f32(a->f16 ? (const void *)((const half *)a->p + off)
                              : (const void *)((const float *)a->p + off),
                       a->f16, a->rs, rows, kc, d, MR);
    } else {
      for (int64_t k = 0; k < kc; k++)
        for (int64_t i = 0; i < rows; i++) d[k * MR + i] = mat_at(a, i0 + ip + i, k0 + k);
    }
  }
}

/* Packs rows [k0, k0+kc) x cols [j0, j0+nc) of B into NR-wide panels, each k-major
 * (dst[panel*NR*kc + k*NR + j]), zero-padding the last panel. */
static void pack_b(float *restrict dst, const mat_t *b, int64_t k0, int64_t kc, int64_t j0,
                   int64_t nc) {
  for (int64_t jp = 0; jp < nc; jp += NR) {
    int64_t cols = nc - jp < NR ? nc - jp : NR;
    float *d = dst + jp * kc;
    if (b->cs == 1) { /* the NR columns of one k are contiguous */
#if defined(__AVX512F__)
      uint32_t bits = cols >= 32 ? 0xffffffffu : ((1u << cols) - 1u);
      __mmask16 m0 = (__mmask16)(bits & 0xffffu), m1 = (__mmask16)(bits >> 16);
      if (b->f16) {
        const half *s = (const half *)b->p + k0 * b->rs + j0 + jp;
        for (int64_t k = 0; k < kc; k++, s += b->rs) {
          _mm512_store_ps(d + k * NR, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, s)));
          _mm512_store_ps(d + k * NR + 16,
                          _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, s + 16)));
        }
      } else {
        const float *s = (const float *)b->p + k0 * b->rs + j0 + jp;
        for (int64_t k = 0; k < kc; k++, s += b->rs) {
          _mm512_store_ps(d + k * NR, _mm512_maskz_loadu_ps(m0, s));
          _mm512_store_ps(d + k * NR + 16, _mm512_maskz_loadu_ps(m1, s + 16));
        }
      }
      continue;
#else
      for (int64_t k = 0; k < kc; k++) {
        for (int64_t j = 0; j < cols; j++) d[k * NR + j] = mat_at(b, k0 + k, j0 + jp + j);
        for (int64_t j = cols; j < NR; j++) d[k * NR + j] = 0.0f;
      }
      continue;
#endif
    }
    if (cols < NR)
      for (int64_t k = 0; k < kc; k++)
        for (int64_t j = cols; j < NR; j++) d[k * NR + j] = 0.0f;
    if (b->rs == 1) { /* each column contiguous along k: transpose while packing */
      int64_t off = (j0 + jp) * b->cs + k0;
      transpose_to_f32(b->f16 ? (const void *)((const half *)b->p + off)
                              : (const void *)((const float *)b->p + off),
                       b->f16, b->cs, cols, kc, d, NR);
    } else {
      for (int64_t k = 0; k < kc; k++)
        for (int64_t j = 0; j < cols; j++) d[k * NR + j] = mat_at(b, k0 + k, j0 + jp + j);
    }
  }
}

/* c[MR x NR] (ldc) = (first ? 0 : c) + a_panel . b_panel over kc. */
static void kernel_14x32(int64_t kc, const float *restrict a, const float *restrict b,
                         float *restrict c, int64_t ldc, int first) {
#if defined(__AVX512F__)
#define PS_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define PS_DECL(i) __m512 c##i##a = _mm512_setzero_ps(), c##i##b = _mm512_setzero_ps();
#define PS_FMA(i)                                                                          \
  {                                                                                        \
    __m512 ai = _mm512_set1_ps(a[i]);                                                      \
    c##i##a = _mm512_fmadd_ps(ai, b0, c##i##a);                                            \
    c##i##b = _mm512_fmadd_ps(ai, b1, c##i##b);                                            \
  }
#define PS_STORE(i)                                                                        \
  {                                                                                        \
    float *r = c + (i) * ldc;                                                              \
    if (!first) {                                                                          \
      c##i##a = _mm512_add_ps(c##i##a, _mm512_loadu_ps(r));                                \
      c##i##b = _mm512_add_ps(c##i##b, _mm512_loadu_ps(r + 16));                           \
    }                                                                                      \
    _mm512_storeu_ps(r, c##i##a);                                                          \
    _mm512_storeu_ps(r + 16, c##i##b);                                                     \
  }
  PS_ROWS(PS_DECL)
  for (int64_t k = 0; k < kc; k++) {
    __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
    PS_ROWS(PS_FMA)
    a += MR;
    b += NR;
  }
  PS_ROWS(PS_STORE)
#undef PS_ROWS
#undef PS_DECL
#undef PS_FMA
#undef PS_STORE
#else
  float acc[MR][NR];
  memset(acc, 0, sizeof acc);
  for (int64_t k = 0; k < kc; k++, a += MR, b += NR)
    for (int i = 0; i < MR; i++)
      for (int j = 0; j < NR; j++) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) c[i * ldc + j] = (first ? 0.0f : c[i * ldc + j]) + acc[i][j];
#endif
}

/* One thread's GEMM (see the comment above); returns 0, or -1 when out of memory. */
static int gemm_serial(int64_t M, int64_t N, int64_t K, const mat_t *A, const mat_t *B, float *C,
                       int64_t ldc, int acc) {
  if (M <= 0 || N <= 0) return 0;
  if (K <= 0) {
    if (!acc)
      for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
    return 0;
  }
  /* Split K evenly into blocks of at most KC_MAX (288 -> 2 x 144, not 256 + 32). */
  int64_t nkb = (K + KC_MAX - 1) / KC_MAX, kcb = (K + nkb - 1) / nkb;
  int64_t ncap = N < NC ? (N + NR - 1) / NR * NR : NC, mcap = M < MC ? (M + MR - 1) / MR * MR : MC;
  float *pa = ws(WS_PACK_A, (size_t)(mcap * kcb)), *pb = ws(WS_PACK_B, (size_t)(ncap * kcb));
  if (!pa || !pb) return -1;
  float tile[MR * NR] __attribute__((aligned(64)));
  for (int64_t jc = 0; jc < N; jc += NC) {
    int64_t nc = N - jc < NC ? N - jc : NC;
    for (int64_t pc = 0; pc < K; pc += kcb) {
      int64_t kc = K - pc < kcb ? K - pc : kcb;
      int first = pc == 0 && !acc;
      pack_b(pb, B, pc, kc, jc, nc);
      for (int64_t ic = 0; ic < M; ic += MC) {
        int64_t mc = M - ic < MC ? M - ic : MC;
        pack_a(pa, A, ic, mc, pc, kc);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          int64_t nr = nc - jr < NR ? nc - jr : NR;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t mr = mc - ir < MR ? mc - ir : MR;
            float *c = C + (ic + ir) * ldc + jc + jr;
            if (mr == MR && nr == NR) {
              kernel_14x32(kc, pa + ir * kc, pb + jr * kc, c, ldc, first);
            } else {
              kernel_14x32(kc, pa + ir * kc, pb + jr * kc, tile, NR, 1);
              for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < nr; j++)
                  c[i * ldc + j] = (first ? 0.0f : c[i * ldc + j]) + tile[i * NR + j];
            }
          }
        }
      }
    }
  }
  return 0;
}

/* ---- argument checks ----------------------------------------------------------------- */

#define CHECK_RANGE(ptr, bytes)                                                            \
  do {                                                                                     \
    if ((bytes) > 0 && !ps_is_live_range((ptr), (uint64_t)(bytes)))                        \
      PS_FAIL(PS_ERR_INVALID_ARGUMENT,                                                     \
              "%s: %s (%p, %llu bytes) is not inside one live device allocation",         \
              __func__, #ptr, (const void *)(ptr), (unsigned long long)(bytes));           \
  } while (0)
#define CHECK_DTYPE(dt) TRY(ps_check_dtype(__func__, #dt, (dt)))
#define OOM() PS_FAIL(PS_ERR_OUT_OF_MEMORY, "%s: no memory for a workspace", __func__)

static int64_t dtsize(int32_t dt) { return dt == PS_NN_F16 ? 2 : 4; }

/* ---- matmul -------------------------------------------------------------------------- */

typedef struct {
  const mat_t *A, *B;
  const void *a, *b;
  float *out;
  int64_t m, n, k;
  int acc, split_m;
  int64_t tiles, parts;
  _Atomic int failed;
} mm_ctx_t;

static void mm_task(void *vctx, int64_t p) {
  mm_ctx_t *x = vctx;
  int64_t t0 = x->tiles * p / x->parts, t1 = x->tiles * (p + 1) / x->parts;
  int bad;
  if (x->split_m) {
    int64_t i0 = t0 * MR, i1 = t1 * MR < x->m ? t1 * MR : x->m;
    mat_t Ap = *x->A;
    Ap.p = (const half *)x->a + i0 * Ap.rs;
    bad = gemm_serial(i1 - i0, x->n, x->k, &Ap, x->B, x->out + i0 * x->n, x->n, x->acc);
  } else {
    int64_t j0 = t0 * NR, j1 = t1 * NR < x->n ? t1 * NR : x->n;
    mat_t Bp = *x->B;
    Bp.p = (const half *)x->b + j0 * Bp.cs;
    bad = gemm_serial(x->m, j1 - j0, x->k, x->A, &Bp, x->out + j0, x->n, x->acc);
  }
  if (bad) atomic_store(&x->failed, 1);
}

PS_API int ps_nn_matmul(const void *a, const void *b, void *c, int32_t c_dtype, int64_t m,
                        int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                        int32_t accumulate, void *stream) {
  (void)stream;
  CHECK_DTYPE(c_dtype);
  TRY(ps_check_matmul(m, n, k));
  if (m == 0 || n == 0) return PS_OK;
  CHECK_RANGE(a, m * k * 2);
  CHECK_RANGE(b, k * n * 2);
  CHECK_RANGE(c, m * n * dtsize(c_dtype));
  mat_t A = {a, 1, trans_a ? 1 : k, trans_a ? m : 1};
  mat_t B = {b, 1, trans_b ? 1 : n, trans_b ? k : 1};
  /* f32 output is accumulated in place; fp16 output goes through an fp32 buffer. */
  float *out = c_dtype == PS_NN_F32 ? (float *)c : NULL;
  float *tmp = NULL;
  if (!out) {
    tmp = aligned_alloc(64, (((size_t)(m * n) * 4 + 63) & ~(size_t)63));
    if (!tmp) OOM();
    out = tmp;
  }
  int acc = accumulate && c_dtype == PS_NN_F32;
  /* Split the longer side, in whole tiles, into about 2 parts per thread. */
  int64_t mt = (m + MR - 1) / MR, ntl = (n + NR - 1) / NR;
  int split_m = mt >= ntl;
  int64_t tiles = split_m ? mt : ntl, want = 2 * (int64_t)nthreads();
  int64_t parts = (double)m * n * k < 1e5 || tiles < 2 ? 1 : (tiles < want ? tiles : want);
  mm_ctx_t mc = {&A, &B, a, b, out, m, n, k, acc, split_m, tiles, parts, 0};
  par_for(parts, mm_task, &mc);
  int failed = atomic_load(&mc.failed);
  if (!failed && tmp) {
    half *ch = (half *)c;
    int64_t total = m * n;
    if (accumulate) {
      for (int64_t i = 0; i < total; i++) ch[i] = f2h(tmp[i] + h2f(ch[i]));
    } else {
      f2h_row(tmp, ch, total);
    }
  }
  free(tmp);
  if (failed) OOM();
  return PS_OK;
}

/* ---- convolution --------------------------------------------------------------------- */

typedef ps_conv_geo conv_t;

/* Output columns ox whose input column ox*s + kx - pad lies in [0, w): [lo, hi). */
static void ox_range(const conv_t *g, int64_t kx, int64_t *lo, int64_t *hi) {
  int64_t off = kx - g->pad;
  int64_t l = off >= 0 ? 0 : (-off + g->s - 1) / g->s;
  int64_t h = (g->w - 1 - off) < 0 ? 0 : (g->w - 1 - off) / g->s + 1;
  if (h > g->ow) h = g->ow;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

/*
 * "Same" convolutions at stride 1 (ow == w, e.g. 3x3 with padding 1) have a faster im2col:
 * row (c, ky, kx) of col is the input plane shifted by off = (ky - pad)*w + (kx - pad), so
 * output rows [oy_lo, oy_hi) are one contiguous copy, after which the few columns that
 * wrapped around from the neighbouring row (ox < lo or ox >= hi) are zeroed. This replaces
 * one short copy per output row (most of im2col's cost at 14x14) by one long one.
 */
typedef struct {
  int64_t off, q0, q1, qa, qb, lo, hi;
} shift_t;

/* Zeroes n floats inline: the runs here are a row or two, shorter than a memset call is
 * worth (the calls were 6% of a 14x14 convolution's time). */
static inline void zero_f(float *d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i < n; i += 16) _mm512_mask_storeu_ps(d + i, mask16(n - i), _mm512_setzero_ps());
#endif
  for (; i < n; i++) d[i] = 0.0f;
}

static int is_same_s1(const conv_t *g) { return g->s == 1 && g->ow == g->w && g->oh == g->h; }

static void shift_of(const conv_t *g, int64_t ky, int64_t kx, shift_t *t) {
  int64_t HW = g->h * g->w;
  int64_t oy_lo = g->pad - ky > 0 ? g->pad - ky : 0;
  int64_t oy_hi = g->h + g->pad - ky < g->oh ? g->h + g->pad - ky : g->oh;
  if (oy_hi < oy_lo) oy_hi = oy_lo;
  t->off = (ky - g->pad) * g->w + (kx - g->pad);
  t->q0 = oy_lo * g->ow;
  t->q1 = oy_hi * g->ow;
  /* the part of [q0, q1) whose source index q + off lies inside the plane */
  t->qa = t->q0 > -t->off ? t->q0 : -t->off;
  t->qb = t->q1 < HW - t->off ? t->q1 : HW - t->off;
  if (t->qb < t->qa) t->qb = t->qa;
  ox_range(g, kx, &t->lo, &t->hi);
}

static void im2col_same(const conv_t *g, const half *x, float *col) {
  int64_t P = g->oh * g->ow, HW = g->h * g->w;
  for (int64_t ky = 0; ky < g->kh; ky++)
    for (int64_t kx = 0; kx < g->kw; kx++) {
      shift_t t;
      shift_of(g, ky, kx, &t);
      for (int64_t c = 0; c < g->c; c++) {
        float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        zero_f(row, t.qa);
        h2f_row(x + c * HW + t.qa + t.off, row + t.qa, t.qb - t.qa);
        zero_f(row + t.qb, P - t.qb);
        if (t.lo > 0 || t.hi < g->ow)
          for (int64_t q = t.q0; q < t.q1; q += g->ow) {
            for (int64_t ox = 0; ox < t.lo; ox++) row[q + ox] = 0.0f;
            for (int64_t ox = t.hi; ox < g->ow; ox++) row[q + ox] = 0.0f;
          }
      }
    }
}

/* The adjoint of im2col_same; clobbers the wrapped columns of col. */
static void col2im_same(const conv_t *g, float *col, float *img) {
  int64_t P = g->oh * g->ow, HW = g->h * g->w;
  for (int64_t ky = 0; ky < g->kh; ky++)
    for (int64_t kx = 0; kx < g->kw; kx++) {
      shift_t t;
      shift_of(g, ky, kx, &t);
      for (int64_t c = 0; c < g->c; c++) {
        float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        if (t.lo > 0 || t.hi < g->ow)
          for (int64_t q = t.q0; q < t.q1; q += g->ow) {
            for (int64_t ox = 0; ox < t.lo; ox++) row[q + ox] = 0.0f;
            for (int64_t ox = t.hi; ox < g->ow; ox++) row[q + ox] = 0.0f;
          }
        float *d = img + c * HW + t.off;
        int64_t q = t.qa;
#if defined(__AVX512F__)
        for (; q + 16 <= t.qb; q += 16)
          _mm512_storeu_ps(d + q, _mm512_add_ps(_mm512_loadu_ps(d + q), _mm512_loadu_ps(row + q)));
#endif
        for (; q < t.qb; q++) d[q] += row[q];
      }
    }
}

/* col[(c*kh + ky)*kw + kx][oy*ow + ox] = x[c][oy*s + ky - pad][ox*s + kx - pad] (0 outside). */
static void im2col(const conv_t *g, const half *x, float *col) {
  if (is_same_s1(g)) {
    im2col_same(g, x, col);
    return;
  }
  int64_t P = g->oh * g->ow;
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t ky = 0; ky < g->kh; ky++)
      for (int64_t kx = 0; kx < g->kw; kx++) {
        float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        int64_t lo, hi;
        ox_range(g, kx, &lo, &hi);
        for (int64_t oy = 0; oy < g->oh; oy++) {
          float *d = row + oy * g->ow;
          int64_t iy = oy * g->s + ky - g->pad;
          if (iy < 0 || iy >= g->h || lo >= hi) {
            memset(d, 0, (size_t)g->ow * sizeof(float));
            continue;
          }
          const half *src = x + (c * g->h + iy) * g->w + kx - g->pad;
          for (int64_t ox = 0; ox < lo; ox++) d[ox] = 0.0f;
          if (g->s == 1) {
            h2f_row(src + lo, d + lo, hi - lo);
          } else {
            for (int64_t ox = lo; ox < hi; ox++) d[ox] = h2f(src[ox * g->s]);
          }
          for (int64_t ox = hi; ox < g->ow; ox++) d[ox] = 0.0f;
        }
      }
}

/* img[c][iy][ix] += col[...] — the adjoint of im2col; img is fp32 [c][h][w]. */
static void col2im(const conv_t *g, float *col, float *img) {
  if (is_same_s1(g)) {
    col2im_same(g, col, img);
    return;
  }
  int64_t P = g->oh * g->ow;
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t ky = 0; ky < g->kh; ky++)
      for (int64_t kx = 0; kx < g->kw; kx++) {
        const float *row = col + ((c * g->kh + ky) * g->kw + kx) * P;
        int64_t lo, hi;
        ox_range(g, kx, &lo, &hi);
        for (int64_t oy = 0; oy < g->oh; oy++) {
          int64_t iy = oy * g->s + ky - g->pad;
          if (iy < 0 || iy >= g->h) continue;
          float *d = img + (c * g->h + iy) * g->w + kx - g->pad;
          const float *s = row + oy * g->ow;
          if (g->s == 1) {
            int64_t ox = lo;
#if defined(__AVX512F__)
            for (; ox < hi; ox += 16) {
              __mmask16 m = mask16(hi - ox);
              _mm512_mask_storeu_ps(d + ox, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + ox),
                                                             _mm512_maskz_loadu_ps(m, s + ox)));
            }
#endif
            for (; ox < hi; ox++) d[ox] += s[ox];
          } else {
            for (int64_t ox = lo; ox < hi; ox++) d[ox * g->s] += s[ox];
          }
        }
      }
}

typedef struct {
  const conv_t *g;
  const void *x, *w, *dy;
  void *y;
  const float *wt;
  float *part;     /* weight gradient: one [K][Co] partial per chunk */
  int64_t chunks;  /* weight gradient: images split into this many fixed chunks */
  _Atomic int failed;
} conv_ctx_t;

static void conv_fwd_task(void *vctx, int64_t i) {
  conv_ctx_t *x = vctx;
  const conv_t *g = x->g;
  int64_t K = g->c * g->kh * g->kw, P = g->oh * g->ow, co = g->co;
  float *col = ws(WS_COL, (size_t)(K * P)), *yt = ws(WS_OUT, (size_t)(P * co));
  if (!col || !yt) {
    atomic_store(&x->failed, 1);
    return;
  }
  im2col(g, (const half *)x->x + i * g->c * g->h * g->w, col);
  if (K < 64) {
    /* Short K (a first layer): the transposed store would cost more than the GEMM, so
     * compute Y[Co, P] = W . col directly and store it contiguously. */
    mat_t A = {x->w, 1, K, 1}, B = {col, 0, P, 1};
    if (gemm_serial(co, P, K, &A, &B, yt, P, 0)) {
      atomic_store(&x->failed, 1);
      return;
    }
    f2h_row(yt, (half *)x->y + i * co * P, co * P);
    return;
  }
  mat_t A = {col, 0, 1, P}, B = {x->wt, 0, co, 1};
  if (gemm_serial(P, co, K, &A, &B, yt, co, 0)) {
    atomic_store(&x->failed, 1);
    return;
  }
  transpose_to_f16(yt, co, P, co, (half *)x->y + i * co * P, P);
}

PS_API int ps_nn_conv2d_forward(const void *x, const void *w, void *y, int64_t n, int64_t c,
                                int64_t h, int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                int32_t stride, int32_t pad, void *stream) {
  (void)stream;
  conv_t g;
  int st = ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  if (n == 0) return PS_OK;
  int64_t K = c * kh * kw, P = g.oh * g.ow;
  CHECK_RANGE(x, n * c * h * w_ * 2);
  CHECK_RANGE(w, co * K * 2);
  CHECK_RANGE(y, n * co * P * 2);
  /* W^T [K][Co] in fp32 once, so the B packing reads contiguous rows. */
  float *wt = aligned_alloc(64, (((size_t)(K * co) * 4 + 63) & ~(size_t)63));
  if (!wt) OOM();
  for (int64_t o = 0; o < co; o++)
    for (int64_t k = 0; k < K; k++) wt[k * co + o] = h2f(((const half *)w)[o * K + k]);
  conv_ctx_t cx = {&g, x, w, NULL, y, wt, NULL, 0, 0};
  par_for(n, conv_fwd_task, &cx); /* one image per task */
  free(wt);
  if (atomic_load(&cx.failed)) OOM();
  return PS_OK;
}

static void conv_bwd_data_task(void *vctx, int64_t i) {
  conv_ctx_t *x = vctx;
  const conv_t *g = x->g;
  int64_t K = g->c * g->kh * g->kw, P = g->oh * g->ow, HW = g->h * g->w, co = g->co;
  float *dcol = ws(WS_COL, (size_t)(K * P)), *img = ws(WS_IMG, (size_t)(g->c * HW));
  if (!dcol || !img) {
    atomic_store(&x->failed, 1);
    return;
  }
  /* dcol[K][P] = W^T . dY: A(kk, o) = w[o*K + kk], B(o, p) = dy[o*P + p]. */
  mat_t A = {x->w, 1, 1, K}, B = {(const half *)x->dy + i * co * P, 1, P, 1};
  if (gemm_serial(K, P, co, &A, &B, dcol, P, 0)) {
    atomic_store(&x->failed, 1);
    return;
  }
  memset(img, 0, (size_t)(g->c * HW) * sizeof(float));
  col2im(g, dcol, img);
  f2h_row(img, (half *)x->y + i * g->c * HW, g->c * HW);
}

PS_API int ps_nn_conv2d_backward_data(const void *dy, const void *w, void *dx, int64_t n,
                                      int64_t c, int64_t h, int64_t w_, int64_t co,
                                      int32_t kh, int32_t kw, int32_t stride, int32_t pad,
                                      void *stream) {
  (void)stream;
  conv_t g;
  int st = ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  if (n == 0) return PS_OK;
  int64_t K = c * kh * kw, P = g.oh * g.ow, HW = h * w_;
  CHECK_RANGE(dy, n * co * P * 2);
  CHECK_RANGE(w, co * K * 2);
  CHECK_RANGE(dx, n * c * HW * 2);
  conv_ctx_t cx = {&g, NULL, w, dy, dx, NULL, NULL, 0, 0};
  par_for(n, conv_bwd_data_task, &cx); /* one image per task */
  if (atomic_load(&cx.failed)) OOM();
  return PS_OK;
}

static void conv_bwd_weight_task(void *vctx, int64_t chunk) {
  conv_ctx_t *x = vctx;
  const conv_t *g = x->g;
  int64_t K = g->c * g->kh * g->kw, P = g->oh * g->ow, HW = g->h * g->w, co = g->co;
  float *mine = x->part + chunk * K * co;
  float *col = ws(WS_COL, (size_t)(K * P));
  if (!col) {
    atomic_store(&x->failed, 1);
    return;
  }
  int64_t i0 = g->n * chunk / x->chunks, i1 = g->n * (chunk + 1) / x->chunks;
  for (int64_t i = i0; i < i1; i++) {
    im2col(g, (const half *)x->x + i * g->c * HW, col);
    /* dW^T[K][Co] (+)= col . dY^T: A(kk, p) = col[kk*P + p], B(p, o) = dy[o*P + p]. */
    mat_t A = {col, 0, P, 1}, B = {(const half *)x->dy + i * co * P, 1, 1, P};
    if (gemm_serial(K, co, P, &A, &B, mine, co, i > i0)) {
      atomic_store(&x->failed, 1);
      return;
    }
  }
}

PS_API int ps_nn_conv2d_backward_weight(const void *x, const void *dy, void *dw,
                                        int32_t dw_dtype, int64_t n, int64_t c, int64_t h,
                                        int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                        int32_t stride, int32_t pad, int32_t accumulate,
                                        void *stream) {
  (void)stream;
  CHECK_DTYPE(dw_dtype);
  conv_t g;
  int st = ps_conv_geometry(&g, __func__, n, c, h, w_, co, kh, kw, stride, pad);
  if (st) return st;
  int64_t K = c * kh * kw, P = g.oh * g.ow, HW = h * w_;
  CHECK_RANGE(x, n * c * HW * 2);
  CHECK_RANGE(dy, n * co * P * 2);
  CHECK_RANGE(dw, co * K * dtsize(dw_dtype));
  /* The batch is cut into a fixed number of chunks, each summed into its own partial and the
   * partials added in chunk order: the result does not depend on which thread ran what, so
   * it is bit-for-bit reproducible. Several chunks per thread keep a preempted thread from
   * holding the others up for long. */
  int64_t chunks = 4 * (int64_t)nthreads();
  if (chunks > n) chunks = n;
  if (chunks < 1) chunks = 1;
  float *part = aligned_alloc(64, (((size_t)(chunks * K * co) * 4 + 63) & ~(size_t)63));
  if (!part) OOM();
  if (n == 0) memset(part, 0, (size_t)(K * co) * sizeof(float));
  conv_ctx_t cx = {&g, x, NULL, dy, NULL, NULL, part, chunks, 0};
  par_for(n > 0 ? chunks : 0, conv_bwd_weight_task, &cx);
  if (atomic_load(&cx.failed)) {
    free(part);
    OOM();
  }
  /* dw[o][ci][ky][kx] = sum over chunks of part[chunk][(ci*kh + ky)*kw + kx][o] */
  for (int64_t o = 0; o < co; o++)
    for (int64_t r = 0; r < K; r++) {
      float s = 0.0f;
      for (int64_t t = 0; t < chunks; t++) s += part[t * K * co + r * co + o];
      int64_t di = o * K + r;
      if (dw_dtype == PS_NN_F32) {
        float *d = (float *)dw + di;
        *d = accumulate ? *d + s : s;
      } else {
        half *d = (half *)dw + di;
        *d = f2h(accumulate ? h2f(*d) + s : s);
      }
    }
  free(part);
  return PS_OK;
}

/* ---- pooling ------------------------------------------------------------------------- */

#if defined(__AVX512F__)
/* 2x2 stride-2 pooling of one plane, 16 outputs at a time: the even and odd columns of the
 * two input rows are de-interleaved with permutes, then compared in the scalar loop's order
 * ((0,0), (0,1), (1,0), (1,1); strictly greater wins; NaN wins over numbers). */
static void maxpool_2x2_plane(const half *xp, half *yp, int32_t *ip, int64_t w, int64_t oh,
                              int64_t ow) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (int64_t oy = 0; oy < oh; oy++) {
    const half *r0 = xp + 2 * oy * w, *r1 = r0 + w;
    for (int64_t ox = 0; ox < ow; ox += 16) {
      int64_t cnt = ow - ox < 16 ? ow - ox : 16, in = 2 * cnt;
      __m512 a0 = load16(r0 + 2 * ox, 1, in), a1 = load16(r0 + 2 * ox + 16, 1, in - 16);
      __m512 b0 = load16(r1 + 2 * ox, 1, in), b1 = load16(r1 + 2 * ox + 16, 1, in - 16);
      __m512 v[4] = {_mm512_permutex2var_ps(a0, ev, a1), _mm512_permutex2var_ps(a0, od, a1),
                     _mm512_permutex2var_ps(b0, ev, b1), _mm512_permutex2var_ps(b0, od, b1)};
      __m512i base = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * oy * w + 2 * ox)), lane2);
      const int32_t off[4] = {0, 1, (int32_t)w, (int32_t)w + 1};
      __m512 m = v[0];
      __m512i best = base;
      for (int t = 1; t < 4; t++) {
        __mmask16 gt = _mm512_cmp_ps_mask(v[t], m, _CMP_GT_OQ) |
                       (_mm512_cmp_ps_mask(v[t], v[t], _CMP_UNORD_Q) &
                        _mm512_cmp_ps_mask(m, m, _CMP_ORD_Q));
        m = _mm512_mask_mov_ps(m, gt, v[t]);
        best = _mm512_mask_mov_epi32(best, gt, _mm512_add_epi32(base, _mm512_set1_epi32(off[t])));
      }
      __mmask16 k = mask16(cnt);
      _mm256_mask_storeu_epi16(yp + oy * ow + ox, k, _mm512_cvtps_ph(m, _MM_FROUND_TO_NEAREST_INT));
      _mm512_mask_storeu_epi32(ip + oy * ow + ox, k, best);
    }
  }
}
#endif

typedef struct {
  const void *x;
  void *y;
  int32_t *idx;
  const int32_t *cidx;
  int64_t h, w, oh, ow;
  int32_t kernel, stride;
  _Atomic int bad;
} pool_ctx_t;

static void pool_fwd_range(void *vctx, int64_t p0, int64_t p1) {
  pool_ctx_t *c = vctx;
  int64_t h = c->h, w_ = c->w, oh = c->oh, ow = c->ow;
  int32_t kernel = c->kernel, stride = c->stride;
  for (int64_t pl = p0; pl < p1; pl++) {
    const half *xp = (const half *)c->x + pl * h * w_;
    half *yp = (half *)c->y + pl * oh * ow;
    int32_t *ip = c->idx ? c->idx + pl * oh * ow : NULL;
#if defined(__AVX512F__)
    if (kernel == 2 && stride == 2 && ip) {
      maxpool_2x2_plane(xp, yp, ip, w_, oh, ow);
      continue;
    }
#endif
    for (int64_t oy = 0; oy < oh; oy++)
      for (int64_t ox = 0; ox < ow; ox++) {
        int64_t y0 = oy * stride, x0 = ox * stride, best = y0 * w_ + x0;
        float m = h2f(xp[best]);
        for (int64_t ky = 0; ky < kernel; ky++)
          for (int64_t kx = 0; kx < kernel; kx++) {
            int64_t at = (y0 + ky) * w_ + x0 + kx;
            float v = h2f(xp[at]);
            if (ps_pool_takes(v, m)) m = v, best = at;
          }
        yp[oy * ow + ox] = f2h(m);
        if (ip) ip[oy * ow + ox] = (int32_t)best;
      }
  }
}

static void pool_bwd_range(void *vctx, int64_t p0, int64_t p1) {
  pool_ctx_t *c = vctx;
  int64_t hw = c->h * c->w, ohw = c->oh * c->ow;
  for (int64_t pl = p0; pl < p1; pl++) {
    half *dxp = (half *)c->y + pl * hw;
    const half *dyp = (const half *)c->x + pl * ohw;
    const int32_t *ip = c->cidx + pl * ohw;
    memset(dxp, 0, (size_t)hw * sizeof(half));
    for (int64_t i = 0; i < ohw; i++) {
      int32_t at = ip[i];
      if (at < 0 || at >= hw) {
        atomic_store(&c->bad, 1);
        break;
      }
      dxp[at] = f2h(h2f(dxp[at]) + h2f(dyp[i]));
    }
  }
}

PS_API int ps_nn_maxpool2d_forward(const void *x, void *y, int32_t *indices, int64_t n,
                                   int64_t c, int64_t h, int64_t w_, int32_t kernel,
                                   int32_t stride, void *stream) {
  (void)stream;
  TRY(ps_check_maxpool_forward(n, c, h, w_, kernel, stride));
  int64_t oh = (h - kernel) / stride + 1, ow = (w_ - kernel) / stride + 1, planes = n * c;
  if (planes == 0) return PS_OK;
  CHECK_RANGE(x, planes * h * w_ * 2);
  CHECK_RANGE(y, planes * oh * ow * 2);
  if (indices) CHECK_RANGE(indices, planes * oh * ow * 4);
  pool_ctx_t pc = {x, y, indices, NULL, h, w_, oh, ow, kernel, stride, 0};
  par_range(planes, 8, planes * h * w_, pool_fwd_range, &pc);
  return PS_OK;
}

PS_API int ps_nn_maxpool2d_backward(const void *dy, const int32_t *indices, void *dx,
                                    int64_t n, int64_t c, int64_t h, int64_t w_, int64_t oh,
                                    int64_t ow, void *stream) {
  (void)stream;
  TRY(ps_check_maxpool_backward(n, c, h, w_, oh, ow));
  int64_t planes = n * c, hw = h * w_, ohw = oh * ow;
  if (planes == 0) return PS_OK;
  CHECK_RANGE(dy, planes * ohw * 2);
  CHECK_RANGE(indices, planes * ohw * 4);
  CHECK_RANGE(dx, planes * hw * 2);
  pool_ctx_t pc = {dy, dx, NULL, indices, h, w_, oh, ow, 0, 0, 0};
  par_range(planes, 8, planes * hw, pool_bwd_range, &pc);
  int bad = atomic_load(&pc.bad);
  if (bad) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_maxpool2d_backward: index out of range");
  return PS_OK;
}

/* ---- batch normalization ------------------------------------------------------------- */

typedef struct {
  const void *x, *dy;
  void *y;
  const float *gamma, *beta, *save_mean, *save_invstd, *run_mean_c, *run_var_c;
  float *save_mean_w, *save_invstd_w, *run_mean, *run_var, *dgamma, *dbeta;
  int64_t n, c, hw;
  float momentum, eps;
} bn_ctx_t;

/* Batch norm walks each channel plane in chunks converted to fp32 with h2f_row, and reduces
 * them in 16 independent float lanes: GCC 12 neither vectorizes _Float16 conversions nor a
 * reduction into one accumulator (a serial chain of dependent adds, in double it was ~10x
 * slower than memory speed). Lane sums cover at most BN_CHUNK values; chunks add up in
 * double, so accuracy does not depend on the batch size. */
#define BN_CHUNK 1024
#define BN_LANES 16

static inline float lanes_total(const float acc[BN_LANES]) {
  float t = 0.0f;
  for (int l = 0; l < BN_LANES; l++) t += acc[l];
  return t;
}

static float chunk_sum(const float *v, int64_t n) {
  float acc[BN_LANES] = {0};
  int64_t j = 0;
  for (; j + BN_LANES <= n; j += BN_LANES)
    for (int l = 0; l < BN_LANES; l++) acc[l] += v[j + l];
  for (; j < n; j++) acc[0] += v[j];
  return lanes_total(acc);
}

static float chunk_sqdev(const float *v, int64_t n, float mean) {
  float acc[BN_LANES] = {0};
  int64_t j = 0;
  for (; j + BN_LANES <= n; j += BN_LANES)
    for (int l = 0; l < BN_LANES; l++) {
      float d = v[j + l] - mean;
      acc[l] += d * d;
    }
  for (; j < n; j++) acc[0] += (v[j] - mean) * (v[j] - mean);
  return lanes_total(acc);
}

/* y = x * a + b over one plane of fp16 values. */
static void plane_affine(const half *p, half *q, int64_t hw, float a, float b) {
  float buf[BN_CHUNK];
  for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
    int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
    h2f_row(p + j0, buf, m);
    for (int64_t j = 0; j < m; j++) buf[j] = buf[j] * a + b;
    f2h_row(buf, q + j0, m);
  }
}

static void bn_train_range(void *vctx, int64_t c0, int64_t c1) {
  bn_ctx_t *k = vctx;
  const half *xh = (const half *)k->x;
  half *yh = (half *)k->y;
  const float *gamma = k->gamma, *beta = k->beta;
  float *save_mean = k->save_mean_w, *save_invstd = k->save_invstd_w;
  float *run_mean = k->run_mean, *run_var = k->run_var, momentum = k->momentum, eps = k->eps;
  int64_t n = k->n, c = k->c, hw = k->hw, cnt = n * hw;
  float buf[BN_CHUNK];
  for (int64_t ch = c0; ch < c1; ch++) {
    /* Two passes (mean, then squared deviations): no cancellation for any data. */
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
      const half *p = xh + (i * c + ch) * hw;
      for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
        int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
        h2f_row(p + j0, buf, m);
        s += chunk_sum(buf, m);
      }
    }
    double mean = s / (double)cnt, ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
      const half *p = xh + (i * c + ch) * hw;
      for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
        int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
        h2f_row(p + j0, buf, m);
        ss += chunk_sqdev(buf, m, (float)mean);
      }
    }
    double var = ss / (double)cnt;
    float invstd = (float)(1.0 / sqrt(var + eps));
    save_mean[ch] = (float)mean;
    save_invstd[ch] = invstd;
    if (run_mean) run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * (float)mean;
    if (run_var) {
      double unbiased = cnt > 1 ? ss / (double)(cnt - 1) : var;
      run_var[ch] = (1.0f - momentum) * run_var[ch] + momentum * (float)unbiased;
    }
    float a = gamma[ch] * invstd, b = beta[ch] - (float)mean * a;
    for (int64_t i = 0; i < n; i++)
      plane_affine(xh + (i * c + ch) * hw, yh + (i * c + ch) * hw, hw, a, b);
  }
}

PS_API int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
                                         void *y, float *save_mean, float *save_invstd,
                                         float *run_mean, float *run_var, int64_t n, int64_t c,
                                         int64_t hw, float momentum, float eps, void *stream) {
  (void)stream;
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  CHECK_RANGE(x, n * c * hw * 2);
  CHECK_RANGE(y, n * c * hw * 2);
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(beta, c * 4);
  CHECK_RANGE(save_mean, c * 4);
  CHECK_RANGE(save_invstd, c * 4);
  if (run_mean) CHECK_RANGE(run_mean, c * 4);
  if (run_var) CHECK_RANGE(run_var, c * 4);
  bn_ctx_t k = {x, NULL, y, gamma, beta, NULL, NULL, NULL, NULL, save_mean, save_invstd,
                run_mean, run_var, NULL, NULL, n, c, hw, momentum, eps};
  par_range(c, 1, n * c * hw, bn_train_range, &k);
  return PS_OK;
}

static void bn_eval_range(void *vctx, int64_t c0, int64_t c1) {
  bn_ctx_t *k = vctx;
  const void *x = k->x;
  void *y = k->y;
  const float *gamma = k->gamma, *beta = k->beta, *run_mean = k->run_mean_c,
              *run_var = k->run_var_c;
  float eps = k->eps;
  int64_t n = k->n, c = k->c, hw = k->hw;
  for (int64_t ch = c0; ch < c1; ch++) {
    float a = gamma[ch] / sqrtf(run_var[ch] + eps), b = beta[ch] - run_mean[ch] * a;
    for (int64_t i = 0; i < n; i++)
      plane_affine((const half *)x + (i * c + ch) * hw, (half *)y + (i * c + ch) * hw, hw, a, b);
  }
}

PS_API int ps_nn_batchnorm_forward_eval(const void *x, const float *gamma, const float *beta,
                                        const float *run_mean, const float *run_var, void *y,
                                        int64_t n, int64_t c, int64_t hw, float eps,
                                        void *stream) {
  (void)stream;
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  CHECK_RANGE(x, n * c * hw * 2);
  CHECK_RANGE(y, n * c * hw * 2);
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(beta, c * 4);
  CHECK_RANGE(run_mean, c * 4);
  CHECK_RANGE(run_var, c * 4);
  bn_ctx_t k = {x, NULL, y, gamma, beta, NULL, NULL, run_mean, run_var, NULL, NULL,
                NULL, NULL, NULL, NULL, n, c, hw, 0.0f, eps};
  par_range(c, 1, n * c * hw, bn_eval_range, &k);
  return PS_OK;
}

static void bn_bwd_range(void *vctx, int64_t c0, int64_t c1) {
  bn_ctx_t *k = vctx;
  const void *x = k->x, *dy = k->dy;
  void *dx = k->y;
  const float *gamma = k->gamma, *save_mean = k->save_mean, *save_invstd = k->save_invstd;
  float *dgamma = k->dgamma, *dbeta = k->dbeta;
  int64_t n = k->n, c = k->c, hw = k->hw, cnt = n * hw;
  float gb[BN_CHUNK], xb[BN_CHUNK];
  for (int64_t ch = c0; ch < c1; ch++) {
    float mean = save_mean[ch], is = save_invstd[ch];
    double sdy = 0.0, sdyx = 0.0; /* sum dy, sum dy * xhat */
    for (int64_t i = 0; i < n; i++) {
      const half *g = (const half *)dy + (i * c + ch) * hw;
      const half *p = (const half *)x + (i * c + ch) * hw;
      for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
        int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
        h2f_row(g + j0, gb, m);
        h2f_row(p + j0, xb, m);
        float a0[BN_LANES] = {0}, a1[BN_LANES] = {0};
        int64_t j = 0;
        for (; j + BN_LANES <= m; j += BN_LANES)
          for (int l = 0; l < BN_LANES; l++) {
            a0[l] += gb[j + l];
            a1[l] += gb[j + l] * ((xb[j + l] - mean) * is);
          }
        for (; j < m; j++) {
          a0[0] += gb[j];
          a1[0] += gb[j] * ((xb[j] - mean) * is);
        }
        sdy += lanes_total(a0);
        sdyx += lanes_total(a1);
      }
    }
    dbeta[ch] = (float)sdy;
    dgamma[ch] = (float)sdyx;
    /* dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) */
    float a = gamma[ch] * is, mdy = (float)(sdy / (double)cnt), mdyx = (float)(sdyx / (double)cnt);
    for (int64_t i = 0; i < n; i++) {
      const half *g = (const half *)dy + (i * c + ch) * hw;
      const half *p = (const half *)x + (i * c + ch) * hw;
      half *q = (half *)dx + (i * c + ch) * hw;
      for (int64_t j0 = 0; j0 < hw; j0 += BN_CHUNK) {
        int64_t m = hw - j0 < BN_CHUNK ? hw - j0 : BN_CHUNK;
        h2f_row(g + j0, gb, m);
        h2f_row(p + j0, xb, m);
        for (int64_t j = 0; j < m; j++) gb[j] = a * (gb[j] - mdy - ((xb[j] - mean) * is) * mdyx);
        f2h_row(gb, q + j0, m);
      }
    }
  }
}

PS_API int ps_nn_batchnorm_backward(const void *dy, const void *x, const float *gamma,
                                    const float *save_mean, const float *save_invstd, void *dx,
                                    float *dgamma, float *dbeta, int64_t n, int64_t c,
                                    int64_t hw, void *stream) {
  (void)stream;
  TRY(ps_check_per_channel(__func__, n, c, hw, 1));
  CHECK_RANGE(dy, n * c * hw * 2);
  CHECK_RANGE(x, n * c * hw * 2);
  CHECK_RANGE(dx, n * c * hw * 2);
  CHECK_RANGE(gamma, c * 4);
  CHECK_RANGE(save_mean, c * 4);
  CHECK_RANGE(save_invstd, c * 4);
  CHECK_RANGE(dgamma, c * 4);
  CHECK_RANGE(dbeta, c * 4);
  bn_ctx_t k = {x, dy, dx, gamma, NULL, save_mean, save_invstd, NULL, NULL, NULL, NULL,
                NULL, NULL, dgamma, dbeta, n, c, hw, 0.0f, 0.0f};
  par_range(c, 1, n * c * hw, bn_bwd_range, &k);
  return PS_OK;
}

/* ---- bias, relu ---------------------------------------------------------------------- */

typedef struct {
  const void *a, *b;
  void *out, *out2;
  float *f0, *f1;
  int64_t n, c, hw;
  int32_t dtype, flag;
  float lr, momentum, dampening, weight_decay, inv;
} ew_ctx_t;

static void bias_add_range(void *vctx, int64_t r0, int64_t r1) {
  ew_ctx_t *k = vctx;
  void *y = k->out;
  const void *bias = k->a;
  int32_t bias_dtype = k->dtype;
  int64_t c = k->c, hw = k->hw;
  for (int64_t r = r0; r < r1; r++) {
    int64_t ch = r % c;
    half *q = (half *)y + r * hw;
    if (hw == 1) { /* [N,F]: one value per row of the loop */
      float b = bias_dtype == PS_NN_F16 ? h2f(((const half *)bias)[ch]) : ((const float *)bias)[ch];
      q[0] = f2h(h2f(q[0]) + b);
      continue;
    }
    float b = bias_dtype == PS_NN_F16 ? h2f(((const half *)bias)[ch]) : ((const float *)bias)[ch];
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 vb = _mm512_set1_ps(b);
    for (; j + 16 <= hw; j += 16) {
      __m512 v = _mm512_add_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q + j))), vb);
      _mm256_storeu_si256((__m256i *)(q + j), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; j < hw; j++) q[j] = f2h(h2f(q[j]) + b);
  }
}

PS_API int ps_nn_bias_add(void *y, const void *bias, int32_t bias_dtype, int64_t n, int64_t c,
                          int64_t hw, void *stream) {
  (void)stream;
  CHECK_DTYPE(bias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  if (n == 0) return PS_OK;
  CHECK_RANGE(y, n * c * hw * 2);
  CHECK_RANGE(bias, c * dtsize(bias_dtype));
  int64_t rows = n * c;
  ew_ctx_t k = {bias, NULL, y, NULL, NULL, NULL, n, c, hw, bias_dtype, 0, 0, 0, 0, 0, 0};
  par_range(rows, 64, rows * hw, bias_add_range, &k);
  return PS_OK;
}

static void bias_grad_range(void *vctx, int64_t c0, int64_t c1) {
  ew_ctx_t *k = vctx;
  const void *dy = k->a;
  float *sum = k->f0;
  int64_t n = k->n, c = k->c, hw = k->hw;
    for (int64_t ch = c0; ch < c1; ch++) {
      float s = 0.0f;
      for (int64_t i = 0; i < n; i++) s += sum_row((const half *)dy + (i * c + ch) * hw, hw);
      sum[ch] = s;
    }
}

PS_API int ps_nn_bias_grad(const void *dy, void *dbias, int32_t dbias_dtype, int64_t n,
                           int64_t c, int64_t hw, int32_t accumulate, void *stream) {
  (void)stream;
  CHECK_DTYPE(dbias_dtype);
  TRY(ps_check_per_channel(__func__, n, c, hw, 0));
  CHECK_RANGE(dy, n * c * hw * 2);
  CHECK_RANGE(dbias, c * dtsize(dbias_dtype));
  float *sum = calloc((size_t)c, sizeof(float));
  if (!sum) OOM();
  if (hw == 1) {
    for (int64_t i = 0; i < n; i++) {
      const half *g = (const half *)dy + i * c;
      for (int64_t ch = 0; ch < c; ch++) sum[ch] += h2f(g[ch]);
    }
  } else {
    ew_ctx_t k = {dy, NULL, NULL, NULL, sum, NULL, n, c, hw, 0, 0, 0, 0, 0, 0, 0};
    par_range(c, 1, n * c * hw, bias_grad_range, &k);
  }
  for (int64_t ch = 0; ch < c; ch++) {
    if (dbias_dtype == PS_NN_F32) {
      float *d = (float *)dbias + ch;
      *d = accumulate ? *d + sum[ch] : sum[ch];
    } else {
      half *d = (half *)dbias + ch;
      *d = f2h(accumulate ? h2f(*d) + sum[ch] : sum[ch]);
    }
  }
  free(sum);
  return PS_OK;
}

static void relu_fwd_range(void *vctx, int64_t i, int64_t end) {
  ew_ctx_t *k = vctx;
  const uint16_t *s = (const uint16_t *)k->a;
  uint16_t *d = (uint16_t *)k->out;
#if defined(__AVX512BW__)
    /* As int16, exactly the values to zero (-0, negatives, -inf; not negative NaNs) are
     * <= (int16)0xfc00 = -1024. */
    const __m512i lim = _mm512_set1_epi16(-1024);
    for (; i < end; i += 32) {
      __mmask32 m = end - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (end - i)) - 1u);
      __m512i v = _mm512_maskz_loadu_epi16(m, s + i);
      __mmask32 neg = _mm512_cmple_epi16_mask(v, lim);
      _mm512_mask_storeu_epi16(d + i, m, _mm512_maskz_mov_epi16((__mmask32)~neg, v));
    }
#endif
    for (; i < end; i++) {
      d[i] = ps_relu_f16(s[i]);
    }
  }

PS_API int ps_nn_relu_forward(const void *x, void *y, int64_t count, void *stream) {
  (void)stream;
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  CHECK_RANGE(x, count * 2);
  CHECK_RANGE(y, count * 2);
  /* On the bits: max(x, 0) keeps NaN like torch.relu does not guarantee either way; a
   * negative-sign test maps -0 and negatives to +0 and leaves NaN payloads alone. */
  ew_ctx_t k = {x, NULL, y, NULL, NULL, NULL, count, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  par_range(count, 16384, count, relu_fwd_range, &k);
  return PS_OK;
}

static void relu_bwd_range(void *vctx, int64_t i, int64_t end) {
  ew_ctx_t *k = vctx;
  const uint16_t *g = (const uint16_t *)k->a, *o = (const uint16_t *)k->b;
  uint16_t *d = (uint16_t *)k->out;
#if defined(__AVX512BW__)
    const __m512i zero = _mm512_setzero_si512(), inf = _mm512_set1_epi16(0x7c00);
    for (; i < end; i += 32) {
      __mmask32 m = end - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (end - i)) - 1u);
      __m512i v = _mm512_maskz_loadu_epi16(m, o + i);
      __mmask32 pos = _mm512_cmpgt_epi16_mask(v, zero) & _mm512_cmple_epi16_mask(v, inf);
      _mm512_mask_storeu_epi16(d + i, m, _mm512_maskz_loadu_epi16(pos & m, g + i));
    }
#endif
    for (; i < end; i++) {
      d[i] = ps_relu_grad_f16(o[i], g[i]);
    }
  }

PS_API int ps_nn_relu_backward(const void *dy, const void *y, void *dx, int64_t count,
                               void *stream) {
  (void)stream;
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  CHECK_RANGE(dy, count * 2);
  CHECK_RANGE(y, count * 2);
  CHECK_RANGE(dx, count * 2);
  /* dx = y > 0 ? dy : 0; y is relu's output, so y > 0 <=> positive sign and nonzero. */
  ew_ctx_t k = {dy, y, dx, NULL, NULL, NULL, count, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  par_range(count, 16384, count, relu_bwd_range, &k);
  return PS_OK;
}

/* ---- loss ---------------------------------------------------------------------------- */

PS_API int ps_nn_cross_entropy(const void *logits, const int32_t *labels, void *dlogits,
                               float *loss_sum, int32_t *correct, int64_t n, int64_t k,
                               float scale, const float *device_scale, void *stream) {
  (void)stream;
  TRY(ps_check_cross_entropy(n, k));
  if (n == 0) return PS_OK;
  CHECK_RANGE(logits, n * k * 2);
  CHECK_RANGE(labels, n * 4);
  if (dlogits) CHECK_RANGE(dlogits, n * k * 2);
  if (loss_sum) CHECK_RANGE(loss_sum, 4);
  if (correct) CHECK_RANGE(correct, 4);
  if (device_scale) CHECK_RANGE(device_scale, 4);
  for (int64_t i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= k)
      PS_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_cross_entropy: label %d of sample %lld not in [0, %lld)",
              labels[i], (long long)i, (long long)k);
  double loss = 0.0;
  int64_t hits = 0;
  float *row = malloc((size_t)k * sizeof(float));
  if (!row) OOM();
  float g = ps_ce_grad_scale(scale, device_scale, n);
  for (int64_t i = 0; i < n; i++) {
    const half *l = (const half *)logits + i * k;
    int64_t arg = 0;
    float m = h2f(l[0]);
    for (int64_t j = 0; j < k; j++) {
      row[j] = h2f(l[j]);
      if (row[j] > m) m = row[j], arg = j;
    }
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) s += expf(row[j] - m);
    float lse = m + logf(s);
    loss += (double)(lse - row[labels[i]]);
    hits += arg == labels[i];
    if (dlogits) {
      half *d = (half *)dlogits + i * k;
      float inv = 1.0f / s;
      for (int64_t j = 0; j < k; j++) {
        float p = expf(row[j] - m) * inv;
        d[j] = f2h(g * (p - (j == labels[i] ? 1.0f : 0.0f)));
      }
    }
  }
  free(row);
  if (loss_sum) *loss_sum += (float)loss;
  if (correct) *correct += (int32_t)hits;
  return PS_OK;
}

/* ---- casts, loss scaling, SGD -------------------------------------------------------- */

PS_API int ps_nn_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype,
                      int64_t count, void *stream) {
  (void)stream;
  CHECK_DTYPE(src_dtype);
  CHECK_DTYPE(dst_dtype);
  TRY(ps_check_count(__func__, count));
  if (count == 0) return PS_OK;
  CHECK_RANGE(src, count * dtsize(src_dtype));
  CHECK_RANGE(dst, count * dtsize(dst_dtype));
  if (src_dtype == dst_dtype)
    memmove(dst, src, (size_t)(count * dtsize(src_dtype)));
  else if (src_dtype == PS_NN_F16)
    h2f_row((const half *)src, (float *)dst, count);
  else
    f2h_row((const float *)src, (half *)dst, count);
  return PS_OK;
}

PS_API int ps_nn_unscale_check(void *grad, int32_t grad_dtype, int64_t count,
                               const float *scale, float inv_scale, int32_t in_place,
                               int32_t *found_inf, void *stream) {
  (void)stream;
  CHECK_DTYPE(grad_dtype);
  TRY(ps_check_count(__func__, count));
  CHECK_RANGE(found_inf, 4);
  if (scale) CHECK_RANGE(scale, 4);
  if (count == 0) return PS_OK;
  CHECK_RANGE(grad, count * dtsize(grad_dtype));
  float inv = scale ? 1.0f / *scale : inv_scale;
  int bad = 0;
  if (grad_dtype == PS_NN_F16) {
    uint16_t *g = (uint16_t *)grad;
    for (int64_t i = 0; i < count; i++) bad |= ps_f16_nonfinite(g[i]);
    if (in_place)
      for (int64_t i = 0; i < count; i++) ((half *)grad)[i] = f2h(h2f(((half *)grad)[i]) * inv);
  } else {
    float *g = (float *)grad;
    for (int64_t i = 0; i < count; i++) {
      bad |= !isfinite(g[i]);
      if (in_place) g[i] *= inv;
    }
  }
  if (bad) *found_inf = 1;
  return PS_OK;
}

static void sgd_range(void *vctx, int64_t i0, int64_t i1) {
  ew_ctx_t *k = vctx;
  const void *grad = k->a;
  int32_t grad_dtype = k->dtype, nesterov = k->flag & 1, fresh = (k->flag >> 1) & 1;
  float *param = k->f0, *momentum_buf = k->f1;
  void *param_half = k->out;
  float inv = k->inv, lr = k->lr, momentum = k->momentum, dampening = k->dampening,
        weight_decay = k->weight_decay;
  for (int64_t i = i0; i < i1; i++) {
    float g = (grad_dtype == PS_NN_F16 ? h2f(((const half *)grad)[i]) : ((const float *)grad)[i]) * inv;
    float p = ps_sgd_element(param[i], g, momentum != 0.0f ? momentum_buf + i : NULL, lr,
                             momentum, dampening, weight_decay, nesterov, fresh);
    param[i] = p;
    if (param_half) ((half *)param_half)[i] = f2h(p);
  }
}

PS_API int ps_nn_sgd_step(float *param, const void *grad, int32_t grad_dtype,
                          float *momentum_buf, void *param_half, int64_t count, float lr,
                          float momentum, float dampening, float weight_decay,
                          int32_t nesterov, const float *scale, const int32_t *found_inf,
                          const int32_t *steps_done, void *stream) {
  (void)stream;
  CHECK_DTYPE(grad_dtype);
  TRY(ps_check_sgd(count, momentum, momentum_buf));
  if (found_inf) CHECK_RANGE(found_inf, 4);
  if (scale) CHECK_RANGE(scale, 4);
  if (steps_done) CHECK_RANGE(steps_done, 4);
  if (count == 0) return PS_OK;
  CHECK_RANGE(param, count * 4);
  CHECK_RANGE(grad, count * dtsize(grad_dtype));
  if (momentum_buf) CHECK_RANGE(momentum_buf, count * 4);
  if (param_half) CHECK_RANGE(param_half, count * 2);
  if (found_inf && *found_inf) return PS_OK;
  float inv = scale ? 1.0f / *scale : 1.0f;
  int fresh = steps_done && *steps_done == 0;
  ew_ctx_t k = {grad, NULL, param_half, NULL, param, momentum_buf, count, 0, 0, grad_dtype,
                (nesterov ? 1 : 0) | (fresh ? 2 : 0), lr, momentum, dampening, weight_decay, inv};
  par_range(count, 16384, count, sgd_range, &k);
  return PS_OK;
}

PS_API int ps_nn_step_count(int32_t *steps_done, const int32_t *found_inf, void *stream) {
  (void)stream;
  CHECK_RANGE(steps_done, 4);
  if (found_inf) CHECK_RANGE(found_inf, 4);
  if (!(found_inf && *found_inf)) *steps_done += 1;
  return PS_OK;
}

PS_API int ps_nn_scaler_update(float *scale, int32_t *growth_tracker, const int32_t *found_inf,
                               float growth_factor, float backoff_factor,
                               int32_t growth_interval, void *stream) {
  (void)stream;
  CHECK_RANGE(scale, 4);
  CHECK_RANGE(growth_tracker, 4);
  CHECK_RANGE(found_inf, 4);
  TRY(ps_check_scaler_update(growth_interval));
  ps_scaler_step(scale, growth_tracker, *found_inf, growth_factor, backoff_factor,
                 growth_interval);
  return PS_OK;
}

/* ---- skipped-step rollback ------------------------------------------------------------ */

PS_API int ps_nn_copy_if(float *dst, const float *src, int64_t count, const int32_t *flag,
                         void *stream) {
  (void)stream;
  TRY(ps_check_count(__func__, count));
  CHECK_RANGE(flag, 4);
  if (count == 0) return PS_OK;
  /* Checked whatever the flag says, so a bad call fails on every step, not on a skipped one. */
  CHECK_RANGE(dst, count * 4);
  CHECK_RANGE(src, count * 4);
  if (*flag) memmove(dst, src, (size_t)count * 4);
  return PS_OK;
}
