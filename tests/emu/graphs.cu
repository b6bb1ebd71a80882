/*
 * graphs.cu — stream capture and graph launches on the CUDA emulator, run by
 * tests/emu_graphs_test.ts: what a graph replays, and the errors CUDA gives for what a capture
 * cannot hold.
 *
 *   graphs <case>    prints "key=value" lines; exits 0 unless a CUDA call failed unexpectedly
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <thread>
#include <vector>

#include "cuda/launch.cuh"

#define CHECK(expr)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      printf("unexpected=%s: %s: %s\n", #expr, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define SHOW(key, expr) printf("%s=%s\n", key, cudaGetErrorName(expr))

constexpr int N = 256;

/* x[i] = 2 x[i] + 1: every application changes the result, so a node run twice, skipped or
 * run before what it depends on shows. */
__global__ void twice_plus_one(float *x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}

/* z[i] = x[i] - y[i] */
__global__ void difference(const float *x, const float *y, float *z, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = x[i] - y[i];
}

static std::vector<float> download(const float *d) {
  std::vector<float> h(N);
  CHECK(cudaMemcpy(h.data(), d, N * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

static cudaStreamCaptureStatus status_of(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CHECK(cudaStreamIsCapturing(s, &st));
  return st;
}

static const char *status_name(cudaStreamCaptureStatus st) {
  return st == cudaStreamCaptureStatusNone     ? "none"
         : st == cudaStreamCaptureStatusActive ? "active"
                                               : "invalidated";
}

/* A capture over two streams (a fork through an event and a join back), replayed three times:
 *   main: x = 2x + 1; record fork;            copy y <- x;  wait join; z = x - y (after side)
 *   side: wait fork; w = x (memset then copy); w = 2w + 1;  record join
 * then main's last kernel reads x, y and the side's w: z = x - y = 0 and w = 2x + 1 per launch.
 * Nothing runs while capturing. */
static int run_replay(cudaStreamCaptureMode mode) {
  float *x, *y, *z, *w;
  CHECK(cudaMalloc(&x, N * sizeof(float)));
  CHECK(cudaMalloc(&y, N * sizeof(float)));
  CHECK(cudaMalloc(&z, N * sizeof(float)));
  CHECK(cudaMalloc(&w, N * sizeof(float)));
  std::vector<float> h(N);
  for (int i = 0; i < N; i++) h[i] = (float)(i % 7);
  CHECK(cudaMemcpy(x, h.data(), N * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(z, 0, N * sizeof(float)));
  cudaStream_t main_s, side;
  CHECK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  CHECK(cudaStreamBeginCapture(main_s, mode));
  printf("status=%s\n", status_name(status_of(main_s)));
  printf("side_before=%s\n", status_name(status_of(side)));
  PS_LAUNCH(twice_plus_one, 2, 128, 0, main_s, x, N);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(fork, main_s));
  CHECK(cudaStreamWaitEvent(side, fork, 0));
  printf("side_joined=%s\n", status_name(status_of(side)));
  CHECK(cudaMemsetAsync(w, 0, N * sizeof(float), side));
  CHECK(cudaMemcpyAsync(w, x, N * sizeof(float), cudaMemcpyDeviceToDevice, side));
  PS_LAUNCH(twice_plus_one, 2, 128, 0, side, w, N);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(join, side));
  CHECK(cudaMemcpyAsync(y, x, N * sizeof(float), cudaMemcpyDeviceToDevice, main_s));
  CHECK(cudaStreamWaitEvent(main_s, join, 0));
  PS_LAUNCH(difference, 2, 128, 0, main_s, x, y, z, N);
  CHECK(cudaGetLastError());
  printf("query_captured=%s\n", cudaGetErrorName(cudaEventQuery(join)));
  (void)cudaGetLastError();
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(main_s, &graph));
  printf("status_after=%s side_after=%s\n", status_name(status_of(main_s)),
         status_name(status_of(side)));
  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  printf("nodes=%zu\n", nodes);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> before = download(x);
  int ran = 0;
  for (int i = 0; i < N; i++) ran += before[i] != h[i];
  printf("ran_while_capturing=%d\n", ran);

  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph)); /* the executable keeps what it needs */
  int wrong = 0;
  std::vector<float> expect = h;
  for (int launch = 0; launch < 3; launch++) {
    CHECK(cudaGraphLaunch(exec, main_s));
    CHECK(cudaStreamSynchronize(main_s));
    for (float &v : expect) v = 2.0f * v + 1.0f;
    std::vector<float> hx = download(x), hz = download(z), hw = download(w);
    for (int i = 0; i < N; i++) {
      wrong += hx[i] != expect[i];
      wrong += hz[i] != 0.0f;
      wrong += hw[i] != 2.0f * expect[i] + 1.0f;
    }
  }
  printf("wrong=%d\n", wrong);
  /* Launched on the legacy stream, the graph still runs after its previous launch. */
  CHECK(cudaGraphLaunch(exec, main_s));
  CHECK(cudaGraphLaunch(exec, 0));
  CHECK(cudaDeviceSynchronize());
  std::vector<float> hx = download(x);
  int wrong_twice = 0;
  for (int i = 0; i < N; i++) wrong_twice += hx[i] != 4.0f * expect[i] + 3.0f;
  printf("wrong_two_launches=%d\n", wrong_twice);
  CHECK(cudaGraphExecDestroy(exec));
  return 0;
}

