// Tensors born on the device (ps_tensor_fill, zeros/ones/full/arange/rand/randn): exact
// values for the deterministic fills, the statistics of the random ones, the same bits on both
// backends and as the TypeScript reference of kernels/rules.h (every float operation rounded on
// its own: a fused multiply-add anywhere would change bits), and the errors.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { Tensor } from "../ffi/tensor.ts";
import { NativeBackend } from "../ffi/native_backend.ts";
import { arange, fillInPlace, full, ones, rand, randn, zeros } from "../ops/fill.ts";
import { CUDA, testEachBackend } from "./_backends.ts";

const f = Math.fround;

/** ps_fill_bits: splitmix64 of seed + (2i + k + 1) * golden, the high 32 bits. */
function bits(seed: bigint, i: bigint, k: bigint): number {
  const M = (1n << 64n) - 1n;
  let z = (seed + (2n * i + k + 1n) * 0x9e3779b97f4a7c15n) & M;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
  return Number((z ^ (z >> 31n)) >> 32n);
}

/** ps_fill_log, one rounding per operation. */
function log(u: number): number {
  const b = new Uint32Array(new Float32Array([u]).buffer)[0];
  const e = ((b >>> 23) & 0xff) - 127;
  const m = new Float32Array(new Uint32Array([(b & 0x007fffff) | 0x3f800000]).buffer)[0];
  const t = f(f(m - 1) / f(m + 1)), t2 = f(t * t);
  let s = f(1 / 13);
  for (const c of [1 / 11, 1 / 9, 1 / 7, 1 / 5, 1 / 3, 1]) s = f(f(s * t2) + f(c));
  return f(f(f(e) * f(0.693147180559945)) + f(f(f(2 * t)) * s));
}

/** ps_fill_cos2pi. */
function cos2pi(x: number): number {
  const y = f(f(x * f(6.28318530717959)) - f(3.14159265358979)), y2 = f(y * y);
  let c = f(1 / 2432902008176640000);
  const k = [
    -1 / 6402373705728000,
    1 / 20922789888000,
    -1 / 87178291200,
    1 / 479001600,
    -1 / 3628800,
    1 / 40320,
    -1 / 720,
    1 / 24,
    -1 / 2,
    1,
  ];
  for (const kj of k) c = f(f(c * y2) + f(kj));
  return -c;
}

function uniform(seed: bigint, i: number, lo: number, hi: number): number {
  const u = f((bits(seed, BigInt(i), 0n) >>> 8) * f(1 / 16777216));
  return f(f(lo) + f(f(f(hi) - f(lo)) * u));
}

function normal(seed: bigint, i: number, mean: number, std: number): number {
  const u1 = f(((bits(seed, BigInt(i), 0n) >>> 8) + 1) * f(1 / 16777216));
  const u2 = f((bits(seed, BigInt(i), 1n) >>> 8) * f(1 / 16777216));
  const r = f(Math.sqrt(f(-2 * log(u1))));
  return f(f(mean) + f(f(std) * f(r * cos2pi(u2))));
}

async function host(t: Tensor): Promise<number[]> {
  return Array.from(await t.toHost());
}

function u32(xs: ArrayLike<number>): number[] {
  return Array.from(new Uint32Array(new Float32Array(xs).buffer));
}

testEachBackend("zeros, ones, full and arange are exact in every dtype", async (dev) => {
  using z = zeros(dev, [2, 3]), o = ones(dev, [5], { dtype: "f16" });
  assert.deepStrictEqual([z.dtype, ...z.shape], ["f32", 2, 3]);
  assert.deepStrictEqual(await host(z), [0, 0, 0, 0, 0, 0]);
  assert.deepStrictEqual(await host(o), [1, 1, 1, 1, 1]);
  using h = full(dev, [3], 0.1, { dtype: "f16" }),
    i = full(dev, [3], -2.7, { dtype: "i32" });
  assert.deepStrictEqual(await host(h), Array.from(new Float16Array([0.1, 0.1, 0.1])));
  assert.deepStrictEqual(await host(i), [-2, -2, -2], "int32 truncates toward zero");
  using big = full(dev, [2], 1e12, { dtype: "i32" }),
    neg = full(dev, [1], -1e12, { dtype: "i32" });
  assert.deepStrictEqual(await host(big), [2147483647, 2147483647], "and saturates");
  assert.deepStrictEqual(await host(neg), [-2147483648]);
  using a = arange(dev, 5), b = arange(dev, -1, { start: 2, step: -0.75 });
  assert.deepStrictEqual(await host(a), [0, 1, 2, 3, 4]);
  assert.deepStrictEqual(await host(b), [2, 1.25, 0.5, -0.25]);
  using c = arange(dev, 1e6, { start: 0.1, step: 0.3, dtype: "f32" });
  const got = await c.toHost() as Float32Array;
  assert.strictEqual(got.length, Math.ceil((1e6 - 0.1) / 0.3));
  for (const k of [0, 1, 12345, got.length - 1]) {
    assert.strictEqual(
      got[k],
      f(0.1 + k * 0.3),
      `element ${k} is start + k * step in double, rounded once`,
    );
  }
  using e = arange(dev, 0, { start: 3 }), empty = zeros(dev, [0, 4]);
  assert.deepStrictEqual([e.numel, empty.numel], [0, 0]);
});

