/*
 * fill.c — CPU backend of ps_tensor_fill: tensors created where they live (zeros, ones, full,
 * arange, rand, randn), element i computed from (mode, a, b, seed, offset + i) by the rules of
 * kernels/rules.h, so the CUDA backend (kernels/cuda/fill.cu) writes the same bits; and
 * ps_gather_rows, the batch gather of a device-resident dataset.
 */
#include <stdint.h>
#include <string.h>

#include "fp16.h"
#include "nn.h"
#include "threads.h"

typedef struct {
  void *dst;
  int32_t dtype, mode;
  double a, b;
  uint64_t seed, offset;
} fill_ctx;

static void fill_range(void *p, int64_t begin, int64_t end) {
  const fill_ctx *c = (const fill_ctx *)p;
  if (c->dtype == PS_FILL_I32) {
    int32_t *d = (int32_t *)c->dst;
    for (int64_t i = begin; i < end; i++)
      d[i] = ps_fill_int(c->mode, c->a, c->b, c->offset + (uint64_t)i);
  } else if (c->dtype == PS_NN_F16) {
    half *d = (half *)c->dst;
    for (int64_t i = begin; i < end; i++)
      d[i] = f2h(ps_fill_value(c->mode, c->a, c->b, c->seed, c->offset + (uint64_t)i));
  } else if (c->dtype == PS_NN_BF16) {
    uint16_t *d = (uint16_t *)c->dst;
    for (int64_t i = begin; i < end; i++)
      d[i] = ps_bf16_from_f32(ps_fill_value(c->mode, c->a, c->b, c->seed, c->offset + (uint64_t)i));
  } else {
    float *d = (float *)c->dst;
    for (int64_t i = begin; i < end; i++)
      d[i] = ps_fill_value(c->mode, c->a, c->b, c->seed, c->offset + (uint64_t)i);
  }
}

PS_API int ps_tensor_fill(void *dst, int32_t dtype, int64_t count, int32_t mode, double a, double b,
                          uint64_t seed, uint64_t offset, void *stream) {
  (void)stream;
  TRY(ps_check_fill(__func__, dtype, count, mode));
  if (count == 0) return PS_OK;
  CHECK_RANGE(dst, count * (dtype == PS_NN_F16 || dtype == PS_NN_BF16 ? 2 : 4));
  fill_ctx c = {
      .dst = dst, .dtype = dtype, .mode = mode, .a = a, .b = b, .seed = seed, .offset = offset};
  /* The random modes cost ~60 flops an element: worth threads from a few thousand on. */
  const int64_t work = mode >= PS_FILL_UNIFORM ? count * 32 : count;
  ps_pool_range(count, 4096, work, fill_range, &c);
  return PS_OK;
}

/* ---- gathering rows of a device-resident dataset ------------------------------------------- */

typedef struct {
  const uint8_t *src;
  const int32_t *indices;
  uint8_t *dst;
  int64_t row_bytes;
} gather_ctx;

static void gather_range(void *p, int64_t begin, int64_t end) {
  const gather_ctx *c = (const gather_ctx *)p;
  for (int64_t k = begin; k < end; k++)
    memcpy(c->dst + k * c->row_bytes, c->src + (int64_t)c->indices[k] * c->row_bytes,
           (size_t)c->row_bytes);
}

int ps_check_row_indices(const char *fn, const int32_t *indices, int32_t n, int64_t rows) {
  for (int32_t k = 0; k < n; k++) {
    if (indices[k] < 0 || indices[k] >= rows)
      PS_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: indices[%d] = %d is outside [0, %lld)", fn, k,
              indices[k], (long long)rows);
  }
  return PS_OK;
}

PS_API int ps_gather_rows(const void *src, int64_t rows, int64_t row_bytes, const int32_t *indices,
                          int32_t n, void *dst, void *stream) {
  (void)stream;
  TRY(ps_check_gather(__func__, rows, row_bytes, n));
  if (n == 0) return PS_OK;
  CHECK_RANGE(indices, (int64_t)n * 4);
  CHECK_RANGE(dst, (int64_t)n * row_bytes);
  CHECK_RANGE(src, rows * row_bytes);
  TRY(ps_check_row_indices(__func__, indices, n, rows));
  gather_ctx c = {.src = (const uint8_t *)src,
                  .indices = indices,
                  .dst = (uint8_t *)dst,
                  .row_bytes = row_bytes};
  ps_pool_range(n, 64, (int64_t)n * row_bytes, gather_range, &c);
  return PS_OK;
}
