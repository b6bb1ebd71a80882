// Every public option bag refuses a misspelt key with a did-you-mean: a typo otherwise takes the
// default silently (the test set loaded as the training set, a checkpoint saved without its
// optimizer or with no step).
import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { CIFAR10 } from "../loader/datasets/cifar10.ts";
import {
  BatchNorm2d,
  Conv2d,
  Linear,
  loadCheckpoint,
  MaxPool2d,
  Parameter,
  saveCheckpoint,
  SGD,
} from "../nn/mod.ts";
import { MetricsLog } from "../train/metrics.ts";

/** Asserts that `fn` throws (or rejects with) a TypeError naming `typo` and suggesting `meant`. */
async function refuses(fn: () => unknown, typo: string, meant: string): Promise<void> {
  const re = new RegExp(`unknown option "${typo}" \\(did you mean "${meant}"\\?\\)`);
  await assert.rejects(async () => await fn(), (e: Error) => {
    assert.ok(e instanceof TypeError, String(e));
    assert.match(e.message, re);
    return true;
  });
}

Deno.test("CIFAR10.load refuses a misspelt option instead of loading the training set", async () => {
  const root = await Deno.makeTempDir();
  await refuses(() => CIFAR10.load({ root, trian: false } as never), "trian", "train");
  await Deno.remove(root);
});

Deno.test("layers refuse misspelt options", async () => {
  await refuses(() => new Conv2d(3, 8, { kernelSise: 5 } as never), "kernelSise", "kernelSize");
  await refuses(() => new Conv2d(3, 8, { paddding: 1 } as never), "paddding", "padding");
  await refuses(() => new BatchNorm2d(8, { momentun: 0.2 } as never), "momentun", "momentum");
  await refuses(() => new MaxPool2d(2, { strides: 1 } as never), "strides", "stride");
  await refuses(
    () => new Parameter(new Float32Array(1), [1], { computeDtyp: "f32" } as never),
    "computeDtyp",
    "computeDtype",
  );
});

Deno.test("MetricsLog.open refuses a misspelt option", async () => {
  const path = await Deno.makeTempFile();
  await refuses(() => MetricsLog.open(path, { apend: false } as never), "apend", "append");
  await Deno.remove(path);
});

Deno.test("saveCheckpoint and loadCheckpoint refuse misspelt parts and progress, writing nothing", async () => {
  using device = Device.open("cpu");
  using model = new Linear(2, 2).to(device);
  using optimizer = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
  const dir = await Deno.makeTempDir();
  const path = `${dir}/m.safetensors`;
  await refuses(
    () => saveCheckpoint(path, { model, optimiser: optimizer } as never),
    "optimiser",
    "optimizer",
  );
  await refuses(
    () => saveCheckpoint(path, { model }, { epoch: 1, stpe: 3 } as never),
    "stpe",
    "step",
  );
  await assert.rejects(
    () => saveCheckpoint(path, { model }, { epoch: 1 } as never),
    /progress\.step must be a non-negative integer/,
  );
  assert.deepStrictEqual([...Deno.readDirSync(dir)], []);
  await saveCheckpoint(path, { model, optimizer }, { epoch: 1, step: 3 });
  await refuses(
    () => loadCheckpoint(path, { model, optimiser: optimizer } as never),
    "optimiser",
    "optimizer",
  );
  assert.strictEqual((await loadCheckpoint(path, { model, optimizer })).step, 3);
  await Deno.remove(dir, { recursive: true });
});
