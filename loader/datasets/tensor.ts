/**
 * `TensorDataset`: an in-memory dataset over typed arrays, kept in shared memory so the
 * zero-copy path and workers see it without copies.
 *
 * @module
 */

import {
  type Dataset,
  type DTypeOf,
  dtypeOf,
  DTYPES,
  type FieldArray,
  type FieldDType,
  sharedArray,
  type SharedField,
  type TypedArray,
  type WorkerSpec,
} from "../dataset.ts";

/** A field given to {@linkcode TensorDataset}: a typed array, optionally with a sample shape. */
export type TensorField = TypedArray | { data: TypedArray; shape: readonly number[] };

/**
 * The sample type of a {@linkcode TensorDataset} over fields `F`: per field, a `number` for
 * a scalar field (a bare typed array, or `shape: []`), else a view of the field's typed
 * array (`number` or a view when the shape is not known to be empty or not).
 *
 * @typeParam F the fields given to the constructor
 */
export type TensorSample<F extends Record<string, TensorField>> = {
  -readonly [K in keyof F]: F[K] extends TypedArray ? number
    : F[K] extends { shape: readonly [] } ? number
    : F[K] extends { data: infer A; shape: readonly [number, ...number[]] } ? FieldArray<DTypeOf<A>>
    : F[K] extends { data: infer A } ? FieldArray<DTypeOf<A>> | number
    : never;
};

/**
 * The {@linkcode SharedField}s of a {@linkcode TensorDataset} over fields `F`, one per field
 * with its name and dtype, which type the DataLoader's batch fields.
 *
 * @typeParam F the fields given to the constructor
 */
export type TensorSharedField<F extends Record<string, TensorField>> = {
  [K in keyof F & string]: SharedField<
    K,
    DTypeOf<F[K] extends { data: infer A } ? A : F[K]>
  >;
}[keyof F & string];

/** The serializable state a worker rebuilds a TensorDataset from. */
export interface TensorDatasetState {
  /** Sample count. */
  length: number;
  /** Fields in shared memory. */
  fields: {
    name: string;
    dtype: FieldDType;
    shape: number[];
    buffer: SharedArrayBuffer;
    byteOffset: number;
  }[];
}

/**
 * Samples are the i-th records of each field: `{ name: view }` for fields with a shape,
 * `{ name: number }` for scalar fields (shape `[]`, the default for a bare typed array).
 * Arrays not already in a SharedArrayBuffer are copied into one at construction (from
 * {@linkcode sharedArray}). Arrays already in one are used in place; allocate them with
 * `sharedArray` too: its memory is a shared WebAssembly.Memory, which the loader's workers gather
 * from with a native copy, where a plain `new SharedArrayBuffer` is copied by a JavaScript loop
 * (the loader alone with one worker, CIFAR-sized samples: 1.1M against 1.8-2.0M samples/s).
 * `get` returns views into shared memory: copy them to keep them past the batch.
 *
 * The field names and array types are kept in the type: a DataLoader over
 * `new TensorDataset({ image: { data: u8, shape: [3, 8, 8] }, label: i32 })` yields
 * `RingBatch<{ image: Uint8Array; label: Int32Array }>`.
 *
 * @typeParam F the fields: name -> typed array or `{ data, shape }`
 *
 * @example Images and labels
 * ```ts
 * import { TensorDataset } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const ds = new TensorDataset({
 *   image: { data: new Uint8Array(2 * 4), shape: [2, 2] },
 *   label: new Int32Array([3, 5]),
 * });
 * assert.strictEqual(ds.length, 2);
 * assert.strictEqual(ds.get(1).label, 5);
 * ```
 */
export class TensorDataset<
  const F extends Record<string, TensorField> = Record<string, TensorField>,
