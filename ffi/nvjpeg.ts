/**
 * JPEG decoding on the GPU with nvJPEG (`libnvjpeg.so`, part of the CUDA toolkit and of
 * PyTorch's CUDA wheels), through `Deno.dlopen`: the workers hand over the files' bytes and the
 * GPU decodes them into a `[n, height, width, 3]` u8 tensor on a stream. nvJPEG's hardware
 * decoder is used where the GPU has one (A100, H100), else its hybrid CPU+GPU path.
 *
 * Where nvJPEG cannot be used (no library, a CPU device, the CUDA emulator without its
 * stand-in), {@linkcode openNvjpeg} answers one line saying why, and decoding stays on the
 * loader's workers. `PINSTREAM_NVJPEG_LIB` names the library to load; by default the CUDA 13 and
 * 12 sonames are tried, then the toolkit's copies (`$CUDA_HOME/lib64`), then those a PyTorch wheel carries under
 * `site-packages/nvidia/<package>/lib`. The CUDA emulator's stand-in
 * (kernels/emu/nvjpeg_stand_in.c) decodes with libjpeg-turbo, the workers' decoder, so on the
 * emulator both paths give the same bytes.
 *
 * @example
 * ```ts
 * import { Device, openNvjpeg } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * const decoder = openNvjpeg(device);
 * assert.strictEqual(typeof decoder, "string"); // a CPU device decodes on the workers
 * assert.match(decoder as string, /stays on the workers/);
 * ```
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { nvidiaWheelLibraries } from "../internal/python_packages.ts";
import type { Device } from "./device.ts";
import { assertStream, type Stream } from "./stream.ts";
import { Tensor } from "./tensor.ts";

/**
 * The environment variable that names the nvJPEG library to open.
 *
 * @example
 * ```ts
 * import { NVJPEG_LIB_ENV } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(NVJPEG_LIB_ENV, "PINSTREAM_NVJPEG_LIB");
 * ```
 */
export const NVJPEG_LIB_ENV = "PINSTREAM_NVJPEG_LIB";

const SYMBOLS = {
  nvjpegGetProperty: { parameters: ["i32", "buffer"], result: "i32" },
  // (backend, devAllocator, pinnedAllocator, flags, nvjpegHandle_t *out)
  nvjpegCreateEx: { parameters: ["i32", "pointer", "pointer", "u32", "buffer"], result: "i32" },
  nvjpegDestroy: { parameters: ["pointer"], result: "i32" },
  nvjpegJpegStateCreate: { parameters: ["pointer", "buffer"], result: "i32" },
  nvjpegJpegStateDestroy: { parameters: ["pointer"], result: "i32" },
  // (handle, data, length, int *nComponents, subsampling *, int widths[4], int heights[4])
  nvjpegGetImageInfo: {
    parameters: ["pointer", "buffer", "usize", "buffer", "buffer", "buffer", "buffer"],
    result: "i32",
  },
  // (handle, state, batchSize, maxCpuThreads, outputFormat)
  nvjpegDecodeBatchedInitialize: {
    parameters: ["pointer", "pointer", "i32", "i32", "i32"],
    result: "i32",
  },
  // (handle, state, const unsigned char *const *data, const size_t *lengths,
  //  nvjpegImage_t *destinations, cudaStream_t)
  nvjpegDecodeBatched: {
    parameters: ["pointer", "pointer", "buffer", "buffer", "buffer", "pointer"],
    result: "i32",
  },
  ps_nvjpeg_stand_in: { parameters: [], result: "i32", optional: true },
} as const;

type Lib = Deno.DynamicLibrary<typeof SYMBOLS>;

const BACKEND_DEFAULT = 0, BACKEND_HARDWARE = 3;
const OUTPUT_RGBI = 5;
/** `nvjpegImage_t`: four channel pointers, then four pitches. */
const IMAGE_BYTES = 64;

const STATUS = [
  "NVJPEG_STATUS_SUCCESS",
  "NVJPEG_STATUS_NOT_INITIALIZED",
  "NVJPEG_STATUS_INVALID_PARAMETER",
  "NVJPEG_STATUS_BAD_JPEG",
  "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
  "NVJPEG_STATUS_ALLOCATOR_FAILURE",
  "NVJPEG_STATUS_EXECUTION_FAILED",
  "NVJPEG_STATUS_ARCH_MISMATCH",
  "NVJPEG_STATUS_INTERNAL_ERROR",
  "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
  "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
];

function statusName(r: number): string {
  return STATUS[r] ?? `nvJPEG status ${r}`;
}