/* A fork whose work never joins the origin stream again. */
static int run_unjoined() {
  float *x;
  CHECK(cudaMalloc(&x, N * sizeof(float)));
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t fork;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
  CHECK(cudaEventRecord(fork, a));
  CHECK(cudaStreamWaitEvent(b, fork, 0));
  PS_LAUNCH(twice_plus_one, 2, 128, 0, b, x, N);
  cudaGraph_t graph = (cudaGraph_t)0x1;
  SHOW("end", cudaStreamEndCapture(a, &graph));
  printf("graph_null=%d\n", graph == nullptr);
  printf("b_after=%s\n", status_name(status_of(b)));
  SHOW("last", cudaGetLastError());
  /* The stream works as before once the capture is over. */
  PS_LAUNCH(twice_plus_one, 2, 128, 0, b, x, N);
  SHOW("after", cudaStreamSynchronize(b));
  return 0;
}

/* A call that cannot be captured, made on the capturing thread: refused, the capture
 * invalidated, and its end fails. `what`: malloc, memcpy, memset, stream_sync, device_sync,
 * pageable (an async copy from pageable memory), query, wait_outside (an event recorded
 * before the capture), free_outside (cudaFreeAsync of memory from before the capture). */
static int run_refused(const std::string &what, cudaStreamCaptureMode mode) {
  float *x, *outside;
  CHECK(cudaMalloc(&x, N * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaMallocAsync(&outside, 64, s));
  cudaEvent_t before;
  CHECK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
  CHECK(cudaEventRecord(before, s));
  CHECK(cudaStreamSynchronize(s));
  std::vector<float> host(N, 1.0f);
  CHECK(cudaStreamBeginCapture(s, mode));
  PS_LAUNCH(twice_plus_one, 2, 128, 0, s, x, N);
  cudaError_t e = cudaSuccess;
  void *p = nullptr;
  if (what == "malloc") {
    e = cudaMalloc(&p, 16);
  } else if (what == "memcpy") {
    e = cudaMemcpy(x, host.data(), N * sizeof(float), cudaMemcpyHostToDevice);
  } else if (what == "memset") {
    e = cudaMemset(x, 0, N * sizeof(float));
  } else if (what == "stream_sync") {
    e = cudaStreamSynchronize(s);
  } else if (what == "device_sync") {
    e = cudaDeviceSynchronize();
  } else if (what == "pageable") {
    e = cudaMemcpyAsync(x, host.data(), N * sizeof(float), cudaMemcpyHostToDevice, s);
  } else if (what == "query") {
    e = cudaStreamQuery(s);
  } else if (what == "wait_outside") {
    e = cudaStreamWaitEvent(s, before, 0);
  } else if (what == "free_outside") {
    e = cudaFreeAsync(outside, s);
  } else {
    printf("unknown refusal %s\n", what.c_str());
    exit(2);
  }
  printf("call=%s\n", cudaGetErrorName(e));
  (void)cudaGetLastError();
  printf("status=%s\n", status_name(status_of(s)));
  /* Work queued on an invalidated capture is refused too. */
  PS_LAUNCH(twice_plus_one, 2, 128, 0, s, x, N);
  printf("launch_after=%s\n", cudaGetErrorName(cudaGetLastError()));
  cudaGraph_t graph = (cudaGraph_t)0x1;
  SHOW("end", cudaStreamEndCapture(s, &graph));
  printf("graph_null=%d\n", graph == nullptr);
  (void)cudaGetLastError();
  if (graph != nullptr && graph != (cudaGraph_t)0x1) CHECK(cudaGraphDestroy(graph));
  if (p != nullptr) CHECK(cudaFree(p));
  SHOW("sync_after", cudaDeviceSynchronize());
  return 0;
}

/* CUDA's capture modes: what another thread may do while this one captures. */
static int run_other_thread(cudaStreamCaptureMode mode) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(s, mode));
  cudaError_t other = cudaSuccess;
  void *p = nullptr;
  std::thread([&] { other = cudaMalloc(&p, 16); }).join();
  printf("other=%s\n", cudaGetErrorName(other));
  /* A thread that asks for relaxed interaction is never refused. */
  cudaError_t relaxed = cudaSuccess;
  void *q = nullptr;
  std::thread([&] {
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&m);
    relaxed = cudaMalloc(&q, 16);
  }).join();
  printf("other_relaxed=%s\n", cudaGetErrorName(relaxed));
  cudaGraph_t graph = nullptr;
  SHOW("end", cudaStreamEndCapture(s, &graph));
  (void)cudaGetLastError();
  if (graph != nullptr) CHECK(cudaGraphDestroy(graph));
  return 0;
}

