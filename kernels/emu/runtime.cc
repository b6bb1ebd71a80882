/*
 * runtime.cc — the CUDA emulator's runtime API: one device (sm_90), its memory, streams,
 * events and errors. One file, although long, because every function of it (one per CUDA call
 * the backend makes) shares the file-private allocation, stream and event tables; the
 * execution of kernels is exec.cc.
 *
 * Streams are asynchronous for real: each has a host thread that runs its operations in
 * order, each operation waiting for what CUDA makes it wait for (the previous operation on
 * its stream; with the legacy default stream, the last operation of every blocking stream or
 * of the default stream; cudaStreamWaitEvent's event). So the host returns from a launch or a
 * copy before the device has done it, and host code that reads results without waiting reads
 * stale bytes here too (PINSTREAM_EMU_DELAY_US widens that window).
 *
 * In deferred mode (PINSTREAM_EMU_STREAMS=deferred) nothing runs until the host waits for it:
 * cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a query (which answers
 * cudaErrorNotReady and lets the work run), a blocking copy or a free release what the waited-
 * for operation depends on (the earlier operations of its stream, the events it waits for),
 * and released operations run one at a time, the most recently queued runnable one first.
 * That is a legal schedule of the program, and the one most likely to break a program that
 * relies on timing: a kernel on a compute stream that lacks its cudaStreamWaitEvent runs
 * before the copy it should wait for; a copy out of a pinned buffer runs only after the host
 * has had every chance to overwrite the buffer; results read before a synchronize are not
 * there yet.
 *
 * Memory follows CUDA's rules where they bite on a GPU: copies to or from pinned memory
 * (cudaHostAlloc, cudaHostRegister) happen when the stream gets to them; a copy from pageable
 * memory is staged at the call, a copy to pageable memory returns when it is done; cudaFree,
 * cudaFreeHost and cudaHostUnregister wait for the device; cudaFreeAsync frees in stream order.
 * Device and pinned allocations are their own mappings, each ending at a guard page, and are
 * filled with 0xff bytes (NaN as fp16 or fp32) when allocated: code that reads memory it never
 * wrote sees NaN, and code that runs past the end or uses freed memory faults.
 *
 * A fault in a kernel (see exec.cc) becomes the sticky error of the context: every later call
 * returns it, as on a GPU, and cudaGetErrorString says what the emulator found.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#include "internal.h"

struct ps_emu_stream;
struct ps_emu_event;
struct ps_emu_mem_pool {
  uint64_t release_threshold = 0;
};

namespace ps_emu {

namespace {

/* ---- configuration -------------------------------------------------------------------------- */

uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char *end = nullptr;
  unsigned long long x = strtoull(v, &end, 0);
  if (end == v || *end != '\0') {
    fprintf(stderr, "pinstream CUDA emulator: ignoring %s=%s (not a number)\n", name, v);
    return fallback;
  }
  return x;
}

EmuConfig read_config() {
  EmuConfig c;
  c.order = Order::random;
  if (const char *o = getenv("PINSTREAM_EMU_ORDER"); o != nullptr && *o != '\0') {
    if (strcmp(o, "forward") == 0) {
      c.order = Order::forward;
    } else if (strcmp(o, "reverse") == 0) {
      c.order = Order::reverse;
    } else if (strcmp(o, "greedy") == 0) {
      c.order = Order::greedy;
    } else if (strcmp(o, "greedy-reverse") == 0) {
      c.order = Order::greedy_reverse;
    } else if (strcmp(o, "random") != 0) {
      fprintf(stderr,
              "pinstream CUDA emulator: ignoring PINSTREAM_EMU_ORDER=%s (forward, reverse, "
              "random, greedy or greedy-reverse)\n",
              o);
    }
  }
  c.seed = env_u64("PINSTREAM_EMU_SEED", 1);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c.workers = (int)env_u64("PINSTREAM_EMU_WORKERS", cpus > 1 ? (uint64_t)cpus - 1 : 1);
  c.delay_us = (unsigned)env_u64("PINSTREAM_EMU_DELAY_US", 0);
  c.trace = env_u64("PINSTREAM_EMU_TRACE", 0) != 0;
  c.deferred = false;
  if (const char *s = getenv("PINSTREAM_EMU_STREAMS"); s != nullptr && *s != '\0') {
    if (strcmp(s, "deferred") == 0) {
      c.deferred = true;
    } else if (strcmp(s, "async") != 0) {
      fprintf(stderr,
              "pinstream CUDA emulator: ignoring PINSTREAM_EMU_STREAMS=%s (async or deferred)\n",
              s);
    }
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t half = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 4ull << 30;
  if (half > 80ull << 30) half = 80ull << 30;
  c.memory_bytes = env_u64("PINSTREAM_EMU_MEMORY_MB", half >> 20) << 20;
  c.memory_pools = env_u64("PINSTREAM_EMU_MEMORY_POOLS", 1) != 0;
  const char *launches = getenv("PINSTREAM_EMU_LAUNCHES");
  c.launches = launches != nullptr && *launches != '\0' ? strdup(launches) : nullptr;
  return c;
}

/* ---- launch sites that ran (PINSTREAM_EMU_LAUNCHES) ------------------------------------------ */

struct Launches {
  std::mutex mu;
  std::set<std::string> seen;
};

Launches &launches() {
  static Launches *l = new Launches();
  return *l;
}

void write_launches() {
  Launches &l = launches();
  std::lock_guard<std::mutex> lk(l.mu);
  FILE *f = fopen(config().launches, "a");
  if (f == nullptr) return;
  for (const std::string &s : l.seen) fprintf(f, "%s\n", s.c_str());
  fclose(f);
}

void note_launch(const Site &site) {
  if (config().launches == nullptr) return;
  Launches &l = launches();
  char buf[512];
  snprintf(buf, sizeof buf, "%s:%d %s", site.file, site.line, site.kernel);
  std::lock_guard<std::mutex> lk(l.mu);
  static bool registered = false;
  if (!registered) {
    registered = true;
    atexit(write_launches);
  }
  l.seen.insert(buf);
}

}  // namespace

const EmuConfig &config() {
  static const EmuConfig c = read_config();
  return c;
}

const char *order_name(Order order) {
  switch (order) {
    case Order::forward: return "forward";
    case Order::reverse: return "reverse";
    case Order::greedy: return "greedy";
    case Order::greedy_reverse: return "greedy-reverse";
    default: return "random";
  }
}

