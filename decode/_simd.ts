// decode/'s pixel loops in WebAssembly (decode/_simd.wat): resize.ts's two passes in SIMD,
// about 4x the JavaScript loops' rate and bit-identical to them (the same 22-bit integer
// arithmetic, the taps still computed by resize.ts), and PNG's scanline filters undone for
// png_fast.ts. Used when the engine validates the module (WebAssembly SIMD: V8 since 9.1, so
// every Deno 2); resize.ts keeps the JavaScript loops otherwise, and PNGs go to libspng.
//
// The scratch memory (memory 0, one per thread that decodes) holds, in order: the input image
// (a decoder can decode straight into it: `wasmInput`, `wasmPng`), then each call's taps, the
// intermediate rows and the output, each followed by 16 bytes of slack the SIMD loops may
// touch. When the output buffer is a view of a remembered shared memory (the loader's ring,
// internal/wasm_memory.ts), the last pass writes it there directly, through an instance whose
// memory 1 is that memory, never past the output's last byte; any other output buffer gets the
// pixels copied from the scratch memory at the end of the call.

import { memoryOfBuffer } from "../internal/wasm_memory.ts";

const BYTES = Uint8Array.from(
  atob(
    // BEGIN MODULE
    "AGFzbQEAAAABMgRgCn9/f39/f39/f38AYAt/f39/f39/f39/fwBgBn9/f39/fwF/YAl/f39/f39/f38AAhICAWUB" +
      "bQIAAQFlAXICAwGAgAQDBgUAAQIDAAcXBQFoAAACaDEAAQF1AAIBdgADAnYxAAQK0w0F6QECCH8BeyAJIRECQANA" +
      "IAogAk8NASAAIAogAWxqIRBBACELAkADQCALIARPDQEgBiALQQJ0aigCACENIBAgBSALQQJ0aigCACADbGohDiAH" +
      "IAsgCGxBAnRqIQ9BgICAAf0RIRJBACEMAkADQCAMIA1PDQEgEiAO/VwCAP2JAf2pASAPKAIA/RH9tQH9rgEhEiAO" +
      "IANqIQ4gD0EEaiEPIAxBAWohDAwACwsgEkEW/awBIRIgEiAS/YUBIRIgEiAS/WYhEiARIBL9WgIAACARIANqIREg" +
      "C0EBaiELDAALCyAKQQFqIQoMAAsLC5cCAgl/AXsgCSETIAkgAiAEbCADbGohCwJAA0AgDCACTw0BIAAgDCABbGoh" +
      "EkEAIQ0CQANAIA0gBE8NASAGIA1BAnRqKAIAIQ8gEiAFIA1BAnRqKAIAIANsaiEQIAcgDSAIbEECdGohEUGAgIAB" +
      "/REhFEEAIQ4CQANAIA4gD08NASAUIBD9XAIA/YkB/akBIBEoAgD9Ef21Af2uASEUIBAgA2ohECARQQRqIREgDkEB" +
      "aiEODAALCyAUQRb9rAEhFCAUIBT9hQEhFCAUIBT9ZiEUIBNBBGogC0sEQCAKIBT9WgIAACATIAogA/wKAQAFIBMg" +
      "FP0bADZCAQALIBMgA2ohEyANQQFqIQ0MAAsLIAxBAWohDAwACwsL/QMBCn8gAiEJAkADQCAGIANPDQEgAC0AACEH" +
      "IABBAWohACAHQQRLBEAgBg8LIAdFBEAgASAAIAT8CgAACyAHQQFGBEAgASAAIAX8CgAAIAUhCAJAA0AgCCAETw0B" +
      "IAEgCGogACAIai0AACABIAhqIAVrLQAAajoAACAIQQFqIQgMAAsLCyAHQQJGBEBBACEIAkADQCAIIARPDQEgASAI" +
      "aiAAIAhq/QAEACAJIAhq/QAEAP1u/QsEACAIQRBqIQgMAAsLCyAHQQNGBEBBACEIAkADQCAIIARPDQEgCCAFTwR/" +
      "IAEgCGogBWstAAAFQQALIQogASAIaiAAIAhqLQAAIAogCSAIai0AAGpBAXZqOgAAIAhBAWohCAwACwsLIAdBBEYE" +
      "QEEAIQgCQANAIAggBE8NASAJIAhqLQAAIQsgCCAFTwRAIAEgCGogBWstAAAhCiAJIAhqIAVrLQAAIQwFQQAhCkEA" +
      "IQwLIAsgDGshDSAKIAxrIQ4gDSAOaiEPIA1BACANayANQQBOGyENIA5BACAOayAOQQBOGyEOIA9BACAPayAPQQBO" +
      "GyEPIAEgCGogACAIai0AACAKIAsgDCAOIA9NGyANIA5NIA0gD01xG2o6AAAgCEEBaiEIDAALCwsgASEJIAEgBGoh" +
      "ASAAIARqIQAgBkEBaiEGDAALC0F/C8UCAgl/CHsCQANAIAkgA08NASAAIAQgCUECdGooAgAgAWxqIQ8gBSAJQQJ0" +
      "aigCACEMIAYgCSAHbEECdGohECAIIAkgAmxqIRFBACEKAkADQCAKIAJPDQFBgICAAf0RIRYgFiEXIBYhGCAWIRkg" +
      "DyAKaiENIBAhDkEAIQsCQANAIAsgDE8NASAOKAIA/REhEiAN/QAEACETIBP9iQEhFCAT/YoBIRUgFiAU/akBIBL9" +
      "tQH9rgEhFiAXIBT9qgEgEv21Af2uASEXIBggFf2pASAS/bUB/a4BIRggGSAV/aoBIBL9tQH9rgEhGSANIAFqIQ0g" +
      "DkEEaiEOIAtBAWohCwwACwsgESAKaiAWQRb9rAEgF0EW/awB/YUBIBhBFv2sASAZQRb9rAH9hQH9Zv0LBAAgCkEQ" +
      "aiEKDAALCyAJQQFqIQkMAAsLC4YDAgp/CHsgCCADIAJsaiEKAkADQCALIANPDQEgACAEIAtBAnRqKAIAIAFsaiER" +
      "IAUgC0ECdGooAgAhDiAGIAsgB2xBAnRqIRIgCCALIAJsaiETQQAhDAJAA0AgDCACTw0BQYCAgAH9ESEYIBghGSAY" +
      "IRogGCEbIBEgDGohDyASIRBBACENAkADQCANIA5PDQEgECgCAP0RIRQgD/0ABAAhFSAV/YkBIRYgFf2KASEXIBgg" +
      "Fv2pASAU/bUB/a4BIRggGSAW/aoBIBT9tQH9rgEhGSAaIBf9qQEgFP21Af2uASEaIBsgF/2qASAU/bUB/a4BIRsg" +
      "DyABaiEPIBBBBGohECANQQFqIQ0MAAsLIBhBFv2sASAZQRb9rAH9hQEgGkEW/awBIBtBFv2sAf2FAf1mIRUgEyAM" +
      "akEQaiAKSwRAIAkgFf0LBAAgEyAMaiAJQRAgAiAMayACIAxrQRBLG/wKAQAFIBMgDGogFf0LRAEACyAMQRBqIQwM" +
      "AAsLIAtBAWohCwwACwsL",
    // END MODULE
  ),
  (c) => c.charCodeAt(0),
);

