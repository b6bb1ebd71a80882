/**
 * The `Deno.dlopen` symbol table of a pinstream backend library, mirroring
 * kernels/pinstream.h one-to-one (same order, same sections), with each C prototype beside
 * its entry.
 *
 * Conventions: every function returns an `i32` status (0 = ok); `u64` sizes accept a number
 * or a bigint; out-parameters are `buffer`s (a typed array of the right width). Functions
 * marked [wait] in the header block until the device catches up, so they are `nonblocking`
 * (run on a Deno worker thread, returning a promise) and take a message buffer because the
 * thread-local `ps_last_error()` of that worker thread is out of reach.
 *
 * @module
 */

/** The ABI version this table matches (`PS_ABI_VERSION` in kernels/pinstream.h). */
export const ABI_VERSION = 8;

/** The dlopen symbol table of a pinstream backend library. */
export const symbols = {
  // ---- library
  // int ps_abi_version(int32_t *out);
  ps_abi_version: { parameters: ["buffer"], result: "i32" },
  // int ps_backend(int32_t *out);  0 = cpu, 1 = cuda
  ps_backend: { parameters: ["buffer"], result: "i32" },
  // const char *ps_last_error(void);
  ps_last_error: { parameters: [], result: "pointer" },
  // int ps_live_objects(int64_t *allocations, int64_t *streams, int64_t *events);
  ps_live_objects: { parameters: ["buffer", "buffer", "buffer"], result: "i32" },

  // ---- devices
  // int ps_device_count(int32_t *out);
  ps_device_count: { parameters: ["buffer"], result: "i32" },
  // int ps_device_props_get(int32_t device, ps_device_props *out);
  ps_device_props_get: { parameters: ["i32", "buffer"], result: "i32" },
  // int ps_device_set(int32_t device);
  ps_device_set: { parameters: ["i32"], result: "i32" },
  // int ps_device_get(int32_t *out);
  ps_device_get: { parameters: ["buffer"], result: "i32" },
  // [wait] int ps_device_synchronize(int32_t device, char *msg, uint64_t msg_cap);
  ps_device_synchronize: {
    parameters: ["i32", "buffer", "u64"],
    result: "i32",
    nonblocking: true,
  },
  // int ps_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);
  ps_mem_info: { parameters: ["buffer", "buffer"], result: "i32" },

  // ---- host memory
  // int ps_host_alloc(uint64_t bytes, void **out);
  ps_host_alloc: { parameters: ["u64", "buffer"], result: "i32" },
  // int ps_host_free(void *ptr);
  ps_host_free: { parameters: ["pointer"], result: "i32" },
  // int ps_host_register(void *ptr, uint64_t bytes);
  ps_host_register: { parameters: ["pointer", "u64"], result: "i32" },
  // int ps_host_unregister(void *ptr);
  ps_host_unregister: { parameters: ["pointer"], result: "i32" },

  // ---- device memory
  // int ps_device_alloc(uint64_t bytes, void **out);
  ps_device_alloc: { parameters: ["u64", "buffer"], result: "i32" },
  // int ps_device_free(void *ptr);
  ps_device_free: { parameters: ["pointer"], result: "i32" },
  // int ps_memset_async(void *dst, int32_t value, uint64_t bytes, void *stream);
  ps_memset_async: { parameters: ["pointer", "i32", "u64", "pointer"], result: "i32" },
  // int ps_memcpy_h2d_async(void *dst, const void *src, uint64_t bytes, void *stream);
  ps_memcpy_h2d_async: { parameters: ["pointer", "pointer", "u64", "pointer"], result: "i32" },
  // int ps_memcpy_d2h_async(void *dst, const void *src, uint64_t bytes, void *stream);
  ps_memcpy_d2h_async: { parameters: ["pointer", "pointer", "u64", "pointer"], result: "i32" },
  // int ps_memcpy_d2d_async(void *dst, const void *src, uint64_t bytes, void *stream);
  ps_memcpy_d2d_async: { parameters: ["pointer", "pointer", "u64", "pointer"], result: "i32" },

  // ---- streams
  // int ps_stream_create(int32_t flags, void **out);
  ps_stream_create: { parameters: ["i32", "buffer"], result: "i32" },
  // int ps_stream_destroy(void *stream);
  ps_stream_destroy: { parameters: ["pointer"], result: "i32" },
  // [wait] int ps_stream_synchronize(int32_t device, void *stream, char *msg, uint64_t msg_cap);
  ps_stream_synchronize: {
    parameters: ["i32", "pointer", "buffer", "u64"],
    result: "i32",
    nonblocking: true,
  },
  // int ps_stream_query(void *stream);  PS_ERR_NOT_READY while work is pending
  ps_stream_query: { parameters: ["pointer"], result: "i32" },
  // int ps_stream_wait_event(void *stream, void *event);
  ps_stream_wait_event: { parameters: ["pointer", "pointer"], result: "i32" },

  // ---- events
  // int ps_event_create(int32_t flags, void **out);
  ps_event_create: { parameters: ["i32", "buffer"], result: "i32" },
  // int ps_event_destroy(void *event);
  ps_event_destroy: { parameters: ["pointer"], result: "i32" },
  // int ps_event_record(void *event, void *stream);
  ps_event_record: { parameters: ["pointer", "pointer"], result: "i32" },
  // int ps_event_query(void *event);  PS_ERR_NOT_READY while work is pending
  ps_event_query: { parameters: ["pointer"], result: "i32" },
  // [wait] int ps_event_synchronize(void *event, char *msg, uint64_t msg_cap);
  ps_event_synchronize: {
    parameters: ["pointer", "buffer", "u64"],
    result: "i32",
    nonblocking: true,
  },
  // int ps_event_elapsed_ms(void *start, void *end, float *out_ms);
  ps_event_elapsed_ms: { parameters: ["pointer", "pointer", "buffer"], result: "i32" },

  // ---- benchmark helper
  // [wait] int ps_bench_memcpy_loop(int32_t device, void *dst, const void *src, uint64_t bytes,
  //                                 int32_t kind, int32_t iters, void *stream, float *out_ms,
  //                                 char *msg, uint64_t msg_cap);
  ps_bench_memcpy_loop: {
    parameters: [
      "i32",
      "pointer",
      "pointer",
      "u64",
      "i32",
      "i32",
      "pointer",
      "buffer",
      "buffer",
      "u64",
    ],
    result: "i32",
    nonblocking: true,
  },

  // PS-SECTION image: entries added by the pipeline work go here.
  // int ps_image_augment(const void *src, const int32_t *indices, int64_t rows,
  //                      int32_t layout, int32_t n, int32_t c, int32_t h, int32_t w,
  //                      int32_t pad, const void *params, const float *scale,
  //                      const float *bias, void *out, int32_t out_dtype, int32_t flags,
  //                      void *stream);
  // scale and bias are HOST arrays (Float32Array), read before the call returns.
  ps_image_augment: {
    parameters: [
      "pointer",
      "pointer",
      "i64",
      "i32",
      "i32",
      "i32",
      "i32",
      "i32",
      "i32",
      "pointer",
      "buffer",
      "buffer",
      "pointer",
      "i32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_image_labels_i32(const void *src, int32_t src_bytes, int32_t n, void *out,
  //                         void *stream);
  ps_image_labels_i32: {
    parameters: ["pointer", "i32", "i32", "pointer", "pointer"],
    result: "i32",
  },
  // PS-SECTION nn: entries added by the training work go here.
  // int ps_nn_matmul(const void *a, const void *b, int32_t dtype, void *c, int32_t c_dtype,
  //                  int64_t m, int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
  //                  int32_t accumulate, void *stream);
  ps_nn_matmul: {
    parameters: [
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "i32",
      "i32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_conv2d_forward(const void *x, const void *w, void *y, int32_t dtype, int64_t n,
  //                          int64_t c, int64_t h, int64_t w_, int64_t co, int32_t kh,
  //                          int32_t kw, int32_t stride, int32_t pad, void *stream);
  ps_nn_conv2d_forward: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "i64",
      "i64",
      "i32",
      "i32",
      "i32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_conv2d_backward_data(const void *dy, const void *w, void *dx, int32_t dtype,
  //                                int64_t n, int64_t c, int64_t h, int64_t w_, int64_t co,
  //                                int32_t kh, int32_t kw, int32_t stride, int32_t pad,
  //                                void *stream);
  ps_nn_conv2d_backward_data: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "i64",
      "i64",
      "i32",
      "i32",
      "i32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_conv2d_backward_weight(const void *x, const void *dy, int32_t dtype, void *dw,
  //                                  int32_t dw_dtype, int64_t n, int64_t c, int64_t h,
  //                                  int64_t w_, int64_t co, int32_t kh, int32_t kw,
  //                                  int32_t stride, int32_t pad, int32_t accumulate,
  //                                  void *stream);
  ps_nn_conv2d_backward_weight: {
    parameters: [
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "i64",
      "i64",
      "i32",
      "i32",
      "i32",
      "i32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_maxpool2d_forward(const void *x, void *y, int32_t dtype, int32_t *indices,
  //                             int64_t n, int64_t c, int64_t h, int64_t w_, int32_t kernel,
  //                             int32_t stride, void *stream);
  ps_nn_maxpool2d_forward: {
    parameters: [
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "i64",
      "i64",
      "i64",
      "i64",
      "i32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_maxpool2d_backward(const void *dy, const int32_t *indices, void *dx,
  //                              int32_t dtype, int64_t n, int64_t c, int64_t h, int64_t w_,
  //                              int64_t oh, int64_t ow, void *stream);
  ps_nn_maxpool2d_backward: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "i64",
      "i64",
      "i64",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
  //                                   void *y, int32_t dtype, float *save_mean,
  //                                   float *save_invstd, float *run_mean, float *run_var,
  //                                   int64_t n, int64_t c, int64_t hw, float momentum,
  //                                   float eps, void *stream);
  ps_nn_batchnorm_forward_train: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "i64",
      "i64",
      "i64",
      "f32",
      "f32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_batchnorm_forward_eval(const void *x, const float *gamma, const float *beta,
  //                                  const float *run_mean, const float *run_var, void *y,
  //                                  int32_t dtype, int64_t n, int64_t c, int64_t hw,
  //                                  float eps, void *stream);
  ps_nn_batchnorm_forward_eval: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "f32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_batchnorm_backward(const void *dy, const void *x, const float *gamma,
  //                              const float *save_mean, const float *save_invstd, void *dx,
  //                              int32_t dtype, float *dgamma, float *dbeta, int64_t n,
  //                              int64_t c, int64_t hw, void *stream);
  ps_nn_batchnorm_backward: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "pointer",
      "i64",
      "i64",
      "i64",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_batchnorm_workspace(int64_t n, int64_t c, int64_t hw, int64_t *floats);
  ps_nn_batchnorm_workspace: { parameters: ["i64", "i64", "i64", "buffer"], result: "i32" },
  // int ps_nn_batchnorm_act_forward_train(const void *x, const float *gamma, const float *beta,
  //     void *y, int32_t dtype, float *save_mean, float *save_invstd, float *run_mean,
  //     float *run_var, float *run_backup, float *work, int64_t work_floats, int64_t n,
  //     int64_t c, int64_t hw, float momentum, float eps, int32_t act, void *stream);
  ps_nn_batchnorm_act_forward_train: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "i64",
      "i64",
      "i64",
      "i64",
      "f32",
      "f32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_batchnorm_act_backward(const void *dy, const void *x, const void *y,
  //     const float *gamma, const float *save_mean, const float *save_invstd, void *dx,
  //     int32_t dtype, float *dgamma, float *dbeta, float *work, int64_t work_floats,
  //     int64_t n, int64_t c, int64_t hw, int32_t act, void *stream);
  ps_nn_batchnorm_act_backward: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "pointer",
      "pointer",
      "i64",
      "i64",
      "i64",
      "i64",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_bias_add(void *y, int32_t dtype, const void *bias, int32_t bias_dtype,
  //                    int64_t n, int64_t c, int64_t hw, void *stream);
  ps_nn_bias_add: {
    parameters: [
      "pointer",
      "i32",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_bias_grad(const void *dy, int32_t dtype, void *dbias, int32_t dbias_dtype,
  //                     int64_t n, int64_t c, int64_t hw, int32_t accumulate, void *stream);
  ps_nn_bias_grad: {
    parameters: [
      "pointer",
      "i32",
      "pointer",
      "i32",
      "i64",
      "i64",
      "i64",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_relu_forward(const void *x, void *y, int32_t dtype, int64_t count,
  //                        void *stream);
  ps_nn_relu_forward: {
    parameters: [
      "pointer",
      "pointer",
      "i32",
      "i64",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_relu_backward(const void *dy, const void *y, void *dx, int32_t dtype,
  //                         int64_t count, void *stream);
  ps_nn_relu_backward: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "i64",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_cross_entropy(const void *logits, const int32_t *labels, void *dlogits,
  //                         int32_t dtype, float *loss_sum, int32_t *correct, int64_t n,
  //                         int64_t k, float scale, const float *device_scale, void *stream);
  ps_nn_cross_entropy: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "pointer",
      "i64",
      "i64",
      "f32",
      "pointer",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype, int64_t count,
  //              void *stream);
  ps_nn_cast: { parameters: ["pointer", "i32", "pointer", "i32", "i64", "pointer"], result: "i32" },
  // int ps_gather_rows(const void *src, int64_t rows, int64_t row_bytes, const int32_t *indices,
  //                    int32_t n, void *dst, void *stream)
  ps_gather_rows: {
    parameters: ["pointer", "i64", "i64", "pointer", "i32", "pointer", "pointer"],
    result: "i32",
  },
  // int ps_tensor_fill(void *dst, int32_t dtype, int64_t count, int32_t mode, double a,
  //                    double b, uint64_t seed, uint64_t offset, void *stream)
  ps_tensor_fill: {
    parameters: ["pointer", "i32", "i64", "i32", "f64", "f64", "u64", "u64", "pointer"],
    result: "i32",
  },
  // int ps_nn_unscale_check(void *grad, int32_t grad_dtype, int64_t count, const float *scale,
  //                       float inv_scale, int32_t in_place, int32_t *found_inf, void *stream);
  ps_nn_unscale_check: {
    parameters: [
      "pointer",
      "i32",
      "i64",
      "pointer",
      "f32",
      "i32",
      "pointer",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_sgd_step(float *param, const void *grad, int32_t grad_dtype, float *momentum_buf,
  //                  void *param_half, int64_t count, float lr, float momentum, float dampening,
  //                  float weight_decay, int32_t nesterov, const float *scale,
  //                  const int32_t *found_inf, const int32_t *steps_done, void *stream);
  ps_nn_sgd_step: {
    parameters: [
      "pointer",
      "pointer",
      "i32",
      "pointer",
      "pointer",
      "i64",
      "f32",
      "f32",
      "f32",
      "f32",
      "i32",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_step_count(int32_t *steps_done, const int32_t *found_inf, void *stream);
  ps_nn_step_count: { parameters: ["pointer", "pointer", "pointer"], result: "i32" },
  // int ps_nn_scaler_update(float *scale, int32_t *growth_tracker, const int32_t *found_inf,
  //                       float growth_factor, float backoff_factor, int32_t growth_interval,
  //                       void *stream);
  ps_nn_scaler_update: {
    parameters: [
      "pointer",
      "pointer",
      "pointer",
      "f32",
      "f32",
      "i32",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_multi_unscale_check(const int64_t *list, int32_t n, int64_t max_count,
  //     const float *scale, float inv_scale, int32_t in_place, int32_t *found_inf, void *stream);
  ps_nn_multi_unscale_check: {
    parameters: ["pointer", "i32", "i64", "pointer", "f32", "i32", "pointer", "pointer"],
    result: "i32",
  },
  // int ps_nn_multi_sgd_step(const int64_t *list, int32_t n, int64_t max_count, float lr,
  //     float momentum, float dampening, float weight_decay, int32_t nesterov,
  //     const float *scale, const int32_t *found_inf, const int32_t *steps_done, void *stream);
  ps_nn_multi_sgd_step: {
    parameters: [
      "pointer",
      "i32",
      "i64",
      "f32",
      "f32",
      "f32",
      "f32",
      "i32",
      "pointer",
      "pointer",
      "pointer",
      "pointer",
    ],
    result: "i32",
  },
  // int ps_nn_multi_copy_if(const int64_t *list, int32_t n, int64_t max_count,
  //     const int32_t *flag, void *stream);
  ps_nn_multi_copy_if: {
    parameters: ["pointer", "i32", "i64", "pointer", "pointer"],
    result: "i32",
  },
  // int ps_nn_copy_if(float *dst, const float *src, int64_t count, const int32_t *flag,
  //                   void *stream);
  ps_nn_copy_if: { parameters: ["pointer", "pointer", "i64", "pointer", "pointer"], result: "i32" },
} as const satisfies Deno.ForeignLibraryInterface;

/** A loaded pinstream backend library. */
export type Library = Deno.DynamicLibrary<typeof symbols>;
