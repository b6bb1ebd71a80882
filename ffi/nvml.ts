/**
 * GPU utilisation from NVML, the NVIDIA Management Library that `nvidia-smi` reads
 * (`libnvidia-ml.so.1`, installed with the driver), through `Deno.dlopen`: how busy the SMs and
 * the memory were over the driver's last sample period, the memory used and the temperature.
 * Where NVML is absent (no NVIDIA driver, another OS), {@linkcode openNvml} says why in one line
 * and nothing fails. `PINSTREAM_NVML_LIB` names another library to load instead (the CUDA
 * emulator's stand-in, kernels/emu/nvml_stand_in.c, in the tests).
 *
 * NVML numbers its GPUs in PCI order, which `CUDA_VISIBLE_DEVICES` does not change: NVML's GPU
 * 0 may not be the process's `cuda:0`.
 *
 * @example
 * ```ts
 * import { GpuSampler, openNvml } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const nvml = openNvml();
 * if (typeof nvml === "string") {
 *   assert.match(nvml, /NVML/); // why not, in one line
 * } else {
 *   using sampler = new GpuSampler(nvml, { intervalMs: 50 });
 *   await new Promise((r) => setTimeout(r, 120));
 *   const s = sampler.stop();
 *   assert.ok(s.samples >= 1 && s.smUtilization.mean >= 0);
 *   nvml.dispose();
 * }
 * ```
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";

const SYMBOLS = {
  nvmlInit_v2: { parameters: [], result: "i32" },
  nvmlShutdown: { parameters: [], result: "i32" },
  nvmlErrorString: { parameters: ["i32"], result: "pointer" },
  nvmlDeviceGetCount_v2: { parameters: ["buffer"], result: "i32" },
  nvmlDeviceGetHandleByIndex_v2: { parameters: ["u32", "buffer"], result: "i32" },
  nvmlDeviceGetName: { parameters: ["pointer", "buffer", "u32"], result: "i32" },
  nvmlDeviceGetUtilizationRates: { parameters: ["pointer", "buffer"], result: "i32" },
  nvmlDeviceGetMemoryInfo: { parameters: ["pointer", "buffer"], result: "i32" },
  nvmlDeviceGetTemperature: { parameters: ["pointer", "i32", "buffer"], result: "i32" },
} as const;

/** One reading of one GPU. */
export interface GpuSample {
  /** NVML's index of the GPU. */
  index: number;
  /** The GPU's name, as nvidia-smi shows it. */
  name: string;
  /** Percent of the last sample period in which a kernel ran on the GPU. */
  smUtilization: number;
  /** Percent of the last sample period in which device memory was read or written. */
  memoryUtilization: number;
  /** Device memory in use, by every process. */
  memoryUsedBytes: number;
  /** Device memory in all. */
  memoryTotalBytes: number;
  /** Degrees Celsius, at the GPU die. */
  temperatureC: number;
}

/** Options of {@linkcode Nvml.open}. */
export interface NvmlOptions {
  /** The library to load (default: `PINSTREAM_NVML_LIB`, else `libnvidia-ml.so.1`). */
  library?: string;
}

function envLibrary(): string | undefined {
  const q = Deno.permissions.querySync({ name: "env", variable: "PINSTREAM_NVML_LIB" });
  return q.state === "granted" ? Deno.env.get("PINSTREAM_NVML_LIB") : undefined;
}

/**
 * NVML, loaded and initialized. Dispose it to shut NVML down and unload the library.
 *
 * @example
 * ```ts
 * import { Nvml } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * try {
 *   using nvml = Nvml.open();
 *   assert.ok(nvml.deviceCount >= 1);
 *   assert.ok(nvml.sample(0).memoryTotalBytes > 0);
 * } catch (err) {
 *   assert.match((err as Error).message, /^Cannot open NVML/);
 * }
 * ```
 */
export class Nvml implements Disposable {
  /** The library loaded. */
  readonly library: string;
  #lib: Deno.DynamicLibrary<typeof SYMBOLS> | undefined;

  private constructor(library: string, lib: Deno.DynamicLibrary<typeof SYMBOLS>) {
    this.library = library;
    this.#lib = lib;
  }

  /**
   * Loads NVML and initializes it.
   *
   * @param options `library`.
   * @returns NVML, ready to sample.
   * @throws {TypeError} On an unknown option.
   * @throws {Error} "Cannot open NVML: ..." when the library is absent, lacks a symbol or
   *   fails to initialize (no driver loaded, say).
   */
  static open(options: NvmlOptions = {}): Nvml {
    refuseUnknownKeys(options ?? {}, ["library"], "open NVML");
    const library = options.library ?? envLibrary() ?? "libnvidia-ml.so.1";
    let lib: Deno.DynamicLibrary<typeof SYMBOLS>;
    try {
      lib = Deno.dlopen(library, SYMBOLS);
    } catch (err) {
      const why = (err as Error).message.split("\n")[0];
      throw new Error(`Cannot open NVML: ${library} could not be loaded (${why})`, {
        cause: err,
      });
    }
    const nvml = new Nvml(library, lib);
    const r = lib.symbols.nvmlInit_v2();
    if (r !== 0) {
      const why = nvml.#error(r);
      lib.close();
      throw new Error(`Cannot open NVML: nvmlInit_v2 failed (${why})`);
    }
    return nvml;
  }

