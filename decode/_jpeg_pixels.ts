/**
 * The pixel stage of the TypeScript JPEG decoder (decode/jpeg.ts): libjpeg-turbo's integer
 * IDCTs (the accurate 8x8 one, and the reduced 4x4, 2x2 and 1x1 ones of its DCT scaling),
 * its upsampling and its fixed-point YCbCr tables, reproduced from their arithmetic so the
 * pixels equal TurboJPEG's and djpeg's bit for bit.
 *
 * @module
 */

import type { Channels } from "./types.ts";
import { cmykToChannels } from "./turbojpeg.ts";

/**
 * The IDCT's output: the sample re-centred on 128 and clamped to 0..255. libjpeg's C code
 * wraps values past +-512 (a 10-bit table) where its SIMD code, which TurboJPEG runs,
 * saturates; the two agree on every coefficient an 8-bit encoder writes, and this follows
 * the SIMD code for the rest (corrupt data).
 */
function CL(v: number): number {
  return v < -128 ? 0 : v > 127 ? 255 : v + 128;
}

// YCbCr -> RGB in 16-bit fixed point, libjpeg's tables (jdcolor.c's arithmetic).
const FIX = (x: number) => Math.floor(x * 65536 + 0.5);
const CR_R = new Int32Array(256), CB_B = new Int32Array(256);
const CR_G = new Int32Array(256), CB_G = new Int32Array(256);
for (let i = 0; i < 256; i++) {
  const x = i - 128;
  CR_R[i] = (FIX(1.402) * x + 32768) >> 16;
  CB_B[i] = (FIX(1.772) * x + 32768) >> 16;
  CR_G[i] = -FIX(0.71414) * x;
  CB_G[i] = -FIX(0.34414) * x + 32768;
}

