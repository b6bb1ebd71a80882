// The command-line parser shared by examples/*.ts and bench/*.ts (train/cli.ts): mistakes
// are one line with a hint and exit code 2, --help needs no permission.
import assert from "node:assert";
import { helpText, parseArgv, UsageError } from "../train/cli.ts";
import { parseTrainArgs } from "../train/fit.ts";

const SPEC = {
  usage: "x.ts [options]",
  options: {
    epochs: { kind: "int", min: 1, default: 3, help: "epochs" },
    lr: { kind: "number", min: 0, exclusiveMin: true, default: 0.1, help: "learning rate" },
    device: { kind: "string", choices: ["auto", "cpu", "cuda"], default: "auto", help: "device" },
    data: { kind: "string", metavar: "DIR", help: "data" },
    fp16: { kind: "boolean", default: true, help: "loss scaling" },
    quiet: { kind: "boolean", help: "quiet" },
  },
} as const;

function usageError(argv: string[]): string {
  try {
    parseArgv(argv, SPEC);
  } catch (e) {
    assert.ok(e instanceof UsageError, String(e));
    return e.message;
  }
  assert.fail(`${argv.join(" ")} was accepted`);
}

Deno.test("parseArgv applies defaults and records which options were given", () => {
  const v = parseArgv(["--epochs", "5", "--lr=0.02", "--no-fp16", "--quiet"], SPEC);
  assert.ok(v !== "help");
  assert.strictEqual(v.epochs, 5);
  assert.strictEqual(v.lr, 0.02);
  assert.strictEqual(v.fp16, false);
  assert.strictEqual(v.quiet, true);
  assert.strictEqual(v.device, "auto");
  assert.strictEqual(v.data, undefined);
  assert.deepStrictEqual([...v.given].sort(), ["epochs", "fp16", "lr", "quiet"]);
});

Deno.test("parseArgv names an unknown option with the closest known one and a --help hint", () => {
  assert.strictEqual(
    usageError(["--epoch", "1"]),
    "unknown option --epoch (did you mean --epochs?); see --help",
  );
  assert.strictEqual(
    usageError(["--fp1"]),
    "unknown option --fp1 (did you mean --fp16?); see --help",
  );
  assert.strictEqual(usageError(["--zzz"]), "unknown option --zzz; see --help");
  assert.strictEqual(usageError(["-x"]), "unknown option -x; see --help");
});

Deno.test("parseArgv names the option and what it expects for a bad or missing value", () => {
  assert.strictEqual(
    usageError(["--epochs", "abc"]),
    'invalid value for --epochs: "abc" (expected a whole number >= 1); see --help',
  );
  assert.strictEqual(
    usageError(["--epochs", "1.5"]),
    'invalid value for --epochs: "1.5" (expected a whole number >= 1); see --help',
  );
  // "-1" is the value of --lr, not an option.
  assert.strictEqual(
    usageError(["--lr", "-1"]),
    'invalid value for --lr: "-1" (expected a number > 0); see --help',
  );
  assert.strictEqual(
    usageError(["--device", "cud"]),
    'invalid value for --device: "cud" (expected one of auto, cpu, cuda; did you mean cuda?); ' +
      "see --help",
  );
  assert.strictEqual(
    usageError(["--epochs"]),
    "option --epochs needs a value (a whole number >= 1); see --help",
  );
  assert.strictEqual(
    usageError(["--quiet=yes"]),
    'option --quiet takes no value (got "yes"); see --help',
  );
  assert.strictEqual(usageError(["extra"]), 'unexpected argument "extra"; see --help');
});

Deno.test("parseArgv: --help wins over other mistakes, and the help lists every option", () => {
  assert.strictEqual(parseArgv(["--epoch", "x", "--help"], SPEC), "help");
  assert.strictEqual(parseArgv(["-h"], SPEC), "help");
  const text = helpText(SPEC);
  for (
    const flag of ["--epochs N", "--lr X", "--device auto|cpu|cuda", "--data DIR", "--no-fp16"]
  ) {
    assert.ok(text.includes(flag), `${flag} missing from:\n${text}`);
  }
  assert.match(text, /--epochs N\s+epochs \(default 3\)/);
});

