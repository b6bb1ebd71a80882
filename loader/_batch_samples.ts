/**
 * The number of samples in each batch a DataLoader yields on its generic path. A collated
 * typed array is flat (`[B, ...shape]` in one dimension), so a consumer that needs the batch
 * dimension back (the device prefetcher of any batch) asks here; the loader notes it when it
 * yields the batch. Weak keys: a batch dropped by the consumer takes its entry with it.
 *
 * @module
 */

const SAMPLES = new WeakMap<object, number>();

/** Notes that `batch` holds `samples` samples (objects only; primitives carry no leaves). */
export function noteBatchSamples(batch: unknown, samples: number): void {
  if ((typeof batch === "object" && batch !== null) || typeof batch === "function") {
    SAMPLES.set(batch as object, samples);
  }
}

/** The samples `batch` holds, when a DataLoader yielded it; undefined otherwise. */
export function batchSamples(batch: unknown): number | undefined {
  if ((typeof batch === "object" && batch !== null) || typeof batch === "function") {
    return SAMPLES.get(batch as object);
  }
  return undefined;
}
