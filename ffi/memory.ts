/**
 * Host and device memory: `HostBuffer` (page-locked host memory, allocated or registered) and
 * `DeviceBuffer` (device memory) with asynchronous copies between them.
 *
 * Lifetime rules:
 * - A copy queued on a stream reads or writes its host memory until the stream reaches it:
 *   keep a HostBuffer (and do not touch its bytes) until the stream or an event after the
 *   copy has been synchronized.
 * - Plain (pageable) JS memory is copied synchronously with respect to the host by CUDA, so
 *   it may be reused as soon as the call returns; on CUDA, a device-to-pageable copy also
 *   waits for the work queued before it on the stream, blocking the JS thread meanwhile.
 * - A view of pinned memory (a HostBuffer's `u8` or `arrayBuffer`, or a buffer registered
 *   with `HostBuffer.register`) is pinned memory to CUDA: copies to and from it are
 *   asynchronous, exactly as with the HostBuffer itself ({@linkcode isPinnedMemory} tells).
 * - Disposing a HostBuffer made by `alloc` detaches its ArrayBuffer: freed memory is never
 *   reachable from JS.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { checkCount, describe, offsetPointer } from "./_checks.ts";
import { assertDevice, MemoryResource } from "./resource.ts";
import type { Device } from "./device.ts";
import { noteDeviceMemory, notePinnedMemory } from "./_memory_stats.ts";
import { assertStream, type Stream } from "./stream.ts";

/** Host memory a copy can read or write: pinned, or plain JS memory. */
export type HostMemory = HostBuffer | ArrayBufferView | ArrayBuffer | SharedArrayBuffer;

/** Options of {@linkcode DeviceBuffer.copyFrom} and {@linkcode DeviceBuffer.copyTo}. */
export interface CopyOptions {
  /** The stream to queue the copy on (default: the device's current stream). */
  stream?: Stream;
  /** Byte offset into the source (default 0). */
  srcOffset?: number;
  /** Byte offset into the destination (default 0). */
  dstOffset?: number;
  /** Bytes to copy (default: the rest of the source after `srcOffset`). */
  bytes?: number;
}

/** Options of {@linkcode DeviceBuffer.fill}. */
export interface FillOptions {
  /** The stream to queue the fill on (default: the device's current stream). */
  stream?: Stream;
  /** Byte offset of the first byte to set (default 0). */
  offset?: number;
  /** Bytes to set (default: the rest of the buffer after `offset`). */
  bytes?: number;
}

/**
 * Page-locked host memory, the fast path for copies to and from a GPU (DMA without staging,
 * truly asynchronous). `alloc` makes new memory; `register` pins memory JS already owns (a
 * SharedArrayBuffer that workers fill, for instance).
 *
 * @example Allocating pinned memory and writing it from JS
 * ```ts
 * import { Device, HostBuffer } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * const host = HostBuffer.alloc(dev, 16);
 * host.u8.fill(7);
 * const view = host.u8;
 * host.dispose();
 * assert.strictEqual(view.length, 0); // detached: the freed memory is out of reach
 * ```
 */
export class HostBuffer extends MemoryResource {
  /** The device whose backend pinned the memory. */
  readonly device: Device;
  /** Size in bytes. */
  readonly bytes: number;
  /** The address of the first byte (null for 0 bytes). */
  readonly pointer: Deno.PointerValue;
  /** "alloc": memory owned by this buffer; "register": JS memory pinned in place. */
  readonly origin: "alloc" | "register";
  #arrayBuffer: ArrayBuffer | SharedArrayBuffer;
  #u8: Uint8Array;

  private constructor(
    device: Device,
    bytes: number,
    pointer: Deno.PointerValue,
    origin: "alloc" | "register",
    arrayBuffer: ArrayBuffer | SharedArrayBuffer,
    u8: Uint8Array,
  ) {
    super("HostBuffer", device);
    this.device = device;
    this.bytes = bytes;
    this.pointer = pointer;
    this.origin = origin;
    this.#arrayBuffer = arrayBuffer;
    this.#u8 = u8;
    // Counted while pinned: from here to release(), which Resource runs once.
    if (pointer !== null) {
      PINNED.set(arrayBuffer, (PINNED.get(arrayBuffer) ?? 0) + 1);
      notePinnedMemory(String(device), bytes);
    }
  }

