/*
 * ps_emu.h — the execution engine of pinstream's CUDA emulator, as the CUDA-facing headers
 * (cuda_runtime.h, cuda_fp16.h, mma.h) see it. Not a CUDA header: nothing in kernels/cuda/
 * names it.
 *
 * The emulator builds the real CUDA sources (kernels/cuda/) with the host C++ compiler. The
 * two constructs that are not C++ are written with the macros of kernels/cuda/launch.cuh,
 * which under the emulator become
 *
 *   PS_LAUNCH(kernel, grid, block, smem, stream, args...)
 *     -> ::ps_emu::launch(Site{"kernel", file, line}, Config(grid, block, smem, stream),
 *                         [](auto... a) { kernel(a...); }, args...)
 *   PS_SHARED_ALIGNED(32, T, name, [N][M]);
 *     -> auto &name = ::ps_emu::shared_var<T[N][M], 32>([] {});
 *
 * and everything else is the headers: every CUDA thread is a fiber on the stack of a host
 * worker thread, one block at a time per worker, and blocks run on a pool of workers in
 * parallel. A fiber runs until it reaches a barrier (__syncthreads), a warp collective
 * (__shfl_*_sync, __syncwarp, wmma::*_sync) or its end; then the block's scheduler picks the
 * next thread in the configured adversarial order. See exec.cc for the rules it enforces.
 */
#ifndef PS_EMU_H
#define PS_EMU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#define PS_EMU_INTERNAL __attribute__((visibility("hidden")))

struct uint3 {
  unsigned int x, y, z;
};

/* CUDA's dim3: unspecified components are 1. */
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

enum cudaError : int;
typedef enum cudaError cudaError_t;
typedef struct ps_emu_stream *cudaStream_t;

namespace ps_emu {

/* The built-in variables of the CUDA thread running on this host thread. The scheduler
 * points ps_emu_regs at the running fiber's registers before switching to it; fibers never
 * move between host threads, so the (initial-exec) TLS slot is always the right one. */
struct Regs {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};

}  // namespace ps_emu

extern __thread ::ps_emu::Regs *ps_emu_regs __attribute__((tls_model("initial-exec")));

namespace ps_emu {

/* Where a launch comes from (for diagnostics). */
struct Site {
  const char *kernel;
  const char *file;
  int line;
};

/* The <<<...>>> configuration. */
struct Config {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Config() : Config(dim3(), dim3()) {}
  Config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
      : grid(g), block(b), smem(s), stream(st) {}
};

/* One kernel with its parameter buffer: run() executes the body as the current thread. */
class KernelBody {
 public:
  virtual ~KernelBody() = default;
  virtual void run() const = 0;
};

template <class F, class Params>
class KernelImpl final : public KernelBody {
 public:
  KernelImpl(F f, Params p) : f_(f), params_(std::move(p)) {}
  /* Every thread gets its own copies of the parameters, as on the device. */
  void run() const override { std::apply(f_, params_); }

 private:
  F f_;
  Params params_;
};

/* A pointer parameter, for the launch-time check that it points into device-accessible
 * memory; other parameters report kNotPointer. */
inline const void *const kNotPointer = reinterpret_cast<const void *>(~uintptr_t(0));
template <class T>
const void *pointer_arg(const T &v) {
  if constexpr (std::is_pointer_v<T>) {
    return (const void *)v;
  } else {
    return kNotPointer;
  }
}

/* Queues a grid on cfg.stream; takes ownership of body. Returns the launch error (invalid
 * configuration or stream), which also becomes the thread's last error. */
PS_EMU_INTERNAL cudaError_t enqueue_launch(const Site &site, const Config &cfg, KernelBody *body,
                                           const void *const *pointers, int count);

template <class F, class... A>
void launch(const Site &site, const Config &cfg, F f, A &&...args) {
  using Params = std::tuple<std::decay_t<A>...>;
  const void *pointers[sizeof...(A) + 1] = {pointer_arg(args)..., nullptr};
  auto *body = new KernelImpl<F, Params>(f, Params(std::forward<A>(args)...));
  (void)enqueue_launch(site, cfg, body, pointers, (int)sizeof...(A));
}

/* ---- shared memory ---------------------------------------------------------------------- */

/* The block's instance of a __shared__ variable identified by `key` (one per declaration and
 * template instantiation): allocated and poisoned by the first thread of the block to reach
 * the declaration. */
PS_EMU_INTERNAL void *shared_alloc(const void *key, size_t bytes, size_t align, const char *file,
                                   int line);
/* extern __shared__ T name[]: the launch's dynamic shared memory. */
PS_EMU_INTERNAL void *dynamic_shared_base();

template <class T, size_t Align, class Tag>
T &shared_var(Tag, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  static const char key = 0;
  constexpr size_t align = Align > alignof(T) ? Align : alignof(T);
  return *static_cast<T *>(shared_alloc(&key, sizeof(T), align < 16 ? 16 : align, file, line));
}

template <class T>
T *dynamic_shared() {
  return static_cast<T *>(dynamic_shared_base());
}

/* ---- synchronization ---------------------------------------------------------------------- */

enum class Barrier { plain, count, all, any };
/* __syncthreads and its reductions: every thread of the block must arrive at the same call. */
PS_EMU_INTERNAL int block_barrier(Barrier kind, int predicate, const char *file, int line);

/* Lets other threads of the block run (atomics and fences in "random" order). */
PS_EMU_INTERNAL void maybe_yield();

/* Stops the grid with an error: the message names the kernel, block and thread. */
[[noreturn]] PS_EMU_INTERNAL void kernel_fault(cudaError_t err, const char *file, int line,
                                               const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* What one lane brings to a warp collective. */
struct LaneIn {
  uint64_t value;  /* shuffles: the bits of the variable; votes: the predicate */
  unsigned arg;    /* shuffles: srcLane / delta / laneMask */
  int width;       /* shuffles */
  const void *src; /* wmma: the matrix pointer or fragments */
  void *dst;
  const void *a, *b;
  unsigned ldm;
  int layout;
};

/* Runs once, by the last lane to arrive, with every participating lane's input; writes each
 * lane's result to out[lane]. */
using Completer = void (*)(const LaneIn *lanes, unsigned mask, uint64_t *out, const void *ctx);

/* The warp collective protocol: every lane named in `mask` must call the same collective
 * (same `what`, same mask) before any of them proceeds. `key` must agree across lanes (wmma:
 * pointer, ldm and layout). Returns this lane's result. */
PS_EMU_INTERNAL uint64_t warp_collective(const char *what, unsigned mask, uint64_t key,
                                         const LaneIn &in, Completer complete, const void *ctx,
                                         const char *file, int line);

/* A permutation of [0, n) that fixes how the elements of an n-element wmma fragment tile are
 * spread over lanes for the current launch: code may not depend on it, so the emulator picks
 * a different one per launch ("random" order) to catch code that does. */
PS_EMU_INTERNAL const uint16_t *fragment_layout(unsigned n);

/* Checks wmma's pointer rules (256-bit aligned pointer, ldm a multiple of 16 bytes). */
PS_EMU_INTERNAL void check_matrix_pointer(const void *p, unsigned ldm, size_t elem,
                                          const char *what, const char *file, int line);

}  // namespace ps_emu

#endif /* PS_EMU_H */
