/**
 * `Device`: one compute device of a backend (a CUDA GPU, or the CPU running the reference
 * backend), the parent of every stream, event and buffer made on it.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { checkCount, describe } from "./_checks.ts";
import { Resource } from "./resource.ts";
import { memoryCounter } from "./_memory_stats.ts";
import { lastError, PinstreamError, Status, unwrap } from "./errors.ts";
import {
  type Backend,
  cudaArchProblem,
  cudaDriverProblem,
  cudaEmulated,
  envSetting,
  type Library,
  LibraryError,
  loadLibrary,
} from "./library.ts";
import { createDefaultStream, type Stream } from "./stream.ts";

/** Which backend `Device.open` should use; "auto" prefers CUDA and falls back to the CPU. */
export type DeviceKind = "auto" | Backend;

/** Options of {@linkcode Device.open}. */
export interface DeviceOpenOptions {
  /** The device ordinal within the backend (default 0). */
  index?: number;
}

/** What a device is, from `ps_device_props_get`. */
export interface DeviceProps {
  /** "NVIDIA H100 80GB HBM3", or the CPU model. */
  name: string;
  /** Device memory in bytes (system memory on the CPU backend). */
  totalMemory: number;
  /** Compute capability major version (0 on cpu). */
  major: number;
  /** Compute capability minor version (0 on cpu). */
  minor: number;
  /** Streaming multiprocessors (logical CPUs on cpu). */
  multiprocessors: number;
  /** Copy engines (0 on cpu). */
  asyncEngines: number;
  /** Whether host and device share one address space. */
  unifiedAddressing: boolean;
  /**
   * Whether this is the CUDA emulator (`PINSTREAM_CUDA_EMULATOR=1`): the CUDA backend's code,
   * run on CPU cores by kernels/emu. Correct, slow, and never a measure of GPU speed.
   */
  emulated: boolean;
}

/** Free and total device memory in bytes. */
export interface MemInfo {
  /** Bytes free. */
  free: number;
  /** Bytes in total. */
  total: number;
}

/** Live native objects of a backend library (process-wide): what the leak tests watch. */
export interface LiveObjects {
  /** Pinned, registered and device allocations. */
  allocations: number;
  /** Streams. */
  streams: number;
  /** Events. */
  events: number;
}

/** Bytes of `ps_device_props` in kernels/pinstream.h: name[256], u64, 8 x i32, reserved[8]. */
const PROPS_BYTES = 256 + 8 + 4 * 16;

/** The device current on the JS thread, per library, to skip redundant `ps_device_set`. */
const current = new Map<Library, number>();

let fallbackReported = false;
let emulatorReported = false;

/**
 * One device of a backend. Open it with {@linkcode Device.open}; dispose it (or `using`) to
 * free everything still allocated on it.
 *
 * @example Opening the CPU backend
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * assert.strictEqual(dev.kind, "cpu");
 * assert.ok(dev.props.multiprocessors >= 1);
 * await dev.synchronize();
 * ```
 */
export class Device extends Resource {
  /** The backend. */
  readonly kind: Backend;
  /** The device ordinal within the backend. */
  readonly index: number;
  /**
   * The backend library, for ffi/'s memory, stream and event calls and for tests of the C ABI.
   * Kernels are not called through it: ops/ calls the device's backend (ops/backend.ts).
   */
  readonly lib: Library;
  /** What the device is. */
  readonly props: DeviceProps;
  /** The backend's default stream (NULL); disposing it does nothing. */
  readonly defaultStream: Stream;
  #current: Stream | null = null;

  private constructor(kind: Backend, index: number, lib: Library) {
    super("Device");
    this.kind = kind;
    this.index = index;
    this.lib = lib;
    const buf = new Uint8Array(PROPS_BYTES);
    this.check(lib.symbols.ps_device_props_get(index, buf), `read the properties of ${this}`);
    const view = new DataView(buf.buffer);
    const nul = buf.indexOf(0);
    this.props = Object.freeze({
      name: new TextDecoder().decode(buf.subarray(0, nul < 0 ? 256 : Math.min(nul, 256))),
      totalMemory: Number(view.getBigUint64(256, true)),
      major: view.getInt32(264, true),
      minor: view.getInt32(268, true),
      multiprocessors: view.getInt32(272, true),
      asyncEngines: view.getInt32(276, true),
      unifiedAddressing: view.getInt32(280, true) !== 0,
      emulated: view.getInt32(284, true) !== 0,
    });
    this.defaultStream = createDefaultStream(this);
  }