> implements Dataset<TensorSample<F>> {
  /** Sample count. */
  readonly length: number;
  #fields: SharedField[];
  #views: { name: string; data: TypedArray; per: number; scalar: boolean }[];

  /**
   * Creates it; see the class documentation.
   *
   * @param fields name -> typed array (scalar per sample) or {data, shape}
   * @throws {TypeError} for a value that is not a typed array
   * @throws {RangeError} when fields disagree on the sample count
   */
  constructor(fields: F) {
    const out: SharedField[] = [];
    let length = -1;
    for (const [name, f] of Object.entries(fields)) {
      if (
        !ArrayBuffer.isView(f) &&
        !(f !== null && typeof f === "object" && ArrayBuffer.isView(f.data))
      ) {
        throw new TypeError(`Cannot create TensorDataset: field "${name}" is not a typed array`);
      }
      const data = ArrayBuffer.isView(f) ? f : f.data;
      const shape = ArrayBuffer.isView(f) ? [] : [...f.shape];
      const dtype = dtypeOf(data);
      if (dtype === undefined) {
        throw new TypeError(`Cannot create TensorDataset: field "${name}" is not a typed array`);
      }
      const per = shape.reduce((a, b) => a * b, 1);
      const n = data.length / per;
      if (!Number.isInteger(n) || (length >= 0 && n !== length)) {
        throw new RangeError(
          `Cannot create TensorDataset: field "${name}" has ${data.length} elements, not a ` +
            `multiple of ${per} giving ${length >= 0 ? length : "an integer number of"} samples`,
        );
      }
      length = n;
      let shared = data;
      if (!(data.buffer instanceof SharedArrayBuffer)) {
        shared = sharedArray(dtype, data.length);
        // deno-lint-ignore no-explicit-any
        (shared as any).set(data);
      }
      out.push({
        name,
        dtype,
        shape,
        buffer: shared.buffer as SharedArrayBuffer,
        byteOffset: shared.byteOffset,
      });
    }
    this.length = Math.max(0, length);
    this.#fields = out;
    this.#views = out.map((f) => {
      const per = f.shape.reduce((a, b) => a * b, 1);
      const { ctor } = DTYPES[f.dtype];
      return {
        name: f.name,
        per,
        scalar: f.shape.length === 0,
        data: new ctor(f.buffer, f.byteOffset ?? 0, this.length * per),
      };
    });
  }

  /**
   * Rebuilds a dataset from {@linkcode TensorDatasetState} (used by workers).
   *
   * @param state the state from `workerSpec()`
   * @returns a dataset sharing the same memory
   */
  static fromState(state: TensorDatasetState): TensorDataset {
    const fields: Record<string, TensorField> = {};
    for (const f of state.fields) {
      const { ctor, bytes } = DTYPES[f.dtype];
      const per = f.shape.reduce((a, b) => a * b, 1);
      const data = new ctor(f.buffer, f.byteOffset, state.length * per);
      void bytes;
      fields[f.name] = { data, shape: f.shape };
    }
    return new TensorDataset(fields);
  }

  /**
   * Sample `index`.
   *
   * @param index sample index in [0, length)
   * @returns `{ name: view | number }`
   * @throws {RangeError} for an index out of range
   */
  get(index: number): TensorSample<F> {
    if (!(index >= 0 && index < this.length) || !Number.isInteger(index)) {
      throw new RangeError(
        `Cannot get sample ${index}: index out of range for a dataset of length ${this.length}`,
      );
    }
    const out: Record<string, TypedArray | number> = {};
    for (const v of this.#views) {
      out[v.name] = v.scalar ? v.data[index] : v.data.subarray(index * v.per, (index + 1) * v.per);
    }
    // out has one entry per field of F, a number exactly for the scalar ones.
    return out as TensorSample<F>;
  }

  /**
   * The zero-copy layout: the fields in shared memory.
   *
   * @returns the fields in shared memory (the zero-copy layout)
   */
  sharedFields(): readonly TensorSharedField<F>[] {
    // #fields holds one entry per field of F, named after it, with the dtype of its array.
    return this.#fields as readonly SharedField[] as readonly TensorSharedField<F>[];
  }

  /**
   * How workers rebuild this dataset.
   *
   * @returns how a worker rebuilds this dataset
   */
  workerSpec(): WorkerSpec {
    const state: TensorDatasetState = {
      length: this.length,
      fields: this.#fields.map((f) => ({
        name: f.name,
        dtype: f.dtype,
        shape: [...f.shape],
        buffer: f.buffer,
        byteOffset: f.byteOffset ?? 0,
      })),
    };
    return { module: import.meta.url, export: "TensorDataset.fromState", state };
  }
}
