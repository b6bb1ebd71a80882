/*
 * exec.cc — how the CUDA emulator runs a grid.
 *
 * One file on purpose, although long: the fiber switch, the block scheduler and its orders,
 * the barrier and warp-collective protocol, shared memory and the fault handler all work on
 * one per-thread Executor and its invariants; split up, each part would need the others'
 * internals.
 *
 * Blocks are claimed by host threads (the stream's own thread and a pool of workers) in the
 * configured order, so blocks of a grid, and grids of different streams, run in parallel as
 * on a GPU. A host thread runs one block at a time: every CUDA thread of the block is a fiber
 * with its own stack, switched cooperatively (a hand-written context switch on x86-64,
 * ucontext elsewhere). A fiber runs until it reaches a barrier or a warp collective, or ends;
 * the block's scheduler then picks the next runnable thread. Threads become runnable in index
 * order (at the block's start, after a barrier); "forward" runs the one waiting longest (so
 * warps advance together, close to lockstep), "reverse" the newest (the highest index first,
 * so the last warp runs ahead of the others), "random" any (seeded per launch and block, and
 * atomics may yield), "greedy" always the lowest runnable index (warp 0 runs as far as it can,
 * through every warp collective, before warp 1 starts: it reads what later warps have not yet
 * written) and "greedy-reverse" the highest. Code that is correct for every order of its
 * threads between synchronization points passes in all of them; a missing __syncthreads()
 * shows up as poisoned (0xff) shared memory or a wrong result in at least one, and no one order
 * catches every race (forward and reverse both miss a warp that reads a later warp's writes
 * after a shuffle; greedy finds it): CI runs several.
 *
 * What the emulator refuses (the grid stops, the error becomes the context's sticky error, as
 * a GPU fault does, and one line on stderr says what, where and in which thread):
 *   - a __syncthreads() that not every thread of the block reaches, or reaches at another call;
 *   - a warp collective whose mask omits the calling lane, names lanes that do not exist,
 *     disagrees between lanes, or that a named lane never reaches (it exited, or waits at
 *     something else): deadlocks are found when no thread of the block can run;
 *   - wmma pointers that are not 256-bit aligned, ldm not a multiple of 16 bytes, lanes passing
 *     different pointers;
 *   - more than 48 KiB of __shared__ variables;
 *   - a pointer parameter that is not inside live device, pinned or registered memory;
 *   - a fault in kernel code (SIGSEGV: device allocations end at a guard page, and freed
 *     memory is unmapped): the handler prints the kernel, block and thread before the
 *     process dies as it would under compute-sanitizer's memcheck.
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#if !defined(__x86_64__) || defined(PS_EMU_UCONTEXT)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define PS_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PS_EMU_ASAN 1
#endif
#endif
#if PS_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "internal.h"

PS_EMU_INTERNAL __thread ps_emu::Regs *ps_emu_regs __attribute__((tls_model("initial-exec"))) =
    nullptr;

namespace ps_emu {

namespace {

constexpr size_t kStackBytes = 128 << 10;
constexpr size_t kMaxThreads = 1024;
constexpr size_t kStaticSharedLimit = 48 << 10;
constexpr size_t kSharedArena = 228 << 10; /* sm_90's most per block */
constexpr unsigned char kPoison = 0xff;

size_t page_size() {
  static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
  return p;
}

/* ---- context switching ------------------------------------------------------------------ */

#if defined(__x86_64__) && !defined(PS_EMU_UCONTEXT)
/* ps_emu_switch(&save, next): pushes the callee-saved registers (and MXCSR / x87 control
 * word), stores the stack pointer in *save, loads `next` and pops the same frame from it. A
 * new fiber's frame "returns" into ps_emu_trampoline, which calls r13(r12). */
extern "C" void ps_emu_switch(void **save, void *next);
extern "C" void ps_emu_trampoline();
asm(R"(
  .text
  .p2align 4
  .type ps_emu_switch,@function
ps_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ps_emu_switch,.-ps_emu_switch
  .p2align 4
  .type ps_emu_trampoline,@function
ps_emu_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size ps_emu_trampoline,.-ps_emu_trampoline
)");

struct Context {
  void *sp = nullptr;
};

void context_make(Context *c, char *stack, size_t bytes, void (*fn)(void *), void *arg) {
  uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
  uint64_t *s = (uint64_t *)top;
  s[-1] = (uint64_t)(uintptr_t)&ps_emu_trampoline; /* "return address": 16-aligned rsp after */
  s[-2] = 0;                                       /* rbp: ends backtraces */
  s[-3] = 0;                                       /* rbx */
  s[-4] = (uint64_t)(uintptr_t)arg;                /* r12 */
  s[-5] = (uint64_t)(uintptr_t)fn;                 /* r13 */
  s[-6] = 0;                                       /* r14 */
  s[-7] = 0;                                       /* r15 */
  uint32_t *csr = (uint32_t *)(top - 64);
  csr[0] = 0x1f80; /* MXCSR: round to nearest, exceptions masked */
  csr[1] = 0x037f; /* x87 control word */
  c->sp = (void *)(top - 64);
}

