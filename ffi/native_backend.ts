/**
 * `NativeBackend`: the kernels of a dlopen'd pinstream library (the CPU backend, CUDA, or the
 * CUDA emulator) as one implementation of the kernel entry points that ops/ calls. Each entry
 * point takes a named argument bag whose keys are the C parameter names of its prototype in
 * kernels/pinstream.h (ffi/symbols.ts holds them, checked against the header by a test), so
 * the contract is written once.
 *
 * Memory operands are objects, not addresses: a {@linkcode Tensor}, a byte offset into a
 * buffer ({@linkcode MemoryAt}), or a pointer the caller has laid out itself. The native
 * backend turns them into addresses; a backend written in TypeScript reads them its own way.
 *
 * @module
 */

import type { Device } from "./device.ts";
import type { DeviceBuffer, HostBuffer } from "./memory.ts";
import type { Stream } from "./stream.ts";
import { type Param, signatures } from "./symbols.ts";
import { Tensor } from "./tensor.ts";

/** The kernel entry points and the ABI function behind each. */
export const KERNELS = {
  matmul: "ps_nn_matmul",
  matmulBiasAct: "ps_nn_matmul_bias_act",
  conv2dForward: "ps_nn_conv2d_forward",
  conv2dBackwardData: "ps_nn_conv2d_backward_data",
  conv2dBackwardWeight: "ps_nn_conv2d_backward_weight",
  maxPool2dForward: "ps_nn_maxpool2d_forward",
  maxPool2dBackward: "ps_nn_maxpool2d_backward",
  batchNormForwardTrain: "ps_nn_batchnorm_act_forward_train",
  batchNormForwardEval: "ps_nn_batchnorm_forward_eval",
  batchNormBackward: "ps_nn_batchnorm_act_backward",
  biasAdd: "ps_nn_bias_add",
  biasGrad: "ps_nn_bias_grad",
  reluForward: "ps_nn_relu_forward",
  reluBackward: "ps_nn_relu_backward",
  crossEntropy: "ps_nn_cross_entropy",
  cast: "ps_nn_cast",
  unscaleCheck: "ps_nn_unscale_check",
  sgdStep: "ps_nn_sgd_step",
  stepCount: "ps_nn_step_count",
  scalerUpdate: "ps_nn_scaler_update",
  copyIf: "ps_nn_copy_if",
  concat: "ps_nn_concat",
  binary: "ps_nn_binary",
  multiUnscaleCheck: "ps_nn_multi_unscale_check",
  multiSgdStep: "ps_nn_multi_sgd_step",
  multiCopyIf: "ps_nn_multi_copy_if",
  imageAugment: "ps_image_augment",
  imageAugmentLabeled: "ps_image_augment_labeled",
  imageLabelsI32: "ps_image_labels_i32",
  imageGeometry: "ps_image_geometry",
  gatherRows: "ps_gather_rows",
  tensorFill: "ps_tensor_fill",
} as const satisfies Record<string, keyof typeof signatures>;

/** The name of a kernel entry point. */
export type KernelName = keyof typeof KERNELS;

/** Bytes at an offset into a buffer, checked by the op against the extent the kernel uses. */
export interface MemoryAt {
  /** The buffer. */
  readonly memory: DeviceBuffer | HostBuffer;
  /** Byte offset of the first byte the kernel uses. */
  readonly offset: number;
}

/**
 * Memory a kernel reads or writes: a tensor, bytes in a buffer, a pointer the caller laid out
 * (a native backend only), or null where the C parameter may be NULL.
 */
export type Operand = Tensor | MemoryAt | Deno.PointerObject | null;

/**
 * The value a C parameter takes in a kernel's argument bag: a {@linkcode Stream} (or null)
 * for `stream`, an {@linkcode Operand} for other pointers, a Float32Array for host arrays, a
 * number (or bigint for 64-bit integers) otherwise.
 */
export type ArgValue<N extends string, T> = N extends "stream" ? Stream | null
  : T extends "pointer" ? Operand
  : T extends "buffer" ? Float32Array
  : T extends "i64" | "u64" ? number | bigint
  : number;

/** The C parameters of a kernel entry point, from ffi/symbols.ts. */
export type ParamsOf<K extends KernelName> = (typeof signatures)[(typeof KERNELS)[K]]["params"];

