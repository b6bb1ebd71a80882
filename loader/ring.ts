/**
 * The staging ring: the shared memory the zero-copy path gathers batches into.
 *
 * ## Layout
 *
 * One `SharedArrayBuffer` (`ring.buffer`, the memory of a shared WebAssembly.Memory, so its
 * length is rounded up to 64 KiB) holds `slotCount` slots of `slotBytes` bytes; slot `s`
 * starts at `ring.slotOffset(s) = s * slotBytes` (a multiple of 4096). Inside a slot,
 * each field of `ring.fields` starts at its `byteOffset` (a multiple of 256) and holds
 * `batchSize` records of `sampleBytes` bytes, record k of the batch at
 * `byteOffset + k * sampleBytes`. Only the first `batch.size` records are valid (the last
 * batch of an epoch may be partial). The fields are, in order:
 *
 * - the dataset's shared fields (e.g. CIFAR-10: `image` u8 [3,32,32] CHW, `label` i32 []),
 * - `indices` i32 []: the dataset index of each sample,
 * - `augment` i32 [{@linkcode AUGMENT_RECORD_LENGTH}], only with the loader's `augment`
 *   option: per sample the record below.
 *
 * ## Augmentation parameters
 *
 * With the loader's `augment` option, sample k's `augment` record is the
 * {@linkcode AUGMENT_RECORD_LENGTH} int32 words that augment/record.ts lays out and draws
 * (see {@linkcode augmentRecord}).
 *
 * ## Ownership
 *
 * A slot belongs to the loader until it is yielded as a {@linkcode RingBatch}; from then on
 * it belongs to the consumer until `batch.release()`, and the loader never writes it in
 * between. With the loader's default `autoRelease: true`, asking for the next batch releases
 * the previous one; with `autoRelease: false` (the device pipeline) the consumer releases
 * each batch itself, typically once its copy to the GPU has completed, and may hold up to
 * `heldBatches` batches without slowing the loader. The ring is allocated once per loader
 * and lives until the loader is disposed, so it can be pinned once (`pinMemory`).
 *
 * @module
 */

import { DTYPES, type FieldDType, recordBytes, type TypedArray } from "./dataset.ts";
import { allocShared } from "./_wasm_gather.ts";
import { memoryOfBuffer } from "../internal/wasm_memory.ts";

/** One field of a ring slot. */
export interface RingField {
  /** Field name: a dataset field, "indices" or "augment". */
  readonly name: string;
  /** Element type. */
  readonly dtype: FieldDType;
  /** Per-sample shape; the batch is `[batchSize, ...sampleShape]`. */
  readonly sampleShape: readonly number[];
  /** Bytes of one sample's record. */
  readonly sampleBytes: number;
  /** Byte offset of the field inside a slot (multiple of 256). */
  readonly byteOffset: number;
  /** Bytes reserved for the field in a slot (`batchSize * sampleBytes`). */
  readonly byteLength: number;
}

/** Alignment of fields inside a slot, and of slots inside the ring. */
export const FIELD_ALIGN = 256;
/** Slots are page-aligned so a slot can be registered or copied on its own. */
export const SLOT_ALIGN = 4096;

const align = (n: number, a: number) => Math.ceil(n / a) * a;

/**
 * Computes the slot layout for sample fields and a batch size.
 *
 * @param fields the per-sample fields (name, dtype, shape)
 * @param batchSize records per slot
 * @returns the ring fields (with offsets) and the slot size
 * @example Two fields
 * ```ts
 * import { ringLayout } from "./ring.ts";
 * import assert from "node:assert";
 * const { fields, slotBytes } = ringLayout(
 *   [{ name: "image", dtype: "u8", shape: [3, 32, 32] }, { name: "label", dtype: "i32", shape: [] }],
 *   128,
 * );
 * assert.strictEqual(fields[1].byteOffset, 128 * 3072);
 * assert.strictEqual(slotBytes % 4096, 0);
 * ```
 */
