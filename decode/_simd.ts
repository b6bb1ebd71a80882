// decode/'s pixel loops in WebAssembly (decode/_simd.wat): resize.ts's two passes in SIMD,
// about 4x the JavaScript loops' rate and bit-identical to them (the same 22-bit integer
// arithmetic, the taps still computed by resize.ts), and PNG's scanline filters undone for
// png_fast.ts. Used when the engine validates the module (WebAssembly SIMD: V8 since 9.1, so
// every Deno 2); resize.ts keeps the JavaScript loops otherwise, and PNGs go to libspng.
//
// The module's memory (one per thread that decodes) holds, in order: the input image (a
// decoder can decode straight into it: `wasmInput`, `wasmPng`), then each call's taps, the
// intermediate rows and the output, each followed by 16 bytes of slack the SIMD loops may
// touch. The output is copied out to the caller's buffer (a ring slot) at the end of the call.

const BYTES = Uint8Array.from(
  atob(
    // BEGIN MODULE
    "AGFzbQEAAAABJANgCn9/f39/f39/f38AYAZ/f39/f38Bf2AJf39/f39/f39/AAMEAwABAgUDAQABBxEEAW0CAAFo" +
      "AAABdQABAXYAAgqyCAPpAQIIfwF7IAkhEQJAA0AgCiACTw0BIAAgCiABbGohEEEAIQsCQANAIAsgBE8NASAGIAtB" +
      "AnRqKAIAIQ0gECAFIAtBAnRqKAIAIANsaiEOIAcgCyAIbEECdGohD0GAgIAB/REhEkEAIQwCQANAIAwgDU8NASAS" +
      "IA79XAIA/YkB/akBIA8oAgD9Ef21Af2uASESIA4gA2ohDiAPQQRqIQ8gDEEBaiEMDAALCyASQRb9rAEhEiASIBL9" +
      "hQEhEiASIBL9ZiESIBEgEv1aAgAAIBEgA2ohESALQQFqIQsMAAsLIApBAWohCgwACwsL/QMBCn8gAiEJAkADQCAG" +
      "IANPDQEgAC0AACEHIABBAWohACAHQQRLBEAgBg8LIAdFBEAgASAAIAT8CgAACyAHQQFGBEAgASAAIAX8CgAAIAUh" +
      "CAJAA0AgCCAETw0BIAEgCGogACAIai0AACABIAhqIAVrLQAAajoAACAIQQFqIQgMAAsLCyAHQQJGBEBBACEIAkAD" +
      "QCAIIARPDQEgASAIaiAAIAhq/QAEACAJIAhq/QAEAP1u/QsEACAIQRBqIQgMAAsLCyAHQQNGBEBBACEIAkADQCAI" +
      "IARPDQEgCCAFTwR/IAEgCGogBWstAAAFQQALIQogASAIaiAAIAhqLQAAIAogCSAIai0AAGpBAXZqOgAAIAhBAWoh" +
      "CAwACwsLIAdBBEYEQEEAIQgCQANAIAggBE8NASAJIAhqLQAAIQsgCCAFTwRAIAEgCGogBWstAAAhCiAJIAhqIAVr" +
      "LQAAIQwFQQAhCkEAIQwLIAsgDGshDSAKIAxrIQ4gDSAOaiEPIA1BACANayANQQBOGyENIA5BACAOayAOQQBOGyEO" +
      "IA9BACAPayAPQQBOGyEPIAEgCGogACAIai0AACAKIAsgDCAOIA9NGyANIA5NIA0gD01xG2o6AAAgCEEBaiEIDAAL" +
      "CwsgASEJIAEgBGohASAAIARqIQAgBkEBaiEGDAALC0F/C8UCAgl/CHsCQANAIAkgA08NASAAIAQgCUECdGooAgAg" +
      "AWxqIQ8gBSAJQQJ0aigCACEMIAYgCSAHbEECdGohECAIIAkgAmxqIRFBACEKAkADQCAKIAJPDQFBgICAAf0RIRYg" +
      "FiEXIBYhGCAWIRkgDyAKaiENIBAhDkEAIQsCQANAIAsgDE8NASAOKAIA/REhEiAN/QAEACETIBP9iQEhFCAT/YoB" +
      "IRUgFiAU/akBIBL9tQH9rgEhFiAXIBT9qgEgEv21Af2uASEXIBggFf2pASAS/bUB/a4BIRggGSAV/aoBIBL9tQH9" +
      "rgEhGSANIAFqIQ0gDkEEaiEOIAtBAWohCwwACwsgESAKaiAWQRb9rAEgF0EW/awB/YUBIBhBFv2sASAZQRb9rAH9" +
      "hQH9Zv0LBAAgCkEQaiEKDAALCyAJQQFqIQkMAAsLCw==",
    // END MODULE
  ),
  (c) => c.charCodeAt(0),
);

