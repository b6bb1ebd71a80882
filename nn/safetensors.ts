/**
 * The safetensors file format, read and written in pure TypeScript.
 *
 * Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian unsigned
 * header length N, then N bytes of UTF-8 JSON mapping each tensor name to
 * `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the byte buffer that
 * follows the header) plus an optional `"__metadata__"` map of string to string, then the
 * little-endian tensor bytes. The writer pads the header with spaces to a multiple of 8 bytes,
 * as the reference implementation does, so every tensor starts 8-byte aligned.
 *
 * @module
 */

/** The dtype names of the safetensors format. */
export type SafetensorsDtype =
  | "BOOL"
  | "U8"
  | "I8"
  | "U16"
  | "I16"
  | "F16"
  | "BF16"
  | "U32"
  | "I32"
  | "F32"
  | "U64"
  | "I64"
  | "F64";

/** The typed arrays a host tensor's data can be held in. */
export type HostData =
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Float16Array
  | Uint32Array
  | Int32Array
  | Float32Array
  | BigUint64Array
  | BigInt64Array
  | Float64Array;

/** A tensor in host memory: dtype, shape and data (row-major, `data.length` = product of shape). */
export interface HostTensor {
  /** The element type. */
  dtype: SafetensorsDtype;
  /** The dimensions; `[]` for a scalar. */
  shape: number[];
  /** The elements, row-major. BF16 is held raw in a Uint16Array, BOOL in a Uint8Array. */
  data: HostData;
}

/** What {@linkcode decodeSafetensors} returns. */
export interface SafetensorsContents {
  /** The tensors, in file order. */
  tensors: Map<string, HostTensor>;
  /** The `__metadata__` map, `{}` when absent. */
  metadata: Record<string, string>;
}

const DTYPE_BYTES: Record<SafetensorsDtype, number> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  U16: 2,
  I16: 2,
  F16: 2,
  BF16: 2,
  U32: 4,
  I32: 4,
  F32: 4,
  U64: 8,
  I64: 8,
  F64: 8,
};

// deno-lint-ignore no-explicit-any
const DTYPE_ARRAY: Record<SafetensorsDtype, new (b: ArrayBuffer, o: number, n: number) => any> = {
  BOOL: Uint8Array,
  U8: Uint8Array,
  I8: Int8Array,
  U16: Uint16Array,
  I16: Int16Array,
  F16: Float16Array,
  BF16: Uint16Array,
  U32: Uint32Array,
  I32: Int32Array,
  F32: Float32Array,
  U64: BigUint64Array,
  I64: BigInt64Array,
  F64: Float64Array,
};

/** Largest header accepted, as in the reference implementation (guards against garbage). */
const MAX_HEADER = 100_000_000;

if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  // Tensor bytes are little-endian on disk and copied as-is.
  throw new Error("Cannot use safetensors: this host is big-endian");
}

function numelOf(shape: readonly number[], name: string): number {
  let n = 1;
  for (const d of shape) {
    if (!Number.isSafeInteger(d) || d < 0) {
      throw new RangeError(`Cannot encode tensor "${name}": invalid shape [${shape}]`);
    }
    n *= d;
  }
  return n;
}

/**
 * Serializes tensors to safetensors bytes.
 *
 * Tensors are written in the order given (the format allows any order; readers use the
 * offsets), and the header is padded with spaces to a multiple of 8 bytes.
 *
 * @param tensors The tensors by name (a Map or a plain record).
 * @param metadata Optional string-to-string metadata, stored under `"__metadata__"`.
 * @returns The file's bytes.
 * @throws {TypeError} When a dtype is unknown, a name is `"__metadata__"`, or a metadata value
 *   is not a string.
 * @throws {RangeError} When a tensor's data length does not match its shape.
 * @example Round trip
 * ```ts
 * import { decodeSafetensors, encodeSafetensors } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const bytes = encodeSafetensors(
 *   { w: { dtype: "F32", shape: [2, 2], data: new Float32Array([1, 2, 3, 4]) } },
 *   { format: "pt" },
 * );
 * const { tensors, metadata } = decodeSafetensors(bytes);
 * assert.deepStrictEqual([...tensors.get("w")!.data], [1, 2, 3, 4]);
 * assert.strictEqual(metadata.format, "pt");
 * ```
 */
