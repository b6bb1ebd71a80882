/**
 * A JPEG decoder in TypeScript, for threads where libjpeg-turbo cannot be loaded (no FFI
 * permission, or the library missing). It gives libjpeg-turbo's default decode (TurboJPEG's
 * and djpeg's: the accurate integer IDCT, "fancy" upsampling, the fixed-point YCbCr tables)
 * bit for bit, written from ITU-T T.81 and the arithmetic libjpeg documents.
 *
 * Baseline and extended sequential (8-bit Huffman) and progressive files, restart intervals,
 * any integer sampling factors, greyscale, YCbCr, RGB (Adobe transform 0), CMYK and YCCK.
 * Arithmetic coding, 12-bit samples, lossless and hierarchical files are refused by name. A
 * progressive file whose scans leave coefficients unrefined is decoded without libjpeg's block
 * smoothing (T.81 K.8), so its pixels are close to libjpeg-turbo's but not the same.
 * DCT-domain scaling by 1/2, 1/4 and 1/8 as libjpeg-turbo's.
 *
 * @module
 */

import { type Channels, type DecodedImage, ImageDecodeError } from "./types.ts";
import { type Plane, toChannels, transform, upsample } from "./_jpeg_pixels.ts";

/** The size and colour of a JPEG, from its frame header. */
export interface JpegInfo {
  /** Pixels per row. */
  width: number;
  /** Rows. */
  height: number;
  /** The colour space the samples are in. */
  colorspace: "grey" | "ycbcr" | "rgb" | "cmyk" | "ycck";
  /** Whether the file is progressive. */
  progressive: boolean;
}

/** Position in the block (row-major) of the k-th coefficient in zigzag order. */
const ZIGZAG = (() => {
  const z = new Uint8Array(80);
  let i = 0;
  for (let s = 0; s < 15; s++) {
    const lo = Math.max(0, s - 7), hi = Math.min(s, 7);
    if (s % 2 === 0) { for (let y = hi; y >= lo; y--) z[i++] = y * 8 + s - y; }
    else for (let y = lo; y <= hi; y++) z[i++] = y * 8 + s - y;
  }
  // Corrupt data can run k past 63: those land on the last coefficient, as in libjpeg.
  z.fill(63, 64);
  return z;
})();

/** A Huffman table: a 9-bit lookup for short codes, canonical-code bounds for the rest. */
interface Huffman {
  /** (length << 8) | symbol for every 9-bit prefix of a code of 9 bits or fewer, else 0. */
  fast: Uint16Array;
  maxcode: Int32Array;
  offset: Int32Array;
  symbols: Uint8Array;
}

function buildHuffman(
  counts: Uint8Array,
  symbols: Uint8Array,
  bad: (what: string) => ImageDecodeError,
): Huffman {
  const fast = new Uint16Array(512);
  const maxcode = new Int32Array(18).fill(-1);
  const offset = new Int32Array(17);
  let code = 0, k = 0;
  for (let len = 1; len <= 16; len++) {
    const n = counts[len - 1];
    offset[len] = k - code;
    for (let i = 0; i < n; i++, k++, code++) {
      if (len <= 9) {
        const from = code << (9 - len);
        fast.fill((len << 8) | symbols[k], from, from + (1 << (9 - len)));
      }
    }
    if (code > 1 << len) throw bad("a Huffman table has more codes than its lengths allow");
    maxcode[len] = n ? code - 1 : -1;
    code <<= 1;
  }
  maxcode[17] = 0x7fffffff;
  return { fast, maxcode, offset, symbols };
}

function hex(byte: number): string {
  return byte.toString(16).toUpperCase().padStart(2, "0");
}

function corrupt(what: string): ImageDecodeError {
  return new ImageDecodeError(`JPEG data is corrupt (${what})`);
}

function truncated(what: string): ImageDecodeError {
  return new ImageDecodeError(`JPEG data is truncated (${what})`);
}