inline void context_switch(Context *from, Context *to) { ps_emu_switch(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};

void context_make(Context *c, char *stack, size_t bytes, void (*fn)(void *), void *arg) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  /* makecontext passes ints: the argument is the executor, which fn finds in TLS instead. */
  (void)arg;
  makecontext(&c->uc, (void (*)())fn, 0);
}

inline void context_switch(Context *from, Context *to) { swapcontext(&from->uc, &to->uc); }
#endif

/* A stack that control moves to: a fiber's, or the scheduler's (the host thread's own). */
struct Stack {
  const void *bottom = nullptr;
  size_t size = 0;
};

/* context_switch, told to AddressSanitizer in a sanitized build (PINSTREAM_EMU_SANITIZE=1),
 * which would otherwise take a fiber's frames for overflows of the host thread's stack.
 * `last`: `from` is never resumed (its fake stack is released). */
inline void switch_to(Context *from, Context *to, const Stack &dest, bool last = false) {
#if PS_EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(last ? nullptr : &fake, dest.bottom, dest.size);
  context_switch(from, to);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)dest;
  (void)last;
  context_switch(from, to);
#endif
}

/* ---- blocks ------------------------------------------------------------------------------- */

enum class State : uint8_t { runnable, running, barrier, warp, done };

/* One asynchronous copy (cuda_pipeline.h) in flight: its bytes, read at issue. */
struct AsyncCopy {
  void *dst;
  unsigned char data[16];
  unsigned size;
};

struct Thread {
  Regs regs;
  Context ctx;
  unsigned index = 0;
  State state = State::done;
  bool started = false;
  uint64_t result = 0;
  /* What it waits for, for deadlock reports. */
  const char *what = nullptr, *file = nullptr;
  int line = 0;
  unsigned mask = 0;
  /* Asynchronous copies issued and not yet landed, oldest first; batch_end[b] is the number of
   * them in committed batches up to b (the rest are not committed yet). */
  std::vector<AsyncCopy> copies;
  std::vector<size_t> batch_end;
};

struct WarpState {
  bool active = false;
  const char *what = nullptr, *file = nullptr;
  int line = 0;
  unsigned mask = 0, arrived = 0;
  uint64_t key = 0;
  Completer complete = nullptr;
  const void *ctx = nullptr;
  LaneIn lanes[32];
  uint64_t out[32];
};

struct SharedVar {
  const void *key;
  size_t offset;
};

/* Per host thread: everything needed to run one block at a time. Never freed (host threads
 * of the emulator live as long as the process). */
struct Executor {
  std::vector<Thread> threads;
  std::vector<WarpState> warps;
  char *stacks = nullptr;
  size_t stacks_ready = 0;
  Context sched;
  Stack sched_stack; /* learned when a fiber first starts */
  Thread *current = nullptr;
  Grid *grid = nullptr;
  uint3 block{0, 0, 0};
  unsigned nthreads = 0, done = 0;
  bool failed = false;
  uint64_t rng = 0;
  /* Runnable threads, in the order they became runnable (by index at a block's start and
   * after a barrier); "forward" takes the oldest, "reverse" the newest, "random" any. The
   * greedy orders keep them as a bit set instead and take the lowest or highest index. */
  std::vector<unsigned> runnable;
  size_t runnable_head = 0;
  uint64_t runnable_bits[kMaxThreads / 64] = {};
  unsigned runnable_count = 0;
  /* barrier */
  unsigned bar_arrived = 0;
  const char *bar_file = nullptr;
  int bar_line = 0;
  Barrier bar_kind = Barrier::plain;
  int bar_acc = 0;
  /* shared memory: [0, dynamic) is the launch's dynamic shared memory */
  unsigned char *shared = nullptr;
  size_t shared_used = 0, shared_dynamic = 0, shared_poisoned = 0;
  std::vector<SharedVar> shared_vars;
  /* wmma layouts of the current grid */
  uint64_t layout_launch = ~0ull;
  std::vector<std::pair<unsigned, const uint16_t *>> layouts;
};

__thread Executor *tl_exec = nullptr;

uint64_t next_random(Executor &ex) {
  ex.rng = mix64(ex.rng);
  return ex.rng;
}

}  // namespace

/* ---- grids -------------------------------------------------------------------------------- */