/** The accurate integer IDCT of one block (LL&M, 13-bit constants, 2 extra bits in pass 1). */
function idct8(
  coefs: Int16Array,
  o: number,
  q: Int32Array,
  ws: Int32Array,
  out: Uint8Array,
  at: number,
  stride: number,
): void {
  // Columns: dequantize, transform, keep 2 more bits than the input.
  for (let x = 0; x < 8; x++) {
    const c = o + x;
    if (
      (coefs[c + 8] | coefs[c + 16] | coefs[c + 24] | coefs[c + 32] | coefs[c + 40] |
        coefs[c + 48] | coefs[c + 56]) === 0
    ) {
      const dc = (coefs[c] * q[x]) << 2;
      for (let y = 0; y < 64; y += 8) ws[x + y] = dc;
      continue;
    }
    let z2 = coefs[c + 16] * q[x + 16], z3 = coefs[c + 48] * q[x + 48];
    let z1 = (z2 + z3) * 4433;
    let t2 = z1 - z3 * 15137, t3 = z1 + z2 * 6270;
    z2 = coefs[c] * q[x];
    z3 = coefs[c + 32] * q[x + 32];
    let t0 = (z2 + z3) << 13, t1 = (z2 - z3) << 13;
    const t10 = t0 + t3, t13 = t0 - t3, t11 = t1 + t2, t12 = t1 - t2;
    t0 = coefs[c + 56] * q[x + 56];
    t1 = coefs[c + 40] * q[x + 40];
    t2 = coefs[c + 24] * q[x + 24];
    t3 = coefs[c + 8] * q[x + 8];
    z1 = t0 + t3;
    z2 = t1 + t2;
    z3 = t0 + t2;
    let z4 = t1 + t3;
    const z5 = (z3 + z4) * 9633;
    t0 *= 2446;
    t1 *= 16819;
    t2 *= 25172;
    t3 *= 12299;
    z1 *= -7373;
    z2 *= -20995;
    z3 = z3 * -16069 + z5;
    z4 = z4 * -3196 + z5;
    t0 += z1 + z3;
    t1 += z2 + z4;
    t2 += z2 + z3;
    t3 += z1 + z4;
    ws[x] = (t10 + t3 + 1024) >> 11;
    ws[x + 56] = (t10 - t3 + 1024) >> 11;
    ws[x + 8] = (t11 + t2 + 1024) >> 11;
    ws[x + 48] = (t11 - t2 + 1024) >> 11;
    ws[x + 16] = (t12 + t1 + 1024) >> 11;
    ws[x + 40] = (t12 - t1 + 1024) >> 11;
    ws[x + 24] = (t13 + t0 + 1024) >> 11;
    ws[x + 32] = (t13 - t0 + 1024) >> 11;
  }
  // Rows: transform, drop the 2 bits and the 3 of the 8-point scaling, re-centre and clamp.
  for (let y = 0; y < 64; y += 8, at += stride) {
    if ((ws[y + 1] | ws[y + 2] | ws[y + 3] | ws[y + 4] | ws[y + 5] | ws[y + 6] | ws[y + 7]) === 0) {
      // The full transform of a row with only its first term gives this value 8 times.
      const v = CL((ws[y] + 16) >> 5);
      for (let k = 0; k < 8; k++) out[at + k] = v;
      continue;
    }
    let z2 = ws[y + 2], z3 = ws[y + 6];
    let z1 = (z2 + z3) * 4433;
    let t2 = z1 - z3 * 15137, t3 = z1 + z2 * 6270;
    let t0 = (ws[y] + ws[y + 4]) << 13, t1 = (ws[y] - ws[y + 4]) << 13;
    const t10 = t0 + t3, t13 = t0 - t3, t11 = t1 + t2, t12 = t1 - t2;
    t0 = ws[y + 7];
    t1 = ws[y + 5];
    t2 = ws[y + 3];
    t3 = ws[y + 1];
    z1 = t0 + t3;
    z2 = t1 + t2;
    z3 = t0 + t2;
    let z4 = t1 + t3;
    const z5 = (z3 + z4) * 9633;
    t0 *= 2446;
    t1 *= 16819;
    t2 *= 25172;
    t3 *= 12299;
    z1 *= -7373;
    z2 *= -20995;
    z3 = z3 * -16069 + z5;
    z4 = z4 * -3196 + z5;
    t0 += z1 + z3;
    t1 += z2 + z4;
    t2 += z2 + z3;
    t3 += z1 + z4;
    out[at] = CL((t10 + t3 + 131072) >> 18);
    out[at + 7] = CL((t10 - t3 + 131072) >> 18);
    out[at + 1] = CL((t11 + t2 + 131072) >> 18);
    out[at + 6] = CL((t11 - t2 + 131072) >> 18);
    out[at + 2] = CL((t12 + t1 + 131072) >> 18);
    out[at + 5] = CL((t12 - t1 + 131072) >> 18);
    out[at + 3] = CL((t13 + t0 + 131072) >> 18);
    out[at + 4] = CL((t13 - t0 + 131072) >> 18);
  }
}

// The reduced IDCTs compute the 8-point IDCT's sums over 2 (4x4) or 4 (2x2) neighbouring
// samples: each constant is sqrt(2) times a sum of cosines, in 13 bits, and the DC term is
// shifted 1 or 2 bits further to match. Row and column 4 (and, for 2x2, 2 and 6) add
// nothing to those sums.

