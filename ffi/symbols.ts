/**
 * The `Deno.dlopen` symbol table of a pinstream backend library, mirroring
 * kernels/pinstream.h one-to-one (same sections), each parameter under its C name:
 * tests/symbols_test.ts reads the header's prototypes and fails on any difference of name,
 * count, type or ABI version. The native backend (ffi/native_backend.ts) passes the kernels'
 * arguments by these names.
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
export const ABI_VERSION = 10;

/** One C parameter: its name in kernels/pinstream.h and its FFI type. */
export type Param = readonly [name: string, type: Deno.NativeType];

/** One function of the ABI: its parameters in order, its result, whether it blocks. */
export interface Signature {
  /** The parameters, by C name. */
  readonly params: readonly Param[];
  /** The result's FFI type. */
  readonly result: Deno.NativeResultType;
  /** Run on a worker thread, returning a promise (the header's [wait] functions). */
  readonly nonblocking?: boolean;
}

/** Every function of kernels/pinstream.h, each parameter named as in its prototype. */
export const signatures = {
  // ---- library
  ps_abi_version: { params: [["out", "buffer"]], result: "i32" },
  // 0 = cpu, 1 = cuda
  ps_backend: { params: [["out", "buffer"]], result: "i32" },
  ps_last_error: { params: [], result: "pointer" },
  ps_live_objects: {
    params: [["allocations", "buffer"], ["streams", "buffer"], ["events", "buffer"]],
    result: "i32",
  },
  ps_scratch_allocations: { params: [["out", "buffer"]], result: "i32" },

  // ---- devices
  ps_device_count: { params: [["out", "buffer"]], result: "i32" },
  ps_device_props_get: { params: [["device", "i32"], ["out", "buffer"]], result: "i32" },
  ps_device_set: { params: [["device", "i32"]], result: "i32" },
  ps_device_get: { params: [["out", "buffer"]], result: "i32" },
  // [wait]
  ps_device_synchronize: {
    params: [["device", "i32"], ["msg", "buffer"], ["msg_cap", "u64"]],
    result: "i32",
    nonblocking: true,
  },
  ps_mem_info: { params: [["free_bytes", "buffer"], ["total_bytes", "buffer"]], result: "i32" },

  // ---- host memory
  ps_host_alloc: { params: [["bytes", "u64"], ["out", "buffer"]], result: "i32" },
  ps_host_free: { params: [["ptr", "pointer"]], result: "i32" },
  ps_host_register: { params: [["ptr", "pointer"], ["bytes", "u64"]], result: "i32" },
  ps_host_unregister: { params: [["ptr", "pointer"]], result: "i32" },

  // ---- device memory
  ps_device_alloc: { params: [["bytes", "u64"], ["out", "buffer"]], result: "i32" },
  ps_device_free: { params: [["ptr", "pointer"]], result: "i32" },
  ps_memset_async: {
    params: [["dst", "pointer"], ["value", "i32"], ["bytes", "u64"], ["stream", "pointer"]],
    result: "i32",
  },
  ps_memcpy_h2d_async: {
    params: [["dst", "pointer"], ["src", "pointer"], ["bytes", "u64"], ["stream", "pointer"]],
    result: "i32",
  },
  ps_memcpy_d2h_async: {
    params: [["dst", "pointer"], ["src", "pointer"], ["bytes", "u64"], ["stream", "pointer"]],
    result: "i32",
  },
  ps_memcpy_d2d_async: {
    params: [["dst", "pointer"], ["src", "pointer"], ["bytes", "u64"], ["stream", "pointer"]],
    result: "i32",
  },

  // ---- streams
  ps_stream_create: { params: [["flags", "i32"], ["out", "buffer"]], result: "i32" },
  ps_stream_destroy: { params: [["stream", "pointer"]], result: "i32" },
  // [wait]
  ps_stream_synchronize: {
    params: [["device", "i32"], ["stream", "pointer"], ["msg", "buffer"], ["msg_cap", "u64"]],
    result: "i32",
    nonblocking: true,
  },
  // PS_ERR_NOT_READY while work is pending
  ps_stream_query: { params: [["stream", "pointer"]], result: "i32" },
  ps_stream_wait_event: { params: [["stream", "pointer"], ["event", "pointer"]], result: "i32" },

  // ---- events
  ps_event_create: { params: [["flags", "i32"], ["out", "buffer"]], result: "i32" },
  ps_event_destroy: { params: [["event", "pointer"]], result: "i32" },
  ps_event_record: { params: [["event", "pointer"], ["stream", "pointer"]], result: "i32" },
  // PS_ERR_NOT_READY while work is pending
  ps_event_query: { params: [["event", "pointer"]], result: "i32" },
  // [wait]
  ps_event_synchronize: {
    params: [["event", "pointer"], ["msg", "buffer"], ["msg_cap", "u64"]],
    result: "i32",
    nonblocking: true,
  },
  ps_event_elapsed_ms: {
    params: [["start", "pointer"], ["end", "pointer"], ["out_ms", "buffer"]],
    result: "i32",
  },

  // ---- graphs
  ps_graph_capture_begin: { params: [["stream", "pointer"]], result: "i32" },
  ps_graph_capture_end: { params: [["stream", "pointer"], ["out", "buffer"]], result: "i32" },
  ps_graph_launch: { params: [["graph", "pointer"], ["stream", "pointer"]], result: "i32" },
  ps_graph_destroy: { params: [["graph", "pointer"]], result: "i32" },
  ps_graph_live: { params: [["out", "buffer"]], result: "i32" },

  // ---- benchmark helper
  // [wait]
  ps_bench_memcpy_loop: {
    params: [
      ["device", "i32"],
      ["dst", "pointer"],
      ["src", "pointer"],
      ["bytes", "u64"],
      ["kind", "i32"],
      ["iters", "i32"],
      ["stream", "pointer"],
      ["out_ms", "buffer"],
      ["msg", "buffer"],
      ["msg_cap", "u64"],
    ],
    result: "i32",
    nonblocking: true,
  },

  // PS-SECTION image: entries added by the pipeline work go here.
  // scale and bias are HOST arrays (Float32Array), read before the call returns.
  ps_image_augment: {
    params: [
      ["src", "pointer"],
      ["indices", "pointer"],
      ["rows", "i64"],
      ["layout", "i32"],
      ["n", "i32"],
      ["c", "i32"],
      ["h", "i32"],
      ["w", "i32"],
      ["pad", "i32"],
      ["params", "pointer"],
      ["scale", "buffer"],
      ["bias", "buffer"],
      ["out", "pointer"],
      ["out_dtype", "i32"],
      ["flags", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_image_augment_labeled: {
    params: [
      ["src", "pointer"],
      ["indices", "pointer"],
      ["rows", "i64"],
      ["layout", "i32"],
      ["n", "i32"],
      ["c", "i32"],
      ["h", "i32"],
      ["w", "i32"],
      ["pad", "i32"],
      ["params", "pointer"],
      ["scale", "buffer"],
      ["bias", "buffer"],
      ["out", "pointer"],
      ["out_dtype", "i32"],
      ["flags", "i32"],
      ["labels", "pointer"],
      ["label_bytes", "i32"],
      ["labels_out", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_image_labels_i32: {
    params: [["src", "pointer"], ["src_bytes", "i32"], ["n", "i32"], ["out", "pointer"], [
      "stream",
      "pointer",
    ]],
    result: "i32",
  },
  // fill packs one byte per channel; params and out are device memory.
  ps_image_geometry: {
    params: [
      ["src", "pointer"],
      ["src_stride", "i64"],
      ["n", "i32"],
      ["c", "i32"],
      ["params", "pointer"],
      ["oh", "i32"],
      ["ow", "i32"],
      ["fill", "i32"],
      ["out", "pointer"],
      ["flags", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  // PS-SECTION nn: entries added by the training work go here.
  ps_nn_matmul: {
    params: [
      ["a", "pointer"],
      ["b", "pointer"],
      ["dtype", "i32"],
      ["c", "pointer"],
      ["c_dtype", "i32"],
      ["m", "i64"],
      ["n", "i64"],
      ["k", "i64"],
      ["trans_a", "i32"],
      ["trans_b", "i32"],
      ["accumulate", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_matmul_bias_act: {
    params: [
      ["a", "pointer"],
      ["b", "pointer"],
      ["dtype", "i32"],
      ["c", "pointer"],
      ["c_dtype", "i32"],
      ["m", "i64"],
      ["n", "i64"],
      ["k", "i64"],
      ["trans_a", "i32"],
      ["trans_b", "i32"],
      ["bias", "pointer"],
      ["bias_dtype", "i32"],
      ["act", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_conv2d_forward: {
    params: [
      ["x", "pointer"],
      ["w", "pointer"],
      ["y", "pointer"],
      ["dtype", "i32"],
      ["n", "i64"],
      ["c", "i64"],
      ["h", "i64"],
      ["w_", "i64"],
      ["co", "i64"],
      ["kh", "i32"],
      ["kw", "i32"],
      ["stride", "i32"],
      ["pad", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_conv2d_backward_data: {
    params: [
      ["dy", "pointer"],
      ["w", "pointer"],
      ["dx", "pointer"],
      ["dtype", "i32"],
      ["n", "i64"],
      ["c", "i64"],
      ["h", "i64"],
      ["w_", "i64"],
      ["co", "i64"],
      ["kh", "i32"],
      ["kw", "i32"],
      ["stride", "i32"],
      ["pad", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_conv2d_backward_weight: {
    params: [
      ["x", "pointer"],
      ["dy", "pointer"],
      ["dtype", "i32"],
      ["dw", "pointer"],
      ["dw_dtype", "i32"],
      ["n", "i64"],
      ["c", "i64"],
      ["h", "i64"],
      ["w_", "i64"],
      ["co", "i64"],
      ["kh", "i32"],
      ["kw", "i32"],
      ["stride", "i32"],
      ["pad", "i32"],
      ["accumulate", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_maxpool2d_forward: {
    params: [
      ["x", "pointer"],
      ["y", "pointer"],
      ["dtype", "i32"],
      ["indices", "pointer"],
      ["n", "i64"],
      ["c", "i64"],
      ["h", "i64"],
      ["w_", "i64"],
      ["kernel", "i32"],
      ["stride", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_maxpool2d_backward: {
    params: [
      ["dy", "pointer"],
      ["indices", "pointer"],
      ["dx", "pointer"],
      ["dtype", "i32"],
      ["n", "i64"],
      ["c", "i64"],
      ["h", "i64"],
      ["w_", "i64"],
      ["oh", "i64"],
      ["ow", "i64"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_batchnorm_forward_train: {
    params: [
      ["x", "pointer"],
      ["gamma", "pointer"],
      ["beta", "pointer"],
      ["y", "pointer"],
      ["dtype", "i32"],
      ["save_mean", "pointer"],
      ["save_invstd", "pointer"],
      ["run_mean", "pointer"],
      ["run_var", "pointer"],
      ["n", "i64"],
      ["c", "i64"],
      ["hw", "i64"],
      ["momentum", "f32"],
      ["eps", "f32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_batchnorm_forward_eval: {
    params: [
      ["x", "pointer"],
      ["gamma", "pointer"],
      ["beta", "pointer"],
      ["run_mean", "pointer"],
      ["run_var", "pointer"],
      ["y", "pointer"],
      ["dtype", "i32"],
      ["n", "i64"],
      ["c", "i64"],
      ["hw", "i64"],
      ["eps", "f32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_batchnorm_backward: {
    params: [
      ["dy", "pointer"],
      ["x", "pointer"],
      ["gamma", "pointer"],
      ["save_mean", "pointer"],
      ["save_invstd", "pointer"],
      ["dx", "pointer"],
      ["dtype", "i32"],
      ["dgamma", "pointer"],
      ["dbeta", "pointer"],
      ["n", "i64"],
      ["c", "i64"],
      ["hw", "i64"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_batchnorm_workspace: {
    params: [["n", "i64"], ["c", "i64"], ["hw", "i64"], ["floats", "buffer"]],
    result: "i32",
  },
  ps_nn_batchnorm_act_forward_train: {
    params: [
      ["x", "pointer"],
      ["gamma", "pointer"],
      ["beta", "pointer"],
      ["y", "pointer"],
      ["dtype", "i32"],
      ["save_mean", "pointer"],
      ["save_invstd", "pointer"],
      ["run_mean", "pointer"],
      ["run_var", "pointer"],
      ["run_backup", "pointer"],
      ["work", "pointer"],
      ["work_floats", "i64"],
      ["n", "i64"],
      ["c", "i64"],
      ["hw", "i64"],
      ["momentum", "f32"],
      ["eps", "f32"],
      ["act", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_batchnorm_act_backward: {
    params: [
      ["dy", "pointer"],
      ["x", "pointer"],
      ["y", "pointer"],
      ["gamma", "pointer"],
      ["save_mean", "pointer"],
      ["save_invstd", "pointer"],
      ["dx", "pointer"],
      ["dtype", "i32"],
      ["dgamma", "pointer"],
      ["dbeta", "pointer"],
      ["work", "pointer"],
      ["work_floats", "i64"],
      ["n", "i64"],
      ["c", "i64"],
      ["hw", "i64"],
      ["act", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_bias_add: {
    params: [
      ["y", "pointer"],
      ["dtype", "i32"],
      ["bias", "pointer"],
      ["bias_dtype", "i32"],
      ["n", "i64"],
      ["c", "i64"],
      ["hw", "i64"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_bias_grad: {
    params: [
      ["dy", "pointer"],
      ["dtype", "i32"],
      ["dbias", "pointer"],
      ["dbias_dtype", "i32"],
      ["n", "i64"],
      ["c", "i64"],
      ["hw", "i64"],
      ["accumulate", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_relu_forward: {
    params: [["x", "pointer"], ["y", "pointer"], ["dtype", "i32"], ["count", "i64"], [
      "stream",
      "pointer",
    ]],
    result: "i32",
  },
  ps_nn_relu_backward: {
    params: [["dy", "pointer"], ["y", "pointer"], ["dx", "pointer"], ["dtype", "i32"], [
      "count",
      "i64",
    ], ["stream", "pointer"]],
    result: "i32",
  },
  ps_nn_cross_entropy: {
    params: [
      ["logits", "pointer"],
      ["labels", "pointer"],
      ["dlogits", "pointer"],
      ["dtype", "i32"],
      ["loss_sum", "pointer"],
      ["correct", "pointer"],
      ["n", "i64"],
      ["k", "i64"],
      ["scale", "f32"],
      ["device_scale", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_cast: {
    params: [["src", "pointer"], ["src_dtype", "i32"], ["dst", "pointer"], ["dst_dtype", "i32"], [
      "count",
      "i64",
    ], ["stream", "pointer"]],
    result: "i32",
  },
  ps_gather_rows: {
    params: [
      ["src", "pointer"],
      ["rows", "i64"],
      ["row_bytes", "i64"],
      ["indices", "pointer"],
      ["n", "i32"],
      ["dst", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_tensor_fill: {
    params: [
      ["dst", "pointer"],
      ["dtype", "i32"],
      ["count", "i64"],
      ["mode", "i32"],
      ["a", "f64"],
      ["b", "f64"],
      ["seed", "u64"],
      ["offset", "u64"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_unscale_check: {
    params: [
      ["grad", "pointer"],
      ["grad_dtype", "i32"],
      ["count", "i64"],
      ["scale", "pointer"],
      ["inv_scale", "f32"],
      ["in_place", "i32"],
      ["found_inf", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_sgd_step: {
    params: [
      ["param", "pointer"],
      ["grad", "pointer"],
      ["grad_dtype", "i32"],
      ["momentum_buf", "pointer"],
      ["param_half", "pointer"],
      ["half_dtype", "i32"],
      ["count", "i64"],
      ["lr", "f32"],
      ["momentum", "f32"],
      ["dampening", "f32"],
      ["weight_decay", "f32"],
      ["nesterov", "i32"],
      ["scale", "pointer"],
      ["found_inf", "pointer"],
      ["steps_done", "pointer"],
      ["hyper", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_step_count: {
    params: [["steps_done", "pointer"], ["found_inf", "pointer"], ["stream", "pointer"]],
    result: "i32",
  },
  ps_nn_scaler_update: {
    params: [
      ["scale", "pointer"],
      ["growth_tracker", "pointer"],
      ["found_inf", "pointer"],
      ["growth_factor", "f32"],
      ["backoff_factor", "f32"],
      ["growth_interval", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_multi_unscale_check: {
    params: [
      ["list", "pointer"],
      ["n", "i32"],
      ["max_count", "i64"],
      ["scale", "pointer"],
      ["inv_scale", "f32"],
      ["in_place", "i32"],
      ["found_inf", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_multi_sgd_step: {
    params: [
      ["list", "pointer"],
      ["n", "i32"],
      ["max_count", "i64"],
      ["lr", "f32"],
      ["momentum", "f32"],
      ["dampening", "f32"],
      ["weight_decay", "f32"],
      ["nesterov", "i32"],
      ["scale", "pointer"],
      ["found_inf", "pointer"],
      ["steps_done", "pointer"],
      ["hyper", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_multi_copy_if: {
    params: [
      ["list", "pointer"],
      ["n", "i32"],
      ["max_count", "i64"],
      ["flag", "pointer"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_copy_if: {
    params: [["dst", "pointer"], ["src", "pointer"], ["count", "i64"], ["flag", "pointer"], [
      "stream",
      "pointer",
    ]],
    result: "i32",
  },
  ps_nn_concat: {
    params: [
      ["part", "pointer"],
      ["whole", "pointer"],
      ["dtype", "i32"],
      ["outer", "i64"],
      ["part_len", "i64"],
      ["whole_len", "i64"],
      ["offset", "i64"],
      ["split", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
  ps_nn_binary: {
    params: [
      ["a", "pointer"],
      ["b", "pointer"],
      ["y", "pointer"],
      ["dtype", "i32"],
      ["count", "i64"],
      ["op", "i32"],
      ["stream", "pointer"],
    ],
    result: "i32",
  },
} as const satisfies Record<string, Signature>;

/** The FFI types of a parameter list, in order. */
export type ParamTypes<P extends readonly Param[]> = {
  -readonly [I in keyof P]: P[I] extends readonly [string, infer T] ? T : never;
};

/** The `Deno.dlopen` entries of a table of signatures. */
export type Foreign<T extends Record<string, Signature>> = {
  [K in keyof T]: {
    parameters: ParamTypes<T[K]["params"]>;
    result: T[K]["result"];
    nonblocking: T[K] extends { nonblocking: true } ? true : false;
  };
};

function foreign<T extends Record<string, Signature>>(table: T): Foreign<T> {
  const out: Record<string, Deno.ForeignFunction> = {};
  for (const [name, s] of Object.entries(table)) {
    out[name] = {
      parameters: s.params.map(([, type]) => type),
      result: s.result,
      nonblocking: s.nonblocking === true,
    };
  }
  return out as Foreign<T>;
}

/** The dlopen symbol table of a pinstream backend library. */
export const symbols: Foreign<typeof signatures> = foreign(signatures);

/** A loaded pinstream backend library. */
export type Library = Deno.DynamicLibrary<typeof symbols>;
