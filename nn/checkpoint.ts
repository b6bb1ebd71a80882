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
 * everything the next step depends on.
 *
 * The two files are one unit. The state file records the SHA-256 of the weights file it was
 * saved with, and {@linkcode loadCheckpoint} refuses a pair that does not match, naming both
 * files: two renames cannot be atomic together, and without the binding a save killed between
 * them (or files copied from two runs) would resume with weights from one epoch and optimizer
 * state from another. A save writes both files completely (and syncs them) under `.tmp` names
 * beside the targets, then renames the weights and then the state. Killed before the first
 * rename, the old checkpoint is intact; killed between the renames, the complete new state
 * file is still at its `.tmp` name and binds the new weights by hash, so the load takes it and
 * resumes from the new checkpoint. Before it overwrites the temporary state name, a save first
 * finishes such an interrupted commit (renames the pending state into place), so any sequence
 * of interrupted saves leaves the last complete checkpoint loadable. A save that fails removes
 * its temporary files. One process saves to a path at a time.
 *
 * @module
 */

import type { Module } from "./module.ts";
import type { SGD, SGDState } from "./optim.ts";
import type { GradScaler, GradScalerState } from "./grad_scaler.ts";
import type { LRScheduler, LRSchedulerState } from "./lr_scheduler.ts";
import { type RngState, Xoshiro128 } from "./init.ts";
import { dirname } from "node:path";
import { decodeSafetensors, encodeSafetensors, type HostTensor } from "./safetensors.ts";
import { refuseUnknownKeys } from "../internal/options.ts";

const PARTS = ["model", "optimizer", "scaler", "scheduler", "rng"] as const;
const PROGRESS = ["epoch", "step", "extra"] as const;

/**
 * Refuses misspelt parts (a typo would silently save or restore nothing of that part). Keys
 * holding functions are let through: a run object with its own methods (`step`, `dispose`) is
 * a natural thing to pass, and no part is a function.
 */
function checkParts(parts: CheckpointParts, action: string): void {
  const data = Object.fromEntries(
    Object.entries(parts ?? {}).filter(([, v]) => typeof v !== "function"),
  );
  refuseUnknownKeys(data, PARTS, action);
  if (!parts.model) throw new TypeError(`Cannot ${action}: parts.model is required`);
}

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
  version: 2;
  /** The weights file this state belongs to: its name when saved and its bytes' SHA-256. */
  weights: { file: string; sha256: string };
  epoch: number;
  step: number;
  optimizer?: Omit<SGDState, "momentumBuffers">;
  scaler?: GradScalerState;
  scheduler?: LRSchedulerState;
  rng?: RngState;
  extra?: Record<string, unknown>;
}

const STATE_KEY = "pinstream.state";
const MOMENTUM_PREFIX = "optimizer.momentum_buffer.";

/**
 * The path of the training-state file that goes with a weights file.
 *
 * @param path The weights file.
 * @returns `x.state.safetensors` for `x.safetensors`, else `path + ".state.safetensors"`.
 * @example
 * ```ts
 * import { statePathFor } from "@pinstream/pinstream";
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

/** The temporary name a file is written under before it is renamed into place. */
function tmpFor(path: string): string {
  return `${path}.tmp`;
}

async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Refuses a target whose directory is missing or that is a directory, before any write. */
async function checkTarget(path: string, what: string): Promise<void> {
  const dir = dirname(path);
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(dir);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) {
      throw new Deno.errors.NotFound(
        `Cannot save the checkpoint's ${what} ${path}: the directory ${dir} does not exist`,
      );
    }
    throw e;
  }
  if (!info.isDirectory) {
    throw new Deno.errors.NotADirectory(
      `Cannot save the checkpoint's ${what} ${path}: ${dir} is not a directory`,
    );
  }
  try {
    if ((await Deno.lstat(path)).isDirectory) {
      throw new Deno.errors.IsADirectory(
        `Cannot save the checkpoint's ${what} ${path}: a directory of that name exists`,
      );
    }
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
}

/** Writes `bytes` and syncs them, so a rename after it never exposes a short file. */
async function writeSynced(path: string, bytes: Uint8Array): Promise<void> {
  using f = await Deno.open(path, { write: true, create: true, truncate: true });
  for (let at = 0; at < bytes.length;) at += await f.write(bytes.subarray(at));
  await f.sync();
}