/** The entropy-coded bits of a scan, 0xFF00 unstuffed; a marker or the end reads as zeros. */
class BitReader {
  pos: number;
  bits = 0;
  nbits = 0;
  /** Zero bytes appended past the data (at a marker or the end of the file). */
  fake = 0;
  constructor(readonly b: Uint8Array, pos: number) {
    this.pos = pos;
  }

  fill(): void {
    const b = this.b;
    while (this.nbits <= 24) {
      let byte = 0;
      if (this.fake === 0 && this.pos < b.length) {
        byte = b[this.pos];
        if (byte === 0xff) {
          const next = b[this.pos + 1];
          if (next === 0) this.pos += 2;
          else if (next === 0xff) { // fill bytes before a marker
            this.pos++;
            continue;
          } else byte = -1;
        } else this.pos++;
      } else byte = -1;
      if (byte < 0) {
        // Decoding would use bits past the data: stop (libjpeg warns and pads with zeros).
        if (this.fake * 8 > this.nbits) this.ended();
        this.fake++;
        byte = 0;
      }
      this.bits = ((this.bits << 8) | byte) >>> 0;
      this.nbits += 8;
    }
  }

  /** Throws when bits past the data were used. */
  check(): void {
    if (this.fake * 8 > this.nbits) this.ended();
  }

  ended(): never {
    if (this.pos + 1 >= this.b.length) throw truncated("premature end of the file");
    throw corrupt(
      `premature end of data segment at marker 0xFF${hex(this.b[this.pos + 1])}`,
    );
  }

  /** Whole bytes of data read into the buffer and not used. */
  unusedBytes(): number {
    return Math.max(0, this.nbits - 8 * this.fake) >> 3;
  }

  /** Drops the buffered bits (at a restart marker or the end of a scan). */
  reset(): void {
    this.check();
    this.bits = this.nbits = this.fake = 0;
  }

  decode(h: Huffman): number {
    if (this.nbits < 16) this.fill();
    const e = h.fast[(this.bits >>> (this.nbits - 9)) & 511];
    if (e !== 0) {
      this.nbits -= e >> 8;
      return e & 255;
    }
    let len = 10;
    let code = (this.bits >>> (this.nbits - 10)) & 1023;
    while (code > h.maxcode[len]) {
      len++;
      code = (this.bits >>> (this.nbits - len)) & ((1 << len) - 1);
    }
    if (len > 16) throw corrupt("bad Huffman code");
    this.nbits -= len;
    return h.symbols[(h.offset[len] + code) & 255];
  }

  /** `s` (1..16) bits as a number. */
  receive(s: number): number {
    if (this.nbits < s) this.fill();
    this.nbits -= s;
    return (this.bits >>> this.nbits) & ((1 << s) - 1);
  }

  /** `s` bits as a signed value (T.81's EXTEND). */
  extend(s: number): number {
    const v = this.receive(s);
    return v < 1 << (s - 1) ? v - (1 << s) + 1 : v;
  }

  bit(): number {
    if (this.nbits < 1) this.fill();
    return (this.bits >>> --this.nbits) & 1;
  }
}

interface Component {
  id: number;
  h: number;
  v: number;
  tq: number;
  /** Dequantization factors in block order, latched at the component's first scan. */
  quant: Int32Array | undefined;
  /** Blocks per row and per column held (whole MCUs). */
  bpl: number;
  bpc: number;
  /** Samples per row and rows of the component (libjpeg's downsampled size). */
  dw: number;
  dh: number;
  coefs: Int16Array;
  pred: number;
  dc: Huffman | undefined;
  ac: Huffman | undefined;
}

interface Frame {
  width: number;
  height: number;
  progressive: boolean;
  comps: Component[];
  hmax: number;
  vmax: number;
  mcusX: number;
  mcusY: number;
}

/** Parses segments in order; with `headerOnly`, stops at the frame header. */
class Parser {
  pos = 2;
  quant: (Int32Array | undefined)[] = [];
  dcTables: (Huffman | undefined)[] = [];
  acTables: (Huffman | undefined)[] = [];
  restartInterval = 0;
  adobe: number | undefined;
  jfif = false;
  frame: Frame | undefined;
  eobrun = 0;
  /** Whole bytes of the last scan's data that decoding left unused. */
  leftover = 0;

