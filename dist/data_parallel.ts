/**
 * `DataParallel`: a model replicated on every rank of a {@linkcode ProcessGroup}, whose
 * gradients are averaged over the ranks during backward (PyTorch's DistributedDataParallel).
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { Tensor } from "../ffi/tensor.ts";
import { add } from "../ops/combine.ts";
import { type BackwardOptions, Module } from "../nn/module.ts";
import type { Parameter } from "../nn/parameter.ts";
import type { ProcessGroup } from "./process_group.ts";
import type { Work } from "./work.ts";

/** Options of {@linkcode DataParallel}. */
export interface DataParallelOptions {
  /**
   * The size of a gradient bucket in MiB of fp32 (default 25, as DDP): gradients are packed
   * into buckets in reverse layer order (then in ready order: see
   * {@linkcode DataParallel.buckets}) and each bucket is all-reduced as one message. The first
   * bucket is capped at 1 MiB, as DDP does, so that communication starts early.
   */
  bucketMB?: number;
  /** Broadcast rank 0's buffers (batch-norm running statistics) at the start (default true). */
  broadcastBuffers?: boolean;
}

interface Slot {
  param: Parameter;
  offset: number;
  numel: number;
  /** The gradient's memory, typed (f16 or f32); null for a CUDA model (reduced in place). */
  view: Float32Array | Float16Array | null;
  /** CUDA models under noSync: the sum of the gradients of the backwards so far. */
  sum: Tensor | null;
  /** The backward during which this gradient was last reported ready. */
  readyAt: number;
  /** Its bucket's index. */
  bucket: number;
}

interface Bucket {
  index: number;
  /** The packed gradients (cpu models; CUDA models' gradients are reduced in place). */
  flat: Float32Array;
  slots: Slot[];
  ready: number;
  /** The backward during which this bucket was packed. */
  packedAt: number;
  /** Holds the sum of gradients of backwards run under noSync. */
  accumulated: boolean;
  work: Work | null;
  /** Packed, its all-reduce left for the blocking call once backward returns. */
  deferred: boolean;
}

function gradView(p: Parameter): Float32Array | Float16Array {
  const g = p.grad;
  if (p.numel === 0) return g.dtype === "f16" ? new Float16Array(0) : new Float32Array(0);
  const bytes = p.numel * (g.dtype === "f16" ? 2 : 4);
  const ab = Deno.UnsafePointerView.getArrayBuffer(g.pointer!, bytes);
  return g.dtype === "f16" ? new Float16Array(ab) : new Float32Array(ab);
}

/** The parameters and buffers of a model as lines every rank must agree on. */
function describeModel(model: Module): string[] {
  return [
    ...model.namedParameters().map(([n, p]) => `parameter "${n}" [${p.shape}]`),
    ...model.namedBuffers().map(([n, b]) => `buffer "${n}" [${b.shape}]`),
  ];
}

/**
 * Refuses models that differ between ranks, naming the first difference (on every rank).
 */
function checkSameModel(model: Module, group: ProcessGroup): void {
  const text = describeModel(model).join("\n");
  const codes = Int32Array.from(text, (c) => c.codePointAt(0)!);
  const lengths = new Int32Array(group.size);
  group.allGather(new Int32Array([codes.length]), lengths);
  const max = Math.max(...lengths);
  const padded = new Int32Array(max);
  padded.set(codes);
  const all = new Int32Array(max * group.size);
  group.allGather(padded, all);
  const textOf = (r: number) =>
    String.fromCodePoint(...all.subarray(r * max, r * max + lengths[r])).split("\n");
  const ref = textOf(0);
  for (let r = 1; r < group.size; r++) {
    const other = textOf(r);
    const n = Math.max(ref.length, other.length);
    for (let i = 0; i < n; i++) {
      if (ref[i] === other[i]) continue;
      throw new RangeError(
        `Cannot wrap the model in DataParallel: the ranks' models differ: rank 0 has ` +
          `${ref.length} parameters and buffers, rank ${r} has ${other.length}; entry ${i} is ` +
          `${ref[i] ?? "absent"} on rank 0 but ${other[i] ?? "absent"} on rank ${r}`,
      );
    }
  }
}