  /**
   * Allocates `bytes` of page-locked host memory (contents unspecified).
   *
   * @param device The device whose backend pins the memory.
   * @param bytes Size in bytes (0 allowed).
   * @returns The buffer; `u8` views its bytes.
   * @throws {TypeError} When `device` is not a Device or `bytes` not a number.
   * @throws {RangeError} When `bytes` is not a non-negative safe integer.
   * @throws {PinstreamError} When the memory cannot be allocated (`OUT_OF_MEMORY`).
   */
  static alloc(device: Device, bytes: number): HostBuffer {
    const action = "allocate pinned host memory";
    assertDevice(device, action);
    checkCount(bytes, "bytes", action);
    device.makeCurrent();
    if (bytes === 0) {
      const ab = new ArrayBuffer(0);
      return new HostBuffer(device, 0, null, "alloc", ab, new Uint8Array(ab));
    }
    const out = new BigUint64Array(1);
    device.check(
      device.lib.symbols.ps_host_alloc(BigInt(bytes), out),
      `${action} (${bytes} bytes)`,
    );
    const ptr = Deno.UnsafePointer.create(out[0])!;
    const ab = Deno.UnsafePointerView.getArrayBuffer(ptr, bytes);
    const buf = new HostBuffer(device, bytes, ptr, "alloc", ab, new Uint8Array(ab));
    // Keyed on the ArrayBuffer, not the wrapper: views of it keep the memory alive.
    buf.guard(ab, { device, address: out[0], kind: "host", pinnedBytes: bytes });
    return buf;
  }

  /**
   * Page-locks memory JS already owns, so copies from and to it are asynchronous DMA. The
   * buffer keeps `memory` referenced until disposed; disposing unpins it (JS keeps the bytes).
   * Do not transfer (postMessage with a transfer list, `ArrayBuffer.transfer`) an ArrayBuffer
   * while it is registered: its memory would move out from under the pinning. A
   * SharedArrayBuffer shared with workers is the intended use: sharing never moves it.
   *
   * @param device The device whose backend pins the memory.
   * @param memory An ArrayBuffer, SharedArrayBuffer or a view of one (not resizable).
   * @returns The buffer; `u8` views the registered bytes.
   * @throws {TypeError} When `memory` is not such a buffer, is detached or resizable.
   * @throws {PinstreamError} When the range cannot be pinned (already registered, say).
   *
   * @example Pinning a SharedArrayBuffer that workers fill
   * ```ts
   * import { Device, HostBuffer } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const ring = new SharedArrayBuffer(4096);
   * using pinned = HostBuffer.register(dev, ring);
   * assert.strictEqual(pinned.bytes, 4096);
   * ```
   */
  static register(
    device: Device,
    memory: ArrayBuffer | SharedArrayBuffer | ArrayBufferView,
  ): HostBuffer {
    const action = "register host memory";
    assertDevice(device, action);
    const { buffer, offset, length } = bufferOf(memory, action);
    if ((buffer as ArrayBuffer).resizable || (buffer as SharedArrayBuffer).growable) {
      // A resize could move or shrink the memory under a pinned registration.
      throw new TypeError(`Cannot ${action}: resizable buffers cannot be pinned`);
    }
    const u8 = new Uint8Array(buffer, offset, length);
    device.makeCurrent();
    if (length === 0) return new HostBuffer(device, 0, null, "register", buffer, u8);
    const ptr = Deno.UnsafePointer.of(u8)!;
    device.check(
      device.lib.symbols.ps_host_register(ptr, BigInt(length)),
      `${action} (${length} bytes)`,
    );
    const buf = new HostBuffer(device, length, ptr, "register", buffer, u8);
    buf.guard(buffer, {
      device,
      address: BigInt(Deno.UnsafePointer.value(ptr)),
      kind: "registered",
      pinnedBytes: length,
    });
    return buf;
  }

