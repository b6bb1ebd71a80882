// The checks every op shares (each error names the offending argument and what was
// expected), the launch of an op on its device and stream, and the call into the backend.

import type { Device } from "../ffi/device.ts";
import { PinstreamError } from "../internal/errors.ts";
import { activeRecorder, range } from "../internal/trace.ts";
import type { Stream } from "../ffi/stream.ts";
import type { DType, Tensor } from "../ffi/tensor.ts";
import {
  backendOf,
  type KernelArgs,
  type KernelEntry,
  type KernelName,
  type OpOptions,
} from "./backend.ts";

/** The kernels' dtype codes (PS_NN_F32, PS_NN_F16, PS_NN_BF16 in kernels/pinstream.h). */
export const F32 = 0;
/** PS_NN_F16. */
export const F16 = 1;
/** PS_NN_BF16. */
export const BF16 = 3;

export function code(t: Tensor): number {
  return t.dtype === "f16" ? F16 : t.dtype === "bf16" ? BF16 : F32;
}

/** The dtypes an op's activations take: f16 or bf16 (mixed precision) or f32 (the fp32 path). */
export const ACT: readonly DType[] = ["f16", "bf16", "f32"];
/** The half-precision dtypes (a mixed-precision model's compute copies). */
export const HALF: readonly DType[] = ["f16", "bf16"];

/**
 * Checks an op's activation tensors (with the weights of matmul and the convolutions): the
 * first f16 or f32, every other of its dtype, in the order given.
 *
 * @returns The kernels' code of that one dtype.
 */
export function activations(action: string, ...named: [unknown, string][]): number {
  const [first, firstName] = named[0];
  const ref = tensor(first, firstName, ACT, action);
  for (const [t, name] of named.slice(1)) sameDtype(t, name, ref, firstName, action);
  return code(ref);
}

/**
 * Checks that `t` is a Tensor of `ref`'s dtype: an op's activations, their gradients and the
 * weights of matmul and the convolutions share one dtype.
 */
export function sameDtype(
  t: unknown,
  name: string,
  ref: Tensor,
  refName: string,
  action: string,
): void {
  tensor(t, name, ACT, action);
  if ((t as Tensor).dtype !== ref.dtype) {
    throw new TypeError(
      `Cannot ${action}: ${name} is ${(t as Tensor).dtype} but ${refName} is ${ref.dtype} ` +
        `(the op computes in one dtype: give every activation and weight f16, bf16 or f32)`,
    );
  }
}

/** "a", "a or b", "a, b or c". */
function oneOf(names: readonly string[]): string {
  return names.length < 3
    ? names.join(" or ")
    : `${names.slice(0, -1).join(", ")} or ${names[names.length - 1]}`;
}

export function isTensor(t: unknown): t is Tensor {
  return typeof t === "object" && t !== null && "dtype" in t && "shape" in t && "device" in t;
}

export function tensor(
  t: unknown,
  name: string,
  dtypes: readonly DType[],
  action: string,
): Tensor {
  if (!isTensor(t)) throw new TypeError(`Cannot ${action}: ${name} must be a Tensor, got ${t}`);
  if (!dtypes.includes(t.dtype)) {
    throw new TypeError(
      `Cannot ${action}: ${name} must be ${oneOf(dtypes)}, got ${t.dtype}`,
    );
  }
  return t;
}

export function shape(t: Tensor, name: string, expected: readonly number[], action: string): void {
  if (t.shape.length !== expected.length || t.shape.some((d, i) => d !== expected[i])) {
    throw new RangeError(
      `Cannot ${action}: ${name} must have shape [${expected}], got [${t.shape}]`,
    );
  }
}

export function rank(t: Tensor, name: string, ranks: readonly number[], action: string): void {
  if (!ranks.includes(t.shape.length)) {
    throw new RangeError(
      `Cannot ${action}: ${name} must have ${ranks.join(" or ")} dimensions, got [${t.shape}]`,
    );
  }
}

