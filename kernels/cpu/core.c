/*
 * core.c — the CPU backend of pinstream.h's core section.
 *
 * "Device" memory is host memory, copies are memcpy, and everything runs synchronously on
 * the calling thread, so streams and events are bookkeeping: an event records the monotonic
 * time at ps_event_record and is complete at once. The backend still validates what the CUDA
 * backend would reject (unknown handles, double frees, copies through freed or out-of-range
 * pointers), so code that runs clean here does not fault on a GPU.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "../pinstream.h"
#include "common.h"
#include "threads.h"
/* The error-recording module's definitions, ps_last_error, ps_abi_version and ps_backend. */
#define PS_BACKEND_ID 0
#define PS_ERRORS_IMPLEMENTATION
#include "../errors.h"

/* ---- registry of live objects ---------------------------------------------------------
 * A sorted array of disjoint [start, start + bytes) ranges, one per live allocation, stream
 * and event, behind one mutex: [wait] functions run on Deno's worker threads while the JS
 * thread allocates. Thousands of entries at most, so binary search plus memmove is plenty. */

typedef enum {
  KIND_HOST_ALLOC = 1,
  KIND_HOST_REGISTERED,
  KIND_DEVICE,
  KIND_STREAM,
  KIND_EVENT,
} entry_kind;

typedef struct {
  uintptr_t start;
  uint64_t bytes;
  entry_kind kind;
} entry;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static entry *reg = NULL;
static size_t reg_len = 0, reg_cap = 0;
static int64_t live[3];

void ps_live_add(ps_live_kind kind, int64_t delta) {
  __atomic_add_fetch(&live[kind], delta, __ATOMIC_RELAXED);
}

PS_API int ps_live_objects(int64_t *allocations, int64_t *streams, int64_t *events) {
  if (allocations) *allocations = __atomic_load_n(&live[PS_LIVE_ALLOCATION], __ATOMIC_RELAXED);
  if (streams) *streams = __atomic_load_n(&live[PS_LIVE_STREAM], __ATOMIC_RELAXED);
  if (events) *events = __atomic_load_n(&live[PS_LIVE_EVENT], __ATOMIC_RELAXED);
  return PS_OK;
}

PS_API int ps_scratch_allocations(int64_t *out) {
  PS_REQUIRE(out != NULL);
  *out = ps_call_scratch_growths();
  return PS_OK;
}

static ps_live_kind live_kind_of(entry_kind k) {
  return k == KIND_STREAM ? PS_LIVE_STREAM : k == KIND_EVENT ? PS_LIVE_EVENT : PS_LIVE_ALLOCATION;
}

/* Index of the first entry whose start is > p. Caller holds reg_lock. */
static size_t upper_bound(uintptr_t p) {
  size_t lo = 0, hi = reg_len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (reg[mid].start <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Adds [p, p + bytes) or fails when it overlaps a live entry. */
static int reg_insert(const void *ptr, uint64_t bytes, entry_kind kind) {
  uintptr_t p = (uintptr_t)ptr;
  pthread_mutex_lock(&reg_lock);
  size_t i = upper_bound(p);
  int overlaps = (i > 0 && reg[i - 1].start + reg[i - 1].bytes > p) ||
                 (i < reg_len && reg[i].start < p + bytes);
  if (overlaps) {
    pthread_mutex_unlock(&reg_lock);
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "range %p+%llu overlaps memory already allocated or registered", ptr,
            (unsigned long long)bytes);
  }
  if (reg_len == reg_cap) {
    size_t cap = reg_cap ? reg_cap * 2 : 256;
    entry *grown = realloc(reg, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&reg_lock);
      PS_FAIL(PS_ERR_OUT_OF_MEMORY, "no memory for the allocation registry");
    }
    reg = grown;
    reg_cap = cap;
  }
  memmove(reg + i + 1, reg + i, (reg_len - i) * sizeof *reg);
  reg[i] = (entry){p, bytes, kind};
  reg_len++;
  pthread_mutex_unlock(&reg_lock);
  ps_live_add(live_kind_of(kind), 1);
  return PS_OK;
}