/** 4x4 output of one block (libjpeg's reduced IDCT for scale 1/2). */
function idct4(
  coefs: Int16Array,
  o: number,
  q: Int32Array,
  ws: Int32Array,
  out: Uint8Array,
  at: number,
  stride: number,
): void {
  for (let x = 0; x < 8; x++) {
    if (x === 4) continue;
    const c = o + x;
    const t0 = (coefs[c] * q[x]) * 16384;
    const z2 = coefs[c + 16] * q[x + 16], z3 = coefs[c + 48] * q[x + 48];
    const e = z2 * 15137 - z3 * 6270;
    const t10 = t0 + e, t12 = t0 - e;
    const z1 = coefs[c + 56] * q[x + 56], z5 = coefs[c + 40] * q[x + 40];
    const z6 = coefs[c + 24] * q[x + 24], z4 = coefs[c + 8] * q[x + 8];
    const o0 = -z1 * 1730 + z5 * 11893 - z6 * 17799 + z4 * 8697;
    const o2 = -z1 * 4176 - z5 * 4926 + z6 * 7373 + z4 * 20995;
    ws[x] = (t10 + o2 + 2048) >> 12;
    ws[x + 24] = (t10 - o2 + 2048) >> 12;
    ws[x + 8] = (t12 + o0 + 2048) >> 12;
    ws[x + 16] = (t12 - o0 + 2048) >> 12;
  }
  for (let y = 0; y < 32; y += 8, at += stride) {
    const t0 = ws[y] * 16384;
    const e = ws[y + 2] * 15137 - ws[y + 6] * 6270;
    const t10 = t0 + e, t12 = t0 - e;
    const z1 = ws[y + 7], z5 = ws[y + 5], z6 = ws[y + 3], z4 = ws[y + 1];
    const o0 = -z1 * 1730 + z5 * 11893 - z6 * 17799 + z4 * 8697;
    const o2 = -z1 * 4176 - z5 * 4926 + z6 * 7373 + z4 * 20995;
    out[at] = CL((t10 + o2 + 262144) >> 19);
    out[at + 3] = CL((t10 - o2 + 262144) >> 19);
    out[at + 1] = CL((t12 + o0 + 262144) >> 19);
    out[at + 2] = CL((t12 - o0 + 262144) >> 19);
  }
}

/** 2x2 output of one block (libjpeg's reduced IDCT for scale 1/4). */
function idct2(
  coefs: Int16Array,
  o: number,
  q: Int32Array,
  ws: Int32Array,
  out: Uint8Array,
  at: number,
  stride: number,
): void {
  for (let x = 1; x < 8; x += 2) idct2Column(coefs, o, q, ws, x);
  idct2Column(coefs, o, q, ws, 0);
  for (let y = 0; y < 16; y += 8, at += stride) {
    const t10 = ws[y] * 32768;
    const t0 = -ws[y + 7] * 5906 + ws[y + 5] * 6967 - ws[y + 3] * 10426 + ws[y + 1] * 29692;
    out[at] = CL((t10 + t0 + 524288) >> 20);
    out[at + 1] = CL((t10 - t0 + 524288) >> 20);
  }
}

function idct2Column(coefs: Int16Array, o: number, q: Int32Array, ws: Int32Array, x: number) {
  const c = o + x;
  const t10 = coefs[c] * q[x] * 32768;
  const t0 = -coefs[c + 56] * q[x + 56] * 5906 + coefs[c + 40] * q[x + 40] * 6967 -
    coefs[c + 24] * q[x + 24] * 10426 + coefs[c + 8] * q[x + 8] * 29692;
  ws[x] = (t10 + t0 + 4096) >> 13;
  ws[x + 8] = (t10 - t0 + 4096) >> 13;
}

/** 1x1 output of one block: its DC term (scale 1/8). */
function idct1(
  coefs: Int16Array,
  o: number,
  q: Int32Array,
  _ws: Int32Array,
  out: Uint8Array,
  at: number,
): void {
  out[at] = CL((coefs[o] * q[0] + 4) >> 3);
}

const IDCTS = { 1: idct1, 2: idct2, 4: idct4, 8: idct8 } as const;

/**
 * Pixels from the colour planes (upsampled): grey (the first plane), YCbCr or RGB to 1, 3
 * or 4 channels, CMYK or YCCK to them as the TurboJPEG path converts CMYK.
 */