const ROOT = new URL("../", import.meta.url);
const SCRIPTS = [
  "examples/cifar.ts",
  "examples/fashion_mnist.ts",
  "bench/all.ts",
  "bench/kernels.ts",
  "bench/loader.ts",
  "bench/pipeline.ts",
  "bench/train.ts",
  "bench/transfer.ts",
];

/** `deno run <script> ...args` with NO permission flags. */
async function run(script: string, args: string[]) {
  const r = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-prompt", new URL(script, ROOT).pathname, ...args],
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: r.code, out: dec.decode(r.stdout), err: dec.decode(r.stderr) };
}

Deno.test("every example and bench script prints --help without any permission", async () => {
  for (const script of SCRIPTS) {
    const { code, out, err } = await run(script, ["--help"]);
    assert.strictEqual(code, 0, `${script} --help: ${err}`);
    assert.match(out, /^Usage: /, script);
    assert.match(out, /--help/, script);
    assert.strictEqual(err, "", `${script} --help wrote to stderr: ${err}`);
  }
});

Deno.test("every example and bench script refuses an unknown option in one line, exit code 2", async () => {
  for (const script of SCRIPTS) {
    const { code, err } = await run(script, ["--epoch", "1"]);
    assert.strictEqual(code, 2, `${script}: ${err}`);
    assert.strictEqual(err.trimEnd().split("\n").length, 1, `${script} printed more:\n${err}`);
    assert.match(err, /^error: unknown option --epoch.*; see --help\n$/, script);
  }
  const { err } = await run("examples/cifar.ts", ["--epoch", "1"]);
  assert.strictEqual(err, "error: unknown option --epoch (did you mean --epochs?); see --help\n");
});

Deno.test("examples refuse bad values in one line naming the option, exit code 2", async () => {
  for (
    const [args, line] of [
      [["--epochs", "abc"], 'invalid value for --epochs: "abc" (expected a whole number >= 1)'],
      [["--lr", "-1"], 'invalid value for --lr: "-1" (expected a number > 0)'],
      [
        ["--workers", "-2"],
        'invalid value for --workers: "-2" (expected a whole number >= 0 or auto)',
      ],
    ] as const
  ) {
    const { code, err } = await run("examples/cifar.ts", [...args]);
    assert.strictEqual(code, 2, err);
    assert.strictEqual(err, `error: ${line}; see --help\n`);
  }
  const { code, err } = await run("examples/fashion_mnist.ts", ["--model", "resnet"]);
  assert.strictEqual(code, 2, err);
  assert.match(err, /^error: invalid value for --model: "resnet" \(expected one of mlp, cnn\)/);
});

Deno.test("an example run without permissions says which flag to add and why, in one line", async () => {
  // `deno run examples/cifar.ts` exactly as written, without a terminal to prompt on.
  for (const script of ["examples/cifar.ts", "examples/fashion_mnist.ts"]) {
    const { code, err } = await run(script, ["--epochs", "1"]);
    assert.strictEqual(code, 1, `${script}: ${err}`);
    assert.strictEqual(err.trimEnd().split("\n").length, 1, `${script} printed more:\n${err}`);
    assert.match(
      err,
      /^error: Deno denied (\w+) access.*: run with --allow-\1 \(.+\)\. In a checkout of pinstream, `deno run -P` grants/,
      script,
    );
  }
});