/* Removes the entry that starts exactly at ptr and has the given kind. */
static int reg_remove(const void *ptr, entry_kind kind, const char *what) {
  uintptr_t p = (uintptr_t)ptr;
  pthread_mutex_lock(&reg_lock);
  size_t i = upper_bound(p);
  int found = i > 0 && reg[i - 1].start == p && reg[i - 1].kind == kind;
  if (found) {
    memmove(reg + i - 1, reg + i, (reg_len - i) * sizeof *reg);
    reg_len--;
  }
  pthread_mutex_unlock(&reg_lock);
  if (!found) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%p is not a live %s (freed twice, or never allocated here)",
            ptr, what);
  }
  ps_live_add(live_kind_of(kind), -1);
  return PS_OK;
}

static int reg_contains(const void *ptr, uint64_t bytes, int memory_only, entry_kind kind) {
  uintptr_t p = (uintptr_t)ptr;
  pthread_mutex_lock(&reg_lock);
  size_t i = upper_bound(p);
  int ok = 0;
  if (i > 0) {
    const entry *e = &reg[i - 1];
    int kind_ok = memory_only ? (e->kind == KIND_HOST_ALLOC || e->kind == KIND_HOST_REGISTERED ||
                                 e->kind == KIND_DEVICE)
                              : (e->kind == kind && e->start == p);
    ok = kind_ok && p + bytes >= p && p + bytes <= e->start + e->bytes;
  }
  pthread_mutex_unlock(&reg_lock);
  return ok;
}

int ps_is_live_range(const void *ptr, uint64_t bytes) { return reg_contains(ptr, bytes, 1, 0); }

/* ---- devices -------------------------------------------------------------------------- */

PS_API int ps_device_count(int32_t *out) {
  PS_REQUIRE(out != NULL);
  *out = 1;
  return PS_OK;
}

static void cpu_model(char *dst, size_t cap) {
  snprintf(dst, cap, "cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      const char *v = strchr(line, ':');
      if (v != NULL) {
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(dst, cap, "%s", v);
        dst[strcspn(dst, "\n")] = '\0';
      }
      break;
    }
  }
  fclose(f);
}

PS_API int ps_device_props_get(int32_t device, ps_device_props *out) {
  PS_REQUIRE(out != NULL);
  if (device != 0) PS_FAIL(PS_ERR_INVALID_DEVICE, "cpu device %d does not exist (only 0)", device);
  memset(out, 0, sizeof *out);
  cpu_model(out->name, sizeof out->name);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  out->total_memory = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  out->multiprocessors = cpus > 0 ? (int32_t)cpus : 1;
  out->unified_addressing = 1;
  return PS_OK;
}

PS_API int ps_device_set(int32_t device) {
  if (device != 0) PS_FAIL(PS_ERR_INVALID_DEVICE, "cpu device %d does not exist (only 0)", device);
  return PS_OK;
}

PS_API int ps_device_get(int32_t *out) {
  PS_REQUIRE(out != NULL);
  *out = 0;
  return PS_OK;
}

static int device_synchronize(int32_t device) {
  if (device != 0) PS_FAIL(PS_ERR_INVALID_DEVICE, "cpu device %d does not exist (only 0)", device);
  return PS_OK;
}

PS_API int ps_device_synchronize(int32_t device, char *msg, uint64_t msg_cap) {
  return ps_export_error(device_synchronize(device), msg, msg_cap);
}

PS_API int ps_mem_info(uint64_t *free_bytes, uint64_t *total_bytes) {
  PS_REQUIRE(free_bytes != NULL && total_bytes != NULL);
  struct sysinfo si;
  if (sysinfo(&si) != 0) PS_FAIL(PS_ERR_BACKEND, "sysinfo: %s", strerror(errno));
  *total_bytes = (uint64_t)si.totalram * si.mem_unit;
  *free_bytes = (uint64_t)(si.freeram + si.bufferram) * si.mem_unit;
  return PS_OK;
}

/* ---- memory --------------------------------------------------------------------------- */

/* Page alignment, like cudaHostAlloc: vector loads never straddle an allocation's start and
 * registered/allocated ranges never share a page. */
