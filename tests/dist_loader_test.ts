import assert from "node:assert";
import { Device, DeviceDataset, DistributedSampler, TensorDataset } from "../mod.ts";

/** 10 one-pixel images whose label is their index. */
function dataset(device: Device): DeviceDataset {
  const n = 10;
  const images = new Uint8Array(new SharedArrayBuffer(n));
  const labels = new Int32Array(new SharedArrayBuffer(n * 4));
  for (let i = 0; i < n; i++) labels[i] = i;
  return new DeviceDataset(
    device,
    new TensorDataset({ image: { data: images, shape: [1, 1] }, label: labels }),
  );
}

async function epochLabels(
  d: DeviceDataset,
  options: { rank: number; worldSize: number; epoch: number; seed?: number },
): Promise<number[]> {
  await using loader = d.loader({
    batchSize: 2,
    shuffle: true,
    seed: options.seed,
    rank: options.rank,
    worldSize: options.worldSize,
    dtype: "f32",
  });
  loader.setEpoch(options.epoch);
  const out: number[] = [];
  for await (const b of loader) out.push(...await b.labels.toHost());
  return out;
}

Deno.test("DeviceLoader shards each epoch over the ranks as DistributedSampler does", async () => {
  using device = Device.open("cpu");
  using d = dataset(device);
  for (const epoch of [0, 1]) {
    const shards = [];
    for (let rank = 0; rank < 3; rank++) {
      const got = await epochLabels(d, { rank, worldSize: 3, epoch, seed: 7 });
      const want = new DistributedSampler(10, { worldSize: 3, rank, seed: 7 }).indices(epoch);
      assert.deepStrictEqual(got, [...want], `rank ${rank}, epoch ${epoch}`);
      shards.push(got);
    }
    // 10 samples over 3 ranks: 4 each, two repeated to pad, every sample present.
    assert.deepStrictEqual(new Set(shards.flat()).size, 10);
    assert.ok(shards.every((s) => s.length === 4));
  }
  const e0 = await epochLabels(d, { rank: 0, worldSize: 2, epoch: 0 });
  const e1 = await epochLabels(d, { rank: 0, worldSize: 2, epoch: 1 });
  assert.notDeepStrictEqual(e0, e1, "setEpoch must change the shuffle");
  // Without a seed, every rank still shuffles alike (seed 0), so the shards stay disjoint.
  const r1 = await epochLabels(d, { rank: 1, worldSize: 2, epoch: 0 });
  assert.strictEqual(new Set([...e0, ...r1]).size, 10);
});

Deno.test("DeviceLoader refuses a rank outside the world", () => {
  using device = Device.open("cpu");
  using d = dataset(device);
  assert.throws(() => d.loader({ rank: 2, worldSize: 2 }), /invalid rank 2/);
});