Deno.test("a fresh cache runs an example without fetching anything (no npm package up front)", async () => {
  const cache = await Deno.makeTempDir();
  try {
    const r = await new Deno.Command(Deno.execPath(), {
      args: ["run", new URL("examples/cifar.ts", ROOT).pathname, "--help"],
      env: { NO_COLOR: "1", DENO_DIR: cache },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const err = new TextDecoder().decode(r.stderr);
    assert.strictEqual(r.code, 0, err);
    assert.doesNotMatch(err, /Download/, "the chart library must load only when a chart is drawn");
  } finally {
    await Deno.remove(cache, { recursive: true });
  }
});

Deno.test("the examples' --precision picks the loss scaling default (bf16 refuses it) and --no-fp16 says where it went", () => {
  const parse = (argv: string[]) => parseTrainArgs(argv, "fashion", {});
  assert.deepStrictEqual(
    [parse([]).precision, parse([]).lossScaling],
    ["fp16", true],
  );
  const fp32 = parse(["--precision", "fp32"]);
  assert.deepStrictEqual([fp32.precision, fp32.lossScaling], ["fp32", false]);
  assert.strictEqual(parse(["--precision", "fp32", "--loss-scaling"]).lossScaling, true);
  assert.strictEqual(parse(["--no-loss-scaling"]).lossScaling, false);
  const bf16 = parse(["--precision", "bf16"]);
  assert.deepStrictEqual([bf16.precision, bf16.lossScaling], ["bf16", false]);
  assert.throws(
    () => parse(["--precision", "bf16", "--loss-scaling"]),
    (e: Error) =>
      e instanceof UsageError && /--loss-scaling does not go with --precision bf16/.test(e.message),
  );
  assert.strictEqual(parse(["--precision", "bf16", "--no-loss-scaling"]).lossScaling, false);
  assert.throws(() => parse(["--precision", "fp8"]), /--precision.*fp16, bf16, fp32/);
  assert.throws(
    () => parse(["--no-fp16"]),
    (e: Error) =>
      e instanceof UsageError &&
      e.message === "option --no-fp16 is gone: --no-loss-scaling turns loss scaling off, " +
          "--precision fp32 computes in fp32; see --help",
  );
});

Deno.test("the examples' augmentation flags change the example's default, --no-augment drops it", () => {
  const cifar = (argv: string[]) =>
    parseTrainArgs(argv, "cifar.ts", { augment: { padding: 4, flip: true } }).augment;
  const off = { vflip: false, cutout: 0, brightness: 0, contrast: 0, saturation: 0, hue: 0 };
  assert.deepStrictEqual(cifar([]), { padding: 4, flip: true, ...off });
  assert.strictEqual(cifar(["--no-augment"]), null);
  assert.deepStrictEqual(
    cifar(["--cutout", "8", "--brightness=0.2", "--contrast", "0.3", "--vflip"]),
    { padding: 4, flip: true, ...off, vflip: true, cutout: 8, brightness: 0.2, contrast: 0.3 },
  );
  assert.deepStrictEqual(
    cifar(["--saturation", "0.4", "--hue=0.1"]),
    { padding: 4, flip: true, ...off, saturation: 0.4, hue: 0.1 },
  );
  assert.throws(() => cifar(["--hue", "0.6"]), /hue/);
  // Every augmentation turned off one by one is no augmentation.
  assert.strictEqual(cifar(["--crop-padding", "0", "--no-flip"]), null);
  // An example without a default augmentation: nothing unless asked.
  const plain = (argv: string[]) => parseTrainArgs(argv, "fashion_mnist.ts", {}).augment;
  assert.strictEqual(plain([]), undefined);
  assert.deepStrictEqual(plain(["--flip", "--cutout", "6"]), {
    padding: 0,
    flip: true,
    ...off,
    cutout: 6,
  });
  assert.throws(() => cifar(["--no-augment", "--vflip"]), {
    name: "UsageError",
    message: "option --no-augment contradicts --vflip; leave one out (see --help)",
  });
  assert.throws(() => cifar(["--brightness", "-0.5"]), {
    name: "UsageError",
    message: /invalid value for --brightness: "-0\.5" \(expected a number >= 0\)/,
  });
});