export function scalar(t: Tensor, name: string, action: string): void {
  if (t.numel !== 1) {
    throw new RangeError(`Cannot ${action}: ${name} must hold one element, got [${t.shape}]`);
  }
}

export function int(v: unknown, name: string, min: number, action: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min) {
    throw new RangeError(`Cannot ${action}: ${name} must be an integer >= ${min}, got ${v}`);
  }
  return v;
}

export function num(v: unknown, name: string, action: string): number {
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw new RangeError(`Cannot ${action}: ${name} must be a finite number, got ${v}`);
  }
  return v;
}

/** An op about to run: its device (made current) and stream, and its profiler range. */
export interface Launched extends Disposable {
  /** The tensors' device. */
  device: Device;
  /** The stream to queue on (the device's current stream unless the op was given one). */
  stream: Stream;
}

/**
 * The common device of the tensors (made current) and the stream to queue on; with a
 * profiler active (internal/trace.ts), the op is a range named after it, timed on the host and on
 * its stream until the returned object is disposed (`using`).
 */
export function launch(
  action: string,
  options: OpOptions,
  ...ts: (Tensor | null | undefined)[]
): Launched {
  let device: Device | undefined;
  for (const t of ts) {
    if (!t) continue;
    if (device === undefined) device = t.device;
    else if (t.device !== device) {
      throw new TypeError(
        `Cannot ${action}: tensors on different devices (${device}, ${t.device})`,
      );
    }
  }
  if (device === undefined) throw new TypeError(`Cannot ${action}: no tensors`);
  return launchOn(device, action, options);
}

/**
 * {@linkcode launch} on a known device (a kernel over a list of tensors in device memory),
 * after checking that the tensors named directly are on it.
 */
export function launchOn(
  device: Device,
  action: string,
  options: OpOptions,
  ...ts: (Tensor | null | undefined)[]
): Launched {
  for (const t of ts) {
    if (t && t.device !== device) {
      throw new TypeError(
        `Cannot ${action}: tensors on different devices (${device}, ${t.device})`,
      );
    }
  }
  const stream = streamOn(options, device, action);
  device.makeCurrent();
  const timed = activeRecorder() === undefined ? undefined : range(
    `nn.${action.replace(/^run /, "")}`,
    { stream },
  );
  return { device, stream, [Symbol.dispose]: () => timed?.[Symbol.dispose]() };
}

/**
 * `options.stream` after checking it belongs to `device`; without one, the device's current
 * stream ({@linkcode Device.currentStream}: the default stream unless one was made current).
 */
export function streamOn(options: OpOptions, device: Device, action: string): Stream {
  const stream = options.stream;
  if (stream !== undefined && stream.device !== device) {
    throw new TypeError(`Cannot ${action}: the stream belongs to ${stream.device}, not ${device}`);
  }
  return stream ?? device.currentStream;
}

/**
 * Queues kernel `name` on `device`'s backend ({@linkcode backendOf}).
 *
 * @throws {PinstreamError} `UNSUPPORTED` when the backend does not implement it; any
 *   failure the backend reports, `detail` completing "Cannot ...".
 */
export function queue<K extends KernelName>(
  device: Device,
  name: K,
  args: KernelArgs<K>,
  detail: string,
): void {
  const backend = backendOf(device);
  const fn = backend[name] as KernelEntry<K> | undefined;
  if (typeof fn !== "function") {
    throw new PinstreamError(
      "UNSUPPORTED",
      detail,
      `${name} is not implemented by the ${backend.name} backend`,
    );
  }
  fn.call(backend, args, detail);
}

/** The product of the dimensions from `from` on. */
export function tail(s: readonly number[], from: number): number {
  let n = 1;
  for (let i = from; i < s.length; i++) n *= s[i];
  return n;
}

export function sameNumel(a: Tensor, b: Tensor, names: string, action: string): void {
  if (a.numel !== b.numel) {
    throw new RangeError(
      `Cannot ${action}: ${names} differ in size ([${a.shape}] and [${b.shape}])`,
    );
  }
}
