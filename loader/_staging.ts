// The zero-copy path's shared memory: checks the dataset's shared fields and record map, sizes
// and allocates the staging ring, and describes for the gather where each field goes.

import { AUGMENT_OFF } from "../augment/options.ts";
import { AUGMENT_RECORD_LENGTH } from "../augment/record.ts";
import { GEOMETRY_RECORD_LENGTH, type GeometrySpec } from "../augment/geometry.ts";
import type { GatherSpec } from "./_gather.ts";
import { memoryOfBuffer } from "../internal/wasm_memory.ts";
import { type Dataset, type FilledField, recordBytes, type SharedField } from "./dataset.ts";
import type { EpochOrder } from "./order.ts";
import { StagingRing } from "./ring.ts";

/** The ring, its slots' states and the gather's description, for one DataLoader. */
export interface Staging {
  ring: StagingRing;
  /** SLOT_FREE / SLOT_LOADER / SLOT_CONSUMER per slot. */
  slotState: Uint8Array;
  gather: GatherSpec;
  /** The record of each sample (a Subset), or undefined when sample i is record i. */
  recordMap: Int32Array | undefined;
  /** Ring batches a consumer may hold without starving the loader. */
  maxHeldBatches: number;
}

/**
 * Allocates the staging ring of a zero-copy loader.
 *
 * @param dataset A dataset with `sharedFields()`.
 * @param order The loader's order (batch sizes, augment records, seed).
 * @param workers The most workers the loader may run.
 * @param prefetch The most batches in flight per worker (0 without workers).
 * @param heldBatches Slots for batches the consumer holds.
 * @param geometry The geometric transforms drawn per sample, if any.
 * @returns The ring and what the engine and the gather need of it.
 * @throws {TypeError} / {RangeError} For fields or records the ring cannot hold, or a ring
 * too large to allocate (naming what to lower).
 */
export function staging(
  dataset: Dataset,
  order: EpochOrder,
  workers: number,
  prefetch: number,
  heldBatches: number,
  geometry?: GeometrySpec,
): Staging {
  const fields = dataset.sharedFields!();
  const { recordMap, recordCount } = checkRecords(dataset);
  for (const f of fields) checkField(f, recordCount, recordMap !== undefined);
  const filled = checkFilled(dataset, fields);
  const ringFields = [
    ...fields.map((f) => ({ name: f.name, dtype: f.dtype, shape: f.shape })),
    ...filled.map((f) => ({ name: f.name, dtype: f.dtype, shape: f.shape })),
    { name: "indices", dtype: "i32" as const, shape: [] },
    ...(order.augment
      ? [{ name: "augment", dtype: "i32" as const, shape: [AUGMENT_RECORD_LENGTH] }]
      : []),
    ...(geometry
      ? [{ name: "geometry", dtype: "i32" as const, shape: [GEOMETRY_RECORD_LENGTH] }]
      : []),
  ];
  const sizes = geometry ? geometrySizes([...fields, ...filled]) : undefined;
  // A batch never holds more indices than an epoch has: batchSize 1e6 on 10 samples needs
  // slots of 10 records, not of a million (a sampler that yields more than its length is
  // refused when the epoch is planned).
  const maxBatch = order.maxBatchSize();
  // In flight + held by the consumer + one per worker: a worker takes its next slot before it
  // takes its next task, so an idle worker holds one.
  const slots = prefetch * Math.max(1, workers) + Math.max(1, heldBatches) + workers;
  let ring: StagingRing;
  try {
    ring = new StagingRing(ringFields, maxBatch, slots);
  } catch (e) {
    const perSample = ringFields.reduce((n, f) => n + recordBytes(f), 0);
    throw new RangeError(
      `Cannot create DataLoader: the staging ring needs about ${
        ((slots * maxBatch * perSample) / 2 ** 20).toFixed(0)
      } MiB (${slots} slots of ${maxBatch} samples of ${perSample} bytes) and could not be ` +
        `allocated (${(e as Error)?.message ?? e}); lower batchSize, prefetchFactor, ` +
        "numWorkers or heldBatches",
    );
  }
  const gather: GatherSpec = {
    ring: ring.buffer,
    ringMemory: ring.memory,
    slotBytes: ring.slotBytes,
    sources: fields.map((f) => {
      const rf = ring.field(f.name);
      return {
        buffer: f.buffer,
        memory: memoryOfBuffer(f.buffer),
        byteOffset: f.byteOffset ?? 0,
        recordBytes: rf.sampleBytes,
        slotFieldOffset: rf.byteOffset,
      };
    }),
    indicesOffset: ring.field("indices").byteOffset,
    augmentOffset: order.augment ? ring.field("augment").byteOffset : -1,
    augment: { ...(order.augment ?? AUGMENT_OFF) },
    geometryOffset: geometry ? ring.field("geometry").byteOffset : -1,
    geometry,
    sizeOffset: sizes?.field ? ring.field(sizes.field).byteOffset : -1,
    fixedSize: sizes?.fixed,
    length: recordCount,
    seed: order.seed,
    filled: filled.map((f) => {
      const rf = ring.field(f.name);
      return { recordBytes: rf.sampleBytes, slotFieldOffset: rf.byteOffset };
    }),
  };
  return {
    ring,
    slotState: new Uint8Array(slots),
    gather,
    recordMap,
    // Loading needs a free slot per batch in flight and per idle worker (one without workers).
    maxHeldBatches: Math.max(1, slots - Math.max(1, prefetch * workers + workers)),
  };
}