export function ringLayout(
  fields: readonly { name: string; dtype: FieldDType; shape: readonly number[] }[],
  batchSize: number,
): { fields: RingField[]; slotBytes: number } {
  let offset = 0;
  const out: RingField[] = [];
  for (const f of fields) {
    const sampleBytes = recordBytes(f);
    out.push({
      name: f.name,
      dtype: f.dtype,
      sampleShape: [...f.shape],
      sampleBytes,
      byteOffset: offset,
      byteLength: sampleBytes * batchSize,
    });
    offset = align(offset + sampleBytes * batchSize, FIELD_ALIGN);
  }
  return { fields: out, slotBytes: align(Math.max(offset, 1), SLOT_ALIGN) };
}

/**
 * The ring of batch slots in one SharedArrayBuffer. Created by the DataLoader (see the
 * module documentation for the layout and the ownership rule); the device layer pins
 * `buffer` and copies `[slotOffset(s), slotOffset(s) + slotBytes)` per batch.
 *
 * @example A ring of two slots
 * ```ts
 * import { StagingRing } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ring = new StagingRing([{ name: "x", dtype: "f32", shape: [2] }], 4, 2);
 * assert.ok(ring.buffer.byteLength >= 2 * ring.slotBytes);
 * assert.strictEqual(ring.view(1, "x").length, 8);
 * ```
 */
export class StagingRing {
  /**
   * The ring's memory: at least `slotCount * slotBytes` bytes (rounded up to 64 KiB: it is
   * the buffer of a shared WebAssembly.Memory, see `memory`). Pin this whole buffer.
   */
  readonly buffer: SharedArrayBuffer;
  /** The shared WebAssembly.Memory behind `buffer` (undefined if wasm is unavailable). */
  readonly memory: WebAssembly.Memory | undefined;
  /** Number of slots. */
  readonly slotCount: number;
  /** Bytes per slot (multiple of 4096). */
  readonly slotBytes: number;
  /** Records per slot. */
  readonly batchSize: number;
  /** The fields of a slot, in order. */
  readonly fields: readonly RingField[];
  #byName: Map<string, RingField>;

  /**
   * Creates it; see the class documentation.
   *
   * @param fields per-sample fields (name, dtype, shape)
   * @param batchSize records per slot
   * @param slotCount number of slots
   * @throws {RangeError} for a non-positive batch size or slot count, or duplicate names
   */
  constructor(
    fields: readonly { name: string; dtype: FieldDType; shape: readonly number[] }[],
    batchSize: number,
    slotCount: number,
  ) {
    if (!Number.isInteger(batchSize) || batchSize < 1) {
      throw new RangeError(`Cannot create ring: batchSize must be >= 1, got ${batchSize}`);
    }
    if (!Number.isInteger(slotCount) || slotCount < 1) {
      throw new RangeError(`Cannot create ring: slotCount must be >= 1, got ${slotCount}`);
    }
    const layout = ringLayout(fields, batchSize);
    this.fields = layout.fields;
    this.#byName = new Map(layout.fields.map((f) => [f.name, f]));
    if (this.#byName.size !== layout.fields.length) {
      throw new RangeError(
        `Cannot create ring: duplicate field names in ${fields.map((f) => f.name).join(", ")}`,
      );
    }
    this.slotBytes = layout.slotBytes;
    this.batchSize = batchSize;
    this.slotCount = slotCount;
    this.buffer = allocShared(this.slotBytes * slotCount);
    this.memory = memoryOfBuffer(this.buffer);
  }

  /**
   * Byte offset of a slot in `buffer`.
   *
   * @param slot slot number in [0, slotCount)
   * @returns the byte offset of the slot in `buffer`
   */
  slotOffset(slot: number): number {
    return slot * this.slotBytes;
  }

  /**
   * A field by name.
   *
   * @param name a field name
   * @returns the field
   * @throws {RangeError} for an unknown name
   */
  field(name: string): RingField {
    const f = this.#byName.get(name);
    if (f === undefined) {
      throw new RangeError(
        `Cannot find ring field "${name}": fields are ${this.fields.map((x) => x.name).join(", ")}`,
      );
    }
    return f;
  }

