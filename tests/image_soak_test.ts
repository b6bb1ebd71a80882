// Soak of the zero-copy decode path: workers decoding image files straight into ring slots,
// looped over many loader configurations (worker counts, prefetch depths, batch sizes,
// persistent workers or not, epochs left early, libjpeg-turbo or the TypeScript decoder in the
// workers), every sample checked against the image libjpeg-turbo gives on the main thread for
// its index. `deno task test` runs a short version;
// `deno test -A tests/image_soak_test.ts -- --rounds=20` runs more.

import assert from "node:assert";
import { join } from "node:path";
import { DataLoader } from "../loader/data_loader.ts";
import { ImageFolder } from "../loader/datasets/image_folder.ts";
import type { RingBatch } from "../loader/ring.ts";
import { encodeJpeg, ImageDecoder } from "../decode/mod.ts";

const roundsArg = Deno.args.findLast((a) => a.startsWith("--rounds="))?.slice(9);
const ROUNDS = roundsArg === undefined ? 2 : Number(roundsArg);
if (!(Number.isInteger(ROUNDS) && ROUNDS > 0)) {
  throw new RangeError(
    `Cannot run the soak: rounds should be a positive integer, got ${roundsArg}`,
  );
}

const native = (() => {
  try {
    return new ImageDecoder({ backend: "native" });
  } catch (e) {
    console.error(`image_soak_test: ${(e as Error).message}: ignored`);
    return undefined;
  }
})();

function digest(b: Uint8Array): string {
  let h = 0x811c9dc5;
  for (const v of b) h = Math.imul(h ^ v, 0x01000193);
  return `${b.length}:${(h >>> 0).toString(16)}`;
}

Deno.test({
  name: "soak: workers decode into ring slots under changing loader configurations",
  ignore: native === undefined,
  fn: async () => {
    const root = await Deno.makeTempDir({ prefix: "pinstream-image-soak-" });
    try {
      // 3 classes x 40 JPEGs of distinct content and sizes.
      let seed = 7;
      const rnd = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
      for (const c of ["a", "b", "c"]) {
        await Deno.mkdir(join(root, c));
        for (let i = 0; i < 40; i++) {
          const height = 20 + Math.floor(rnd() * 40), width = 20 + Math.floor(rnd() * 40);
          const data = Uint8Array.from({ length: height * width * 3 }, () => rnd() * 256);
          await Deno.writeFile(
            join(root, c, `${i}.jpg`),
            encodeJpeg({ data, height, width, channels: 3 }, 80),
          );
        }
      }
      const size: [number, number] = [16, 24];
      const ds = new ImageFolder(root, { size, verbose: false });
      // The TypeScript JPEG decoder in the workers gives the same bytes.
      const viaTs = new ImageFolder(root, { size, verbose: false, decoder: "typescript" });
      const want = Array.from(
        { length: ds.length },
        (_, i) => digest(native!.decode(Deno.readFileSync(ds.path(i)), { size }).data),
      );
      const per = size[0] * size[1] * 3;
      const pick = <T>(xs: T[]) => xs[Math.floor(rnd() * xs.length)];
      for (let round = 0; round < ROUNDS; round++) {
        const config = {
          batchSize: pick([1, 5, 16, 64]),
          numWorkers: pick([1, 2, 3]),
          prefetchFactor: pick([1, 2, 4]),
          persistentWorkers: rnd() < 0.5,
          shuffle: true,
          seed: round,
        };
        const decoder = round % 2 ? "typescript" : "auto";
        await using loader = new DataLoader<RingBatch<{ image: Uint8Array; label: Int32Array }>>(
          decoder === "typescript" ? viaTs : ds,
          config,
        );
        for (let epoch = 0; epoch < 3; epoch++) {
          // Sometimes the epoch is left early: the next one must start clean.
          const stopAt = rnd() < 0.3 ? Math.floor(rnd() * loader.length) : Infinity;
          let seen = 0, b = 0;
          for await (const batch of loader) {
            for (let k = 0; k < batch.size; k++) {
              const i = batch.indices[k];
              const image = batch.fields.image.subarray(k * per, (k + 1) * per);
              assert.strictEqual(
                digest(image),
                want[i],
                `${JSON.stringify(config)} ${decoder} sample ${i}`,
              );
              assert.strictEqual(batch.fields.label[k], ds.labels[i]);
            }
            seen += batch.size;
            if (++b >= stopAt) break;
          }
          if (stopAt === Infinity) assert.strictEqual(seen, ds.length, JSON.stringify(config));
        }
      }
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});