  constructor(readonly b: Uint8Array, readonly maxPixels: number) {
    if (b.length < 2 || b[0] !== 0xff || b[1] !== 0xd8) {
      throw new ImageDecodeError("JPEG header is corrupt (no SOI marker at the start)");
    }
  }

  /** A corrupt header (before the frame's scans) or corrupt data. */
  corrupt(what: string): ImageDecodeError {
    return this.frame ? corrupt(what) : new ImageDecodeError(`JPEG header is corrupt (${what})`);
  }

  /** The next marker's code: fill bytes (0xFF) skipped, bytes that belong to nothing refused. */
  marker(): number {
    const b = this.b;
    // Bytes before a marker that belong to nothing (libjpeg warns of them, and the TurboJPEG
    // path refuses the file for it): whole bytes of a scan's data left undecoded, and more.
    let extra = this.leftover;
    this.leftover = 0;
    for (;;) {
      while (this.pos < b.length && b[this.pos] !== 0xff) this.pos++, extra++;
      while (this.pos < b.length && b[this.pos] === 0xff) this.pos++;
      if (this.pos >= b.length) {
        throw this.frame ? truncated("premature end of the file") : new ImageDecodeError(
          "JPEG header is truncated (no frame header before the end)",
        );
      }
      const c = b[this.pos++];
      if (c === 0) extra += 2;
      else if (extra > 0) {
        throw this.corrupt(`${extra} extraneous bytes before marker 0xFF${hex(c)}`);
      } else return c;
    }
  }

  /** The segment after a marker: its payload's start and end (its length checked). */
  segment(): [number, number] {
    const b = this.b;
    if (this.pos + 2 > b.length) throw this.headerEnd();
    const len = (b[this.pos] << 8) | b[this.pos + 1];
    if (len < 2) throw this.corrupt(`a segment length of ${len}`);
    const start = this.pos + 2, end = this.pos + len;
    if (end > b.length) throw this.headerEnd();
    this.pos = end;
    return [start, end];
  }

  headerEnd(): ImageDecodeError {
    return this.frame
      ? truncated("premature end of the file")
      : new ImageDecodeError("JPEG header is truncated (a segment runs past the end)");
  }

  /** Reads segments up to the frame header (headerOnly) or through EOI. */
  run(headerOnly: boolean): void {
    for (;;) {
      const m = this.marker();
      if (m === 0xd9) {
        if (!this.frame) {
          throw new ImageDecodeError("JPEG header is corrupt (EOI before any frame header)");
        }
        return;
      }
      if (m >= 0xd0 && m <= 0xd7 || m === 0x01) continue; // stray RST/TEM: no segment
      if (m === 0xd8) throw this.corrupt("a second SOI marker");
      if (m < 0xc0 || (m > 0xdd && m < 0xe0) || (m > 0xef && m !== 0xfe)) {
        throw this.corrupt(`an unsupported marker 0xFF${hex(m)}`);
      }
      // A frame of a kind not decoded says so before anything else is checked.
      if (m >= 0xc3 && m <= 0xcf && m !== 0xc4 && m !== 0xcc) {
        throw new ImageDecodeError(unsupported(m));
      }
      const [s, e] = this.segment();
      if (m === 0xc0 || m === 0xc1 || m === 0xc2) {
        if (this.frame) throw this.corrupt("a second frame header");
        this.sof(s, e, m === 0xc2);
        if (headerOnly) return;
      } else if (m === 0xc4) this.dht(s, e);
      else if (m === 0xdb) this.dqt(s, e);
      else if (m === 0xdd) {
        if (e - s !== 2) throw this.corrupt("a DRI segment of the wrong length");
        this.restartInterval = (this.b[s] << 8) | this.b[s + 1];
      } else if (m === 0xda) {
        if (!this.frame) throw this.corrupt("a scan before the frame header");
        if (headerOnly) return;
        this.sos(s, e);
      } else if (m === 0xe0) {
        const b = this.b;
        if (e - s >= 5 && b[s] === 0x4a && b[s + 1] === 0x46 && b[s + 2] === 0x49) this.jfif = true;
      } else if (m === 0xee) {
        const b = this.b;
        if (e - s >= 12 && b[s] === 0x41 && b[s + 1] === 0x64 && b[s + 2] === 0x6f) {
          this.adobe = b[s + 11];
        }
      }
    }
  }

