/**
 * The fit loop's data-parallel pieces (train/fit.ts): joining the launcher's job, sharding a
 * loader's epochs over the ranks, and summing an epoch's figures over them.
 *
 * @module
 */

import type { Dataset } from "../loader/dataset.ts";
import { DistributedSampler } from "../loader/sampler.ts";
import { launchEnv } from "../dist/launch_env.ts";
import { ProcessGroup } from "../dist/process_group.ts";

/**
 * The job's process group when asked for (`--distributed`) or when a launcher started several
 * ranks: apart, they would each train alone and overwrite each other's checkpoint.
 *
 * @param distributed Whether --distributed was given.
 * @returns The group, or null for a single-process run.
 */
export function joinJob(distributed: boolean): ProcessGroup | null {
  return distributed || launchEnv().size > 1 ? ProcessGroup.init() : null;
}

/**
 * A DataLoader's order options: this rank's share of every epoch, the same shuffle on every
 * rank (the seed); without a group, the plain shuffle flag.
 *
 * @param set The data set.
 * @param group The ranks, or null.
 * @param shuffle Shuffle each epoch.
 * @param seed The shared seed.
 * @returns `{ sampler }` or `{ shuffle }`.
 */
export function shardOptions(
  set: Dataset,
  group: ProcessGroup | null,
  shuffle: boolean,
  seed: number,
): { sampler: DistributedSampler } | { shuffle: boolean } {
  if (group === null) return { shuffle };
  return {
    sampler: new DistributedSampler(set, {
      worldSize: group.size,
      rank: group.rank,
      shuffle,
      seed,
    }),
  };
}

/**
 * Sums an epoch's `[loss x samples, correct, samples]` over the ranks (a no-op alone).
 *
 * @param group The ranks, or null.
 * @param lossSum This rank's summed loss.
 * @param correct This rank's correct predictions.
 * @param seen This rank's samples.
 * @returns The sums over every rank.
 */
export function sumOverRanks(
  group: ProcessGroup | null,
  lossSum: number,
  correct: number,
  seen: number,
): { lossSum: number; correct: number; seen: number } {
  if (group === null) return { lossSum, correct, seen };
  // f32 holds these exactly enough: counts below 2^24, losses summed over at most an epoch.
  const t = new Float32Array([lossSum, correct, seen]);
  group.allReduce(t);
  return { lossSum: t[0], correct: t[1], seen: t[2] };
}
