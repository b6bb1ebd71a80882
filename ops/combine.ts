/**
 * Ops that combine tensors, for models with more than one input or branch: concatenation
 * along a dimension (`cat`, `stack`) and elementwise sums and products (`add`, `mul`), each
 * with its backward.
 *
 * | op | tensors | notes |
 * |----|---------|-------|
 * | `cat(parts, out, {dim})`, `catBackward(dout, dparts, {dim})` | f16 or f32, one dtype | parts agree outside `dim`; one launch per part |
 * | `stack(parts, out, {dim})`, `stackBackward(dout, dparts, {dim})` | f16 or f32, one dtype | parts of one shape; `out` has a new dimension at `dim` |
 * | `add(a, b, y)`, `mul(a, b, y)` | f16 or f32, same shape | computed in fp32, rounded once; `y` may be `a` or `b` |
 * | `mulBackward(dy, {a, b, da, db})` | as `mul` | `da = dy * b`, `db = dy * a` |
 *
 * The backward of `add` is the identity on both inputs: `dy` is the gradient of `a` and of
 * `b`, so it has no op of its own. There is no broadcasting: `add` and `mul` refuse tensors of
 * different shapes (use `biasAdd` for a per-channel bias).
 *
 * @module
 */

import type { Tensor } from "../ffi/tensor.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import type { OpOptions } from "./backend.ts";
import { activations, code, launch, queue, sameDtype, tail } from "./_launch.ts";

/** The dimension of {@linkcode cat} and {@linkcode stack} and their backward. */
export interface ConcatOptions extends OpOptions {
  /** The dimension to join along (negative counts from the end; default 0). */
  dim?: number;
}

/** The inputs and their gradients of {@linkcode mulBackward}. */
export interface MulBackwardOptions extends OpOptions {
  /** The forward's first input. */
  a: Tensor;
  /** The forward's second input. */
  b: Tensor;
  /** Receives `dy * b` (null: not needed). */
  da: Tensor | null;
  /** Receives `dy * a` (null: not needed); may not be `dy` when `da` is wanted too. */
  db: Tensor | null;
}

const PS_BINARY_ADD = 0;
const PS_BINARY_MUL = 1;

function dimOf(options: ConcatOptions, rank: number, action: string): number {
  refuseUnknownKeys(options ?? {}, ["dim", "stream"], action);
  const d = options?.dim ?? 0;
  if (!Number.isSafeInteger(d) || d < -rank || d >= rank) {
    throw new RangeError(
      `Cannot ${action}: dim must be an integer in [${-rank}, ${rank - 1}], got ${d}`,
    );
  }
  return d < 0 ? d + rank : d;
}

function partsOf(parts: readonly Tensor[], name: string, action: string): Tensor[] {
  if (!Array.isArray(parts) || parts.length === 0) {
    throw new TypeError(`Cannot ${action}: ${name} must be a non-empty array of tensors`);
  }
  return [...parts];
}

/** Checks `whole` against the parts joined along `dim`. */
function layout(
  parts: Tensor[],
  partsName: string,
  whole: Tensor,
  wholeName: string,
  dim: number,
  action: string,
): void {
  const ref = whole.shape;
  let along = 0;
  parts.forEach((p, i) => {
    sameDtype(p, `${partsName}[${i}]`, whole, wholeName, action);
    const ok = p.shape.length === ref.length && p.shape.every((d, j) => j === dim || d === ref[j]);
    if (!ok) {
      throw new RangeError(
        `Cannot ${action}: ${partsName}[${i}] has shape [${p.shape}], which does not match ` +
          `${wholeName} [${ref}] outside dim ${dim}`,
      );
    }
    along += p.shape[dim];
  });
  if (along !== ref[dim]) {
    throw new RangeError(
      `Cannot ${action}: ${wholeName} has ${ref[dim]} along dim ${dim} but the parts add up ` +
        `to ${along}`,
    );
  }
}

