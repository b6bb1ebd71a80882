/**
 * The base of every layer: parameters with fp32 master weights and fp16 compute copies,
 * buffers, train/eval modes, device placement with a precision, and PyTorch-compatible state
 * dicts.
 *
 * Parameters are created on the host (initialized there from a seeded generator, so weights
 * do not depend on the backend) and uploaded by {@linkcode Module.to}, which also chooses the
 * model's precision:
 *
 * - `"fp16"` (the default, mixed precision as PyTorch's autocast + GradScaler): activations
 *   and their gradients are fp16, every kernel accumulates in fp32, and a parameter that the
 *   forward reads in fp16 keeps three device tensors: the fp32 master weight the optimizer
 *   updates, the fp16 copy the kernels read, and the gradient.
 * - `"fp32"`: everything is fp32 (PyTorch without autocast): the forward reads the master
 *   weight itself, gradients are fp32, and no fp16 copy exists.
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import type { Device } from "../ffi/device.ts";
import { type DType, Tensor } from "../ffi/tensor.ts";
import type { HostData, HostTensor } from "./safetensors.ts";
import * as ops from "../ops/mod.ts";
import { type BufferTensor, checkPrecision, type Parameter, type Precision } from "./parameter.ts";

/** Options of {@linkcode Module.to}. */
export interface ModuleToOptions {
  /** The precision the model computes in (default "fp16": mixed precision). */
  precision?: Precision;
}

/** Options of {@linkcode Module.backward}. */
export interface BackwardOptions {
  /** Compute the gradient of the input (default true); false saves work in the first layer. */
  inputGrad?: boolean;
}

/**
 * Called during backward with parameters whose gradients were just written and will not be
 * written again in this backward (see {@linkcode Module.registerGradReadyHook}).
 */
export type GradReadyHook = (params: readonly Parameter[]) => void;

/** Options of {@linkcode Module.loadStateDict}. */
export interface LoadStateDictOptions {
  /** Refuse missing and unexpected keys (default true), as PyTorch does. */
  strict?: boolean;
  /** Where the state came from (a file path), named in every error (default "the state dict"). */
  source?: string;
}

/**
 * What a layer's {@linkcode Module.loadExtraState} found: the keys it will consume and the
 * function that applies them, called only once every key of the whole state was validated.
 */
export interface ExtraStateLoad {
  /** The state keys this layer consumes. */
  keys: string[];
  /** Applies the validated values (must not throw). */
  apply: () => void;
}

/**
 * The base class of layers and containers (PyTorch's `nn.Module`). A module computes
 * `forward(x)` and, in training, `backward(dy)`, which writes its parameters' gradients and
 * returns the input's gradient. Tensors returned by `forward` and `backward` are owned by the
 * module and reused by the next call with the same shape: use them before the next step.
 *
 * @example
 * ```ts
 * import { Linear, ReLU, Sequential } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const model = new Sequential([new Linear(4, 3), new ReLU(), new Linear(3, 2)]);
 * assert.deepStrictEqual(
 *   model.namedParameters().map(([n]) => n),
 *   ["0.weight", "0.bias", "2.weight", "2.bias"],
 * );
 * assert.strictEqual(model.eval().training, false);
 * ```
 */
export abstract class Module {
  /** Training (true) or evaluation mode. */
  training = true;
  /** The device, once {@linkcode Module.to} was called. */
  device: Device | null = null;
  /** The precision {@linkcode Module.to} chose ("fp16" until then). */
  precision: Precision = "fp16";
  /** Parameters registered by this module, by local name. */
  protected readonly params: Map<string, Parameter> = new Map();
  /** Buffers registered by this module, by local name. */
  protected readonly buffers: Map<string, BufferTensor> = new Map();
  /** Child modules, by local name (PyTorch's names: "0", "1", ... in Sequential). */
  protected readonly children: Map<string, Module> = new Map();
  #workspace = new Map<string, Tensor>();
  #revertList: ops.TensorList | null = null;
  #gradHooks: GradReadyHook[] = [];

