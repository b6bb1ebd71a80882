/*
 * rules.h — what the two backends must agree on, written once: which arguments a kernel
 * refuses (and what it says), and what one element of a kernel's output is. The CPU backend
 * (kernels/cpu) includes it as C; the CUDA backend (kernels/cuda) as CUDA C++, where the
 * element rules run on the device (and, through kernels/emu, in the CUDA emulator). Each backend
 * keeps its own loops, vector paths and launch shapes; a vector path that cannot call a rule says
 * which rule it spells out.
 *
 * Failures are recorded through kernels/errors.h. CUDA defines PS_RULE as host-and-device
 * inline before including this header.
 */
#ifndef PINSTREAM_RULES_H
#define PINSTREAM_RULES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "errors.h"
#include "pinstream.h"

#ifndef PS_RULE
#define PS_RULE static inline
#endif
/* Checks run on the host only. */
#define PS_CHECK static inline

/* Records the failure at the rule that refused it and returns `status`. */
#define PS_RULE_FAIL(status, ...) return ps_record_error((status), "rules.h", __LINE__, __VA_ARGS__)

/* ---- argument checks: 0 or the PS_ERR_* that the call returns ---------------------------- */

PS_CHECK int ps_check_dtype(const char *fn, const char *what, int32_t dtype) {
  if (dtype != PS_NN_F32 && dtype != PS_NN_F16 && dtype != PS_NN_BF16) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad %s %d (PS_NN_F32, PS_NN_F16 or PS_NN_BF16)", fn,
                 what, (int)dtype);
  }
  return PS_OK;
}

/* A half-precision dtype: the element type of an optimizer's compute copy. */
PS_CHECK int ps_check_half_dtype(const char *fn, const char *what, int32_t dtype) {
  if (dtype != PS_NN_F16 && dtype != PS_NN_BF16) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad %s %d (PS_NN_F16 or PS_NN_BF16)", fn, what,
                 (int)dtype);
  }
  return PS_OK;
}

PS_CHECK int ps_check_count(const char *fn, int64_t count) {
  if (count < 0) PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad count %lld", fn, (long long)count);
  return PS_OK;
}

PS_CHECK int ps_check_image_augment(int32_t layout, int32_t n, int32_t c, int32_t h, int32_t w,
                                    int32_t pad, int32_t out_dtype, int32_t flags) {
  if ((flags & ~(PS_IMAGE_SERIAL | PS_IMAGE_NO_CONTRAST)) != 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_augment: unknown flags 0x%x", (unsigned)flags);
  }
  if (n < 0 || c <= 0 || c > PS_IMAGE_MAX_CHANNELS || h <= 0 || w <= 0 || pad < 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "ps_image_augment: bad shape n=%d c=%d h=%d w=%d pad=%d (c <= %d)", n, c, h, w,
                 pad, PS_IMAGE_MAX_CHANNELS);
  }
  if (layout != PS_IMAGE_NHWC && layout != PS_IMAGE_NCHW) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_augment: bad layout %d", layout);
  }
  if (out_dtype != PS_IMAGE_F16 && out_dtype != PS_IMAGE_F32) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_augment: bad out_dtype %d", out_dtype);
  }
  /* Keeps the per-plane index math in 32 bits on both backends. */
  if ((int64_t)h * w > (int64_t)1 << 24) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_augment: image %dx%d too large", h, w);
  }
  return PS_OK;
}

PS_CHECK int ps_check_image_labels(int32_t src_bytes, int32_t n) {
  if (n < 0 || (src_bytes != 1 && src_bytes != 2 && src_bytes != 4)) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_labels_i32: bad n=%d or src_bytes=%d", n,
                 src_bytes);
  }
  return PS_OK;
}

PS_CHECK int ps_check_matmul(int64_t m, int64_t n, int64_t k) {
  if (m < 0 || n < 0 || k < 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_matmul: bad shape m=%lld n=%lld k=%lld",
                 (long long)m, (long long)n, (long long)k);
  }
  return PS_OK;
}

/* A convolution's geometry: OH = (H + 2*pad - kh) / stride + 1 (floor), likewise OW. */
typedef struct ps_conv_geo {
  int64_t n, c, h, w, co, oh, ow;
  int32_t kh, kw, s, pad;
} ps_conv_geo;

PS_CHECK int ps_conv_geometry(ps_conv_geo *g, const char *fn, int64_t n, int64_t c, int64_t h,
                              int64_t w, int64_t co, int32_t kh, int32_t kw, int32_t stride,
                              int32_t pad) {
  if (n < 0 || c <= 0 || h <= 0 || w <= 0 || co <= 0 || kh <= 0 || kw <= 0 || stride <= 0 ||
      pad < 0 || h + 2 * (int64_t)pad < kh || w + 2 * (int64_t)pad < kw) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "%s: bad shape n=%lld c=%lld h=%lld w=%lld co=%lld k=%dx%d stride=%d pad=%d", fn,
                 (long long)n, (long long)c, (long long)h, (long long)w, (long long)co, kh, kw,
                 stride, pad);
  }
  g->n = n, g->c = c, g->h = h, g->w = w, g->co = co;
  g->kh = kh, g->kw = kw, g->s = stride, g->pad = pad;
  g->oh = (h + 2 * (int64_t)pad - kh) / stride + 1;
  g->ow = (w + 2 * (int64_t)pad - kw) / stride + 1;
  return PS_OK;
}

PS_CHECK int ps_check_maxpool_forward(int64_t n, int64_t c, int64_t h, int64_t w, int32_t kernel,
                                      int32_t stride) {
  if (n < 0 || c < 0 || h <= 0 || w <= 0 || kernel <= 0 || stride <= 0 || kernel > h ||
      kernel > w) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "ps_nn_maxpool2d_forward: bad shape n=%lld c=%lld h=%lld w=%lld kernel=%d "
                 "stride=%d",
                 (long long)n, (long long)c, (long long)h, (long long)w, kernel, stride);
  }
  return PS_OK;
}

PS_CHECK int ps_check_maxpool_backward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh,
                                       int64_t ow) {
  if (n < 0 || c < 0 || h <= 0 || w <= 0 || oh < 0 || ow < 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "ps_nn_maxpool2d_backward: bad shape n=%lld c=%lld h=%lld w=%lld oh=%lld "
                 "ow=%lld",
                 (long long)n, (long long)c, (long long)h, (long long)w, (long long)oh,
                 (long long)ow);
  }
  return PS_OK;
}

/* Per-channel [n, c, hw] kernels (batch norm, bias). `min_n` is 1 where batch statistics need
 * a sample. c fits an int32: CUDA runs one block per channel. */