#define PS_ALIGN 4096
/* Allocations of PS_HUGE_MIN bytes or more are aligned to 2 MiB and advised into transparent
 * huge pages (Linux, where THP is "madvise" or "always"): a resident dataset is read at random,
 * a sample or a row at a time, and with 4 KiB pages nearly every read is a TLB miss (a
 * two-dimensional page walk in a VM). On the 2-core VM the resident CIFAR kernel (128 shuffled
 * images from the 150 MB set to fp16) took 48-49 us a batch with huge pages against 56-62
 * with 4 KiB pages, one thread. `deno run -A bench/pipeline.ts` measures it again (its
 * DeviceDataset row; set PS_HUGE_MIN above the set's size for the other side). */
#define PS_HUGE_MIN ((uint64_t)4 << 20)
#define PS_HUGE_PAGE ((size_t)2 << 20)

static int aligned_alloc_entry(uint64_t bytes, void **out, entry_kind kind, const char *what) {
  PS_REQUIRE(out != NULL);
  *out = NULL;
  if (bytes == 0) return PS_OK; /* like cudaMalloc(0): success, NULL, nothing to free */
  if (bytes > (uint64_t)PTRDIFF_MAX - PS_ALIGN) {
    PS_FAIL(PS_ERR_OUT_OF_MEMORY, "%s of %llu bytes: too large", what, (unsigned long long)bytes);
  }
  void *p = NULL;
  const int huge = bytes >= PS_HUGE_MIN;
  int rc = posix_memalign(&p, huge ? PS_HUGE_PAGE : PS_ALIGN, (size_t)bytes);
  if (rc != 0 || p == NULL) {
    PS_FAIL(PS_ERR_OUT_OF_MEMORY, "%s of %llu bytes failed: %s", what, (unsigned long long)bytes,
            strerror(rc));
  }
#if defined(MADV_HUGEPAGE)
  /* Advice only: without transparent huge pages (or with them off) it fails and changes
   * nothing. */
  if (huge) (void)madvise(p, (size_t)bytes & ~(size_t)(PS_HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
  int st = reg_insert(p, bytes, kind);
  if (st != PS_OK) {
    free(p);
    return st;
  }
  *out = p;
  return PS_OK;
}

static int free_entry(void *ptr, entry_kind kind, const char *what) {
  if (ptr == NULL) return PS_OK;
  int st = reg_remove(ptr, kind, what);
  if (st != PS_OK) return st;
  free(ptr);
  return PS_OK;
}

PS_API int ps_host_alloc(uint64_t bytes, void **out) {
  return aligned_alloc_entry(bytes, out, KIND_HOST_ALLOC, "pinned host allocation");
}

PS_API int ps_host_free(void *ptr) {
  return free_entry(ptr, KIND_HOST_ALLOC, "pinned host allocation");
}

PS_API int ps_host_register(void *ptr, uint64_t bytes) {
  PS_REQUIRE(ptr != NULL);
  PS_REQUIRE(bytes > 0);
  return reg_insert(ptr, bytes, KIND_HOST_REGISTERED);
}

PS_API int ps_host_unregister(void *ptr) {
  PS_REQUIRE(ptr != NULL);
  return reg_remove(ptr, KIND_HOST_REGISTERED, "registered host range");
}

PS_API int ps_device_alloc(uint64_t bytes, void **out) {
  return aligned_alloc_entry(bytes, out, KIND_DEVICE, "device allocation");
}

PS_API int ps_device_free(void *ptr) { return free_entry(ptr, KIND_DEVICE, "device allocation"); }

static int check_stream(void *stream) {
  if (stream != NULL && !reg_contains(stream, 1, 0, KIND_STREAM)) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%p is not a live stream", stream);
  }
  return PS_OK;
}

static int check_device_range(const void *ptr, uint64_t bytes, const char *role) {
  if (ptr == NULL) PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s is NULL", role);
  if (!ps_is_live_range(ptr, bytes)) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT,
            "%s %p+%llu is not inside a live allocation (freed, or out of range)", role, ptr,
            (unsigned long long)bytes);
  }
  return PS_OK;
}

PS_API int ps_memset_async(void *dst, int32_t value, uint64_t bytes, void *stream) {
  TRY(check_stream(stream));
  if (bytes == 0) return PS_OK;
  TRY(check_device_range(dst, bytes, "memset destination"));
  memset(dst, value, (size_t)bytes);
  return PS_OK;
}