export function toChannels(
  space: "grey" | "ycbcr" | "rgb" | "cmyk" | "ycck",
  planes: Plane[],
  [W, H]: readonly [number, number],
  channels: Channels,
  dst: Uint8Array,
): void {
  const n = W * H;
  if (space === "grey" || (space === "ycbcr" && channels === 1)) {
    const { data, stride } = planes[0];
    for (let y = 0; y < H; y++) {
      const s = y * stride;
      if (channels === 1) dst.set(data.subarray(s, s + W), y * W);
      else {
        for (let x = 0, o = y * W * channels; x < W; x++, o += channels) {
          const v = data[s + x];
          dst[o] = dst[o + 1] = dst[o + 2] = v;
          if (channels === 4) dst[o + 3] = 255;
        }
      }
    }
  } else if (space === "ycbcr" || space === "rgb") {
    const [a, b, c] = planes;
    const clamped = new Uint8ClampedArray(dst.buffer, dst.byteOffset, n * channels);
    const ycc = space === "ycbcr";
    const A = a.data, B = b.data, C = c.data;
    if (ycc && channels !== 1) {
      // The common case on its own: no per-pixel branches.
      for (let y = 0; y < H; y++) {
        const sa = y * a.stride, sb = y * b.stride, sc = y * c.stride;
        for (let x = 0, o = y * W * channels; x < W; x++, o += channels) {
          const Y = A[sa + x], cb = B[sb + x], cr = C[sc + x];
          clamped[o] = Y + CR_R[cr];
          clamped[o + 1] = Y + ((CB_G[cb] + CR_G[cr]) >> 16);
          clamped[o + 2] = Y + CB_B[cb];
          if (channels === 4) clamped[o + 3] = 255;
        }
      }
      return;
    }
    for (let y = 0; y < H; y++) {
      const sa = y * a.stride, sb = y * b.stride, sc = y * c.stride;
      for (let x = 0, o = y * W * channels; x < W; x++, o += channels) {
        let r = A[sa + x], g = B[sb + x], bl = C[sc + x];
        if (ycc) {
          const Y = r, cb = g, cr = bl;
          r = Y + CR_R[cr];
          g = Y + ((CB_G[cb] + CR_G[cr]) >> 16);
          bl = Y + CB_B[cb];
        }
        if (channels === 1) {
          // libjpeg's RGB to grey: the same weights as Pillow's "L".
          clamped[o] = (r * 19595 + g * 38470 + bl * 7471 + 32768) >> 16;
        } else {
          clamped[o] = r, clamped[o + 1] = g, clamped[o + 2] = bl;
          if (channels === 4) clamped[o + 3] = 255;
        }
      }
    }
  } else {
    const [a, b, c, k] = planes;
    const cmyk = new Uint8ClampedArray(n * 4);
    const ycck = space === "ycck";
    for (let y = 0; y < H; y++) {
      const sa = y * a.stride, sb = y * b.stride, sc = y * c.stride, sk = y * k.stride;
      for (let x = 0, o = y * W * 4; x < W; x++, o += 4) {
        const v0 = a.data[sa + x], v1 = b.data[sb + x], v2 = c.data[sc + x];
        if (ycck) {
          cmyk[o] = 255 - (v0 + CR_R[v2]);
          cmyk[o + 1] = 255 - (v0 + ((CB_G[v1] + CR_G[v2]) >> 16));
          cmyk[o + 2] = 255 - (v0 + CB_B[v1]);
        } else cmyk[o] = v0, cmyk[o + 1] = v1, cmyk[o + 2] = v2;
        cmyk[o + 3] = k.data[sk + x];
      }
    }
    cmykToChannels(new Uint8Array(cmyk.buffer), dst, n, channels);
  }
}

/** A plane of 8-bit samples, `stride` bytes a row. */
export interface Plane {
  data: Uint8Array;
  stride: number;
}

/**
 * The samples of a component: its first `bw` x `bh` blocks (of `bpl` a row in `coefs`),
 * each transformed to `size` x `size` samples.
 */