namespace {

double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- errors ----------------------------------------------------------------------------------- */

__thread cudaError_t tl_last_error = cudaSuccess;

std::atomic<int> sticky{cudaSuccess};
char sticky_message[1024];

cudaError_t fail(cudaError_t err) {
  tl_last_error = err;
  return err;
}

const char *error_text(cudaError_t err);

/* The first fault of a kernel poisons the context for good; later faults are only printed. */
void raise_sticky(cudaError_t err, const std::string &message) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  fprintf(stderr, "pinstream CUDA emulator: %s\n", message.c_str());
  if (sticky.load() != cudaSuccess) return;
  snprintf(sticky_message, sizeof sticky_message, "%s (CUDA emulator: %s)",
           error_text(err), message.c_str());
  sticky.store(err);
}

/* Entry of every call that touches the device: a sticky error answers for it. */
#define PS_EMU_STICKY()                                     \
  do {                                                      \
    int s_ = sticky.load(std::memory_order_acquire);        \
    if (s_ != cudaSuccess) return fail((cudaError_t)s_);    \
  } while (0)

/* ---- memory ------------------------------------------------------------------------------------ */

enum class Kind { device, pool, pinned, registered };

struct Alloc {
  size_t bytes;
  Kind kind;
  void *map;        /* the mapping, or null for registered host memory */
  size_t map_bytes;
  size_t charged;   /* device memory it counts against (cudaMemGetInfo) */
};

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, Alloc> allocs;
  uint64_t device_bytes = 0;
};

Memory &memory() {
  static Memory *m = new Memory();
  return *m;
}

size_t page() {
  static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
  return p;
}

/* The allocation containing [p, p + bytes), or null. Caller holds memory().mu. */
const Alloc *find_locked(uintptr_t p, size_t bytes, uintptr_t *start) {
  auto &a = memory().allocs;
  auto it = a.upper_bound(p);
  if (it == a.begin()) return nullptr;
  --it;
  if (p + bytes < p || p + bytes > it->first + it->second.bytes) return nullptr;
  if (start) *start = it->first;
  return &it->second;
}

bool is_pinned(const void *p, size_t bytes) {
  std::lock_guard<std::mutex> lk(memory().mu);
  const Alloc *a = find_locked((uintptr_t)p, bytes, nullptr);
  return a != nullptr && (a->kind == Kind::pinned || a->kind == Kind::registered);
}

/* Maps `bytes` so that they end at a guard page, filled with poison. Device memory is
 * 256-byte aligned (as cudaMalloc's) and ends within 255 bytes of the guard; pinned memory
 * is page aligned (as cudaHostAlloc's). */
cudaError_t map_alloc(size_t bytes, Kind kind, void **out) {
  const size_t align = kind == Kind::pinned ? page() : 256;
  const size_t data = (bytes + align - 1) & ~(align - 1);
  const size_t len = ((data + page() - 1) & ~(page() - 1)) + page();
  if (data < bytes || len < data) return cudaErrorMemoryAllocation;
  if (kind != Kind::pinned) {
    std::lock_guard<std::mutex> lk(memory().mu);
    if (memory().device_bytes + data > config().memory_bytes) return cudaErrorMemoryAllocation;
    memory().device_bytes += data;
  }
  void *map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (map == MAP_FAILED) {
    if (kind != Kind::pinned) {
      std::lock_guard<std::mutex> lk(memory().mu);
      memory().device_bytes -= data;
    }
    return cudaErrorMemoryAllocation;
  }
  mprotect((char *)map + len - page(), page(), PROT_NONE);
  char *p = (char *)map + len - page() - data;
  memset(p, 0xff, data);
  std::lock_guard<std::mutex> lk(memory().mu);
  memory().allocs[(uintptr_t)p] = Alloc{bytes, kind, map, len, kind == Kind::pinned ? 0 : data};
  *out = p;
  return cudaSuccess;
}

/* Unmaps an allocation of `kind` starting exactly at p. */
cudaError_t unmap_alloc(void *p, Kind kind, cudaError_t not_found) {
  Alloc a;
  {
    std::lock_guard<std::mutex> lk(memory().mu);
    auto it = memory().allocs.find((uintptr_t)p);
    if (it == memory().allocs.end() || it->second.kind != kind) return not_found;
    a = it->second;
    memory().allocs.erase(it);
    memory().device_bytes -= a.charged;
  }
  if (a.map != nullptr) munmap(a.map, a.map_bytes);
  return cudaSuccess;
}

}  // namespace

bool device_accessible(const void *p, size_t bytes) {
  std::lock_guard<std::mutex> lk(memory().mu);
  return find_locked((uintptr_t)p, bytes, nullptr) != nullptr;
}

namespace {

/* ---- streams ----------------------------------------------------------------------------------- */

struct Op {
  std::function<void()> run; /* empty for markers (event records, waits) */
  std::vector<std::shared_ptr<Op>> deps;
  std::shared_ptr<Op> prev; /* the operation before it on its stream, until done */
  ps_emu_stream *stream = nullptr;
  const char *what = nullptr; /* for PINSTREAM_EMU_TRACE */
  uint64_t seq = 0;         /* queue order across all streams */
  bool released = true;     /* deferred mode: the host has waited for it (or for a later op) */
  uint64_t gen = 0;         /* deferred mode: the latest wait of the host that needs it */
  bool done = false;
  double done_ms = 0.0;
};

/* ---- stream capture ---------------------------------------------------------------------------- */

/* One captured operation. Kernel nodes keep what makes a grid (each launch of the graph makes
 * its own); the others keep a body that may run any number of times. */
struct Node {
  const char *what = nullptr;
  std::function<void()> run; /* empty for kernels and markers */
  bool kernel = false;
  Site site{};
  Config cfg;
  std::shared_ptr<const KernelBody> body;
  std::vector<const void *> pointers;
  std::vector<size_t> deps; /* earlier nodes of the same graph */
};

/* A captured graph's nodes, shared by the graph, its executables and their queued launches;
 * memory of the capture's cudaMallocAsync nodes lives as long as it does (as a graph's
 * allocations stay reserved for it on a GPU). */
struct GraphData {
  std::vector<Node> nodes;
  std::vector<void *> allocs;
  ~GraphData() {
    for (void *p : allocs) (void)unmap_alloc(p, Kind::pool, cudaErrorInvalidValue);
  }
};

/* One capture sequence, from cudaStreamBeginCapture to cudaStreamEndCapture: the origin
 * stream and every stream joined to it through a captured event record the same graph. */
struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  ps_emu_stream *origin = nullptr;
  bool invalidated = false;
  bool ended = false;
  std::shared_ptr<GraphData> graph = std::make_shared<GraphData>();
  std::vector<ps_emu_stream *> streams; /* origin first */
};

}  // namespace
}  // namespace ps_emu