  dqt(s: number, e: number): void {
    const b = this.b;
    while (s < e) {
      const pq = b[s] >> 4, tq = b[s] & 15;
      if (pq > 1 || tq > 3) throw this.corrupt(`a quantization table ${b[s]}`);
      const size = pq ? 128 : 64;
      if (s + 1 + size > e) throw this.corrupt("a short DQT segment");
      const q = new Int32Array(64);
      for (let k = 0; k < 64; k++) {
        q[ZIGZAG[k]] = pq ? (b[s + 1 + 2 * k] << 8) | b[s + 2 + 2 * k] : b[s + 1 + k];
      }
      this.quant[tq] = q;
      s += 1 + size;
    }
  }

  dht(s: number, e: number): void {
    const b = this.b;
    while (s < e) {
      if (s + 17 > e) throw this.corrupt("a short DHT segment");
      const tc = b[s] >> 4, th = b[s] & 15;
      if (tc > 1 || th > 3) throw this.corrupt(`a Huffman table ${b[s]}`);
      const counts = b.subarray(s + 1, s + 17);
      let n = 0;
      for (const c of counts) n += c;
      if (n > 256 || s + 17 + n > e) throw this.corrupt("a Huffman table of bad length");
      const t = buildHuffman(counts, b.slice(s + 17, s + 17 + n), (w) => this.corrupt(w));
      (tc ? this.acTables : this.dcTables)[th] = t;
      s += 17 + n;
    }
  }

  sof(s: number, e: number, progressive: boolean): void {
    const b = this.b;
    if (e - s < 6) throw this.corrupt("a short frame header");
    const precision = b[s];
    const height = (b[s + 1] << 8) | b[s + 2], width = (b[s + 3] << 8) | b[s + 4];
    const n = b[s + 5];
    if (precision !== 8) {
      throw new ImageDecodeError(
        `${precision}-bit JPEG is not decoded (8-bit samples only)`,
      );
    }
    if (height === 0) {
      throw new ImageDecodeError("JPEG DNL marker (height after the scan) is not supported");
    }
    if (width === 0) throw new ImageDecodeError("JPEG header is corrupt (width 0)");
    if (n !== 1 && n !== 3 && n !== 4) {
      throw new ImageDecodeError(`JPEG of ${n} components is not decoded (1, 3 or 4)`);
    }
    if (e - s !== 6 + 3 * n) throw this.corrupt("a frame header of the wrong length");
    if (width * height > this.maxPixels) {
      throw new ImageDecodeError(
        `image of ${width}x${height} = ${
          width * height
        } pixels exceeds the limit of ${this.maxPixels} (maxPixels)`,
      );
    }
    const comps: Component[] = [];
    for (let i = 0; i < n; i++) {
      const at = s + 6 + 3 * i;
      const h = b[at + 1] >> 4, v = b[at + 1] & 15, tq = b[at + 2];
      if (h < 1 || h > 4 || v < 1 || v > 4 || tq > 3) {
        throw new ImageDecodeError(
          `JPEG header is corrupt (component ${i}: sampling ${h}x${v}, table ${tq})`,
        );
      }
      comps.push({
        id: b[at],
        h,
        v,
        tq,
        quant: undefined,
        bpl: 0,
        bpc: 0,
        dw: 0,
        dh: 0,
        coefs: new Int16Array(0),
        pred: 0,
        dc: undefined,
        ac: undefined,
      });
    }
    // A single component is one block per MCU whatever its factors say (T.81 A.2.2).
    if (n === 1) comps[0].h = comps[0].v = 1;
    const hmax = Math.max(...comps.map((c) => c.h)), vmax = Math.max(...comps.map((c) => c.v));
    for (const c of comps) {
      if (hmax % c.h || vmax % c.v) {
        throw new ImageDecodeError(
          `JPEG sampling factors ${
            comps.map((c) => `${c.h}x${c.v}`).join(", ")
          } are not integer ratios (not decoded, as libjpeg)`,
        );
      }
    }
    const mcusX = Math.ceil(width / (8 * hmax)), mcusY = Math.ceil(height / (8 * vmax));
    this.frame = { width, height, progressive, comps, hmax, vmax, mcusX, mcusY };
  }