/** Ring field names a dataset may not use. */
const RESERVED = ["indices", "augment", "geometry"];

/**
 * Where the geometry records' image sizes come from: the dataset's int32 [2] `imageSize`
 * field (variable-size images), else the fixed [H, W(, C)] shape of its u8 `image` field.
 */
function geometrySizes(
  fields: readonly { name: string; dtype: string; shape: readonly number[] }[],
): { field?: string; fixed?: [number, number] } {
  const image = fields.find((f) => f.name === "image");
  if (
    image === undefined || image.dtype !== "u8" || image.shape.length < 2 ||
    image.shape.length > 3 || (image.shape[2] ?? 1) > 4
  ) {
    throw new RangeError(
      'Cannot create DataLoader: geometry needs the dataset\'s images in a u8 field "image" ' +
        `of [height, width, channels] (1 to 4 channels), got ${
          image ? `${image.dtype} [${image.shape}]` : "no such field"
        }`,
    );
  }
  const size = fields.find((f) => f.name === "imageSize");
  if (size === undefined) return { fixed: [image.shape[0], image.shape[1]] };
  if (size.dtype !== "i32" || size.shape.length !== 1 || size.shape[0] !== 2) {
    throw new RangeError(
      'Cannot create DataLoader: the dataset\'s field "imageSize" should be i32 [2] ' +
        `(each image's height and width), got ${size.dtype} [${size.shape}]`,
    );
  }
  return { field: "imageSize" };
}

/** The fields the dataset fills itself (`filledFields()`), refusing reserved or repeated names. */
function checkFilled(dataset: Dataset, fields: readonly SharedField[]): readonly FilledField[] {
  const filled = dataset.filledFields?.() ?? [];
  if (filled.length > 0 && typeof dataset.fillRecord !== "function") {
    throw new TypeError(
      "Cannot create DataLoader: the dataset has filledFields() but no fillRecord()",
    );
  }
  const names = new Set(fields.map((f) => f.name));
  for (const f of filled) {
    if (RESERVED.includes(f.name)) {
      throw new RangeError(
        `Cannot create DataLoader: dataset field name "${f.name}" is reserved for the ring`,
      );
    }
    if (names.has(f.name)) {
      throw new RangeError(
        `Cannot create DataLoader: dataset field name "${f.name}" is used twice`,
      );
    }
    names.add(f.name);
  }
  return filled;
}

/** The dataset's sample -> record map (`records()`, checked; undefined without one) and count. */
function checkRecords(
  dataset: Dataset,
): { recordMap: Int32Array | undefined; recordCount: number } {
  const records = dataset.records?.();
  if (records === undefined) return { recordMap: undefined, recordCount: dataset.length };
  if (!(records.indices instanceof Int32Array) || records.indices.length !== dataset.length) {
    throw new TypeError(
      `Cannot create DataLoader: dataset.records() should map each of the ${dataset.length} ` +
        "samples to a record (an Int32Array of that length)",
    );
  }
  for (const r of records.indices) {
    if (!(r >= 0 && r < records.count)) {
      throw new RangeError(
        `Cannot create DataLoader: dataset.records() maps a sample to record ${r}, ` +
          `outside the ${records.count} records of its shared fields`,
      );
    }
  }
  return { recordMap: records.indices, recordCount: records.count };
}

/** Refuses a shared field the ring cannot gather from. */
function checkField(f: SharedField, recordCount: number, mapped: boolean): void {
  if (RESERVED.includes(f.name)) {
    throw new RangeError(
      `Cannot create DataLoader: dataset field name "${f.name}" is reserved for the ring`,
    );
  }
  if (!(f.buffer instanceof SharedArrayBuffer)) {
    throw new TypeError(
      `Cannot create DataLoader: shared field "${f.name}" is not in a SharedArrayBuffer ` +
        "(allocate it with sharedArray())",
    );
  }
  const need = (f.byteOffset ?? 0) + recordCount * recordBytes(f);
  if (need > f.buffer.byteLength) {
    throw new RangeError(
      `Cannot create DataLoader: shared field "${f.name}" needs ${need} bytes for ` +
        `${recordCount} ${mapped ? "records" : "samples"}, its buffer has ` +
        `${f.buffer.byteLength}`,
    );
  }
}