struct Grid {
  Site site;
  Config cfg;
  std::shared_ptr<const KernelBody> body; /* shared by the launches of a graph's node */
  std::vector<const void *> pointers;
  uint64_t launch_id = 0, seed = 0;
  uint64_t total = 0, stride = 1, offset = 0; /* block order: (stride * i + offset) % total */
  std::atomic<uint64_t> next{0}, finished{0};
  int users = 0; /* pool workers inside the grid (pool mutex) */
  std::atomic<bool> failed{false};
  std::mutex mu;
  cudaError_t error = cudaSuccess;
  std::string message;
  std::map<unsigned, std::vector<uint16_t>> layouts;
};

namespace {

void grid_fail(Grid &g, cudaError_t err, const std::string &message) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (g.error != cudaSuccess) return;
  g.error = err;
  g.message = message;
  g.failed.store(true, std::memory_order_release);
}

/* "kernel K (launched at F:L) block (x,y,z)[ thread (x,y,z)]" into buf; no allocation, so the
 * fault handler may call it. */
void where(char *buf, size_t cap, const Executor &ex, const Thread *t) {
  const Grid &g = *ex.grid;
  int n = snprintf(buf, cap, "kernel %s (launched at %s:%d) block (%u,%u,%u)", g.site.kernel,
                   g.site.file, g.site.line, ex.block.x, ex.block.y, ex.block.z);
  if (t != nullptr && n > 0 && (size_t)n < cap) {
    snprintf(buf + n, cap - (size_t)n, " thread (%u,%u,%u)", t->regs.thread_idx.x,
             t->regs.thread_idx.y, t->regs.thread_idx.z);
  }
}

std::string where(const Executor &ex, const Thread *t) {
  char buf[512];
  where(buf, sizeof buf, ex, t);
  return buf;
}

Executor &executor(const char *what) {
  Executor *ex = tl_exec;
  if (ex == nullptr || ex->current == nullptr) {
    fprintf(stderr, "pinstream CUDA emulator: %s called outside a kernel\n", what);
    abort();
  }
  return *ex;
}

/* Back to the scheduler; returns when the scheduler runs this thread again. */
void suspend(Executor &ex) {
  Thread *t = ex.current;
  switch_to(&t->ctx, &ex.sched, ex.sched_stack);
}

bool greedy_order() {
  return config().order == Order::greedy || config().order == Order::greedy_reverse;
}

void make_runnable(Executor &ex, Thread &t) {
  t.state = State::runnable;
  t.what = nullptr;
  if (greedy_order()) {
    ex.runnable_bits[t.index / 64] |= 1ull << (t.index % 64);
    ex.runnable_count++;
  } else {
    ex.runnable.push_back(t.index);
  }
}

bool has_runnable(const Executor &ex) {
  return ex.runnable_head < ex.runnable.size() || ex.runnable_count > 0;
}

unsigned pick_runnable(Executor &ex) {
  unsigned idx;
  if (greedy_order()) {
    const unsigned words = kMaxThreads / 64;
    unsigned w = 0;
    if (config().order == Order::greedy) {
      while (ex.runnable_bits[w] == 0) w++;
      idx = w * 64 + (unsigned)__builtin_ctzll(ex.runnable_bits[w]);
    } else {
      w = words - 1;
      while (ex.runnable_bits[w] == 0) w--;
      idx = w * 64 + 63 - (unsigned)__builtin_clzll(ex.runnable_bits[w]);
    }
    ex.runnable_bits[idx / 64] &= ~(1ull << (idx % 64));
    ex.runnable_count--;
    return idx;
  }
  switch (config().order) {
    case Order::forward:
      idx = ex.runnable[ex.runnable_head++];
      break;
    case Order::reverse:
      idx = ex.runnable.back();
      ex.runnable.pop_back();
      break;
    default: {
      const size_t n = ex.runnable.size() - ex.runnable_head;
      const size_t at = ex.runnable_head + (size_t)(next_random(ex) % n);
      idx = ex.runnable[at];
      ex.runnable[at] = ex.runnable.back();
      ex.runnable.pop_back();
      break;
    }
  }
  if (ex.runnable_head == ex.runnable.size()) {
    ex.runnable.clear();
    ex.runnable_head = 0;
  }
  return idx;
}

void fiber_main(void *) {
  Executor &ex = *tl_exec;
#if PS_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &ex.sched_stack.bottom, &ex.sched_stack.size);
#endif
  Thread *t = ex.current;
  ex.grid->body->run();
  t->state = State::done;
  ex.done++;
  switch_to(&t->ctx, &ex.sched, ex.sched_stack, true);
  __builtin_trap(); /* a finished fiber is never resumed */
}