  /** Allocates the coefficients (after the header and the pixel limit were checked). */
  allocate(): void {
    const f = this.frame!;
    for (const c of f.comps) {
      c.bpl = f.mcusX * c.h;
      c.bpc = f.mcusY * c.v;
      c.dw = Math.ceil((f.width * c.h) / f.hmax);
      c.dh = Math.ceil((f.height * c.v) / f.vmax);
      c.coefs = new Int16Array(c.bpl * c.bpc * 64);
    }
  }

  sos(s: number, e: number): void {
    const b = this.b, f = this.frame!;
    const ns = b[s];
    if (ns < 1 || ns > 4 || e - s !== 4 + 2 * ns) throw this.corrupt("a bad scan header");
    const comps: Component[] = [];
    for (let i = 0; i < ns; i++) {
      const id = b[s + 1 + 2 * i], t = b[s + 2 + 2 * i];
      const c = f.comps.find((c) => c.id === id);
      if (c === undefined || comps.includes(c)) throw this.corrupt(`a scan of component id ${id}`);
      c.dc = this.dcTables[t >> 4];
      c.ac = this.acTables[t & 15];
      if (c.quant === undefined) {
        const q = this.quant[c.tq];
        if (q === undefined) throw this.corrupt(`quantization table ${c.tq} is not defined`);
        c.quant = q.slice();
      }
      comps.push(c);
    }
    const at = s + 1 + 2 * ns;
    const ss = b[at], se = b[at + 1], ah = b[at + 2] >> 4, al = b[at + 2] & 15;
    if (f.progressive) {
      if (
        ss > se || se > 63 || (ss === 0 && se !== 0) || (ss !== 0 && ns !== 1) ||
        (ah !== 0 && al !== ah - 1) || al > 13
      ) {
        throw this.corrupt(`invalid progressive parameters Ss=${ss} Se=${se} Ah=${ah} Al=${al}`);
      }
    }
    if (ns > 1 && comps.reduce((n, c) => n + c.h * c.v, 0) > 10) {
      throw this.corrupt("sampling factors too large for an interleaved scan");
    }
    for (const c of comps) {
      const needDc = !f.progressive || (ss === 0 && ah === 0);
      const needAc = !f.progressive || ss > 0;
      if (needDc && c.dc === undefined) {
        throw this.corrupt("a scan uses an undefined DC Huffman table");
      }
      // A DC difference has at most 15 bits: libjpeg refuses a DC table with larger symbols.
      if (needDc && c.dc!.symbols.some((v) => v > 15)) throw this.corrupt("a bad DC Huffman table");
      if (needAc && c.ac === undefined) {
        throw this.corrupt("a scan uses an undefined AC Huffman table");
      }
      c.pred = 0;
    }
    this.pos = e;
    this.scan(comps, ss, se, ah, al);
  }