testEachBackend(
  "rand and randn equal the TypeScript reference of rules.h bit for bit",
  async (dev) => {
    const n = 2000;
    using u = rand(dev, [n], { seed: 42, low: -3, high: 5 });
    using g = randn(dev, [n], { seed: 9n, mean: 1.5, std: 2 });
    const want = Array.from({ length: n }, (_, i) => uniform(42n, i, -3, 5));
    assert.deepStrictEqual(u32(await host(u)), u32(want));
    const wantN = Array.from({ length: n }, (_, i) => normal(9n, i, 1.5, 2));
    const gotN = await host(g);
    for (let i = 0; i < n; i++) {
      if (Object.is(gotN[i], wantN[i])) continue;
      assert.fail(`randn element ${i}: ${gotN[i]} (bits ${u32([gotN[i]])}), reference ${wantN[i]}`);
    }
    using h = randn(dev, [n], { seed: 9n, mean: 1.5, std: 2, dtype: "f16" });
    assert.deepStrictEqual(
      await host(h),
      Array.from(new Float16Array(wantN)),
      "f16 rounds the f32 value",
    );
  },
);

testEachBackend(
  "rand and randn have the right statistics and depend only on the seed",
  async (dev) => {
    const n = 200_000;
    using u = rand(dev, [n], { seed: 1 });
    const x = await u.toHost() as Float32Array;
    let s = 0, s2 = 0;
    for (const v of x) {
      assert.ok(v >= 0 && v < 1);
      s += v;
      s2 += v * v;
    }
    const mean = s / n, variance = s2 / n - mean * mean;
    // Standard errors: 1/sqrt(12n) = 0.00065 for the mean; 0.0002 for the variance.
    assert.ok(Math.abs(mean - 0.5) < 0.004, `mean ${mean}`);
    assert.ok(Math.abs(variance - 1 / 12) < 0.002, `variance ${variance}`);
    using g = randn(dev, [n], { seed: 2 });
    const z = await g.toHost() as Float32Array;
    let m = 0, m2 = 0, within1 = 0;
    for (const v of z) {
      m += v;
      m2 += v * v;
      if (Math.abs(v) < 1) within1++;
    }
    assert.ok(Math.abs(m / n) < 0.01, `mean ${m / n}`);
    assert.ok(Math.abs(Math.sqrt(m2 / n) - 1) < 0.01, `std ${Math.sqrt(m2 / n)}`);
    assert.ok(Math.abs(within1 / n - 0.6827) < 0.005, `P(|z| < 1) = ${within1 / n}`);
    using again = rand(dev, [n], { seed: 1 }), other = rand(dev, [16], { seed: 3 });
    assert.deepStrictEqual(u32(await again.toHost()), u32(x), "same seed, same bits");
    assert.notDeepStrictEqual(u32(await other.toHost()), u32(x.subarray(0, 16)));
  },
);

testEachBackend(
  "a fill at an offset equals that range of a whole fill (ps_tensor_fill)",
  async (dev) => {
    using whole = randn(dev, [100], { seed: 5 });
    using part = Tensor.empty(dev, [30], "f32");
    NativeBackend.of(dev).tensorFill(
      { dst: part, dtype: 0, count: 30, mode: 3, a: 0, b: 1, seed: 5n, offset: 40n, stream: null },
      "fill at an offset",
    );
    assert.deepStrictEqual(u32(await part.toHost()), u32((await whole.toHost()).subarray(40, 70)));
  },
);