char *stack_of(Executor &ex, unsigned i) {
  const size_t slot = kStackBytes + page_size();
  if (ex.stacks == nullptr) {
    /* One reservation for every stack, each below a guard page; pages are committed only
     * when a stack is first used. */
    void *p = mmap(nullptr, slot * kMaxThreads, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
      fprintf(stderr, "pinstream CUDA emulator: cannot reserve fiber stacks\n");
      abort();
    }
    ex.stacks = (char *)p;
  }
  while (ex.stacks_ready <= i) {
    char *s = ex.stacks + ex.stacks_ready * slot + page_size();
    if (mprotect(s, kStackBytes, PROT_READ | PROT_WRITE) != 0) {
      fprintf(stderr, "pinstream CUDA emulator: cannot map a fiber stack\n");
      abort();
    }
    ex.stacks_ready++;
  }
  return ex.stacks + i * slot + page_size();
}

void install_fault_handler();

/* The fault handler's stack for this thread, given back when the thread ends: disabled first,
 * so that a runtime that frees the alternate stack it installed itself at thread exit
 * (AddressSanitizer unmaps whatever stack is current then) finds none, rather than this
 * malloc'd one. Thread-local destructors run before such thread-exit hooks. */
struct AltStack {
  void *sp = nullptr;
  ~AltStack() {
    if (sp == nullptr) return;
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
    free(sp);
  }
};
thread_local AltStack tl_altstack;

Executor &this_executor() {
  if (tl_exec == nullptr) {
    tl_exec = new Executor();
    tl_exec->threads.resize(kMaxThreads);
    tl_exec->warps.resize(kMaxThreads / 32);
    tl_exec->runnable.reserve(kMaxThreads);
    void *p = mmap(nullptr, kSharedArena, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fprintf(stderr, "pinstream CUDA emulator: cannot map shared memory\n");
      abort();
    }
    tl_exec->shared = (unsigned char *)p;
    /* The fault handler needs a stack of its own: a fiber that overflows its stack faults on
     * the guard page with no stack left. */
    stack_t ss;
    ss.ss_size = 64 << 10;
    ss.ss_sp = malloc(ss.ss_size);
    ss.ss_flags = 0;
    if (ss.ss_sp != nullptr && sigaltstack(&ss, nullptr) == 0) tl_altstack.sp = ss.ss_sp;
  }
  return *tl_exec;
}

std::string deadlock_report(Executor &ex) {
  std::string out = "no thread of the block can run:";
  struct Wait {
    const char *what, *file;
    int line;
    unsigned mask, count, first;
  };
  std::vector<Wait> waits;
  unsigned exited = 0;
  for (unsigned i = 0; i < ex.nthreads; i++) {
    const Thread &t = ex.threads[i];
    if (t.state == State::done) {
      exited++;
      continue;
    }
    bool found = false;
    for (Wait &w : waits) {
      if (w.what == t.what && w.file == t.file && w.line == t.line && w.mask == t.mask) {
        w.count++;
        found = true;
        break;
      }
    }
    if (!found) waits.push_back(Wait{t.what, t.file, t.line, t.mask, 1, i});
  }
  char buf[256];
  for (const Wait &w : waits) {
    if (w.mask != 0) {
      snprintf(buf, sizeof buf, " %u thread(s) (first: %u, warp %u) wait in %s(mask 0x%08x) at %s:%d;",
               w.count, w.first, w.first / 32, w.what, w.mask, w.file, w.line);
    } else {
      snprintf(buf, sizeof buf, " %u thread(s) (first: %u) wait at %s at %s:%d;", w.count, w.first,
               w.what, w.file, w.line);
    }
    out += buf;
  }
  snprintf(buf, sizeof buf, " %u of %u exited", exited, ex.nthreads);
  out += buf;
  out += " (every thread of a block must reach each __syncthreads(), and every lane named in a "
         "warp collective's mask must reach it)";
  return out;
}

