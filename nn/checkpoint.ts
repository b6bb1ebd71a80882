/**
 * Checkpoints that resume training exactly.
 *
 * A checkpoint is two safetensors files:
 *
 * - `PATH` — the model's weights and buffers under PyTorch's names (fp32 master weights,
 *   `num_batches_tracked` as I64), metadata `{"format": "pt"}`: loadable with
 *   `safetensors.torch.load_file(PATH)` and `model.load_state_dict(...)` in PyTorch.
 * - `PATH` with `.state.safetensors` in place of `.safetensors` (or appended) — the training
 *   state: the optimizer's momentum buffers as tensors named
 *   `optimizer.momentum_buffer.<parameter name>`, and in the metadata (key `pinstream.state`,
 *   JSON) the optimizer's hyper-parameters and completed steps, the scaler's scale and growth
 *   tracker, the scheduler's position, the epoch and step, a generator's state, and any extra
 *   JSON the caller adds.
 *
 * With the data order a pure function of (seed, epoch), as the DataLoader guarantees, that is
 * everything the next step depends on. Both files are written to a temporary name and renamed,
 * so an interrupted save never leaves a torn checkpoint.
 *
 * @module
 */

import type { Module } from "./module.ts";
import type { SGD, SGDState } from "./optim.ts";
import type { GradScaler, GradScalerState } from "./grad_scaler.ts";
import type { LRScheduler, LRSchedulerState } from "./lr_scheduler.ts";
import type { RngState, Xoshiro128 } from "./init.ts";
import { decodeSafetensors, encodeSafetensors, type HostTensor } from "./safetensors.ts";

/** What {@linkcode saveCheckpoint} saves and {@linkcode loadCheckpoint} restores. */
export interface CheckpointParts {
  /** The model (weights and buffers). */
  model: Module;
  /** The optimizer. */
  optimizer?: SGD | null;
  /** The loss scaler. */
  scaler?: GradScaler | null;
  /** The learning-rate scheduler. */
  scheduler?: LRScheduler | null;
  /** A generator whose state to save/restore (e.g. the one initializing weights). */
  rng?: Xoshiro128 | null;
}

/** Progress saved with a checkpoint. */
export interface CheckpointProgress {
  /** Completed epochs. */
  epoch: number;
  /** Completed steps (batches) overall. */
  step: number;
  /** Caller data (JSON-serializable). */
  extra?: Record<string, unknown>;
}

interface StateJson {
  version: 1;
  epoch: number;
  step: number;
  optimizer?: Omit<SGDState, "momentumBuffers">;
  scaler?: GradScalerState;
  scheduler?: LRSchedulerState;
  rng?: RngState;
  extra?: Record<string, unknown>;
}

const STATE_KEY = "pinstream.state";

/**
 * The path of the training-state file that goes with a weights file.
 *
 * @param path The weights file.
 * @returns `x.state.safetensors` for `x.safetensors`, else `path + ".state.safetensors"`.
 * @example
 * ```ts
 * import { statePathFor } from "./checkpoint.ts";
 * import assert from "node:assert";
 * assert.strictEqual(statePathFor("run/cnn.safetensors"), "run/cnn.state.safetensors");
 * assert.strictEqual(statePathFor("ckpt"), "ckpt.state.safetensors");
 * ```
 */
export function statePathFor(path: string): string {
  return path.endsWith(".safetensors")
    ? path.slice(0, -".safetensors".length) + ".state.safetensors"
    : path + ".state.safetensors";
}

async function writeAtomic(path: string, bytes: Uint8Array): Promise<void> {
  const tmp = `${path}.tmp-${Deno.pid}`;
  await Deno.writeFile(tmp, bytes);
  await Deno.rename(tmp, path);
}