PS_CHECK int ps_check_per_channel(const char *fn, int64_t n, int64_t c, int64_t hw, int64_t min_n) {
  if (n < min_n || c <= 0 || hw <= 0 || c > INT32_MAX) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad shape n=%lld c=%lld hw=%lld", fn, (long long)n,
                 (long long)c, (long long)hw);
  }
  return PS_OK;
}

PS_CHECK int ps_check_concat(int64_t outer, int64_t part_len, int64_t whole_len, int64_t offset) {
  if (outer < 0 || part_len < 0 || offset < 0 || whole_len < offset + part_len)
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "ps_nn_concat: bad shape outer=%lld part_len=%lld whole_len=%lld offset=%lld",
                 (long long)outer, (long long)part_len, (long long)whole_len, (long long)offset);
  return PS_OK;
}

PS_CHECK int ps_check_binary(int64_t count, int32_t op) {
  if (count < 0)
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_binary: bad count %lld", (long long)count);
  if (op != PS_BINARY_ADD && op != PS_BINARY_MUL)
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_binary: bad op %d", op);
  return PS_OK;
}

PS_CHECK int ps_check_cross_entropy(int64_t n, int64_t k) {
  if (n < 0 || k <= 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_cross_entropy: bad shape n=%lld k=%lld",
                 (long long)n, (long long)k);
  }
  return PS_OK;
}

PS_CHECK int ps_check_sgd(int64_t count, float momentum, const float *momentum_buf) {
  if (count < 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_sgd_step: bad count %lld", (long long)count);
  }
  if (momentum != 0.0f && momentum_buf == 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_sgd_step: momentum %g needs a momentum buffer",
                 (double)momentum);
  }
  return PS_OK;
}

/* A multi-tensor call (ps_nn_multi_*): n entries (0: nothing to do), at most 65535 (one
 * launch row each on CUDA). */
PS_CHECK int ps_check_multi(const char *fn, const int64_t *list, int32_t n, int64_t max_count) {
  if (n < 0 || n > 65535 || max_count < 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad list of %d entries, max_count %lld", fn, (int)n,
                 (long long)max_count);
  }
  if (n > 0 && list == 0) PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: null list", fn);
  return PS_OK;
}

PS_CHECK int ps_check_scaler_update(int32_t growth_interval) {
  if (growth_interval <= 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_nn_scaler_update: bad growth_interval %d",
                 growth_interval);
  }
  return PS_OK;
}

/* ps_image_augment's buffers (params and indices may be NULL; rows counts only with indices). */
PS_CHECK int ps_check_image_buffers(const void *src, const int32_t *indices, int64_t rows,
                                    const void *out, const float *scale, const float *bias) {
  if (src == 0 || out == 0 || scale == 0 || bias == 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_augment: null src, out, scale or bias");
  }
  if (indices != 0 && rows <= 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "ps_image_augment: rows=%lld with indices (src must hold at least one image)",
                 (long long)rows);
  }
  return PS_OK;
}

PS_CHECK int ps_check_labels_buffers(const void *src, const void *out) {
  if (src == 0 || out == 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_labels_i32: null src or out");
  }
  return PS_OK;
}

/* ps_image_augment_labeled's labels (n > 0). */
PS_CHECK int ps_check_augment_labels(const void *labels, int32_t label_bytes,
                                     const void *labels_out) {
  if (label_bytes != 1 && label_bytes != 2 && label_bytes != 4) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_augment_labeled: bad label_bytes=%d",
                 label_bytes);
  }
  if (labels == 0 || labels_out == 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_augment_labeled: null labels or labels_out");
  }
  return PS_OK;
}

/* ---- element rules ----------------------------------------------------------------------- */

/* ps_image_augment's normalize: two fp32 roundings, never a fused multiply-add. On the GPU the
 * _rn intrinsics, which nvcc never fuses; on the host (cpu/image.c, the CUDA emulator) plain
 * operations in code built without contraction. */
PS_RULE float ps_image_normalize(float t, float scale, float bias) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(t, scale), bias);
#else
  const float scaled = t * scale;
  return scaled + bias;
#endif
}

/* ps_image_augment's normalize of a byte with the colour steps off (float(byte) is exact). */
PS_RULE float ps_image_value(uint32_t byte, float scale, float bias) {
  return ps_image_normalize((float)byte, scale, bias);
}

/* ps_image_augment: the offset of the crop in the source along an axis of `extent` pixels,
 * d - pad, clamped to [-extent, extent]. d and pad are any int32 (pad >= 0), so d - pad needs
 * 33 bits; every offset at or beyond +-extent puts the whole window outside the image (all
 * zeros), so the clamp changes no pixel, and with extent <= 2^24 (ps_check_image_augment)
 * each backend's `y + offset`, `w - 1 - x + offset` and the like stay far inside int32. */
PS_RULE int32_t ps_image_offset(int32_t d, int32_t pad, int32_t extent) {
  const int64_t o = (int64_t)d - pad;
  return o < -extent ? -extent : o > extent ? extent : (int32_t)o;
}

/* ReLU on fp16 bits: -0, negatives and -inf become +0; NaN payloads pass unchanged. */
PS_RULE uint16_t ps_relu_f16(uint16_t x) {
  return ((x & 0x8000u) && (x & 0x7fffu) <= 0x7c00u) ? (uint16_t)0 : x;
}

/* ReLU's gradient from its output y: dy where y > 0 (positive sign, nonzero, not NaN). */
PS_RULE uint16_t ps_relu_grad_f16(uint16_t y, uint16_t dy) {
  return (!(y & 0x8000u) && y != 0 && y <= 0x7c00u) ? dy : (uint16_t)0;
}

/* ps_relu_f16 and ps_relu_grad_f16 on fp32 bits (the fp32 path): the same decisions. */
PS_RULE uint32_t ps_relu_f32(uint32_t x) {
  return ((x & 0x80000000u) && (x & 0x7fffffffu) <= 0x7f800000u) ? 0u : x;
}
PS_RULE uint32_t ps_relu_grad_f32(uint32_t y, uint32_t dy) {
  return (!(y & 0x80000000u) && y != 0 && y <= 0x7f800000u) ? dy : 0u;
}

/* An fp16 value that is inf or NaN (exponent bits all ones). */
PS_RULE int ps_f16_nonfinite(uint16_t x) { return (x & 0x7c00u) == 0x7c00u; }

/* ---- bf16 (PS_NN_BF16) ------------------------------------------------------------------ */

/* The bits of an fp32 and back: a bf16 is the top half of them. */
PS_RULE uint32_t ps_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
#endif
}
PS_RULE float ps_bits_f32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(x);
#else
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
#endif
}

