// The zero-copy gather: copies the records of a batch's samples from the dataset's shared
// fields into a ring slot, and writes their augment records (augment/record.ts). Runs in
// workers and, with numWorkers 0, on the main thread. Everything it touches is shared memory,
// so the only thing crossing threads per batch is a small control message.

import type { AugmentSpec } from "../augment/options.ts";
import { sampleKey, writeAugmentRecords } from "../augment/record.ts";
import {
  GEOMETRY_RECORD_LENGTH,
  type GeometrySpec,
  writeGeometryRecord,
} from "../augment/geometry.ts";
import { type WasmGather, wasmGather } from "./_wasm_gather.ts";
import { rememberMemory } from "../internal/wasm_memory.ts";
import { sampleContext } from "./_fetch.ts";
import type { SampleContext } from "./dataset.ts";

export interface GatherSource {
  buffer: SharedArrayBuffer;
  /** The WebAssembly.Memory behind `buffer`, enabling the memory.copy gather. */
  memory?: WebAssembly.Memory;
  byteOffset: number;
  recordBytes: number;
  slotFieldOffset: number;
}

export interface GatherSpec {
  ring: SharedArrayBuffer;
  ringMemory?: WebAssembly.Memory;
  slotBytes: number;
  sources: GatherSource[];
  indicesOffset: number;
  /** -1 when the loader draws no augmentation parameters. */
  augmentOffset: number;
  /** What the loader draws (unused when augmentOffset is -1). */
  augment: AugmentSpec;
  /** -1 when the loader draws no geometry records. */
  geometryOffset?: number;
  /** The geometric transforms (with geometryOffset >= 0). */
  geometry?: GeometrySpec;
  /** The int32 [h, w] of each image in the slot, or -1: every image is fixedSize. */
  sizeOffset?: number;
  /** The images' size when they all have one. */
  fixedSize?: [number, number];
  length: number;
  seed: number;
  /** Fields the dataset writes into the slot itself (Dataset.fillRecord), by field position. */
  filled?: FilledSource[];
}

/** Where a filled field goes in a slot. */
export interface FilledSource {
  recordBytes: number;
  slotFieldOffset: number;
}

/** What fills the filled fields: the dataset (rebuilt in each worker). */
export interface Filler {
  fillRecord?(record: number, field: number, out: Uint8Array, context: SampleContext): void;
}

/**
 * Records up to this many bytes are copied byte by byte: below it, a `subarray` per sample
 * (an allocation) costs more than the copy.
 */
const SMALL_RECORD = 16;

/** An error in one sample, carrying its dataset index. */
export class SampleError extends Error {
  readonly index: number;
  constructor(index: number, message: string, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = cause instanceof Error ? cause.name : "RangeError";
    this.index = index;
  }
}

