/**
 * Which WebAssembly.Memory a buffer belongs to, per thread: the loader's shared memories (its
 * ring and fields) are remembered where they are made or received, so that the WebAssembly
 * loops of other floors (decode/'s resize) can write into them directly.
 *
 * @module
 */

const memories = new WeakMap<ArrayBufferLike, WebAssembly.Memory>();

/**
 * Remembers a memory under its current buffer.
 *
 * @param memory the memory (a shared one keeps its buffer: it never grows here)
 * @returns its buffer, the object later views must be made on to be found
 */
export function rememberMemory(memory: WebAssembly.Memory): ArrayBufferLike {
  const buffer = memory.buffer;
  memories.set(buffer, memory);
  return buffer;
}

/**
 * The memory behind a buffer, if it was remembered in this thread.
 *
 * @param buffer a typed array's `buffer`
 * @returns the memory, or undefined
 */
export function memoryOfBuffer(buffer: ArrayBufferLike): WebAssembly.Memory | undefined {
  return memories.get(buffer);
}
