/*
 * selftest.cu — kernels that break CUDA's rules on purpose, and a few that keep them, run by
 * tests/emu_test.ts against the CUDA emulator (one process per case, since a kernel fault
 * poisons the context for good, as on a GPU).
 *
 *   selftest <case>    prints "key=value" lines; exits 0 unless a CUDA call failed unexpectedly
 */
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "cuda/launch.cuh"

using namespace nvcuda;

#define CHECK(expr)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      printf("unexpected=%s: %s: %s\n", #expr, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* Prints how a faulting launch ended: the error, its text, and what a later call returns. */
static void report_fault() {
  cudaError_t sync = cudaDeviceSynchronize();
  printf("sync=%s\n", cudaGetErrorName(sync));
  printf("message=%s\n", cudaGetErrorString(sync));
  void *p = nullptr;
  printf("after=%s\n", cudaGetErrorName(cudaMalloc(&p, 16)));
  printf("last=%s\n", cudaGetErrorName(cudaGetLastError()));
  printf("last_again=%s\n", cudaGetErrorName(cudaGetLastError()));
}

template <class T>
static std::vector<T> download(const T *d, size_t n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/* ---- asynchronous copies (cuda_pipeline.h) ------------------------------------------------ */

/* Two batches of one 16-byte copy each (the second zero-fills its last 8 bytes), read before
 * any wait, after a barrier, after waiting for the older batch and after waiting for all. */
__global__ void pipeline(const int *src, int *out, int dst_offset) {
  PS_SHARED_ALIGNED(16, int, s, [12]);
  __pipeline_memcpy_async(&s[dst_offset], &src[0], 16);
  __pipeline_commit();
  __pipeline_memcpy_async(&s[4], &src[4], 16, 8);
  __pipeline_commit();
  __syncthreads();
  out[0] = s[0];
  __pipeline_wait_prior(1);
  out[1] = s[0];
  out[2] = s[4];
  __pipeline_wait_prior(0);
  for (int i = 0; i < 4; i++) out[3 + i] = s[4 + i];
}

/* ---- barriers and shared memory ------------------------------------------------------------ */

__global__ void neighbour(int *out, bool barrier) {
  PS_SHARED(int, s, [64]);
  int t = threadIdx.x;
  s[t] = t;
  if (barrier) __syncthreads();
  out[t] = s[(t + 1) % 64];
}

static int run_neighbour(bool barrier) {
  int *d;
  CHECK(cudaMalloc(&d, 64 * sizeof(int)));
  PS_LAUNCH(neighbour, 1, 64, 0, 0, d, barrier);
  CHECK(cudaGetLastError());
  std::vector<int> h = download(d, 64);
  int wrong = 0;
  for (int t = 0; t < 64; t++) wrong += h[t] != (t + 1) % 64;
  printf("wrong=%d\n", wrong);
  return 0;
}

/* Wrong on purpose without the barrier: warp 0 reads what warp 1 wrote, after a shuffle. The
 * shuffle is a scheduling point, and every thread writes before it, so the round-robin orders
 * (forward: every thread reaches the shuffle before any passes it; reverse: warp 1 runs first)
 * never see the race; greedy runs warp 0 through the shuffle before warp 1 has written. */
__global__ void warp_ahead(int *out, bool barrier) {
  PS_SHARED(int, s, [64]);
  const int t = threadIdx.x;
  s[t] = t;
  const int lane0 = __shfl_sync(0xffffffffu, t, 0);
  if (barrier) __syncthreads();
  if (t < 32) out[t] = s[t + 32] + lane0;
}

static int run_warp_ahead(bool barrier) {
  int *d;
  CHECK(cudaMalloc(&d, 32 * sizeof(int)));
  PS_LAUNCH(warp_ahead, 1, 64, 0, 0, d, barrier);
  CHECK(cudaGetLastError());
  std::vector<int> h = download(d, 32);
  int wrong = 0;
  for (int t = 0; t < 32; t++) wrong += h[t] != t + 32;
  printf("wrong=%d\n", wrong);
  return 0;
}

/* Wrong on purpose: only even slots of shared memory are written, and every block reads all of
 * them (the second block after the first has written its own copy). */
__global__ void read_unwritten(float *out, __half *hout, const float *fresh, float *fresh_out) {
  PS_SHARED(float, s, [64]);
  PS_SHARED(__half, h, [64]);
  const int t = threadIdx.x;
  if (t % 2 == 0) {
    s[t] = (float)t;
    h[t] = __float2half((float)t);
  }
  __syncthreads();
  out[blockIdx.x * 64 + t] = s[t];
  hout[blockIdx.x * 64 + t] = h[t];
  fresh_out[blockIdx.x * 64 + t] = fresh[blockIdx.x * 64 + t];
}

static int run_read_unwritten() {
  float *out, *fresh, *fresh_out;
  __half *hout;
  CHECK(cudaMalloc(&out, 128 * sizeof(float)));
  CHECK(cudaMalloc(&hout, 128 * sizeof(__half)));
  CHECK(cudaMalloc(&fresh, 128 * sizeof(float)));
  CHECK(cudaMalloc(&fresh_out, 128 * sizeof(float)));
  PS_LAUNCH(read_unwritten, 2, 64, 0, 0, out, hout, fresh, fresh_out);
  CHECK(cudaGetLastError());
  std::vector<float> o = download(out, 128), f = download(fresh_out, 128);
  std::vector<__half> h = download(hout, 128);
  int shared_nan = 0, shared_written = 0, half_nan = 0, fresh_nan = 0;
  for (int i = 0; i < 128; i++) {
    const int t = i % 64;
    if (t % 2 == 1) {
      shared_nan += o[i] != o[i];
      half_nan += __half2float(h[i]) != __half2float(h[i]);
    } else {
      shared_written += o[i] == (float)t;
    }
    fresh_nan += f[i] != f[i];
  }
  printf("shared_nan=%d half_nan=%d shared_written=%d fresh_nan=%d\n", shared_nan, half_nan,
         shared_written, fresh_nan);
  return 0;
}

__global__ void divergent_barrier() {
  if (threadIdx.x < 32) __syncthreads();
}

__global__ void different_barriers() {
  if (threadIdx.x & 1) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

__global__ void counts(int *out) {
  int t = threadIdx.x;
  out[0] = __syncthreads_count(t % 3 == 0);
  out[1] = __syncthreads_and(t < 1000);
  out[2] = __syncthreads_or(t == 77);
  out[3] = __syncthreads_and(t != 5);
}

__global__ void too_much_shared(float *out) {
  PS_SHARED(float, big, [13 * 1024]);
  big[threadIdx.x] = 1.0f;
  out[0] = big[0];
}

__global__ void dynamic_shared(int *out) {
  PS_EXTERN_SHARED(int, dyn);
  dyn[threadIdx.x] = (int)threadIdx.x * 2;
  __syncthreads();
  out[threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

/* ---- warps ----------------------------------------------------------------------------------- */

__global__ void shfl_mask_lane(int *out) {
  out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, (int)threadIdx.x, 1);
}

__global__ void shfl_full_mask(int *out) {
  out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

__global__ void shfl_exited_lane(int *out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

__global__ void warp_reduce(int *out, float *fout, long long *lout) {
  int v = (int)threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  float f = (float)threadIdx.x;
  for (int o = 1; o < 32; o <<= 1) f += __shfl_xor_sync(0xffffffffu, f, o);
  long long l = (long long)threadIdx.x << 33;
  l = __shfl_sync(0xffffffffu, l, 31);
  int up = __shfl_up_sync(0xffffffffu, (int)threadIdx.x, 1);
  unsigned ballot = __ballot_sync(0xffffffffu, threadIdx.x % 2);
  /* width 8: four groups of eight lanes each read their group's lane 2 */
  int grouped = __shfl_sync(0xffffffffu, (int)threadIdx.x, 2, 8);
  if (threadIdx.x == 0) {
    out[0] = v;
    fout[0] = f;
    lout[0] = l;
    out[1] = (int)ballot;
  }
  if (threadIdx.x == 9) out[2] = up;
  if (threadIdx.x == 13) out[3] = grouped;
}

/* ---- wmma ------------------------------------------------------------------------------------- */

__global__ void wmma_gemm(const __half *a, const __half *b, float *c, int offset) {
  PS_SHARED_ALIGNED(32, __half, sa, [16 * 16 + 16]);
  for (int i = threadIdx.x; i < 256; i += 32) sa[i + offset] = a[i];
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  wmma::load_matrix_sync(fa, sa + offset, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

/* Wrong on purpose: assumes lane l holds row l / 2 of the tile in x[0..7]. */
__global__ void wmma_layout_assumed(const float *m, float *out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, m, 16, wmma::mem_row_major);
  out[threadIdx.x] = acc.x[0];
}

/* ---- grids, atomics and pointers ---------------------------------------------------------------- */

__global__ void record_order(int *counter, int *order) {
  int at = atomicAdd(counter, 1);
  order[at] = (int)(blockIdx.x * blockDim.x + threadIdx.x);
}

__global__ void atomics(float *f, int *i, __half *h) {
  atomicAdd(f, 1.0f);
  atomicAdd(i, 2);
  atomicMax(i + 1, (int)(blockIdx.x * blockDim.x + threadIdx.x));
  if (threadIdx.x < 8) atomicAdd(h, __float2half(1.0f));
}

__global__ void copy_words(const unsigned *src, unsigned *dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void write_at(float *p, long offset) { p[offset] = 1.0f; }

__global__ void set_value(int *p, int v) { *p = v; }

/* Wrong on purpose: 1 MiB of locals per thread. */
__global__ void big_locals(int *out, int n) {
  volatile char local[1 << 20];
  for (int i = 0; i < n; i += 4096) local[i] = (char)i;
  out[threadIdx.x] = local[n / 2];
}

/* ---- cases ------------------------------------------------------------------------------------------ */

static int run(const std::string &c) {
  if (c == "pipeline" || c == "pipeline_misaligned") {
    int h[8] = {10, 11, 12, 13, 14, 15, 16, 17}, *src, *out;
    CHECK(cudaMalloc(&src, sizeof h));
    CHECK(cudaMalloc(&out, 7 * sizeof(int)));
    CHECK(cudaMemcpy(src, h, sizeof h, cudaMemcpyHostToDevice));
    PS_LAUNCH(pipeline, 1, 1, 0, 0, src, out, c == "pipeline" ? 0 : 1);
    if (c == "pipeline_misaligned") {
      report_fault();
      return 0;
    }
    std::vector<int> got = download(out, 7);
    printf("before=%d first=%d second_pending=%d second=%d,%d,%d,%d\n", got[0], got[1], got[2],
           got[3], got[4], got[5], got[6]);
    return 0;
  }
  if (c == "race") return run_neighbour(false);
  if (c == "race_fixed") return run_neighbour(true);
  if (c == "warp_ahead") return run_warp_ahead(false);
  if (c == "read_unwritten") return run_read_unwritten();
  if (c == "warp_ahead_fixed") return run_warp_ahead(true);
  if (c == "divergent_barrier") {
    PS_LAUNCH(divergent_barrier, 2, 64, 0, 0);
    /* No cudaGetLastError() check here: the launch is asynchronous, so the fault may already
       be sticky by then, as on a GPU; report_fault() reads it like the other cases. */
    report_fault();
    return 0;
  }
  if (c == "different_barriers") {
    PS_LAUNCH(different_barriers, 1, 64, 0, 0);
    report_fault();
    return 0;
  }
  if (c == "barrier_counts") {
    int *d;
    CHECK(cudaMalloc(&d, 4 * sizeof(int)));
    PS_LAUNCH(counts, 1, 100, 0, 0, d);
    std::vector<int> h = download(d, 4);
    printf("counts=%d,%d,%d,%d\n", h[0], h[1], h[2], h[3]);
    return 0;
  }
  if (c == "too_much_shared") {
    float *d;
    CHECK(cudaMalloc(&d, 4));
    PS_LAUNCH(too_much_shared, 1, 32, 0, 0, d);
    report_fault();
    return 0;
  }
  if (c == "dynamic_shared") {
    int *d;
    CHECK(cudaMalloc(&d, 40 * sizeof(int)));
    PS_LAUNCH(dynamic_shared, 1, 40, 40 * sizeof(int), 0, d);
    std::vector<int> h = download(d, 40);
    int wrong = 0;
    for (int t = 0; t < 40; t++) wrong += h[t] != (39 - t) * 2;
    printf("wrong=%d\n", wrong);
    return 0;
  }
  if (c == "shfl_mask_lane" || c == "shfl_partial_warp" || c == "shfl_exited_lane") {
    int *d;
    CHECK(cudaMalloc(&d, 64 * sizeof(int)));
    if (c == "shfl_mask_lane") PS_LAUNCH(shfl_mask_lane, 1, 32, 0, 0, d);
    if (c == "shfl_partial_warp") PS_LAUNCH(shfl_full_mask, 1, 48, 0, 0, d);
    if (c == "shfl_exited_lane") PS_LAUNCH(shfl_exited_lane, 1, 32, 0, 0, d);
    report_fault();
    return 0;
  }
  if (c == "warp_reduce") {
    int *d;
    float *f;
    long long *l;
    CHECK(cudaMalloc(&d, 4 * sizeof(int)));
    CHECK(cudaMalloc(&f, sizeof(float)));
    CHECK(cudaMalloc(&l, sizeof(long long)));
    PS_LAUNCH(warp_reduce, 1, 32, 0, 0, d, f, l);
    std::vector<int> h = download(d, 4);
    printf("sum=%d xor_sum=%g long=%lld ballot=%08x up=%d grouped=%d\n", h[0], download(f, 1)[0],
           download(l, 1)[0], (unsigned)h[1], h[2], h[3]);
    return 0;
  }
  if (c == "wmma_gemm" || c == "wmma_misaligned") {
    __half ha[256], hb[256];
    for (int i = 0; i < 256; i++) {
      ha[i] = __float2half((float)(i % 7) - 3.0f);
      hb[i] = __float2half((float)(i % 5) - 2.0f);
    }
    __half *a, *b;
    float *d;
    CHECK(cudaMalloc(&a, sizeof ha));
    CHECK(cudaMalloc(&b, sizeof hb));
    CHECK(cudaMalloc(&d, 256 * sizeof(float)));
    CHECK(cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice));
    PS_LAUNCH(wmma_gemm, 1, 32, 0, 0, a, b, d, c == "wmma_misaligned" ? 8 : 16);
    if (c == "wmma_misaligned") {
      report_fault();
      return 0;
    }
    std::vector<float> h = download(d, 256);
    double worst = 0.0;
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 16; j++) {
        /* b is column major: B(k, j) = hb[j * 16 + k] */
        double want = 1.0;
        for (int k = 0; k < 16; k++) want += (double)ha[i * 16 + k] * (double)hb[j * 16 + k];
        double err = h[i * 16 + j] - want;
        if (err < 0) err = -err;
        if (err > worst) worst = err;
      }
    printf("max_error=%g\n", worst);
    return 0;
  }
  if (c == "wmma_layout") {
    float hm[256];
    for (int i = 0; i < 256; i++) hm[i] = (float)i;
    float *m, *out;
    CHECK(cudaMalloc(&m, sizeof hm));
    CHECK(cudaMalloc(&out, 32 * sizeof(float)));
    CHECK(cudaMemcpy(m, hm, sizeof hm, cudaMemcpyHostToDevice));
    PS_LAUNCH(wmma_layout_assumed, 1, 32, 0, 0, m, out);
    std::vector<float> h = download(out, 32);
    std::string s;
    for (float v : h) s += std::to_string((int)v) + ",";
    printf("x0=%s\n", s.c_str());
    return 0;
  }
  if (c == "block_order" || c == "thread_order") {
    int *counter, *order;
    CHECK(cudaMalloc(&counter, sizeof(int)));
    CHECK(cudaMalloc(&order, 8 * sizeof(int)));
    CHECK(cudaMemset(counter, 0, sizeof(int)));
    if (c == "block_order") PS_LAUNCH(record_order, 8, 1, 0, 0, counter, order);
    else PS_LAUNCH(record_order, 1, 8, 0, 0, counter, order);
    std::vector<int> h = download(order, 8);
    std::string s;
    for (int v : h) s += std::to_string(v);
    printf("order=%s\n", s.c_str());
    return 0;
  }
  if (c == "atomics") {
    float *f;
    int *i;
    __half *h;
    CHECK(cudaMalloc(&f, sizeof(float)));
    CHECK(cudaMalloc(&i, 2 * sizeof(int)));
    CHECK(cudaMalloc(&h, sizeof(__half)));
    CHECK(cudaMemset(f, 0, sizeof(float)));
    CHECK(cudaMemset(i, 0, 2 * sizeof(int)));
    CHECK(cudaMemset(h, 0, sizeof(__half)));
    PS_LAUNCH(atomics, 64, 256, 0, 0, f, i, h);
    std::vector<int> hi = download(i, 2);
    printf("float=%g int=%d max=%d half=%g\n", download(f, 1)[0], hi[0], hi[1],
           __half2float(download(h, 1)[0]));
    return 0;
  }
  if (c == "uninitialized") {
    unsigned *src, *dst;
    CHECK(cudaMalloc(&src, 64 * 4));
    CHECK(cudaMalloc(&dst, 64 * 4));
    PS_LAUNCH(copy_words, 2, 32, 0, 0, src, dst, 64);
    std::vector<unsigned> h = download(dst, 64);
    int poisoned = 0;
    for (unsigned v : h) poisoned += v == 0xffffffffu;
    printf("poisoned=%d\n", poisoned);
    return 0;
  }
  if (c == "host_pointer") {
    std::vector<unsigned> host(64, 7);
    unsigned *dst;
    CHECK(cudaMalloc(&dst, 64 * 4));
    PS_LAUNCH(copy_words, 1, 64, 0, 0, host.data(), dst, 64);
    report_fault();
    return 0;
  }
  if (c == "out_of_bounds") {
    float *p;
    CHECK(cudaMalloc(&p, 1000 * sizeof(float)));
    PS_LAUNCH(write_at, 1, 1, 0, 0, p, 1000 + 1024);
    report_fault(); /* not reached: the fault kills the process */
    return 0;
  }
  if (c == "stack_overflow") {
    int *d;
    CHECK(cudaMalloc(&d, 32 * sizeof(int)));
    PS_LAUNCH(big_locals, 1, 32, 0, 0, d, 1 << 20);
    report_fault(); /* not reached */
    return 0;
  }
  if (c == "use_after_free_async") {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *p;
    CHECK(cudaMallocAsync((void **)&p, 64, s));
    PS_LAUNCH(set_value, 1, 1, 0, s, p, 1);
    CHECK(cudaFreeAsync(p, s));
    PS_LAUNCH(set_value, 1, 1, 0, s, p, 2);
    report_fault();
    return 0;
  }
  if (c == "overlap_copy") {
    char *d;
    CHECK(cudaMalloc(&d, 64));
    printf("overlap=%s\n", cudaGetErrorName(cudaMemcpyAsync(d + 8, d, 32, cudaMemcpyDeviceToDevice)));
    printf("apart=%s\n", cudaGetErrorName(cudaMemcpyAsync(d + 32, d, 32, cudaMemcpyDeviceToDevice)));
    printf("sync=%s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    return 0;
  }
  if (c == "bad_config") {
    PS_LAUNCH(set_value, 1, 2048, 0, 0, nullptr, 0);
    printf("launch=%s\n", cudaGetErrorName(cudaGetLastError()));
    printf("cleared=%s\n", cudaGetErrorName(cudaGetLastError()));
    printf("sync=%s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    return 0;
  }
  if (c == "async") {
    /* With PINSTREAM_EMU_DELAY_US set, each stream operation starts late: a copy to pinned
     * memory has not happened when the call returns; one to pageable memory has. */
    int *d, *pinned, pageable = 0;
    CHECK(cudaMalloc(&d, sizeof(int)));
    CHECK(cudaHostAlloc((void **)&pinned, sizeof(int), cudaHostAllocPortable));
    *pinned = 0;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    PS_LAUNCH(set_value, 1, 1, 0, s, d, 42);
    CHECK(cudaMemcpyAsync(pinned, d, sizeof(int), cudaMemcpyDeviceToHost, s));
    printf("pinned_before=%d query=%s\n", *pinned, cudaGetErrorName(cudaStreamQuery(s)));
    (void)cudaGetLastError(); /* the query's cudaErrorNotReady */
    CHECK(cudaStreamSynchronize(s));
    printf("pinned_after=%d\n", *pinned);
    PS_LAUNCH(set_value, 1, 1, 0, s, d, 7);
    CHECK(cudaMemcpyAsync(&pageable, d, sizeof(int), cudaMemcpyDeviceToHost, s));
    printf("pageable=%d\n", pageable);
    return 0;
  }
  if (c == "stream_order") {
    /* The legacy default stream waits for blocking streams; an event orders two streams. */
    int *d, *e;
    CHECK(cudaMalloc(&d, sizeof(int)));
    CHECK(cudaMalloc(&e, sizeof(int)));
    cudaStream_t a, b;
    CHECK(cudaStreamCreate(&a));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    PS_LAUNCH(set_value, 1, 1, 0, a, d, 5);
    int legacy = 0;
    CHECK(cudaMemcpyAsync(&legacy, d, sizeof(int), cudaMemcpyDeviceToHost, 0));
    PS_LAUNCH(set_value, 1, 1, 0, a, e, 9);
    CHECK(cudaEventRecord(ev, a));
    CHECK(cudaStreamWaitEvent(b, ev, 0));
    int waited = 0;
    CHECK(cudaMemcpyAsync(&waited, e, sizeof(int), cudaMemcpyDeviceToHost, b));
    printf("legacy=%d event=%d\n", legacy, waited);
    return 0;
  }
  printf("unknown case %s\n", c.c_str());
  return 2;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: selftest <case>\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IONBF, 0);
  return run(argv[1]);
}
