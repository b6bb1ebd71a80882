/**
 * `Resource`: the lifetime rules shared by every native wrapper (Device, Stream, Event,
 * HostBuffer, DeviceBuffer), in one place.
 *
 * - `dispose()` is idempotent and `[Symbol.dispose]` calls it;
 * - a resource used after dispose throws "Cannot <action>: the <Kind> is disposed";
 * - a parent (a Device) disposes the children still alive when it is disposed; it holds them
 *   through WeakRefs, so an abandoned child stays collectable and the FinalizationRegistry
 *   backstop (the only one; see `guard`) can release its native object;
 * - `MemoryResource` adds the checked `pointerAt` of HostBuffer and DeviceBuffer.
 *
 * @module
 */

import { describe, offsetPointer } from "./_checks.ts";
import type { Device } from "./device.ts";
import type { Library } from "./symbols.ts";
import { noteDeviceMemory, notePinnedMemory } from "./_memory_stats.ts";

/** How the backstop frees each kind of native object. */
const FREE = {
  host: (lib: Library, p: Deno.PointerValue) => lib.symbols.ps_host_free(p),
  registered: (lib: Library, p: Deno.PointerValue) => lib.symbols.ps_host_unregister(p),
  device: (lib: Library, p: Deno.PointerValue) => lib.symbols.ps_device_free(p),
  stream: (lib: Library, p: Deno.PointerValue) => lib.symbols.ps_stream_destroy(p),
  event: (lib: Library, p: Deno.PointerValue) => lib.symbols.ps_event_destroy(p),
  graph: (lib: Library, p: Deno.PointerValue) => lib.symbols.ps_graph_destroy(p),
};

interface Held {
  lib: Library;
  // A number, not the pointer object: a held value referencing its target (a DeviceBuffer
  // or Stream registers its pointer object) would keep the target alive forever.
  address: bigint;
  kind: keyof typeof FREE;
  /** Device memory: the device's name and the bytes, for Device.memoryAllocated. */
  counted?: [string, number];
  /** Pinned host memory: the device's name and the bytes, for Device.pinnedMemoryAllocated. */
  pinned?: [string, number];
}

const backstop = new FinalizationRegistry<Held>(({ lib, address, kind, counted, pinned }) => {
  // The native object became unreachable from JS without dispose(): free it so it does not
  // leak. Its status is dropped: there is nobody to report it to.
  if (counted) noteDeviceMemory(counted[0], -counted[1]);
  if (pinned) notePinnedMemory(pinned[0], -pinned[1]);
  FREE[kind](lib, Deno.UnsafePointer.create(address));
});

/**
 * Throws unless `device` is a Device. Checked structurally: importing device.ts here (and
 * in memory.ts and stream.ts, which device.ts imports) would be an import cycle.
 *
 * @param device The value passed as a device.
 * @param action What was being done, completing "Cannot ..." in the message.
 * @throws {TypeError} When `device` is not a Device.
 */
export function assertDevice(device: unknown, action: string): asserts device is Device {
  if (
    typeof device !== "object" || device === null || !("lib" in device) ||
    !("makeCurrent" in device)
  ) {
    throw new TypeError(`Cannot ${action}: expected a Device, got ${describe(device)}`);
  }
}

/**
 * A native object with an explicit, idempotent `dispose()`. Subclasses implement `release()`
 * (free the native object) and may run [wait] calls through `whileInFlight`, which defers
 * the release until the call returns.
 *
 * @example A resource is disposed once, however often dispose() is called
 * ```ts
 * import { Resource } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * class Counter extends Resource {
 *   released = 0;
 *   constructor() { super("Counter"); }
 *   protected release() { this.released++; }
 * }
 * const c = new Counter();
 * c.dispose();
 * c.dispose();
 * assert.strictEqual(c.released, 1);
 * assert.strictEqual(c.disposed, true);
 * ```
 */
export abstract class Resource implements Disposable {
  #disposed = false;
  #inflight = 0;
  #releasePending = false;
  #parent: Resource | undefined;
  #children: Set<WeakRef<Resource>> | undefined;
  #selfRef: WeakRef<Resource> | undefined;
  readonly #kind: string;

