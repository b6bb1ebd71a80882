/**
 * {@linkcode gatherRows}: rows of a device-resident table gathered by index on the device,
 * through the device's backend (ops/backend.ts). Nothing here waits for the device.
 *
 * @module
 */

import { DeviceBuffer } from "../ffi/memory.ts";
import type { OpOptions } from "./backend.ts";
import { queue, streamOn } from "./_launch.ts";
import { I32_MAX, intIn, region } from "./_memory.ts";

/** Indices and row geometry of {@linkcode gatherRows}. */
export interface GatherRowsOptions extends OpOptions {
  /** int32 row indices on the device, `count` of them, each in [0, rows). */
  indices: DeviceBuffer;
  /** Rows to gather. */
  count: number;
  /** Bytes per row (> 0). */
  rowBytes: number;
  /** Rows in `src` (default: as many whole rows as `src` holds after `srcOffset`). */
  rows?: number;
  /** Byte offset of row 0 in `src` (default 0). */
  srcOffset?: number;
  /** Byte offset of the first gathered row in `dst` (default 0). */
  dstOffset?: number;
  /** Byte offset of the first index in `indices` (default 0). */
  indicesOffset?: number;
}

/**
 * Gathers rows of a device-resident dataset on the device: row k of `dst` becomes row
 * `indices[k]` of `src`, `rowBytes` bytes each. An index outside [0, rows) fails on the CPU
 * backend; on CUDA that row is skipped and left as it was (the kernel cannot fail).
 *
 * @param src `rows` rows of `rowBytes` bytes.
 * @param dst `count` rows, written; must not overlap `src`.
 * @param options indices (count int32), count, rowBytes, rows, srcOffset, dstOffset,
 *   indicesOffset, stream.
 * @throws {TypeError} On a wrong memory kind, or memory of another device.
 * @throws {RangeError} On a bad count, row size or row count, or a buffer too small.
 * @throws {PinstreamError} When the backend refuses the launch (CPU: an index out of range).
 * @example Rows 2 and 0 of a 3-row table
 * ```ts
 * import { Device, DeviceBuffer, gatherRows } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using table = DeviceBuffer.alloc(dev, 6);
 * table.copyFrom(new Uint8Array([1, 2, 3, 4, 5, 6]));
 * using idx = DeviceBuffer.alloc(dev, 8);
 * idx.copyFrom(new Int32Array([2, 0]));
 * using out = DeviceBuffer.alloc(dev, 4);
 * gatherRows(table, out, { indices: idx, count: 2, rowBytes: 2 });
 * const back = new Uint8Array(4);
 * out.copyTo(back);
 * await dev.defaultStream.synchronize();
 * assert.deepStrictEqual([...back], [5, 6, 1, 2]);
 * ```
 */
export function gatherRows(
  src: DeviceBuffer,
  dst: DeviceBuffer,
  options: GatherRowsOptions,
): void {
  const action = "run gatherRows";
  for (const [b, name] of [[src, "src"], [dst, "dst"], [options?.indices, "indices"]] as const) {
    if (!(b instanceof DeviceBuffer)) {
      throw new TypeError(`Cannot ${action}: ${name} must be a DeviceBuffer, got ${b}`);
    }
  }
  const device = src.device;
  const count = intIn(options.count, "count", 0, I32_MAX, action);
  const rowBytes = intIn(options.rowBytes, "rowBytes", 1, Number.MAX_SAFE_INTEGER, action);
  const srcOffset = intIn(options.srcOffset ?? 0, "src offset", 0, src.bytes, action);
  const rows = intIn(
    options.rows ?? Math.floor((src.bytes - srcOffset) / rowBytes),
    "rows",
    0,
    Number.MAX_SAFE_INTEGER,
    action,
  );
  const srcAt = region(src, "src", srcOffset, rows * rowBytes, device, action);
  const dstAt = region(dst, "dst", options.dstOffset, count * rowBytes, device, action);
  const idxAt = region(
    options.indices,
    "indices",
    options.indicesOffset,
    count * 4,
    device,
    action,
  );
  const stream = streamOn(options, device, action);
  device.makeCurrent();
  queue(device, "gatherRows", {
    src: srcAt,
    rows,
    row_bytes: rowBytes,
    indices: idxAt,
    n: count,
    dst: dstAt,
    stream,
  }, `${action} ${count} of ${rows} rows x ${rowBytes} bytes`);
}
