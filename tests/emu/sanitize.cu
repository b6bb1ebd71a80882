/*
 * sanitize.cu — bugs that AddressSanitizer and UBSan find in code built for the CUDA emulator
 * (PINSTREAM_EMU_SANITIZE=1, tests/emu_asan_test.ts), and a clean case that switches fibers a
 * lot, to show that the emulator's own stack switching gives no false reports.
 *
 *   sanitize <case>    prints "key=value" lines; a sanitizer report ends the process
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "cuda/launch.cuh"

#define CHECK(expr)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      printf("unexpected=%s: %s: %s\n", #expr, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

/* Barriers, shuffles and a local array on every fiber's stack (instrumented frames). */
__global__ void busy(int *out, int rounds) {
  PS_SHARED(int, s, [256]);
  int local[64];
  const int t = threadIdx.x;
  for (int i = 0; i < 64; i++) local[i] = t + i;
  int acc = 0;
  for (int r = 0; r < rounds; r++) {
    s[t] = local[(t + r) % 64];
    __syncthreads();
    acc += s[(t + 1) % blockDim.x];
    acc += __shfl_down_sync(0xffffffffu, acc, 1) & 1;
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + t] = acc;
}

/* Reads `n` ints from `p`: one past the end of a host heap buffer when n is its size + 1. */
__global__ void sum_host(const int *p, int n, int *out) {
  int acc = 0;
  for (int i = 0; i < n; i++) acc += p[i];
  out[threadIdx.x] = acc;
}

/* Signed overflow for a large enough `scale`: undefined in CUDA C++ as in C++. */
__global__ void scaled_index(int scale, long long *out) {
  const int i = (int)threadIdx.x + 1;
  out[threadIdx.x] = i * scale;
}

static int run(const std::string &c) {
  if (c == "clean") {
    int *d;
    CHECK(cudaMalloc(&d, 8 * 256 * sizeof(int)));
    PS_LAUNCH(busy, 8, 256, 0, 0, d, 8);
    CHECK(cudaDeviceSynchronize());
    std::vector<int> h(8 * 256);
    CHECK(cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost));
    printf("ok=%d\n", h[0] > 0 ? 1 : 0);
    return 0;
  }
  if (c == "host_heap_overflow") {
    int *host = new int[16];
    for (int i = 0; i < 16; i++) host[i] = i;
    /* The kernel may read registered host memory (as a mapped pinned buffer on a GPU). */
    CHECK(cudaHostRegister(host, 16 * sizeof(int), cudaHostRegisterMapped));
    int *d;
    CHECK(cudaMalloc(&d, sizeof(int)));
    PS_LAUNCH(sum_host, 1, 1, 0, 0, host, 17, d);
    CHECK(cudaDeviceSynchronize());
    printf("survived=1\n");
    return 0;
  }
  if (c == "signed_overflow") {
    long long *d;
    CHECK(cudaMalloc(&d, 32 * sizeof(long long)));
    PS_LAUNCH(scaled_index, 1, 32, 0, 0, 1 << 30, d);
    CHECK(cudaDeviceSynchronize());
    printf("survived=1\n");
    return 0;
  }
  printf("unknown case %s\n", c.c_str());
  return 2;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: sanitize <case>\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IONBF, 0);
  return run(argv[1]);
}