  scan(comps: Component[], ss: number, se: number, ah: number, al: number): void {
    const f = this.frame!;
    const r = new BitReader(this.b, this.pos);
    this.eobrun = 0;
    const block = !f.progressive
      ? (c: Component, o: number) => this.baseline(r, c, o)
      : ss === 0
      ? ah === 0
        ? (c: Component, o: number) => this.dcFirst(r, c, o, al)
        : (c: Component, o: number) => this.dcRefine(r, c, o, al)
      : ah === 0
      ? (c: Component, o: number) => this.acFirst(r, c, o, ss, se, al)
      : (c: Component, o: number) => this.acRefine(r, c, o, ss, se, al);
    const single = comps.length === 1;
    const c0 = comps[0];
    // One component alone: its blocks that hold image samples, row by row (T.81 A.2.2).
    const perRow = single ? Math.ceil(c0.dw / 8) : f.mcusX;
    const total = single ? perRow * Math.ceil(c0.dh / 8) : f.mcusX * f.mcusY;
    const ri = this.restartInterval;
    let rst = 0;
    for (let m = 0; m < total; m++) {
      if (ri > 0 && m > 0 && m % ri === 0) {
        this.restart(r, rst++, comps);
      }
      const my = (m / perRow) | 0, mx = m - my * perRow;
      if (single) block(c0, (my * c0.bpl + mx) * 64);
      else {
        for (const c of comps) {
          for (let v = 0; v < c.v; v++) {
            const row = (my * c.v + v) * c.bpl + mx * c.h;
            for (let h = 0; h < c.h; h++) block(c, (row + h) * 64);
          }
        }
      }
    }
    r.check();
    this.leftover = r.unusedBytes();
    this.pos = r.pos;
  }

  /** Expects restart marker `n` (mod 8) where the bits stop, and resets the predictions. */
  restart(r: BitReader, n: number, comps: Component[]): void {
    const extra = r.unusedBytes();
    r.reset();
    const b = this.b;
    let p = r.pos;
    while (p < b.length && b[p] === 0xff) p++;
    if (p >= b.length) throw truncated("premature end of the file");
    if (extra > 0 || p === r.pos || b[p] !== 0xd0 + (n & 7)) {
      throw corrupt(
        `expected restart marker RST${n & 7}, found ${
          extra > 0 || p === r.pos ? "more entropy-coded data" : `marker 0xFF${hex(b[p])}`
        }`,
      );
    }
    r.pos = p + 1;
    for (const c of comps) c.pred = 0;
    this.eobrun = 0;
  }

  baseline(r: BitReader, c: Component, o: number): void {
    const coefs = c.coefs, ac = c.ac!;
    const s = r.decode(c.dc!);
    c.pred += s ? r.extend(s) : 0;
    coefs[o] = c.pred;
    for (let k = 1; k < 64; k++) {
      const rs = r.decode(ac);
      const run = rs >> 4, size = rs & 15;
      if (size) {
        k += run;
        coefs[o + ZIGZAG[k]] = r.extend(size);
      } else if (run === 15) k += 15;
      else break;
    }
  }

  dcFirst(r: BitReader, c: Component, o: number, al: number): void {
    const s = r.decode(c.dc!);
    c.pred += s ? r.extend(s) : 0;
    c.coefs[o] = c.pred << al;
  }

  dcRefine(r: BitReader, c: Component, o: number, al: number): void {
    if (r.bit()) c.coefs[o] |= 1 << al;
  }

  acFirst(r: BitReader, c: Component, o: number, ss: number, se: number, al: number): void {
    if (this.eobrun > 0) {
      this.eobrun--;
      return;
    }
    const coefs = c.coefs, ac = c.ac!;
    for (let k = ss; k <= se; k++) {
      const rs = r.decode(ac);
      const run = rs >> 4, size = rs & 15;
      if (size) {
        k += run;
        coefs[o + ZIGZAG[k]] = r.extend(size) * (1 << al);
      } else if (run === 15) k += 15;
      else {
        this.eobrun = (1 << run) - 1;
        if (run) this.eobrun += r.receive(run);
        break;
      }
    }
  }

  acRefine(r: BitReader, c: Component, o: number, ss: number, se: number, al: number): void {
    const coefs = c.coefs, p1 = 1 << al, m1 = -1 << al;
    let k = ss;
    if (this.eobrun === 0) {
      const ac = c.ac!;
      for (; k <= se; k++) {
        const rs = r.decode(ac);
        let run = rs >> 4, value = 0;
        const size = rs & 15;
        if (size) {
          if (size !== 1) throw corrupt("a refinement coefficient of more than 1 bit");
          value = r.bit() ? p1 : m1;
        } else if (run !== 15) {
          this.eobrun = 1 << run;
          if (run) this.eobrun += r.receive(run);
          break;
        }
        // Skip `run` zero coefficients, refining the non-zero ones passed on the way.
        for (; k <= se; k++) {
          const z = o + ZIGZAG[k];
          if (coefs[z] !== 0) {
            if (r.bit() && (coefs[z] & p1) === 0) coefs[z] += coefs[z] >= 0 ? p1 : m1;
          } else if (--run < 0) break;
        }
        if (value) coefs[o + ZIGZAG[k]] = value;
      }
    }
    if (this.eobrun > 0) {
      for (; k <= se; k++) {
        const z = o + ZIGZAG[k];
        if (coefs[z] !== 0 && r.bit() && (coefs[z] & p1) === 0) {
          coefs[z] += coefs[z] >= 0 ? p1 : m1;
        }
      }
      this.eobrun--;
    }
  }