  /**
   * Runs the layer.
   *
   * @param x The input (fp16 activations, NCHW or [N, F]).
   * @returns The output, owned by the module.
   */
  abstract forward(x: Tensor): Tensor;

  /**
   * Back-propagates `dy` (the gradient of the loss with respect to the last forward's output):
   * writes the parameters' gradients and returns the input's gradient.
   *
   * @param dy The output's gradient.
   * @param options Whether the input's gradient is needed.
   * @returns The input's gradient, or null when `inputGrad` is false.
   */
  abstract backward(dy: Tensor, options?: BackwardOptions): Tensor | null;

  /**
   * Runs the model on several inputs (a model with more than one input overrides this and
   * {@linkcode Module.backwardInputs}; {@linkcode Trainer.trainStep} calls it when given an
   * array). By default a module takes exactly one input: `forward(inputs[0])`.
   *
   * @param inputs The inputs, in the model's order.
   * @returns The output, owned by the module.
   * @throws {RangeError} By default, unless there is exactly one input.
   * @example A two-input model that sums its inputs
   * ```ts
   * import { add, Device, Module, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * class Sum extends Module {
   *   forward(): Tensor {
   *     throw new TypeError("Cannot run Sum: it takes two inputs (forwardInputs)");
   *   }
   *   backward(): Tensor | null {
   *     throw new TypeError("Cannot run Sum: it takes two inputs (backwardInputs)");
   *   }
   *   override forwardInputs([a, b]: readonly Tensor[]): Tensor {
   *     const y = this.workspace("y", [...a.shape], a.dtype);
   *     add(a, b, y);
   *     return y;
   *   }
   *   override backwardInputs(dy: Tensor): (Tensor | null)[] {
   *     return [dy, dy]; // the gradient of a sum is the output's, for each input
   *   }
   * }
   * using device = Device.open("cpu");
   * using sum = new Sum().to(device);
   * using a = Tensor.fromHost(device, new Float16Array([1, 2]));
   * using b = Tensor.fromHost(device, new Float16Array([3, 4]));
   * assert.deepStrictEqual([...await sum.forwardInputs([a, b]).toHost()], [4, 6]);
   * ```
   */
  forwardInputs(inputs: readonly Tensor[]): Tensor {
    if (!Array.isArray(inputs) || inputs.length !== 1) {
      throw new RangeError(
        `Cannot run ${this.constructor.name}: it takes one input, got ` +
          `${Array.isArray(inputs) ? inputs.length : inputs} (a model with several inputs ` +
          `overrides forwardInputs and backwardInputs)`,
      );
    }
    return this.forward(inputs[0]);
  }

  /**
   * The backward of {@linkcode Module.forwardInputs}: writes the parameters' gradients and
   * returns each input's gradient. By default `[backward(dy)]`.
   *
   * @param dy The output's gradient.
   * @param options Whether the inputs' gradients are needed.
   * @returns One gradient per input (null where `inputGrad` is false).
   */
  backwardInputs(dy: Tensor, options?: BackwardOptions): (Tensor | null)[] {
    return [this.backward(dy, options)];
  }

  /**
   * Registers `module` as a child named `name` (PyTorch's `add_module`): its parameters and
   * buffers become this module's under `name.`, and {@linkcode Module.to}, train/eval,
   * {@linkcode Module.apply}, state dicts and dispose reach it.
   *
   * @param name The child's name (no dots, not taken).
   * @param module The child.
   * @returns `module`.
   * @throws {TypeError} When the name is empty, has a dot or is taken, or `module` is not a
   *   Module.
   * @example
   * ```ts
   * import { Linear, Module, type Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * class Head extends Module {
   *   fc = this.addModule("fc", new Linear(2, 1));
   *   forward(x: Tensor): Tensor {
   *     return this.fc.forward(x);
   *   }
   *   backward(dy: Tensor): Tensor | null {
   *     return this.fc.backward(dy);
   *   }
   * }
   * assert.deepStrictEqual(new Head().namedParameters().map(([n]) => n), ["fc.weight", "fc.bias"]);
   * ```
   */
  addModule<M extends Module>(name: string, module: M): M {
    if (typeof name !== "string" || name === "" || name.includes(".")) {
      throw new TypeError(
        `Cannot add a module: name must be non-empty without dots, got "${name}"`,
      );
    }
    if (this.children.has(name)) {
      throw new TypeError(`Cannot add a module: "${name}" is taken`);
    }
    if (!(module instanceof Module)) {
      throw new TypeError(`Cannot add module "${name}": it is not a Module, got ${module}`);
    }
    this.children.set(name, module);
    if (this.device) module.to(this.device, { precision: this.precision });
    return module;
  }