/* fp32 -> bf16, rounded to nearest even: the low 16 bits decide, ties keep an even result.
 * Subnormals round like any other value (no flush to zero); a value that rounds past the
 * largest finite bf16 becomes inf; NaN becomes the quiet NaN 0x7fc0 with the input's sign.
 * Both backends convert through this rule (never __float2bfloat16_rn or a CPU instruction,
 * whose NaN and subnormal handling differ between generations), so the bits agree. */
PS_RULE uint16_t ps_bf16_from_f32(float f) {
  const uint32_t x = ps_f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((x >> 16) & 0x8000u) | 0x7fc0u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact. */
PS_RULE float ps_bf16_to_f32(uint16_t h) { return ps_bits_f32((uint32_t)h << 16); }

/* ReLU and its gradient on bf16 bits: ps_relu_f32's decisions on the top half of an fp32
 * (bf16 -0, negatives, -inf become +0; NaN payloads pass). */
PS_RULE uint16_t ps_relu_bf16(uint16_t x) {
  return ((x & 0x8000u) && (x & 0x7fffu) <= 0x7f80u) ? (uint16_t)0 : x;
}
PS_RULE uint16_t ps_relu_grad_bf16(uint16_t y, uint16_t dy) {
  return (!(y & 0x8000u) && y != 0 && y <= 0x7f80u) ? dy : (uint16_t)0;
}

/* A bf16 value that is inf or NaN. */
PS_RULE int ps_bf16_nonfinite(uint16_t x) { return (x & 0x7f80u) == 0x7f80u; }

/* Max pooling without padding: output extent along an axis of `extent` pixels. */
PS_RULE int64_t ps_pool_out(int64_t extent, int32_t kernel, int32_t stride) {
  return (extent - kernel) / stride + 1;
}

/* Max pooling: does v replace the running maximum m? Strictly greater wins, and NaN wins
 * over numbers (it propagates, as in PyTorch), so the first NaN of a window stays. */
PS_RULE int ps_pool_takes(float v, float m) { return v > m || (v != v && m == m); }

/* Cross entropy's argmax (the `correct` count), as an in-order scan seeded with logit 0 and
 * taking strictly greater values defines it: a NaN at index 0 wins, any other NaN is skipped,
 * and of equal values the lower index wins. Does candidate (v, j) replace the current (m, arg)?
 * An index < 0 is "none" (an empty side). Associative and commutative, so a tree reduction
 * (CUDA's warp shuffles) gives the scan's answer; a lane's first value is not special. */
PS_RULE int ps_argmax_takes(float v, int64_t j, float m, int64_t arg) {
  if (j < 0) return 0;
  if (arg < 0) return 1;
  if (j == 0 && v != v) return 1;
  if (arg == 0 && m != m) return 0;
  if (v != v) return 0;
  if (m != m) return 1;
  return v > m || (v == m && j < arg);
}

/* The cross-entropy gradient's factor, s / n with s = scale * *device_scale (or scale). */
PS_RULE float ps_ce_grad_scale(float scale, const float *device_scale, int64_t n) {
  return (device_scale ? scale * *device_scale : scale) / (float)n;
}

/* Batch norm's running statistic (PyTorch): run = (1 - momentum) * run + momentum * batch. */
PS_RULE float ps_bn_running(float run, float batch, float momentum) {
  return (1.0f - momentum) * run + momentum * batch;
}

/* Batch norm in training as y = x * a + b for one channel: a = gamma * invstd,
 * b = beta - mean * a. */
PS_RULE void ps_bn_affine(float gamma, float beta, float mean, float invstd, float *a, float *b) {
  *a = gamma * invstd;
  *b = beta - mean * *a;
}

/* Batch norm in evaluation as y = x * a + b from the running statistics: a = gamma /
 * sqrt(var + eps) (a division, not gamma * rsqrt: one rounding fewer), b = beta - mean * a. */
PS_RULE void ps_bn_eval_affine(float gamma, float beta, float mean, float var, float eps, float *a,
                               float *b) {
  *a = gamma / sqrtf(var + eps);
  *b = beta - mean * *a;
}

/* Batch norm's input gradient for one element: a * (dy - mean(dy) - xhat * mean(dy * xhat)),
 * xhat = (x - mean) * invstd, a = gamma * invstd. */
PS_RULE float ps_bn_grad(float dy, float x, float mean, float invstd, float a, float mean_dy,
                         float mean_dy_xhat) {
  return a * (dy - mean_dy - ((x - mean) * invstd) * mean_dy_xhat);
}

/* Batch norm's fixed partition, the same on every backend and every device: each channel's n
 * samples are cut into ps_bn_groups groups, group j holding samples [n*j/g, n*(j+1)/g). Each
 * group's statistics are reduced on their own (CUDA: one block per group and channel), then the
 * groups are merged in the order j = 0, 1, ...: results do not depend on the scheduling, and
 * the partition does not depend on the device. About 1024 (group, channel) pairs in all, each
 * of at least ~2048 values where the tensor allows. */
PS_RULE int32_t ps_bn_groups(int64_t n, int64_t c, int64_t hw) {
  int64_t g = (1024 + c - 1) / c;
  const int64_t by_size = n * hw / 2048;
  if (g > by_size) g = by_size;
  if (g > n) g = n;
  if (g > 1024) g = 1024;
  return g < 1 ? 1 : (int32_t)g;
}

/* The first sample of group j of g over n samples. */
PS_RULE int64_t ps_bn_group_start(int64_t n, int32_t g, int32_t j) { return n * j / g; }

/* Chan's parallel merge of a group's (count cb, mean mb, squared deviations m2b) into the
 * running (cnt, mean, m2): the groups' statistics combine without cancellation. */
PS_RULE void ps_bn_merge(int64_t *cnt, float *mean, float *m2, int64_t cb, float mb, float m2b) {
  if (cb == 0) return;
  const int64_t total = *cnt + cb;
  const float d = mb - *mean, f = (float)cb / (float)total;
  *mean += d * f;
  *m2 += m2b + d * d * (float)*cnt * f;
  *cnt = total;
}

/* 1 / sqrt(biased variance + eps) from the merged squared deviations of cnt values. */
PS_RULE float ps_bn_invstd(float m2, int64_t cnt, float eps) {
  return 1.0f / sqrtf(m2 / (float)cnt + eps);
}

/* The unbiased variance PyTorch keeps in the running statistic (the biased one for one value). */
PS_RULE float ps_bn_unbiased(float m2, int64_t cnt) {
  return m2 / (float)(cnt > 1 ? cnt - 1 : cnt);
}

/* The floats of workspace a batch norm of [n, c, hw] takes (ps_nn_batchnorm_act_*): three per
 * group and channel. */
PS_RULE int64_t ps_bn_work_floats(int64_t n, int64_t c, int64_t hw) {
  return 3 * c * (int64_t)ps_bn_groups(n, c, hw);
}

PS_CHECK int ps_check_bn_work(const char *fn, const float *work, int64_t work_floats, int64_t n,
                              int64_t c, int64_t hw, int32_t act) {
  if (act != 0 && act != PS_BN_RELU) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad act %d (0 or PS_BN_RELU)", fn, (int)act);
  }
  if (work != 0 && work_floats < ps_bn_work_floats(n, c, hw)) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "%s: workspace of %lld floats, [%lld, %lld, %lld] needs %lld", fn,
                 (long long)work_floats, (long long)n, (long long)c, (long long)hw,
                 (long long)ps_bn_work_floats(n, c, hw));
  }
  return PS_OK;
}

