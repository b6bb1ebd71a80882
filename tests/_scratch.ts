/**
 * Device memory for the tests that call the C ABI directly (tests/_overlap_copy.ts):
 * allocations are remembered and freed together.
 *
 * @module
 */

import type { Library } from "../ffi/library.ts";
import { unwrap } from "../ffi/errors.ts";

/** Device memory owned by a test, freed in `free()`. */
export class Scratch {
  #ptrs: Deno.PointerValue[] = [];
  constructor(readonly lib: Library) {}

  /** A device allocation of at least one byte. */
  alloc(bytes: number): Deno.PointerValue {
    const out = new BigUint64Array(1);
    unwrap(this.lib, this.lib.symbols.ps_device_alloc(BigInt(Math.max(bytes, 1)), out), "alloc");
    const p = Deno.UnsafePointer.create(out[0]);
    this.#ptrs.push(p);
    return p;
  }

  /** A device allocation holding a copy of `data`. */
  upload(data: ArrayBufferView): Deno.PointerValue {
    const p = this.alloc(data.byteLength);
    const src = Deno.UnsafePointer.of(data as ArrayBufferView<ArrayBuffer>);
    unwrap(
      this.lib,
      this.lib.symbols.ps_memcpy_h2d_async(p, src, BigInt(data.byteLength), null),
      "upload",
    );
    return p;
  }

  /** Copies `out.byteLength` bytes at `p` into `out` once the default stream is done. */
  async download<T extends ArrayBufferView<ArrayBuffer>>(p: Deno.PointerValue, out: T): Promise<T> {
    const s = this.lib.symbols;
    unwrap(
      this.lib,
      s.ps_memcpy_d2h_async(Deno.UnsafePointer.of(out), p, BigInt(out.byteLength), null),
      "download",
    );
    const msg = new Uint8Array(512);
    unwrap(this.lib, await s.ps_stream_synchronize(0, null, msg, BigInt(msg.length)), "sync", msg);
    return out;
  }

  /** Frees every allocation made so far. */
  free(): void {
    for (const p of this.#ptrs) this.lib.symbols.ps_device_free(p);
    this.#ptrs = [];
  }
}