  /**
   * The parameters with their dotted names, in registration order (PyTorch's names).
   *
   * @param prefix Prepended to every name.
   * @returns `[name, parameter]` pairs.
   */
  namedParameters(prefix = ""): [string, Parameter][] {
    const out: [string, Parameter][] = [];
    for (const [n, p] of this.params) out.push([prefix + n, p]);
    for (const [n, c] of this.children) out.push(...c.namedParameters(`${prefix}${n}.`));
    return out;
  }

  /**
   * The parameters, in registration order.
   *
   * @returns The parameters.
   */
  parameters(): Parameter[] {
    return this.namedParameters().map(([, p]) => p);
  }

  /**
   * The buffers with their dotted names.
   *
   * @param prefix Prepended to every name.
   * @returns `[name, buffer]` pairs.
   */
  namedBuffers(prefix = ""): [string, BufferTensor][] {
    const out: [string, BufferTensor][] = [];
    for (const [n, b] of this.buffers) out.push([prefix + n, b]);
    for (const [n, c] of this.children) out.push(...c.namedBuffers(`${prefix}${n}.`));
    return out;
  }

  /**
   * This module and its descendants with dotted names ("" for this one).
   *
   * @param prefix Prepended to every name.
   * @returns `[name, module]` pairs.
   */
  namedModules(prefix = ""): [string, Module][] {
    const out: [string, Module][] = [[prefix.replace(/\.$/, ""), this]];
    for (const [n, c] of this.children) out.push(...c.namedModules(`${prefix}${n}.`));
    return out;
  }

  /**
   * Calls `fn` on every descendant module, children before their parent, then on this module
   * (PyTorch's `Module.apply`): the place for a custom initialization, written through
   * {@linkcode Parameter.write} (on the host before {@linkcode Module.to}, or on the device
   * after it).
   *
   * @param fn Called once per module.
   * @returns This module.
   * @throws {TypeError} When `fn` is not a function.
   * @example Re-initialize every Linear and Conv2d weight, zero every bias
   * ```ts
   * import {
   *   Conv2d, Flatten, kaimingUniform, Linear, ReLU, Sequential, Xoshiro128,
   * } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const model = new Sequential([
   *   new Conv2d(1, 4, { kernelSize: 3 }), new ReLU(), new Flatten(), new Linear(16, 2),
   * ]);
   * const rng = new Xoshiro128(7);
   * model.apply((m) => {
   *   if (m instanceof Linear || m instanceof Conv2d) {
   *     const fanIn = m.weight.numel / m.weight.shape[0];
   *     m.weight.write(kaimingUniform(new Float32Array(m.weight.numel), fanIn, rng, 0));
   *     m.bias?.write(new Float32Array(m.bias.numel));
   *   }
   * });
   * assert.deepStrictEqual([...await model.parameters()[3].read()], [0, 0]);
   * ```
   */
  apply(fn: (module: Module) => void): this {
    if (typeof fn !== "function") {
      throw new TypeError(`Cannot apply to a module: fn must be a function, got ${fn}`);
    }
    for (const c of this.children.values()) c.apply(fn);
    fn(this);
    return this;
  }

