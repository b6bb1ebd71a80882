/**
 * `defaultCollate`: PyTorch's `default_collate` for TypeScript values.
 *
 * @module
 */

import { type DTypeOf, dtypeOf, type FieldArray, type TypedArray } from "./dataset.ts";

/**
 * The batch {@linkcode defaultCollate} makes of samples of type `T`, rule by rule: a typed
 * array of the loader's kinds stays that kind (the samples concatenated), `number` becomes
 * `Float64Array`, `bigint` `BigInt64Array`, `boolean` `Uint8Array`, `string` `string[]`;
 * a tuple or array collates per position, an object per key (so `{ image: Uint8Array;
 * label: number }` gives `{ image: Uint8Array; label: Float64Array }`). A union collates
 * member by member (at run time the first sample picks the rule and a mismatch throws);
 * what collate refuses (null, undefined, functions, symbols) gives `never`; `unknown` stays
 * `unknown`.
 *
 * @typeParam T the sample type
 */
// `any` samples give `any` batches: nothing is known, nothing is checked.
// deno-lint-ignore no-explicit-any
export type Collated<T> = 0 extends 1 & T ? any
  : unknown extends T ? unknown
  // `boolean` is `true | false`: one Uint8Array, not one per member.
  : [T] extends [boolean] ? Uint8Array
  : T extends TypedArray ? FieldArray<DTypeOf<T>>
  // Typed arrays collate does not stack (Uint8ClampedArray, BigInt64Array...) are objects
  // to it: keyed by element index.
  : T extends ArrayBufferView
    ? T extends { [index: number]: infer E } ? { [key: string]: Collated<E> } : never
  : T extends number ? Float64Array
  : T extends bigint ? BigInt64Array
  : T extends boolean ? Uint8Array
  : T extends string ? string[]
  : T extends null | undefined | symbol | ((...args: never[]) => unknown) ? never
  : T extends readonly unknown[] ? { -readonly [K in keyof T]: Collated<T[K]> }
  : T extends object ? { -readonly [K in keyof T]: Collated<T[K]> }
  : unknown;

/** Turns the list of samples of one batch into the batch. */
export type CollateFn<T = unknown, B = unknown> = (samples: T[]) => B;

/**
 * Stacks a list of samples into a batch the way `torch.utils.data.default_collate` does:
 * typed arrays of one type concatenate into one typed array of that type (`[B, ...shape]`
 * flattened, so sample k is elements `k*n .. (k+1)*n`); numbers become a `Float64Array`
 * (JavaScript has one number type), bigints a `BigInt64Array`, booleans a `Uint8Array`;
 * strings stay a list; objects collate per key; arrays (tuples) collate per position.
 * Typed arrays of different lengths or types fail, naming the key and the sizes.
 *
 * @typeParam T the sample type
 * @param samples the samples of one batch (at least one)
 * @returns the batch, of type {@linkcode Collated}`<T>`
 * @throws {TypeError} on mixed types, ragged typed arrays, or an empty list
 * @example Objects of arrays and labels
 * ```ts
 * import { defaultCollate } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const b = defaultCollate([
 *   { x: new Uint8Array([1, 2]), y: 0 },
 *   { x: new Uint8Array([3, 4]), y: 1 },
 * ]);
 * const typed: { x: Uint8Array; y: Float64Array } = b;
 * assert.deepStrictEqual(b.x, new Uint8Array([1, 2, 3, 4]));
 * assert.deepStrictEqual(typed.y, new Float64Array([0, 1]));
 * ```
 */
export function defaultCollate<T>(samples: T[]): Collated<T> {
  if (!Array.isArray(samples) || samples.length === 0) {
    throw new TypeError("Cannot collate: expected a non-empty list of samples");
  }
  // collateAt applies the rules Collated<T> spells out at the type level.
  return collateAt(samples, "batch") as Collated<T>;
}

function collateAt(samples: unknown[], path: string): unknown {
  const first = samples[0];
  const dtype = dtypeOf(first);
  if (dtype !== undefined) {
    const n = (first as TypedArray).length;
    const ctor = (first as TypedArray).constructor as { new (n: number): TypedArray };
    const out = new ctor(n * samples.length);
    for (let k = 0; k < samples.length; k++) {
      const s = samples[k] as TypedArray;
      if (dtypeOf(s) !== dtype || s.length !== n) {
        throw new TypeError(
          `Cannot collate ${path}: sample 0 is a ${dtype}[${n}] but sample ${k} is ` +
            `${dtypeOf(s) ?? typeof s}[${(s as { length?: number })?.length}]`,
        );
      }
      // deno-lint-ignore no-explicit-any
      (out as any).set(s, k * n);
    }
    return out;
  }
  switch (typeof first) {
    case "number": {
      const out = new Float64Array(samples.length);
      for (let k = 0; k < samples.length; k++) out[k] = expect(samples[k], "number", path, k);
      return out;
    }
    case "bigint": {
      const out = new BigInt64Array(samples.length);
      for (let k = 0; k < samples.length; k++) out[k] = expect(samples[k], "bigint", path, k);
      return out;
    }
    case "boolean": {
      const out = new Uint8Array(samples.length);
      for (let k = 0; k < samples.length; k++) {
        out[k] = expect(samples[k], "boolean", path, k) ? 1 : 0;
      }
      return out;
    }
    case "string":
      return samples.map((s, k) => expect(s, "string", path, k));
  }
  if (Array.isArray(first)) {
    const len = first.length;
    for (let k = 0; k < samples.length; k++) {
      const s = samples[k];
      if (!Array.isArray(s) || s.length !== len) {
        throw new TypeError(
          `Cannot collate ${path}: each element in list of batch should be of equal size ` +
            `(sample 0 has ${len}, sample ${k} has ${Array.isArray(s) ? s.length : typeof s})`,
        );
      }
    }
    return first.map((_, j) => collateAt(samples.map((s) => (s as unknown[])[j]), `${path}[${j}]`));
  }
  if (first !== null && typeof first === "object") {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(first)) {
      out[key] = collateAt(
        samples.map((s, k) => {
          if (s === null || typeof s !== "object" || !(key in s)) {
            throw new TypeError(`Cannot collate ${path}.${key}: sample ${k} has no key "${key}"`);
          }
          return (s as Record<string, unknown>)[key];
        }),
        `${path}.${key}`,
      );
    }
    return out;
  }
  throw new TypeError(
    `Cannot collate ${path}: default collate found ${first === null ? "null" : typeof first}; ` +
      "samples must contain typed arrays, numbers, bigints, booleans, strings, arrays or objects",
  );
}

// deno-lint-ignore no-explicit-any
function expect(value: unknown, type: string, path: string, k: number): any {
  const actual = typeof value;
  if (actual !== type) {
    throw new TypeError(
      `Cannot collate ${path}: sample 0 is a ${type} but sample ${k} is a ${typeof value}`,
    );
  }
  return value;
}