testEachBackend("fills refuse what they cannot do, naming it", (dev) => {
  assert.throws(() => rand(dev, [2], {} as never), /seed must be a safe integer >= 0/);
  assert.throws(() => rand(dev, [2], { seed: -1 }), /seed must be/);
  assert.throws(
    () => rand(dev, [2], { seed: 1, dtype: "i32" as never }),
    /dtype must be f32, f16 or bf16, got "i32"/,
  );
  assert.throws(() => rand(dev, [2], { seed: 1, low: 2, high: 1 }), /low <= high/);
  assert.throws(() => randn(dev, [2], { seed: 1, std: -1 }), /std finite and >= 0/);
  assert.throws(() => arange(dev, 5, { step: 0 }), /step must not be 0/);
  assert.throws(() => arange(dev, Infinity), /end must be a finite number/);
  assert.throws(() => full(dev, [2], "1" as never), /value must be a number, got "1"/);
  assert.throws(
    () => zeros(dev, [2], { dtype: "u8" as never }),
    /dtype must be f32, f16, bf16 or i32, got "u8"/,
  );
  assert.throws(() => zeros(dev, [2], { dtyp: "f16" } as never), /dtyp.*dtype/s);
  const raw = dev.lib.symbols;
  assert.notStrictEqual(raw.ps_tensor_fill(null, 7, 1n, 0, 0, 0, 0n, 0n, null), 0);
  assert.notStrictEqual(raw.ps_tensor_fill(null, 2, 1n, 2, 0, 1, 0n, 0n, null), 0, "int32 random");
});

Deno.test({
  name: "[cuda] fills: the CUDA backend writes the CPU backend's bits",
  ignore: CUDA.ignore,
  async fn() {
    using cpu = Device.open("cpu"), cuda = Device.open("cuda");
    const make = (d: Device) => [
      rand(d, [70_001], { seed: 123n, low: -1, high: 1 }),
      randn(d, [70_001], { seed: 77, mean: 0, std: 0.02 }),
      randn(d, [4099], { seed: 77, dtype: "f16" }),
      arange(d, 3000, { start: -7.5, step: 0.37, dtype: "f16" }),
      full(d, [5], 3.9, { dtype: "i32" }),
    ];
    const a = make(cpu), b = make(cuda);
    try {
      for (let k = 0; k < a.length; k++) {
        const x = await a[k].toHost(), y = await b[k].toHost();
        assert.deepStrictEqual(
          Array.from(new Uint8Array(y.buffer, y.byteOffset, y.byteLength)),
          Array.from(new Uint8Array(x.buffer, x.byteOffset, x.byteLength)),
          `fill ${k}`,
        );
      }
    } finally {
      for (const t of [...a, ...b]) t.dispose();
    }
  },
});

testEachBackend(
  "fillInPlace writes a range of an existing tensor and nothing else",
  async (dev) => {
    using f = Tensor.fromHost(dev, new Float32Array([1, 2, 3, 4, 5]));
    fillInPlace(f, 0.1, { start: 1, count: 3 });
    assert.deepStrictEqual(u32(await f.toHost()), u32(new Float32Array([1, 0.1, 0.1, 0.1, 5])));
    using h = Tensor.fromHost(dev, new Float16Array([1, 2, 3]));
    fillInPlace(h, -2.5, { start: 2 });
    assert.deepStrictEqual([...await h.toHost()], [1, 2, -2.5]);
    using i = Tensor.fromHost(dev, new Int32Array([7, 7]));
    fillInPlace(i, -3.9);
    assert.deepStrictEqual([...await i.toHost()], [-3, -3]);
    fillInPlace(i, 9, { start: 2 }); // an empty range writes nothing
    assert.deepStrictEqual([...await i.toHost()], [-3, -3]);
    using b = Tensor.empty(dev, [2], "u8");
    assert.throws(() => fillInPlace(b, 1), /t must be f32, f16, bf16 or i32, got u8/);
    assert.throws(() => fillInPlace(f, 1, { start: 4, count: 2 }), /\[4, 6\) are not inside \[5\]/);
    assert.throws(() => fillInPlace(f, 1, { start: -1 }), /start must be an integer >= 0/);
    assert.throws(() => fillInPlace(f, 1, { cout: 1 } as never), /unknown option "cout"/);
  },
);