/* Host sides are JS memory we cannot check beyond NULL; device sides must be live ranges. */
PS_API int ps_memcpy_h2d_async(void *dst, const void *src, uint64_t bytes, void *stream) {
  TRY(check_stream(stream));
  if (bytes == 0) return PS_OK;
  TRY(check_device_range(dst, bytes, "h2d destination"));
  PS_REQUIRE(src != NULL);
  memmove(dst, src, (size_t)bytes);
  return PS_OK;
}

PS_API int ps_memcpy_d2h_async(void *dst, const void *src, uint64_t bytes, void *stream) {
  TRY(check_stream(stream));
  if (bytes == 0) return PS_OK;
  TRY(check_device_range(src, bytes, "d2h source"));
  PS_REQUIRE(dst != NULL);
  memmove(dst, src, (size_t)bytes);
  return PS_OK;
}

PS_API int ps_memcpy_d2d_async(void *dst, const void *src, uint64_t bytes, void *stream) {
  TRY(check_stream(stream));
  if (bytes == 0) return PS_OK;
  TRY(check_device_range(dst, bytes, "d2d destination"));
  TRY(check_device_range(src, bytes, "d2d source"));
  memmove(dst, src, (size_t)bytes);
  return PS_OK;
}

/* ---- streams and events --------------------------------------------------------------- */

typedef struct {
  int32_t unused;
} cpu_stream;

typedef struct {
  double ms; /* monotonic time at the last record */
  int32_t recorded;
  int32_t timing;
} cpu_event;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

PS_API int ps_stream_create(int32_t flags, void **out) {
  PS_REQUIRE(out != NULL);
  /* Work runs at once on cpu, so the flag only has to be valid. */
  PS_REQUIRE(flags == PS_STREAM_DEFAULT || flags == PS_STREAM_NON_BLOCKING);
  *out = NULL;
  cpu_stream *s = calloc(1, sizeof *s);
  if (s == NULL) PS_FAIL(PS_ERR_OUT_OF_MEMORY, "no memory for a stream");
  int st = reg_insert(s, sizeof *s, KIND_STREAM);
  if (st != PS_OK) {
    free(s);
    return st;
  }
  *out = s;
  return PS_OK;
}

PS_API int ps_stream_destroy(void *stream) {
  PS_REQUIRE(stream != NULL);
  TRY(reg_remove(stream, KIND_STREAM, "stream"));
  free(stream);
  return PS_OK;
}

static int stream_synchronize(int32_t device, void *stream) {
  TRY(device_synchronize(device));
  return check_stream(stream);
}

PS_API int ps_stream_synchronize(int32_t device, void *stream, char *msg, uint64_t msg_cap) {
  return ps_export_error(stream_synchronize(device, stream), msg, msg_cap);
}

PS_API int ps_stream_query(void *stream) { return check_stream(stream); }

static int check_event(void *event) {
  if (event == NULL || !reg_contains(event, 1, 0, KIND_EVENT)) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%p is not a live event", event);
  }
  return PS_OK;
}

PS_API int ps_stream_wait_event(void *stream, void *event) {
  TRY(check_stream(stream));
  TRY(check_event(event));
  return PS_OK; /* work is synchronous: whatever the event marks has already happened */
}

/* ---- graphs: nothing to record, as every call runs when it is made ---------------------- */

PS_API int ps_graph_capture_begin(void *stream) {
  TRY(check_stream(stream));
  PS_FAIL(PS_ERR_UNSUPPORTED,
          "ps_graph_capture_begin: the cpu backend runs each call as it is made; there is no "
          "queue to capture (run the work directly)");
}

PS_API int ps_graph_capture_end(void *stream, void **out) {
  PS_REQUIRE(out != NULL);
  *out = NULL;
  TRY(check_stream(stream));
  PS_FAIL(PS_ERR_UNSUPPORTED, "ps_graph_capture_end: the cpu backend never captures");
}

PS_API int ps_graph_launch(void *graph, void *stream) {
  (void)stream;
  PS_FAIL(PS_ERR_INVALID_ARGUMENT,
          "ps_graph_launch: %p is not a graph (the cpu backend makes none)", graph);
}