  info(): JpegInfo {
    const f = this.frame!;
    return {
      width: f.width,
      height: f.height,
      colorspace: this.colorspace(),
      progressive: f.progressive,
    };
  }

  /** libjpeg's rules: JFIF, then the Adobe transform, then the component ids. */
  colorspace(): JpegInfo["colorspace"] {
    const comps = this.frame!.comps;
    if (comps.length === 1) return "grey";
    if (comps.length === 4) return this.adobe === undefined || this.adobe === 0 ? "cmyk" : "ycck";
    if (this.jfif) return "ycbcr";
    if (this.adobe !== undefined) return this.adobe === 0 ? "rgb" : "ycbcr";
    const [a, b, c] = comps.map((c) => c.id);
    return a === 0x52 && b === 0x47 && c === 0x42 ? "rgb" : "ycbcr";
  }
}

/** Why a frame type is refused. */
function unsupported(m: number): string {
  const sof = `SOF${m - 0xc0}`;
  if (m === 0xc9 || m === 0xca) {
    return `arithmetic-coded JPEG (${sof}) is not decoded by the TypeScript fallback ` +
      "(libjpeg-turbo decodes it: apt-get install libturbojpeg0, and --allow-ffi)";
  }
  if (m === 0xc3 || m === 0xcb) return `lossless JPEG (${sof}) is not decoded`;
  return `hierarchical JPEG (${sof}) is not decoded`;
}

/**
 * The size and colour space of a JPEG, from the segments before its first scan.
 *
 * @param bytes the file
 * @returns the frame's size and colour space
 * @throws {ImageDecodeError} when the header is truncated or corrupt, or the file is of a
 *   kind not decoded (arithmetic, lossless, 12-bit)
 * @example
 * ```ts
 * import { jpegInfo } from "./jpeg.ts";
 * import assert from "node:assert";
 * // SOI, then a frame header of a 3x2 greyscale baseline JPEG.
 * const sof = [0xff, 0xc0, 0, 11, 8, 0, 2, 0, 3, 1, 1, 0x11, 0];
 * const info = jpegInfo(new Uint8Array([0xff, 0xd8, ...sof]));
 * assert.deepStrictEqual([info.width, info.height, info.colorspace], [3, 2, "grey"]);
 * ```
 */
export function jpegInfo(bytes: Uint8Array): JpegInfo {
  const p = new Parser(bytes, Infinity);
  p.run(true);
  if (!p.frame) throw new ImageDecodeError("JPEG header is truncated (no frame header)");
  return p.info();
}

/** Options of {@linkcode decodeJpegTs}. */
export interface DecodeJpegOptions {
  /** Refuse frames with more pixels, before allocating anything (default: no limit). */
  maxPixels?: number;
  /** Where the pixels go, at least `height * width * channels` bytes of the scaled size. */
  out?: Uint8Array;
  /** Decode at 1/scale of the size in the DCT domain, as libjpeg-turbo (default 1). */
  scale?: 1 | 2 | 4 | 8;
}

