/**
 * Test and benchmark fixtures for the loader: data files generated in the official formats
 * (never committed), a tar.gz writer for the download test, and a dataset whose workers
 * fail on purpose.
 *
 * @module
 */

import { join } from "node:path";
import { CIFAR10_RECORD_BYTES, CIFAR10_RECORDS_PER_FILE } from "../loader/datasets/cifar10.ts";
import type {
  Dataset,
  FilledField,
  SampleContext,
  SharedField,
  WorkerSpec,
} from "../loader/dataset.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import { getWorkerInfo } from "../loader/worker_info.ts";

/** Fills bytes with a deterministic pseudo-random stream (xorshift32, fast). */
export function fillRandom(bytes: Uint8Array, seed: number): void {
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.length >>> 2);
  let x = (seed | 0) || 0x12345678;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = x;
  }
  for (let i = words.length * 4; i < bytes.length; i++) bytes[i] = i * 31;
}

/**
 * Writes CIFAR-10 binary files: `data_batch_1..5.bin` and/or `test_batch.bin`.
 * Record r of file f has label `(f * 10000 + r) % 10` and pseudo-random pixels, except that
 * pixel byte 0 of the image holds `(global index) & 255` and byte 1 `(global index >> 8) & 255`
 * so tests can identify samples.
 */
export async function writeCifar10Files(
  dir: string,
  options: { train?: boolean; test?: boolean; seed?: number } = {},
): Promise<void> {
  await Deno.mkdir(dir, { recursive: true });
  const names = [
    ...(options.train ?? true ? [1, 2, 3, 4, 5].map((i) => `data_batch_${i}.bin`) : []),
    ...(options.test ?? true ? ["test_batch.bin"] : []),
  ];
  for (let f = 0; f < names.length; f++) {
    const bytes = new Uint8Array(CIFAR10_RECORDS_PER_FILE * CIFAR10_RECORD_BYTES);
    fillRandom(bytes, (options.seed ?? 1) * 1000 + f + 1);
    const base = names[f] === "test_batch.bin" ? 0 : f * CIFAR10_RECORDS_PER_FILE;
    for (let r = 0; r < CIFAR10_RECORDS_PER_FILE; r++) {
      const off = r * CIFAR10_RECORD_BYTES;
      const g = base + r;
      bytes[off] = g % 10;
      bytes[off + 1] = g & 255;
      bytes[off + 2] = (g >> 8) & 255;
    }
    await Deno.writeFile(join(dir, names[f]), bytes);
  }
}

const be32 = (n: number) => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255];

/** Bytes of an IDX u8 file with the given dims and data. */
export function idxBytes(dims: number[], data: Uint8Array): Uint8Array {
  const header = [0, 0, 8, dims.length, ...dims.flatMap(be32)];
  const out = new Uint8Array(header.length + data.length);
  out.set(header);
  out.set(data, header.length);
  return out;
}