/** The slack after every region: the widest access past a region's end. */
const SLACK = 16;
const PAGE = 65536;

interface Exports {
  m: WebAssembly.Memory;
  h: (...args: number[]) => void;
  v: (...args: number[]) => void;
  u: (...args: number[]) => number;
}

let exports: Exports | null | undefined;

function instance(): Exports | null {
  if (exports === undefined) {
    try {
      const module = new WebAssembly.Module(BYTES);
      exports = new WebAssembly.Instance(module).exports as unknown as Exports;
    } catch {
      exports = null; // no WebAssembly SIMD: the JavaScript loops are used
    }
  }
  return exports;
}

/** One pass's taps: each output position's first input, count and weights. */
export interface PassTaps {
  start: Int32Array;
  count: Int32Array;
  weights: Int32Array;
  width: number;
}

const align = (n: number) => (n + SLACK + 15) & ~15;

/** Grows the memory to at least `bytes`; the old views are detached by a growth. */
function reserve(e: Exports, bytes: number): void {
  const have = e.m.buffer.byteLength;
  if (bytes > have) e.m.grow(Math.ceil((bytes - have) / PAGE));
}

/**
 * A buffer of `n` bytes at the start of the resize memory, for a decode that is resized next
 * (no copy into the module then), or undefined without WebAssembly SIMD. Valid until the next
 * call of this module.
 */
export function wasmInput(n: number): Uint8Array | undefined {
  const e = instance();
  if (e === null) return undefined;
  reserve(e, align(n));
  return new Uint8Array(e.m.buffer, 0, n);
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
  const e = instance();
  if (e === null) return undefined;
  const image = rows * rowBytes;
  const zero = align(image), src = zero + align(rowBytes);
  const inflatedBytes = rows * (rowBytes + 1);
  reserve(e, src + align(inflatedBytes));
  new Uint8Array(e.m.buffer, zero, rowBytes).fill(0);
  return {
    inflated: new Uint8Array(e.m.buffer, src, inflatedBytes),
    unfilter: () => {
      const bad = e.u(src, 0, zero, rows, rowBytes, bpp);
      return bad >= 0 ? bad : new Uint8Array(e.m.buffer, 0, image);
    },
  };
}

/** Whether the WebAssembly passes run here. */
export function wasmResizeAvailable(): boolean {
  return instance() !== null;
}

function put(e: Exports, at: number, t: PassTaps): number {
  const n = t.start.length;
  const i32 = new Int32Array(e.m.buffer, at, n * (2 + t.width));
  i32.set(t.start, 0);
  i32.set(t.count, n);
  i32.set(t.weights, 2 * n);
  return at + align(4 * n * (2 + t.width));
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
  const e = instance()!;
  const stride = fullW * c;
  let src: number, end: number;
  if (data.buffer === e.m.buffer) {
    src = data.byteOffset + (top * fullW + left) * c;
    end = data.byteOffset + data.byteLength;
  } else {
    // Not decoded into the module: the region's rows come in (whole rows, one copy).
    const bytes = ih * stride;
    reserve(e, align(bytes));
    new Uint8Array(e.m.buffer, 0, bytes).set(data.subarray(top * stride, top * stride + bytes));
    src = left * c;
    end = bytes;
  }
  let at = align(end);
  const hAt = at;
  if (h) at += align(4 * h.start.length * (2 + h.width));
  const vAt = at;
  if (v) at += align(4 * v.start.length * (2 + v.width));
  const midAt = at;
  if (h && v) at += align(ih * width * c);
  const outAt = at;
  const size = height * width * c;
  reserve(e, outAt + align(size));
  if (h) put(e, hAt, h);
  if (v) put(e, vAt, v);
  if (h) {
    const n = width;
    e.h(
      src,
      stride,
      ih,
      c,
      width,
      hAt,
      hAt + 4 * n,
      hAt + 8 * n,
      h.width,
      v ? midAt : outAt,
    );
  }
  if (v) {
    const n = height;
    const [from, fromStride] = h ? [midAt, width * c] : [src, stride];
    e.v(from, fromStride, width * c, height, vAt, vAt + 4 * n, vAt + 8 * n, v.width, outAt);
  }
  dst.set(new Uint8Array(e.m.buffer, outAt, size));
}