/**
 * Decodes a JPEG as libjpeg-turbo's default decode does, bit for bit: at full size, or
 * scaled by 1/2, 1/4 or 1/8 in the DCT domain (each side rounded up).
 *
 * @param bytes the file
 * @param channels 1 (the luma plane of YCbCr), 3 (RGB) or 4 (RGBA, alpha 255)
 * @param options the pixel limit, where the pixels go and the scale
 * @returns the pixels, HWC
 * @throws {ImageDecodeError} for a truncated, corrupt, too large or unsupported file
 * @example A grey 8x8 block of one DC value
 * ```ts
 * import { decodeJpegTs } from "./jpeg.ts";
 * import assert from "node:assert";
 * const dqt = [0xff, 0xdb, 0, 67, 0, ...new Array(64).fill(1)];
 * const sof = [0xff, 0xc0, 0, 11, 8, 0, 8, 0, 8, 1, 1, 0x11, 0];
 * // DC table: one code "0" for size 0; AC table: one code "0" for end-of-block.
 * const dht = [0xff, 0xc4, 0, 38, 0x00, 1, ...new Array(15).fill(0), 0,
 *   0x10, 1, ...new Array(15).fill(0), 0];
 * const sos = [0xff, 0xda, 0, 8, 1, 1, 0x00, 0, 63, 0];
 * const jpeg = new Uint8Array([0xff, 0xd8, ...dqt, ...sof, ...dht, ...sos, 0x3f, 0xff, 0xd9]);
 * const img = decodeJpegTs(jpeg, 1);
 * assert.deepStrictEqual([img.height, img.width, img.data[0], img.data[63]], [8, 8, 128, 128]);
 * assert.deepStrictEqual([...decodeJpegTs(jpeg, 3, { scale: 8 }).data], [128, 128, 128]);
 * ```
 */
export function decodeJpegTs(
  bytes: Uint8Array,
  channels: Channels,
  options: DecodeJpegOptions = {},
): DecodedImage {
  const scale = options.scale ?? 1;
  if (![1, 2, 4, 8].includes(scale)) {
    throw new RangeError(`Cannot decode a JPEG at scale 1/${scale}: 1, 2, 4 or 8`);
  }
  const p = new Parser(bytes, options.maxPixels ?? Infinity);
  p.run(true);
  if (!p.frame) throw new ImageDecodeError("JPEG header is truncated (no frame header)");
  const f = p.frame;
  const min = 8 / scale;
  const W = Math.ceil((f.width * min) / 8), H = Math.ceil((f.height * min) / 8);
  const n = W * H;
  const out = options.out;
  if (out !== undefined && out.length < n * channels) {
    throw new RangeError(`Cannot decode into ${out.length} bytes: the image needs ${n * channels}`);
  }
  p.allocate();
  // run(true) stopped after the frame header: go on from there.
  p.run(false);
  const space = p.colorspace();
  const dst = out ?? new Uint8Array(n * channels);
  const plane = (c: Component): Plane => {
    // libjpeg's choice: a subsampled component takes a larger IDCT where that spares
    // upsampling (scaled decodes only).
    let size = min;
    while (
      size < 8 && (f.hmax * min) % (c.h * size * 2) === 0 && (f.vmax * min) % (c.v * size * 2) === 0
    ) size *= 2;
    const hs = (f.hmax * min) / (c.h * size), vs = (f.vmax * min) / (c.v * size);
    if (!Number.isInteger(hs) || !Number.isInteger(vs)) {
      throw new ImageDecodeError(`JPEG sampling ${c.h}x${c.v} does not scale by 1/${scale}`);
    }
    const samples = transform(
      c.coefs,
      c.bpl,
      Math.ceil(c.dw / 8),
      Math.ceil(c.dh / 8),
      c.quant ?? new Int32Array(64),
      size as 1 | 2 | 4 | 8,
    );
    const dw = Math.ceil((f.width * c.h * size) / (f.hmax * 8));
    const dh = Math.ceil((f.height * c.v * size) / (f.vmax * 8));
    return upsample(samples, dw, dh, hs, vs, [W, H], min > 1);
  };
  const comps = space === "grey" || (space === "ycbcr" && channels === 1)
    ? f.comps.slice(0, 1)
    : f.comps;
  toChannels(space, comps.map(plane), [W, H], channels, dst);
  return { data: dst.subarray(0, n * channels), height: H, width: W, channels };
}