  /**
   * Registers `hook`, called during {@linkcode Module.backward} each time a layer's parameter
   * gradients are final: by a container (Sequential) right after the layer's backward
   * returned, with that layer's parameters, in backward order. It is what lets data-parallel
   * training reduce the last layers' gradients while the first layers still back-propagate.
   * A hook must not change the gradients before backward returns; a backward that a
   * container does not drive (a lone layer) calls no hook. Nested containers each report,
   * so a hook may see a parameter twice in one backward.
   *
   * @param hook Called with the parameters whose gradients are ready.
   * @returns Disposing it removes the hook.
   * @example
   * ```ts
   * import { Device, Linear, ReLU, Sequential, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using model = new Sequential([new Linear(2, 3), new ReLU(), new Linear(3, 1)]).to(device);
   * const seen: string[][] = [];
   * const names = new Map(model.namedParameters().map(([n, p]) => [p, n]));
   * using _hook = model.registerGradReadyHook((ps) => seen.push(ps.map((p) => names.get(p)!)));
   * using x = Tensor.fromHost(device, new Float16Array(2), [1, 2]);
   * model.forward(x);
   * using dy = Tensor.fromHost(device, new Float16Array(1), [1, 1]);
   * model.backward(dy, { inputGrad: false });
   * assert.deepStrictEqual(seen, [["2.weight", "2.bias"], ["0.weight", "0.bias"]]);
   * ```
   */
  registerGradReadyHook(hook: GradReadyHook): Disposable {
    const modules = this.namedModules().map(([, m]) => m);
    for (const m of modules) m.#gradHooks.push(hook);
    return {
      [Symbol.dispose]: () => {
        for (const m of modules) m.#gradHooks = m.#gradHooks.filter((h) => h !== hook);
      },
    };
  }