export function encodeSafetensors(
  tensors: Map<string, HostTensor> | Record<string, HostTensor>,
  metadata?: Record<string, string>,
): Uint8Array {
  const entries = tensors instanceof Map ? [...tensors] : Object.entries(tensors);
  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) {
    for (const [k, v] of Object.entries(metadata)) {
      if (typeof v !== "string") {
        throw new TypeError(`Cannot encode metadata "${k}": value ${String(v)} is not a string`);
      }
    }
    header.__metadata__ = metadata;
  }
  let offset = 0;
  for (const [name, t] of entries) {
    if (name === "__metadata__") {
      throw new TypeError(`Cannot encode tensor "${name}": the name is reserved`);
    }
    const size = DTYPE_BYTES[t.dtype];
    if (size === undefined) {
      throw new TypeError(`Cannot encode tensor "${name}": unknown dtype ${t.dtype}`);
    }
    const numel = numelOf(t.shape, name);
    if (t.data.length !== numel || t.data.BYTES_PER_ELEMENT !== size) {
      throw new RangeError(
        `Cannot encode tensor "${name}": ${t.data.length} elements of ${t.data.BYTES_PER_ELEMENT} ` +
          `bytes for shape [${t.shape}] of ${t.dtype}`,
      );
    }
    header[name] = {
      dtype: t.dtype,
      shape: t.shape,
      data_offsets: [offset, offset + numel * size],
    };
    offset += numel * size;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const out = new Uint8Array(8 + padded + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(padded), true);
  out.set(json, 8);
  let at = 8 + padded;
  for (const [, t] of entries) {
    out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), at);
    at += t.data.byteLength;
  }
  return out;
}

/**
 * Parses safetensors bytes. The data is copied into fresh, aligned typed arrays, so the
 * result does not keep `bytes` alive.
 *
 * @param bytes The file's bytes.
 * @param source A name for error messages (e.g. the file path).
 * @returns The tensors and the metadata.
 * @throws {RangeError} When the file is truncated, the header is malformed, or offsets are
 *   out of bounds, overlapping or inconsistent with the shape.
 * @example
 * ```ts
 * import { decodeSafetensors } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.throws(() => decodeSafetensors(new Uint8Array(4)), RangeError);
 * ```
 */
export function decodeSafetensors(
  bytes: Uint8Array,
  source = "safetensors data",
): SafetensorsContents {
  if (bytes.length < 8) {
    throw new RangeError(`Cannot read ${source}: ${bytes.length} bytes, expected at least 8`);
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = Number(dv.getBigUint64(0, true));
  if (n > MAX_HEADER || 8 + n > bytes.length) {
    throw new RangeError(
      `Cannot read ${source}: header length ${n} exceeds the ${bytes.length}-byte file`,
    );
  }
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(8, 8 + n)));
  } catch (e) {
    throw new RangeError(`Cannot read ${source}: the header is not valid JSON (${e})`);
  }
  if (header === null || typeof header !== "object" || Array.isArray(header)) {
    throw new RangeError(`Cannot read ${source}: the header is not a JSON object`);
  }
  const dataStart = 8 + n;
  const dataLen = bytes.length - dataStart;
  const metadata: Record<string, string> = {};
  const ranges: [number, number, string][] = [];
  const tensors = new Map<string, HostTensor>();
  for (const [name, raw] of Object.entries(header)) {
    if (name === "__metadata__") {
      for (const [k, v] of Object.entries((raw ?? {}) as Record<string, unknown>)) {
        if (typeof v !== "string") {
          throw new RangeError(`Cannot read ${source}: metadata "${k}" is not a string`);
        }
        metadata[k] = v;
      }
      continue;
    }
    const info = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const dtype = info?.dtype as SafetensorsDtype;
    if (typeof dtype !== "string" || !(dtype in DTYPE_BYTES)) {
      throw new RangeError(`Cannot read ${source}: tensor "${name}" has dtype ${String(dtype)}`);
    }
    const shape = info.shape;
    const offs = info.data_offsets;
    if (
      !Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0) ||
      !Array.isArray(offs) || offs.length !== 2 ||
      !offs.every((o) => Number.isSafeInteger(o) && o >= 0)
    ) {
      throw new RangeError(`Cannot read ${source}: tensor "${name}" has a malformed entry`);
    }
    const [begin, end] = offs as [number, number];
    const numel = shape.reduce((a: number, b: number) => a * b, 1);
    if (end < begin || end > dataLen || end - begin !== numel * DTYPE_BYTES[dtype]) {
      throw new RangeError(
        `Cannot read ${source}: tensor "${name}" spans [${begin}, ${end}) of ${dataLen} data ` +
          `bytes, expected ${numel * DTYPE_BYTES[dtype]} bytes for shape [${shape}] ${dtype}`,
      );
    }
    ranges.push([begin, end, name]);
    const copy = bytes.slice(dataStart + begin, dataStart + end).buffer;
    tensors.set(name, { dtype, shape: [...shape], data: new DTYPE_ARRAY[dtype](copy, 0, numel) });
  }
  ranges.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < ranges.length; i++) {
    if (ranges[i][0] < ranges[i - 1][1]) {
      throw new RangeError(
        `Cannot read ${source}: tensors "${ranges[i - 1][2]}" and "${ranges[i][2]}" overlap`,
      );
    }
  }
  return { tensors, metadata };
}