async function removeIfPresent(path: string): Promise<void> {
  try {
    await Deno.remove(path);
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
}

/**
 * Saves the model's weights (safetensors) and the training state next to them, as one unit:
 * the state file records the weights file's SHA-256, and {@linkcode loadCheckpoint} refuses a
 * pair that does not match. An interrupted save leaves the previous checkpoint or the new one;
 * a failed save removes its temporary files.
 *
 * @param path The weights file (e.g. `cnn.safetensors`); the state goes to
 *   {@linkcode statePathFor}`(path)`.
 * @param parts Model, optimizer, scaler, scheduler, generator.
 * @param progress Epoch, step and extra JSON.
 * @returns When both files are written.
 * @throws {TypeError} When `parts` or `progress` has an unknown key (a misspelt part would
 *   silently go unsaved), or epoch/step is not a non-negative integer.
 * @throws {Deno.errors.NotFound} When the directory does not exist.
 * @throws {Deno.errors.IsADirectory} When the weights or state path is a directory.
 * @example
 * ```ts
 * import { Device } from "@pinstream/pinstream";
 * import { Linear, loadCheckpoint, saveCheckpoint } from "@pinstream/pinstream";
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
  checkParts(parts, "save the checkpoint");
  refuseUnknownKeys(progress, PROGRESS, "save the checkpoint");
  for (const k of ["epoch", "step"] as const) {
    if (!Number.isSafeInteger(progress[k]) || progress[k] < 0) {
      throw new TypeError(
        `Cannot save the checkpoint: progress.${k} must be a non-negative integer, got ${
          progress[k]
        }`,
      );
    }
  }
  const sp = statePathFor(path);
  const weightsBytes = encodeSafetensors(await parts.model.stateDict(), {
    format: "pt",
    epoch: String(progress.epoch),
  });
  const state: StateJson = {
    version: 2,
    weights: { file: path.split(/[\\/]/).pop()!, sha256: await sha256Hex(weightsBytes) },
    epoch: progress.epoch,
    step: progress.step,
  };
  const tensors = new Map<string, HostTensor>();
  if (parts.optimizer) {
    const { momentumBuffers, ...rest } = await parts.optimizer.stateDict();
    state.optimizer = rest;
    const byParam = new Map(parts.model.namedParameters().map(([n, p]) => [p, n]));
    momentumBuffers.forEach((b, i) => {
      const p = parts.optimizer!.params[i];
      tensors.set(`${MOMENTUM_PREFIX}${byParam.get(p) ?? `param${i}`}`, {
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
  const stateBytes = encodeSafetensors(tensors, { [STATE_KEY]: JSON.stringify(state) });
  await checkTarget(path, "weights");
  await checkTarget(sp, "training state");
  const [wTmp, sTmp] = [tmpFor(path), tmpFor(sp)];
  // The temporary state name is about to be overwritten; if it holds the state of the weights
  // now in place (an earlier save killed between its renames), that pair is the last complete
  // checkpoint, so its commit is finished first.
  await settlePendingState(path, sp);
  try {
    await writeSynced(wTmp, weightsBytes);
    await writeSynced(sTmp, stateBytes);
    await Deno.rename(wTmp, path);
    // The commit point: from here the new weights are in place and the state that binds them
    // is complete at sTmp, where loadCheckpoint looks for it if the next rename never happens.
    await Deno.rename(sTmp, sp);
  } catch (e) {
    await removeIfPresent(wTmp);
    await removeIfPresent(sTmp);
    throw e;
  }
}

/**
 * Finishes the commit of a save that was killed between its two renames: when the state file
 * at its temporary name binds the weights at `path` and the state file in place does not, the
 * temporary one is renamed into place. Anything else (no weights, a partial or foreign
 * temporary file) is left alone.
 */
async function settlePendingState(path: string, sp: string): Promise<void> {
  const pending = await readState(tmpFor(sp)).catch(() => null);
  if (!pending) return;
  let digest: string;
  try {
    digest = await sha256Hex(await Deno.readFile(path));
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return;
    throw e;
  }
  if (pending.state.weights.sha256 !== digest) return;
  const current = await readState(sp).catch(() => null);
  if (current?.state.weights.sha256 === digest) return;
  await Deno.rename(tmpFor(sp), sp);
}

/** A decoded, structurally valid state file. */
interface LoadedState {
  file: string;
  state: StateJson;
  tensors: Map<string, HostTensor>;
}

async function readState(file: string): Promise<LoadedState | null> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(file);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return null;
    throw e;
  }
  const s = decodeSafetensors(bytes, file);
  const raw = s.metadata[STATE_KEY];
  if (raw === undefined) throw new RangeError(`Cannot load ${file}: no "${STATE_KEY}" metadata`);
  let state: StateJson;
  try {
    state = JSON.parse(raw);
  } catch (e) {
    throw new RangeError(`Cannot load ${file}: the "${STATE_KEY}" metadata is not JSON (${e})`);
  }
  checkStateJson(state, file);
  return { file, state, tensors: s.tensors };
}

