// The training step recorded as a CUDA graph (Trainer's cudaGraphs): replayed steps leave the
// same weights, running statistics, momentum buffers, scaler state and loss statistics as
// steps queued one op at a time, bit for bit, in fp16 with loss scaling and in fp32, with a
// schedule that changes lr and momentum every step; a new input shape records a graph of its
// own; disposing the trainer frees the graphs; where recording is refused (the CPU backend, a
// CUDA device without a stream-ordered allocator) the trainer says so once and trains
// directly, with the same results.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { CudaGraph } from "../ffi/graph.ts";
import { Tensor } from "../ffi/tensor.ts";
import { opCounts, opDelta } from "../internal/op_count.ts";
import { Flatten, GradScaler, Linear, Sequential, SGD } from "../nn/mod.ts";
import { Trainer } from "../train/trainer.ts";
import { assertSameRun, model, type Run, train } from "./_train_graphs.ts";
import { toDevice } from "../pipeline/prefetcher.ts";
import { makeData, makeLoader, MEAN, STD } from "./pipeline_fixtures.ts";
import { CUDA, cudaIsEmulated, runWithoutMemoryPools, testEachBackend } from "./_backends.ts";

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

Deno.test({
  name: "a new input shape records its own graph, the old one still replays [cuda]",
  ignore: CUDA.ignore,
  async fn() {
    using dev = Device.open("cuda");
    const batches = [6, 6, 6, 4, 4, 4, 6, 4, 6];
    const eager = await train(dev, "fp16", false, batches);
    const graphs = await train(dev, "fp16", true, batches);
    assertSameRun(graphs, eager, "two shapes");
    assert.strictEqual(graphs.graphsLive, 2);
    assert.strictEqual(CudaGraph.live(dev), 0);
  },
});

Deno.test("the CPU backend refuses recording: the trainer says so once and trains directly", async () => {
  using dev = Device.open("cpu");
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
});

Deno.test({
  name: "[cuda] without a stream-ordered allocator the step records too (it allocates nothing)",
  ignore: !cudaIsEmulated(),
  async fn() {
    const out = await runWithoutMemoryPools(
      new URL("./_graphs_no_pools_child.ts", import.meta.url),
    );
    assert.strictEqual(out, "ok");
  },
});

Deno.test({
  name: "a replayed step asks the backend for one graph launch and two input copies [cuda]",
  ignore: CUDA.ignore,
  async fn() {
    using dev = Device.open("cuda");
    using net = new Sequential([new Flatten(), new Linear(12, 10)]).to(dev);
    using opt = new SGD(net.parameters(), { lr: 0.1, momentum: 0.9 });
    using scaler = new GradScaler(dev);
    using trainer = new Trainer(net, { optimizer: opt, scaler, cudaGraphs: true });
    using x = Tensor.fromHost(dev, new Float16Array(4 * 12).fill(0.5), [4, 3, 2, 2]);
    using y = Tensor.fromHost(dev, new Int32Array([1, 2, 3, 4]));
    trainer.trainStep(x, y); // direct: allocates
    trainer.trainStep(x, y); // recorded, then launched
    const before = opCounts();
    trainer.trainStep(x, y);
    const d = opDelta(opCounts(), before);
    assert.deepStrictEqual(d, {
      kernels: 1,
      copies: 2,
      memsets: 0,
      allocations: 0,
      frees: 0,
      syncs: 0,
    });
    // A scheduler's change: one one-element fill per changed value, still one launch.
    opt.lr = 0.05;
    const before2 = opCounts();
    trainer.trainStep(x, y);
    assert.strictEqual(opDelta(opCounts(), before2).kernels, 2);
    opt.lr = 0.04;
    opt.momentum = 0.85;
    const before3 = opCounts();
    trainer.trainStep(x, y);
    assert.strictEqual(opDelta(opCounts(), before3).kernels, 3);
    assert.strictEqual(trainer.cudaGraphsActive, true);
    await dev.synchronize();
  },
});

Deno.test({
  name: "batches from the device prefetcher, replayed, give the weights of direct steps [cuda]",
  ignore: CUDA.ignore,
  async fn() {
    // 70 samples in batches of 16: four full batches and a short one per epoch, so the
    // shape changes twice an epoch, while the prefetcher reuses its slots under the steps.
    const data = makeData(70, [3, 8, 8], 11);
    const runs: Map<string, number[]>[] = [];
    for (const cudaGraphs of [false, true]) {
      using dev = Device.open("cuda");
      using net = model(8).to(dev);
      using opt = new SGD(net.parameters(), { lr: 0.05, momentum: 0.9 });
      using scaler = new GradScaler(dev);
      using trainer = new Trainer(net, { optimizer: opt, scaler, cudaGraphs });
      await using loader = makeLoader(data, { numWorkers: 1 });
      for (let epoch = 0; epoch < 2; epoch++) {
        await using p = toDevice(loader, dev, { mean: MEAN, std: STD, depth: 2 });
        for await (const b of p) trainer.trainStep(b.images, b.labels);
      }
      const state = new Map<string, number[]>();
      for (const [k, v] of await net.stateDict()) state.set(k, [...v.data].map(Number));
      runs.push(state);
      assert.strictEqual(trainer.cudaGraphsActive, cudaGraphs);
    }
    for (const [k, v] of runs[0]) assert.deepStrictEqual(runs[1].get(k), v, k);
  },
});
