/**
 * One rank of tests/dist_train_test.ts (or the whole job when run without a launcher): trains
 * a small model with DataParallel on a seeded synthetic data set, each rank taking its slice
 * of every global batch, and writes the final weights to
 * `<out>.<rank>.json` with the loss scale after each step.
 *
 *     deno run -A tests/_dist_train_child.ts --model mlp --precision fp32 --steps 10 \
 *       --batch 32 --out /tmp/w [--accumulate 2] [--nan-index 700 --nan-step 3] [--sync-bn] \
 *       [--device cuda] [--augment]
 *
 * With --augment, the batches come from a DeviceLoader over a seeded uint8 image set, sharded
 * over the ranks with crop, flip and cutout drawn per sample: the ranks' batches together
 * must be the one process's batch, augmentation included (augment/record.ts).
 *
 * Non-zero ranks build their model from another seed: the broadcast must make them equal.
 *
 * @module
 */

import { parseArgs } from "node:util";
import {
  BatchNorm2d,
  Conv2d,
  CrossEntropyLoss,
  DataParallel,
  Device,
  DeviceDataset,
  Flatten,
  GradScaler,
  Linear,
  MaxPool2d,
  type Module,
  ProcessGroup,
  ReLU,
  Sequential,
  SGD,
  SyncBatchNorm,
  Tensor,
  TensorDataset,
  Trainer,
  Xoshiro128,
} from "../mod.ts";
import { cast } from "../ops/elementwise.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    model: { type: "string", default: "mlp" },
    precision: { type: "string", default: "fp32" },
    steps: { type: "string", default: "10" },
    batch: { type: "string", default: "32" },
    out: { type: "string" },
    accumulate: { type: "string", default: "1" },
    "nan-index": { type: "string", default: "-1" },
    "nan-step": { type: "string", default: "-1" },
    "sync-bn": { type: "boolean", default: false },
    "bucket-mb": { type: "string", default: "0.001" },
    // cuda: the model on the CUDA device, its gradients reduced by the nccl backend.
    device: { type: "string", default: "cpu" },
    // The last rank builds a wider hidden layer: DataParallel must refuse the models.
    differ: { type: "boolean", default: false },
    augment: { type: "boolean", default: false },
  },
});
const precision = values.precision as "fp16" | "bf16" | "fp32";
const steps = Number(values.steps), batch = Number(values.batch);
const accumulate = Number(values.accumulate);
const nanIndex = Number(values["nan-index"]), nanStep = Number(values["nan-step"]);

const kind = values.device as "cpu" | "cuda";
using device = Device.open(kind);
using group = ProcessGroup.init({
  timeoutMs: 120_000,
  ...(kind === "cuda" ? { backend: "nccl", device } : {}),
});
const { rank, size } = group;
if (batch % size !== 0) throw new RangeError(`batch ${batch} is not divisible by ${size} ranks`);
const local = batch / size;

const rng = new Xoshiro128(rank === 0 ? 1 : 100 + rank);
const hidden = values.differ && rank === size - 1 ? 33 : 32;
function build(): Module {
  switch (values.model) {
    case "mlp":
      return new Sequential([
        new Flatten(),
        new Linear(64, hidden, { rng }),
        new ReLU(),
        new Linear(hidden, 4, { rng }),
      ]);
    case "cnn":
      return new Sequential([
        new Conv2d(1, 4, { kernelSize: 3, padding: 1, rng }),
        new ReLU(),
        new MaxPool2d(2),
        new Flatten(),
        new Linear(64, 4, { rng }),
      ]);
    case "bn":
      return new Sequential([
        new Conv2d(1, 4, { kernelSize: 3, padding: 1, rng }),
        values["sync-bn"] ? new SyncBatchNorm(4, group) : new BatchNorm2d(4),
        new ReLU(),
        new Flatten(),
        new Linear(256, 4, { rng }),
      ]);
  }
  throw new RangeError(`unknown model ${values.model}`);
}

const model = build().to(device, { precision });
// A tiny bucket size by default, so that even these small models have several buckets.
using dp = new DataParallel(model, group, { bucketMB: Number(values["bucket-mb"]) });
using opt = new SGD(dp.parameters(), { lr: 0.1, momentum: 0.9 });
using scaler = precision === "fp16" ? new GradScaler(device, { initScale: 1024 }) : null;
using trainer = new Trainer(dp, { optimizer: opt, scaler });
using loss = new CrossEntropyLoss(device);