  /**
   * The bytes as a Uint8Array (the same view each time).
   *
   * @throws {Error} When disposed.
   */
  get u8(): Uint8Array {
    this.assertLive("read a host buffer");
    return this.#u8;
  }

  /** The underlying ArrayBuffer or SharedArrayBuffer. @throws {Error} When disposed. */
  get arrayBuffer(): ArrayBuffer | SharedArrayBuffer {
    this.assertLive("read a host buffer");
    return this.#arrayBuffer;
  }

  /** Frees (alloc) or unpins (register) the memory; an alloc'd buffer's views detach. */
  protected release(): void {
    if (this.pointer === null) return;
    const n = (PINNED.get(this.#arrayBuffer) ?? 1) - 1;
    if (n > 0) PINNED.set(this.#arrayBuffer, n);
    else PINNED.delete(this.#arrayBuffer);
    notePinnedMemory(String(this.device), -this.bytes);
    const { lib } = this.device;
    if (this.origin === "alloc") {
      // Detach before freeing: every view of the memory becomes length 0, so no JS code can
      // read or write the freed pages.
      (this.#arrayBuffer as ArrayBuffer).transfer(0);
      this.device.check(lib.symbols.ps_host_free(this.pointer), "free pinned host memory");
    } else {
      this.device.check(lib.symbols.ps_host_unregister(this.pointer), "unregister host memory");
    }
    this.#u8 = new Uint8Array(0);
  }
}

/**
 * Device memory. Copies and fills are queued on a stream (the default stream unless
 * `{ stream }`); on the CPU backend they run at once.
 *
 * @example A round trip through the device
 * ```ts
 * import { Device, DeviceBuffer } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using buf = DeviceBuffer.alloc(dev, 4);
 * buf.copyFrom(new Uint8Array([1, 2, 3, 4]));
 * const back = new Uint8Array(4);
 * buf.copyTo(back);
 * await dev.defaultStream.synchronize();
 * assert.deepStrictEqual([...back], [1, 2, 3, 4]);
 * ```
 */
export class DeviceBuffer extends MemoryResource {
  /** The device holding the memory. */
  readonly device: Device;
  /** Size in bytes. */
  readonly bytes: number;
  /** The device address of the first byte (null for 0 bytes); for kernels, not for JS. */
  readonly pointer: Deno.PointerValue;

  /** A view's memory belongs to the buffer it views, which frees it. */
  readonly #view: boolean;

  private constructor(
    device: Device,
    bytes: number,
    pointer: Deno.PointerValue,
    viewOf?: DeviceBuffer,
  ) {
    // A view is its buffer's child: disposing the buffer disposes its views.
    super("DeviceBuffer", viewOf ?? device);
    this.device = device;
    this.bytes = bytes;
    this.pointer = pointer;
    this.#view = viewOf !== undefined;
  }

  /**
   * `bytes` bytes of this buffer from byte `offset`, as a buffer of their own: the same memory,
   * nothing copied or allocated. Disposing the view frees nothing; disposing this buffer
   * disposes its views.
   *
   * @param offset The first byte.
   * @param bytes The view's size.
   * @returns The view.
   * @throws {Error} When this buffer is disposed.
   * @throws {RangeError} When the range does not lie inside this buffer.
   *
   * @example
   * ```ts
   * import { Device, DeviceBuffer } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const buf = DeviceBuffer.alloc(dev, 8);
   * buf.fill(0);
   * const tail = buf.view(4, 4);
   * tail.fill(7);
   * const out = new Uint8Array(8);
   * buf.copyTo(out);
   * assert.deepStrictEqual([...out], [0, 0, 0, 0, 7, 7, 7, 7]);
   * buf.dispose();
   * assert.ok(tail.disposed);
   * ```
   */
  view(offset: number, bytes: number): DeviceBuffer {
    const action = "take a view of a DeviceBuffer";
    this.assertLive(action);
    checkCount(offset, "offset", action);
    checkCount(bytes, "bytes", action);
    if (offset + bytes > this.bytes) {
      throw new RangeError(
        `Cannot ${action}: ${bytes} bytes at offset ${offset} overrun ${this.bytes} bytes`,
      );
    }
    const pointer = bytes === 0 ? null : offsetPointer(this.pointer, offset);
    return new DeviceBuffer(this.device, bytes, pointer, this);
  }

  /**
   * Allocates `bytes` of device memory (contents unspecified).
   *
   * @param device The device.
   * @param bytes Size in bytes (0 allowed: a null pointer).
   * @returns The buffer.
   * @throws {TypeError} When `device` is not a Device or `bytes` not a number.
   * @throws {RangeError} When `bytes` is not a non-negative safe integer.
   * @throws {PinstreamError} When the memory cannot be allocated (`OUT_OF_MEMORY`).
   *
   * @example
   * ```ts
   * import { Device, DeviceBuffer } from "@pinstream/pinstream";
   * using dev = Device.open("cpu");
   * using buf = DeviceBuffer.alloc(dev, 1024);
   * buf.fill(0);
   * ```
   */
  static alloc(device: Device, bytes: number): DeviceBuffer {
    const action = "allocate device memory";
    assertDevice(device, action);
    checkCount(bytes, "bytes", action);
    device.makeCurrent();
    if (bytes === 0) return new DeviceBuffer(device, 0, null);
    const out = new BigUint64Array(1);
    device.check(
      device.lib.symbols.ps_device_alloc(BigInt(bytes), out),
      `${action} (${bytes} bytes)`,
    );
    const ptr = Deno.UnsafePointer.create(out[0])!;
    const buf = new DeviceBuffer(device, bytes, ptr);
    // Keyed on the pointer object: a kernel wrapper holding `buf.pointer` keeps it alive.
    buf.guard(ptr, { device, address: out[0], kind: "device", bytes });
    noteDeviceMemory(String(device), bytes);
    return buf;
  }

  /**
   * Queues a copy into this buffer from host memory (host-to-device) or from another
   * DeviceBuffer of the same backend (device-to-device).
   *
   * @param src The source: a HostBuffer (asynchronous), plain JS memory (see the module notes)
   * or a DeviceBuffer.
   * @param options `stream`, `srcOffset`, `dstOffset`, `bytes` (default: the rest of `src`).
   * @throws {TypeError} When `src` or `stream` is of the wrong kind.
   * @throws {RangeError} When offsets or sizes are negative, fractional or out of bounds.
   * @throws {Error} When this buffer, the source or the stream is disposed.
   * @throws {PinstreamError} On a backend failure.
   */
  copyFrom(src: HostMemory | DeviceBuffer, options: CopyOptions = {}): void {
    refuseUnknownKeys(
      options ?? {},
      ["stream", "srcOffset", "dstOffset", "bytes"],
      "copy into a device buffer",
    );
    const action = "copy into a device buffer";
    this.assertLive(action);
    const stream = options.stream ?? this.device.currentStream;
    assertStream(stream, this.device, action);
    const s = operand(src, this.device, action);
    const { srcOffset, dstOffset, bytes } = span(options, s.length, this.bytes, action);
    const lib = this.device.lib;
    if (bytes === 0) return;
    if (src === this && srcOffset < dstOffset + bytes && dstOffset < srcOffset + bytes) {
      // cudaMemcpyAsync does not define overlapping copies (the cpu backend's memmove would).
      throw new RangeError(
        `Cannot ${action}: source ${srcOffset}+${bytes} and destination ${dstOffset}+${bytes} overlap`,
      );
    }
    this.device.makeCurrent(); // a stream must be used with its device current
    const dst = offsetPointer(this.pointer, dstOffset);
    const from = offsetPointer(s.base, srcOffset);
    const status = s.device
      ? lib.symbols.ps_memcpy_d2d_async(dst, from, BigInt(bytes), stream.handle)
      : lib.symbols.ps_memcpy_h2d_async(dst, from, BigInt(bytes), stream.handle);
    this.device.check(status, `${action} (${bytes} bytes)`);
  }

  /**
   * Queues a copy from this buffer into host memory (device-to-host) or into another
   * DeviceBuffer (device-to-device).
   *
   * @param dst The destination: a HostBuffer (asynchronous: read it after synchronizing),
   * plain JS memory (see the module notes) or a DeviceBuffer.
   * @param options `stream`, `srcOffset`, `dstOffset`, `bytes` (default: the rest of this
   * buffer after `srcOffset`).
   * @throws {TypeError} When `dst` or `stream` is of the wrong kind.
   * @throws {RangeError} When offsets or sizes are negative, fractional or out of bounds.
   * @throws {Error} When this buffer, the destination or the stream is disposed.
   * @throws {PinstreamError} On a backend failure.
   */
  copyTo(dst: HostMemory | DeviceBuffer, options: CopyOptions = {}): void {
    refuseUnknownKeys(
      options ?? {},
      ["stream", "srcOffset", "dstOffset", "bytes"],
      "copy out of a device buffer",
    );
    const action = "copy from a device buffer";
    this.assertLive(action);
    const stream = options.stream ?? this.device.currentStream;
    assertStream(stream, this.device, action);
    const d = operand(dst, this.device, action);
    const { srcOffset, dstOffset, bytes } = span(options, this.bytes, d.length, action, true);
    const lib = this.device.lib;
    if (bytes === 0) return;
    this.device.makeCurrent(); // a stream must be used with its device current
    const src = offsetPointer(this.pointer, srcOffset);
    const to = offsetPointer(d.base, dstOffset);
    const status = d.device
      ? lib.symbols.ps_memcpy_d2d_async(to, src, BigInt(bytes), stream.handle)
      : lib.symbols.ps_memcpy_d2h_async(to, src, BigInt(bytes), stream.handle);
    this.device.check(status, `${action} (${bytes} bytes)`);
  }

  /**
   * Queues setting bytes of this buffer to `byte` (cudaMemsetAsync).
   *
   * @param byte The value, 0..255.
   * @param options `stream`, `offset`, `bytes` (default: the rest of the buffer).
   * @throws {TypeError} When `byte` is not a number or `stream` not a Stream of this device.
   * @throws {RangeError} When `byte` is not an integer in 0..255, or the range is out of bounds.
   * @throws {Error} When this buffer or the stream is disposed.
   * @throws {PinstreamError} On a backend failure.
   */
  fill(byte: number, options: FillOptions = {}): void {
    refuseUnknownKeys(options ?? {}, ["stream", "offset", "bytes"], "fill a device buffer");
    const action = "fill a device buffer";
    this.assertLive(action);
    checkCount(byte, "byte", action);
    if (byte > 255) throw new RangeError(`Cannot ${action}: byte must be 0..255, got ${byte}`);
    const stream = options.stream ?? this.device.currentStream;
    assertStream(stream, this.device, action);
    const offset = checkCount(options.offset ?? 0, "offset", action);
    if (offset > this.bytes) {
      throw new RangeError(
        `Cannot ${action}: offset ${offset} is past the end (${this.bytes} bytes)`,
      );
    }
    const bytes = checkCount(options.bytes ?? this.bytes - offset, "bytes", action);
    if (offset + bytes > this.bytes) {
      throw new RangeError(
        `Cannot ${action}: ${bytes} bytes at offset ${offset} overrun ${this.bytes} bytes`,
      );
    }
    if (bytes === 0) return;
    this.device.makeCurrent(); // a stream must be used with its device current
    this.device.check(
      this.device.lib.symbols.ps_memset_async(
        offsetPointer(this.pointer, offset),
        byte,
        BigInt(bytes),
        stream.handle,
      ),
      `${action} (${bytes} bytes)`,
    );
  }

  /** Frees the device memory (a view's belongs to its buffer). */
  protected release(): void {
    if (this.pointer === null || this.#view) return;
    noteDeviceMemory(String(this.device), -this.bytes);
    this.device.check(this.device.lib.symbols.ps_device_free(this.pointer), "free device memory");
  }
}

/** JS buffers holding pinned memory -> live HostBuffers over them. */
const PINNED = new WeakMap<ArrayBuffer | SharedArrayBuffer, number>();

/**
 * Whether `buffer` holds pinned memory: it backs a live HostBuffer (allocated, or registered
 * over it). Copies to and from views of such memory are asynchronous on CUDA, like the
 * HostBuffer's own: the bytes may be read or written until the stream reaches the copy.
 *
 * @param buffer A JS buffer.
 * @returns true while a HostBuffer pins (some of) it.
 * @example
 * ```ts
 * import { Device, HostBuffer, isPinnedMemory } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * const host = HostBuffer.alloc(dev, 64);
 * assert.ok(isPinnedMemory(host.arrayBuffer));
 * assert.ok(!isPinnedMemory(new ArrayBuffer(64)));
 * host.dispose();
 * ```
 */
export function isPinnedMemory(buffer: ArrayBuffer | SharedArrayBuffer): boolean {
  return PINNED.has(buffer);
}

/** A resolved copy operand: its size, whether it is device memory, its first byte. */
interface Operand {
  length: number;
  device: boolean;
  base: Deno.PointerValue;
}

function operand(value: unknown, device: Device, action: string): Operand {
  if (value instanceof HostBuffer) {
    return { length: value.bytes, device: false, base: value.pointerAt(0, action) };
  }
  if (value instanceof DeviceBuffer) {
    if (value.device.lib !== device.lib) {
      throw new TypeError(
        `Cannot ${action}: the other buffer is on ${value.device}, not ${device.kind}`,
      );
    }
    return { length: value.bytes, device: true, base: value.pointerAt(0, action) };
  }
  const { buffer, offset, length } = bufferOf(value, action);
  // The view's first byte; JS keeps `value` alive through the synchronous copy call.
  const base = length === 0 ? null : Deno.UnsafePointer.of(buffer as ArrayBuffer);
  return { length, device: false, base: offsetPointer(base, offset) };
}

function bufferOf(
  value: unknown,
  action: string,
): { buffer: ArrayBuffer | SharedArrayBuffer; offset: number; length: number } {
  let buffer: ArrayBuffer | SharedArrayBuffer, offset = 0, length: number;
  if (value instanceof ArrayBuffer || value instanceof SharedArrayBuffer) {
    buffer = value;
    length = value.byteLength;
  } else if (ArrayBuffer.isView(value)) {
    buffer = value.buffer;
    offset = value.byteOffset;
    length = value.byteLength;
  } else {
    throw new TypeError(
      `Cannot ${action}: expected a HostBuffer, DeviceBuffer, ArrayBuffer, SharedArrayBuffer or typed array, got ${
        describe(value)
      }`,
    );
  }
  if (buffer instanceof ArrayBuffer && buffer.detached) {
    throw new TypeError(`Cannot ${action}: the ArrayBuffer is detached`);
  }
  return { buffer, offset, length };
}

function span(
  options: CopyOptions,
  srcLength: number,
  dstLength: number,
  action: string,
  defaultFromSrc = true,
): { srcOffset: number; dstOffset: number; bytes: number } {
  const srcOffset = checkCount(options.srcOffset ?? 0, "srcOffset", action);
  const dstOffset = checkCount(options.dstOffset ?? 0, "dstOffset", action);
  if (srcOffset > srcLength) {
    throw new RangeError(
      `Cannot ${action}: srcOffset ${srcOffset} is past the source's ${srcLength} bytes`,
    );
  }
  if (dstOffset > dstLength) {
    throw new RangeError(
      `Cannot ${action}: dstOffset ${dstOffset} is past the destination's ${dstLength} bytes`,
    );
  }
  const bytes = checkCount(
    options.bytes ?? (defaultFromSrc ? srcLength - srcOffset : dstLength - dstOffset),
    "bytes",
    action,
  );
  if (srcOffset + bytes > srcLength) {
    throw new RangeError(
      `Cannot ${action}: ${bytes} bytes from srcOffset ${srcOffset} overrun the source's ${srcLength} bytes`,
    );
  }
  if (dstOffset + bytes > dstLength) {
    throw new RangeError(
      `Cannot ${action}: ${bytes} bytes at dstOffset ${dstOffset} overrun the destination's ${dstLength} bytes`,
    );
  }
  return { srcOffset, dstOffset, bytes };
}
