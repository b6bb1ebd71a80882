// The command line of the training examples (examples/cifar.ts, examples/fashion_mnist.ts,
// examples/imagefolder.ts) and the training benchmarks: the shared options with each example's
// defaults and its own, parsed into TrainArgs for the fit loop (train/fit.ts, which re-exports
// all of it).
//
// Not exported from mod.ts, but small enough to copy into a script.

import { type CliOption, type CliSpec, helpText, parseArgv, UsageError } from "./cli.ts";
import type { AugmentOptions } from "../loader/mod.ts";
import type { Precision } from "../nn/mod.ts";

/** Command-line options shared by the examples. */
export interface TrainArgs {
  data?: string;
  device: "auto" | "cpu" | "cuda";
  epochs: number;
  batchSize: number;
  /** DataLoader workers, or "auto" (tuned between epochs). */
  workers: number | "auto";
  /** Batches in flight per worker, or "auto" (default: the DataLoader's, 2). */
  prefetchFactor?: number | "auto";
  lr: number;
  momentum: number;
  /** Whether a one-cycle schedule may cycle the momentum (false when --momentum was given). */
  cycleMomentum: boolean;
  weightDecay: number;
  /** The model's precision: "fp16" or "bf16" (mixed precision) or "fp32". */
  precision: Precision;
  /** Dynamic loss scaling (GradScaler); default on with fp16, off with bf16 and fp32. */
  lossScaling: boolean;
  /** Record the training step as a CUDA graph on CUDA (Trainer's cudaGraphs; default on). */
  cudaGraphs?: boolean;
  checkpoint?: string;
  /** Where each epoch's metrics go (JSON Lines); default beside the checkpoint. */
  log?: string;
  /** A TensorBoard log directory: scalars per log interval, evaluation and epoch. */
  tensorboard?: string;
  /** Evaluate every N epochs (default 1; the last epoch always is). */
  evalEvery?: number;
  /** Also evaluate every N training steps (default 0: only by epoch). */
  evalEverySteps?: number;
  resume: boolean;
  seed: number;
  model: string;
  limit: number;
  stopAfter: number;
  quiet: boolean;
  /** Data-parallel over the launcher's ranks (train/distributed.ts), --batch-size per rank. */
  distributed?: boolean;
  help: boolean;
  /** The options given on the command line (the others hold defaults). */
  given?: ReadonlySet<string>;
  /** Values of the example's own options (`extra.options`), by name. */
  extra?: Readonly<Record<string, string | number | boolean | undefined>>;
  /**
   * The training loader's augmentation: the example's default (as a default, shown in --help)
   * with the augmentation flags applied; `null` for none (--no-augment, or every flag off);
   * undefined when neither a default nor a flag says anything (the example picks).
   */
  augment?: AugmentOptions | null;
}

/** Defaults an example may change. */
export type TrainDefaults = Partial<TrainArgs>;

/** What an example adds to the shared command line. */
export interface TrainCliExtra {
  /** What the example does, under the usage line of --help. */
  summary?: string;
  /** Help of --data (default "data set directory"). */
  dataHelp?: string;
  /** Help of --model; the accepted names (default: only the default model). */
  models?: { help: string; choices: readonly string[] };
  /** Help of --checkpoint (default: no checkpoint unless given). */
  checkpointHelp?: string;
  /** The example's own options (returned in `TrainArgs.extra`). */
  options?: Readonly<Record<string, CliOption>>;
  /** Text after the options in --help. */
  epilog?: string;
}

/**
 * The command line of a training example: the shared options with the example's defaults,
 * then its own.
 *
 * @param name The example's file name, for the usage line.
 * @param d The defaults.
 * @param extra What the example adds.
 * @returns The spec for {@linkcode parseArgv}.
 */