function run(
  parts: Tensor[],
  whole: Tensor,
  dim: number,
  split: number,
  options: OpOptions,
  action: string,
): void {
  using launched = launch(action, options, whole, ...parts);
  const { device, stream } = launched;
  const outer = whole.shape.slice(0, dim).reduce((a, b) => a * b, 1);
  const wholeLen = tail(whole.shape, dim);
  let offset = 0;
  for (const part of parts) {
    const partLen = tail(part.shape, dim);
    queue(device, "concat", {
      part,
      whole,
      dtype: code(whole),
      outer,
      part_len: partLen,
      whole_len: wholeLen,
      offset,
      split,
      stream,
    }, `${action} [${part.shape}] into [${whole.shape}]`);
    offset += partLen;
  }
}

/**
 * Concatenates `parts` along `dim` into `out` (PyTorch's `torch.cat`).
 *
 * @param parts f16 or f32 tensors of one rank, agreeing with `out` outside `dim`.
 * @param out Their dtype; along `dim` the sum of the parts' sizes.
 * @param options dim (default 0), stream.
 * @throws {TypeError} On a wrong dtype or no parts.
 * @throws {RangeError} When the shapes do not fit or `dim` is out of range.
 * @example Two feature vectors per sample side by side
 * ```ts
 * import { cat, Device, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float32Array([1, 2, 3, 4]), [2, 2]);
 * using b = Tensor.fromHost(dev, new Float32Array([5, 6]), [2, 1]);
 * using out = Tensor.empty(dev, [2, 3], "f32");
 * cat([a, b], out, { dim: 1 });
 * assert.deepStrictEqual([...await out.toHost()], [1, 2, 5, 3, 4, 6]);
 * ```
 */
export function cat(parts: readonly Tensor[], out: Tensor, options: ConcatOptions = {}): void {
  const action = "run cat";
  const ps = partsOf(parts, "parts", action);
  activations(action, [out, "out"]);
  const dim = dimOf(options, out.shape.length, action);
  layout(ps, "parts", out, "out", dim, action);
  run(ps, out, dim, 0, options, action);
}

/**
 * The backward of {@linkcode cat}: splits `dout` along `dim` into the parts' gradients.
 *
 * @param dout The gradient of cat's output.
 * @param dparts One gradient per part, each of its part's shape.
 * @param options dim (the forward's), stream.
 * @throws {TypeError} On a wrong dtype or no parts.
 * @throws {RangeError} When the shapes do not fit or `dim` is out of range.
 * @example
 * ```ts
 * import { catBackward, Device, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using dout = Tensor.fromHost(dev, new Float16Array([1, 2, 5, 3, 4, 6]), [2, 3]);
 * using da = Tensor.empty(dev, [2, 2], "f16");
 * using db = Tensor.empty(dev, [2, 1], "f16");
 * catBackward(dout, [da, db], { dim: 1 });
 * assert.deepStrictEqual([...await da.toHost()], [1, 2, 3, 4]);
 * assert.deepStrictEqual([...await db.toHost()], [5, 6]);
 * ```
 */
export function catBackward(
  dout: Tensor,
  dparts: readonly Tensor[],
  options: ConcatOptions = {},
): void {
  const action = "run catBackward";
  const ps = partsOf(dparts, "dparts", action);
  activations(action, [dout, "dout"]);
  const dim = dimOf(options, dout.shape.length, action);
  layout(ps, "dparts", dout, "dout", dim, action);
  run(ps, dout, dim, 1, options, action);
}

function stackLayout(parts: Tensor[], name: string, whole: Tensor, wn: string, action: string) {
  const first = parts[0];
  activations(action, [whole, wn]);
  const dim = (d: ConcatOptions) => dimOf(d, first.shape.length + 1, action);
  parts.forEach((p, i) => {
    sameDtype(p, `${name}[${i}]`, whole, wn, action);
    if (p.shape.join() !== first.shape.join()) {
      throw new RangeError(
        `Cannot ${action}: ${name}[${i}] has shape [${p.shape}] but ${name}[0] has ` +
          `[${first.shape}] (stack needs one shape)`,
      );
    }
  });
  return dim;
}