  /** For containers: reports that `child`'s backward wrote its final parameter gradients. */
  protected gradReady(child: Module): void {
    if (this.#gradHooks.length === 0) return;
    const params = child.parameters();
    if (params.length === 0) return;
    for (const h of this.#gradHooks) h(params);
  }

  /**
   * Sets training mode (recursively).
   *
   * @param mode True for training, false for evaluation.
   * @returns This module.
   */
  train(mode = true): this {
    this.training = mode;
    for (const c of this.children.values()) c.train(mode);
    return this;
  }

  /**
   * Sets evaluation mode: forward only, batch norm uses running statistics.
   *
   * @returns This module.
   */
  eval(): this {
    return this.train(false);
  }

  /**
   * Places the parameters and buffers on `device` (recursively), computing in `precision`:
   * "fp16" (the default, mixed precision) or "fp32". Feed an "fp32" model f32 inputs (a
   * prefetcher with `dtype: "f32"`) and train it without loss scaling; the optimizer, the
   * scheduler, checkpoints and state dicts work the same in both.
   *
   * @param device The device.
   * @param options The precision.
   * @returns This module.
   * @throws {TypeError} On an unknown option or precision, or when a parameter already lives
   *   elsewhere or with the other precision.
   * @example A model in fp32
   * ```ts
   * import { Device, Linear, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using fc = new Linear(2, 1).to(device, { precision: "fp32" });
   * fc.weight.write(new Float32Array([1, 2]));
   * fc.bias!.write(new Float32Array([0.1]));
   * assert.strictEqual(fc.precision, "fp32");
   * assert.strictEqual(fc.weight.half, null);
   * using x = Tensor.fromHost(device, new Float32Array([3, 4]), [1, 2]);
   * const [y] = await fc.forward(x).toHost();
   * assert.strictEqual(y, Math.fround(11 + Math.fround(0.1)));
   * ```
   */
  to(device: Device, options: ModuleToOptions = {}): this {
    refuseUnknownKeys(options ?? {}, ["precision"], "move a module");
    const precision = checkPrecision(options?.precision, "move a module");
    if (this.device !== null && precision !== this.precision) {
      throw new TypeError(
        `Cannot move a module: it is already on ${this.device} in ${this.precision} ` +
          `(a model's precision is chosen once, by its first to())`,
      );
    }
    for (const p of this.params.values()) p.to(device, precision);
    for (const b of this.buffers.values()) b.to(device);
    for (const c of this.children.values()) c.to(device, { precision });
    this.device = device;
    this.precision = precision;
    return this;
  }

  /**
   * Undoes the running-statistics update of each layer's last training forward (batch norm's
   * running mean and variance) when the device flag is non-zero, on the device: the decision
   * is the kernel's, so nothing is read back. {@linkcode GradScaler.step} calls it with its
   * found-inf flag for a step it skips, so that a batch with inf/NaN, which leaves the weights
   * alone, does not leave NaN in the running statistics for good either.
   *
   * @param flag i32 [1] on the model's device (a GradScaler's `foundInf`).
   * @example A skipped step keeps the statistics from before its forward
   * ```ts
   * import { Device } from "@pinstream/pinstream";
   * import { Tensor } from "@pinstream/pinstream";
   * import { BatchNorm2d } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using bn = new BatchNorm2d(1).to(device);
   * using x = Tensor.fromHost(device, new Float16Array([NaN, 1]), [2, 1, 1, 1]);
   * using skipped = Tensor.fromHost(device, new Int32Array([1]));
   * bn.forward(x);
   * bn.revertRunningStats(skipped);
   * assert.deepStrictEqual([...await bn.runningMean.read()], [0]);
   * ```
   */
  revertRunningStats(flag: Tensor): void {
    // Every layer's saved statistics go back in one launch (one copy list for the model).
    const copies: ops.CopyEntry[] = [];
    for (const [, m] of this.namedModules()) copies.push(...m.runningStatsBackup());
    if (copies.length === 0) return;
    this.#revertList ??= new ops.TensorList(flag.device, "copy");
    this.#revertList.setCopies(copies);
    ops.multiCopyIf(this.#revertList, { flag });
  }

  /**
   * This layer's part of {@linkcode Module.revertRunningStats}: where its last training forward
   * saved the running statistics it changed, and where they go back (none by default). Called
   * once per revert: a layer forgets its backup then, so a second revert does not restore
   * statistics a later step has built on.
   */
  protected runningStatsBackup(): ops.CopyEntry[] {
    return [];
  }

  /** Extra state tensors a layer keeps on the host (batch norm's `num_batches_tracked`). */
  protected extraState(): Map<string, HostTensor> {
    return new Map();
  }

  /**
   * Validates this layer's part of {@linkcode Module.extraState} in `state` (throwing a
   * RangeError that names `source` and the key) and returns how to apply it; changes nothing.
   */
  protected loadExtraState(
    _state: Map<string, HostTensor>,
    _prefix: string,
    _source: string,
  ): ExtraStateLoad {
    return { keys: [], apply: () => {} };
  }

  /**
   * The weights and buffers as host tensors under PyTorch's names (fp32 master weights), in
   * the order PyTorch's `state_dict()` lists them, ready for safetensors.
   *
   * @returns Name to tensor.
   */
  async stateDict(): Promise<Map<string, HostTensor>> {
    const out = new Map<string, HostTensor>();
    await this.#collect("", out);
    return out;
  }

  async #collect(prefix: string, out: Map<string, HostTensor>): Promise<void> {
    for (const [n, p] of this.params) {
      out.set(prefix + n, { dtype: "F32", shape: [...p.shape], data: await p.read() });
    }
    for (const [n, b] of this.buffers) {
      out.set(prefix + n, { dtype: "F32", shape: [...b.shape], data: await b.read() });
    }
    for (const [n, t] of this.extraState()) out.set(prefix + n, t);
    for (const [n, c] of this.children) await c.#collect(`${prefix}${n}.`, out);
  }

  /**
   * Loads weights and buffers saved by {@linkcode Module.stateDict} (or by PyTorch, through
   * safetensors). fp16/fp64 values are converted to fp32. Every key is validated before
   * anything is written, so a state that is refused leaves the module unchanged.
   *
   * @param state Name to tensor.
   * @param options `strict` (default true) refuses missing and unexpected keys; `source`
   *   names the state's origin in errors.
   * @throws {RangeError} On a shape mismatch or a non-float tensor (naming the tensor and the
   *   source), or in strict mode on missing/unexpected keys.
   * @example A refused state changes nothing
   * ```ts
   * import { Linear } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * const fc = new Linear(2, 1);
   * const state = await fc.stateDict();
   * state.set("weight", { dtype: "F32", shape: [1, 2], data: new Float32Array([7, 7]) });
   * state.delete("bias");
   * assert.throws(() => fc.loadStateDict(state, { source: "fc.safetensors" }), /missing keys \[bias\]/);
   * assert.notDeepStrictEqual([...await fc.weight.read()], [7, 7]);
   * ```
   */
  loadStateDict(state: Map<string, HostTensor>, options: LoadStateDictOptions = {}): void {
    refuseUnknownKeys(options ?? {}, ["strict", "source"], "load a state dict");
    const strict = options.strict ?? true;
    const source = options.source ?? "the state dict";
    const used = new Set<string>();
    const missing: string[] = [];
    const writes: [Parameter | BufferTensor, Float32Array][] = [];
    const entries: [string, Parameter | BufferTensor][] = [
      ...this.namedParameters(),
      ...this.namedBuffers(),
    ];
    for (const [name, target] of entries) {
      const t = state.get(name);
      if (!t) {
        missing.push(name);
        continue;
      }
      if (t.shape.join() !== target.shape.join()) {
        throw new RangeError(
          `Cannot load "${name}" from ${source}: shape [${t.shape}] does not match the ` +
            `module's [${target.shape}]`,
        );
      }
      writes.push([target, toF32(t, name, source)]);
      used.add(name);
    }
    const extra: ExtraStateLoad[] = [];
    for (const [prefix, m] of this.namedModules()) {
      const e = m.loadExtraState(state, prefix ? prefix + "." : "", source);
      for (const k of e.keys) used.add(k);
      extra.push(e);
    }
    if (strict) {
      const unexpected = [...state.keys()].filter((k) => !used.has(k));
      if (missing.length || unexpected.length) {
        throw new RangeError(
          `Cannot load ${source}: missing keys [${missing.join(", ")}], ` +
            `unexpected keys [${unexpected.join(", ")}]`,
        );
      }
    }
    // Everything was checked: from here on nothing throws, so the module is never left half
    // loaded.
    for (const [target, values] of writes) target.write(values);
    for (const e of extra) e.apply();
  }

  /**
   * A device tensor owned by this module for `key`, reused while the shape and dtype stay the
   * same (so steps do not allocate).
   */
  protected workspace(key: string, shape: number[], dtype: DType): Tensor {
    const device = this.device;
    if (!device) throw new TypeError("Cannot run the module: it is not on a device (call to())");
    const k = `${key}:${dtype}:${shape.join("x")}`;
    let t = this.#workspace.get(k);
    if (!t) {
      // Shapes alternate between at most a few values (full batch, last partial batch, eval
      // batch), so one entry per (key, shape) is kept rather than reallocating on each change.
      t = Tensor.empty(device, shape, dtype);
      this.#workspace.set(k, t);
    }
    return t;
  }

  /**
   * Frees parameters, buffers and workspaces (recursively; idempotent).
   */
  dispose(): void {
    this.#revertList?.dispose();
    this.#revertList = null;
    for (const p of this.params.values()) p.dispose();
    for (const b of this.buffers.values()) b.dispose();
    for (const t of this.#workspace.values()) t.dispose();
    this.#workspace.clear();
    for (const c of this.children.values()) c.dispose();
  }

  /** Same as {@linkcode Module.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

function toF32(t: HostTensor, name: string, source: string): Float32Array {
  const d: HostData = t.data;
  if (d instanceof Float32Array) return d;
  if (d instanceof Float16Array || d instanceof Float64Array) return Float32Array.from(d);
  throw new RangeError(
    `Cannot load "${name}" from ${source}: dtype ${t.dtype} is not a float type`,
  );
}