export function trainSpec(name: string, d: TrainArgs, extra: TrainCliExtra = {}): CliSpec {
  const options: Record<string, CliOption> = {
    data: {
      kind: "string",
      metavar: "DIR",
      help: extra.dataHelp ?? "data set directory",
      default: d.data,
    },
    device: {
      kind: "string",
      choices: ["auto", "cpu", "cuda"],
      help: "where to train; auto falls back to cpu",
      default: d.device,
    },
    epochs: { kind: "int", min: 1, help: "epochs", default: d.epochs },
    "batch-size": { kind: "int", min: 1, help: "batch size", default: d.batchSize },
    workers: {
      kind: "int",
      min: 0,
      auto: true,
      help: "DataLoader workers; auto: tuned between epochs by measured speed",
      default: d.workers,
    },
    "prefetch-factor": {
      kind: "int",
      min: 1,
      auto: true,
      help: "batches in flight per worker (default 2); auto: tuned between epochs",
      ...(d.prefetchFactor === undefined ? {} : { default: d.prefetchFactor }),
    },
    lr: { kind: "number", min: 0, exclusiveMin: true, help: "peak learning rate", default: d.lr },
    momentum: {
      kind: "number",
      min: 0,
      max: 1,
      help: "SGD momentum (default: cycled 0.95 -> 0.85 -> 0.95 by the one-cycle\n" +
        "schedule; a given value is kept constant)",
    },
    "weight-decay": { kind: "number", min: 0, help: "SGD weight decay", default: d.weightDecay },
    precision: {
      kind: "string",
      choices: ["fp16", "bf16", "fp32"],
      help: "fp16: mixed precision (fp16 activations, fp32 accumulation and master\n" +
        "weights, dynamic loss scaling); bf16: the same in bfloat16, without loss\n" +
        "scaling; fp32: everything in fp32",
      default: d.precision,
    },
    "loss-scaling": {
      kind: "boolean",
      help: "dynamic loss scaling (default: on with fp16, off with fp32; bf16 refuses it)",
    },
    "cuda-graphs": {
      kind: "boolean",
      help: "on CUDA, record the training step as a CUDA graph and replay it (default on)",
    },
    model: {
      kind: "string",
      choices: extra.models?.choices ?? [d.model],
      help: extra.models?.help ?? "the model",
      default: d.model,
    },
    checkpoint: {
      kind: "string",
      metavar: "PATH",
      help: extra.checkpointHelp ??
        "save weights (safetensors) + training state after every epoch",
    },
    resume: {
      kind: "boolean",
      help: "continue from --checkpoint (same next step as an\n" +
        "uninterrupted run)",
    },
    limit: { kind: "int", min: 0, help: "use only the first N training samples (quick runs)" },
    "stop-after": {
      kind: "int",
      min: 0,
      help: "stop after epoch N of --epochs (simulates an interruption; the\n" +
        "schedule still spans --epochs, so --resume continues it exactly)",
    },
    seed: { kind: "int", min: 0, help: "seed of initialization and data order", default: d.seed },
    quiet: { kind: "boolean", help: "no progress bar" },
    distributed: { kind: "boolean", help: "data-parallel over mpirun's ranks, batch per rank" },
    log: {
      kind: "string",
      metavar: "PATH",
      help: "append each epoch's metrics to PATH (JSON Lines) and draw their\n" +
        "curves to PATH.svg (default: beside the checkpoint)",
    },
    tensorboard: {
      kind: "string",
      metavar: "DIR",
      help: "also write TensorBoard event files to DIR: training loss, accuracy and\n" +
        "learning rate per log interval, test metrics per evaluation",
    },
    "eval-every": {
      kind: "int",
      min: 1,
      metavar: "N",
      help: "evaluate on the test set every N epochs (the last epoch always is)",
      default: d.evalEvery ?? 1,
    },
    "eval-every-steps": {
      kind: "int",
      min: 0,
      metavar: "N",
      help: "also evaluate every N training steps, within epochs (0: off)",
      default: d.evalEverySteps ?? 0,
    },
    augment: {
      kind: "boolean",
      default: true,
      help: "train without augmentation: none of the augmentations below,\n" +
        "whatever the example's default",
    },
    "crop-padding": {
      kind: "int",
      min: 0,
      metavar: "N",
      help: "random crop from the image zero-padded by N pixels",
      default: d.augment?.padding ?? 0,
    },
    // A boolean that defaults to true is shown as --no-<flag>: its help says what that does.
    flip: {
      kind: "boolean",
      help: d.augment?.flip ? "no random horizontal flips" : "random horizontal flips",
      default: d.augment?.flip ?? false,
    },
    vflip: {
      kind: "boolean",
      help: d.augment?.vflip ? "no random vertical flips" : "random vertical flips",
      default: d.augment?.vflip ?? false,
    },
    cutout: {
      kind: "int",
      min: 0,
      metavar: "N",
      help: "cut out a random N x N square of each image (0: off)",
      default: d.augment?.cutout ?? 0,
    },
    brightness: {
      kind: "number",
      min: 0,
      metavar: "J",
      help: "brightness jitter: factors in [max(0, 1 - J), 1 + J]",
      default: d.augment?.brightness ?? 0,
    },
    contrast: {
      kind: "number",
      min: 0,
      metavar: "J",
      help: "contrast jitter toward each image's mean grey:\nfactors in [max(0, 1 - J), 1 + J]",
      default: d.augment?.contrast ?? 0,
    },
    saturation: {
      kind: "number",
      min: 0,
      metavar: "J",
      help: "saturation jitter: factors in [max(0, 1 - J), 1 + J]",
      default: d.augment?.saturation ?? 0,
    },
    hue: {
      kind: "number",
      min: 0,
      max: 0.5,
      metavar: "H",
      help: "hue jitter: shifts in [-H, H] turns (H <= 0.5)",
      default: d.augment?.hue ?? 0,
    },
    ...extra.options,
  };
  return {
    usage: `deno run -A examples/${name} [options]`,
    summary: extra.summary,
    options,
    epilog: extra.epilog,
  };
}

