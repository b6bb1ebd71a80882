// numWorkers / prefetchFactor "auto": the counts a DataLoader loads with, fixed or tuned
// between epochs from the consumer's measured throughput (like tf.data's AUTOTUNE).

/** What the tuner reads of a finished epoch (a subset of the loader's EpochStats). */
export interface TrialStats {
  /** Samples yielded. */
  samples: number;
  /** Seconds from the first request to the last batch. */
  seconds: number;
  /** Seconds the consumer waited for the epoch's first batch. */
  firstBatchSeconds: number;
  /** Workers that loaded the epoch. */
  numWorkers: number;
  /** Batches in flight per worker (0 without workers). */
  prefetchFactor: number;
}

/** The most batches in flight per worker that prefetchFactor "auto" tries. */
export const MAX_AUTO_PREFETCH = 8;

/**
 * The shortest trial "auto" judges by: a trial whose epochs are shorter runs more epochs with
 * the same counts until they add up to this (20 ms epochs of small samples measured up to
 * 20% apart from one epoch to the next; a quarter second of them settles to a few percent;
 * `deno run -A bench/loader.ts` records every epoch's rate of each row).
 */
export const MIN_TRIAL_SECONDS = 0.25;

/**
 * numWorkers / prefetchFactor "auto": a coordinate search on the consumer's samples per
 * second, one trial per finished epoch. The first epoch warms up (workers start, caches fill)
 * and is not counted; then each worker count from the start outwards runs an epoch at a
 * prefetch of 2, then deeper prefetches (4, 8) run at the fastest count, and, when that count
 * is 0 (nothing in flight to deepen), at the fastest count with workers: a deeper prefetch can
 * lift a count that lost at depth 2 past the one that won (measured in bench/loader.ts: 2
 * workers at depth 8 beat 0 workers, which beat 2 workers at depth 2). The fastest trial wins
 * and the search stops there. A trial is one epoch, or as many as make {@linkcode MIN_TRIAL_SECONDS}, judged
 * by their samples over their seconds after each epoch's first batch (a new worker set starts
 * in that wait). With a settled choice nothing changes again. The counts never change the
 * sample order.
 */
export class Tuner {
  #trials: { workers: number; prefetch: number }[] = [];
  #results: { workers: number; prefetch: number; rate: number }[] = [];
  #w: { min: number; max: number };
  #p: { min: number; max: number };
  #phase: "warmup" | "workers" | "prefetch" | "settled" = "warmup";
  /** The running trial's epochs so far: samples and seconds. */
  #acc = { samples: 0, seconds: 0 };

  constructor(w: { min: number; max: number }, p: { min: number; max: number }) {
    this.#w = w;
    this.#p = p;
  }

