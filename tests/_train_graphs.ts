/**
 * What tests/train_graphs_test.ts and its child process share: a small CNN trained with or
 * without CUDA graphs, and the comparison of two runs.
 *
 * @module
 */

import assert from "node:assert";
import type { Device } from "../ffi/device.ts";
import { CudaGraph } from "../ffi/graph.ts";
import { Tensor } from "../ffi/tensor.ts";
import {
  BatchNorm2d,
  Conv2d,
  Flatten,
  GradScaler,
  Linear,
  MaxPool2d,
  type Module,
  OneCycleLR,
  type Precision,
  ReLU,
  Sequential,
  SGD,
  Xoshiro128,
} from "../nn/mod.ts";
import * as ops from "../ops/mod.ts";
import { Trainer } from "../train/trainer.ts";

/** The CNN the runs train: conv-BN-ReLU, pool, linear, on `side`-pixel square images. */
export function model(side: number): Module {
  const rng = new Xoshiro128(3);
  return new Sequential([
    new Conv2d(3, 8, { kernelSize: 3, padding: 1, bias: false, rng }),
    new BatchNorm2d(8),
    new ReLU(),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(8 * (side / 2) ** 2, 10, { rng }),
  ]);
}

/** Everything a run changed. */
export interface Run {
  state: Map<string, number[]>;
  stats: { loss: number; accuracy: number; samples: number };
  steps: number;
  tracked: number;
  scale: number;
  momentum: Float32Array[];
  active: boolean;
  graphsLive: number;
}

/**
 * Trains a fresh model on `batches` (batch sizes; images `side` pixels square) and returns
 * everything the steps changed.
 */
export async function train(
  device: Device,
  precision: Precision,
  cudaGraphs: boolean,
  batches: number[],
  side = 8,
): Promise<Run> {
  using net = model(side).to(device, { precision });
  using opt = new SGD(net.parameters(), { lr: 0.05, momentum: 0.9, weightDecay: 5e-4 });
  using scaler = new GradScaler(device, { enabled: precision === "fp16" });
  const scheduler = new OneCycleLR(opt, { maxLr: 0.1, totalSteps: batches.length + 1 });
  using trainer = new Trainer(net, { optimizer: opt, scaler, scheduler, cudaGraphs });
  const dtype = precision === "fp16" ? "f16" : "f32";
  batches.forEach((n, i) => {
    using x32 = ops.randn(device, [n, 3, side, side], { seed: 100 + i });
    using x = dtype === "f16" ? Tensor.empty(device, [n, 3, side, side], "f16") : null;
    if (x) ops.cast(x32, x);
    using y = Tensor.fromHost(device, Int32Array.from({ length: n }, (_, k) => (k * 7 + i) % 10));
    trainer.trainStep(x ?? x32, y);
  });
  const graphsLive = CudaGraph.live(device);
  const state = new Map<string, number[]>();
  for (const [k, v] of await net.stateDict()) state.set(k, [...v.data].map(Number));
  const opts = await opt.stateDict();
  return {
    state,
    stats: await trainer.readTrain(),
    steps: trainer.steps,
    tracked: (net.namedModules().find(([, m]) => m instanceof BatchNorm2d)![1] as BatchNorm2d)
      .numBatchesTracked,
    scale: await scaler.getScale(),
    momentum: opts.momentumBuffers,
    active: trainer.cudaGraphsActive,
    graphsLive,
  };
}

/** Asserts that two runs changed the same things, bit for bit. */
export function assertSameRun(graphs: Run, eager: Run, what: string) {
  assert.deepStrictEqual([...graphs.state.keys()], [...eager.state.keys()], what);
  for (const [k, v] of eager.state) assert.deepStrictEqual(graphs.state.get(k), v, `${what}: ${k}`);
  assert.deepStrictEqual(graphs.momentum, eager.momentum, `${what}: momentum buffers`);
  // The CUDA loss sum is accumulated with atomics, in an order that varies run to run.
  assert.strictEqual(graphs.stats.samples, eager.stats.samples, `${what}: samples`);
  assert.strictEqual(graphs.stats.accuracy, eager.stats.accuracy, `${what}: accuracy`);
  assert.ok(
    Math.abs(graphs.stats.loss - eager.stats.loss) <= 1e-6 * Math.abs(eager.stats.loss),
    `${what}: loss ${graphs.stats.loss} against ${eager.stats.loss}`,
  );
  assert.strictEqual(graphs.steps, eager.steps, what);
  assert.strictEqual(graphs.tracked, eager.tracked, `${what}: num_batches_tracked`);
  assert.strictEqual(graphs.scale, eager.scale, `${what}: loss scale`);
}