/** One JPEG to decode: a name for messages (its file) and its bytes. */
export interface JpegInput {
  /** The file (or any name) the messages give. */
  name: string;
  /** The file's bytes. */
  bytes: Uint8Array;
}

/** Options of {@linkcode openNvjpeg}. */
export interface NvjpegOptions {
  /** The library to load (default: `PINSTREAM_NVJPEG_LIB`, else the search described above). */
  library?: string;
  /** Use the hardware decoder where the GPU has one (default true). */
  hardware?: boolean;
}

/** Options of {@linkcode NvjpegDecoder.decode}. */
export interface NvjpegDecodeOptions {
  /** The stream the decode runs on (default: the device's current stream). */
  stream?: Stream;
  /** Where the pixels go: a u8 `[n, height, width, 3]` tensor of the device (default: a new one). */
  out?: Tensor;
  /**
   * Bytes between images: files of different sizes, each decoded at its own size with its rows
   * packed (`width * 3` bytes a row) at byte `i * stride` of `out`, a u8 `[n, stride]` tensor.
   * Without it every file must have the first one's size.
   */
  stride?: number;
}

function envLibrary(): string | undefined {
  const q = Deno.permissions.querySync({ name: "env", variable: NVJPEG_LIB_ENV });
  return q.state === "granted" ? Deno.env.get(NVJPEG_LIB_ENV) : undefined;
}

/** The CUDA toolkit's copies, which the loader's path may not include. */
function toolkitLibraries(): string[] {
  const q = Deno.permissions.querySync({ name: "env", variable: "CUDA_HOME" });
  const home = (q.state === "granted" ? Deno.env.get("CUDA_HOME") : undefined) ?? "/usr/local/cuda";
  return [13, 12].map((v) => `${home}/lib64/libnvjpeg.so.${v}`).filter((p) => {
    try {
      return Deno.statSync(p).isFile;
    } catch {
      return false;
    }
  });
}

const STAYS = "JPEG decoding stays on the workers";

/**
 * Opens nvJPEG for `device`, or says in one line why JPEG decoding stays on the workers.
 *
 * @param device The device the pixels go to.
 * @param options `library`, `hardware`.
 * @returns A decoder, or the reason there is none.
 * @throws {TypeError} On an unknown option.
 *
 * @example
 * ```ts
 * import { Device, openNvjpeg } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * const why = openNvjpeg(device, { library: "/nonexistent/libnvjpeg.so" });
 * assert.match(why as string, /^JPEG decoding stays on the workers/);
 * ```
 */
export function openNvjpeg(device: Device, options: NvjpegOptions = {}): NvjpegDecoder | string {
  refuseUnknownKeys(options ?? {}, ["library", "hardware"], "open nvJPEG");
  if (device.kind !== "cuda") return `${STAYS}: nvJPEG needs a CUDA device, not ${device.kind}`;
  const named = options.library ?? envLibrary();
  const candidates = named !== undefined ? [named] : [
    "libnvjpeg.so.13",
    "libnvjpeg.so.12",
    ...toolkitLibraries(),
    ...nvidiaWheelLibraries(/^libnvjpeg\.so\.\d+$/),
  ];
  let lib: Lib | undefined, path = "";
  for (const c of candidates) {
    try {
      lib = Deno.dlopen(c, SYMBOLS);
      path = c;
      break;
    } catch {
      // Not here: the next.
    }
  }
  if (lib === undefined) {
    return `${STAYS}: nvJPEG not found (tried ${
      candidates.join(", ")
    }; name it in ${NVJPEG_LIB_ENV})`;
  }
  const standIn = lib.symbols.ps_nvjpeg_stand_in !== null;
  if (standIn !== device.props.emulated) {
    lib.close();
    return standIn
      ? `${STAYS}: ${path} is the CUDA emulator's stand-in, and device cuda:${device.index} is a GPU`
      : `${STAYS}: ${path} is nvJPEG, and the CUDA emulator needs its stand-in ` +
        `(kernels/emu/nvjpeg_stand_in.c)`;
  }
  const v = new Int32Array(1), version: number[] = [];
  for (let t = 0; t < 3; t++) {
    version.push(lib.symbols.nvjpegGetProperty(t, v) === 0 ? v[0] : 0);
  }
  // nvJPEG allocates on, and its calls run on, the thread's current device.
  device.makeCurrent();
  const out = new BigUint64Array(1);
  let backend: "hardware" | "default" = "default";
  if (
    (options.hardware ?? true) &&
    lib.symbols.nvjpegCreateEx(BACKEND_HARDWARE, null, null, 0, out) === 0
  ) {
    backend = "hardware";
  } else {
    const r = lib.symbols.nvjpegCreateEx(BACKEND_DEFAULT, null, null, 0, out);
    if (r !== 0) {
      lib.close();
      return `${STAYS}: nvjpegCreateEx failed (${statusName(r)}) with ${path}`;
    }
  }
  return new NvjpegDecoder(device, lib, path, version.join("."), backend, standIn, out[0]);
}