/* torch.optim.SGD on one element (see ps_nn_sgd_step): returns the new parameter. `g` is the
 * unscaled gradient; `fresh` is true on the step that creates the momentum buffer. */
PS_RULE float ps_sgd_element(float p, float g, float *buf, float lr, float momentum,
                             float dampening, float weight_decay, int nesterov, int fresh) {
  if (weight_decay != 0.0f) g += weight_decay * p;
  if (momentum != 0.0f) {
    const float b = fresh ? g : momentum * *buf + (1.0f - dampening) * g;
    *buf = b;
    g = nesterov ? g + momentum * b : b;
  }
  return p - lr * g;
}

/* torch._amp_update_scale_ (ps_nn_scaler_update). */
PS_RULE void ps_scaler_step(float *scale, int32_t *tracker, int found_inf, float growth,
                            float backoff, int32_t interval) {
  if (found_inf) {
    *scale *= backoff;
    *tracker = 0;
  } else {
    const int32_t successful = *tracker + 1;
    if (successful == interval) {
      const float grown = *scale * growth;
      if (isfinite(grown)) *scale = grown;
      *tracker = 0;
    } else {
      *tracker = successful;
    }
  }
}

PS_CHECK int ps_check_gather(const char *fn, int64_t rows, int64_t row_bytes, int32_t n) {
  if (rows < 0 || row_bytes <= 0 || n < 0)
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: bad shape rows=%lld row_bytes=%lld n=%d", fn,
                 (long long)rows, (long long)row_bytes, (int)n);
  return PS_OK;
}

/* ---- tensors born on the device (ps_tensor_fill) -------------------------------------------- */

/* Float operations rounded one at a time, never fused into an FMA, so that both backends
 * compute the same bits: nvcc contracts a * b + c by default, and so does gcc at -O3. */
#if defined(__CUDA_ARCH__)
#define PS_FADD(a, b) __fadd_rn((a), (b))
#define PS_FSUB(a, b) __fsub_rn((a), (b))
#define PS_FMUL(a, b) __fmul_rn((a), (b))
#define PS_FDIV(a, b) __fdiv_rn((a), (b))
#define PS_FSQRT(a) __fsqrt_rn(a)
#define PS_DADD(a, b) __dadd_rn((a), (b))
#define PS_DMUL(a, b) __dmul_rn((a), (b))
#define PS_NO_CONTRACT
#else
#define PS_FADD(a, b) ((a) + (b))
#define PS_FSUB(a, b) ((a) - (b))
#define PS_FMUL(a, b) ((a) * (b))
#define PS_FDIV(a, b) ((a) / (b))
#define PS_FSQRT(a) sqrtf(a)
#define PS_DADD(a, b) ((a) + (b))
#define PS_DMUL(a, b) ((a) * (b))
#if defined(__clang__)
#define PS_NO_CONTRACT
#else
#define PS_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
#endif

PS_CHECK int ps_check_fill(const char *fn, int32_t dtype, int64_t count, int32_t mode) {
  TRY(ps_check_count(fn, count));
  if (dtype != PS_NN_F32 && dtype != PS_NN_F16 && dtype != PS_NN_BF16 && dtype != PS_FILL_I32)
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "%s: dtype %d is not PS_NN_F32, PS_NN_F16, PS_NN_BF16 or PS_FILL_I32", fn,
                 (int)dtype);
  if (mode < PS_FILL_CONSTANT || mode > PS_FILL_NORMAL)
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: mode %d is not a PS_FILL_* mode", fn, (int)mode);
  if (dtype == PS_FILL_I32 && (mode == PS_FILL_UNIFORM || mode == PS_FILL_NORMAL))
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "%s: random fills are floating point (dtype %d is int32)",
                 fn, (int)dtype);
  return PS_OK;
}

/* 32 random bits of element i, draw k (0 or 1), of a fill with `seed`: splitmix64 of a counter,
 * so any element is computed alone and a fill of a range equals that range of a whole fill. */
