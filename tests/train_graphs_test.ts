// The training step recorded as a CUDA graph (Trainer's cudaGraphs): replayed steps leave the
// same weights, running statistics, momentum buffers, scaler state and loss statistics as
// steps queued one op at a time, bit for bit, in fp16 with loss scaling and in fp32, with a
// schedule that changes lr and momentum every step; a new input shape records a graph of its
// own; disposing the trainer frees the graphs; where recording is refused (the CPU backend)
// the trainer says so once and trains directly, with the same results.

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
  Trainer,
  Xoshiro128,
} from "../nn/mod.ts";
import * as ops from "../nn/ops.ts";
import { testEachBackend } from "./_backends.ts";

function model(): Module {
  const rng = new Xoshiro128(3);
  return new Sequential([
    new Conv2d(3, 8, { kernelSize: 3, padding: 1, bias: false, rng }),
    new BatchNorm2d(8),
    new ReLU(),
    new MaxPool2d(2),
    new Flatten(),
    new Linear(8 * 4 * 4, 10, { rng }),
  ]);
}

interface Run {
  state: Map<string, number[]>;
  stats: { loss: number; accuracy: number; samples: number };
  steps: number;
  tracked: number;
  scale: number;
  momentum: Float32Array[];
  active: boolean;
  graphsLive: number;
}

/** Trains a fresh model on `batches` (batch sizes) and returns everything the steps changed. */
async function train(
  device: Device,
  precision: Precision,
  cudaGraphs: boolean,
  batches: number[],
): Promise<Run> {
  using net = model().to(device, { precision });
  using opt = new SGD(net.parameters(), { lr: 0.05, momentum: 0.9, weightDecay: 5e-4 });
  using scaler = new GradScaler(device, { enabled: precision === "fp16" });
  const scheduler = new OneCycleLR(opt, { maxLr: 0.1, totalSteps: batches.length + 1 });
  using trainer = new Trainer(net, { optimizer: opt, scaler, scheduler, cudaGraphs });
  const dtype = precision === "fp16" ? "f16" : "f32";
  batches.forEach((n, i) => {
    using x32 = Tensor.randn(device, [n, 3, 8, 8], { seed: 100 + i });
    using x = dtype === "f16" ? Tensor.empty(device, [n, 3, 8, 8], "f16") : null;
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

function assertSameRun(graphs: Run, eager: Run, what: string) {
  assert.deepStrictEqual([...graphs.state.keys()], [...eager.state.keys()], what);
  for (const [k, v] of eager.state) assert.deepStrictEqual(graphs.state.get(k), v, `${what}: ${k}`);
  assert.deepStrictEqual(graphs.momentum, eager.momentum, `${what}: momentum buffers`);
  assert.deepStrictEqual(graphs.stats, eager.stats, `${what}: loss statistics`);
  assert.strictEqual(graphs.steps, eager.steps, what);
  assert.strictEqual(graphs.tracked, eager.tracked, `${what}: num_batches_tracked`);
  assert.strictEqual(graphs.scale, eager.scale, `${what}: loss scale`);
}

for (const precision of ["fp16", "fp32"] as const) {
  testEachBackend(
    `replayed steps leave the weights of direct steps (${precision})`,
    async (dev) => {
      const batches = [6, 6, 6, 6, 6];
      const eager = await train(dev, precision, false, batches);
      if (dev.kind === "cuda") {
        const graphs = await train(dev, precision, true, batches);
        assertSameRun(graphs, eager, precision);
        assert.strictEqual(graphs.active, true);
        assert.strictEqual(graphs.graphsLive, 1, "one shape, one graph");
      }
      assert.strictEqual(eager.active, false);
      assert.strictEqual(eager.graphsLive, 0);
      assert.strictEqual(CudaGraph.live(dev), 0, "disposing the trainer freed its graphs");
    },
  );
}

testEachBackend(
  "a new input shape records its own graph, the old one still replays",
  async (dev) => {
    const batches = [6, 6, 6, 4, 4, 4, 6, 4, 6];
    const eager = await train(dev, "fp16", false, batches);
    if (dev.kind !== "cuda") return;
    const graphs = await train(dev, "fp16", true, batches);
    assertSameRun(graphs, eager, "two shapes");
    assert.strictEqual(graphs.graphsLive, 2);
    assert.strictEqual(CudaGraph.live(dev), 0);
  },
);

testEachBackend(
  "where recording is refused the trainer says so once and trains directly",
  async (dev) => {
    if (dev.kind !== "cpu") return;
    const lines: string[] = [];
    const error = console.error;
    console.error = (...args: unknown[]) => void lines.push(args.join(" "));
    let refused: Run;
    try {
      refused = await train(dev, "fp16", true, [6, 6, 6, 6]);
    } finally {
      console.error = error;
    }
    const eager = await train(dev, "fp16", false, [6, 6, 6, 6]);
    assertSameRun(refused, eager, "refused");
    assert.strictEqual(refused.active, false);
    assert.strictEqual(lines.length, 1, lines.join("\n"));
    assert.match(lines[0], /^pinstream: training without CUDA graphs .*cpu backend/);
  },
);
