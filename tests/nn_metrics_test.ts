// The epoch-level training log (train/metrics.ts) and the examples' --log: JSON Lines that survive
// a crash line by line, values checked, a corrupt line named by file and line, and the curves
// drawn beside the log.

import assert from "node:assert";
import { MetricsLog } from "../train/metrics.ts";
import { curvesSvg } from "../train/_chart.ts";

Deno.test("a log appends whole lines with a time, reads back in order, and resumes", async () => {
  const path = await Deno.makeTempFile({ suffix: ".jsonl" });
  try {
    {
      using log = await MetricsLog.open(path, { append: false });
      await log.append({ epoch: 1, trainLoss: 2.1, testAcc: 0.3, data: "x" });
      await log.append({ epoch: 2, trainLoss: 1.4, testAcc: 0.5, time: "given" });
    }
    // Each record is on disk as soon as append() returns: a second reader sees both.
    const text = await Deno.readTextFile(path);
    assert.strictEqual(text.split("\n").filter((l) => l).length, 2);
    {
      using log = await MetricsLog.open(path); // append: true keeps the past epochs
      await log.append({ epoch: 3, trainLoss: 1.0, testAcc: 0.6 });
    }
    const rows = await MetricsLog.read(path);
    assert.deepStrictEqual(rows.map((r) => r.epoch), [1, 2, 3]);
    assert.match(String(rows[0].time), /^\d{4}-\d\d-\d\dT/);
    assert.strictEqual(rows[1].time, "given");
    {
      using fresh = await MetricsLog.open(path, { append: false });
      await fresh.append({ epoch: 1 });
    }
    assert.strictEqual((await MetricsLog.read(path)).length, 1, "append: false starts afresh");
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("a log refuses values that are not JSON numbers, and names a corrupt line", async () => {
  const path = await Deno.makeTempFile({ suffix: ".jsonl" });
  try {
    using log = await MetricsLog.open(path, { append: false });
    await assert.rejects(() => log.append({ loss: NaN }), /loss must be a finite number/);
    await assert.rejects(
      () => log.append({ loss: {} as unknown as number }),
      /loss must be a finite number, a string, a boolean or null/,
    );
    await log.append({ epoch: 1 });
    log[Symbol.dispose]();
    await assert.rejects(() => log.append({ epoch: 2 }), /the log is closed/);
    await Deno.writeTextFile(path, '{"epoch":1}\n{"epoch":\n', { append: false });
    await assert.rejects(() => MetricsLog.read(path), new RegExp(`${path}:2: not a JSON line`));
    await Deno.writeTextFile(path, "[1,2]\n");
    await assert.rejects(() => MetricsLog.read(path), /:1: expected a JSON object per line/);
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("the curves of a log are drawn with loss and accuracy panels", async () => {
  const svg = await curvesSvg([
    { epoch: 1, trainLoss: 2, testLoss: 1.8, trainAcc: 0.3, testAcc: 0.35, data: "shapes" },
    { epoch: 2, trainLoss: 1.5, testLoss: 1.4, trainAcc: 0.5, testAcc: 0.52, data: "shapes" },
  ]);
  assert.match(svg, /^<svg/);
  for (const text of ["Training curves", "shapes", "loss", "accuracy", "train", "test"]) {
    assert.ok(svg.includes(text), `${text} missing`);
  }
});

Deno.test("an example run with --log writes one line per epoch and the curves beside it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const log = `${dir}/run.jsonl`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("../examples/cifar.ts", import.meta.url).pathname,
        "--epochs",
        "2",
        "--limit",
        "256",
        "--batch-size",
        "64",
        "--quiet",
        "--synthetic", // never downloads CIFAR-10
        // The suite runs with the CUDA emulator as the cuda device: "auto" would train on it,
        // correct but a hundred times slower, and the log is what this test is about.
        "--device",
        "cpu",
        "--checkpoint",
        `${dir}/ck.safetensors`,
        "--log",
        log,
      ],
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    assert.ok(out.success, stdout + new TextDecoder().decode(out.stderr));
    const rows = await MetricsLog.read(log);
    assert.deepStrictEqual(rows.map((r) => r.epoch), [1, 2]);
    for (const key of ["trainLoss", "testAcc", "samplesPerSecond", "inputWaitShare", "lossScale"]) {
      assert.strictEqual(typeof rows[1][key], "number", key);
    }
    assert.match(await Deno.readTextFile(`${log}.svg`), /^<svg/);
    assert.match(stdout, new RegExp(`metrics +${log} \\(\\+ curves: ${log}\\.svg\\)`));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