function stackShape(part: Tensor, k: number, dim: number): number[] {
  const s = [...part.shape];
  s.splice(dim, 0, k);
  return s;
}

function checkStacked(whole: Tensor, expected: number[], wn: string, action: string): void {
  if (whole.shape.join() !== expected.join()) {
    throw new RangeError(
      `Cannot ${action}: ${wn} must have shape [${expected}], got [${whole.shape}]`,
    );
  }
}

/** The parts of a stack as cat sees them: each with size 1 at `dim`, laid out alike. */
function runStack(
  parts: Tensor[],
  whole: Tensor,
  dim: number,
  split: number,
  options: OpOptions,
  action: string,
): void {
  using launched = launch(action, options, whole, ...parts);
  const { device, stream } = launched;
  const outer = whole.shape.slice(0, dim).reduce((a, b) => a * b, 1);
  const partLen = tail(whole.shape, dim + 1);
  parts.forEach((part, i) => {
    queue(device, "concat", {
      part,
      whole,
      dtype: code(whole),
      outer,
      part_len: partLen,
      whole_len: partLen * parts.length,
      offset: i * partLen,
      split,
      stream,
    }, `${action} [${part.shape}] into [${whole.shape}]`);
  });
}

/**
 * Stacks `parts` (one shape) along a new dimension `dim` of `out` (PyTorch's `torch.stack`).
 *
 * @param parts f16 or f32 tensors of one shape.
 * @param out Their dtype; their shape with `parts.length` inserted at `dim`.
 * @param options dim (default 0, in `[-rank - 1, rank]` of a part), stream.
 * @throws {TypeError} On a wrong dtype or no parts.
 * @throws {RangeError} When the shapes do not fit or `dim` is out of range.
 * @example
 * ```ts
 * import { Device, stack, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float32Array([1, 2]));
 * using b = Tensor.fromHost(dev, new Float32Array([3, 4]));
 * using out = Tensor.empty(dev, [2, 2], "f32");
 * stack([a, b], out, { dim: 1 });
 * assert.deepStrictEqual([...await out.toHost()], [1, 3, 2, 4]);
 * ```
 */
export function stack(parts: readonly Tensor[], out: Tensor, options: ConcatOptions = {}): void {
  const action = "run stack";
  const ps = partsOf(parts, "parts", action);
  const dim = stackLayout(ps, "parts", out, "out", action)(options);
  checkStacked(out, stackShape(ps[0], ps.length, dim), "out", action);
  runStack(ps, out, dim, 0, options, action);
}

/**
 * The backward of {@linkcode stack}: the slices of `dout` along `dim` into the parts'
 * gradients.
 *
 * @param dout The gradient of stack's output.
 * @param dparts One gradient per part, of the parts' shape.
 * @param options dim (the forward's), stream.
 * @throws {TypeError} On a wrong dtype or no parts.
 * @throws {RangeError} When the shapes do not fit or `dim` is out of range.
 * @example
 * ```ts
 * import { Device, stackBackward, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using dout = Tensor.fromHost(dev, new Float32Array([1, 3, 2, 4]), [2, 2]);
 * using da = Tensor.empty(dev, [2], "f32");
 * using db = Tensor.empty(dev, [2], "f32");
 * stackBackward(dout, [da, db], { dim: 1 });
 * assert.deepStrictEqual([...await db.toHost()], [3, 4]);
 * ```
 */
export function stackBackward(
  dout: Tensor,
  dparts: readonly Tensor[],
  options: ConcatOptions = {},
): void {
  const action = "run stackBackward";
  const ps = partsOf(dparts, "dparts", action);
  const dim = stackLayout(ps, "dparts", dout, "dout", action)(options);
  checkStacked(dout, stackShape(ps[0], ps.length, dim), "dout", action);
  runStack(ps, dout, dim, 1, options, action);
}

