/**
 * The same-type copies of ps_nn_cast and ps_image_labels_i32 with source and destination
 * overlapping inside one allocation, against memmove done in TypeScript on a copy (both
 * backends promise memmove's semantics; cudaMemcpyAsync alone leaves overlap undefined).
 * Shared by tests/overlap_copy_test.ts and the no-memory-pools child
 * (tests/_no_memory_pools_child.ts), where the CUDA copy's scratch buffer comes from
 * cudaMalloc.
 *
 * @module
 */

import assert from "node:assert";
import type { Library } from "../ffi/library.ts";
import { unwrap } from "../ffi/errors.ts";
import { rng } from "./_image_reference.ts";
import { Scratch } from "./_scratch.ts";

/** The copy kinds exercised: element size and how one copy is issued. */
const KINDS = [
  { what: "ps_nn_cast f16 -> f16", bytes: 2, dtype: 1 },
  { what: "ps_nn_cast f32 -> f32", bytes: 4, dtype: 0 },
  { what: "ps_image_labels_i32 int32", bytes: 4, dtype: -1 },
] as const;

/** Element shifts of the destination against the source: forwards and backwards. */
const SHIFTS = [-5, -3, -1, 0, 1, 2, 7];

/**
 * Copies `count` elements from element `from` to element `to` of one device buffer of `total`
 * elements, for every kind and shift, and asserts the buffer equals memmove's result.
 *
 * @param lib The backend's library.
 */
export async function checkOverlappingCopies(lib: Library): Promise<void> {
  const r = rng(77);
  const total = 1031, count = 1000;
  for (const kind of KINDS) {
    for (const shift of SHIFTS) {
      const from = shift < 0 ? -shift + 11 : 11, to = from + shift;
      const init = new Uint8Array(total * kind.bytes);
      for (let i = 0; i < init.length; i++) init[i] = (r() * 256) | 0;
      const expected = init.slice();
      expected.copyWithin(to * kind.bytes, from * kind.bytes, (from + count) * kind.bytes);
      const mem = new Scratch(lib);
      try {
        const buf = mem.upload(init);
        const src = Deno.UnsafePointer.offset(buf!, from * kind.bytes);
        const dst = Deno.UnsafePointer.offset(buf!, to * kind.bytes);
        const status = kind.dtype < 0
          ? lib.symbols.ps_image_labels_i32(src, 4, count, dst, null)
          : lib.symbols.ps_nn_cast(src, kind.dtype, dst, kind.dtype, BigInt(count), null);
        unwrap(lib, status, kind.what);
        const got = await mem.download(buf, new Uint8Array(init.length));
        const bad = got.findIndex((b, i) => b !== expected[i]);
        assert.strictEqual(
          bad,
          -1,
          `${kind.what}: ${count} elements from element ${from} to ${to} of one buffer: ` +
            `byte ${bad} is ${got[bad]}, expected ${expected[bad]} (memmove's result)`,
        );
      } finally {
        mem.free();
      }
    }
  }
}