PS_RULE uint32_t ps_fill_bits(uint64_t seed, uint64_t i, uint32_t k) {
  uint64_t z = seed + (2 * i + k + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}

/* ln(u) for u in (0, 1]: u = m * 2^e, m in [1, 2); ln(m) = 2 atanh(t), t = (m - 1) / (m + 1),
 * by its series to t^13 (|t| <= 1/3: error below 2e-8). Not libm's last ulp: the same bits on
 * both backends. */
PS_RULE PS_NO_CONTRACT float ps_fill_log(float u) {
  union {
    float f;
    uint32_t b;
  } v = {u};
  const int e = (int)((v.b >> 23) & 0xff) - 127;
  v.b = (v.b & 0x007fffffu) | 0x3f800000u;
  const float t = PS_FDIV(PS_FSUB(v.f, 1.0f), PS_FADD(v.f, 1.0f)), t2 = PS_FMUL(t, t);
  float s = 1.0f / 13.0f;
  s = PS_FADD(PS_FMUL(s, t2), 1.0f / 11.0f);
  s = PS_FADD(PS_FMUL(s, t2), 1.0f / 9.0f);
  s = PS_FADD(PS_FMUL(s, t2), 1.0f / 7.0f);
  s = PS_FADD(PS_FMUL(s, t2), 1.0f / 5.0f);
  s = PS_FADD(PS_FMUL(s, t2), 1.0f / 3.0f);
  s = PS_FADD(PS_FMUL(s, t2), 1.0f);
  return PS_FADD(PS_FMUL((float)e, 0.693147180559945f), PS_FMUL(PS_FMUL(2.0f, t), s));
}

/* cos(2 pi x) for x in [0, 1): cos(y) = -cos(y - pi), y - pi in [-pi, pi), by its Taylor series
 * to y^20 (error below 3e-7). */
PS_RULE PS_NO_CONTRACT float ps_fill_cos2pi(float x) {
  const float y = PS_FSUB(PS_FMUL(x, 6.28318530717959f), 3.14159265358979f), y2 = PS_FMUL(y, y);
  float c = 1.0f / 2432902008176640000.0f; /* 1/20! */
  const float k[10] = {-1.0f / 6402373705728000.0f,
                       1.0f / 20922789888000.0f,
                       -1.0f / 87178291200.0f,
                       1.0f / 479001600.0f,
                       -1.0f / 3628800.0f,
                       1.0f / 40320.0f,
                       -1.0f / 720.0f,
                       1.0f / 24.0f,
                       -1.0f / 2.0f,
                       1.0f};
  for (int j = 0; j < 10; j++) c = PS_FADD(PS_FMUL(c, y2), k[j]);
  return -c;
}

/* Element i of a fill, as float (f16 and bf16 round it once more, to nearest even). */
PS_RULE PS_NO_CONTRACT float ps_fill_value(int32_t mode, double a, double b, uint64_t seed,
                                           uint64_t i) {
  if (mode == PS_FILL_CONSTANT) return (float)a;
  if (mode == PS_FILL_ARANGE) return (float)PS_DADD(a, PS_DMUL((double)i, b));
  if (mode == PS_FILL_UNIFORM) {
    const float u = (float)(ps_fill_bits(seed, i, 0) >> 8) * (1.0f / 16777216.0f);
    const float lo = (float)a, hi = (float)b;
    return PS_FADD(lo, PS_FMUL(PS_FSUB(hi, lo), u));
  }
  /* Box-Muller: u1 in (0, 1] keeps the logarithm finite. */
  const float u1 = (float)((ps_fill_bits(seed, i, 0) >> 8) + 1) * (1.0f / 16777216.0f);
  const float u2 = (float)(ps_fill_bits(seed, i, 1) >> 8) * (1.0f / 16777216.0f);
  const float r = PS_FSQRT(PS_FMUL(-2.0f, ps_fill_log(u1)));
  return PS_FADD((float)a, PS_FMUL((float)b, PS_FMUL(r, ps_fill_cos2pi(u2))));
}

/* Element i of an int32 fill: constant or arange, truncated toward zero like a C cast (values
 * outside int32 saturate). */
PS_RULE PS_NO_CONTRACT int32_t ps_fill_int(int32_t mode, double a, double b, uint64_t i) {
  const double v = mode == PS_FILL_CONSTANT ? a : PS_DADD(a, PS_DMUL((double)i, b));
  if (!(v > -2147483649.0)) return v != v ? 0 : INT32_MIN;
  if (!(v < 2147483648.0)) return INT32_MAX;
  return (int32_t)v;
}

/* Label j of a uint8 (bytes 1), uint16 (2) or int32 (4) label array, as int32. */
PS_RULE int32_t ps_label_i32(const void *labels, int32_t bytes, int64_t j) {
  if (bytes == 1) return ((const uint8_t *)labels)[j];
  if (bytes == 2) return ((const uint16_t *)labels)[j];
  return ((const int32_t *)labels)[j];
}

/* ---- ps_image_geometry: crop, resize (Pillow's bilinear), rotation ----------------------------
 */
/* Integer arithmetic but for the resize weights, which are Pillow's: fp64 filter values, each
 * operation rounded on its own (PS_D*: never contracted), then 22-bit fixed point. */

#if defined(__CUDA_ARCH__)
#define PS_DSUB(a, b) __dsub_rn((a), (b))
#define PS_DDIV(a, b) __ddiv_rn((a), (b))
#else
#define PS_DSUB(a, b) ((a) - (b))
#define PS_DDIV(a, b) ((a) / (b))
#endif

/* Fraction bits of the resize weights (Pillow's PRECISION_BITS for 8-bit images). */
#define PS_GEO_BITS 22
/* The largest output side; the largest source image (pixels): offsets stay in int32. */
#define PS_GEO_MAX_SIDE (1 << 14)
#define PS_GEO_MAX_PIXELS ((int64_t)1 << 28)

PS_CHECK int ps_check_image_geometry(int64_t src_stride, int32_t n, int32_t c, int32_t oh,
                                     int32_t ow, int32_t flags) {
  if ((flags & ~(PS_IMAGE_SERIAL | PS_IMAGE_ANTIALIAS)) != 0) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT, "ps_image_geometry: unknown flags 0x%x", (unsigned)flags);
  }
  if (n < 0 || c < 1 || c > PS_IMAGE_GEOMETRY_MAX_CHANNELS || oh < 1 || ow < 1 ||
      oh > PS_GEO_MAX_SIDE || ow > PS_GEO_MAX_SIDE || src_stride < c) {
    PS_RULE_FAIL(PS_ERR_INVALID_ARGUMENT,
                 "ps_image_geometry: bad shape n=%d c=%d out %dx%d src_stride=%lld (c <= %d, "
                 "sides 1..%d)",
                 n, c, oh, ow, (long long)src_stride, PS_IMAGE_GEOMETRY_MAX_CHANNELS,
                 PS_GEO_MAX_SIDE);
  }
  return PS_OK;
}

/* One sample's PS_IMAGE_GEOMETRY_PARAMS record (pinstream.h) as named words. */
typedef struct ps_geo_record {
  int32_t h, w, top, left, crop_h, crop_w, cos, sin;
} ps_geo_record;

/* Does record r describe an image of slots of src_stride bytes with a box inside it? */
PS_RULE int ps_geo_record_ok(ps_geo_record r, int64_t src_stride, int32_t c) {
  if (r.h < 1 || r.w < 1 || (int64_t)r.h * r.w > PS_GEO_MAX_PIXELS) return 0;
  if ((int64_t)r.h * r.w * c > src_stride) return 0;
  if (r.top < 0 || r.left < 0 || r.crop_h < 1 || r.crop_w < 1) return 0;
  return (int64_t)r.top + r.crop_h <= r.h && (int64_t)r.left + r.crop_w <= r.w;
}

/* One axis of the resize: `in` pixels of the box from `start` on, to `out` pixels. */
typedef struct ps_geo_axis {
  double scale, fscale; /* in / out; the filter's width, max(scale, 1) with antialias else 1 */
  int32_t start, in, out;
} ps_geo_axis;

PS_RULE PS_NO_CONTRACT void ps_geo_axis_init(ps_geo_axis *a, int32_t start, int32_t in, int32_t out,
                                             int antialias) {
  a->start = start;
  a->in = in;
  a->out = out;
  a->scale = PS_DDIV((double)in, (double)out);
  a->fscale = antialias && a->scale > 1.0 ? a->scale : 1.0;
}