struct ps_emu_graph {
  std::shared_ptr<ps_emu::GraphData> data;
};

struct ps_emu_graph_exec {
  std::shared_ptr<ps_emu::GraphData> data;
  std::shared_ptr<ps_emu::Op> last; /* the last operation of its latest launch */
  uint64_t launches = 0;
};

struct ps_emu_stream {
  unsigned flags = 0;
  bool legacy = false;
  bool destroyed = false;
  std::deque<std::shared_ptr<ps_emu::Op>> queue;
  std::shared_ptr<ps_emu::Op> last;
  std::shared_ptr<ps_emu::Capture> capture; /* while capturing */
  std::vector<size_t> tail;                 /* while capturing: what its next node depends on */
};

struct ps_emu_event {
  unsigned flags = 0;
  std::shared_ptr<ps_emu::Op> last; /* the most recent record, or null */
  std::shared_ptr<ps_emu::Capture> capture; /* when last recorded in a capture */
  std::vector<size_t> tail;                 /* the nodes that record waits for */
};

namespace ps_emu {
namespace {

struct Streams {
  std::mutex mu;
  std::condition_variable changed; /* any operation completed, or a queue grew */
  std::unordered_set<ps_emu_stream *> live; /* user streams the host may name */
  std::vector<ps_emu_stream *> all;         /* user streams with a thread, destroyed included */
  ps_emu_stream *legacy = nullptr;
  std::unordered_set<ps_emu_event *> events;
  uint64_t seq = 0;
  bool running = false;     /* deferred mode: an operation is running */
  double host_call = 0.0;   /* deferred mode: when the host last queued or asked for work */
  uint64_t gen = 0;         /* deferred mode: waits of the host so far */
  std::vector<std::shared_ptr<Capture>> captures; /* capture sequences under way */
};

Streams &streams() {
  static Streams *s = new Streams();
  return *s;
}

bool ready(const Op &op) {
  for (const auto &d : op.deps)
    if (!d->done) return false;
  return true;
}

/* Deferred mode: whether `op`, the head of stream `s`, is the one to run next: released, ready,
 * nothing else running, and of all such stream heads the one needed by the host's most recent
 * wait (the compute stream it has just synchronized before the copy stream whose event it
 * queried a while ago), the most recently queued first. Caller holds S.mu. */
bool chosen_locked(const ps_emu_stream *s, const Op &op) {
  Streams &S = streams();
  if (S.running || !op.released || !ready(op)) return false;
  auto later = [&](const ps_emu_stream *o) {
    if (o == nullptr || o == s || o->queue.empty()) return false;
    const Op &h = *o->queue.front();
    return h.released && ready(h) && (h.gen > op.gen || (h.gen == op.gen && h.seq > op.seq));
  };
  if (later(S.legacy)) return false;
  for (const ps_emu_stream *o : S.all)
    if (later(o)) return false;
  return true;
}

/* Deferred mode: the host waits for `ops` (one wait, even for several streams): they and
 * everything they depend on may run, as the needs of this newest wait. Caller holds S.mu. */
void release_locked(std::vector<Op *> todo) {
  Streams &S = streams();
  if (!config().deferred) return;
  const uint64_t gen = ++S.gen;
  while (!todo.empty()) {
    Op *x = todo.back();
    todo.pop_back();
    if (x == nullptr || x->done || x->gen == gen) continue;
    x->released = true;
    x->gen = gen;
    todo.push_back(x->prev.get());
    for (const auto &d : x->deps) todo.push_back(d.get());
  }
  S.host_call = now_ms();
  S.changed.notify_all();
}

void release_locked(const std::shared_ptr<Op> &op) { release_locked(std::vector<Op *>{op.get()}); }

/* Deferred mode: how long the host must have left the device alone (queued nothing, waited for
 * nothing new) before released work runs: a host that is still busy may yet queue and wait
 * for more (the next batch's kernels, a synchronize of the compute stream), and the most
 * recent of it then runs first. What only an older wait needs (a copy whose event the host
 * queried, then went on) waits 25 times as long: until the host has nothing else to do, or a
 * newer wait needs it too. A host blocked in a synchronize is quiet, so it waits that long at
 * most. */
double settle_ms(bool newest) {
  const double ms = config().delay_us > 0 ? config().delay_us / 1000.0 : 2.0;
  return newest ? ms : 25 * ms;
}

void stream_main(ps_emu_stream *s) {
  Streams &S = streams();
  const bool deferred = config().deferred;
  uint64_t rng = mix64((uint64_t)(uintptr_t)s ^ config().seed);
  std::unique_lock<std::mutex> lk(S.mu);
  for (;;) {
    if (s->queue.empty()) {
      if (s->destroyed) break;
      S.changed.wait(lk);
      continue;
    }
    const Op &head = *s->queue.front();
    if (!(deferred ? chosen_locked(s, head) : ready(head))) {
      S.changed.wait(lk);
      continue;
    }
    if (deferred) {
      const double left = S.host_call + settle_ms(head.gen == S.gen) - now_ms();
      if (left > 0) {
        S.changed.wait_for(lk, std::chrono::microseconds((int64_t)(left * 1000) + 1));
        continue;
      }
    }
    std::shared_ptr<Op> op = s->queue.front();
    if (deferred) S.running = true;
    lk.unlock();
    if (!deferred && config().delay_us > 0) {
      rng = mix64(rng);
      std::this_thread::sleep_for(std::chrono::microseconds(rng % (config().delay_us + 1)));
    }
    if (config().trace) {
      fprintf(stderr, "pinstream CUDA emulator: run #%llu %s on stream %p\n",
              (unsigned long long)op->seq, op->what, (void *)s);
    }
    if (op->run && sticky.load(std::memory_order_acquire) == cudaSuccess) op->run();
    const double t = now_ms();
    lk.lock();
    op->run = nullptr; /* drops staging buffers and kernel parameters now */
    op->deps.clear();
    op->prev = nullptr;
    op->done_ms = t;
    op->done = true;
    s->queue.pop_front();
    if (deferred) S.running = false;
    S.changed.notify_all();
  }
  S.all.erase(std::find(S.all.begin(), S.all.end(), s));
  lk.unlock();
  delete s;
}

ps_emu_stream *new_stream(unsigned flags, bool legacy) {
  auto *s = new ps_emu_stream();
  s->flags = flags;
  s->legacy = legacy;
  std::thread(stream_main, s).detach();
  return s;
}

/* The stream a handle names, or null when it names none. Caller holds streams().mu. */
ps_emu_stream *resolve_locked(cudaStream_t st) {
  Streams &S = streams();
  if (st == nullptr || st == cudaStreamLegacy) {
    if (S.legacy == nullptr) S.legacy = new_stream(cudaStreamDefault, true);
    return S.legacy;
  }
  return S.live.count(st) ? st : nullptr;
}

/* ---- capture bookkeeping (callers hold streams().mu) ------------------------------------------- */

void invalidate_locked(const std::shared_ptr<Capture> &c) {
  if (c) c->invalidated = true;
}

/* The legacy stream synchronizes with every blocking stream, so it may not be used while one
 * of them captures: such a capture is invalidated and the call fails. */
cudaError_t legacy_conflict_locked() {
  bool conflict = false;
  for (const auto &c : streams().captures) {
    for (ps_emu_stream *o : c->streams) {
      if (!(o->flags & cudaStreamNonBlocking)) {
        c->invalidated = true;
        conflict = true;
      }
    }
  }
  return conflict ? cudaErrorStreamCaptureImplicit : cudaSuccess;
}

/* Appends `node` to the capture of `s`, after what the stream's next node depends on. */
cudaError_t capture_locked(ps_emu_stream *s, Node node) {
  const std::shared_ptr<Capture> &c = s->capture;
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  node.deps = s->tail;
  c->graph->nodes.push_back(std::move(node));
  s->tail.assign(1, c->graph->nodes.size() - 1);
  return cudaSuccess;
}

__thread cudaStreamCaptureMode tl_capture_mode = cudaStreamCaptureModeGlobal;

/* CUDA's rule for calls that are not stream-ordered and so cannot be captured (cudaMalloc,
 * cudaMemcpy, cudaDeviceSynchronize, ...): a thread in global mode may not make them while a
 * capture it began is under way (unless begun in relaxed mode) or while another thread
 * captures in global mode; a thread in thread-local mode only while its own capture is under
 * way; a thread in relaxed mode always may. A refused call invalidates the captures that
 * refused it and fails with cudaErrorStreamCaptureUnsupported. */
cudaError_t unsafe_call() {
  Streams &S = streams();
  std::lock_guard<std::mutex> lk(S.mu);
  if (S.captures.empty() || tl_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  const std::thread::id me = std::this_thread::get_id();
  bool refused = false;
  for (const auto &c : S.captures) {
    const bool mine = c->thread == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool global = c->thread != me && c->mode == cudaStreamCaptureModeGlobal &&
                        tl_capture_mode == cudaStreamCaptureModeGlobal;
    if (mine || global) {
      c->invalidated = true;
      refused = true;
    }
  }
  return refused ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

#define PS_EMU_UNSAFE()                           \
  do {                                            \
    cudaError_t u_ = unsafe_call();               \
    if (u_ != cudaSuccess) return u_;             \
  } while (0)

/* The capture `st` records into, or null (an unknown handle is null too). */
std::shared_ptr<Capture> capture_of(cudaStream_t st) {
  std::lock_guard<std::mutex> lk(streams().mu);
  ps_emu_stream *s = resolve_locked(st);
  return s != nullptr ? s->capture : nullptr;
}

/* Queues `run` on `st` behind what CUDA orders it after; `extra` is one more dependency. On a
 * capturing stream, records it instead. Caller holds streams().mu. */
cudaError_t enqueue_locked(const char *what, ps_emu_stream *s, std::function<void()> run,
                           std::shared_ptr<Op> *out, std::shared_ptr<Op> extra) {
  Streams &S = streams();
  if (s->capture) {
    Node node;
    node.what = what;
    node.run = std::move(run);
    return capture_locked(s, std::move(node));
  }
  if (s->legacy) {
    if (cudaError_t e = legacy_conflict_locked(); e != cudaSuccess) return fail(e);
  }
  auto op = std::make_shared<Op>();
  op->run = std::move(run);
  op->seq = ++S.seq;
  op->stream = s;
  op->what = what;
  op->released = !config().deferred;
  S.host_call = now_ms();
  if (s->last && !s->last->done) op->prev = s->last;
  auto need = [&](const std::shared_ptr<Op> &d) {
    if (d && !d->done) op->deps.push_back(d);
  };
  if (s->legacy) {
    for (ps_emu_stream *o : S.all)
      if (!(o->flags & cudaStreamNonBlocking)) need(o->last);
  } else if (!(s->flags & cudaStreamNonBlocking) && S.legacy != nullptr) {
    need(S.legacy->last);
  }
  need(extra);
  s->queue.push_back(op);
  s->last = op;
  S.changed.notify_all();
  if (out) *out = op;
  return cudaSuccess;
}

cudaError_t enqueue(const char *what, cudaStream_t st, std::function<void()> run,
                    std::shared_ptr<Op> *out = nullptr,
                    std::shared_ptr<Op> extra = nullptr) {
  std::lock_guard<std::mutex> lk(streams().mu);
  ps_emu_stream *s = resolve_locked(st);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return enqueue_locked(what, s, std::move(run), out, std::move(extra));
}

void wait_done(const std::shared_ptr<Op> &op) {
  if (!op) return;
  Streams &S = streams();
  std::unique_lock<std::mutex> lk(S.mu);
  release_locked(op);
  S.changed.wait(lk, [&] { return op->done; });
}

cudaError_t synchronize_all() {
  Streams &S = streams();
  std::unique_lock<std::mutex> lk(S.mu);
  {
    std::vector<Op *> lasts;
    if (S.legacy) lasts.push_back(S.legacy->last.get());
    for (ps_emu_stream *s : S.all) lasts.push_back(s->last.get());
    release_locked(std::move(lasts));
  }
  S.changed.wait(lk, [&] {
    if (S.legacy && S.legacy->last && !S.legacy->last->done) return false;
    for (ps_emu_stream *s : S.all)
      if (s->last && !s->last->done) return false;
    return true;
  });
  return cudaSuccess;
}

bool live_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> lk(streams().mu);
  return e != nullptr && streams().events.count(e) != 0;
}

struct ErrorName {
  cudaError_t err;
  const char *name, *text;
};

const ErrorName kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction",
     "an illegal instruction was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch",
     "system has unsupported display driver / cuda driver combination"},
    {cudaErrorCompatNotSupportedOnDevice, "cudaErrorCompatNotSupportedOnDevice",
     "forward compatibility was attempted on non supported HW"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorName *error_entry(cudaError_t err) {
  for (const ErrorName &e : kErrors)
    if (e.err == err) return &e;
  return nullptr;
}

const char *error_text(cudaError_t err) {
  const ErrorName *e = error_entry(err);
  return e ? e->text : "unrecognized error code";
}

__thread int tl_device = 0;

}  // namespace

cudaError_t enqueue_launch(const Site &site, const Config &cfg, KernelBody *body,
                           const void *const *pointers, int count) {
  std::unique_ptr<KernelBody> owned(body);
  PS_EMU_STICKY();
  const dim3 g = cfg.grid, b = cfg.block;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
      (uint64_t)b.x * b.y * b.z > 1024 || g.x == 0 || g.y == 0 || g.z == 0 ||
      g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
    return fail(cudaErrorInvalidConfiguration);
  }
  if (cfg.smem > (48u << 10)) return fail(cudaErrorInvalidValue);
  note_launch(site);
  std::shared_ptr<const KernelBody> body_shared(owned.release());
  {
    std::lock_guard<std::mutex> lk(streams().mu);
    ps_emu_stream *s = resolve_locked(cfg.stream);
    if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
    if (s->capture) {
      Node node;
      node.what = site.kernel;
      node.kernel = true;
      node.site = site;
      node.cfg = cfg;
      node.body = std::move(body_shared);
      node.pointers.assign(pointers, pointers + count);
      return capture_locked(s, std::move(node));
    }
  }
  std::shared_ptr<Grid> grid = make_grid(site, cfg, std::move(body_shared), pointers, count);
  return enqueue(site.kernel, cfg.stream, [grid] {
    std::string message;
    cudaError_t err = run_grid(*grid, &message);
    if (err != cudaSuccess) raise_sticky(err, message);
  });
}

}  // namespace ps_emu