/**
 * nvJPEG, opened for one device: decodes batches of JPEGs into device memory on a stream. The
 * decoder holds each batch's bytes until its next decode or its disposal, so the caller may drop
 * them at once. Dispose it (after the streams it decoded on are done) to free nvJPEG's handle.
 *
 * @example
 * ```ts
 * import { Device, NvjpegDecoder, openNvjpeg } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("auto");
 * const decoder = openNvjpeg(device);
 * if (decoder instanceof NvjpegDecoder) {
 *   using _ = decoder;
 *   assert.ok(decoder.backend === "hardware" || decoder.backend === "default");
 * } else {
 *   assert.match(decoder, /^JPEG decoding stays on the workers: /);
 * }
 * ```
 */
export class NvjpegDecoder implements Disposable {
  /** The device the pixels go to. */
  readonly device: Device;
  /** The library file loaded. */
  readonly library: string;
  /** nvJPEG's version, "major.minor.patch". */
  readonly version: string;
  /** "hardware" where the GPU's JPEG decoder is used, else "default" (the hybrid path). */
  readonly backend: "hardware" | "default";
  /** Whether the library is the CUDA emulator's stand-in. */
  readonly standIn: boolean;
  #lib: Lib | undefined;
  #handle: Deno.PointerValue;
  #state: Deno.PointerValue = null;
  #batch = 0;
  /** The hybrid handle and state, for what the hardware decoder refuses (made when needed). */
  #fallback: { handle: Deno.PointerValue; state: Deno.PointerValue; batch: number } | undefined;
  #held: unknown[] = [];

  /** Internal: made by {@linkcode openNvjpeg}. */
  constructor(
    device: Device,
    lib: Lib,
    library: string,
    version: string,
    backend: "hardware" | "default",
    standIn: boolean,
    handle: bigint,
  ) {
    this.device = device;
    this.library = library;
    this.version = version;
    this.backend = backend;
    this.standIn = standIn;
    this.#lib = lib;
    this.#handle = Deno.UnsafePointer.create(handle);
    const out = new BigUint64Array(1);
    const r = lib.symbols.nvjpegJpegStateCreate(this.#handle, out);
    if (r !== 0) {
      this.dispose();
      throw new Error(`Cannot open nvJPEG: nvjpegJpegStateCreate failed (${statusName(r)})`);
    }
    this.#state = Deno.UnsafePointer.create(out[0]);
  }

  #live(action: string): Lib {
    if (this.#lib === undefined) {
      throw new Error(`Cannot ${action}: the nvJPEG decoder is disposed`);
    }
    return this.#lib;
  }

  /**
   * The size of a JPEG as nvJPEG reads its header.
   *
   * @param image The file.
   * @returns Its height, width and colour components (1 or 3).
   * @throws {Error} "Cannot read <name> ..." when nvJPEG cannot parse it.
   */
  info(image: JpegInput): { height: number; width: number; components: number } {
    const lib = this.#live(`read ${image.name}`);
    const n = new Int32Array(1), ss = new Int32Array(1);
    const w = new Int32Array(4), h = new Int32Array(4);
    const r = lib.symbols.nvjpegGetImageInfo(
      this.#handle,
      image.bytes as Uint8Array<ArrayBuffer>,
      BigInt(image.bytes.length),
      n,
      ss,
      w,
      h,
    );
    if (r !== 0) {
      throw new Error(`Cannot read ${image.name} as a JPEG: nvJPEG says ${statusName(r)}`);
    }
    return { height: h[0], width: w[0], components: n[0] };
  }