void run_block(Executor &ex, Grid &g, uint64_t linear) {
  const dim3 gd = g.cfg.grid, bd = g.cfg.block;
  ex.grid = &g;
  ex.block = uint3{(unsigned)(linear % gd.x), (unsigned)(linear / gd.x % gd.y),
                   (unsigned)(linear / ((uint64_t)gd.x * gd.y))};
  ex.nthreads = bd.x * bd.y * bd.z;
  ex.done = 0;
  ex.failed = false;
  ex.rng = mix64(g.seed ^ mix64(linear + 1));
  ex.bar_arrived = 0;
  ex.runnable.clear();
  ex.runnable_head = 0;
  memset(ex.runnable_bits, 0, sizeof ex.runnable_bits);
  ex.runnable_count = 0;
  /* Shared memory of the previous block reads as poison in this one. */
  memset(ex.shared, kPoison, ex.shared_poisoned);
  ex.shared_dynamic = (g.cfg.smem + 127) & ~(size_t)127;
  ex.shared_used = ex.shared_dynamic;
  if (ex.shared_used > ex.shared_poisoned) {
    memset(ex.shared + ex.shared_poisoned, kPoison, ex.shared_used - ex.shared_poisoned);
    ex.shared_poisoned = ex.shared_used;
  }
  ex.shared_vars.clear();
  for (unsigned w = 0; w < (ex.nthreads + 31) / 32; w++) ex.warps[w].active = false;
  for (unsigned i = 0; i < ex.nthreads; i++) {
    Thread &t = ex.threads[i];
    t.regs.thread_idx = uint3{i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
    t.regs.block_idx = ex.block;
    t.regs.block_dim = bd;
    t.regs.grid_dim = gd;
    t.index = i;
    t.started = false;
    t.mask = 0;
    t.copies.clear(); /* a thread that ended without waiting: its copies never land */
    t.batch_end.clear();
    make_runnable(ex, t);
  }
  while (has_runnable(ex) && !ex.failed) {
    Thread &t = ex.threads[pick_runnable(ex)];
    t.state = State::running;
    ex.current = &t;
    ps_emu_regs = &t.regs;
    char *stack = stack_of(ex, t.index);
    if (!t.started) {
      t.started = true;
#if PS_EMU_ASAN
      /* A fiber that ended in kernel_fault left its frames' redzones poisoned here. */
      ASAN_UNPOISON_MEMORY_REGION(stack, kStackBytes);
#endif
      context_make(&t.ctx, stack, kStackBytes, fiber_main, &ex);
    }
    switch_to(&ex.sched, &t.ctx, Stack{stack, kStackBytes});
  }
  ex.current = nullptr;
  ps_emu_regs = nullptr;
  if (!ex.failed && ex.done < ex.nthreads) {
    std::string msg = where(ex, nullptr) + ": " + deadlock_report(ex);
    grid_fail(g, cudaErrorLaunchFailure, msg);
  }
}

/* ---- the worker pool ---------------------------------------------------------------------- */

struct Pool {
  std::mutex mu;
  std::condition_variable work, idle;
  std::vector<Grid *> grids;
  size_t turn = 0;
  bool started = false;
};

Pool &pool() {
  static Pool *p = new Pool();
  return *p;
}

bool claim_block(Grid &g, uint64_t *linear) {
  uint64_t i = g.next.fetch_add(1, std::memory_order_relaxed);
  if (i >= g.total) return false;
  *linear = (uint64_t)(((unsigned __int128)g.stride * i + g.offset) % g.total);
  return true;
}

void run_claimed(Executor &ex, Grid &g) {
  uint64_t linear;
  while (claim_block(g, &linear)) {
    if (!g.failed.load(std::memory_order_acquire)) run_block(ex, g, linear);
    g.finished.fetch_add(1, std::memory_order_acq_rel);
  }
}

void worker_main() {
  Executor &ex = this_executor();
  Pool &p = pool();
  std::unique_lock<std::mutex> lk(p.mu);
  for (;;) {
    Grid *g = nullptr;
    p.work.wait(lk, [&] {
      for (size_t k = 0; k < p.grids.size(); k++) {
        Grid *c = p.grids[(p.turn + k) % p.grids.size()];
        if (c->next.load(std::memory_order_relaxed) < c->total) {
          g = c;
          p.turn = (p.turn + k + 1) % p.grids.size();
          return true;
        }
      }
      return false;
    });
    g->users++;
    lk.unlock();
    run_claimed(ex, *g);
    lk.lock();
    g->users--;
    p.idle.notify_all();
  }
}

void start_pool() {
  Pool &p = pool();
  std::lock_guard<std::mutex> lk(p.mu);
  if (p.started) return;
  p.started = true;
  for (int i = 0; i < config().workers; i++) std::thread(worker_main).detach();
}

/* ---- faults in kernel code ------------------------------------------------------------------ */

struct sigaction old_segv, old_bus;

void on_fault(int sig, siginfo_t *info, void *uctx) {
  Executor *ex = tl_exec;
  if (ex != nullptr && ex->current != nullptr && ex->grid != nullptr) {
    char at[512], buf[1024];
    where(at, sizeof at, *ex, ex->current);
    const uintptr_t a = (uintptr_t)info->si_addr, stacks = (uintptr_t)ex->stacks;
    const size_t slot = kStackBytes + page_size();
    /* The guard page below a fiber's stack: the thread used more than its stack. */
    const bool overflow = ex->stacks != nullptr && a >= stacks && a < stacks + slot * kMaxThreads &&
                          (a - stacks) % slot < page_size();
    int n = overflow
                ? snprintf(buf, sizeof buf,
                           "pinstream CUDA emulator: %s: stack overflow (a CUDA thread has %zu KiB "
                           "of stack here: large local arrays, or deep recursion)\n",
                           at, kStackBytes >> 10)
                : snprintf(buf, sizeof buf,
                           "pinstream CUDA emulator: %s: illegal address %p (%s): out of bounds "
                           "of its allocation, freed, or host memory the device cannot see\n",
                           at, info->si_addr, sig == SIGSEGV ? "SIGSEGV" : "SIGBUS");
    if (n > 0) (void)!write(2, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
  }
  const struct sigaction &old = sig == SIGSEGV ? old_segv : old_bus;
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction != nullptr) {
      old.sa_sigaction(sig, info, uctx);
      return;
    }
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
    return;
  }
  /* No handler before ours: fault again with the default action (a core dump). */
  signal(sig, SIG_DFL);
}

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
  });
}

}  // namespace

