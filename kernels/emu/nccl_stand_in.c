// A stand-in for libnccl.so.2 on machines without a GPU: the NCCL calls dist/_nccl.ts makes,
// for the CUDA emulator's device memory, between the rank processes of one machine through a
// shared-memory segment, so the nccl backend's code path (communicator init, group calls,
// stream ordering, asynchronous errors, abort) runs in CI. Selected with
// PINSTREAM_NCCL_LIB=<this library>; it needs the emulated cuda backend loaded in the process.
//
// Each collective runs as a host function on the emulated stream it was issued on (the
// emulator's ps_emu_launch_host_func), so it happens at its position in the stream and in the
// order of the events the stream waits for, in deferred-stream mode too. There it moves the
// data through one staging slot per rank, a chunk at a time, with a barrier on either side of
// each chunk. Reductions run in rank order in fp32 (fp16 and bf16 rounded once at the end),
// so every rank gets bit-identical results; NCCL's own rings and trees round differently.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
} ncclResult_t;

enum { ncclInt32 = 2, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
enum { OP_ALL_REDUCE, OP_BROADCAST, OP_ALL_GATHER, OP_REDUCE_SCATTER };

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

#define MAX_RANKS 64
#define SLOT_BYTES (1u << 20)
#define MAGIC "psnccl1"

// The segment every rank of a communicator maps; the staging slots follow it.
typedef struct {
  int32_t nranks;
  _Atomic uint32_t joined;
  _Atomic uint32_t arrived;
  _Atomic uint32_t generation;  // futex word of the barrier
  _Atomic int32_t failed;       // 1 + the rank that aborted or was found dead, else 0
  _Atomic int32_t pids[MAX_RANKS];
} Shared;

typedef struct ncclComm {
  int rank, nranks;
  Shared *shared;
  size_t map_bytes;
  unsigned char *slots;
  _Atomic int refs;         // the user's, plus one per collective queued
  _Atomic int aborted;      // set by ncclCommAbort
  _Atomic int async_error;  // the first failure of a collective
  char name[64];
  char message[160];  // what the first failed collective found
} * ncclComm_t;

static __thread char last_error[256];

static ncclResult_t fail(ncclResult_t r, const char *fmt, const char *detail) {
  snprintf(last_error, sizeof last_error, fmt, detail);
  return r;
}

// ---- the emulator's hooks

#include "stand_in_hooks.h"

// ---- fp16 and bf16

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0) {
    float f = (float)m / 16777216.0f;  // subnormal: m x 2^-24, exact
    return sign ? -f : f;
  }
  bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // from 65520 up: inf
  if (ax < 0x38800000u) {                       // below 2^-14: a subnormal half
    float a = (f < 0 ? -f : f) * 16777216.0f;   // in units of 2^-24, exact
    uint32_t i = (uint32_t)a;
    float frac = a - (float)i;
    if (frac > 0.5f || (frac == 0.5f && (i & 1))) i++;
    return sign | (uint16_t)i;
  }
  uint32_t h = (((ax >> 23) - 112) << 10) | ((ax & 0x7fffff) >> 13), rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return sign | (uint16_t)h;
}

static float bf16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case ncclInt32:
    case ncclFloat32: return 4;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclFloat64: return 8;
    default: return 0;
  }
}

// ---- barrier and failure detection

