/**
 * Datasets and collates for the any-batch prefetcher's tests (tests/batch_prefetcher_test.ts,
 * tests/_stream_order_child.ts): a module workers can import, so the datasets rebuild there
 * and the collates run there.
 *
 * @module
 */

import type { WorkerSpec } from "../loader/dataset.ts";
import { defaultCollate } from "../loader/collate.ts";

/** Samples per audio clip and mask length of {@linkcode AudioDataset}. */
export const FRAMES = 1600, MASK = 40;

/** One sample of {@linkcode AudioDataset}. */
export interface AudioSample {
  audio: Float32Array;
  label: Int32Array;
  mask: Uint8Array;
}

/** Audio frames, a label and a mask per sample, a pure function of (index, seed). */
export class AudioDataset {
  readonly length: number;
  readonly seed: number;
  constructor(length: number, seed = 1) {
    this.length = length;
    this.seed = seed;
  }
  static fromState(s: { length: number; seed: number }): AudioDataset {
    return new AudioDataset(s.length, s.seed);
  }
  get(i: number): AudioSample {
    const audio = new Float32Array(FRAMES);
    for (let k = 0; k < FRAMES; k++) audio[k] = Math.sin((i + 1) * 0.01 * k + this.seed) * (i + 1);
    const mask = new Uint8Array(MASK);
    for (let k = 0; k < MASK; k++) mask[k] = (i * 7 + k * 3 + this.seed) % 251;
    return { audio, label: new Int32Array([(i * 13 + this.seed) % 10]), mask };
  }
  workerSpec(): WorkerSpec {
    return {
      module: import.meta.url,
      export: "AudioDataset.fromState",
      state: { length: this.length, seed: this.seed },
    };
  }
}

/** PyTorch's default collate, as a module function (it then runs in the workers). */
export function audioCollate(samples: AudioSample[]): unknown {
  return defaultCollate(samples);
}

/** Token ids [3, 4] per sample, their mask, a float target and a name. */
export class TokenDataset {
  readonly length: number;
  constructor(length: number) {
    this.length = length;
  }
  static fromState(s: { length: number }): TokenDataset {
    return new TokenDataset(s.length);
  }
  get(i: number): { ids: Int32Array; mask: Uint8Array; target: Float16Array; name: string } {
    const ids = new Int32Array(12).map((_, k) => i * 1000 + k * 37 - 5);
    const mask = new Uint8Array(12).map((_, k) => (k + i) % 3 === 0 ? 0 : 1);
    return { ids, mask, target: new Float16Array([i / 8]), name: `sample${i}` };
  }
  workerSpec(): WorkerSpec {
    return {
      module: import.meta.url,
      export: "TokenDataset.fromState",
      state: { length: this.length },
    };
  }
}

/**
 * Nests the samples as a text model takes them: `{ inputs: { ids, mask }, target, names }`,
 * the ids with their shape `[n, 3, 4]` given by `{ data, shape }`.
 */
export function tokenCollate(
  samples: { ids: Int32Array; mask: Uint8Array; target: Float16Array; name: string }[],
): unknown {
  const b = defaultCollate(samples);
  return {
    inputs: { ids: { data: b.ids, shape: [samples.length, 3, 4] }, mask: b.mask },
    target: b.target,
    names: b.name,
  };
}