  #error(r: number): string {
    const p = this.#lib!.symbols.nvmlErrorString(r);
    return `${p === null ? "error" : Deno.UnsafePointerView.getCString(p)}, NVML status ${r}`;
  }

  #check(r: number, what: string): void {
    if (r !== 0) throw new Error(`Cannot ${what}: ${this.#error(r)}`);
  }

  #live(what: string): Deno.DynamicLibrary<typeof SYMBOLS> {
    if (this.#lib === undefined) throw new Error(`Cannot ${what}: NVML is shut down`);
    return this.#lib;
  }

  /** The GPUs NVML sees. */
  get deviceCount(): number {
    const lib = this.#live("count the GPUs");
    const n = new Uint32Array(1);
    this.#check(lib.symbols.nvmlDeviceGetCount_v2(n), "count the GPUs");
    return n[0];
  }

  /**
   * Reads one GPU now.
   *
   * @param index NVML's index of the GPU (default 0).
   * @returns Its utilisation, memory and temperature.
   * @throws {Error} Naming the GPU and NVML's error when a query fails (an index out of range,
   *   a GPU that fell off the bus) or NVML is shut down.
   */
  sample(index = 0): GpuSample {
    const what = `read GPU ${index} through NVML`;
    const s = this.#live(what).symbols;
    const handle = new BigUint64Array(1);
    this.#check(s.nvmlDeviceGetHandleByIndex_v2(index, handle), what);
    const dev = Deno.UnsafePointer.create(handle[0]);
    const name = new Uint8Array(96);
    this.#check(s.nvmlDeviceGetName(dev, name, name.length), what);
    const util = new Uint32Array(2);
    this.#check(s.nvmlDeviceGetUtilizationRates(dev, util), what);
    const mem = new BigUint64Array(3); // total, free, used
    this.#check(s.nvmlDeviceGetMemoryInfo(dev, mem), what);
    const temp = new Uint32Array(1);
    this.#check(s.nvmlDeviceGetTemperature(dev, 0, /* NVML_TEMPERATURE_GPU */ temp), what);
    const end = name.indexOf(0);
    return {
      index,
      name: new TextDecoder().decode(name.subarray(0, end < 0 ? name.length : end)),
      smUtilization: util[0],
      memoryUtilization: util[1],
      memoryUsedBytes: Number(mem[2]),
      memoryTotalBytes: Number(mem[0]),
      temperatureC: temp[0],
    };
  }

  /** Shuts NVML down and unloads the library. Idempotent. */
  dispose(): void {
    if (this.#lib === undefined) return;
    this.#lib.symbols.nvmlShutdown();
    this.#lib.close();
    this.#lib = undefined;
  }

  /** Shuts NVML down and unloads the library. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * Opens NVML, or says in one line why not: what a report shows instead of GPU figures.
 *
 * @param options As {@linkcode Nvml.open}.
 * @returns NVML, or the reason it is not available.
 * @example
 * ```ts
 * import { openNvml } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const r = openNvml({ library: "/nonexistent/libnvidia-ml.so.1" });
 * assert.match(String(r), /^NVML not available: .*\/nonexistent\/libnvidia-ml\.so\.1/);
 * ```
 */
export function openNvml(options: NvmlOptions = {}): Nvml | string {
  try {
    return Nvml.open(options);
  } catch (err) {
    if (err instanceof TypeError) throw err;
    const m = (err as Error).message.replace(/^Cannot open NVML: /, "");
    return `NVML not available: ${m.split("\n")[0]}`;
  }
}

/** Options of {@linkcode GpuSampler}. */
export interface GpuSamplerOptions {
  /** NVML's index of the GPU (default 0). */
  index?: number;
  /** Milliseconds between samples (default 500; NVML's own period is 1/6 s to 1 s). */
  intervalMs?: number;
}

/** Mean and maximum of a sampled quantity. */
export interface GpuStat {
  /** The mean over the samples. */
  mean: number;
  /** The largest sample. */
  max: number;
}

/** What a {@linkcode GpuSampler} saw. */
export interface GpuSummary {
  /** NVML's index of the GPU. */
  index: number;
  /** The GPU's name. */
  name: string;
  /** How many samples were taken (0: none, the figures below are NaN). */
  samples: number;
  /** Percent of time a kernel ran (see {@linkcode GpuSample}). */
  smUtilization: GpuStat;
  /** Percent of time device memory was read or written. */
  memoryUtilization: GpuStat;
  /** Device memory in use, by every process. */
  memoryUsedBytes: GpuStat;
  /** Device memory in all. */
  memoryTotalBytes: number;
  /** Degrees Celsius. */
  temperatureC: GpuStat;
}

/**
 * Samples a GPU on a timer while work runs (the event loop must turn: awaited device work
 * does), and summarizes. The first sample is taken at once. A failed sample stops the
 * sampling and is reported by {@linkcode GpuSampler.stop}'s `error`, never thrown.
 *
 * @example
 * ```ts
 * import { GpuSampler, openNvml } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const nvml = openNvml();
 * if (typeof nvml !== "string") {
 *   const s = new GpuSampler(nvml).stop();
 *   assert.strictEqual(s.samples, 1);
 *   nvml.dispose();
 * }
 * ```
 */
export class GpuSampler implements Disposable {
  readonly #nvml: Nvml;
  readonly #index: number;
  #timer: ReturnType<typeof setInterval> | undefined;
  #seen: GpuSample[] = [];
  #error: string | undefined;

  /**
   * Starts sampling.
   *
   * @param nvml An open NVML.
   * @param options `index`, `intervalMs`.
   * @throws {TypeError} On an unknown option.
   * @throws {RangeError} When `intervalMs` is not a positive number.
   */
  constructor(nvml: Nvml, options: GpuSamplerOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["index", "intervalMs"], "create GpuSampler");
    const interval = options.intervalMs ?? 500;
    if (!(interval > 0)) {
      throw new RangeError(
        `Cannot create GpuSampler: intervalMs option must be > 0, got ${interval}`,
      );
    }
    this.#nvml = nvml;
    this.#index = options.index ?? 0;
    this.#take();
    // Unref'd: a sampler left running must not keep the process alive.
    if (this.#error === undefined) {
      const timer = setInterval(() => this.#take(), interval);
      Deno.unrefTimer(timer as unknown as number);
      this.#timer = timer;
    }
  }

  #take(): void {
    try {
      this.#seen.push(this.#nvml.sample(this.#index));
    } catch (err) {
      this.#error = (err as Error).message;
      this.#clear();
    }
  }

  #clear(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /**
   * Stops sampling (taking one last sample when still running) and summarizes.
   *
   * @returns The summary, with `error` when a sample failed.
   */
  stop(): GpuSummary & { error?: string } {
    if (this.#timer !== undefined) this.#take();
    this.#clear();
    const xs = this.#seen;
    const stat = (f: (s: GpuSample) => number): GpuStat =>
      xs.length === 0 ? { mean: NaN, max: NaN } : {
        mean: xs.reduce((a, s) => a + f(s), 0) / xs.length,
        max: Math.max(...xs.map(f)),
      };
    return {
      index: this.#index,
      name: xs[0]?.name ?? "",
      samples: xs.length,
      smUtilization: stat((s) => s.smUtilization),
      memoryUtilization: stat((s) => s.memoryUtilization),
      memoryUsedBytes: stat((s) => s.memoryUsedBytes),
      memoryTotalBytes: xs[0]?.memoryTotalBytes ?? NaN,
      temperatureC: stat((s) => s.temperatureC),
      ...(this.#error === undefined ? {} : { error: this.#error }),
    };
  }

  /** Stops sampling. */
  [Symbol.dispose](): void {
    this.#clear();
  }
}

/**
 * One line for a report: the sampled GPU figures, or why there are none.
 *
 * @param s A sampler's summary, or the reason NVML is not available.
 * @returns e.g. "GPU 0 (NVIDIA H100): SM 87% (max 99%), memory 41%, 3.0 of 80.0 GiB used,
 *   64 C (max 70 C), 12 samples".
 * @example
 * ```ts
 * import { gpuLine } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(gpuLine("NVML not available: no driver"), "NVML not available: no driver");
 * ```
 */
export function gpuLine(s: (GpuSummary & { error?: string }) | string): string {
  if (typeof s === "string") return s;
  if (s.samples === 0) return `GPU ${s.index}: no NVML sample (${s.error ?? "none taken"})`;
  const pct = (x: number) => `${Math.round(x)}%`;
  const gib = (x: number) => (x / 2 ** 30).toFixed(1);
  return `GPU ${s.index} (${s.name}): SM ${pct(s.smUtilization.mean)} (max ` +
    `${pct(s.smUtilization.max)}), memory ${pct(s.memoryUtilization.mean)}, ` +
    `${gib(s.memoryUsedBytes.max)} of ${gib(s.memoryTotalBytes)} GiB used, ` +
    `${Math.round(s.temperatureC.mean)} C (max ${s.temperatureC.max} C), ` +
    `${s.samples} sample${s.samples === 1 ? "" : "s"}` +
    (s.error ? ` (sampling stopped: ${s.error})` : "");
}