using namespace ps_emu;

/* ---- errors --------------------------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
  int s = sticky.load(std::memory_order_acquire);
  if (s != cudaSuccess) return (cudaError_t)s;
  cudaError_t e = tl_last_error;
  tl_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  int s = sticky.load(std::memory_order_acquire);
  return s != cudaSuccess ? (cudaError_t)s : tl_last_error;
}

const char *cudaGetErrorName(cudaError_t err) {
  const ErrorName *e = error_entry(err);
  return e ? e->name : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t err) {
  /* The sticky message is written once, before `sticky` is stored. */
  if (err != cudaSuccess && err == sticky.load(std::memory_order_acquire)) return sticky_message;
  return error_text(err);
}

/* ---- devices ---------------------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = config().workers + 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMemoryPoolsSupported: *value = config().memory_pools ? 1 : 0; break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "pinstream CUDA emulator (sm_90, %s order, %d workers)",
           order_name(config().order), config().workers + 1);
  p->totalGlobalMem = config().memory_bytes;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = config().workers + 1;
  p->asyncEngineCount = 2;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  tl_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = tl_device;
  return cudaSuccess;
}

namespace {
std::atomic<unsigned> device_flags{cudaDeviceMapHost};
}  // namespace

cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  if (flags & ~0x1fu || (flags & cudaDeviceScheduleMask) == 0x03 ||
      (flags & cudaDeviceScheduleMask) > cudaDeviceScheduleBlockingSync) {
    return fail(cudaErrorInvalidValue);
  }
  device_flags.store(flags | cudaDeviceMapHost);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int *flags) {
  if (flags == nullptr) return fail(cudaErrorInvalidValue);
  *flags = device_flags.load();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  synchronize_all();
  PS_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  PS_EMU_STICKY();
  if (free_bytes == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(memory().mu);
  *total = config().memory_bytes;
  *free_bytes = config().memory_bytes - memory().device_bytes;
  return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **ptr, size_t size) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  cudaError_t e = map_alloc(size, Kind::device, ptr);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaFree(void *ptr) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  if (ptr == nullptr) return cudaSuccess;
  synchronize_all(); /* cudaFree waits for the device */
  cudaError_t e = unmap_alloc(ptr, Kind::device, cudaErrorInvalidValue);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  if (ptr == nullptr || (flags & ~0x7u)) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  cudaError_t e = map_alloc(size, Kind::pinned, ptr);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void *ptr) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  if (ptr == nullptr) return cudaSuccess;
  synchronize_all();
  cudaError_t e = unmap_alloc(ptr, Kind::pinned, cudaErrorInvalidValue);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  if (ptr == nullptr || size == 0 || (flags & ~0xfu)) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(memory().mu);
  auto &a = memory().allocs;
  const uintptr_t p = (uintptr_t)ptr;
  auto it = a.upper_bound(p);
  bool overlaps = (it != a.end() && it->first < p + size);
  if (it != a.begin()) {
    auto prev = std::prev(it);
    overlaps = overlaps || prev->first + prev->second.bytes > p;
  }
  if (overlaps) return fail(cudaErrorHostMemoryAlreadyRegistered);
  a[p] = Alloc{size, Kind::registered, nullptr, 0, 0};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  /* Copies still queued from or to the range must finish while it is pinned. */
  synchronize_all();
  cudaError_t e = unmap_alloc(ptr, Kind::registered, cudaErrorHostMemoryNotRegistered);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  PS_EMU_STICKY();
  if (count == 0) {
    std::lock_guard<std::mutex> lk(streams().mu);
    return resolve_locked(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
  }
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  if (kind == cudaMemcpyDefault) {
    const bool d = device_accessible(dst, count) && !is_pinned(dst, count);
    const bool s = device_accessible(src, count) && !is_pinned(src, count);
    kind = d && s ? cudaMemcpyDeviceToDevice
           : d    ? cudaMemcpyHostToDevice
           : s    ? cudaMemcpyDeviceToHost
                  : cudaMemcpyHostToHost;
  }
  const bool dev_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool dev_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((int)kind < 0 || (int)kind > 3) return fail(cudaErrorInvalidMemcpyDirection);
  if ((dev_dst && !device_accessible(dst, count)) || (dev_src && !device_accessible(src, count))) {
    return fail(cudaErrorInvalidValue);
  }
  if ((uintptr_t)dst < (uintptr_t)src + count && (uintptr_t)src < (uintptr_t)dst + count) {
    /* Undefined in CUDA (a GPU's copy engine may move the bytes in any order): refused here,
     * so code that relies on memmove semantics fails on the emulator too. */
    fprintf(stderr,
            "pinstream CUDA emulator: cudaMemcpyAsync(%p, %p, %zu): source and destination "
            "overlap (undefined in CUDA; copy through a temporary buffer)\n",
            dst, src, count);
    return fail(cudaErrorInvalidValue);
  }
  const bool pageable_src = !dev_src && !is_pinned(src, count);
  const bool pageable_dst = !dev_dst && !is_pinned(dst, count);
  if (pageable_src || pageable_dst) {
    /* A graph cannot hold a copy the call itself completes (staged at the call, or waited
     * for): captured, it is refused, and the capture with it. */
    std::lock_guard<std::mutex> lk(streams().mu);
    ps_emu_stream *s = resolve_locked(stream);
    if (s != nullptr && s->capture) {
      invalidate_locked(s->capture);
      return fail(cudaErrorStreamCaptureUnsupported);
    }
  }
  if (pageable_src) {
    /* Pageable source: staged now, so the caller may reuse it when this returns. */
    auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                               (const unsigned char *)src + count);
    return enqueue("cudaMemcpyAsync", stream, [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
  }
  std::shared_ptr<Op> op;
  cudaError_t e =
      enqueue("cudaMemcpyAsync", stream, [dst, src, count] { memmove(dst, src, count); }, &op);
  if (e != cudaSuccess || dev_dst || is_pinned(dst, count)) return e;
  /* Pageable destination: the call returns when the bytes are there. */
  wait_done(op);
  PS_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, 0);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(0);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  PS_EMU_STICKY();
  if (count == 0) {
    std::lock_guard<std::mutex> lk(streams().mu);
    return resolve_locked(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
  }
  if (!device_accessible(ptr, count)) return fail(cudaErrorInvalidValue);
  return enqueue("cudaMemsetAsync", stream, [ptr, value, count] { memset(ptr, value, count); });
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
  PS_EMU_STICKY();
  PS_EMU_UNSAFE();
  cudaError_t e = cudaMemsetAsync(ptr, value, count, 0);
  return e != cudaSuccess ? e : cudaStreamSynchronize(0);
}

cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream) {
  PS_EMU_STICKY();
  if (!config().memory_pools) return fail(cudaErrorNotSupported);
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  {
    std::lock_guard<std::mutex> lk(streams().mu);
    if (resolve_locked(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  }
  if (size == 0) return cudaSuccess;
  /* Usable by work queued on `stream` after this call; the memory exists from now on. */
  cudaError_t e = map_alloc(size, Kind::pool, ptr);
  if (e != cudaSuccess) return fail(e);
  std::lock_guard<std::mutex> lk(streams().mu);
  ps_emu_stream *s = resolve_locked(stream);
  if (s != nullptr && s->capture) {
    /* An allocation node: the graph owns the memory, at the same address in every launch,
     * and each launch finds it poisoned again (what a fresh allocation holds is undefined). */
    s->capture->graph->allocs.push_back(*ptr);
    void *p = *ptr;
    Node node;
    node.what = "cudaMallocAsync";
    node.run = [p, size] { memset(p, 0xff, size); };
    cudaError_t c = capture_locked(s, std::move(node));
    if (c != cudaSuccess) *ptr = nullptr; /* the graph's memory is freed with the capture */
    return c;
  }
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  PS_EMU_STICKY();
  if (!config().memory_pools) return fail(cudaErrorNotSupported);
  if (ptr == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lk(memory().mu);
    auto it = memory().allocs.find((uintptr_t)ptr);
    if (it == memory().allocs.end() || it->second.kind != Kind::pool) {
      return fail(cudaErrorInvalidValue);
    }
  }
  if (std::shared_ptr<Capture> c = capture_of(stream)) {
    std::lock_guard<std::mutex> lk(streams().mu);
    const auto &own = c->graph->allocs;
    if (std::find(own.begin(), own.end(), ptr) == own.end()) {
      /* Memory from outside the graph would be freed at its first launch only. */
      invalidate_locked(c);
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    ps_emu_stream *s = resolve_locked(stream);
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> mk(memory().mu);
      bytes = memory().allocs.at((uintptr_t)ptr).bytes;
    }
    /* A free node: the memory stays the graph's; it is poisoned, so work that runs after the
     * free and still reads it sees NaN. */
    Node node;
    node.what = "cudaFreeAsync";
    node.run = [ptr, bytes] { memset(ptr, 0xff, bytes); };
    return capture_locked(s, std::move(node));
  }
  /* Freed when the stream gets there: later work on other streams that still uses it faults. */
  return enqueue("cudaFreeAsync", stream, [ptr] { (void)unmap_alloc(ptr, Kind::pool, cudaErrorInvalidValue); });
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
  static ps_emu_mem_pool the_pool;
  if (pool == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  if (!config().memory_pools) return fail(cudaErrorNotSupported);
  *pool = &the_pool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *value) {
  if (pool == nullptr || value == nullptr) return fail(cudaErrorInvalidValue);
  if (attr == cudaMemPoolAttrReleaseThreshold) {
    pool->release_threshold = *(const uint64_t *)value;
  }
  return cudaSuccess;
}

/* ---- streams ------------------------------------------------------------------------------------------ */

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  PS_EMU_STICKY();
  if (stream == nullptr || (flags & ~(unsigned)cudaStreamNonBlocking)) {
    return fail(cudaErrorInvalidValue);
  }
  ps_emu_stream *s = new_stream(flags, false);
  Streams &S = streams();
  std::lock_guard<std::mutex> lk(S.mu);
  S.live.insert(s);
  S.all.push_back(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  PS_EMU_STICKY();
  Streams &S = streams();
  std::lock_guard<std::mutex> lk(S.mu);
  if (stream == nullptr || !S.live.count(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (stream->capture) {
    invalidate_locked(stream->capture);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  S.live.erase(stream);
  /* Returns at once; queued work still runs, then the stream's thread ends. */
  stream->destroyed = true;
  release_locked(stream->last);
  S.changed.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  PS_EMU_STICKY();
  std::shared_ptr<Op> last;
  {
    std::lock_guard<std::mutex> lk(streams().mu);
    ps_emu_stream *s = resolve_locked(stream);
    if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
    if (s->capture) {
      invalidate_locked(s->capture);
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (s->legacy) {
      if (cudaError_t e = legacy_conflict_locked(); e != cudaSuccess) return fail(e);
    }
    last = s->last;
  }
  wait_done(last);
  PS_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  PS_EMU_STICKY();
  std::lock_guard<std::mutex> lk(streams().mu);
  ps_emu_stream *s = resolve_locked(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    invalidate_locked(s->capture);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (s->legacy) {
    if (cudaError_t e = legacy_conflict_locked(); e != cudaSuccess) return fail(e);
  }
  if (!s->last || s->last->done) return cudaSuccess;
  release_locked(s->last); /* not yet: a later query may find it done */
  return fail(cudaErrorNotReady);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  PS_EMU_STICKY();
  if (flags != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(streams().mu);
  if (event == nullptr || !streams().events.count(event)) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  ps_emu_stream *s = resolve_locked(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (const std::shared_ptr<Capture> &c = event->capture) {
    /* An event recorded in a capture: the waiting stream's next node depends on what the
     * record depended on, and a stream that was not capturing joins the capture. */
    if (c->ended) return fail(cudaErrorStreamCaptureIsolation);
    if (s->capture && s->capture != c) {
      invalidate_locked(s->capture);
      invalidate_locked(c);
      return fail(cudaErrorStreamCaptureMerge);
    }
    if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    if (!s->capture) {
      if (s->legacy) {
        invalidate_locked(c);
        return fail(cudaErrorStreamCaptureImplicit);
      }
      s->capture = c;
      s->tail = event->tail;
      c->streams.push_back(s);
      return cudaSuccess;
    }
    for (size_t n : event->tail) {
      if (std::find(s->tail.begin(), s->tail.end(), n) == s->tail.end()) s->tail.push_back(n);
    }
    return cudaSuccess;
  }
  if (s->capture) {
    /* Work outside the capture cannot be a dependency of a graph's node. */
    invalidate_locked(s->capture);
    return fail(cudaErrorStreamCaptureIsolation);
  }
  /* The record current at this call, as CUDA captures it. */
  return enqueue_locked("cudaStreamWaitEvent", s, nullptr, nullptr, event->last);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data) {
  PS_EMU_STICKY();
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  return enqueue("cudaLaunchHostFunc", stream, [fn, data] { fn(data); });
}

/* The two calls the emulator's NCCL stand-in (nccl_stand_in.c, a library of its own) finds
 * with dlsym in the loaded emulator: a collective runs as a host function at its position in
 * the stream, on emulated device memory only. C names and default visibility, unlike the rest. */
extern "C" __attribute__((visibility("default"))) int ps_emu_launch_host_func(void *stream,
                                                                             void (*fn)(void *),
                                                                             void *data) {
  return (int)cudaLaunchHostFunc((cudaStream_t)stream, fn, data);
}

extern "C" __attribute__((visibility("default"))) int ps_emu_device_accessible(const void *p,
                                                                              size_t bytes) {
  return ps_emu::device_accessible(p, bytes) ? 1 : 0;
}

/* ---- events -------------------------------------------------------------------------------------------- */

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  PS_EMU_STICKY();
  if (event == nullptr || (flags & ~0x7u)) return fail(cudaErrorInvalidValue);
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)) {
    return fail(cudaErrorInvalidValue);
  }
  auto *e = new ps_emu_event();
  e->flags = flags;
  std::lock_guard<std::mutex> lk(streams().mu);
  streams().events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  PS_EMU_STICKY();
  {
    std::lock_guard<std::mutex> lk(streams().mu);
    if (event == nullptr || !streams().events.erase(event)) {
      return fail(cudaErrorInvalidResourceHandle);
    }
  }
  /* Queued records hold the operation, not the event: freeing it now is safe. */
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  PS_EMU_STICKY();
  std::lock_guard<std::mutex> lk(streams().mu);
  if (event == nullptr || !streams().events.count(event)) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  ps_emu_stream *s = resolve_locked(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    if (s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    event->capture = s->capture;
    event->tail = s->tail;
    return cudaSuccess;
  }
  std::shared_ptr<Op> op;
  cudaError_t e = enqueue_locked("cudaEventRecord", s, nullptr, &op, nullptr);
  if (e != cudaSuccess) return e;
  event->last = op;
  event->capture = nullptr;
  event->tail.clear();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  PS_EMU_STICKY();
  std::lock_guard<std::mutex> lk(streams().mu);
  if (event == nullptr || !streams().events.count(event)) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (event->capture) return fail(cudaErrorCapturedEvent);
  if (!event->last || event->last->done) return cudaSuccess;
  release_locked(event->last); /* not yet: a later query may find it done */
  return fail(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  PS_EMU_STICKY();
  std::shared_ptr<Op> last;
  {
    std::lock_guard<std::mutex> lk(streams().mu);
    if (event == nullptr || !streams().events.count(event)) {
      return fail(cudaErrorInvalidResourceHandle);
    }
    if (event->capture) {
      invalidate_locked(event->capture);
      return fail(cudaErrorCapturedEvent);
    }
    last = event->last;
  }
  /* Sleeps on a condition variable whether or not cudaEventBlockingSync was asked for. */
  wait_done(last);
  PS_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  PS_EMU_STICKY();
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(streams().mu);
  auto &ev = streams().events;
  if (start == nullptr || end == nullptr || !ev.count(start) || !ev.count(end)) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if ((start->flags | end->flags) & cudaEventDisableTiming) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (start->capture || end->capture) return fail(cudaErrorCapturedEvent);
  if (!start->last || !end->last) return fail(cudaErrorInvalidResourceHandle);
  if (!start->last->done || !end->last->done) {
    release_locked(std::vector<Op *>{start->last.get(), end->last.get()});
    return fail(cudaErrorNotReady);
  }
  *ms = (float)(end->last->done_ms - start->last->done_ms);
  return cudaSuccess;
}

/* ---- stream capture and graphs ----------------------------------------------------------------- */

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode) {
  if (mode == nullptr || (int)*mode < 0 || (int)*mode > 2) return fail(cudaErrorInvalidValue);
  std::swap(*mode, tl_capture_mode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  PS_EMU_STICKY();
  if ((int)mode < 0 || (int)mode > 2) return fail(cudaErrorInvalidValue);
  Streams &S = streams();
  std::lock_guard<std::mutex> lk(S.mu);
  if (stream == nullptr || stream == cudaStreamLegacy) {
    /* The legacy stream synchronizes with every blocking stream: it cannot capture. */
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  ps_emu_stream *s = resolve_locked(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->streams.push_back(s);
  s->capture = c;
  s->tail.clear();
  S.captures.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  PS_EMU_STICKY();
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  Streams &S = streams();
  std::lock_guard<std::mutex> lk(S.mu);
  ps_emu_stream *s = resolve_locked(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<Capture> c = s->capture;
  if (!c) return fail(cudaErrorIllegalState);
  if (c->origin != s) {
    invalidate_locked(c);
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    return fail(cudaErrorStreamCaptureWrongThread);
  }
  /* Every stream that joined must have been joined back: its last node is the origin's tail
   * or one of its ancestors. */
  const std::vector<Node> &nodes = c->graph->nodes;
  std::vector<bool> joined(nodes.size(), false);
  std::vector<size_t> todo = s->tail;
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (joined[n]) continue;
    joined[n] = true;
    for (size_t d : nodes[n].deps) todo.push_back(d);
  }
  bool unjoined = false;
  for (ps_emu_stream *o : c->streams) {
    for (size_t n : o->tail) unjoined = unjoined || !joined[n];
    o->capture = nullptr;
    o->tail.clear();
  }
  c->ended = true;
  S.captures.erase(std::find(S.captures.begin(), S.captures.end(), c));
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (unjoined) return fail(cudaErrorStreamCaptureUnjoined);
  *graph = new ps_emu_graph{c->graph};
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status) {
  PS_EMU_STICKY();
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(streams().mu);
  ps_emu_stream *s = resolve_locked(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (s->legacy) {
    for (const auto &c : streams().captures)
      for (ps_emu_stream *o : c->streams)
        if (!(o->flags & cudaStreamNonBlocking)) return fail(cudaErrorStreamCaptureImplicit);
  }
  *status = !s->capture              ? cudaStreamCaptureStatusNone
            : s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                          unsigned long long flags) {
  PS_EMU_STICKY();
  if (exec == nullptr || graph == nullptr || (flags & ~1ull)) return fail(cudaErrorInvalidValue);
  *exec = new ps_emu_graph_exec{graph->data, nullptr, 0};
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  return cudaGraphInstantiateWithFlags(exec, graph, flags);
}

namespace {

/* The order a launch queues the nodes in: a topological order, picked as PINSTREAM_EMU_ORDER
 * says among the nodes whose dependencies are queued. */
std::vector<size_t> launch_order(const std::vector<Node> &nodes, uint64_t seed) {
  const size_t n = nodes.size();
  std::vector<size_t> order;
  order.reserve(n);
  const Order o = config().order;
  if (o == Order::forward || o == Order::greedy) {
    for (size_t i = 0; i < n; i++) order.push_back(i);
    return order;
  }
  std::vector<size_t> pending(n, 0);
  std::vector<std::vector<size_t>> users(n);
  for (size_t i = 0; i < n; i++) {
    pending[i] = nodes[i].deps.size();
    for (size_t d : nodes[i].deps) users[d].push_back(i);
  }
  std::vector<size_t> ready;
  for (size_t i = 0; i < n; i++)
    if (pending[i] == 0) ready.push_back(i);
  uint64_t rng = seed;
  while (!ready.empty()) {
    size_t pick = 0;
    if (o == Order::random) {
      rng = mix64(rng);
      pick = (size_t)(rng % ready.size());
    } else {
      pick = (size_t)(std::max_element(ready.begin(), ready.end()) - ready.begin());
    }
    const size_t i = ready[pick];
    ready.erase(ready.begin() + (std::ptrdiff_t)pick);
    order.push_back(i);
    for (size_t u : users[i])
      if (--pending[u] == 0) ready.push_back(u);
  }
  return order;
}

}  // namespace

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  PS_EMU_STICKY();
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<GraphData> data = exec->data;
  const uint64_t seed = mix64(config().seed ^ mix64((uint64_t)(uintptr_t)exec) ^ exec->launches);
  const std::vector<size_t> order = launch_order(data->nodes, seed);
  /* Grids are made here, on the launching thread, so a seed reproduces their block orders. */
  std::vector<std::function<void()>> runs;
  runs.reserve(order.size());
  for (size_t i : order) {
    const Node &node = data->nodes[i];
    if (node.kernel) {
      std::shared_ptr<Grid> grid = make_grid(node.site, node.cfg, node.body, node.pointers.data(),
                                             (int)node.pointers.size());
      runs.push_back([grid, data] {
        std::string message;
        cudaError_t err = run_grid(*grid, &message);
        if (err != cudaSuccess) raise_sticky(err, message);
      });
    } else if (node.run) {
      runs.push_back([data, i] { data->nodes[i].run(); });
    } else {
      runs.push_back(nullptr);
    }
  }
  Streams &S = streams();
  std::lock_guard<std::mutex> lk(S.mu);
  ps_emu_stream *s = resolve_locked(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    /* CUDA would add the graph as a child node; the emulator does not model that. */
    invalidate_locked(s->capture);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  /* One launch of an executable runs after its previous one, whatever stream that was on. */
  std::shared_ptr<Op> after = exec->last, op;
  for (size_t k = 0; k < order.size(); k++) {
    const char *what = data->nodes[order[k]].what;
    cudaError_t e = enqueue_locked(what, s, std::move(runs[k]), &op, after);
    if (e != cudaSuccess) return e;
    after = nullptr;
  }
  if (order.empty()) {
    cudaError_t e = enqueue_locked("cudaGraphLaunch", s, nullptr, &op, after);
    if (e != cudaSuccess) return e;
  }
  exec->last = op;
  exec->launches++;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  /* Launches still queued hold the nodes and the graph's memory until they have run. */
  std::lock_guard<std::mutex> lk(streams().mu);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count) {
  if (graph == nullptr || count == nullptr || nodes != nullptr) return fail(cudaErrorInvalidValue);
  *count = graph->data->nodes.size();
  return cudaSuccess;
}
