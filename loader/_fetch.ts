// Per-sample fetching on the generic path: `get(i)` for each index of a batch, each sample
// with its own SampleContext. One function for the main thread (numWorkers 0) and the
// workers, so a sample sees the same context, the same random stream and the same error
// wording wherever it is loaded.

import { CounterRandom, STREAM_SAMPLE } from "../internal/random.ts";
import { type Dataset, type SampleContext, SKIP_SAMPLE } from "./dataset.ts";

/** Where a batch's samples are loaded: the loader's seed, the epoch, the draw positions. */
export interface FetchAt {
  seed: number;
  epoch: number;
  /** Draw position of the batch's first sample (EpochOrder.drawPosition). */
  position: number;
  /** Step between the batch's samples' draw positions (EpochOrder.drawStride). */
  stride: number;
  /** Worker id, or -1 on the main thread. */
  workerId: number;
}

/**
 * The main thread's `timeout` on a batch (workers are stopped from outside instead): `wait`
 * bounds a promise from get(), `check` runs after each sample. What either throws passes
 * through fetchSamples unchanged.
 */
export interface FetchDeadline {
  wait<T>(p: Promise<T>): Promise<T>;
  check(): void;
}

/**
 * The synchronous dataset call running on this thread: set before a get(), a collate or a
 * gather, cleared when it returns or throws. An event handler finds it set only when V8
 * ended the call from outside (which runs no catch or finally), as it does to a worker at its
 * heap limit; a worker's ping handler reports that.
 */
export const syncCall = { active: false, seq: -1, index: -1, call: "" };

/** A sample's get() threw or rejected: its dataset index and the value thrown, as thrown. */
export class SampleFailure {
  readonly index: number;
  readonly thrown: unknown;
  constructor(index: number, thrown: unknown) {
    this.index = index;
    this.thrown = thrown;
  }
}

/**
 * The sample at draw `position` of `epoch`: its random stream is a pure function of (seed,
 * epoch, position), so it does not depend on which worker, or which rank, loads it; its
 * `u32()` draws are the ones its augment record takes (augment/record.ts).
 */
export function sampleContext(
  seed: number,
  epoch: number,
  position: number,
  workerId: number,
): SampleContext {
  const rng = new CounterRandom(seed, epoch, STREAM_SAMPLE, position);
  return {
    epoch,
    position,
    workerId,
    random: () => rng.random(),
    int: (n: number) => rng.int(n),
    u32: () => rng.nextU32(),
  };
}

/**
 * Loads `indices` with `dataset.get`, one after another (a promise is awaited before the next
 * sample starts). A sample the dataset skips ({@linkcode SKIP_SAMPLE}) is left out.
 *
 * @throws {SampleFailure} When a get() throws or rejects.
 */
export async function fetchSamples(
  dataset: Dataset,
  indices: Int32Array,
  at: FetchAt,
  deadline?: FetchDeadline,
): Promise<unknown[]> {
  const samples: unknown[] = [];
  for (let k = 0; k < indices.length; k++) {
    const index = indices[k];
    let s: unknown;
    syncCall.active = true;
    syncCall.index = index;
    syncCall.call = "get";
    try {
      s = dataset.get(
        index,
        sampleContext(at.seed, at.epoch, at.position + k * at.stride, at.workerId),
      );
    } catch (e) {
      syncCall.active = false;
      throw new SampleFailure(index, e);
    }
    syncCall.active = false;
    if (s instanceof Promise) {
      const settled = s.catch((e) => {
        throw new SampleFailure(index, e);
      });
      s = await (deadline ? deadline.wait(settled) : settled);
    }
    // A synchronous get() cannot be interrupted on the main thread; one that returned after
    // the deadline still fails the batch, as with workers.
    deadline?.check();
    if (s !== SKIP_SAMPLE) samples.push(s);
  }
  if (samples.length === 0 && indices.length > 0) {
    throw new SampleFailure(
      indices[0],
      new Error(
        `Cannot load a batch: the dataset skipped all of its ${indices.length} samples ` +
          `(indices ${Array.from(indices.subarray(0, 8)).join(", ")}${
            indices.length > 8 ? ", ..." : ""
          })`,
      ),
    );
  }
  return samples;
}