function binary(a: Tensor, b: Tensor, y: Tensor, op: number, options: OpOptions, action: string) {
  const dt = activations(action, [a, "a"], [b, "b"], [y, "y"]);
  for (const [t, n] of [[b, "b"], [y, "y"]] as const) {
    if (t.shape.join() !== a.shape.join()) {
      throw new RangeError(
        `Cannot ${action}: ${n} has shape [${t.shape}] but a has [${a.shape}] (no broadcasting: ` +
          `give both inputs and the output one shape)`,
      );
    }
  }
  using launched = launch(action, options, a, b, y);
  const { device, stream } = launched;
  queue(device, "binary", { a, b, y, dtype: dt, count: a.numel, op, stream }, action);
}

/**
 * `y = a + b` elementwise (PyTorch's `torch.add`), in fp32 and rounded once. Its backward is
 * the identity: the output's gradient is each input's.
 *
 * @param a f16 or f32.
 * @param b a's dtype and shape.
 * @param y a's dtype and shape (may be `a` or `b`).
 * @param options stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes differ.
 * @example
 * ```ts
 * import { add, Device, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float16Array([1, 2]));
 * using b = Tensor.fromHost(dev, new Float16Array([0.5, -4]));
 * add(a, b, a);
 * assert.deepStrictEqual([...await a.toHost()], [1.5, -2]);
 * ```
 */
export function add(a: Tensor, b: Tensor, y: Tensor, options: OpOptions = {}): void {
  binary(a, b, y, PS_BINARY_ADD, options, "run add");
}

/**
 * `y = a * b` elementwise (PyTorch's `torch.mul`), in fp32 and rounded once.
 *
 * @param a f16 or f32.
 * @param b a's dtype and shape.
 * @param y a's dtype and shape (may be `a` or `b`).
 * @param options stream.
 * @throws {TypeError} On a wrong dtype.
 * @throws {RangeError} When the shapes differ.
 * @example
 * ```ts
 * import { Device, mul, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float32Array([3, 2]));
 * using b = Tensor.fromHost(dev, new Float32Array([0.5, -4]));
 * using y = Tensor.empty(dev, [2], "f32");
 * mul(a, b, y);
 * assert.deepStrictEqual([...await y.toHost()], [1.5, -8]);
 * ```
 */
export function mul(a: Tensor, b: Tensor, y: Tensor, options: OpOptions = {}): void {
  binary(a, b, y, PS_BINARY_MUL, options, "run mul");
}

/**
 * The backward of {@linkcode mul}: `da = dy * b`, `db = dy * a`.
 *
 * @param dy The gradient of mul's output.
 * @param options The forward's inputs a and b, the gradients da and db (null: skipped), stream.
 * @throws {TypeError} On a wrong dtype, or when `da` is `dy` or `a` while `db` is wanted
 *   (it would be overwritten before it is read).
 * @throws {RangeError} When the shapes differ.
 * @example
 * ```ts
 * import { Device, mulBackward, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using dev = Device.open("cpu");
 * using a = Tensor.fromHost(dev, new Float32Array([3, 2]));
 * using b = Tensor.fromHost(dev, new Float32Array([0.5, -4]));
 * using dy = Tensor.fromHost(dev, new Float32Array([2, 1]));
 * using da = Tensor.empty(dev, [2], "f32");
 * using db = Tensor.empty(dev, [2], "f32");
 * mulBackward(dy, { a, b, da, db });
 * assert.deepStrictEqual([...await da.toHost()], [1, -4]);
 * assert.deepStrictEqual([...await db.toHost()], [6, 2]);
 * ```
 */
export function mulBackward(dy: Tensor, options: MulBackwardOptions): void {
  const action = "run mulBackward";
  refuseUnknownKeys(options ?? {}, ["a", "b", "da", "db", "stream"], action);
  const { a, b, da, db } = options;
  if (da && db && (da === dy || da === a)) {
    throw new TypeError(
      `Cannot ${action}: da may not be dy or a while db is wanted (db reads them after da is ` +
        `written)`,
    );
  }
  if (da) binary(dy, b, da, PS_BINARY_MUL, options, action);
  if (db) binary(dy, a, db, PS_BINARY_MUL, options, action);
}