/* The legacy stream cannot capture, and may not be used while a blocking stream captures. */
static int run_legacy() {
  float *x;
  CHECK(cudaMalloc(&x, N * sizeof(float)));
  SHOW("begin_legacy", cudaStreamBeginCapture(0, cudaStreamCaptureModeThreadLocal));
  (void)cudaGetLastError();
  cudaStream_t blocking;
  CHECK(cudaStreamCreate(&blocking));
  CHECK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeThreadLocal));
  SHOW("begin_again", cudaStreamBeginCapture(blocking, cudaStreamCaptureModeThreadLocal));
  (void)cudaGetLastError();
  PS_LAUNCH(twice_plus_one, 2, 128, 0, 0, x, N);
  printf("launch_legacy=%s\n", cudaGetErrorName(cudaGetLastError()));
  cudaGraph_t graph = nullptr;
  SHOW("end", cudaStreamEndCapture(blocking, &graph));
  (void)cudaGetLastError();
  SHOW("end_again", cudaStreamEndCapture(blocking, &graph));
  (void)cudaGetLastError();
  return 0;
}

/* cudaMallocAsync and cudaFreeAsync in a capture become the graph's own memory: the same
 * address at every launch, found poisoned again by each. */
__global__ void fill_from(float *dst, const float *src, float add, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] + add;
}

static int run_alloc_nodes() {
  float *x, *out;
  CHECK(cudaMalloc(&x, N * sizeof(float)));
  CHECK(cudaMalloc(&out, N * sizeof(float)));
  CHECK(cudaMemset(x, 0, N * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  float *tmp = nullptr;
  CHECK(cudaMallocAsync(&tmp, N * sizeof(float), s));
  PS_LAUNCH(fill_from, 2, 128, 0, s, out, tmp, 0.0f, N); /* reads the fresh allocation */
  PS_LAUNCH(fill_from, 2, 128, 0, s, tmp, x, 1.0f, N);
  PS_LAUNCH(twice_plus_one, 2, 128, 0, s, x, N);
  CHECK(cudaFreeAsync(tmp, s));
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  int poisoned = 0;
  for (int launch = 0; launch < 2; launch++) {
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    std::vector<float> h = download(out);
    for (float v : h) poisoned += v != v;
  }
  printf("poisoned=%d\n", poisoned);
  std::vector<float> hx = download(x);
  int wrong = 0;
  for (float v : hx) wrong += v != 3.0f; /* 0 -> 1 -> 3 */
  printf("wrong=%d\n", wrong);
  CHECK(cudaGraphExecDestroy(exec));
  return 0;
}

static cudaStreamCaptureMode mode_named(const std::string &m) {
  if (m == "global") return cudaStreamCaptureModeGlobal;
  if (m == "thread_local") return cudaStreamCaptureModeThreadLocal;
  if (m == "relaxed") return cudaStreamCaptureModeRelaxed;
  printf("unknown mode %s\n", m.c_str());
  exit(2);
}

static int run(const std::string &c) {
  /* <case>:<mode> for the cases that take a capture mode. */
  const size_t colon = c.find(':');
  const std::string name = c.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : c.substr(colon + 1);
  if (name == "replay") return run_replay(mode_named(arg));
  if (name == "unjoined") return run_unjoined();
  if (name == "other_thread") return run_other_thread(mode_named(arg));
  if (name == "legacy") return run_legacy();
  if (name == "alloc_nodes") return run_alloc_nodes();
  if (name.rfind("refused-", 0) == 0) return run_refused(name.substr(8), mode_named(arg));
  printf("unknown case %s\n", c.c_str());
  return 2;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: graphs <case>\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IONBF, 0);
  return run(argv[1]);
}
