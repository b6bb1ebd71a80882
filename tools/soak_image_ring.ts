/**
 * A soak of image decoding into the ring at real sizes: RandomResizedCrop(224) of a folder of
 * photographs (e.g. bench/imagefolder.ts's generated ones), epoch after epoch, at 0, 3 and 2
 * workers with the same seed; every sample's bytes must be the same at every worker count.
 * Workers write neighbouring samples of a slot at once, so a write past a sample's end, or a
 * race on the decoders' memory, shows as a mismatch.
 *
 *     deno run -A tools/soak_image_ring.ts DIR [EPOCHS=4] [SAMPLES=800]
 *
 * Exits 1 on any mismatch.
 *
 * @module
 */

import { ImageFolder } from "../loader/datasets/image_folder.ts";
import { DataLoader } from "../loader/data_loader.ts";
import type { RingBatch } from "../loader/ring.ts";

const [root, epochsArg = "4", samplesArg = "800"] = Deno.args;
if (root === undefined) {
  console.error("usage: deno run -A tools/soak_image_ring.ts DIR [EPOCHS=4] [SAMPLES=800]");
  Deno.exit(2);
}
const epochs = Number(epochsArg), samples = Number(samplesArg);
const SIZE = 224, PER = SIZE * SIZE * 3;
const ds = new ImageFolder(root, { randomResizedCrop: { size: SIZE }, verbose: false });

function digest(b: Uint8Array): string {
  let h = 0x811c9dc5;
  for (const v of b) h = Math.imul(h ^ v, 0x01000193);
  return (h >>> 0).toString(16);
}

/** The digests of the first `samples` samples of `epoch` at `numWorkers` workers. */
async function run(numWorkers: number, epoch: number): Promise<string[]> {
  const out: string[] = [];
  await using loader = new DataLoader(ds, {
    batchSize: 32,
    numWorkers,
    seed: 7,
    shuffle: true,
    ...(numWorkers > 0 ? { prefetchFactor: 3 } : {}),
  });
  loader.setEpoch(epoch);
  for await (const b of loader) {
    const batch = b as unknown as RingBatch;
    const image = batch.fields.image as Uint8Array;
    for (let k = 0; k < batch.size; k++) out.push(digest(image.subarray(k * PER, (k + 1) * PER)));
    if (out.length >= samples) break; // leaving early, as a training loop may
  }
  return out;
}

let bad = 0, total = 0;
for (let e = 0; e < epochs; e++) {
  const [zero, three, two] = [await run(0, e), await run(3, e), await run(2, e)];
  for (let i = 0; i < zero.length; i++) {
    total++;
    if (zero[i] !== three[i] || zero[i] !== two[i]) bad++;
  }
  console.log(`epoch ${e}: ${zero.length} samples, ${bad} mismatches so far`);
}
console.log(`${total} samples compared at 0, 3 and 2 workers: ${bad} mismatches`);
if (bad > 0) Deno.exit(1);