/* ---- the engine's interface ------------------------------------------------------------------ */

std::shared_ptr<Grid> make_grid(const Site &site, const Config &cfg,
                                std::shared_ptr<const KernelBody> body,
                                const void *const *pointers, int count) {
  static std::atomic<uint64_t> launches{0};
  auto g = std::make_shared<Grid>();
  g->site = site;
  g->cfg = cfg;
  g->body = std::move(body);
  for (int i = 0; i < count; i++) g->pointers.push_back(pointers[i]);
  g->launch_id = launches.fetch_add(1, std::memory_order_relaxed);
  g->seed = mix64(config().seed ^ mix64(g->launch_id));
  g->total = (uint64_t)cfg.grid.x * cfg.grid.y * cfg.grid.z;
  switch (config().order) {
    case Order::forward:
    case Order::greedy: g->stride = 1, g->offset = 0; break;
    case Order::reverse:
    case Order::greedy_reverse: g->stride = g->total - 1, g->offset = g->total - 1; break;
    case Order::random: {
      /* A stride coprime with the block count visits every block once, in scattered order. */
      uint64_t s = g->total > 1 ? mix64(g->seed) % g->total : 1;
      for (;;) {
        if (s == 0) s = 1;
        uint64_t a = s, b = g->total;
        while (b) a %= b, std::swap(a, b);
        if (a == 1) break;
        s = (s + 1) % g->total;
      }
      g->stride = s;
      g->offset = mix64(g->seed + 1) % (g->total ? g->total : 1);
      break;
    }
  }
  /* reverse: (total - 1) * i + (total - 1) = (total - 1) - i (mod total) */
  return g;
}

cudaError_t run_grid(Grid &g, std::string *message) {
  for (size_t i = 0; i < g.pointers.size(); i++) {
    const void *p = g.pointers[i];
    if (p == kNotPointer || p == nullptr || device_accessible(p, 1) ||
        device_accessible((const char *)p - 1, 1) /* one past the end */) {
      continue;
    }
    char buf[512];
    snprintf(buf, sizeof buf,
             "kernel %s (launched at %s:%d): parameter %zu is %p, which is not inside any "
             "live device, pinned or registered allocation (host memory, or memory already "
             "freed)",
             g.site.kernel, g.site.file, g.site.line, i + 1, p);
    *message = buf;
    return cudaErrorIllegalAddress;
  }
  install_fault_handler();
  Executor &ex = this_executor();
  Pool &p = pool();
  if (g.total > 1 && config().workers > 0) {
    start_pool();
    std::lock_guard<std::mutex> lk(p.mu);
    p.grids.push_back(&g);
    p.work.notify_all();
  }
  run_claimed(ex, g);
  if (g.total > 1 && config().workers > 0) {
    std::unique_lock<std::mutex> lk(p.mu);
    p.idle.wait(lk, [&] {
      return g.finished.load(std::memory_order_acquire) == g.total && g.users == 0;
    });
    p.grids.erase(std::find(p.grids.begin(), p.grids.end(), &g));
  }
  std::lock_guard<std::mutex> lk(g.mu);
  if (g.error != cudaSuccess) *message = g.message;
  return g.error;
}

void kernel_fault(cudaError_t err, const char *file, int line, const char *fmt, ...) {
  Executor &ex = executor("a device function");
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  char buf[1024];
  snprintf(buf, sizeof buf, "%s at %s:%d: %s", where(ex, ex.current).c_str(), file, line, what);
  grid_fail(*ex.grid, err, buf);
  ex.failed = true;
  Thread *t = ex.current;
  t->state = State::done;
  switch_to(&t->ctx, &ex.sched, ex.sched_stack, true);
  __builtin_trap(); /* a failed block's fibers are never resumed */
}