PS_API int ps_graph_destroy(void *graph) {
  PS_FAIL(PS_ERR_INVALID_ARGUMENT,
          "ps_graph_destroy: %p is not a graph (the cpu backend makes none)", graph);
}

PS_API int ps_graph_live(int64_t *out) {
  PS_REQUIRE(out != NULL);
  *out = 0;
  return PS_OK;
}

PS_API int ps_event_create(int32_t flags, void **out) {
  PS_REQUIRE(out != NULL);
  /* PS_EVENT_BLOCKING_SYNC changes nothing here: events fire when recorded. */
  PS_REQUIRE((flags & ~(PS_EVENT_DISABLE_TIMING | PS_EVENT_BLOCKING_SYNC)) == 0);
  *out = NULL;
  cpu_event *e = calloc(1, sizeof *e);
  if (e == NULL) PS_FAIL(PS_ERR_OUT_OF_MEMORY, "no memory for an event");
  e->timing = !(flags & PS_EVENT_DISABLE_TIMING);
  int st = reg_insert(e, sizeof *e, KIND_EVENT);
  if (st != PS_OK) {
    free(e);
    return st;
  }
  *out = e;
  return PS_OK;
}

PS_API int ps_event_destroy(void *event) {
  PS_REQUIRE(event != NULL);
  TRY(reg_remove(event, KIND_EVENT, "event"));
  free(event);
  return PS_OK;
}

PS_API int ps_event_record(void *event, void *stream) {
  TRY(check_event(event));
  TRY(check_stream(stream));
  cpu_event *e = event;
  e->ms = now_ms();
  e->recorded = 1;
  return PS_OK;
}

PS_API int ps_event_query(void *event) { return check_event(event); }

PS_API int ps_event_synchronize(void *event, char *msg, uint64_t msg_cap) {
  return ps_export_error(check_event(event), msg, msg_cap);
}

PS_API int ps_event_elapsed_ms(void *start, void *end, float *out_ms) {
  PS_REQUIRE(out_ms != NULL);
  TRY(check_event(start));
  TRY(check_event(end));
  const cpu_event *a = start, *b = end;
  if (!a->timing || !b->timing) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "elapsed time needs events created with timing enabled");
  }
  if (!a->recorded || !b->recorded) {
    PS_FAIL(PS_ERR_INVALID_ARGUMENT, "elapsed time needs both events recorded");
  }
  *out_ms = (float)(b->ms - a->ms);
  return PS_OK;
}

/* ---- benchmark helper ----------------------------------------------------------------- */

static int bench_memcpy_loop(void *dst, const void *src, uint64_t bytes, int32_t kind,
                             int32_t iters, void *stream, float *out_ms) {
  PS_REQUIRE(out_ms != NULL);
  PS_REQUIRE(iters > 0);
  PS_REQUIRE(kind == PS_MEMCPY_H2D || kind == PS_MEMCPY_D2H || kind == PS_MEMCPY_D2D);
  PS_REQUIRE(dst != NULL && src != NULL && bytes > 0);
  TRY(check_stream(stream));
  if (kind != PS_MEMCPY_H2D) TRY(check_device_range(src, bytes, "source"));
  if (kind != PS_MEMCPY_D2H) TRY(check_device_range(dst, bytes, "destination"));
  double t0 = now_ms();
  for (int32_t i = 0; i < iters; i++) {
    memcpy(dst, src, (size_t)bytes);
    /* Keeps the compiler from merging the iterations into one copy. */
    __asm__ __volatile__("" : : "r"(dst) : "memory");
  }
  *out_ms = (float)(now_ms() - t0);
  return PS_OK;
}

PS_API int ps_bench_memcpy_loop(int32_t device, void *dst, const void *src, uint64_t bytes,
                                int32_t kind, int32_t iters, void *stream, float *out_ms, char *msg,
                                uint64_t msg_cap) {
  int st = device_synchronize(device);
  if (st == PS_OK) st = bench_memcpy_loop(dst, src, bytes, kind, iters, stream, out_ms);
  return ps_export_error(st, msg, msg_cap);
}