static void futex_wait(_Atomic uint32_t *word, uint32_t value, long ns) {
  struct timespec t = {0, ns};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, value, &t, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// A rank whose process is gone (it crashed, or was killed) fails every collective of the
// others at their next barrier, instead of leaving them waiting for the watchdog.
static int dead_rank(ncclComm_t c) {
  for (int r = 0; r < c->nranks; r++) {
    int pid = atomic_load(&c->shared->pids[r]);
    if (r != c->rank && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) return r;
  }
  return -1;
}

static ncclResult_t barrier(ncclComm_t c) {
  Shared *s = c->shared;
  uint32_t gen = atomic_load(&s->generation);
  if (atomic_fetch_add(&s->arrived, 1) == (uint32_t)c->nranks - 1) {
    atomic_store(&s->arrived, 0);
    atomic_fetch_add(&s->generation, 1);
    futex_wake(&s->generation);
    return ncclSuccess;
  }
  for (int spins = 0; atomic_load(&s->generation) == gen; spins++) {
    if (atomic_load(&c->aborted)) {
      snprintf(c->message, sizeof c->message, "this rank aborted the communicator");
      return ncclInvalidUsage;
    }
    int failed = atomic_load(&s->failed);
    if (failed) {
      snprintf(c->message, sizeof c->message, "rank %d aborted the communicator or exited",
               failed - 1);
      return ncclRemoteError;
    }
    if (spins % 16 == 15) {
      int dead = dead_rank(c);
      if (dead >= 0) {
        int expected = 0;
        atomic_compare_exchange_strong(&s->failed, &expected, 1 + dead);
        snprintf(c->message, sizeof c->message, "rank %d (pid %d) exited", dead,
                 (int)atomic_load(&s->pids[dead]));
        return ncclRemoteError;
      }
    }
    futex_wait(&s->generation, gen, 5 * 1000 * 1000);
  }
  return ncclSuccess;
}

// ---- the collectives

typedef struct {
  int kind, dtype, redop, root;
  const unsigned char *send;
  unsigned char *recv;
  size_t count;
  ncclComm_t comm;
  void *stream;
} Op;

static void release(ncclComm_t c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  munmap(c->shared, c->map_bytes);
  free(c);
}

static float load(const unsigned char *p, int dtype, size_t i) {
  switch (dtype) {
    case ncclFloat16: return half_to_float(((const uint16_t *)p)[i]);
    case ncclBfloat16: return bf16_to_float(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
  }
}

static void store(unsigned char *p, int dtype, size_t i, float v) {
  switch (dtype) {
    case ncclFloat16: ((uint16_t *)p)[i] = float_to_half(v); break;
    case ncclBfloat16: ((uint16_t *)p)[i] = float_to_bf16(v); break;
    default: ((float *)p)[i] = v;
  }
}

// out[i] = the reduction over ranks, in rank order, of element `first + i` of every slot.
static void reduce(ncclComm_t c, const Op *op, size_t first, size_t n, unsigned char *out) {
  const int R = c->nranks;
  for (size_t i = 0; i < n; i++) {
    const size_t k = first + i;
    if (op->dtype == ncclInt32) {
      int64_t acc = ((const int32_t *)c->slots)[k];
      for (int r = 1; r < R; r++) {
        int64_t v = ((const int32_t *)(c->slots + (size_t)r * SLOT_BYTES))[k];
        acc = op->redop == ncclMax    ? (v > acc ? v : acc)
              : op->redop == ncclMin  ? (v < acc ? v : acc)
              : op->redop == ncclProd ? (int64_t)(int32_t)((uint32_t)acc * (uint32_t)v)
                                      : (int64_t)(int32_t)((uint32_t)acc + (uint32_t)v);
      }
      if (op->redop == ncclAvg) acc /= R;
      ((int32_t *)out)[i] = (int32_t)acc;
    } else if (op->dtype == ncclFloat64) {
      double acc = ((const double *)c->slots)[k];
      for (int r = 1; r < R; r++) {
        double v = ((const double *)(c->slots + (size_t)r * SLOT_BYTES))[k];
        acc = op->redop == ncclMax    ? (v > acc ? v : acc)
              : op->redop == ncclMin  ? (v < acc ? v : acc)
              : op->redop == ncclProd ? acc * v
                                      : acc + v;
      }
      ((double *)out)[i] = op->redop == ncclAvg ? acc / R : acc;
    } else {
      float acc = load(c->slots, op->dtype, k);
      for (int r = 1; r < R; r++) {
        float v = load(c->slots + (size_t)r * SLOT_BYTES, op->dtype, k);
        acc = op->redop == ncclMax    ? (v > acc || v != v ? v : acc)
              : op->redop == ncclMin  ? (v < acc || v != v ? v : acc)
              : op->redop == ncclProd ? acc * v
                                      : acc + v;
      }
      store(out, op->dtype, i, op->redop == ncclAvg ? acc / (float)R : acc);
    }
  }
}

static ncclResult_t run(const Op *op) {
  ncclComm_t c = op->comm;
  const size_t e = dtype_bytes(op->dtype), R = (size_t)c->nranks;
  unsigned char *mine = c->slots + (size_t)c->rank * SLOT_BYTES;
  // Elements a chunk moves per rank: reduce-scatter stages every block of its chunk at once.
  const size_t step = op->kind == OP_REDUCE_SCATTER ? SLOT_BYTES / e / R : SLOT_BYTES / e;
  ncclResult_t r = ncclSuccess;
  for (size_t off = 0; off < op->count && r == ncclSuccess; off += step) {
    const size_t n = op->count - off < step ? op->count - off : step;
    switch (op->kind) {
      case OP_ALL_REDUCE:
        memcpy(mine, op->send + off * e, n * e);
        if ((r = barrier(c))) break;
        reduce(c, op, 0, n, op->recv + off * e);
        break;
      case OP_BROADCAST:
        if (c->rank == op->root) memcpy(mine, op->send + off * e, n * e);
        if ((r = barrier(c))) break;
        memcpy(op->recv + off * e, c->slots + (size_t)op->root * SLOT_BYTES, n * e);
        break;
      case OP_ALL_GATHER:
        memcpy(mine, op->send + off * e, n * e);
        if ((r = barrier(c))) break;
        for (size_t k = 0; k < R; k++) {
          memcpy(op->recv + (k * op->count + off) * e, c->slots + k * SLOT_BYTES, n * e);
        }
        break;
      case OP_REDUCE_SCATTER:
        for (size_t b = 0; b < R; b++) {
          memcpy(mine + b * step * e, op->send + (b * op->count + off) * e, n * e);
        }
        if ((r = barrier(c))) break;
        reduce(c, op, (size_t)c->rank * step, n, op->recv + off * e);
        break;
    }
    if (r == ncclSuccess) r = barrier(c);  // the slots are free again
  }
  return r;
}

static void run_host(void *data) {
  Op *op = data;
  ncclComm_t c = op->comm;
  if (!atomic_load(&c->aborted) && !atomic_load(&c->async_error)) {
    ncclResult_t r = run(op);
    int expected = 0;
    if (r != ncclSuccess) atomic_compare_exchange_strong(&c->async_error, &expected, (int)r);
  }
  release(c);
  free(op);
}

// Collectives issued between ncclGroupStart and ncclGroupEnd, queued at the end in issue order.
static __thread int group_depth;
static __thread Op **group_ops;
static __thread int group_count, group_cap;

static ncclResult_t launch(Op *op) {
  atomic_fetch_add(&op->comm->refs, 1);
  int rc = launch_host_func(op->stream, run_host, op);
  if (rc != 0) {
    release(op->comm);
    free(op);
    return fail(ncclUnhandledCudaError, "%s", "the emulated stream refused the collective");
  }
  return ncclSuccess;
}

static ncclResult_t issue(int kind, const void *send, void *recv, size_t count, int dtype,
                          int redop, int root, ncclComm_t comm, void *stream) {
  if (!comm || atomic_load(&comm->refs) <= 0) {
    return fail(ncclInvalidArgument, "%s", "invalid communicator");
  }
  if (atomic_load(&comm->aborted)) return fail(ncclInvalidUsage, "%s", "communicator aborted");
  const size_t e = dtype_bytes(dtype);
  if (e == 0) return fail(ncclInvalidArgument, "%s", "unsupported data type");
  if (redop < ncclSum || redop > ncclAvg) {
    return fail(ncclInvalidArgument, "%s", "unsupported reduction");
  }
  if (root < 0 || root >= comm->nranks) return fail(ncclInvalidArgument, "%s", "invalid root");
  const size_t R = (size_t)comm->nranks;
  const size_t in = kind == OP_REDUCE_SCATTER ? count * R : count;
  const size_t out = kind == OP_ALL_GATHER ? count * R : count;
  const int sends = kind != OP_BROADCAST || comm->rank == root;
  if (count > 0 &&
      ((sends && !device_accessible(send, in * e)) || !device_accessible(recv, out * e))) {
    return fail(ncclInvalidArgument, "%s", "a buffer is not device memory of the emulator");
  }
  Op *op = malloc(sizeof *op);
  if (!op) return fail(ncclSystemError, "%s", "out of host memory");
  *op = (Op){kind, dtype, redop, root, send, recv, count, comm, stream};
  if (group_depth == 0) return launch(op);
  if (group_count == group_cap) {
    int cap = group_cap ? 2 * group_cap : 16;
    Op **grown = realloc(group_ops, (size_t)cap * sizeof *grown);
    if (!grown) {
      free(op);
      return fail(ncclSystemError, "%s", "out of host memory");
    }
    group_ops = grown;
    group_cap = cap;
  }
  atomic_fetch_add(&comm->refs, 1);  // the group's hold until ncclGroupEnd
  group_ops[group_count++] = op;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op,
                           ncclComm_t comm, void *stream) {
  return issue(OP_ALL_REDUCE, send, recv, count, dtype, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root,
                           ncclComm_t comm, void *stream) {
  return issue(OP_BROADCAST, send, recv, count, dtype, ncclSum, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, int dtype,
                           ncclComm_t comm, void *stream) {
  return issue(OP_ALL_GATHER, send, recv, sendcount, dtype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, int dtype, int op,
                               ncclComm_t comm, void *stream) {
  return issue(OP_REDUCE_SCATTER, send, recv, recvcount, dtype, op, 0, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return fail(ncclInvalidUsage, "%s", "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  ncclResult_t result = ncclSuccess;
  for (int i = 0; i < group_count; i++) {
    ncclComm_t c = group_ops[i]->comm;
    if (result == ncclSuccess) {
      result = launch(group_ops[i]);  // frees the op when it fails
    } else {
      free(group_ops[i]);
    }
    release(c);
  }
  group_count = 0;
  return result;
}

// ---- communicators

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = 21903;
  return ncclSuccess;
}

// Tells the stand-in apart from NCCL (dist/_nccl.ts reports which one it opened).
int ps_nccl_stand_in(void) { return 1; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, MAGIC, sizeof MAGIC);
  if (getrandom(id->internal + 8, 16, 0) != 16) {
    return fail(ncclSystemError, "%s", "getrandom failed");
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  if (!out || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, "%s", "invalid rank or size (at most 64 ranks)");
  }
  if (memcmp(id.internal, MAGIC, sizeof MAGIC) != 0) {
    return fail(ncclInvalidArgument, "%s", "the unique id is not one of ncclGetUniqueId");
  }
  if (!find_emulator()) {
    return fail(ncclSystemError, "%s", "the CUDA emulator is not loaded in this process");
  }
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return fail(ncclSystemError, "%s", "out of host memory");
  int n = snprintf(c->name, sizeof c->name, "/pinstream-nccl-");
  for (int i = 0; i < 16; i++)
    n += snprintf(c->name + n, 3, "%02x", (unsigned char)id.internal[8 + i]);
  c->rank = rank;
  c->nranks = nranks;
  c->map_bytes = 4096 + (size_t)nranks * SLOT_BYTES;
  int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)c->map_bytes) != 0) {
    if (fd >= 0) close(fd);
    free(c);
    return fail(ncclSystemError, "shm_open or ftruncate failed: %s", strerror(errno));
  }
  void *map = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    free(c);
    return fail(ncclSystemError, "mmap failed: %s", strerror(errno));
  }
  c->shared = map;
  c->slots = (unsigned char *)map + 4096;
  atomic_store(&c->refs, 1);
  atomic_store(&c->shared->pids[rank], (int32_t)getpid());
  atomic_fetch_add(&c->shared->joined, 1);
  // Every rank must join before the first collective; NCCL's init blocks as this does.
  for (int waited = 0; (int)atomic_load(&c->shared->joined) < nranks; waited++) {
    if (waited > 600 * 1000) {
      release(c);
      return fail(ncclSystemError, "%s", "the other ranks did not join within 600 s");
    }
    usleep(1000);
  }
  c->shared->nranks = nranks;
  if (rank == 0) shm_unlink(c->name);  // the mappings live on; nothing is left behind
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  release(comm);  // queued collectives hold the communicator until they ran
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  atomic_store(&comm->aborted, 1);
  int expected = 0;
  atomic_compare_exchange_strong(&comm->shared->failed, &expected, 1 + comm->rank);
  futex_wake(&comm->shared->generation);
  release(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
  if (!comm || !error) return ncclInvalidArgument;
  *error = (ncclResult_t)atomic_load(&comm->async_error);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  if (comm && atomic_load(&comm->async_error) && comm->message[0]) return comm->message;
  return last_error;
}
