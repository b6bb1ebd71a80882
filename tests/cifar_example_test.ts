// examples/cifar.ts without CIFAR-10: the generated shapes set is a learning problem (not
// trivially separable, not learned in one epoch), deterministic and in CIFAR's layout; a
// --data path without CIFAR-10 is a one-line error naming it.
import assert from "node:assert";
import { generateShapes } from "../examples/_shapes.ts";
import { trainCifar } from "../examples/cifar.ts";
import { parseTrainArgs } from "../train/fit.ts";

Deno.test("the generated shapes set is deterministic, CIFAR-shaped and balanced", () => {
  const a = generateShapes(200, 5), b = generateShapes(200, 5), c = generateShapes(200, 6);
  assert.strictEqual(a.images.length, 200 * 3 * 32 * 32);
  assert.ok(a.images.buffer instanceof SharedArrayBuffer);
  assert.deepStrictEqual(a.images, b.images);
  assert.deepStrictEqual(a.labels, b.labels);
  assert.notDeepStrictEqual(a.images, c.images);
  const counts = new Array(10).fill(0);
  for (const l of a.labels) counts[l]++;
  assert.deepStrictEqual(counts, new Array(10).fill(20));
  // Colours span the byte range (the store clamps rather than wrapping).
  let lo = 255, hi = 0;
  for (const x of a.images) [lo, hi] = [Math.min(lo, x), Math.max(hi, x)];
  assert.ok(lo < 10 && hi > 245, `pixel range ${lo}..${hi}`);
});

Deno.test("the generated shapes set is not separable by a nearest-class-mean on pixels", () => {
  // A set whose classes differ in colour or position (the previous generated set) scores
  // near 100% here; shapes drawn at random colours, places and sizes stay near chance.
  const train = generateShapes(3000, 1), test = generateShapes(500, 2);
  const means = Array.from({ length: 10 }, () => new Float64Array(3072));
  for (let i = 0; i < 3000; i++) {
    const m = means[train.labels[i]];
    for (let j = 0; j < 3072; j++) m[j] += train.images[i * 3072 + j] / 300;
  }
  let correct = 0;
  for (let i = 0; i < 500; i++) {
    let best = -1, bestD = Infinity;
    for (let c = 0; c < 10; c++) {
      let d = 0;
      for (let j = 0; j < 3072; j++) d += (test.images[i * 3072 + j] - means[c][j]) ** 2;
      if (d < bestD) [best, bestD] = [c, d];
    }
    if (best === test.labels[i]) correct++;
  }
  assert.ok(correct / 500 < 0.25, `nearest class mean: ${(100 * correct / 500).toFixed(1)}%`);
});

Deno.test("the CNN does not learn the generated set in one epoch", async () => {
  const args = parseTrainArgs(
    ["--device", "cpu", "--epochs", "1", "--limit", "2000", "--workers", "0", "--quiet"],
    "cifar.ts",
    {},
  );
  const [r] = await trainCifar(args, { synthetic: true });
  assert.ok(Number.isFinite(r.trainLoss));
  assert.ok(r.testAcc < 0.6, `test accuracy after one epoch ${r.testAcc}`);
});

async function cifar(args: string[]) {
  const r = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL("../examples/cifar.ts", import.meta.url).pathname, ...args],
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: r.code, out: dec.decode(r.stdout), err: dec.decode(r.stderr) };
}

Deno.test("cifar.ts --data with a missing path is one line naming it, exit code 1", async () => {
  const path = `${await Deno.makeTempDir()}/no-such-dir`;
  const { code, out, err } = await cifar(["--data", path, "--epochs", "1"]);
  assert.strictEqual(code, 1, out + err);
  assert.strictEqual(err, `error: Cannot load CIFAR-10 from --data ${path}: no such directory\n`);
  assert.doesNotMatch(out, /generated/);
  await Deno.remove(path.slice(0, -"/no-such-dir".length));
});

Deno.test("cifar.ts --data with a directory without CIFAR-10 files is an error naming it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const { code, out, err } = await cifar(["--data", dir]);
    assert.strictEqual(code, 1, out + err);
    assert.strictEqual(err.trimEnd().split("\n").length, 1, err);
    assert.ok(err.startsWith(`error: Cannot load CIFAR-10 from --data ${dir}: no CIFAR-10 files`));
    assert.doesNotMatch(out, /generated/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
