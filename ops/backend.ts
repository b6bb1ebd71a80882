/**
 * The seam between the typed ops and whatever runs them: a {@linkcode KernelBackend} is an
 * object with kernel entry points, each taking a named argument bag whose keys are the C
 * parameter names of kernels/pinstream.h. Every op in ops/ checks its arguments, then asks
 * {@linkcode backendOf} for the device's backend and calls one entry point; nothing above ops/
 * calls a `ps_*` symbol.
 *
 * A device's backend is its {@linkcode NativeBackend} (the dlopen'd CPU or CUDA library)
 * unless {@linkcode useBackend} has put another in its place: a backend written in TypeScript
 * implements the entry points it has, and an op whose entry point is missing throws a
 * {@linkcode PinstreamError} with code `UNSUPPORTED` naming the backend. Memory allocation,
 * copies and streams stay with the device (ffi/).
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import type { DeviceBuffer, HostBuffer } from "../ffi/memory.ts";
import {
  type KernelArgs,
  type KernelEntries,
  type KernelEntry,
  type KernelName,
  NativeBackend,
} from "../ffi/native_backend.ts";
import type { Stream } from "../ffi/stream.ts";

export type { KernelArgs, KernelEntries, KernelEntry, KernelName };
export type { ArgValue, MemoryAt, Operand, ParamsOf } from "../ffi/native_backend.ts";
export { KERNELS } from "../ffi/native_backend.ts";
export { NativeBackend };

/** Raw bytes a kernel reads or writes: a buffer (bounds-checked) or a bare pointer (not). */
export type RawMemory = DeviceBuffer | HostBuffer | Deno.PointerValue;

/** Options shared by every op. */
export interface OpOptions {
  /** The stream to queue the kernel on (default: the device's default stream). */
  stream?: Stream;
}

/**
 * Kernel entry points for a device, by name; a backend may leave some out. Each entry point
 * takes the argument bag of its C prototype ({@linkcode KernelArgs}) and the action that
 * completes "Cannot ..." in its errors.
 */
export interface KernelBackend extends Partial<KernelEntries> {
  /** The backend's name in error messages. */
  readonly name: string;
}

const installed = new WeakMap<Device, KernelBackend>();

/**
 * The backend the ops of `device` run on: the one {@linkcode useBackend} installed, else the
 * device's {@linkcode NativeBackend}.
 *
 * @param device An open device.
 * @returns Its backend.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { backendOf } from "./backend.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * assert.strictEqual(backendOf(dev).name, "cpu");
 * ```
 */
export function backendOf(device: Device): KernelBackend {
  let backend = installed.get(device);
  if (backend === undefined) installed.set(device, backend = NativeBackend.of(device));
  return backend;
}

/**
 * Runs the ops of `device` on `backend` until the returned handle is disposed, which puts the
 * previous backend back.
 *
 * @param device An open device: the memory the backend's kernels read and write is its memory.
 * @param backend The entry points to use.
 * @returns A handle; dispose it (or `using`) to restore the previous backend.
 * @throws {TypeError} When `backend` has no name.
 * @example A backend that refuses everything
 * ```ts
 * import { Device, PinstreamError, Tensor } from "@pinstream/pinstream";
 * import { useBackend } from "./backend.ts";
 * import { reluForward } from "./elementwise.ts";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using x = Tensor.fromHost(dev, new Float32Array([-1, 2]));
 * {
 *   using _ = useBackend(dev, { name: "empty" });
 *   assert.throws(() => reluForward(x, x), PinstreamError);
 * }
 * reluForward(x, x);
 * assert.deepStrictEqual([...await x.toHost()], [0, 2]);
 * ```
 */
export function useBackend(device: Device, backend: KernelBackend): Disposable {
  if (typeof backend?.name !== "string") {
    throw new TypeError(`Cannot use a backend: it must have a name, got ${backend}`);
  }
  const previous = installed.get(device);
  installed.set(device, backend);
  return {
    [Symbol.dispose]() {
      installed.set(device, previous ?? NativeBackend.of(device));
    },
  };
}