/**
 * Data-parallel training: wraps a model that every rank of `group` built the same way, and
 * makes its backward leave in every parameter's gradient the average over the ranks of their
 * gradients, so that each rank's optimizer takes the same step. Fed a different part of the
 * batch on each rank (see {@linkcode DistributedSampler}), n ranks train as one process fed
 * the whole batch.
 *
 * - At construction, rank 0's parameters and buffers are broadcast, after checking that
 *   every rank's model has the same parameters and shapes (naming the first difference).
 * - Gradients are grouped into buckets in reverse layer order, rebuilt once after the first
 *   backward that reduced in the order they became ready in it; each bucket is all-reduced,
 *   asynchronously, as soon as backward wrote its last gradient (the model's
 *   {@linkcode Module.registerGradReadyHook}), so the reduction of the last layers overlaps
 *   with the back-propagation through the first. `backward` returns once every bucket was
 *   reduced and its average is in the gradients.
 * - A cpu model's buckets are packed into fp32 and reduced over MPI (fp16 gradients are
 *   averaged in fp32 and rounded once). A CUDA model needs a group with the nccl backend:
 *   each bucket's gradients are averaged in place, in their own dtype, by one NCCL group call
 *   on the group's communication stream, which waits for an event recorded on the current
 *   stream after the bucket's last gradient, so the reduction overlaps with the rest of
 *   backward on the device.
 * - Under mixed precision the {@linkcode GradScaler}'s found-inf decision is the same on
 *   every rank: the averaged gradients are bit-identical across ranks, and an inf or NaN on
 *   any rank propagates into the average, so every rank skips the same steps (PyTorch's DDP
 *   relies on the same property).
 * - {@linkcode DataParallel.noSync} accumulates gradients locally for gradient accumulation.
 * - Batch norm stays per rank unless the model uses {@linkcode SyncBatchNorm}.
 *
 * The wrapper is a Module: pass it to a {@linkcode Trainer} in place of the model. Its
 * parameters are the model's, named with a `module.` prefix as PyTorch's DDP names them;
 * save and load checkpoints of the model itself. Disposing the wrapper leaves the model.
 *
 * @example One rank (no launcher): the gradients are the local ones
 * ```ts
 * import { DataParallel, Device, Linear, ProcessGroup, Tensor } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * using group = ProcessGroup.init();
 * using model = new Linear(2, 1).to(device, { precision: "fp32" });
 * using dp = new DataParallel(model, group);
 * using x = Tensor.fromHost(device, new Float32Array([1, 2]), [1, 2]);
 * dp.forward(x);
 * using dy = Tensor.fromHost(device, new Float32Array([1]), [1, 1]);
 * dp.backward(dy, { inputGrad: false });
 * assert.deepStrictEqual([...await model.weight.grad.toHost()], [1, 2]);
 * ```
 */
export class DataParallel extends Module {
  /** The wrapped model. */
  readonly module: Module;
  /** The ranks. */
  readonly group: ProcessGroup;
  #bucketParams: readonly (readonly Parameter[])[] = [];
  /** Parameters in the order their gradients became ready in this backward. */
  #order: Parameter[] = [];
  #rebuilt = false;
  #cap: number;
  #buckets: Bucket[] = [];
  #slots = new Map<Parameter, Slot>();
  #hook: Disposable;
  #pass = 0;
  #noSync = 0;
  #onDevice: boolean;

  /**
   * The buckets' parameters, by bucket: in reverse parameter order until the first backward
   * that reduced, then in the order rank 0's gradients became ready in it.
   */
  get buckets(): readonly (readonly Parameter[])[] {
    return this.#bucketParams;
  }

  /**
   * Wraps `model` (already on its device) and broadcasts rank 0's weights.
   *
   * @param model The model, the same on every rank, on a cpu device, or a CUDA device with a
   *   group of the nccl backend.
   * @param group The ranks.
   * @param options Bucket size, buffer broadcast.
   * @throws {TypeError} When the model's device does not fit the group's backend, or on an
   *   unknown option.
   * @throws {RangeError} When the ranks' models differ (naming the first difference) or the
   *   bucket size is not positive.
   */
  constructor(model: Module, group: ProcessGroup, options: DataParallelOptions = {}) {
    super();
    const action = "wrap the model in DataParallel";
    refuseUnknownKeys(options ?? {}, ["bucketMB", "broadcastBuffers"], action);
    const bucketMB = options.bucketMB ?? 25;
    if (!(bucketMB > 0) || !Number.isFinite(bucketMB)) {
      throw new RangeError(`Cannot ${action}: bucketMB must be > 0, got ${bucketMB}`);
    }
    if (!model.device) {
      throw new TypeError(`Cannot ${action}: the model is not on a device (call to() first)`);
    }
    this.#onDevice = model.device.kind !== "cpu";
    if (!this.#onDevice && model.precision === "bf16") {
      throw new TypeError(
        `Cannot ${action}: a bf16 model on ${model.device}; the mpi backend reduces fp32 and ` +
          `fp16 gradients (bf16 ones on a CUDA device, with the nccl backend)`,
      );
    }
    if (this.#onDevice && group.backend !== "nccl") {
      throw new TypeError(
        `Cannot ${action}: the model is on ${model.device}; the mpi backend reduces cpu-device ` +
          `memory: create the group with { backend: "nccl" } for CUDA models`,
      );
    }
    this.module = model;
    this.group = group;
    this.children.set("module", model);
    this.device = model.device;
    this.precision = model.precision;
    this.training = model.training;

    checkSameModel(model, group);
    for (const p of model.parameters()) {
      group.broadcast(p.master, { root: 0 });
      p.syncHalf();
    }
    if (options.broadcastBuffers ?? true) {
      for (const [, b] of model.namedBuffers()) group.broadcast(b.tensor, { root: 0 });
    }

    this.#cap = bucketMB * 2 ** 20 / 4;
    this.#assign(model.parameters().reverse());
    this.#hook = model.registerGradReadyHook((params) => this.#ready(params));
  }