  /**
   * Registers the resource with its parent, which will dispose it.
   *
   * @param kind The class name used in messages.
   * @param parent The resource that disposes this one when it is disposed itself.
   */
  constructor(kind: string, parent?: Resource) {
    this.#kind = kind;
    if (parent !== undefined) {
      this.#parent = parent;
      this.#selfRef = new WeakRef(this);
      (parent.#children ??= new Set()).add(this.#selfRef);
    }
  }

  /** Whether `dispose()` was called (directly or by the parent). */
  get disposed(): boolean {
    return this.#disposed;
  }

  /** Throws when disposed: `Cannot <action>: the <Kind> is disposed`. */
  protected assertLive(action: string): void {
    if (this.#disposed) throw new Error(`Cannot ${action}: the ${this.#kind} is disposed`);
  }

  /**
   * Has the backstop free the native object if `target` becomes unreachable before
   * `dispose()`, which cancels that before `release()`.
   *
   * @param target What keeps the native object in use while reachable: its pointer object
   *   (a kernel wrapper holding `pointer` keeps it alive) or the ArrayBuffer over its memory
   *   (views keep it alive); never the wrapper alone, which those outlive.
   * @param native The device whose library frees it, its address and its kind.
   */
  protected guard(
    target: object,
    native: {
      device: Device;
      address: bigint;
      kind: "host" | "registered" | "device" | "stream" | "event" | "graph";
      /** Device memory: its size, uncounted from Device.memoryAllocated when collected. */
      bytes?: number;
      /** Pinned host memory: its size, uncounted from Device.pinnedMemoryAllocated. */
      pinnedBytes?: number;
    },
  ): void {
    backstop.register(target, {
      lib: native.device.lib,
      address: native.address,
      kind: native.kind,
      counted: native.bytes === undefined ? undefined : [String(native.device), native.bytes],
      pinned: native.pinnedBytes === undefined
        ? undefined
        : [String(native.device), native.pinnedBytes],
    }, this);
  }

  /** Releases the native object (children first). Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    const errors: unknown[] = [];
    if (this.#children !== undefined) {
      const children = [...this.#children];
      this.#children = undefined;
      for (const ref of children) {
        try {
          ref.deref()?.dispose();
        } catch (err) {
          errors.push(err);
        }
      }
    }
    if (this.#parent !== undefined && this.#selfRef !== undefined) {
      this.#parent.#children?.delete(this.#selfRef);
    }
    try {
      // Releasing a handle that a worker thread is waiting on is undefined behaviour in
      // CUDA: the last in-flight call releases it instead.
      if (this.#inflight > 0) this.#releasePending = true;
      else this.#release();
    } catch (err) {
      errors.push(err);
    }
    if (errors.length === 1) throw errors[0];
    if (errors.length > 1) {
      throw new AggregateError(errors, `Cannot dispose the ${this.#kind}: several releases failed`);
    }
  }

  /** Same as `dispose()`. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /**
   * Runs a call that uses the native object on another thread (a `nonblocking` FFI call),
   * keeping the object alive until it settles even if `dispose()` runs meanwhile.
   *
   * @param action What is being done, for the use-after-dispose message.
   * @param call Starts the call.
   * @returns The call's result.
   * @throws {Error} When already disposed.
   */
  protected async whileInFlight<T>(action: string, call: () => Promise<T>): Promise<T> {
    this.assertLive(action);
    this.#inflight++;
    try {
      return await call();
    } finally {
      if (--this.#inflight === 0 && this.#releasePending) {
        this.#releasePending = false;
        this.#release();
      }
    }
  }

  #release(): void {
    backstop.unregister(this);
    this.release();
  }

  /** Frees the native object. Called once, after the children are disposed. */
  protected abstract release(): void;
}

/**
 * A Resource over `bytes` bytes of native memory starting at `pointer` (HostBuffer,
 * DeviceBuffer), with the one checked way to address into it.
 *
 * @example Addressing into a buffer
 * ```ts
 * import { Device, DeviceBuffer, MemoryResource } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using buf = DeviceBuffer.alloc(dev, 16);
 * assert.ok(buf instanceof MemoryResource);
 * const at = (p: Deno.PointerValue) => BigInt(Deno.UnsafePointer.value(p));
 * assert.strictEqual(at(buf.pointerAt(4)) - at(buf.pointer), 4n);
 * assert.throws(() => buf.pointerAt(17), RangeError);
 * ```
 */
export abstract class MemoryResource extends Resource {
  /** Size in bytes. */
  abstract readonly bytes: number;
  /** The address of the first byte (null for 0 bytes). */
  abstract readonly pointer: Deno.PointerValue;

  /**
   * The address of byte `offset` (0..bytes), for kernels and raw `ps_*` calls.
   *
   * @param offset Byte offset from the start.
   * @param action What the pointer is for, completing "Cannot ..." in errors.
   * @returns The pointer (null for an empty buffer).
   * @throws {Error} When disposed.
   * @throws {RangeError} When `offset` is not an integer in 0..bytes.
   */
  pointerAt(offset: number, action = "take a pointer"): Deno.PointerValue {
    this.assertLive(action);
    if (offset !== 0 && !(Number.isSafeInteger(offset) && offset > 0 && offset <= this.bytes)) {
      throw new RangeError(`Cannot ${action}: offset ${offset} is outside 0..${this.bytes}`);
    }
    return offsetPointer(this.pointer, offset);
  }
}