/** The slack after every region: the widest access past a region's end. */
const SLACK = 16;
const PAGE = 65536;
/**
 * The most scratch memory a call may ask for (of wasm32's 4 GiB): larger images take the
 * JavaScript loops (and libspng), which allocate as they go.
 */
export const WASM_SCRATCH_LIMIT = 2 ** 30;

interface Exports {
  h: (...args: number[]) => void;
  v: (...args: number[]) => void;
  h1: (...args: number[]) => void;
  v1: (...args: number[]) => void;
  u: (...args: number[]) => number;
}

/** This thread's module, its scratch memory (0) and its instance without a ring. */
interface Simd {
  module: WebAssembly.Module;
  m: WebAssembly.Memory;
  plain: Exports;
  /** An instance per ring memory written directly (memory 1). */
  rings: WeakMap<WebAssembly.Memory, Exports>;
}

let simd: Simd | null | undefined;

function load(): Simd | null {
  if (simd === undefined) {
    try {
      const module = new WebAssembly.Module(BYTES);
      const m = new WebAssembly.Memory({ initial: 1 });
      const page = new WebAssembly.Memory({ initial: 1, maximum: 1, shared: true });
      const plain = new WebAssembly.Instance(module, { e: { m, r: page } })
        .exports as unknown as Exports;
      simd = { module, m, plain, rings: new WeakMap() };
    } catch {
      simd = null; // no WebAssembly SIMD or multi-memory: the JavaScript loops are used
    }
  }
  return simd;
}

/** The instance whose memory 1 is `ring`. */
function ringInstance(s: Simd, ring: WebAssembly.Memory): Exports {
  let e = s.rings.get(ring);
  if (e === undefined) {
    e = new WebAssembly.Instance(s.module, { e: { m: s.m, r: ring } })
      .exports as unknown as Exports;
    s.rings.set(ring, e);
  }
  return e;
}

/** One pass's taps: each output position's first input, count and weights. */
export interface PassTaps {
  start: Int32Array;
  count: Int32Array;
  weights: Int32Array;
  width: number;
}

const align = (n: number) => (n + SLACK + 15) & ~15;

/** Grows the scratch memory to at least `bytes`; the old views are detached by a growth. */
function reserve(s: Simd, bytes: number): void {
  const have = s.m.buffer.byteLength;
  if (bytes > have) s.m.grow(Math.ceil((bytes - have) / PAGE));
}

/**
 * A buffer of `n` bytes at the start of the resize memory, for a decode that is resized next
 * (no copy into the module then), or undefined without WebAssembly SIMD. Valid until the next
 * call of this module.
 */