  /**
   * Runs the model.
   *
   * @param x The input.
   * @returns The model's output.
   */
  forward(x: Tensor): Tensor {
    return this.module.forward(x);
  }

  /**
   * Runs the model's backward while all-reducing its gradients bucket by bucket; returns
   * once every gradient holds the average over the ranks (or, under
   * {@linkcode DataParallel.noSync}, once this backward's gradients were added to the local
   * accumulation).
   *
   * @param dy The output's gradient.
   * @param options Whether the input's gradient is needed.
   * @returns The input's gradient, or null.
   * @throws {Error} When a collective fails or times out.
   */
  backward(dy: Tensor, options: BackwardOptions = {}): Tensor | null {
    this.#pass++;
    this.#order = [];
    const dx = this.module.backward(dy, options);
    // Buckets whose gradients no container reported (a lone layer, or parameters a backward
    // did not reach): packed now, in bucket order, which is the same on every rank.
    for (const b of this.#buckets) if (b.packedAt !== this.#pass) this.#launch(b);
    if (this.#noSync > 0) return dx;
    const n = this.group.size;
    for (const b of this.#buckets) {
      if (b.deferred) {
        // The last bucket: nothing is left to overlap it with, and the blocking call is MPI's
        // own (it queues behind the buckets still in flight), where the asynchronous form's
        // polite wait costs up to a few times the transfer.
        b.deferred = false;
        this.group.allReduce(b.flat, { op: "sum" });
      } else {
        b.work!.waitSync();
        b.work = null;
      }
      if (!this.#onDevice) {
        // The average is written straight into the gradients: one pass over the sum.
        const f = b.flat;
        for (const s of b.slots) {
          const v = s.view!, o = s.offset, len = s.numel;
          for (let i = 0; i < len; i++) v[i] = f[o + i] / n;
        }
      }
      b.ready = 0;
    }
    if (!this.#rebuilt) this.#rebuild();
    return dx;
  }

  /** Packs the parameters into buckets in `order`, each of at most the bucket size. */
  #assign(order: readonly Parameter[]): void {
    const cap = this.#cap;
    // A small first bucket, as DDP: its reduction starts early in backward.
    const firstCap = Math.min(cap, 2 ** 20 / 4);
    this.#buckets = [];
    let current: Slot[] = [], size = 0;
    const close = () => {
      if (current.length === 0) return;
      this.#buckets.push({
        index: this.#buckets.length,
        flat: new Float32Array(this.#onDevice ? 0 : size),
        slots: current,
        ready: 0,
        packedAt: -1,
        accumulated: false,
        work: null,
        deferred: false,
      });
      current = [];
      size = 0;
    };
    for (const p of order) {
      const limit = this.#buckets.length === 0 ? firstCap : cap;
      if (size > 0 && size + p.numel > limit) close();
      let slot = this.#slots.get(p);
      if (!slot) {
        slot = {
          param: p,
          offset: 0,
          numel: p.numel,
          view: this.#onDevice ? null : gradView(p),
          sum: null,
          readyAt: -1,
          bucket: 0,
        };
        this.#slots.set(p, slot);
      }
      slot.offset = size;
      slot.bucket = this.#buckets.length;
      current.push(slot);
      size += p.numel;
    }
    close();
    this.#bucketParams = this.#buckets.map((b) => b.slots.map((s) => s.param));
  }

  /**
   * Rebuilds the buckets in the order the gradients became ready in the backward that just
   * reduced (DDP's rebuild after its first iteration), once: a model whose layers back-propagate
   * in another order than their parameters' reverse then fills its buckets one after the other.
   * Rank 0's order is broadcast so that every rank packs the same buckets.
   */
  #rebuild(): void {
    this.#rebuilt = true;
    const seen = new Set(this.#order);
    // Parameters no container reported were packed at the end of backward, in bucket order.
    for (const b of this.#buckets) {
      for (const s of b.slots) if (!seen.has(s.param)) this.#order.push(s.param);
    }
    const params = this.module.parameters();
    const index = new Map(params.map((p, i) => [p, i]));
    const codes = Int32Array.from(this.#order, (p) => index.get(p)!);
    this.group.broadcast(codes, { root: 0 });
    this.#order = [];
    this.#assign(Array.from(codes, (i) => params[i]));
  }

  #ready(params: readonly Parameter[]): void {
    for (const p of params) {
      const s = this.#slots.get(p);
      if (!s || s.readyAt === this.#pass) continue;
      s.readyAt = this.#pass;
      if (!this.#rebuilt) this.#order.push(p);
      this.#buckets[s.bucket].ready++;
    }
    // In bucket order, as DDP does: a full bucket waits for the ones before it, so every rank
    // issues the same sequence whatever order a layer reports its parameters in.
    for (const b of this.#buckets) {
      if (b.packedAt === this.#pass) continue;
      if (b.ready < b.slots.length) break;
      this.#launch(b);
    }
  }

  /** Packs a bucket's gradients (adding to an accumulation) and starts its all-reduce. */
  #launch(b: Bucket): void {
    b.packedAt = this.#pass;
    b.ready = 0;
    if (this.#onDevice) {
      this.#launchOnDevice(b);
      return;
    }
    for (const s of b.slots) {
      if (b.accumulated) {
        const f = b.flat, v = s.view!, o = s.offset;
        for (let i = 0; i < s.numel; i++) f[o + i] += v[i];
      } else {
        b.flat.set(s.view!, s.offset);
      }
    }
    if (this.#noSync > 0) {
      b.accumulated = true;
      return;
    }
    b.accumulated = false;
    // Every rank defers the same bucket (the buckets and their order are agreed), so every
    // rank issues each collective in the same form, as MPI requires.
    if (b.index === this.#buckets.length - 1) b.deferred = true;
    else b.work = this.group.allReduceAsync(b.flat, { op: "sum" });
  }

  /** #launch for a CUDA model: device-side accumulation, then one NCCL group in place. */
  #launchOnDevice(b: Bucket): void {
    const device = this.device!;
    for (const s of b.slots) {
      const g = s.param.grad;
      if (this.#noSync > 0 && !b.accumulated) {
        s.sum ??= Tensor.empty(device, [...g.shape], g.dtype);
        s.sum.buffer.copyFrom(g.buffer, { stream: device.currentStream });
      } else if (this.#noSync > 0) {
        add(s.sum!, g, s.sum!);
      } else if (b.accumulated) {
        add(g, s.sum!, g);
      }
    }
    if (this.#noSync > 0) {
      b.accumulated = true;
      return;
    }
    b.accumulated = false;
    b.work = this.group._allReduceTensorsAsync(b.slots.map((s) => s.param.grad), "avg");
  }

  /**
   * Skips the gradient all-reduce while the returned handle lives: each backward adds its
   * gradients to a local sum, and the first backward after the handle is disposed adds its
   * own and reduces the whole sum (PyTorch's `no_sync()`). Step the optimizer only after that
   * backward.
   *
   * @returns Dispose it (or `using`) to end the no-sync region.
   * @example
   * ```ts
   * import { DataParallel, Device, Linear, ProcessGroup, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using group = ProcessGroup.init();
   * using model = new Linear(1, 1).to(device, { precision: "fp32" });
   * using dp = new DataParallel(model, group);
   * using x = Tensor.fromHost(device, new Float32Array([1]), [1, 1]);
   * using dy = Tensor.fromHost(device, new Float32Array([1]), [1, 1]);
   * {
   *   using _ = dp.noSync();
   *   dp.forward(x);
   *   dp.backward(dy, { inputGrad: false });
   * }
   * dp.forward(x);
   * dp.backward(dy, { inputGrad: false });
   * const [w] = await model.weight.grad.toHost();
   * assert.strictEqual(w, 2); // two micro-batches' gradients, summed
   * ```
   */
  noSync(): Disposable {
    this.#noSync++;
    let open = true;
    return {
      [Symbol.dispose]: () => {
        if (open) this.#noSync--;
        open = false;
      },
    };
  }

  /**
   * Removes the gradient hook; the model stays the caller's, to train on alone or to free.
   * Idempotent.
   */
  override dispose(): void {
    this.#hook[Symbol.dispose]();
    for (const s of this.#slots.values()) {
      s.sum?.dispose();
      s.sum = null;
    }
  }
}