const Arr = precision === "fp16" ? Float16Array : Float32Array;
/** The batch on the device in the model's compute dtype (bf16: cast there from fp32). */
function input(xs: Float32Array | Float16Array): Tensor {
  const shape = [local, 1, 8, 8];
  if (precision !== "bf16") return Tensor.fromHost(device, xs, shape);
  using wide = Tensor.fromHost(device, xs, shape);
  const t = Tensor.empty(device, shape, "bf16");
  cast(wide, t);
  return t;
}
/** Global batch `step`, micro-batch `micro`: seeded, the same on every rank. */
function globalBatch(step: number, micro: number): { x: Float32Array; y: Int32Array } {
  const g = new Xoshiro128(1000 + step * 31 + micro);
  const x = new Float32Array(batch * 64);
  for (let i = 0; i < x.length; i++) x[i] = 2 * g.random() - 1;
  const y = Int32Array.from({ length: batch }, (_, i) => (i + step) % 4);
  // A learnable signal: the label's quadrant is brighter.
  for (let n = 0; n < batch; n++) for (let k = 0; k < 16; k++) x[n * 64 + y[n] * 16 + k] += 1;
  return { x, y };
}

/**
 * --augment: a DeviceLoader over 4 global batches of seeded 8x8 images (the label's quadrant
 * brighter), this rank's share of each shuffled epoch, every sample cropped, flipped and cut
 * out from its own draws; epochs one after another until `steps`.
 */
async function* augmentedBatches(): AsyncGenerator<{ images: Tensor; labels: Tensor }> {
  const n = 4 * batch;
  const g = new Xoshiro128(77);
  const labels = new Int32Array(new SharedArrayBuffer(n * 4)).map((_, i) => (i * 7) % 4);
  const images = new Uint8Array(new SharedArrayBuffer(n * 64));
  for (let i = 0; i < images.length; i++) {
    const q = Math.floor((i % 64) / 16) === labels[Math.floor(i / 64)] ? 96 : 0;
    images[i] = Math.min(255, q + Math.floor(g.random() * 160));
  }
  using resident = new DeviceDataset(
    device,
    new TensorDataset({ image: { data: images, shape: [1, 8, 8] }, label: labels }),
  );
  await using loader = resident.loader({
    batchSize: local,
    shuffle: true,
    seed: 5,
    augment: { padding: 2, flip: true, cutout: 3 },
    mean: [0.4],
    std: [0.25],
    dtype: precision === "fp16" ? "f16" : "f32",
    worldSize: size,
    rank,
  });
  for (;;) for await (const b of loader) yield b;
}
const augmented = values.augment ? augmentedBatches() : null;

/** The loss scale after each step: it halves exactly on the steps the scaler skips. */
const scales: number[] = [];
for (let step = 0; step < steps; step++) {
  if (augmented !== null) {
    const b = (await augmented.next()).value!;
    trainer.trainStep(b.images, b.labels);
    if (scaler) scales.push(await scaler.getScale());
    continue;
  }
  for (let micro = 0; micro < accumulate; micro++) {
    const { x, y } = globalBatch(step, micro);
    const xs = Arr.from(x.subarray(rank * local * 64, (rank + 1) * local * 64));
    // The NaN sits at one element of the global batch: on whichever rank holds it.
    const at = nanIndex - rank * local * 64;
    if (step === nanStep && at >= 0 && at < xs.length) xs[at] = NaN;
    using xt = input(xs as Float32Array | Float16Array);
    using yt = Tensor.fromHost(device, y.slice(rank * local, (rank + 1) * local), [local]);
    if (accumulate === 1) {
      trainer.trainStep(xt, yt);
      continue;
    }
    // Gradient accumulation: micro-batches under noSync, the last one synchronized, then
    // one optimizer step on the sum of the micro-batches' gradients.
    using _sync = micro < accumulate - 1 ? dp.noSync() : null;
    const logits = dp.forward(xt);
    const dlogits = loss.forwardBackward(logits, yt, null);
    dp.backward(dlogits, { inputGrad: false });
    if (micro === accumulate - 1) opt.step();
  }
  if (scaler) scales.push(await scaler.getScale());
}

const weights: Record<string, number[]> = {};
for (const [name, p] of model.namedParameters()) weights[name] = [...await p.read()];
for (const [name, b] of model.namedBuffers()) weights[name] = [...await b.read()];
await augmented?.return(undefined);
await Deno.writeTextFile(`${values.out}.${rank}.json`, JSON.stringify({ weights, scales }));
console.log(`ok ${rank}`);