/** Gzips bytes. */
export async function gzip(bytes: Uint8Array): Promise<Uint8Array> {
  const stream = new Blob([bytes as Uint8Array<ArrayBuffer>]).stream()
    .pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/**
 * Writes MNIST-format IDX files for `prefix` ("train" or "t10k"): n images 28x28 whose first
 * byte is `i & 255`, labels `i % 10`.
 */
export async function writeIdxFiles(
  dir: string,
  options: { prefix?: string; n?: number; gzip?: boolean } = {},
): Promise<void> {
  const n = options.n ?? 100;
  const prefix = options.prefix ?? "train";
  const images = new Uint8Array(n * 784);
  fillRandom(images, 7);
  const labels = new Uint8Array(n);
  for (let i = 0; i < n; i++) {
    images[i * 784] = i & 255;
    labels[i] = i % 10;
  }
  let img = idxBytes([n, 28, 28], images);
  let lab = idxBytes([n], labels);
  const ext = options.gzip ? ".gz" : "";
  if (options.gzip) {
    img = await gzip(img);
    lab = await gzip(lab);
  }
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeFile(join(dir, `${prefix}-images-idx3-ubyte${ext}`), img);
  await Deno.writeFile(join(dir, `${prefix}-labels-idx1-ubyte${ext}`), lab);
}

/** A ustar archive of regular files. */
export function tarBytes(entries: { name: string; data: Uint8Array }[]): Uint8Array {
  const enc = new TextEncoder();
  const blocks: Uint8Array[] = [];
  for (const e of entries) {
    const h = new Uint8Array(512);
    h.set(enc.encode(e.name).subarray(0, 100), 0);
    h.set(enc.encode("0000644\0"), 100);
    h.set(enc.encode("0000000\0"), 108);
    h.set(enc.encode("0000000\0"), 116);
    h.set(enc.encode(e.data.length.toString(8).padStart(11, "0") + "\0"), 124);
    h.set(enc.encode("00000000000\0"), 136);
    h[156] = 48; // '0': regular file
    h.set(enc.encode("ustar\0" + "00"), 257);
    h.fill(32, 148, 156);
    let sum = 0;
    for (const b of h) sum += b;
    h.set(enc.encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
    blocks.push(h);
    const body = new Uint8Array(Math.ceil(e.data.length / 512) * 512);
    body.set(e.data);
    blocks.push(body);
  }
  blocks.push(new Uint8Array(1024));
  const out = new Uint8Array(blocks.reduce((a, b) => a + b.length, 0));
  let off = 0;
  for (const b of blocks) {
    out.set(b, off);
    off += b.length;
  }
  return out;
}

/** What the "oom" fault keeps alive: from `at` on, every sample leaks 4 MB (a cache gone wrong). */
const hoard: number[][] = [];

/** A sample of {@linkcode FaultyDataset}. */
export interface FaultySample {
  /** The index. */
  x: Float32Array;
  /** The first draw of the sample's random stream. */
  r: number;
  /** Worker id (-1 on the main thread). */
  w: number;
  /** What workerInit recorded (-1 when it did not run). */
  init: number;
  /** getWorkerInfo().seed (-1 on the main thread). */
  seed: number;
}

/** What {@linkcode FaultyDataset} does at its `at` index. */
export type Fault =
  | "none"
  | "throw"
  | "throwString"
  | "throwNull"
  | "close"
  | "exit"
  | "hang"
  | "spin"
  | "never"
  | "slow"
  | "oom"
  | "heapLimit"
  | "crash";

/** State of a {@linkcode FaultyDataset}. */
export interface FaultyState {
  length: number;
  fault: Fault;
  at: number;
}

/**
 * A dataset of `{ x: Float32Array([i]) , r: random draw }` that misbehaves at index `at`:
 * throws (an Error, a string, null), closes its worker, exits, hangs (spinning for 60 s or
 * forever, or a promise that never settles), takes 300 ms, leaks 4 MB per sample from `at` on
 * ("oom"), allocates inside its one get() until V8 stops the worker at its heap limit, in epoch
 * 0 only ("heapLimit"), or crashes the worker with an uncaught error. On the main thread only the throws,
 * "never" and "slow" apply.
 */
export class FaultyDataset implements Dataset<FaultySample> {
  readonly length: number;
  readonly fault: Fault;
  readonly at: number;
  constructor(state: FaultyState) {
    this.length = state.length;
    this.fault = state.fault;
    this.at = state.at;
  }
  static fromState(state: FaultyState): FaultyDataset {
    return new FaultyDataset(state);
  }
  get(i: number, ctx?: SampleContext): FaultySample {
    if (this.fault === "oom" && i >= this.at) hoard.push(new Array(5e5).fill(i + 0.5));
    else if (i === this.at) {
      switch (this.fault) {
        case "throw":
          throw new Error(`injected failure at ${i}`);
        case "throwString":
          throw `injected string at ${i}`;
        case "throwNull":
          throw null;
        case "spin":
          // A worker stuck in a JavaScript loop (the condition keeps lint from calling the
          // case a fall-through).
          while (this.at >= 0) { /* spin */ }
          break;
        case "never":
          return new Promise<never>(() => {}) as never;
        case "heapLimit": {
          if (ctx && ctx.epoch > 0) break;
          const grown: number[][] = [];
          // Ends only when V8 stops the worker (the condition keeps lint quiet).
          while (this.at >= 0) grown.push(new Array(1e5).fill(i + 0.5));
          break;
        }
        case "slow": {
          const end = Date.now() + 300;
          while (Date.now() < end) { /* a slow synchronous get() */ }
          break;
        }

        case "close":
          self.close();
          break;
        case "exit":
          Deno.exit(3);
          break;
        case "hang": {
          const end = Date.now() + 60_000;
          while (Date.now() < end) { /* spin: a hung worker */ }
          break;
        }
        case "crash":
          setTimeout(() => {
            throw new Error("uncaught in worker");
          });
          // Keep the task pending so only the crash can end it.
          return new Promise<never>(() => {}) as never;
      }
    }
    return {
      x: new Float32Array([i]),
      r: ctx ? ctx.random() : -1,
      w: getWorkerInfo()?.id ?? -1,
      init: (globalThis as { __workerId?: number }).__workerId ?? -1,
      seed: getWorkerInfo()?.seed ?? -1,
    };
  }
  workerSpec(): WorkerSpec {
    const state: FaultyState = { length: this.length, fault: this.fault, at: this.at };
    return { module: import.meta.url, export: "FaultyDataset.fromState", state };
  }
}

/** A workerInit function for tests: records the worker id in globalThis. */
export function recordWorkerId(id: number): void {
  (globalThis as { __workerId?: number }).__workerId = id;
}

/** A collate (module function, runs in workers): sums x per batch. */
export function sumCollate(samples: { x: Float32Array }[]): number {
  return samples.reduce((a, s) => a + s.x[0], 0);
}

/** A collate (module function, runs in workers) returning the samples as they are. */
export function identity<T>(samples: T[]): T[] {
  return samples;
}

/** State of a {@linkcode HeapFillDataset}. */
export interface HeapFillState {
  length: number;
  at: number;
}

/**
 * A zero-copy dataset (a shared `label` field, sample i has label i) with a field it fills
 * itself, `x` (f32, the record's index), whose fill of record `at` allocates until V8 stops the
 * worker, in epoch 0 only: a gather that runs out of heap.
 */
export class HeapFillDataset {
  readonly length: number;
  readonly at: number;
  #labels: TensorDataset;
  constructor(state: HeapFillState) {
    this.length = state.length;
    this.at = state.at;
    this.#labels = new TensorDataset({
      label: Int32Array.from({ length: state.length }, (_, i) => i),
    });
  }
  static fromState(state: HeapFillState): HeapFillDataset {
    return new HeapFillDataset(state);
  }
  get(i: number): { label: number; x: Float32Array } {
    return { label: i, x: new Float32Array([i]) };
  }
  sharedFields(): readonly SharedField[] {
    return this.#labels.sharedFields();
  }
  filledFields(): readonly FilledField[] {
    return [{ name: "x", dtype: "f32", shape: [1] }];
  }
  fillRecord(record: number, _field: number, out: Uint8Array, ctx: SampleContext): void {
    if (record === this.at && ctx.epoch === 0) {
      const grown: number[][] = [];
      // Ends only when V8 stops the worker (the condition keeps lint quiet).
      while (this.at >= 0) grown.push(new Array(1e5).fill(record + 0.5));
    }
    new DataView(out.buffer, out.byteOffset, 4).setFloat32(0, record, true);
  }
  workerSpec(): WorkerSpec {
    const state: HeapFillState = { length: this.length, at: this.at };
    return { module: import.meta.url, export: "HeapFillDataset.fromState", state };
  }
}