export class Gatherer {
  #spec: GatherSpec;
  #ringU8: Uint8Array;
  #ringI32: Int32Array;
  #src: {
    u8: Uint8Array;
    i32: Int32Array | undefined;
    wasm: WasmGather | undefined;
    s: GatherSource;
  }[];

  #filler: Filler | undefined;

  #workerId: number;

  /** The step between a batch's samples' draw positions (EpochOrder.drawStride). */
  #stride: number;

  constructor(spec: GatherSpec, filler?: Filler, workerId = -1, stride = 1) {
    this.#spec = spec;
    this.#stride = stride;
    this.#filler = filler;
    this.#workerId = workerId;
    if ((spec.filled?.length ?? 0) > 0 && typeof filler?.fillRecord !== "function") {
      throw new TypeError("Cannot gather filled fields: the dataset has no fillRecord()");
    }
    // Views on the ring memory's own buffer (in a worker, the posted memory's), remembered, so
    // that a dataset's WebAssembly loops can write a slot directly (decode/'s resize).
    const ring = spec.ringMemory ? rememberMemory(spec.ringMemory) : spec.ring;
    this.#ringU8 = new Uint8Array(ring);
    this.#ringI32 = new Int32Array(ring, 0, ring.byteLength >>> 2);
    this.#src = spec.sources.map((s) => ({
      s,
      wasm: spec.ringMemory && s.memory && s.recordBytes > 4
        ? wasmGather(spec.ringMemory, s.memory)
        : undefined,
      u8: new Uint8Array(s.buffer),
      // Word-sized records (labels) are copied element-wise: a subarray per 4 bytes would
      // cost more than the copy.
      i32: s.recordBytes === 4 && s.byteOffset % 4 === 0
        ? new Int32Array(s.buffer, 0, s.buffer.byteLength >>> 2)
        : undefined,
    }));
  }

  /**
   * Fills `count` records of `slot` from the indices already written in its indices field;
   * `position` is the first sample's draw position.
   */
  gather(slot: number, count: number, epoch: number, position: number): void {
    const spec = this.#spec;
    const base = slot * spec.slotBytes;
    const idxBase = (base + spec.indicesOffset) >>> 2;
    const ring8 = this.#ringU8;
    const ring32 = this.#ringI32;
    const n = spec.length;
    for (let k = 0; k < count; k++) {
      const i = ring32[idxBase + k];
      if (!(i >= 0 && i < n)) {
        throw new SampleError(
          i,
          `Cannot load sample ${i}: index out of range for a dataset of length ${n}`,
        );
      }
    }
    for (const { s, u8, i32, wasm } of this.#src) {
      const rb = s.recordBytes;
      const dst = base + s.slotFieldOffset;
      if (wasm !== undefined) {
        wasm(base + spec.indicesOffset, count, s.byteOffset, rb, dst);
      } else if (i32 !== undefined) {
        const d32 = dst >>> 2;
        const s32 = s.byteOffset >>> 2;
        for (let k = 0; k < count; k++) ring32[d32 + k] = i32[s32 + ring32[idxBase + k]];
      } else if (rb <= SMALL_RECORD) {
        // A subarray per sample costs more than copying a few bytes one by one (u8 labels,
        // the resident loader's one-byte index set).
        for (let k = 0; k < count; k++) {
          const from = s.byteOffset + ring32[idxBase + k] * rb, to = dst + k * rb;
          for (let j = 0; j < rb; j++) ring8[to + j] = u8[from + j];
        }
      } else {
        for (let k = 0; k < count; k++) {
          const from = s.byteOffset + ring32[idxBase + k] * rb;
          ring8.set(u8.subarray(from, from + rb), dst + k * rb);
        }
      }
    }
    const filled = spec.filled ?? [];
    for (let f = 0; f < filled.length; f++) {
      const rb = filled[f].recordBytes;
      const dst = base + filled[f].slotFieldOffset;
      for (let k = 0; k < count; k++) {
        const i = ring32[idxBase + k];
        // The sample's own stream, as get() has it on the generic path.
        const context = sampleContext(
          spec.seed,
          epoch,
          position + k * this.#stride,
          this.#workerId,
        );
        try {
          this.#filler!.fillRecord!(
            i,
            f,
            ring8.subarray(dst + k * rb, dst + (k + 1) * rb),
            context,
          );
        } catch (e) {
          throw new SampleError(i, (e as Error)?.message ?? String(e), e);
        }
      }
    }
    if (spec.augmentOffset >= 0) {
      const a32 = (base + spec.augmentOffset) >>> 2;
      const key = sampleKey(spec.seed, epoch);
      writeAugmentRecords(ring32, a32, key, position, count, spec.augment, this.#stride);
    }
    if ((spec.geometryOffset ?? -1) >= 0) {
      const g32 = (base + spec.geometryOffset!) >>> 2, key = sampleKey(spec.seed, epoch);
      const s32 = spec.sizeOffset! >= 0 ? (base + spec.sizeOffset!) >>> 2 : -1;
      for (let k = 0; k < count; k++) {
        const h = s32 >= 0 ? ring32[s32 + 2 * k] : spec.fixedSize![0];
        const w = s32 >= 0 ? ring32[s32 + 2 * k + 1] : spec.fixedSize![1];
        try {
          writeGeometryRecord(
            ring32,
            g32 + k * GEOMETRY_RECORD_LENGTH,
            spec.geometry!,
            h,
            w,
            key,
            position + k * this.#stride,
          );
        } catch (e) {
          const i = ring32[idxBase + k];
          throw new SampleError(i, `Cannot load sample ${i}: ${(e as Error).message}`, e);
        }
      }
    }
  }
}
