// DataParallel in one process: the order in which it reduces buckets during backward, and what
// it refuses. (Training across ranks: tests/dist_train_test.ts.)
import assert from "node:assert";
import {
  DataParallel,
  Device,
  Linear,
  ProcessGroup,
  ReLU,
  Sequential,
  Tensor,
  Xoshiro128,
} from "../mod.ts";

/**
 * Logs each all-reduce `group` issues, by length: the asynchronous ones, and the blocking one
 * that reduces the last bucket once backward returns.
 */
function spyOnReduces(group: ProcessGroup, log: string[]): void {
  const reduce = group.allReduceAsync.bind(group), blocking = group.allReduce.bind(group);
  group.allReduceAsync = (buf, options) => {
    log.push(`reduce ${(buf as Float32Array).length}`);
    return reduce(buf, options);
  };
  group.allReduce = (buf, options) => {
    log.push(`reduce ${(buf as Float32Array).length}, blocking`);
    return blocking(buf, options);
  };
}

Deno.test("DataParallel reduces each bucket as soon as backward filled it, last layers first", () => {
  using device = Device.open("cpu");
  using group = ProcessGroup.init({ env: () => undefined });
  const rng = new Xoshiro128(3);
  const layers = [new Linear(8, 64, { rng }), new ReLU(), new Linear(64, 64, { rng }), new ReLU()];
  using model = new Sequential([...layers, new Linear(64, 2, { rng })]).to(device, {
    precision: "fp32",
  });
  const log: string[] = [];
  // Spy on the collectives and on the first layer's backward.
  spyOnReduces(group, log);
  const first = layers[0] as Linear, backward = first.backward.bind(first);
  first.backward = (dy, options) => {
    log.push("backward of layer 0");
    return backward(dy, options);
  };
  // Buckets of at most 4096 floats, filled in reverse parameter order (4.bias, 4.weight,
  // 2.bias, 2.weight, 0.bias, 0.weight), a parameter never split.
  using dp = new DataParallel(model, group, { bucketMB: 4096 * 4 / 2 ** 20 });
  assert.deepStrictEqual(
    dp.buckets.map((b) => b.map((p) => p.numel)),
    [[2, 128, 64], [4096], [64, 512]],
  );
  using x = Tensor.fromHost(device, new Float32Array(4 * 8).fill(0.5), [4, 8]);
  using dy = Tensor.fromHost(device, new Float32Array(4 * 2).fill(1), [4, 2]);
  dp.forward(x);
  dp.backward(dy, { inputGrad: false });
  assert.deepStrictEqual(log, [
    "reduce 194",
    "reduce 4096",
    "backward of layer 0",
    "reduce 576, blocking",
  ]);
});

Deno.test("DataParallel rebuilds its buckets in the ready order after the first backward", async () => {
  using device = Device.open("cpu");
  using group = ProcessGroup.init({ env: () => undefined });
  const build = () => {
    const rng = new Xoshiro128(5);
    return new Sequential([
      new Linear(8, 64, { rng }),
      new ReLU(),
      new Linear(64, 64, { rng }),
      new ReLU(),
      new Linear(64, 2, { rng }),
    ]).to(device, { precision: "fp32" });
  };
  using model = build();
  using plain = build();
  const names = new Map(model.namedParameters().map(([n, p]) => [p, n]));
  const log: string[] = [];
  spyOnReduces(group, log);
  using dp = new DataParallel(model, group, { bucketMB: 4096 * 4 / 2 ** 20 });
  const named = () => dp.buckets.map((b) => b.map((p) => names.get(p)!));
  assert.deepStrictEqual(named(), [
    ["4.bias", "4.weight", "2.bias"],
    ["2.weight"],
    ["0.bias", "0.weight"],
  ]);
  const xs = new Float32Array(4 * 8).map((_, i) => Math.sin(i));
  using x = Tensor.fromHost(device, xs, [4, 8]);
  using dy = Tensor.fromHost(device, new Float32Array(4 * 2).map((_, i) => i - 3), [4, 2]);
  dp.forward(x);
  dp.backward(dy, { inputGrad: false });
  // A Sequential reports each layer's parameters as [weight, bias], after its backward.
  assert.deepStrictEqual(named(), [
    ["4.weight", "4.bias"],
    ["2.weight"],
    ["2.bias", "0.weight", "0.bias"],
  ]);
  log.length = 0;
  dp.forward(x);
  dp.backward(dy, { inputGrad: false });
  assert.deepStrictEqual(log, ["reduce 130", "reduce 4096", "reduce 640, blocking"]);
  // A group of one averages nothing: every gradient lands where the plain model has it.
  plain.forward(x);
  plain.backward(dy, { inputGrad: false });
  const want = new Map(plain.namedParameters());
  for (const [n, p] of model.namedParameters()) {
    const got = await p.grad.toHost(), ref = await want.get(n)!.grad.toHost();
    assert.deepStrictEqual([...got], [...ref], n);
  }
});

Deno.test("DataParallel refuses a model that is not on a device, and a bad bucket size", () => {
  using device = Device.open("cpu");
  using group = ProcessGroup.init({ env: () => undefined });
  assert.throws(
    () => new DataParallel(new Linear(2, 2), group),
    /not on a device \(call to\(\) first\)/,
  );
  using model = new Linear(2, 2).to(device);
  assert.throws(() => new DataParallel(model, group, { bucketMB: 0 }), /bucketMB must be > 0/);
  assert.throws(
    () => new DataParallel(model, group, { bucketMb: 1 } as never),
    /unknown option "bucketMb" \(did you mean "bucketMB"\?\)/,
  );
});

Deno.test("DataParallel refuses a bf16 model on the mpi backend, naming the nccl backend", () => {
  using device = Device.open("cpu");
  using group = ProcessGroup.init({ env: () => undefined });
  using model = new Linear(2, 2).to(device, { precision: "bf16" });
  assert.throws(
    () => new DataParallel(model, group),
    /a bf16 model on cpu.*the mpi backend reduces fp32 and fp16 gradients.*nccl backend/,
  );
});