/**
 * Saves the model's weights (safetensors) and the training state next to them.
 *
 * @param path The weights file (e.g. `cnn.safetensors`).
 * @param parts Model, optimizer, scaler, scheduler, generator.
 * @param progress Epoch, step and extra JSON.
 * @returns When both files are written.
 * @example
 * ```ts
 * import { Device } from "../ffi/device.ts";
 * import { Linear, loadCheckpoint, saveCheckpoint } from "./mod.ts";
 * import assert from "node:assert";
 * using device = Device.open("cpu");
 * const dir = await Deno.makeTempDir();
 * using a = new Linear(3, 2).to(device);
 * await saveCheckpoint(`${dir}/m.safetensors`, { model: a }, { epoch: 2, step: 10 });
 * using b = new Linear(3, 2).to(device);
 * const p = await loadCheckpoint(`${dir}/m.safetensors`, { model: b });
 * assert.strictEqual(p.epoch, 2);
 * assert.deepStrictEqual(await b.weight.read(), await a.weight.read());
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function saveCheckpoint(
  path: string,
  parts: CheckpointParts,
  progress: CheckpointProgress = { epoch: 0, step: 0 },
): Promise<void> {
  const weights = await parts.model.stateDict();
  const state: StateJson = { version: 1, epoch: progress.epoch, step: progress.step };
  const tensors = new Map<string, HostTensor>();
  if (parts.optimizer) {
    const { momentumBuffers, ...rest } = await parts.optimizer.stateDict();
    state.optimizer = rest;
    const names = parts.model.namedParameters().map(([n]) => n);
    const byParam = new Map(parts.model.parameters().map((p, i) => [p, names[i]]));
    momentumBuffers.forEach((b, i) => {
      const p = parts.optimizer!.params[i];
      const name = byParam.get(p) ?? `param${i}`;
      tensors.set(`optimizer.momentum_buffer.${name}`, {
        dtype: "F32",
        shape: [...p.shape],
        data: b,
      });
    });
  }
  if (parts.scaler) state.scaler = await parts.scaler.stateDict();
  if (parts.scheduler) state.scheduler = parts.scheduler.stateDict();
  if (parts.rng) state.rng = parts.rng.getState();
  if (progress.extra) state.extra = progress.extra;
  await writeAtomic(
    path,
    encodeSafetensors(weights, { format: "pt", epoch: String(progress.epoch) }),
  );
  await writeAtomic(
    statePathFor(path),
    encodeSafetensors(tensors, { [STATE_KEY]: JSON.stringify(state) }),
  );
}

/**
 * Loads a checkpoint written by {@linkcode saveCheckpoint} into the given objects. The model
 * is required; the optimizer, scaler, scheduler and generator are restored when given (and
 * the state file is then required). A weights file alone (e.g. exported from PyTorch) loads
 * into the model when only the model is given.
 *
 * @param path The weights file.
 * @param parts The objects to restore into (built as for the saved run).
 * @returns The saved epoch, step and extra data (zeros when there is no state file).
 * @throws {RangeError} When a file is malformed or does not match the objects.
 * @throws {Deno.errors.NotFound} When a needed file is missing.
 * @example
 * ```ts
 * import { loadCheckpoint } from "./checkpoint.ts";
 * import { Linear } from "./mod.ts";
 * import assert from "node:assert";
 * await assert.rejects(loadCheckpoint("/nonexistent.safetensors", { model: new Linear(1, 1) }));
 * ```
 */
export async function loadCheckpoint(
  path: string,
  parts: CheckpointParts,
): Promise<CheckpointProgress> {
  const w = decodeSafetensors(await Deno.readFile(path), path);
  parts.model.loadStateDict(w.tensors);
  const needState = !!(parts.optimizer || parts.scaler || parts.scheduler || parts.rng);
  const sp = statePathFor(path);
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(sp);
  } catch (e) {
    if (!needState && e instanceof Deno.errors.NotFound) return { epoch: 0, step: 0 };
    throw e;
  }
  const s = decodeSafetensors(bytes, sp);
  const raw = s.metadata[STATE_KEY];
  if (!raw) throw new RangeError(`Cannot load ${sp}: no "${STATE_KEY}" metadata`);
  const state = JSON.parse(raw) as StateJson;
  if (parts.optimizer) {
    if (!state.optimizer) throw new RangeError(`Cannot load ${sp}: it has no optimizer state`);
    const names = new Map(parts.model.namedParameters().map(([n, p]) => [p, n]));
    const momentumBuffers: Float32Array[] = [];
    parts.optimizer.params.forEach((p, i) => {
      const t = s.tensors.get(`optimizer.momentum_buffer.${names.get(p) ?? `param${i}`}`);
      if (t) momentumBuffers.push(t.data as Float32Array);
    });
    if (momentumBuffers.length !== 0 && momentumBuffers.length !== parts.optimizer.params.length) {
      throw new RangeError(
        `Cannot load ${sp}: ${momentumBuffers.length} momentum buffers for ` +
          `${parts.optimizer.params.length} parameters`,
      );
    }
    parts.optimizer.loadStateDict({ ...state.optimizer, momentumBuffers });
  }
  if (parts.scaler && state.scaler) parts.scaler.loadStateDict(state.scaler);
  if (parts.scheduler) {
    if (!state.scheduler) throw new RangeError(`Cannot load ${sp}: it has no scheduler state`);
    parts.scheduler.loadStateDict(state.scheduler);
  }
  if (parts.rng && state.rng) parts.rng.setState(state.rng);
  return { epoch: state.epoch, step: state.step, extra: state.extra };
}