function bad(file: string, what: string, value: unknown): RangeError {
  return new RangeError(
    `Cannot load ${file}: ${what} is ${JSON.stringify(value) ?? String(value)}`,
  );
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/**
 * Checks every field the objects will be given, so that restoring them cannot fail halfway
 * (the objects' own loadStateDict checks the same things, but only after the model was written).
 */
function checkStateJson(state: StateJson, file: string): void {
  if (!isObject(state)) throw bad(file, "the training state", state);
  if (state.version !== 2) {
    throw new RangeError(
      `Cannot load ${file}: training-state format ${JSON.stringify(state.version)} is not 2 ` +
        `(format 1 did not record which weights file it belongs to; save the checkpoint again)`,
    );
  }
  if (!isObject(state.weights) || typeof state.weights.sha256 !== "string") {
    throw bad(file, "weights", state.weights);
  }
  for (const k of ["epoch", "step"] as const) {
    if (!Number.isSafeInteger(state[k]) || state[k] < 0) throw bad(file, k, state[k]);
  }
  if (state.extra !== undefined && !isObject(state.extra)) throw bad(file, "extra", state.extra);
  const o = state.optimizer;
  if (o !== undefined) {
    if (!isObject(o) || !isObject(o.hyper)) throw bad(file, "optimizer", o);
    for (const k of ["lr", "momentum", "dampening", "weightDecay"] as const) {
      const v = o.hyper[k];
      if (typeof v !== "number" || !Number.isFinite(v) || (k !== "dampening" && v < 0)) {
        throw bad(file, `optimizer.hyper.${k}`, v);
      }
    }
    if (typeof o.hyper.nesterov !== "boolean") {
      throw bad(file, "optimizer.hyper.nesterov", o.hyper.nesterov);
    }
    if (!Number.isInteger(o.stepsDone) || o.stepsDone < 0 || o.stepsDone > 0x7fffffff) {
      throw bad(file, "optimizer.stepsDone", o.stepsDone);
    }
  }
  const sc = state.scaler;
  if (sc !== undefined) {
    if (!isObject(sc)) throw bad(file, "scaler", sc);
    if (typeof sc.scale !== "number" || !(sc.scale > 0 && Number.isFinite(sc.scale))) {
      throw bad(file, "scaler.scale", sc.scale);
    }
    if (!Number.isInteger(sc._growth_tracker) || sc._growth_tracker < 0) {
      throw bad(file, "scaler._growth_tracker", sc._growth_tracker);
    }
  }
  const sh = state.scheduler;
  if (sh !== undefined) {
    if (!isObject(sh)) throw bad(file, "scheduler", sh);
    for (const k of ["lastEpoch", "stepCount", "baseLr", "lastLr"] as const) {
      if (typeof sh[k] !== "number") throw bad(file, `scheduler.${k}`, sh[k]);
    }
    if (sh.lastMomentum !== undefined && typeof sh.lastMomentum !== "number") {
      throw bad(file, "scheduler.lastMomentum", sh.lastMomentum);
    }
  }
  if (state.rng !== undefined) {
    try {
      new Xoshiro128(1).setState(state.rng);
    } catch {
      throw bad(file, "rng", state.rng);
    }
  }
}

/** The optimizer's momentum buffers from the state file, checked against its parameters. */
function momentumBuffersFor(parts: CheckpointParts, loaded: LoadedState): Float32Array[] {
  const optimizer = parts.optimizer!;
  const names = new Map(parts.model.namedParameters().map(([n, p]) => [p, n]));
  const found: Float32Array[] = [];
  const missing: string[] = [];
  const used = new Set<string>();
  optimizer.params.forEach((p, i) => {
    const key = `${MOMENTUM_PREFIX}${names.get(p) ?? `param${i}`}`;
    const t = loaded.tensors.get(key);
    if (!t) return void missing.push(key);
    if (t.dtype !== "F32" || t.shape.join() !== p.shape.join()) {
      throw new RangeError(
        `Cannot load "${key}" from ${loaded.file}: ${t.dtype} [${t.shape}] does not match the ` +
          `parameter's F32 [${p.shape}]`,
      );
    }
    used.add(key);
    found.push(t.data as Float32Array);
  });
  const unexpected = [...loaded.tensors.keys()].filter((k) => !used.has(k));
  // No buffers at all is a momentum-free optimizer; some but not all is a different model.
  if ((found.length !== 0 && missing.length !== 0) || unexpected.length !== 0) {
    throw new RangeError(
      `Cannot load the optimizer state from ${loaded.file}: missing tensors ` +
        `[${found.length ? missing.join(", ") : ""}], unexpected tensors [${
          unexpected.join(", ")
        }]`,
    );
  }
  return found;
}

/**
 * Loads a checkpoint written by {@linkcode saveCheckpoint} into the given objects. The model
 * is required; the optimizer, scaler, scheduler and generator are restored when given (and
 * the state file is then required). A weights file alone (e.g. exported from PyTorch) loads
 * into the model when only the model is given.
 *
 * Everything is read and checked before anything is changed: a checkpoint that is refused
 * leaves every object as it was. A state file that belongs to other weights than the file at
 * `path` (a save interrupted between its two renames, files from two runs) is refused, naming
 * both files, unless the interrupted save's complete state file still binds these weights.
 *
 * @param path The weights file.
 * @param parts The objects to restore into (built as for the saved run).
 * @returns The saved epoch, step and extra data (zeros when there is no state file).
 * @throws {TypeError} When `parts` has an unknown key (a misspelt part would silently stay
 *   unrestored).
 * @throws {RangeError} When a file is malformed, the two files do not belong together, or a
 *   file does not match the objects; the message names the file and the tensor or field.
 * @throws {Deno.errors.NotFound} When a needed file is missing.
 * @example
 * ```ts
 * import { loadCheckpoint } from "@pinstream/pinstream";
 * import { Linear } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * await assert.rejects(loadCheckpoint("/nonexistent.safetensors", { model: new Linear(1, 1) }));
 * ```
 */
export async function loadCheckpoint(
  path: string,
  parts: CheckpointParts,
): Promise<CheckpointProgress> {
  checkParts(parts, "load the checkpoint");
  const weightsBytes = await Deno.readFile(path);
  const w = decodeSafetensors(weightsBytes, path);
  const digest = await sha256Hex(weightsBytes);
  const sp = statePathFor(path);
  let loaded = await readState(sp);
  if (loaded?.state.weights.sha256 !== digest) {
    // A save killed between its renames left the complete state that binds these weights at
    // its temporary name. Anything unreadable there is a save killed earlier: not a candidate.
    const pending = await readState(tmpFor(sp)).catch(() => null);
    if (pending?.state.weights.sha256 === digest) {
      loaded = pending;
    } else if (loaded) {
      throw new RangeError(
        `Cannot load checkpoint ${path}: its training state ${sp} belongs to other weights ` +
          `(weights saved for epoch ${w.metadata.epoch ?? "?"}, state for epoch ` +
          `${loaded.state.epoch}; the SHA-256 recorded in the state does not match): a save ` +
          `was interrupted or the files come from different runs`,
      );
    }
  }
  const needState = !!(parts.optimizer || parts.scaler || parts.scheduler || parts.rng);
  if (!loaded) {
    if (needState) {
      throw new Deno.errors.NotFound(
        `Cannot load checkpoint ${path}: its training state ${sp} does not exist (needed to ` +
          `restore the optimizer, scaler, scheduler or generator)`,
      );
    }
    parts.model.loadStateDict(w.tensors, { source: path });
    return { epoch: 0, step: 0 };
  }
  const { state, file } = loaded;
  const missing = (what: string) =>
    new RangeError(`Cannot load ${file}: it has no ${what} state (it was saved without one)`);
  if (parts.optimizer && !state.optimizer) throw missing("optimizer");
  if (parts.scaler && !state.scaler) throw missing("scaler");
  if (parts.scheduler && !state.scheduler) throw missing("scheduler");
  if (parts.rng && !state.rng) throw missing("generator (rng)");
  const momentumBuffers = parts.optimizer ? momentumBuffersFor(parts, loaded) : [];
  // The model validates every tensor before writing any; everything after it was checked above.
  parts.model.loadStateDict(w.tensors, { source: path });
  parts.optimizer?.loadStateDict({ ...state.optimizer!, momentumBuffers });
  parts.scaler?.loadStateDict(state.scaler!);
  parts.scheduler?.loadStateDict(state.scheduler!);
  parts.rng?.setState(state.rng!);
  const progress: CheckpointProgress = { epoch: state.epoch, step: state.step };
  if (state.extra !== undefined) progress.extra = state.extra;
  return progress;
}