export function wasmInput(n: number): Uint8Array | undefined {
  const s = load();
  if (s === null || 2 * n > WASM_SCRATCH_LIMIT) return undefined;
  reserve(s, align(n));
  return new Uint8Array(s.m.buffer, 0, n);
}

/** Where a PNG's scanlines are undone: the inflated bytes in, the pixels out. */
export interface PngScratch {
  /** Where the inflated scanlines go (filter byte + `rowBytes` bytes each). */
  inflated: Uint8Array;
  /**
   * Undoes the filters into the image buffer at the start of the memory (a decode that is
   * resized next is read there in place).
   *
   * @returns the pixels, or the first row with an unknown filter type
   */
  unfilter(): Uint8Array | number;
}

/**
 * Memory for a PNG of `rows` scanlines of `rowBytes` bytes (`bpp` bytes a pixel), or undefined
 * without WebAssembly SIMD. Valid until the next call of this module.
 */
export function wasmPng(rows: number, rowBytes: number, bpp: number): PngScratch | undefined {
  const s = load();
  if (s === null || 3 * rows * (rowBytes + 1) > WASM_SCRATCH_LIMIT) return undefined;
  const image = rows * rowBytes;
  const zero = align(image), src = zero + align(rowBytes);
  const inflatedBytes = rows * (rowBytes + 1);
  reserve(s, src + align(inflatedBytes));
  new Uint8Array(s.m.buffer, zero, rowBytes).fill(0);
  return {
    inflated: new Uint8Array(s.m.buffer, src, inflatedBytes),
    unfilter: () => {
      const bad = s.plain.u(src, 0, zero, rows, rowBytes, bpp);
      return bad >= 0 ? bad : new Uint8Array(s.m.buffer, 0, image);
    },
  };
}

/** Whether the WebAssembly passes run here. */
export function wasmResizeAvailable(): boolean {
  return load() !== null;
}

function put(s: Simd, at: number, t: PassTaps): void {
  const n = t.start.length;
  const i32 = new Int32Array(s.m.buffer, at, n * (2 + t.width));
  i32.set(t.start, 0);
  i32.set(t.count, n);
  i32.set(t.weights, 2 * n);
}

/**
 * Resizes the region of `ih` rows from (`top`, `left`) of an HWC image of `fullW` columns and
 * `c` channels to `height` x `width` into `dst`, horizontal pass first (`h` taps, over the
 * region's width; none when the width is kept), then vertical (`v`, or none when the height
 * is kept).
 */
export function wasmResize(
  data: Uint8Array,
  fullW: number,
  c: number,
  top: number,
  left: number,
  ih: number,
  height: number,
  width: number,
  h: PassTaps | undefined,
  v: PassTaps | undefined,
  dst: Uint8Array,
): void {
  const s = load()!;
  const stride = fullW * c;
  let src: number, end: number;
  if (data.buffer === s.m.buffer) {
    src = data.byteOffset + (top * fullW + left) * c;
    end = data.byteOffset + data.byteLength;
  } else {
    // Not decoded into the module: the region's rows come in (whole rows, one copy).
    const bytes = ih * stride;
    reserve(s, align(bytes));
    new Uint8Array(s.m.buffer, 0, bytes).set(data.subarray(top * stride, top * stride + bytes));
    src = left * c;
    end = bytes;
  }
  // A ring slot (a remembered shared memory) is written by the last pass itself; anything
  // else gets the output copied from the scratch memory.
  const ring = memoryOfBuffer(dst.buffer);
  const e = ring ? ringInstance(s, ring) : s.plain;
  let at = align(end);
  const hAt = at;
  if (h) at += align(4 * h.start.length * (2 + h.width));
  const vAt = at;
  if (v) at += align(4 * v.start.length * (2 + v.width));
  const midAt = at;
  if (h && v) at += align(ih * width * c);
  const tmp = at;
  at += align(16);
  const outAt = at;
  const size = height * width * c;
  reserve(s, outAt + align(size));
  if (h) put(s, hAt, h);
  if (v) put(s, vAt, v);
  const out = ring ? dst.byteOffset : outAt;
  if (h) {
    const n = width, into = v ? midAt : out;
    const args = [src, stride, ih, c, width, hAt, hAt + 4 * n, hAt + 8 * n, h.width, into];
    if (ring && !v) e.h1(...args, tmp);
    else e.h(...args);
  }
  if (v) {
    const n = height;
    const [from, fromStride] = h ? [midAt, width * c] : [src, stride];
    const args = [from, fromStride, width * c, height, vAt, vAt + 4 * n, vAt + 8 * n, v.width, out];
    if (ring) e.v1(...args, tmp);
    else e.v(...args);
  }
  if (!ring) {
    dst.set(new Uint8Array(s.m.buffer, outAt, size));
    copiesOut++;
  }
}

let copiesOut = 0;

/** How many resizes in this thread copied their output out of the scratch memory (tests). */
export function wasmOutputCopies(): number {
  return copiesOut;
}
