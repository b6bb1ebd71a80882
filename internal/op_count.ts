/**
 * Counts of what the backend library is asked to do, by kind: kernel launches, copies,
 * memsets, allocations and frees, and host synchronizations. ffi/library.ts counts every call
 * of a backend symbol here as it is made, so the counts are the same on every backend (the CPU
 * backend's "launch" is a plain call, counted like a CUDA launch) and count whatever the ABI is
 * asked to do: one ABI call is one operation, however many kernels a backend runs for it (the
 * CUDA batch norm's two phases are one call). ffi/profiler.ts's `Profiler` reports them per
 * range and for its whole window.
 *
 * Always on: a count is one array increment next to an FFI call.
 *
 * @example
 * ```ts
 * import { countCall, OP_KINDS, opCounts, opKindOf } from "./op_count.ts";
 * import assert from "node:assert";
 * const before = opCounts();
 * countCall(opKindOf("ps_nn_relu_forward"));
 * countCall(opKindOf("ps_device_props_get")); // a query: not an operation
 * assert.strictEqual(opCounts().kernels - before.kernels, 1);
 * assert.strictEqual(OP_KINDS[opKindOf("ps_stream_synchronize")], "syncs");
 * ```
 *
 * @module
 */

/** What one backend call is. */
export type OpKind = "kernels" | "copies" | "memsets" | "allocations" | "frees" | "syncs";

/** Operations by kind. */
export type OpCounts = Record<OpKind, number>;

/** The kinds, in the order tables print them. */
export const OP_KINDS: readonly OpKind[] = [
  "kernels",
  "copies",
  "memsets",
  "allocations",
  "frees",
  "syncs",
];

const counts = new Float64Array(OP_KINDS.length);

/**
 * The kind of a backend symbol's call, or undefined for calls that queue no device work and
 * wait for none (queries, properties, stream and event bookkeeping).
 *
 * @param symbol A `ps_*` name of ffi/symbols.ts.
 * @returns Its index in {@linkcode OP_KINDS}, or -1.
 */
export function opKindOf(symbol: string): number {
  let kind: OpKind | undefined;
  if (/synchronize$/.test(symbol)) kind = "syncs";
  else if (/^ps_memcpy_/.test(symbol) || symbol === "ps_image_labels_i32") kind = "copies";
  else if (/^ps_memset/.test(symbol)) kind = "memsets";
  else if (/^ps_(device|host)_alloc$/.test(symbol)) kind = "allocations";
  else if (/^ps_(device|host)_free$/.test(symbol)) kind = "frees";
  else if (/^ps_(nn|image|gather|tensor_fill|graph_launch)/.test(symbol)) {
    // ps_nn_batchnorm_workspace is a size query.
    if (!/_workspace$/.test(symbol)) kind = "kernels";
  }
  return kind === undefined ? -1 : OP_KINDS.indexOf(kind);
}

/**
 * Counts one call of a kind from {@linkcode opKindOf} (-1: nothing).
 *
 * @param kind The index.
 */
export function countCall(kind: number): void {
  if (kind >= 0) counts[kind]++;
}

/**
 * The counts since the process started (subtract two readings for an interval).
 *
 * @returns A fresh object.
 */
export function opCounts(): OpCounts {
  const out = {} as OpCounts;
  OP_KINDS.forEach((k, i) => out[k] = counts[i]);
  return out;
}

/**
 * `after - before`, kind by kind.
 *
 * @param after The later reading.
 * @param before The earlier reading.
 * @returns The operations in between.
 */
export function opDelta(after: OpCounts, before: OpCounts): OpCounts {
  const out = {} as OpCounts;
  for (const k of OP_KINDS) out[k] = after[k] - before[k];
  return out;
}