  /**
   * The counts of the next epoch, given the one that just finished.
   *
   * @param s The finished epoch's stats (with the counts it ran).
   * @returns The next epoch's counts.
   */
  next(s: TrialStats): { workers: number; prefetch: number } {
    const cur = { workers: s.numWorkers, prefetch: s.prefetchFactor || this.#p.min };
    if (this.#phase === "settled") return cur;
    if (this.#phase === "warmup") {
      this.#phase = "workers";
      // The start first (again, now warm), then outwards: +1, -1, +2, -2, ...
      const out: number[] = [cur.workers];
      for (let d = 1; d <= this.#w.max - this.#w.min; d++) {
        if (cur.workers + d <= this.#w.max) out.push(cur.workers + d);
        if (cur.workers - d >= this.#w.min) out.push(cur.workers - d);
      }
      const prefetch = Math.max(this.#p.min, Math.min(2, this.#p.max));
      this.#trials = out.map((workers) => ({ workers, prefetch }));
    } else {
      // Steady-state rate: the wait for the first batch is left out, since it holds the start
      // of a new worker set whenever a trial changes the count (tens of ms, which in short
      // epochs made every trial with workers lose to 0 workers).
      this.#acc.samples += s.samples;
      this.#acc.seconds += Math.max(0, s.seconds - s.firstBatchSeconds);
      // A short trial runs another epoch with the same counts.
      if (this.#acc.seconds < MIN_TRIAL_SECONDS) return cur;
      this.#results.push({ ...cur, rate: this.#acc.samples / this.#acc.seconds });
      this.#acc = { samples: 0, seconds: 0 };
    }
    if (this.#trials.length === 0 && this.#phase === "workers") {
      this.#phase = "prefetch";
      // Deeper at the fastest count; with no workers (nothing in flight) at the fastest count
      // that has some.
      const withWorkers = this.#results.filter((r) => r.workers > 0);
      const at = this.#best().workers > 0
        ? this.#best()
        : withWorkers.length > 0
        ? withWorkers.reduce((a, b) => (b.rate > a.rate ? b : a))
        : undefined;
      this.#trials = at === undefined ? [] : [4, 8]
        .filter((p) => p > at.prefetch && p >= this.#p.min && p <= this.#p.max)
        .map((prefetch) => ({ workers: at.workers, prefetch }));
    }
    const trial = this.#trials.shift();
    if (trial !== undefined) return trial;
    this.#phase = "settled";
    const best = this.#best();
    return { workers: best.workers, prefetch: best.prefetch };
  }

  #best(): { workers: number; prefetch: number; rate: number } {
    return this.#results.reduce((a, b) => (b.rate > a.rate ? b : a));
  }
}

/**
 * A loader's worker and prefetch counts: fixed, or, for "auto", started low and moved by a
 * {@linkcode Tuner} after each finished epoch. The staging ring is sized for the most either
 * may reach (`maxWorkers`, `maxPrefetch`).
 */
export class WorkerCounts {
  /** The most workers the counts may reach (what the ring is sized for). */
  readonly maxWorkers: number;
  /** The most batches in flight per worker the counts may reach. */
  readonly maxPrefetch: number;
  #workers: number;
  #prefetch: number;
  readonly #tuner: Tuner | undefined;

  /**
   * @param workers The workers, or "auto": between 0 (1 with persistent workers) and `cores`.
   * @param prefetch Batches in flight per worker, or "auto": between 2 and MAX_AUTO_PREFETCH.
   * @param cores The most workers "auto" may choose.
   * @param persistent Whether workers persist across epochs (then "auto" keeps at least one).
   */
  constructor(
    workers: number | "auto",
    prefetch: number | "auto",
    cores: number,
    persistent: boolean,
  ) {
    this.maxWorkers = workers === "auto" ? cores : workers;
    this.maxPrefetch = prefetch === "auto" ? MAX_AUTO_PREFETCH : prefetch;
    this.#workers = this.maxWorkers;
    this.#prefetch = this.maxPrefetch;
    if (workers === "auto" || prefetch === "auto") {
      const min = persistent ? 1 : 0;
      this.#tuner = new Tuner(
        workers === "auto" ? { min, max: cores } : { min: workers, max: workers },
        prefetch === "auto" ? { min: 2, max: MAX_AUTO_PREFETCH } : { min: prefetch, max: prefetch },
      );
      // Start low and let the tuner climb.
      if (workers === "auto") this.#workers = Math.max(min, Math.min(2, cores));
      if (prefetch === "auto") this.#prefetch = 2;
    }
  }

  /** Workers of the next epoch. */
  get workers(): number {
    return this.#workers;
  }

  /** Batches in flight per worker of the next epoch (0 without workers). */
  get prefetch(): number {
    return this.#workers === 0 ? 0 : this.#prefetch;
  }

  /** Whether the counts are tuned between epochs. */
  get tuned(): boolean {
    return this.#tuner !== undefined;
  }

  /**
   * Takes the tuner's counts for the epoch after a finished one.
   *
   * @param stats The finished epoch's stats.
   * @returns Whether the counts changed (the next epoch needs a new engine).
   */
  next(stats: TrialStats): boolean {
    if (this.#tuner === undefined) return false;
    const next = this.#tuner.next(stats);
    if (next.workers === this.#workers && next.prefetch === this.#prefetch) return false;
    this.#workers = next.workers;
    this.#prefetch = next.prefetch;
    return true;
  }
}
