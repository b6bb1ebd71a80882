// Counter-based random numbers for the loader and the augment records.
//
// Every random draw of the loader is a pure function of a key (seed, epoch, stream, counter):
// no generator state travels between threads, so a permutation or a sample's augmentation
// parameters do not depend on which worker computed them, nor on how many workers there are.
// The mixer is the "lowbias32" finalizer (Chris Wellons' hash prospector), applied once per
// key word in a chain. It passes avalanche tests and costs a handful of integer ops, which
// matters because the workers draw three numbers per sample on the fast path.

/** Splits a seed in [0, 2^53) into two 32-bit words. */
export function seedWords(seed: number): [number, number] {
  return [seed >>> 0, Math.floor(seed / 0x1_0000_0000) >>> 0];
}

/** The lowbias32 integer finalizer: a bijection on uint32 with good avalanche. */
export function mix32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

/** Hash of a four-word key; distinct keys give independent-looking uint32 values. */
export function hash4(a: number, b: number, c: number, d: number): number {
  let h = mix32((a ^ 0x9e3779b9) >>> 0);
  h = mix32((h ^ b) + 0x7f4a7c15);
  h = mix32((h ^ c) + 0x6a09e667);
  return mix32((h ^ d) + 0xbb67ae85);
}

/** A double in [0, 1) from two uint32 draws: the top 27 bits of `a` and 26 of `b`. */
function unitDouble(a: number, b: number): number {
  return ((a >>> 5) * 67108864 + (b >>> 6)) / 9007199254740992;
}

/** An integer in [0, n) from a uint32 draw, for n <= 2^32. */
function below(u: number, n: number): number {
  return Math.floor((u / 0x1_0000_0000) * n);
}

/** Streams of one key: a sampler's permutation, a sample's augmentation, a worker seed. */
export const STREAM_SAMPLER = 1;
export const STREAM_SAMPLE = 2;
export const STREAM_WORKER = 3;

/**
 * A counter-based generator: output k is hash(key, k). Cheap to create, so one per sample
 * is fine.
 */
export class CounterRandom {
  #k0: number;
  #k1: number;
  #counter = 0;

  constructor(seed: number, epoch: number, stream: number, id: number) {
    const [lo, hi] = seedWords(seed);
    this.#k0 = hash4(lo, hi, epoch >>> 0, stream);
    this.#k1 = id >>> 0;
  }

  /** Next uint32. */
  nextU32(): number {
    return hash4(this.#k0, this.#k1, this.#counter++, 0x243f6a88);
  }

  /** A double in [0, 1) with 53 random bits. */
  random(): number {
    return unitDouble(this.nextU32(), this.nextU32());
  }

  /** An integer in [0, n) for n <= 2^32 (bias below 2^-32 * n, irrelevant here). */
  int(n: number): number {
    return below(this.nextU32(), n);
  }
}

/**
 * xoshiro128** seeded from a hashed key: a sequential generator for samplers, where one
 * stream produces a whole permutation (about 4x cheaper per draw than hashing a counter, so
 * planning a 50,000-sample epoch takes a fraction of a millisecond).
 */
export class SequenceRandom {
  #s0: number;
  #s1: number;
  #s2: number;
  #s3: number;

  constructor(seed: number, epoch: number, stream: number, id: number) {
    const [lo, hi] = seedWords(seed);
    const k = hash4(lo, hi, epoch >>> 0, stream);
    this.#s0 = hash4(k, id >>> 0, 0, 1) | 1;
    this.#s1 = hash4(k, id >>> 0, 0, 2);
    this.#s2 = hash4(k, id >>> 0, 0, 3);
    this.#s3 = hash4(k, id >>> 0, 0, 4);
  }

  /** Next uint32. */
  nextU32(): number {
    const s1 = this.#s1;
    const r = Math.imul(rotl(Math.imul(s1, 5), 7), 9) >>> 0;
    const t = s1 << 9;
    this.#s2 ^= this.#s0;
    this.#s3 ^= this.#s1;
    this.#s1 ^= this.#s2;
    this.#s0 ^= this.#s3;
    this.#s2 ^= t;
    this.#s3 = rotl(this.#s3, 11);
    return r;
  }

  /** A double in [0, 1) with 53 random bits. */
  random(): number {
    return unitDouble(this.nextU32(), this.nextU32());
  }

  /** An integer in [0, n) for n <= 2^32. */
  int(n: number): number {
    return below(this.nextU32(), n);
  }

  /** Fisher-Yates shuffle of `out` in place, the generator inlined (the epoch-plan hot loop). */
  shuffle(out: Int32Array): void {
    let s0 = this.#s0, s1 = this.#s1, s2 = this.#s2, s3 = this.#s3;
    for (let i = out.length - 1; i > 0; i--) {
      const r = Math.imul(rotl(Math.imul(s1, 5), 7), 9) >>> 0;
      const t = s1 << 9;
      s2 ^= s0;
      s3 ^= s1;
      s1 ^= s2;
      s0 ^= s3;
      s2 ^= t;
      s3 = (s3 << 11) | (s3 >>> 21);
      const j = Math.floor((r / 0x1_0000_0000) * (i + 1));
      const v = out[i];
      out[i] = out[j];
      out[j] = v;
    }
    this.#s0 = s0;
    this.#s1 = s1;
    this.#s2 = s2;
    this.#s3 = s3;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/** A uniformly random permutation of 0..n-1 (Fisher-Yates), a pure function of the key. */
export function permutation(
  n: number,
  rng: { int(n: number): number; shuffle?(out: Int32Array): void },
): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = i;
  if (rng.shuffle) {
    rng.shuffle(out);
    return out;
  }
  for (let i = n - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    const t = out[i];
    out[i] = out[j];
    out[j] = t;
  }
  return out;
}

/** A fresh random seed in [0, 2^32) when the user gives none. */
export function randomSeed(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0];
}