  /**
   * A typed view of one field of one slot.
   *
   * @param slot slot number
   * @param name field name
   * @param count records to cover (default batchSize)
   * @returns a view into `buffer` (no copy)
   */
  view(slot: number, name: string, count: number = this.batchSize): TypedArray {
    const f = this.field(name);
    const { ctor, bytes } = DTYPES[f.dtype];
    return new ctor(
      this.buffer,
      this.slotOffset(slot) + f.byteOffset,
      (count * f.sampleBytes) / bytes,
    );
  }
}

/**
 * A batch in a slot of the staging ring (the zero-copy path). The typed arrays are views
 * into the ring: valid until `release()`, after which the loader may overwrite them.
 *
 * `F` names the dataset's fields and their arrays: `new DataLoader(dataset)` infers it from
 * the dataset (`RingBatch<{ image: Uint8Array; label: Int32Array }>` for CIFAR-10), so
 * `batch.fields.lable` is a type error. A `RingBatch<F>` is a `RingBatch` (its default,
 * any field names).
 *
 * @typeParam F the batch fields: name -> typed array
 *
 * @example Reading a batch from a loader over an in-memory dataset
 * ```ts
 * import { DataLoader } from "@pinstream/pinstream";
 * import { TensorDataset } from "@pinstream/pinstream";
 * import { RingBatch } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ds = new TensorDataset({ x: { data: new Float32Array([1, 2, 3, 4]), shape: [2] } });
 * await using loader = new DataLoader(ds, { batchSize: 2 });
 * for await (const batch of loader) {
 *   assert.ok(batch instanceof RingBatch);
 *   assert.deepStrictEqual(batch.fields.x, new Float32Array([1, 2, 3, 4]));
 *   assert.deepStrictEqual(batch.indices, new Int32Array([0, 1]));
 * }
 * ```
 */
export class RingBatch<F extends Record<string, TypedArray> = Record<string, TypedArray>> {
  /** The ring the batch lives in. */
  readonly ring: StagingRing;
  /** Slot number. */
  readonly slot: number;
  /** Byte offset of the slot in `ring.buffer`. */
  readonly byteOffset: number;
  /** Epoch of the batch. */
  readonly epoch: number;
  /** Batch number within the epoch. */
  readonly index: number;
  /** Valid records (batchSize, or fewer for a last partial batch). */
  readonly size: number;
  /** Views of the dataset's fields, `size` records each. */
  readonly fields: Readonly<F>;
  /** Dataset index of each sample. */
  readonly indices: Int32Array;
  /**
   * The per-sample augmentation records ({@linkcode AUGMENT_RECORD_LENGTH} int32 words each, see
   * the module documentation) when the loader has `augment`, else undefined.
   */
  readonly augment: Int32Array | undefined;
  /**
   * The per-sample geometry records (8 int32 words each, see
   * augment/geometry.ts) when the loader has `geometry`, else undefined.
   */
  readonly geometry: Int32Array | undefined;
  #release: ((batch: RingBatch) => void) | undefined;

  /** @internal Built by the loader. */
  constructor(
    ring: StagingRing,
    slot: number,
    epoch: number,
    index: number,
    size: number,
    release: (batch: RingBatch) => void,
  ) {
    this.ring = ring;
    this.slot = slot;
    this.byteOffset = ring.slotOffset(slot);
    this.epoch = epoch;
    this.index = index;
    this.size = size;
    const fields: Record<string, TypedArray> = {};
    let augment: Int32Array | undefined, geometry: Int32Array | undefined;
    let indices: Int32Array | undefined;
    for (const f of ring.fields) {
      const v = ring.view(slot, f.name, size);
      if (f.name === "indices") indices = v as Int32Array;
      else if (f.name === "augment") augment = v as Int32Array;
      else if (f.name === "geometry") geometry = v as Int32Array;
      else fields[f.name] = v;
    }
    // The loader builds the ring from the dataset's shared fields, which is what F describes.
    this.fields = fields as F;
    this.indices = indices!;
    this.augment = augment;
    this.geometry = geometry;
    this.#release = release;
  }

  /** Whether `release()` was called. */
  get released(): boolean {
    return this.#release === undefined;
  }

  /** Gives the slot back to the loader. Idempotent. */
  release(): void {
    const r = this.#release;
    this.#release = undefined;
    r?.(this);
  }

  /** Same as `release()`. */
  [Symbol.dispose](): void {
    this.release();
  }
}