/* Output position x's taps: box inputs [lo, lo + n), the filter's centre and its values' sum. */
typedef struct ps_geo_taps {
  double center, sum;
  int32_t lo, n;
} ps_geo_taps;

/* The triangle filter at tap i: 1 - |(lo + i - center + 0.5) / fscale|, 0 beyond 1. */
PS_RULE PS_NO_CONTRACT double ps_geo_filter(const ps_geo_axis *a, const ps_geo_taps *t, int32_t i) {
  double d = PS_DDIV(PS_DADD(PS_DSUB((double)(t->lo + i), t->center), 0.5), a->fscale);
  if (d < 0.0) d = -d;
  return d < 1.0 ? PS_DSUB(1.0, d) : 0.0;
}

/* Pillow's precompute for output position x (the support equals the filter's width). */
PS_RULE PS_NO_CONTRACT void ps_geo_taps_at(const ps_geo_axis *a, int32_t x, ps_geo_taps *t) {
  t->center = PS_DMUL(PS_DADD((double)x, 0.5), a->scale);
  int32_t lo = (int32_t)PS_DADD(PS_DSUB(t->center, a->fscale), 0.5);
  int32_t hi = (int32_t)PS_DADD(PS_DADD(t->center, a->fscale), 0.5);
  if (lo < 0) lo = 0;
  if (hi > a->in) hi = a->in;
  t->lo = lo;
  t->n = hi - lo;
  double sum = 0.0;
  for (int32_t i = 0; i < t->n; i++) sum = PS_DADD(sum, ps_geo_filter(a, t, i));
  t->sum = sum;
}

/* Tap i's weight in PS_GEO_BITS fixed point: round-half-up of k_i / sum (k_i >= 0). */
PS_RULE PS_NO_CONTRACT int32_t ps_geo_weight(const ps_geo_axis *a, const ps_geo_taps *t,
                                             int32_t i) {
  double k = ps_geo_filter(a, t, i);
  if (t->sum != 0.0) k = PS_DDIV(k, t->sum);
  return (int32_t)PS_DADD(0.5, PS_DMUL(k, (double)(1 << PS_GEO_BITS)));
}

/* The start value of a pass's sum (one half, for rounding). */
#define PS_GEO_HALF (1 << (PS_GEO_BITS - 1))

/* A pass's sum to a byte: shifted down and clamped (weights sum to about one, and the sum
 * stays below 2^31: 255 * (2^22 + n / 2) + 2^21). */
PS_RULE uint32_t ps_geo_byte(int32_t acc) {
  const int32_t v = acc >> PS_GEO_BITS;
  return v < 0 ? 0u : v > 255 ? 255u : (uint32_t)v;
}

/* The rotation of output pixel (y, x) of an oh x ow image by cos and sin (rotation-bit fixed
 * point): where it reads the (resized) image, or nothing (the fill). */
typedef struct ps_geo_rot {
  int32_t y0, y1, x0, x1; /* the neighbours' rows and columns, edge-clamped */
  int32_t has_y1;         /* row y1 is the next row (else the first row counts twice) */
  int32_t fy, fx;         /* the weights of rows y1 and columns x1, in 1/65536 */
} ps_geo_rot;

/* Fills *r and returns 1 when pixel (y, x) reads the image. Coordinates are in 2^-31 pixels:
 * (2x + 1 - ow) * cos is at most 2^15 * 2^31, so everything fits int64 for any int32 cos/sin. */
PS_RULE int ps_geo_rotate_at(int32_t cs, int32_t sn, int32_t oh, int32_t ow, int32_t y, int32_t x,
                             ps_geo_rot *r) {
  const int64_t u = 2 * (int64_t)x + 1 - ow, v = 2 * (int64_t)y + 1 - oh;
  const int64_t X = (int64_t)cs * u - (int64_t)sn * v + ((int64_t)ow << PS_IMAGE_ROTATION_BITS);
  const int64_t Y = (int64_t)sn * u + (int64_t)cs * v + ((int64_t)oh << PS_IMAGE_ROTATION_BITS);
  const int64_t one = (int64_t)1 << (PS_IMAGE_ROTATION_BITS + 1);
  if (X < 0 || Y < 0 || X >= ow * one || Y >= oh * one) return 0;
  /* X - one / 2 (the pixel centre's half) is >= -one / 2: shifting X + one / 2 keeps both the
   * floor and the fraction non-negative. */
  const int64_t xs = X + one / 2, ys = Y + one / 2;
  const int32_t px = (int32_t)(xs >> (PS_IMAGE_ROTATION_BITS + 1)) - 1;
  const int32_t py = (int32_t)(ys >> (PS_IMAGE_ROTATION_BITS + 1)) - 1;
  r->fx = (int32_t)((xs & (one - 1)) >> (PS_IMAGE_ROTATION_BITS - 15));
  r->fy = (int32_t)((ys & (one - 1)) >> (PS_IMAGE_ROTATION_BITS - 15));
  r->x0 = px < 0 ? 0 : px;
  r->x1 = px + 1 < ow ? px + 1 : ow - 1;
  r->y0 = py < 0 ? 0 : py;
  r->has_y1 = py + 1 < oh;
  r->y1 = r->has_y1 ? py + 1 : r->y0;
  return 1;
}

/* The rotated byte from the four neighbours a (y0, x0), b (y0, x1), c (y1, x0), d (y1, x1):
 * bilinear, truncated (Pillow's bilinear_filter). */
PS_RULE uint32_t ps_geo_blend(const ps_geo_rot *r, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  const int64_t top = (int64_t)a * (65536 - r->fx) + (int64_t)b * r->fx;
  const int64_t bottom = r->has_y1 ? (int64_t)c * (65536 - r->fx) + (int64_t)d * r->fx : top;
  return (uint32_t)((top * (65536 - r->fy) + bottom * r->fy) >> 32);
}

/* One sample of a ps_image_geometry batch, from its record. */
typedef struct ps_geo_sample {
  ps_geo_axis ay, ax;
  int32_t rotate, cs, sn; /* rotate: the record's rotation is not the identity */
} ps_geo_sample;

PS_RULE void ps_geo_sample_init(ps_geo_record r, int32_t oh, int32_t ow, int antialias,
                                ps_geo_sample *s) {
  ps_geo_axis_init(&s->ay, r.top, r.crop_h, oh, antialias);
  ps_geo_axis_init(&s->ax, r.left, r.crop_w, ow, antialias);
  s->cs = r.cos;
  s->sn = r.sin;
  s->rotate = !(r.cos == (1 << PS_IMAGE_ROTATION_BITS) && r.sin == 0);
}

