/**
 * cat, stack, add and mul with their backward against a float64 reference written with plain
 * index arithmetic, on every backend, in f16 and f32, along every dimension; and their
 * refusals.
 */

import assert from "node:assert";
import { type Device, type DType, Tensor } from "../mod.ts";
import * as ops from "../ops/mod.ts";
import { testEachBackend } from "./_backends.ts";
import { assertClose, gen, randF } from "./_nn_reference.ts";

function strides(shape: readonly number[]): number[] {
  const s = shape.map(() => 1);
  for (let i = shape.length - 2; i >= 0; i--) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

/** The float64 concatenation: element by element, by multi-index. */
function refCat(parts: Float64Array[], shapes: number[][], dim: number): Float64Array {
  const outShape = [...shapes[0]];
  outShape[dim] = shapes.reduce((a, s) => a + s[dim], 0);
  const n = outShape.reduce((a, b) => a * b, 1);
  const out = new Float64Array(n);
  const os = strides(outShape);
  let base = 0;
  parts.forEach((p, k) => {
    const ps = strides(shapes[k]);
    for (let i = 0; i < p.length; i++) {
      let at = 0, rest = i;
      for (let d = 0; d < ps.length; d++) {
        const idx = Math.floor(rest / ps[d]);
        rest -= idx * ps[d];
        at += (d === dim ? idx + base : idx) * os[d];
      }
      out[at] = p[i];
    }
    base += shapes[k][dim];
  });
  return out;
}

function values(r: () => number, n: number, dtype: DType): Float64Array {
  const f = randF(r, n, -4, 4);
  return Float64Array.from(dtype === "f16" ? Float16Array.from(f) : f);
}

function upload(dev: Device, v: Float64Array, shape: number[], dtype: DType): Tensor {
  const data = dtype === "f16" ? Float16Array.from(v) : Float32Array.from(v);
  return Tensor.fromHost(dev, data, shape);
}

async function host(t: Tensor): Promise<number[]> {
  return [...await t.toHost()];
}

const CASES: { shapes: number[][]; dim: number }[] = [
  { shapes: [[3, 4], [3, 7]], dim: 1 },
  { shapes: [[2, 5], [3, 5], [1, 5]], dim: 0 },
  { shapes: [[2, 3, 4, 5], [2, 1, 4, 5]], dim: 1 },
  { shapes: [[2, 3, 4, 5], [2, 3, 4, 2], [2, 3, 4, 1]], dim: -1 },
  { shapes: [[4, 2, 3], [4, 0, 3], [4, 5, 3]], dim: 1 },
  { shapes: [[300, 17], [300, 40000 / 300 | 0]], dim: 1 },
];

testEachBackend("cat and catBackward match a float64 reference", async (dev) => {
  const r = gen("cat");
  for (const dtype of ["f16", "f32"] as const) {
    for (const { shapes, dim: d } of CASES) {
      const dim = d < 0 ? d + shapes[0].length : d;
      const vs = shapes.map((s) => values(r, s.reduce((a, b) => a * b, 1), dtype));
      const ref = refCat(vs, shapes, dim);
      const outShape = [...shapes[0]];
      outShape[dim] = shapes.reduce((a, s) => a + s[dim], 0);
      const parts = vs.map((v, i) => upload(dev, v, shapes[i], dtype));
      using out = Tensor.empty(dev, outShape, dtype);
      ops.cat(parts, out, { dim: d });
      const what = `cat ${dtype} ${JSON.stringify(shapes)} dim ${d}`;
      assert.deepStrictEqual(await host(out), [...ref], what);
      // Backward: a fresh gradient splits back into exactly its slices.
      const g = values(r, ref.length, dtype);
      using dout = upload(dev, g, outShape, dtype);
      const grads = shapes.map((s) => Tensor.empty(dev, s, dtype));
      ops.catBackward(dout, grads, { dim: d });
      const gs = [];
      for (const t of grads) gs.push(Float64Array.from(await host(t)));
      assert.deepStrictEqual([...refCat(gs, shapes, dim)], [...g], `${what} backward`);
      for (const t of [...parts, ...grads]) t.dispose();
    }
  }
});

testEachBackend("stack and stackBackward match a float64 reference", async (dev) => {
  const r = gen("stack");
  for (const dtype of ["f16", "f32"] as const) {
    for (const [shape, k] of [[[3, 4], 2], [[2, 3, 5], 3], [[7], 4]] as [number[], number][]) {
      for (let d = -shape.length - 1; d <= shape.length; d++) {
        const dim = d < 0 ? d + shape.length + 1 : d;
        const n = shape.reduce((a, b) => a * b, 1);
        const vs = Array.from({ length: k }, () => values(r, n, dtype));
        // stack = cat of the parts with a size-1 dimension inserted at dim.
        const unsq = [...shape];
        unsq.splice(dim, 0, 1);
        const ref = refCat(vs, vs.map(() => unsq), dim);
        const outShape = [...shape];
        outShape.splice(dim, 0, k);
        const parts = vs.map((v) => upload(dev, v, shape, dtype));
        using out = Tensor.empty(dev, outShape, dtype);
        ops.stack(parts, out, { dim: d });
        const what = `stack ${dtype} ${k}x[${shape}] dim ${d}`;
        assert.deepStrictEqual(await host(out), [...ref], what);
        const grads = parts.map(() => Tensor.empty(dev, shape, dtype));
        ops.stackBackward(out, grads, { dim: d });
        for (let i = 0; i < k; i++) {
          assert.deepStrictEqual(await host(grads[i]), [...vs[i]], `${what} backward ${i}`);
        }
        for (const t of [...parts, ...grads]) t.dispose();
      }
    }
  }
});

testEachBackend("add, mul and mulBackward match a float64 reference", async (dev) => {
  const r = gen("binary");
  for (const dtype of ["f16", "f32"] as const) {
    const [atol, rtol] = dtype === "f16" ? [1e-7, 4.9e-4] : [1e-12, 6e-8];
    for (const shape of [[1], [5, 3], [70001], [2, 3, 4, 5]]) {
      const n = shape.reduce((a, b) => a * b, 1);
      const [a, b, g] = [values(r, n, dtype), values(r, n, dtype), values(r, n, dtype)];
      using ta = upload(dev, a, shape, dtype);
      using tb = upload(dev, b, shape, dtype);
      using dy = upload(dev, g, shape, dtype);
      using y = Tensor.empty(dev, shape, dtype);
      using da = Tensor.empty(dev, shape, dtype);
      using db = Tensor.empty(dev, shape, dtype);
      const what = `${dtype} [${shape}]`;
      ops.add(ta, tb, y);
      assertClose(await host(y), a.map((v, i) => v + b[i]), atol, rtol, `add ${what}`);
      ops.mul(ta, tb, y);
      assertClose(await host(y), a.map((v, i) => v * b[i]), atol, rtol, `mul ${what}`);
      ops.mulBackward(dy, { a: ta, b: tb, da, db });
      assertClose(await host(da), g.map((v, i) => v * b[i]), atol, rtol, `da ${what}`);
      assertClose(await host(db), g.map((v, i) => v * a[i]), atol, rtol, `db ${what}`);
      // In place: y may be an input.
      ops.add(ta, tb, ta);
      assertClose(await host(ta), a.map((v, i) => v + b[i]), atol, rtol, `add in place ${what}`);
    }
  }
});

testEachBackend("cat, stack, add and mul refuse what does not fit, naming it", (dev) => {
  using a = Tensor.empty(dev, [2, 3], "f16");
  using b = Tensor.empty(dev, [3, 3], "f16");
  using c = Tensor.empty(dev, [2, 3], "f32");
  using out = Tensor.empty(dev, [4, 3], "f16");
  assert.throws(() => ops.cat([a, b], out), /out has 4 along dim 0 but the parts add up to 5/);
  using wide = Tensor.empty(dev, [2, 6], "f16");
  assert.throws(() => ops.cat([a, b], wide, { dim: 1 }), /parts\[1\] has shape \[3,3\], which/);
  assert.throws(() => ops.cat([a, a], out, { dim: 2 }), /dim must be an integer in \[-2, 1\]/);
  assert.throws(() => ops.cat([a, c], out), /parts\[1\] is f32 but out is f16/);
  assert.throws(() => ops.cat([], out), /parts must be a non-empty array/);
  // @ts-expect-error a typo in the options
  assert.throws(() => ops.cat([a, a], out, { dims: 0 }), /dims.*dim/);
  assert.throws(() => ops.stack([a, b], out), /parts\[1\] has shape \[3,3\] but parts\[0\]/);
  assert.throws(() => ops.stack([a, a], out), /out must have shape \[2,2,3\]/);
  assert.throws(() => ops.add(a, b, a), /b has shape \[3,3\] but a has \[2,3\] \(no broadcasting/);
  assert.throws(() => ops.mul(a, c, a), /b is f32 but a is f16/);
  assert.throws(
    () => ops.mulBackward(a, { a, b: a, da: a, db: out }),
    /da may not be dy or a while db is wanted/,
  );
});