void *shared_alloc(const void *key, size_t bytes, size_t align, const char *file, int line) {
  Executor &ex = executor("a __shared__ declaration");
  for (const SharedVar &v : ex.shared_vars)
    if (v.key == key) return ex.shared + v.offset;
  const size_t off = (ex.shared_used + align - 1) & ~(align - 1);
  if (off + bytes - ex.shared_dynamic > kStaticSharedLimit) {
    kernel_fault(cudaErrorLaunchOutOfResources, file, line,
                 "__shared__ variables need %zu bytes; a block has %zu bytes of static shared "
                 "memory",
                 off + bytes - ex.shared_dynamic, kStaticSharedLimit);
  }
  if (off + bytes > ex.shared_poisoned) {
    memset(ex.shared + ex.shared_poisoned, kPoison, off + bytes - ex.shared_poisoned);
    ex.shared_poisoned = off + bytes;
  }
  ex.shared_vars.push_back(SharedVar{key, off});
  ex.shared_used = off + bytes;
  return ex.shared + off;
}

void pipeline_copy(void *dst, const void *src, size_t size, size_t zfill, const char *file,
                   int line) {
  Executor &ex = executor("__pipeline_memcpy_async");
  if (size != 4 && size != 8 && size != 16)
    kernel_fault(cudaErrorInvalidValue, file, line,
                 "__pipeline_memcpy_async of %zu bytes (4, 8 or 16)", size);
  if (zfill > size)
    kernel_fault(cudaErrorInvalidValue, file, line,
                 "__pipeline_memcpy_async: zfill %zu is more than the size %zu", zfill, size);
  const unsigned char *d = static_cast<unsigned char *>(dst);
  if (d < ex.shared || d + size > ex.shared + ex.shared_used)
    kernel_fault(cudaErrorIllegalAddress, file, line,
                 "__pipeline_memcpy_async: destination %p is not in the block's shared memory",
                 dst);
  if ((uintptr_t)dst % size != 0 || (uintptr_t)src % size != 0)
    kernel_fault(cudaErrorMisalignedAddress, file, line,
                 "__pipeline_memcpy_async: %p <- %p not aligned to %zu bytes", dst, src, size);
  AsyncCopy c{dst, {}, (unsigned)size};
  if (size > zfill) memcpy(c.data, src, size - zfill);
  memset(dst, kPoison, size);
  ex.current->copies.push_back(c);
}

void pipeline_commit() {
  Thread &t = *executor("__pipeline_commit").current;
  t.batch_end.push_back(t.copies.size());
}

void pipeline_wait_prior(size_t prior) {
  Thread &t = *executor("__pipeline_wait_prior").current;
  if (t.batch_end.size() <= prior) return;
  const size_t batches = t.batch_end.size() - prior, landed = t.batch_end[batches - 1];
  for (size_t i = 0; i < landed; i++) memcpy(t.copies[i].dst, t.copies[i].data, t.copies[i].size);
  t.copies.erase(t.copies.begin(), t.copies.begin() + (ptrdiff_t)landed);
  t.batch_end.erase(t.batch_end.begin(), t.batch_end.begin() + (ptrdiff_t)batches);
  for (size_t &e : t.batch_end) e -= landed;
}

void *dynamic_shared_base() { return executor("extern __shared__").shared; }

int block_barrier(Barrier kind, int predicate, const char *file, int line) {
  Executor &ex = executor("__syncthreads");
  Thread &t = *ex.current;
  static const char *const names[] = {"__syncthreads()", "__syncthreads_count()",
                                      "__syncthreads_and()", "__syncthreads_or()"};
  const char *name = names[(int)kind];
  if (ex.bar_arrived == 0) {
    ex.bar_file = file;
    ex.bar_line = line;
    ex.bar_kind = kind;
    ex.bar_acc = kind == Barrier::all ? 1 : 0;
  } else if (ex.bar_line != line || strcmp(ex.bar_file, file) != 0 || ex.bar_kind != kind) {
    kernel_fault(cudaErrorLaunchFailure, file, line,
                 "%s here while %u thread(s) wait at %s at %s:%d: threads of a block must "
                 "reach the same barrier",
                 name, ex.bar_arrived, names[(int)ex.bar_kind], ex.bar_file, ex.bar_line);
  }
  switch (kind) {
    case Barrier::plain: break;
    case Barrier::count: ex.bar_acc += predicate != 0; break;
    case Barrier::all: ex.bar_acc &= predicate != 0; break;
    case Barrier::any: ex.bar_acc |= predicate != 0; break;
  }
  t.state = State::barrier;
  t.what = name;
  t.file = file;
  t.line = line;
  t.mask = 0;
  if (++ex.bar_arrived == ex.nthreads) {
    ex.bar_arrived = 0;
    for (unsigned i = 0; i < ex.nthreads; i++) {
      Thread &o = ex.threads[i];
      if (o.state == State::barrier) {
        o.result = (uint64_t)ex.bar_acc;
        make_runnable(ex, o);
      }
    }
  }
  /* Even the last to arrive goes back to the scheduler: who runs first after a barrier
   * follows the configured order, not arrival. */
  suspend(ex);
  return (int)t.result;
}