/* ---- ps_image_augment's per-sample record ------------------------------------------------- */

/* The fp32 value whose bits are `bits` (the record's brightness and contrast words). */
PS_RULE float ps_f32_from_bits(int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

/* One sample's transform, decoded from its PS_IMAGE_PARAMS record (pinstream.h). */
typedef struct ps_image_sample {
  int32_t oy, ox;                         /* crop offsets in the source (ps_image_offset) */
  int32_t flip, vflip;                    /* 0 or 1 */
  int32_t cut_y0, cut_y1, cut_x0, cut_x1; /* cutout rows [y0, y1), columns [x0, x1); or empty */
  int32_t color; /* a colour factor is not the identity: the colour steps run */
  int32_t mix;   /* saturation or hue is not the identity (they act on 3-channel images only) */
  float ct, cs;  /* contrast and its shift (ps_image_contrast_shift, once the mean is known) */
  float br;      /* brightness */
  float sat, ks; /* saturation and 1 - saturation */
  float hue6;    /* the hue shift in sextants (6 * the record's hue, in turns) */
} ps_image_sample;

/* The cutout's extent along an axis of `extent` pixels: [*lo, *hi), empty (0, 0) when
 * size <= 0. The centre pixel c = floor(clamp(frac, 0, 65535) * extent / 2^16) lies inside the
 * axis (extent <= 2^24 keeps the product in 40 bits), and the span c - floor(size / 2) ..
 * + size, clipped, always holds it. 64-bit sums: size is any int32. */
PS_RULE void ps_image_cutout_span(int32_t frac, int32_t size, int32_t extent, int32_t *lo,
                                  int32_t *hi) {
  if (size <= 0) {
    *lo = *hi = 0;
    return;
  }
  const int64_t f = frac < 0 ? 0 : frac > 65535 ? 65535 : frac;
  const int64_t c = (f * extent) >> 16;
  const int64_t a = c - (size >> 1), b = a + size;
  *lo = (int32_t)(a < 0 ? 0 : a);
  *hi = (int32_t)(b > extent ? extent : b);
}

/* The contrast's grey weights, torchvision's rgb_to_grayscale (0.2989, 0.587, 0.114), as
 * integers over PS_IMAGE_GREY_DIV for the exact per-image sum and as fp32 for a pixel's grey. */
#define PS_IMAGE_GREY_R 2989
#define PS_IMAGE_GREY_G 5870
#define PS_IMAGE_GREY_B 1140
#define PS_IMAGE_GREY_DIV 10000

/* The rows or columns [*lo, *hi) of the source that an h- or w-long crop window at offset `o`
 * (ps_image_offset, |o| <= extent) covers; empty when the window lies outside. */
PS_RULE void ps_image_window(int32_t o, int32_t extent, int32_t *lo, int32_t *hi) {
  *lo = o < 0 ? 0 : o;
  *hi = o < 0 ? extent + o : extent;
  if (*hi < *lo) *hi = *lo;
}

/* A 3-channel pixel's weighted grey sum for the per-image mean, exact in integers. */
PS_RULE uint32_t ps_image_grey_weighted(uint32_t r, uint32_t g, uint32_t b) {
  return PS_IMAGE_GREY_R * r + PS_IMAGE_GREY_G * g + PS_IMAGE_GREY_B * b;
}

/* The contrast's mean grey of one sample from the exact integer `sum` over its h x w crop
 * window (pixels outside the image count as 0): with c == 3 the sum of ps_image_grey_weighted
 * over the window, otherwise the sum of every byte of every channel. One double division of
 * exact integers (both below 2^53), then one rounding to fp32: the same bits everywhere. */
PS_RULE float ps_image_grey_mean(uint64_t sum, int32_t c, int32_t h, int32_t w) {
  const double den = (double)h * (double)w * (c == 3 ? (double)PS_IMAGE_GREY_DIV : (double)c);
  return (float)((double)sum / den);
}

/* Contrast's per-sample constant: fp32(fp32(1 - ct) * mean), so that the blend
 * ct * v + (1 - ct) * mean is one multiply and one add per element (0 when ct = 1). */
PS_RULE PS_NO_CONTRACT float ps_image_contrast_shift(float ct, float mean) {
  const float keep = PS_FSUB(1.0f, ct);
  return PS_FMUL(keep, mean);
}

/* One sample's PS_IMAGE_PARAMS record (pinstream.h) as named words: a kernel reads it into
 * registers field by field, never into an indexed array. */
typedef struct ps_image_record {
  int32_t dy, dx, flip, vflip, cut_fy, cut_fx, cut_size, br_bits, ct_bits, sat_bits, hue_bits;
} ps_image_record;

/* The record of a batch without records: centred window (dy = dx = pad), nothing else. */
PS_RULE ps_image_record ps_image_record_plain(int32_t pad) {
  ps_image_record r;
  r.dy = r.dx = pad;
  r.flip = r.vflip = r.cut_fy = r.cut_fx = r.cut_size = 0;
  r.br_bits = r.ct_bits = r.sat_bits = 0x3f800000; /* 1.0f */
  r.hue_bits = 0;                                  /* 0.0f */
  return r;
}

/* Decodes record `r` of a batch of c-channel h x w images with padding `pad`. The contrast's
 * shift needs the sample's mean grey: cs is 0 here, and a kernel sets it
 * (ps_image_contrast_shift) when ct != 1. */
PS_RULE PS_NO_CONTRACT void ps_image_record_decode(ps_image_record r, int32_t pad, int32_t c,
                                                   int32_t h, int32_t w, ps_image_sample *s) {
  s->flip = r.flip != 0;
  s->vflip = r.vflip != 0;
  ps_image_cutout_span(r.cut_fy, r.cut_size, h, &s->cut_y0, &s->cut_y1);
  ps_image_cutout_span(r.cut_fx, r.cut_size, w, &s->cut_x0, &s->cut_x1);
  s->br = ps_f32_from_bits(r.br_bits);
  s->ct = ps_f32_from_bits(r.ct_bits);
  s->sat = ps_f32_from_bits(r.sat_bits);
  s->ks = PS_FSUB(1.0f, s->sat);
  s->hue6 = PS_FMUL(ps_f32_from_bits(r.hue_bits), 6.0f);
  s->cs = 0.0f;
  /* dy - pad can overflow int32: ps_image_offset computes it in 64 bits and clamps. */
  s->oy = ps_image_offset(r.dy, pad, h);
  s->ox = ps_image_offset(r.dx, pad, w);
  /* Factors of exactly 1 (and a hue shift of 0) are identities (ps_image_color,
   * ps_image_mix), so skipping them changes no bit; a NaN factor is not 1 and runs them.
   * Saturation and hue need three channels, as torchvision's (a grey image is left as is). */
  s->mix = c == 3 && !(s->sat == 1.0f && s->hue6 == 0.0f);
  s->color = !(s->br == 1.0f && s->ct == 1.0f) || s->mix;
}

/* Decodes sample `rec` (PS_IMAGE_PARAMS words, or NULL: centred window, nothing else) of a
 * batch of c-channel h x w images with padding `pad`; its contrast word is read as 1.0 unless
 * `contrast` (PS_IMAGE_NO_CONTRAST). */
PS_RULE void ps_image_sample_decode(const int32_t *rec, int32_t pad, int32_t c, int32_t h,
                                    int32_t w, int32_t contrast, ps_image_sample *s) {
  ps_image_record r = ps_image_record_plain(pad);
  if (rec != 0) {
    r.dy = rec[0];
    r.dx = rec[1];
    r.flip = rec[2];
    r.vflip = rec[3];
    r.cut_fy = rec[4];
    r.cut_fx = rec[5];
    r.cut_size = rec[6];
    r.br_bits = rec[7];
    if (contrast) r.ct_bits = rec[8];
    r.sat_bits = rec[9];
    r.hue_bits = rec[10];
  }
  ps_image_record_decode(r, pad, c, h, w, s);
}

/* ps_image_augment's clamp of a colour step to the byte range; NaN passes through. */
PS_RULE float ps_image_clamp255(float a) { return a < 0.0f ? 0.0f : a > 255.0f ? 255.0f : a; }

/* Contrast then brightness on one byte, each an fp32 multiply (and add) then a clamp:
 * a = clamp(byte * ct + cs), t = clamp(a * br). With ct = br = 1 (cs = 0): t = byte exactly. */
PS_RULE PS_NO_CONTRACT float ps_image_color(uint32_t byte, float ct, float cs, float br) {
  const float blended = PS_FMUL((float)byte, ct);
  const float a = ps_image_clamp255(PS_FADD(blended, cs));
  return ps_image_clamp255(PS_FMUL(a, br));
}

/* A pixel's grey for saturation, torchvision's rgb_to_grayscale weights in fp32:
 * ((0.2989 r + 0.587 g) + 0.114 b), each product and sum rounded. */
PS_RULE PS_NO_CONTRACT float ps_image_grey(float r, float g, float b) {
  const float gr = PS_FMUL(0.2989f, r), gg = PS_FMUL(0.587f, g), gb = PS_FMUL(0.114f, b);
  return PS_FADD(PS_FADD(gr, gg), gb);
}

/* Saturation then hue on one pixel (r, g, b: colour steps done, in [0, 255]), in place.
 * Saturation (sat != 1): x = clamp(sat * x + (1 - sat) * grey), grey from ps_image_grey.
 * Hue (hue6 != 0), in HSV with the hue in sextants [0, 6): mx, mn the largest and smallest
 * channel, cr = mx - mn (a grey pixel, cr = 0, has no hue and is left as it is); the hue
 * (g - b) / cr, 2 + (b - r) / cr or 4 + (r - g) / cr as r, g or b is the largest (in that
 * order of ties), plus hue6, wrapped once into [0, 6); sextant i (the first of 1, 2, 3, 4, 5
 * the hue is below, else 5), f = hue - i, q = mx - cr f, t = mn + cr f, and the pixel is
 * (mx, t, mn), (q, mx, mn), (mn, mx, t), (mn, q, mx), (t, mn, mx) or (mx, mn, q), each clamped
 * to [0, 255]. Value and saturation are kept, as torchvision's adjust_hue keeps them. */
PS_RULE PS_NO_CONTRACT void ps_image_mix(const ps_image_sample *s, float *r, float *g, float *b) {
  float x = *r, y = *g, z = *b;
  if (s->sat != 1.0f) {
    const float grey = PS_FMUL(ps_image_grey(x, y, z), s->ks);
    x = ps_image_clamp255(PS_FADD(PS_FMUL(x, s->sat), grey));
    y = ps_image_clamp255(PS_FADD(PS_FMUL(y, s->sat), grey));
    z = ps_image_clamp255(PS_FADD(PS_FMUL(z, s->sat), grey));
  }
  if (s->hue6 != 0.0f) {
    /* Comparisons rather than fmaxf: the same pick for NaN and signed zeros everywhere. */
    float mx = x, mn = x;
    if (y > mx) mx = y;
    if (z > mx) mx = z;
    if (y < mn) mn = y;
    if (z < mn) mn = z;
    const float cr = PS_FSUB(mx, mn);
    if (cr > 0.0f) {
      float hh;
      if (mx == x) {
        hh = PS_FDIV(PS_FSUB(y, z), cr);
      } else if (mx == y) {
        hh = PS_FADD(2.0f, PS_FDIV(PS_FSUB(z, x), cr));
      } else {
        hh = PS_FADD(4.0f, PS_FDIV(PS_FSUB(x, y), cr));
      }
      hh = PS_FADD(hh, s->hue6);
      if (hh < 0.0f) hh = PS_FADD(hh, 6.0f);
      if (hh >= 6.0f) hh = PS_FSUB(hh, 6.0f);
      const float i = hh < 1.0f   ? 0.0f
                      : hh < 2.0f ? 1.0f
                      : hh < 3.0f ? 2.0f
                      : hh < 4.0f ? 3.0f
                      : hh < 5.0f ? 4.0f
                                  : 5.0f;
      const float d = PS_FMUL(cr, PS_FSUB(hh, i));
      const float q = ps_image_clamp255(PS_FSUB(mx, d)), t = ps_image_clamp255(PS_FADD(mn, d));
      if (i == 0.0f) {
        x = mx, y = t, z = mn;
      } else if (i == 1.0f) {
        x = q, y = mx, z = mn;
      } else if (i == 2.0f) {
        x = mn, y = mx, z = t;
      } else if (i == 3.0f) {
        x = mn, y = q, z = mx;
      } else if (i == 4.0f) {
        x = t, y = mn, z = mx;
      } else {
        x = mx, y = mn, z = q;
      }
    }
  }
  *r = x;
  *g = y;
  *b = z;
}

/* Is output pixel (y, x) inside the sample's cutout square (written as +0.0)? */
PS_RULE int ps_image_cut(const ps_image_sample *s, int32_t y, int32_t x) {
  return y >= s->cut_y0 && y < s->cut_y1 && x >= s->cut_x0 && x < s->cut_x1;
}

#endif /* PINSTREAM_RULES_H */
