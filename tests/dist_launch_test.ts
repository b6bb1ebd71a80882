/**
 * `deno task launch` runs an example as several ranks: one rank prints, logs and saves; the
 * checkpoint resumes in a run of another size.
 */

import assert from "node:assert";
import { existsSync } from "node:fs";
import { FASHION_MNIST_DEBIAN_ROOT } from "../loader/datasets/mnist.ts";
import { parseLaunchArgs } from "../tools/launch.ts";
import { MPIS } from "./_dist.ts";

const root = Deno.env.get("PINSTREAM_FASHION_ROOT") ?? FASHION_MNIST_DEBIAN_ROOT;
const haveData = existsSync(root);
if (!haveData) console.warn(`launch test skipped: no Fashion-MNIST at ${root}`);

Deno.test("parseLaunchArgs splits the launcher's options from the program's", () => {
  const a = parseLaunchArgs(["-n", "4", "--mpi", "mpich", "train.ts", "-n", "9", "--lr", "1"]);
  assert.deepStrictEqual(a, {
    n: 4,
    mpi: "mpich",
    mpirunArgs: [],
    program: ["train.ts", "-n", "9", "--lr", "1"],
  });
  assert.throws(() => parseLaunchArgs(["-n", "0", "x.ts"]), /-n must be a positive integer/);
  assert.throws(() => parseLaunchArgs(["-n", "2"]), /no program given/);
});

Deno.test({
  name: "an example launched on 2 ranks prints once, saves once, and resumes on 1 rank",
  ignore: MPIS.length === 0 || !haveData,
  async fn() {
    const dir = await Deno.makeTempDir();
    const ckpt = `${dir}/m.safetensors`;
    const common = ["--model", "mlp", "--limit", "2000", "--workers", "0", "--quiet"];
    const dec = new TextDecoder();
    const two = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("../tools/launch.ts", import.meta.url).pathname,
        "-n",
        "2",
        new URL("../examples/fashion_mnist.ts", import.meta.url).pathname,
        ...common,
        "--epochs",
        "2",
        "--stop-after",
        "1",
        "--checkpoint",
        ckpt,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const out = dec.decode(two.stdout);
    assert.strictEqual(two.code, 0, out + dec.decode(two.stderr));
    assert.strictEqual(out.match(/^epoch 1\/2 /gm)?.length, 1, out);
    assert.match(out, /batch 128 per rank x 2 ranks/);
    assert.ok(existsSync(ckpt));
    const one = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("../examples/fashion_mnist.ts", import.meta.url).pathname,
        ...common,
        "--epochs",
        "2",
        "--checkpoint",
        ckpt,
        "--resume",
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const out1 = dec.decode(one.stdout);
    assert.strictEqual(one.code, 0, out1 + dec.decode(one.stderr));
    assert.match(out1, /resumed from .* after epoch 1/);
    assert.match(out1, /^epoch 2\/2 /m);
    await Deno.remove(dir, { recursive: true });
  },
});