/**
 * Parses the shared options (and the example's own). Reads nothing but `argv`: --help needs
 * no permission.
 *
 * @param argv Command-line arguments.
 * @param name The example's file name, for --help.
 * @param defaults Example-specific defaults.
 * @param extra The example's own options and help text.
 * @returns The options; prints the help and exits 0 on --help.
 * @throws {UsageError} For an unknown option or a bad value (naming the option and what it
 *   takes); `runMain` prints it as one line and exits 2.
 */
export function parseTrainArgs(
  argv: string[],
  name: string,
  defaults: TrainDefaults,
  extra: TrainCliExtra = {},
): TrainArgs {
  const d: TrainArgs = {
    device: "auto",
    epochs: 5,
    batchSize: 128,
    workers: 2,
    lr: 0.05,
    momentum: 0.9,
    cycleMomentum: true,
    weightDecay: 0,
    precision: "fp16",
    lossScaling: true,
    cudaGraphs: true,
    resume: false,
    seed: 0,
    model: "cnn",
    limit: 0,
    stopAfter: 0,
    quiet: false,
    distributed: false,
    help: false,
    ...defaults,
  };
  const spec = trainSpec(name, d, extra);
  // Before the fp32 path, --no-fp16 turned loss scaling off (the kernels computed in fp16
  // either way): say where it went rather than only that it is unknown.
  const renamed = argv.find((a) => /^--(no-)?fp16(=|$)/.test(a));
  if (renamed !== undefined) {
    throw new UsageError(
      `option ${renamed.replace(/=.*/, "")} is gone: --no-loss-scaling turns loss scaling off, ` +
        `--precision fp32 computes in fp32; see --help`,
    );
  }
  const v = parseArgv(argv, spec);
  if (v === "help") {
    console.log(helpText(spec));
    Deno.exit(0);
  }
  const get = <T>(k: string, dflt: T): T => (v[k] as T | undefined) ?? dflt;
  const precision = get("precision", d.precision) as Precision;
  if (precision === "bf16" && v["loss-scaling"] === true) {
    throw new UsageError(
      "option --loss-scaling does not go with --precision bf16: bf16 has fp32's range and " +
        "trains without loss scaling; see --help",
    );
  }
  const own: Record<string, string | number | boolean | undefined> = {};
  for (const k of Object.keys(extra.options ?? {})) own[k] = v[k] as typeof own[string];
  if (v.given.has("prefetch-factor") && get("workers", d.workers) === 0) {
    throw new UsageError(
      "option --prefetch-factor needs workers (prefetching is what workers do); " +
        "drop it or pass --workers N or --workers auto; see --help",
    );
  }
  const args: TrainArgs = {
    data: get("data", d.data),
    device: get("device", d.device),
    epochs: get("epochs", d.epochs),
    batchSize: get("batch-size", d.batchSize),
    workers: get("workers", d.workers),
    prefetchFactor: get("prefetch-factor", d.prefetchFactor),
    lr: get("lr", d.lr),
    momentum: get("momentum", d.momentum),
    cycleMomentum: !v.given.has("momentum"),
    weightDecay: get("weight-decay", d.weightDecay),
    precision,
    // On by default with fp16 (unless an example's defaults turn it off), off with fp32.
    lossScaling: get<boolean>("loss-scaling", precision === "fp16" && d.lossScaling),
    cudaGraphs: get<boolean>("cuda-graphs", d.cudaGraphs ?? true),
    model: get("model", d.model),
    checkpoint: get("checkpoint", d.checkpoint),
    resume: get("resume", false),
    limit: get("limit", d.limit),
    stopAfter: get("stop-after", d.stopAfter),
    seed: get("seed", d.seed),
    quiet: get("quiet", d.quiet),
    distributed: get("distributed", d.distributed),
    log: get("log", d.log),
    tensorboard: get("tensorboard", d.tensorboard),
    evalEvery: get("eval-every", d.evalEvery ?? 1),
    evalEverySteps: get("eval-every-steps", d.evalEverySteps ?? 0),
    help: false,
    given: v.given,
    extra: own,
    augment: augmentArgs(v, d.augment),
  };
  return args;
}