/**
 * The argument bag of a kernel entry point: one key per C parameter of its prototype in
 * kernels/pinstream.h, under the C name (`stream` is the {@linkcode Stream} to queue on, null
 * for the device's default stream).
 */
export type KernelArgs<K extends KernelName> = {
  readonly [P in ParamsOf<K>[number] as P[0]]: ArgValue<P[0], P[1]>;
};

/**
 * One kernel entry point: queues the kernel on `args.stream`. `action` completes "Cannot ..."
 * in the error thrown when the backend refuses the launch.
 */
export type KernelEntry<K extends KernelName> = (args: KernelArgs<K>, action: string) => void;

/** Every kernel entry point, by name. */
export type KernelEntries = { readonly [K in KernelName]: KernelEntry<K> };

function address(v: unknown, action: string): Deno.PointerValue {
  if (v instanceof Tensor) return v.numel === 0 ? null : v.pointer;
  if (v === null || v === undefined) return null;
  const at = v as Partial<MemoryAt>;
  if (at.memory !== undefined) return at.memory.pointerAt(at.offset ?? 0, action);
  return v as Deno.PointerObject;
}

/** A 64-bit integer as a bigint: given as a number it would take Deno's slow FFI call path. */
function int64(v: unknown): unknown {
  return typeof v === "number" ? BigInt(v) : v;
}

function handle(v: unknown): Deno.PointerValue {
  return (v as Stream | null | undefined)?.handle ?? null;
}

/** An entry point's body: reads the bag, makes the device current, calls, checks. */
type Caller = (args: object, action: string) => void;

/**
 * The caller of ABI function `symbol` on `device`, made once per kernel from its signature.
 * It is generated source (one direct call with the prototype's arity, each bag key read by
 * name) because Deno's fast FFI path needs a call site of fixed arity bound to one symbol: a
 * loop over the parameters and a spread call took three to ten times as long per op.
 */
function callerOf(device: Device, symbol: keyof typeof signatures): Caller {
  const params: readonly Param[] = signatures[symbol].params;
  const values = params.map(([name, type]) => {
    const v = `a[${JSON.stringify(name)}]`;
    if (name === "stream") return `handle(${v})`;
    if (type === "pointer") return `address(${v}, action)`;
    if (type === "i64" || type === "u64") return `int64(${v})`;
    return v;
  });
  const body = "return (a, action) => { device.makeCurrent(); " +
    `device.check(fn(${values.join(", ")}), action); };`;
  const make = new Function("fn", "device", "address", "int64", "handle", body);
  return make(device.lib.symbols[symbol], device, address, int64, handle);
}

const BACKENDS = new WeakMap<Device, NativeBackend>();

/**
 * The kernels of a device's native library: every entry point of {@linkcode KERNELS}, each
 * calling its `ps_*` function with the bag's values in the prototype's order.
 *
 * @example
 * ```ts
 * import { Device, Tensor } from "@pinstream/pinstream";
 * import { NativeBackend } from "./native_backend.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using t = Tensor.empty(dev, [3], "f32");
 * const native = NativeBackend.of(dev);
 * native.tensorFill({
 *   dst: t, dtype: 0, count: 3, mode: 1, a: 1, b: 2, seed: 0n, offset: 0n, stream: null,
 * }, "fill a tensor");
 * assert.deepStrictEqual([...await t.toHost()], [1, 3, 5]);
 * ```
 */
export class NativeBackend {
  /** The backend's name in error messages: the library's backend ("cpu" or "cuda"). */
  readonly name: string;
  /** The device the kernels run on. */
  readonly device: Device;

  private constructor(device: Device) {
    this.device = device;
    this.name = device.kind;
    for (const [name, symbol] of Object.entries(KERNELS)) {
      Object.defineProperty(this, name, { value: callerOf(device, symbol) });
    }
  }

  /**
   * The native backend of a device (one per device).
   *
   * @param device An open device.
   * @returns Its backend.
   */
  static of(device: Device): NativeBackend {
    let b = BACKENDS.get(device);
    if (b === undefined) BACKENDS.set(device, b = new NativeBackend(device));
    return b;
  }
}

/** Every kernel entry point (defined by the constructor from {@linkcode KERNELS}). */
export interface NativeBackend extends KernelEntries {}