void maybe_yield() {
  Executor *ex = tl_exec;
  if (ex == nullptr || ex->current == nullptr || config().order != Order::random) return;
  if ((next_random(*ex) & 3) != 0) return;
  make_runnable(*ex, *ex->current);
  suspend(*ex);
}

uint64_t warp_collective(const char *what, unsigned mask, uint64_t key, const LaneIn &in,
                         Completer complete, const void *ctx, const char *file, int line) {
  Executor &ex = executor(what);
  Thread &t = *ex.current;
  const unsigned lane = t.index % 32, w = t.index / 32;
  const unsigned lanes = std::min(32u, ex.nthreads - w * 32);
  const unsigned exists = lanes == 32 ? ~0u : (1u << lanes) - 1u;
  if (!(mask >> lane & 1u)) {
    kernel_fault(cudaErrorIllegalInstruction, file, line,
                 "%s: mask 0x%08x does not name the calling lane %u", what, mask, lane);
  }
  if (mask & ~exists) {
    kernel_fault(cudaErrorIllegalInstruction, file, line,
                 "%s: mask 0x%08x names lanes that do not exist (warp %u has %u lanes: the "
                 "block's size is not a multiple of 32)",
                 what, mask, w, lanes);
  }
  WarpState &ws = ex.warps[w];
  if (!ws.active) {
    ws.active = true;
    ws.what = what;
    ws.file = file;
    ws.line = line;
    ws.mask = mask;
    ws.key = key;
    ws.arrived = 0;
    ws.complete = complete;
    ws.ctx = ctx;
  } else if (strcmp(ws.what, what) != 0 || ws.mask != mask) {
    kernel_fault(cudaErrorIllegalInstruction, file, line,
                 "%s(mask 0x%08x) by lane %u while lanes 0x%08x of warp %u wait in "
                 "%s(mask 0x%08x) at %s:%d",
                 what, mask, lane, ws.arrived, w, ws.what, ws.mask, ws.file, ws.line);
  } else if (ws.key != key) {
    kernel_fault(cudaErrorIllegalInstruction, file, line,
                 "%s: lane %u passes another pointer, ldm or layout than lanes 0x%08x of warp %u "
                 "(every lane must pass the same)",
                 what, lane, ws.arrived, w);
  }
  ws.lanes[lane] = in;
  ws.arrived |= 1u << lane;
  t.state = State::warp;
  t.what = what;
  t.file = file;
  t.line = line;
  t.mask = mask;
  if (ws.arrived == mask) {
    ws.active = false;
    ws.complete(ws.lanes, mask, ws.out, ws.ctx);
    for (unsigned l = 0; l < 32; l++) {
      if (!(mask >> l & 1u)) continue;
      Thread &o = ex.threads[w * 32 + l];
      o.result = ws.out[l];
      make_runnable(ex, o);
    }
  }
  /* Even the last lane to arrive goes back to the scheduler: who runs on after a collective
   * follows the configured order, not arrival. */
  suspend(ex);
  return t.result;
}

const uint16_t *fragment_layout(unsigned n) {
  Executor &ex = executor("wmma");
  Grid &g = *ex.grid;
  if (ex.layout_launch != g.launch_id) {
    ex.layout_launch = g.launch_id;
    ex.layouts.clear();
  }
  for (const auto &e : ex.layouts)
    if (e.first == n) return e.second;
  std::lock_guard<std::mutex> lk(g.mu);
  std::vector<uint16_t> &perm = g.layouts[n];
  if (perm.empty()) {
    perm.resize(n);
    for (unsigned i = 0; i < n; i++) perm[i] = (uint16_t)i;
    if (config().order == Order::reverse || config().order == Order::greedy_reverse) {
      std::reverse(perm.begin(), perm.end());
    } else if (config().order == Order::random) {
      uint64_t r = g.seed ^ n;
      for (unsigned i = n - 1; i > 0; i--) {
        r = mix64(r);
        std::swap(perm[i], perm[r % (i + 1)]);
      }
    }
  }
  ex.layouts.emplace_back(n, perm.data());
  return perm.data();
}

void check_matrix_pointer(const void *p, unsigned ldm, size_t elem, const char *what,
                          const char *file, int line) {
  if ((uintptr_t)p % 32 != 0) {
    kernel_fault(cudaErrorMisalignedAddress, file, line,
                 "%s: pointer %p is not 256-bit aligned", what, p);
  }
  if (ldm == 0 || (ldm * elem) % 16 != 0) {
    kernel_fault(cudaErrorMisalignedAddress, file, line,
                 "%s: ldm %u (%zu-byte elements) is not a multiple of 16 bytes", what, ldm, elem);
  }
}

}  // namespace ps_emu