/** The precision and loss scaling of a run, for its first line ("fp16 with loss scaling"). */
export function precisionLine(args: TrainArgs): string {
  return `${args.precision} ${args.lossScaling ? "with" : "without"} loss scaling`;
}

/** The augmentation flags, in the order --help lists them. */
const AUGMENT_FLAGS = [
  "crop-padding",
  "flip",
  "vflip",
  "cutout",
  "brightness",
  "contrast",
  "saturation",
  "hue",
];

/**
 * The training augmentation from the parsed flags over the example's default: null for none,
 * undefined when neither says anything.
 */
function augmentArgs(
  v: Record<string, unknown> & { given: ReadonlySet<string> },
  dflt: AugmentOptions | null | undefined,
): AugmentOptions | null | undefined {
  const flags = AUGMENT_FLAGS.filter((k) => v.given.has(k));
  if (v.augment === false) {
    if (flags.length > 0) {
      throw new UsageError(
        `option --no-augment contradicts --${flags[0]}; leave one out (see --help)`,
      );
    }
    return null;
  }
  if (flags.length === 0 && !dflt) return dflt;
  const a: Required<AugmentOptions> = {
    padding: (v["crop-padding"] as number | undefined) ?? dflt?.padding ?? 0,
    flip: (v.flip as boolean | undefined) ?? dflt?.flip ?? false,
    vflip: (v.vflip as boolean | undefined) ?? dflt?.vflip ?? false,
    cutout: (v.cutout as number | undefined) ?? dflt?.cutout ?? 0,
    brightness: (v.brightness as number | undefined) ?? dflt?.brightness ?? 0,
    contrast: (v.contrast as number | undefined) ?? dflt?.contrast ?? 0,
    saturation: (v.saturation as number | undefined) ?? dflt?.saturation ?? 0,
    hue: (v.hue as number | undefined) ?? dflt?.hue ?? 0,
  };
  const on = a.padding > 0 || a.flip || a.vflip || a.cutout > 0 || a.brightness > 0 ||
    a.contrast > 0 || a.saturation > 0 || a.hue > 0;
  return on ? a : null;
}

/**
 * One line describing a training augmentation, for the examples' start-up line.
 *
 * @param a The augmentation (null or undefined: none).
 * @returns e.g. "augment crop 4 + flip + cutout 8", or "no augmentation".
 */
export function augmentNote(a: AugmentOptions | null | undefined): string {
  if (!a) return "no augmentation";
  const parts = [
    a.padding ? `crop ${a.padding}` : "",
    a.flip ? "flip" : "",
    a.vflip ? "vflip" : "",
    a.cutout ? `cutout ${a.cutout}` : "",
    a.brightness ? `brightness ${a.brightness}` : "",
    a.contrast ? `contrast ${a.contrast}` : "",
    a.saturation ? `saturation ${a.saturation}` : "",
    a.hue ? `hue ${a.hue}` : "",
  ].filter((x) => x !== "");
  return parts.length > 0 ? `augment ${parts.join(" + ")}` : "no augmentation";
}