export function transform(
  coefs: Int16Array,
  bpl: number,
  bw: number,
  bh: number,
  quant: Int32Array,
  size: 1 | 2 | 4 | 8,
): Plane {
  const stride = bw * size;
  const data = new Uint8Array(stride * bh * size);
  const ws = new Int32Array(64);
  const idct = IDCTS[size];
  for (let by = 0; by < bh; by++) {
    for (let bx = 0; bx < bw; bx++) {
      idct(coefs, (by * bpl + bx) * 64, quant, ws, data, by * size * stride + bx * size, stride);
    }
  }
  return { data, stride };
}

/**
 * A component's `n` x `rows` samples brought to `W` x `H` by integer factors `hs` x `vs`:
 * with `fancy`, libjpeg's triangle filter for 2:1 ratios (3/4 of the nearer sample, 1/4 of
 * the next, edges repeated, the rounding bias alternating so that it averages out), and
 * replication otherwise (libjpeg's choice for a component 2 or fewer samples wide, too).
 */
export function upsample(
  plane: Plane,
  n: number,
  rows: number,
  hs: number,
  vs: number,
  size: readonly [W: number, H: number],
  fancy: boolean,
): Plane {
  if (hs === 1 && vs === 1) return plane;
  const [W, H] = size, { data: src, stride } = plane;
  const out = new Uint8Array(W * H);
  const last = rows - 1;
  if (fancy && hs === 2 && vs === 1 && n > 2) {
    const row = new Uint8Array(2 * n);
    for (let y = 0; y < H; y++) {
      const s = y * stride;
      row[0] = src[s];
      row[1] = (src[s] * 3 + src[s + 1] + 2) >> 2;
      for (let i = 1; i < n - 1; i++) {
        const v = src[s + i] * 3;
        row[2 * i] = (v + src[s + i - 1] + 1) >> 2;
        row[2 * i + 1] = (v + src[s + i + 1] + 2) >> 2;
      }
      row[2 * n - 2] = (src[s + n - 1] * 3 + src[s + n - 2] + 1) >> 2;
      row[2 * n - 1] = src[s + n - 1];
      out.set(row.subarray(0, W), y * W);
    }
  } else if (fancy && hs === 1 && vs === 2) {
    for (let y = 0; y < H; y++) {
      const r = y >> 1, lower = y & 1;
      const near = r * stride, far = (lower ? Math.min(r + 1, last) : Math.max(r - 1, 0)) * stride;
      const bias = lower ? 2 : 1, o = y * W;
      for (let x = 0; x < W; x++) out[o + x] = (src[near + x] * 3 + src[far + x] + bias) >> 2;
    }
  } else if (fancy && hs === 2 && vs === 2 && n > 2) {
    const sum = new Int32Array(n), row = new Uint8Array(2 * n);
    for (let y = 0; y < H; y++) {
      const r = y >> 1, lower = y & 1;
      const near = r * stride, far = (lower ? Math.min(r + 1, last) : Math.max(r - 1, 0)) * stride;
      for (let i = 0; i < n; i++) sum[i] = src[near + i] * 3 + src[far + i];
      row[0] = (sum[0] * 4 + 8) >> 4;
      row[1] = (sum[0] * 3 + sum[1] + 7) >> 4;
      for (let i = 1; i < n - 1; i++) {
        const v = sum[i] * 3;
        row[2 * i] = (v + sum[i - 1] + 8) >> 4;
        row[2 * i + 1] = (v + sum[i + 1] + 7) >> 4;
      }
      row[2 * n - 2] = (sum[n - 1] * 3 + sum[n - 2] + 8) >> 4;
      row[2 * n - 1] = (sum[n - 1] * 4 + 7) >> 4;
      out.set(row.subarray(0, W), y * W);
    }
  } else {
    for (let y = 0; y < H; y++) {
      const s = ((y / vs) | 0) * stride, o = y * W;
      for (let x = 0; x < W; x++) out[o + x] = src[s + ((x / hs) | 0)];
    }
  }
  return { data: out, stride: W };
}
