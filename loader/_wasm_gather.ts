// A 114-byte WebAssembly module whose one function gathers records with `memory.copy`.
//
// Why: V8 copies between SharedArrayBuffers with a relaxed-atomic word loop (TypedArray.set
// on shared memory may race with other threads, so it cannot use memcpy), about 3 GB/s here.
// WebAssembly's memory.copy on shared memories compiles to a native memmove, about 2x the
// rate (measured 1.0-1.1M vs 1.8-2.0M CIFAR samples/s on one thread; `deno run -A
// bench/loader.ts` measures both again, its two "memory-copy bound" rows). With multi-memory,
// one instance imports the ring's memory (0: destination, also holding the indices) and a
// dataset field's memory (1: source), so the dataset and the ring stay separate buffers.
//
// The module, as text (record k of the batch goes to dstBase + k*rec; idx[k] is the i32 at
// idxPtr + 4k in memory 0):
//
//   (module
//     (import "e" "d" (memory 0 65536 shared))
//     (import "e" "s" (memory 0 65536 shared))
//     (func (export "g") (param $idx i32) (param $n i32) (param $src i32) (param $rec i32)
//                        (param $dst i32)
//       (local $k i32)
//       (block $done
//         (loop $next
//           (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
//           (memory.copy 0 1
//             (i32.add (local.get $dst) (i32.mul (local.get $k) (local.get $rec)))
//             (i32.add
//               (local.get $src)
//               (i32.mul
//                 (i32.load (i32.add (local.get $idx) (i32.shl (local.get $k) (i32.const 2))))
//                 (local.get $rec)))
//             (local.get $rec))
//           (local.set $k (i32.add (local.get $k) (i32.const 1)))
//           (br $next)))))
//
// BYTES is that text assembled by WABT 1.0.39 (`wat2wasm --enable-threads
// --enable-multi-memory`, or npm wabt's parseWat with multi_memory and threads), in base64.
const BYTES = Uint8Array.from(
  atob(
    "AGFzbQEAAAABCQFgBX9/f39/AAIVAgFlAWQCAwCAgAQBZQFzAgMAgIAEAwIBAAcFAQFnAAAKOwE5AQF/AkADQCAF" +
      "IAFPDQEgBCAFIANsaiACIAAgBUECdGooAgAgA2xqIAP8CgABIAVBAWohBQwACwsL",
  ),
  (c) => c.charCodeAt(0),
);

import { rememberMemory } from "../internal/wasm_memory.ts";

let module: WebAssembly.Module | null | undefined;

/** The gather function over (ring memory, source memory), or undefined when unsupported. */
export type WasmGather = (idx: number, n: number, src: number, rec: number, dst: number) => void;

export function wasmGather(
  ring: WebAssembly.Memory,
  source: WebAssembly.Memory,
): WasmGather | undefined {
  if (module === undefined) {
    try {
      module = new WebAssembly.Module(BYTES);
    } catch {
      module = null; // no multi-memory: the JavaScript copy is used
    }
  }
  if (module === null) return undefined;
  const instance = new WebAssembly.Instance(module, { e: { d: ring, s: source } });
  return instance.exports.g as WasmGather;
}

const MAX_PAGES = 65535;

/**
 * A SharedArrayBuffer of at least `bytes` bytes backed by a shared WebAssembly.Memory (so the
 * gather can use memory.copy), or a plain one past wasm32's 4 GiB.
 */
export function allocShared(bytes: number): SharedArrayBuffer {
  const pages = Math.max(1, Math.ceil(bytes / 65536));
  if (pages > MAX_PAGES) return new SharedArrayBuffer(bytes);
  try {
    const memory = new WebAssembly.Memory({ initial: pages, maximum: pages, shared: true });
    return rememberMemory(memory) as SharedArrayBuffer;
  } catch {
    return new SharedArrayBuffer(bytes);
  }
}
