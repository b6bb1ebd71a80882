/**
 * Seeded random numbers and PyTorch's default parameter initializations.
 *
 * Initialization runs on the host into a `Float32Array` that the layer then uploads, so a
 * given seed gives the same weights on every backend.
 *
 * @module
 */

/** The serializable state of an {@linkcode Xoshiro128}: four unsigned 32-bit words. */
export type RngState = [number, number, number, number];

/**
 * A small, fast, seeded generator (xoshiro128**, seeded through splitmix32) used for weight
 * initialization. Its state can be saved and restored, so a resumed run draws the same numbers.
 *
 * @example Same seed, same numbers
 * ```ts
 * import { Xoshiro128 } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const a = new Xoshiro128(42), b = new Xoshiro128(42);
 * assert.strictEqual(a.random(), b.random());
 * const x = a.random();
 * assert.ok(x >= 0 && x < 1);
 * ```
 */
export class Xoshiro128 {
  #s = new Uint32Array(4);

  /**
   * Creates a generator from a seed.
   *
   * @param seed Any safe integer; equal seeds give equal streams.
   * @throws {TypeError} When `seed` is not a safe integer.
   */
  constructor(seed = 0) {
    if (!Number.isSafeInteger(seed)) {
      throw new TypeError(`Cannot seed the generator: seed ${seed} is not a safe integer`);
    }
    // splitmix32 spreads any seed (0 included) over the 128-bit state, which must not be 0.
    let z = (seed ^ Math.floor(seed / 2 ** 32)) >>> 0;
    for (let i = 0; i < 4; i++) {
      z = (z + 0x9e3779b9) >>> 0;
      let t = z;
      t = Math.imul(t ^ (t >>> 16), 0x21f0aaad);
      t = Math.imul(t ^ (t >>> 15), 0x735a2d97);
      this.#s[i] = (t ^ (t >>> 15)) >>> 0;
    }
    if ((this.#s[0] | this.#s[1] | this.#s[2] | this.#s[3]) === 0) this.#s[0] = 1;
  }

  /**
   * The next unsigned 32-bit integer.
   *
   * @returns An integer in [0, 2^32).
   * @example
   * ```ts
   * import { Xoshiro128 } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const u = new Xoshiro128(1).nextU32();
   * assert.ok(Number.isInteger(u) && u >= 0 && u < 2 ** 32);
   * ```
   */
  nextU32(): number {
    const s = this.#s;
    const r = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return r;
  }

  /**
   * A uniform double in [0, 1) with 53 random bits.
   *
   * @returns The number.
   * @example
   * ```ts
   * import { Xoshiro128 } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const x = new Xoshiro128(3).random();
   * assert.ok(x >= 0 && x < 1);
   * ```
   */
  random(): number {
    const hi = this.nextU32() >>> 5; // 27 bits
    const lo = this.nextU32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }

  /**
   * The generator's state, to save in a checkpoint.
   *
   * @returns A copy of the four state words.
   * @example
   * ```ts
   * import { Xoshiro128 } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const g = new Xoshiro128(5);
   * const saved = g.getState();
   * const x = g.random();
   * g.setState(saved);
   * assert.strictEqual(g.random(), x);
   * ```
   */
  getState(): RngState {
    return [this.#s[0], this.#s[1], this.#s[2], this.#s[3]];
  }

  /**
   * Restores a state from {@linkcode Xoshiro128.getState}.
   *
   * @param state Four unsigned 32-bit words, not all zero.
   * @throws {RangeError} When the state is malformed.
   * @example
   * ```ts
   * import { Xoshiro128 } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const g = new Xoshiro128(9);
   * g.setState([1, 2, 3, 4]);
   * assert.deepStrictEqual(g.getState(), [1, 2, 3, 4]);
   * ```
   */
  setState(state: readonly number[]): void {
    if (
      state.length !== 4 || state.some((w) => !Number.isInteger(w) || w < 0 || w >= 2 ** 32) ||
      state.every((w) => w === 0)
    ) {
      throw new RangeError(`Cannot restore the generator: invalid state ${JSON.stringify(state)}`);
    }
    this.#s.set(state);
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/**
 * Fills `out` with draws from U(low, high), like `torch.nn.init.uniform_`.
 *
 * @param out The array to fill.
 * @param low The lower bound.
 * @param high The upper bound.
 * @param rng The generator.
 * @returns `out`.
 * @example
 * ```ts
 * import { uniform, Xoshiro128 } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const a = uniform(new Float32Array(100), -0.5, 0.5, new Xoshiro128(0));
 * assert.ok(a.every((v) => v >= -0.5 && v <= 0.5));
 * ```
 */
export function uniform<T extends Float32Array | Float64Array>(
  out: T,
  low: number,
  high: number,
  rng: Xoshiro128,
): T {
  const span = high - low;
  for (let i = 0; i < out.length; i++) out[i] = low + span * rng.random();
  return out;
}

/**
 * `torch.nn.init.kaiming_uniform_(w, a, mode="fan_in", nonlinearity="leaky_relu")`: draws from
 * U(-b, b) with b = gain * sqrt(3 / fanIn) and gain = sqrt(2 / (1 + a^2)). With PyTorch's
 * default for Linear and Conv2d, a = sqrt(5), this is b = 1 / sqrt(fanIn).
 *
 * @param out The weights to fill.
 * @param fanIn Inputs per output (in_features, or in_channels * kh * kw).
 * @param rng The generator.
 * @param a The negative slope of the leaky ReLU the gain is computed for.
 * @returns `out`.
 * @throws {RangeError} When `fanIn` is not a positive integer.
 * @example
 * ```ts
 * import { kaimingUniform, Xoshiro128 } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const w = kaimingUniform(new Float32Array(64), 16, new Xoshiro128(0));
 * assert.ok(w.every((v) => Math.abs(v) <= 0.25));
 * ```
 */
export function kaimingUniform<T extends Float32Array | Float64Array>(
  out: T,
  fanIn: number,
  rng: Xoshiro128,
  a: number = Math.sqrt(5),
): T {
  if (!Number.isInteger(fanIn) || fanIn <= 0) {
    throw new RangeError(`Cannot initialize weights: fanIn ${fanIn} is not a positive integer`);
  }
  const gain = Math.sqrt(2 / (1 + a * a));
  const bound = gain * Math.sqrt(3 / fanIn);
  return uniform(out, -bound, bound, rng);
}
