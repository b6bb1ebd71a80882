import assert from "node:assert";
import { allocShared, wasmGather } from "../loader/_wasm_gather.ts";
import { memoryOfBuffer } from "../internal/wasm_memory.ts";

// Without this, a broken module would go unnoticed: the gather falls back to the JavaScript
// copy and every loader test still passes, only slower.
Deno.test("the memory.copy gather compiles and copies records by index from memory 1 to memory 0", () => {
  const ring = allocShared(1024);
  const source = allocShared(1024);
  const ringMemory = memoryOfBuffer(ring), sourceMemory = memoryOfBuffer(source);
  assert.ok(ringMemory && sourceMemory, "allocShared returns WebAssembly memory");
  const g = wasmGather(ringMemory, sourceMemory);
  assert.ok(g, "the module compiles (multi-memory is supported by this Deno)");
  const rec = 8, srcBase = 16, dstBase = 256, idxPtr = 0;
  const src = new Uint8Array(source);
  for (let i = 0; i < 10 * rec; i++) src[srcBase + i] = i + 1;
  new Int32Array(ring, idxPtr, 3).set([7, 0, 3]);
  g(idxPtr, 3, srcBase, rec, dstBase);
  const dst = new Uint8Array(ring, dstBase, 3 * rec);
  const expected = [7, 0, 3].flatMap((i) => Array.from({ length: rec }, (_, b) => i * rec + b + 1));
  assert.deepStrictEqual(Array.from(dst), expected);
});
