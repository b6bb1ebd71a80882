// decode/'s pixel loops in WebAssembly (decode/_simd.wat): resize.ts's two passes in SIMD,
// about 4x the JavaScript loops' rate and bit-identical to them (the same 22-bit integer
// arithmetic, the taps still computed by resize.ts), and PNG's scanline filters undone for
// png_fast.ts. Used when the engine validates the module (WebAssembly SIMD: V8 since 9.1, so
// every Deno 2); resize.ts keeps the JavaScript loops otherwise, and PNGs go to libspng.
//
// The scratch memory (memory 0, one per thread that decodes) holds, in order: the input image
// (a decoder can decode straight into it: `wasmInput`, `wasmPng`), then each call's taps and
// intermediate rows, each followed by 16 bytes of slack the SIMD loops may touch. The last pass
// writes memory 1, never past the output's last byte: when the output buffer is a view of a
// remembered shared memory (the loader's ring, internal/wasm_memory.ts), that memory, through
// an instance of its own; else this thread's output memory, from which the pixels are copied
// at the end of the call.

import { memoryOfBuffer } from "../internal/wasm_memory.ts";

const BYTES = Uint8Array.from(
  atob(
    // BEGIN MODULE
    "AGFzbQEAAAABJgNgCn9/f39/f39/f38AYAt/f39/f39/f39/fwBgBn9/f39/fwF/AhICAWUBbQIAAQFlAXICAwGA" +
      "gAQDBQQAAQIABxUEAWgAAAVoTGFzdAABAXUAAgF2AAMKjAsE6QECCH8BeyAJIRECQANAIAogAk8NASAAIAogAWxq" +
      "IRBBACELAkADQCALIARPDQEgBiALQQJ0aigCACENIBAgBSALQQJ0aigCACADbGohDiAHIAsgCGxBAnRqIQ9BgICA" +
      "Af0RIRJBACEMAkADQCAMIA1PDQEgEiAO/VwCAP2JAf2pASAPKAIA/RH9tQH9rgEhEiAOIANqIQ4gD0EEaiEPIAxB" +
      "AWohDAwACwsgEkEW/awBIRIgEiAS/YUBIRIgEiAS/WYhEiARIBL9WgIAACARIANqIREgC0EBaiELDAALCyAKQQFq" +
      "IQoMAAsLC5cCAgl/AXsgCSETIAkgAiAEbCADbGohCwJAA0AgDCACTw0BIAAgDCABbGohEkEAIQ0CQANAIA0gBE8N" +
      "ASAGIA1BAnRqKAIAIQ8gEiAFIA1BAnRqKAIAIANsaiEQIAcgDSAIbEECdGohEUGAgIAB/REhFEEAIQ4CQANAIA4g" +
      "D08NASAUIBD9XAIA/YkB/akBIBEoAgD9Ef21Af2uASEUIBAgA2ohECARQQRqIREgDkEBaiEODAALCyAUQRb9rAEh" +
      "FCAUIBT9hQEhFCAUIBT9ZiEUIBNBBGogC0sEQCAKIBT9WgIAACATIAogA/wKAQAFIBMgFP0bADZCAQALIBMgA2oh" +
      "EyANQQFqIQ0MAAsLIAxBAWohDAwACwsL/QMBCn8gAiEJAkADQCAGIANPDQEgAC0AACEHIABBAWohACAHQQRLBEAg" +
      "Bg8LIAdFBEAgASAAIAT8CgAACyAHQQFGBEAgASAAIAX8CgAAIAUhCAJAA0AgCCAETw0BIAEgCGogACAIai0AACAB" +
      "IAhqIAVrLQAAajoAACAIQQFqIQgMAAsLCyAHQQJGBEBBACEIAkADQCAIIARPDQEgASAIaiAAIAhq/QAEACAJIAhq" +
      "/QAEAP1u/QsEACAIQRBqIQgMAAsLCyAHQQNGBEBBACEIAkADQCAIIARPDQEgCCAFTwR/IAEgCGogBWstAAAFQQAL" +
      "IQogASAIaiAAIAhqLQAAIAogCSAIai0AAGpBAXZqOgAAIAhBAWohCAwACwsLIAdBBEYEQEEAIQgCQANAIAggBE8N" +
      "ASAJIAhqLQAAIQsgCCAFTwRAIAEgCGogBWstAAAhCiAJIAhqIAVrLQAAIQwFQQAhCkEAIQwLIAsgDGshDSAKIAxr" +
      "IQ4gDSAOaiEPIA1BACANayANQQBOGyENIA5BACAOayAOQQBOGyEOIA9BACAPayAPQQBOGyEPIAEgCGogACAIai0A" +
      "ACAKIAsgDCAOIA9NGyANIA5NIA0gD01xG2o6AAAgCEEBaiEIDAALCwsgASEJIAEgBGohASAAIARqIQAgBkEBaiEG" +
      "DAALC0F/C4YDAgp/CHsgCCADIAJsaiEKAkADQCALIANPDQEgACAEIAtBAnRqKAIAIAFsaiERIAUgC0ECdGooAgAh" +
      "DiAGIAsgB2xBAnRqIRIgCCALIAJsaiETQQAhDAJAA0AgDCACTw0BQYCAgAH9ESEYIBghGSAYIRogGCEbIBEgDGoh" +
      "DyASIRBBACENAkADQCANIA5PDQEgECgCAP0RIRQgD/0ABAAhFSAV/YkBIRYgFf2KASEXIBggFv2pASAU/bUB/a4B" +
      "IRggGSAW/aoBIBT9tQH9rgEhGSAaIBf9qQEgFP21Af2uASEaIBsgF/2qASAU/bUB/a4BIRsgDyABaiEPIBBBBGoh" +
      "ECANQQFqIQ0MAAsLIBhBFv2sASAZQRb9rAH9hQEgGkEW/awBIBtBFv2sAf2FAf1mIRUgEyAMakEQaiAKSwRAIAkg" +
      "Ff0LBAAgEyAMaiAJQRAgAiAMayACIAxrQRBLG/wKAQAFIBMgDGogFf0LRAEACyAMQRBqIQwMAAsLIAtBAWohCwwA" +
      "CwsL",
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
  hLast: (...args: number[]) => void;
  v: (...args: number[]) => void;
  u: (...args: number[]) => number;
}

/**
 * This thread's module, its scratch memory (memory 0), its output memory and the instance whose
 * memory 1 that is (outputs that are not a ring slot are written there, then copied out).
 */
interface Simd {
  module: WebAssembly.Module;
  m: WebAssembly.Memory;
  out: WebAssembly.Memory;
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
      const out = new WebAssembly.Memory({
        initial: 1,
        maximum: WASM_SCRATCH_LIMIT / PAGE,
        shared: true,
      });
      const plain = new WebAssembly.Instance(module, { e: { m, r: out } })
        .exports as unknown as Exports;
      simd = { module, m, out, plain, rings: new WeakMap() };
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

/** Grows a memory to at least `bytes`; the old views are detached by a growth. */
function reserve(memory: WebAssembly.Memory, bytes: number): void {
  const have = memory.buffer.byteLength;
  if (bytes > have) memory.grow(Math.ceil((bytes - have) / PAGE));
}

/**
 * A buffer of `n` bytes at the start of the resize memory, for a decode that is resized next
 * (no copy into the module then), or undefined without WebAssembly SIMD. Valid until the next
 * call of this module.
 */
export function wasmInput(n: number): Uint8Array | undefined {
  const s = load();
  if (s === null || 2 * n > WASM_SCRATCH_LIMIT) return undefined;
  reserve(s.m, align(n));
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
  reserve(s.m, src + align(inflatedBytes));
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
    reserve(s.m, align(bytes));
    new Uint8Array(s.m.buffer, 0, bytes).set(data.subarray(top * stride, top * stride + bytes));
    src = left * c;
    end = bytes;
  }
  // The last pass writes the output's own memory: a ring slot (a remembered shared memory)
  // directly; anything else through this thread's output memory, copied out after.
  const ring = memoryOfBuffer(dst.buffer);
  const e = ring ? ringInstance(s, ring) : s.plain;
  const size = height * width * c;
  const out = ring ? dst.byteOffset : 0;
  if (!ring) reserve(s.out, size);
  let at = align(end);
  const hAt = at;
  if (h) at += align(4 * h.start.length * (2 + h.width));
  const vAt = at;
  if (v) at += align(4 * v.start.length * (2 + v.width));
  const tmp = at;
  at += align(16);
  const midAt = at;
  if (h && v) at += align(ih * width * c);
  reserve(s.m, at);
  if (h) put(s, hAt, h);
  if (v) put(s, vAt, v);
  if (h) {
    const n = width;
    const args = [src, stride, ih, c, width, hAt, hAt + 4 * n, hAt + 8 * n, h.width];
    if (v) e.h(...args, midAt);
    else e.hLast(...args, out, tmp);
  }
  if (v) {
    const n = height;
    const [from, fromStride] = h ? [midAt, width * c] : [src, stride];
    e.v(from, fromStride, width * c, height, vAt, vAt + 4 * n, vAt + 8 * n, v.width, out, tmp);
  }
  if (!ring) {
    dst.set(new Uint8Array(s.out.buffer, 0, size));
    copiesOut++;
  }
}

let copiesOut = 0;

/** How many resizes in this thread copied their output out of the scratch memory (tests). */
export function wasmOutputCopies(): number {
  return copiesOut;
}