  /**
   * Decodes JPEGs, all of one size, into a u8 `[n, height, width, 3]` (RGB, interleaved) tensor,
   * at the stream's current position: the pixels are there once the stream has reached it.
   *
   * @param images The files, at least one.
   * @param options `stream`, `out`.
   * @returns The tensor (`out` when given).
   * @throws {Error} Naming the file, when one is not a JPEG nvJPEG decodes, or is not the
   *   batch's size (nothing is resized on the device).
   *
   * @example
   * ```ts
   * import { Device, openNvjpeg } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("auto");
   * const decoder = openNvjpeg(device);
   * if (typeof decoder !== "string") {
   *   using _ = decoder;
   *   const bytes = Uint8Array.from(
   *     atob(
   *       "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFx" +
   *         "OQERXRTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/wAALCAABAAIBAREA/8QAFAABAAAAAAAAAAAAAAAAAAAAB" +
   *         "f/EABQQAQAAAAAAAAAAAAAAAAAAAAD/2gAIAQEAAD8AMf/Z",
   *     ),
   *     (c) => c.charCodeAt(0),
   *   ); // a 2x1 grey JPEG
   *   using pixels = decoder.decode([{ name: "grey.jpg", bytes }]);
   *   assert.deepStrictEqual(pixels.shape, [1, 1, 2, 3]);
   * }
   * ```
   */
  decode(images: readonly JpegInput[], options: NvjpegDecodeOptions = {}): Tensor {
    refuseUnknownKeys(options ?? {}, ["stream", "out", "stride"], "decode JPEGs on the device");
    const action = "decode JPEGs on the device";
    const stride = options.stride;
    if (stride !== undefined && !(Number.isInteger(stride) && stride > 0)) {
      throw new RangeError(`Cannot ${action}: stride must be a positive integer, got ${stride}`);
    }
    const lib = this.#live(action);
    if (!Array.isArray(images) || images.length === 0) {
      throw new TypeError(`Cannot ${action}: expected a non-empty array of { name, bytes }`);
    }
    const stream = options.stream ?? this.device.currentStream;
    assertStream(stream, this.device, action);
    let height = 0, width = 0;
    const sizes: [number, number][] = [];
    for (const image of images) {
      if (!(image?.bytes instanceof Uint8Array)) {
        throw new TypeError(`Cannot ${action}: ${image?.name ?? "an input"} has no bytes`);
      }
      const s = this.info(image);
      sizes.push([s.height, s.width]);
      if (stride !== undefined) {
        if (s.height * s.width * 3 > stride) {
          throw new Error(
            `Cannot decode ${image.name} on the device: its ${s.width}x${s.height} RGB pixels ` +
              `need ${s.height * s.width * 3} bytes, more than the stride of ${stride}`,
          );
        }
      } else if (height === 0) [height, width] = [s.height, s.width];
      else if (s.height !== height || s.width !== width) {
        throw new Error(
          `Cannot decode ${image.name} on the device: it is ${s.width}x${s.height}, the batch ` +
            `${width}x${height} (${images[0].name}); device decoding does not resize`,
        );
      }
    }
    this.device.makeCurrent();
    const n = images.length;
    const shape = stride === undefined ? [n, height, width, 3] : [n, stride];
    const out = options.out ?? Tensor.empty(this.device, shape, "u8");
    if (
      out.device !== this.device || out.dtype !== "u8" ||
      out.shape.join() !== shape.join()
    ) {
      throw new Error(
        `Cannot ${action}: out must be a u8 [${shape}] tensor of the decoder's device, got ` +
          `${out.dtype} [${out.shape}]`,
      );
    }
    try {
      const base = BigInt(Deno.UnsafePointer.value(out.pointer));
      const frame = BigInt(stride ?? height * width * 3);
      const dest = new DataView(new ArrayBuffer(IMAGE_BYTES * n));
      const data = new BigUint64Array(n), lengths = new BigUint64Array(n);
      images.forEach((image, i) => {
        dest.setBigUint64(i * IMAGE_BYTES, base + BigInt(i) * frame, true);
        dest.setBigUint64(i * IMAGE_BYTES + 32, BigInt(sizes[i][1] * 3), true);
        data[i] = BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(image.bytes)));
        lengths[i] = BigInt(image.bytes.length);
      });
      // nvJPEG may read the bytes after the call returns (the hardware decoder copies them on
      // the stream): they stay referenced until the next decode.
      this.#held = [images.map((x) => x.bytes), dest, data, lengths];
      if (this.#batch !== n) {
        this.#check(
          lib.symbols.nvjpegDecodeBatchedInitialize(this.#handle, this.#state, n, 1, OUTPUT_RGBI),
          action,
        );
        this.#batch = n;
      }
      const r = lib.symbols.nvjpegDecodeBatched(
        this.#handle,
        this.#state,
        data,
        lengths,
        new Uint8Array(dest.buffer),
        stream.handle,
      );
      if (r !== 0) this.#oneByOne(lib, images, dest, data, lengths, stream);
      return out;
    } catch (err) {
      if (options.out === undefined) out.dispose();
      throw err;
    }
  }

  /**
   * After a batch failed: each image again, alone, on the hybrid path (which decodes what the
   * hardware decoder refuses), so a file that cannot be decoded is named.
   */
  #oneByOne(
    lib: Lib,
    images: readonly JpegInput[],
    dest: DataView,
    data: BigUint64Array,
    lengths: BigUint64Array,
    stream: Stream,
  ): void {
    let f = this.#fallback;
    if (f === undefined) {
      if (this.backend === "default") f = { handle: this.#handle, state: this.#state, batch: 0 };
      else {
        const h = new BigUint64Array(1), s = new BigUint64Array(1);
        this.#check(lib.symbols.nvjpegCreateEx(BACKEND_DEFAULT, null, null, 0, h), "open nvJPEG");
        const handle = Deno.UnsafePointer.create(h[0]);
        const r = lib.symbols.nvjpegJpegStateCreate(handle, s);
        if (r !== 0) {
          lib.symbols.nvjpegDestroy(handle);
          this.#check(r, "open nvJPEG");
        }
        f = { handle, state: Deno.UnsafePointer.create(s[0]), batch: 0 };
      }
      this.#fallback = f;
    }
    if (f.handle === this.#handle) this.#batch = 1;
    if (f.batch !== 1) {
      this.#check(
        lib.symbols.nvjpegDecodeBatchedInitialize(f.handle, f.state, 1, 1, OUTPUT_RGBI),
        "decode JPEGs on the device",
      );
      f.batch = 1;
    }
    for (let i = 0; i < images.length; i++) {
      const r = lib.symbols.nvjpegDecodeBatched(
        f.handle,
        f.state,
        data.subarray(i, i + 1),
        lengths.subarray(i, i + 1),
        new Uint8Array(dest.buffer, i * IMAGE_BYTES, IMAGE_BYTES),
        stream.handle,
      );
      if (r !== 0) {
        throw new Error(
          `Cannot decode ${images[i].name} on the device: nvJPEG says ${statusName(r)}`,
        );
      }
    }
  }

  #check(r: number, action: string): void {
    if (r !== 0) throw new Error(`Cannot ${action}: nvJPEG says ${statusName(r)}`);
  }

  /** Frees nvJPEG's handle and state and unloads the library. Idempotent. */
  dispose(): void {
    const lib = this.#lib;
    if (lib === undefined) return;
    this.#lib = undefined;
    const f = this.#fallback;
    if (f !== undefined && f.handle !== this.#handle) {
      lib.symbols.nvjpegJpegStateDestroy(f.state);
      lib.symbols.nvjpegDestroy(f.handle);
    }
    if (this.#state !== null) lib.symbols.nvjpegJpegStateDestroy(this.#state);
    lib.symbols.nvjpegDestroy(this.#handle);
    this.#held = [];
    lib.close();
  }

  /** Same as {@linkcode dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * Reads JPEG files and decodes them on the device with nvJPEG, on `stream`; the tensor is
 * ready once the stream reaches the decode. A one-off: it opens nvJPEG, and waits for the
 * stream before closing it; keep an {@linkcode NvjpegDecoder} for repeated batches.
 *
 * @param device A CUDA device.
 * @param files JPEG files, all of one size.
 * @param stream The stream (default: the device's current stream).
 * @returns A u8 `[n, height, width, 3]` tensor.
 * @throws {Error} "Cannot decode JPEGs on the device: JPEG decoding stays on the workers: ..."
 *   where nvJPEG cannot be used; naming the file when one cannot be decoded.
 *
 * @example
 * ```ts
 * import { decodeJpegsOnDevice, Device } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * await assert.rejects(decodeJpegsOnDevice(device, ["a.jpg"]), /stays on the workers/);
 * ```
 */
export async function decodeJpegsOnDevice(
  device: Device,
  files: readonly string[],
  stream?: Stream,
): Promise<Tensor> {
  const queue = stream ?? device.currentStream;
  assertStream(queue, device, "decode JPEGs on the device");
  const decoder = openNvjpeg(device);
  if (typeof decoder === "string") {
    throw new Error(`Cannot decode JPEGs on the device: ${decoder}`);
  }
  let out: Tensor | undefined;
  try {
    const images = await Promise.all(
      files.map(async (name) => ({ name, bytes: await Deno.readFile(name) })),
    );
    out = decoder.decode(images, { stream: queue });
    // nvJPEG's handle must outlive the work queued with it.
    await queue.synchronize();
    return out;
  } catch (err) {
    await queue.synchronize().catch(() => {}); // the first error is the one to report
    out?.dispose();
    throw err;
  } finally {
    decoder.dispose();
  }
}