  /**
   * The stream that work given no `{ stream }` is queued on: the default stream, or the one
   * made current by {@linkcode Device.useStream} (PyTorch's `torch.cuda.current_stream()`).
   *
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * assert.strictEqual(dev.currentStream, dev.defaultStream);
   * ```
   */
  get currentStream(): Stream {
    return this.#current ?? this.defaultStream;
  }

  /**
   * Makes `stream` the current stream until the returned object is disposed (PyTorch's
   * `with torch.cuda.stream(s)`): kernels, copies and fills given no `{ stream }` queue on it.
   * Nested uses restore the previous stream in turn.
   *
   * @param stream A stream of this device.
   * @returns Disposing it makes the previous stream current again.
   * @throws {TypeError} When the stream belongs to another device.
   * @example
   * ```ts
   * import { Device, Stream } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using s = new Stream(dev);
   * {
   *   using _ = dev.useStream(s);
   *   assert.strictEqual(dev.currentStream, s);
   * }
   * assert.strictEqual(dev.currentStream, dev.defaultStream);
   * ```
   */
  useStream(stream: Stream): Disposable {
    if (stream?.device !== this) {
      throw new TypeError(`Cannot use the stream on ${this}: it belongs to ${stream?.device}`);
    }
    const previous = this.#current;
    this.#current = stream;
    return { [Symbol.dispose]: () => void (this.#current = previous) };
  }

  /**
   * Opens a device. "auto" opens CUDA device `index` when the driver, nvcc (or a prebuilt
   * library) and a device are all there, else the CPU backend, printing one line on stderr
   * (once per process) saying why. With `PINSTREAM_CUDA_EMULATOR=1`, "cuda" (and so "auto")
   * is the CUDA emulator, which needs only a C++ compiler (`props.emulated` is true).
   *
   * @param kind "auto" (default), "cuda" or "cpu".
   * @param options `index`: the device ordinal (default 0).
   * @returns The open device.
   * @throws {TypeError} When `kind` is not one of the three.
   * @throws {RangeError} When `index` is not a non-negative integer.
   * @throws {PinstreamError} When the backend cannot be used (code `NO_DRIVER`, `NO_DEVICE`,
   * `INVALID_DEVICE`; a {@linkcode LibraryError} when no library could be found or built).
   *
   * @example Asking for CUDA explicitly
   * ```ts
   * import { Device, PinstreamError } from "@pinstream/pinstream";
   * try {
   *   using dev = Device.open("cuda");
   *   console.log(dev.props.name);
   * } catch (err) {
   *   if (!(err instanceof PinstreamError)) throw err;
   *   console.log(err.code, err.message); // e.g. NO_DRIVER on a machine without a GPU
   * }
   * ```
   */
  static open(kind: DeviceKind = "auto", options: DeviceOpenOptions = {}): Device {
    refuseUnknownKeys(options ?? {}, ["index"], "open a device");
    if (kind !== "auto" && kind !== "cuda" && kind !== "cpu") {
      throw new TypeError(
        `Cannot open a device: kind must be "auto", "cuda" or "cpu", got ${describe(kind)}`,
      );
    }
    const index = checkCount(options.index ?? 0, "index", "open a device");
    if (kind === "cpu") return Device.#openBackend("cpu", index);
    if (kind === "cuda") return Device.#openBackend("cuda", index);
    try {
      return Device.#openBackend("cuda", index);
    } catch (err) {
      if (!(err instanceof PinstreamError)) throw err;
      if (!fallbackReported) {
        fallbackReported = true;
        console.error(`pinstream: using the CPU backend: ${fallbackReason(err)}`);
      }
      return Device.#openBackend("cpu", index);
    }
  }

  /**
   * The number of devices of a backend (1 for cpu); 0 when the backend cannot be used.
   *
   * @param kind "cuda" or "cpu".
   * @returns How many devices `Device.open(kind, {index})` accepts.
   *
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * assert.strictEqual(Device.count("cpu"), 1);
   * ```
   */
  static count(kind: Backend): number {
    try {
      if (
        kind === "cuda" && !hasOverride("cuda") && !cudaEmulated() &&
        cudaDriverProblem() !== undefined
      ) {
        return 0;
      }
      const lib = loadLibrary(kind);
      const out = new Int32Array(1);
      return lib.symbols.ps_device_count(out) === 0 ? out[0] : 0;
    } catch (err) {
      if (err instanceof PinstreamError) return 0;
      throw err;
    }
  }

  static #openBackend(kind: Backend, index: number): Device {
    const action = `open ${kind} device ${index}`;
    if (kind === "cuda" && !hasOverride("cuda") && !cudaEmulated()) {
      const why = cudaDriverProblem();
      if (why !== undefined) throw new PinstreamError("NO_DRIVER", action, why);
    }
    const lib = loadLibrary(kind);
    const count = new Int32Array(1);
    const status = lib.symbols.ps_device_count(count);
    if (status === Status.NO_DRIVER && kind === "cuda") {
      // cudart says "driver version is insufficient" also when there is no driver at all.
      const why = cudaDriverProblem();
      const detail = lastError(lib);
      throw new PinstreamError(
        "NO_DRIVER",
        action,
        why !== undefined
          ? `${why}; ${detail}`
          : /insufficient/i.test(detail)
          ? `the NVIDIA driver is too old for the CUDA runtime this library was built with ` +
            `(update the driver, or build with an older CUDA toolkit); ${detail}`
          : detail,
      );
    }
    unwrap(lib, status, action);
    if (count[0] === 0) throw new PinstreamError("NO_DEVICE", action, `no ${kind} device`);
    if (index >= count[0]) {
      throw new PinstreamError(
        "INVALID_DEVICE",
        action,
        `there ${count[0] === 1 ? "is 1 device" : `are ${count[0]} devices`}`,
      );
    }
    unwrap(lib, lib.symbols.ps_device_set(index), action);
    current.set(lib, index);
    const device = new Device(kind, index, lib);
    if (device.props.emulated && !emulatorReported) {
      emulatorReported = true;
      console.error(
        `pinstream: cuda is the CUDA emulator (${device.props.name}): correct, not fast`,
      );
    }
    if (kind === "cuda" && !hasOverride("cuda") && !device.props.emulated) {
      // Copies would work on a GPU the kernels were not built for; every launch would not.
      const why = cudaArchProblem(device.props.major, device.props.minor);
      if (why !== undefined) {
        device.dispose();
        throw new PinstreamError("UNSUPPORTED", action, `${device.props.name}: ${why}`);
      }
    }
    return device;
  }

  /**
   * Throws a {@linkcode PinstreamError} when `status` (returned by one of `this.lib`'s
   * functions, on this thread) is not 0.
   *
   * @param status The status returned by a `ps_*` call.
   * @param action What was being done, completing "Cannot ...".
   * @throws {PinstreamError} When `status` is not 0.
   *
   * @example Wrapping a kernel call
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * using dev = Device.open("cpu");
   * dev.check(dev.lib.symbols.ps_device_set(0), "select the device");
   * ```
   */
  check(status: number, action: string): void {
    unwrap(this.lib, status, action);
  }

  /**
   * Makes this device current on the calling thread (no-op when it already is). Allocations,
   * streams and events belong to the current device; the wrappers call this for you.
   *
   * @throws {Error} When the device is disposed.
   */
  makeCurrent(): void {
    this.assertLive("use a device");
    if (current.get(this.lib) === this.index) return;
    this.check(this.lib.symbols.ps_device_set(this.index), `select ${this}`);
    current.set(this.lib, this.index);
  }

  /**
   * Free and total memory of this device.
   *
   * @returns Bytes free and in total.
   * @throws {Error} When the device is disposed.
   *
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const { free, total } = dev.memInfo();
   * assert.ok(free <= total);
   * ```
   */
  memInfo(): MemInfo {
    this.makeCurrent();
    const free = new BigUint64Array(1), total = new BigUint64Array(1);
    this.check(this.lib.symbols.ps_mem_info(free, total), `read the memory of ${this}`);
    return { free: Number(free[0]), total: Number(total[0]) };
  }

  /**
   * Bytes of device memory held by live {@linkcode DeviceBuffer}s (and so tensors) on this
   * device, as PyTorch's `torch.cuda.memory_allocated()`. Counts pinstream's allocations
   * only: not the kernels' short-lived scratch (split-K partials, CPU workspaces), the
   * CUDA context, or memory of other libraries.
   *
   * @returns Bytes allocated now.
   * @example
   * ```ts
   * import { Device, DeviceBuffer } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const before = dev.memoryAllocated();
   * const buf = DeviceBuffer.alloc(dev, 4096);
   * assert.strictEqual(dev.memoryAllocated(), before + 4096);
   * buf.dispose();
   * assert.strictEqual(dev.memoryAllocated(), before);
   * ```
   */
  memoryAllocated(): number {
    return memoryCounter(String(this)).allocated;
  }

  /**
   * The most bytes {@linkcode Device.memoryAllocated} reached since the process started or
   * the last {@linkcode Device.resetPeakMemoryStats} (PyTorch's
   * `torch.cuda.max_memory_allocated()`): the memory a training step needs at its peak.
   *
   * @returns Peak bytes allocated.
   * @example
   * ```ts
   * import { Device, DeviceBuffer } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * dev.resetPeakMemoryStats();
   * DeviceBuffer.alloc(dev, 1 << 20).dispose();
   * assert.ok(dev.maxMemoryAllocated() >= 1 << 20);
   * ```
   */
  maxMemoryAllocated(): number {
    return memoryCounter(String(this)).peak;
  }

  /**
   * Starts a new peak for {@linkcode Device.maxMemoryAllocated} at what is allocated now (and
   * for {@linkcode Device.maxPinnedMemoryAllocated} at what is pinned now).
   *
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * dev.resetPeakMemoryStats();
   * assert.strictEqual(dev.maxMemoryAllocated(), dev.memoryAllocated());
   * ```
   */
  resetPeakMemoryStats(): void {
    const c = memoryCounter(String(this));
    c.peak = c.allocated;
    c.pinnedPeak = c.pinned;
  }

  /**
   * Bytes of pinned (page-locked) host memory held now by live HostBuffers of this device,
   * allocated or registered: the loaders' rings and the prefetchers' staging buffers among
   * them. Pinned memory cannot be paged out, so it is taken from everything else on the
   * machine (see docs/memory.md on when not to pin). On the CPU backend the same buffers are
   * counted, though nothing is page-locked there.
   *
   * @returns Bytes pinned now.
   * @example
   * ```ts
   * import { Device, HostBuffer } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const before = dev.pinnedMemoryAllocated();
   * const buf = HostBuffer.alloc(dev, 8192);
   * assert.strictEqual(dev.pinnedMemoryAllocated(), before + 8192);
   * buf.dispose();
   * assert.strictEqual(dev.pinnedMemoryAllocated(), before);
   * ```
   */
  pinnedMemoryAllocated(): number {
    return memoryCounter(String(this)).pinned;
  }

  /**
   * The most bytes {@linkcode Device.pinnedMemoryAllocated} reached since the process started
   * or the last {@linkcode Device.resetPeakMemoryStats}.
   *
   * @returns Peak bytes pinned.
   * @example
   * ```ts
   * import { Device, HostBuffer } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * dev.resetPeakMemoryStats();
   * HostBuffer.alloc(dev, 1 << 16).dispose();
   * assert.ok(dev.maxPinnedMemoryAllocated() >= 1 << 16);
   * ```
   */
  maxPinnedMemoryAllocated(): number {
    return memoryCounter(String(this)).pinnedPeak;
  }

  /**
   * Waits, without blocking the event loop, until all work queued on this device is done.
   *
   * @returns A promise resolved when the device is idle.
   * @throws {PinstreamError} When queued work failed.
   *
   * @example
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * using dev = Device.open("cpu");
   * await dev.synchronize();
   * ```
   */
  async synchronize(): Promise<void> {
    this.assertLive("synchronize a device");
    const msg = new Uint8Array(1024);
    const status = await this.lib.symbols.ps_device_synchronize(
      this.index,
      msg,
      BigInt(msg.length),
    );
    unwrap(this.lib, status, `synchronize ${this}`, msg);
  }

  /**
   * Live native objects of this device's backend library (process-wide counters).
   *
   * @returns Counts of allocations, streams and events alive now.
   *
   * @example
   * ```ts
   * import { Device, DeviceBuffer } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * const before = dev.liveObjects().allocations;
   * const buf = DeviceBuffer.alloc(dev, 64);
   * assert.strictEqual(dev.liveObjects().allocations, before + 1);
   * buf.dispose();
   * assert.strictEqual(dev.liveObjects().allocations, before);
   * ```
   */
  liveObjects(): LiveObjects {
    const a = new BigInt64Array(1), s = new BigInt64Array(1), e = new BigInt64Array(1);
    this.check(this.lib.symbols.ps_live_objects(a, s, e), "count live objects");
    return { allocations: Number(a[0]), streams: Number(s[0]), events: Number(e[0]) };
  }

  /**
   * How many memory allocations this device's backend library has made inside its own calls
   * since it was loaded (a process-wide counter): the scratch a call keeps for the next ones
   * growing, and CUDA's stream-ordered scratch for a single call. A steady training step adds
   * none (docs/training_step.md).
   *
   * @returns The count so far; subtract two readings for an interval.
   *
   * @example
   * ```ts
   * import { Conv2d, Device, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using dev = Device.open("cpu");
   * using conv = new Conv2d(3, 8, { padding: 1 }).to(dev);
   * using x = Tensor.fromHost(dev, new Float16Array(2 * 3 * 8 * 8), [2, 3, 8, 8]);
   * conv.forward(x); // the first call of a size may grow the scratch the library keeps
   * const before = dev.scratchAllocations();
   * conv.forward(x);
   * assert.strictEqual(dev.scratchAllocations(), before);
   * ```
   */
  scratchAllocations(): number {
    const out = new BigInt64Array(1);
    this.check(this.lib.symbols.ps_scratch_allocations(out), "count scratch allocations");
    return Number(out[0]);
  }

  /** "cuda:0", "cpu:0". */
  override toString(): string {
    return `${this.kind}:${this.index}`;
  }

  /** Nothing native: the children (streams, events, buffers) were disposed before this. */
  protected release(): void {
    // Nothing native to free: the device (CUDA context) outlives its wrappers.
  }
}

function hasOverride(kind: Backend): boolean {
  return envSetting(kind === "cpu" ? "PINSTREAM_LIB_CPU" : "PINSTREAM_LIB_CUDA") !== undefined ||
    envSetting("PINSTREAM_LIB") !== undefined;
}

function fallbackReason(err: PinstreamError): string {
  if (err instanceof LibraryError) {
    switch (err.reason) {
      case "no-compiler":
        return cudaEmulated()
          ? "no C++ compiler, so the CUDA emulator cannot be built (install g++ or set CXX)"
          : "nvcc not found, so the CUDA library cannot be built (install the CUDA toolkit, set NVCC or CUDA_HOME, or point PINSTREAM_LIB_CUDA at a prebuilt library)";
      case "build-failed":
        return 'the CUDA library failed to build (run "deno task build --require cuda" to see the compiler\'s output)';
      default:
        return err.detail.split("\n")[0];
    }
  }
  switch (err.code) {
    case "NO_DRIVER":
      return /^(no CUDA driver|the NVIDIA driver is too old|cannot look for the CUDA driver)/
          .test(err.detail)
        ? err.detail
        : `no CUDA driver (${err.detail})`;
    case "NO_DEVICE":
      return `no CUDA device (${err.detail})`;
    default:
      return err.message;
  }
}
