/**
 * The training floor, on top of nn/ (the model, the optimizer) and pipeline/ (the batches on
 * the device): the {@linkcode Trainer} step, the throughput doctor ({@linkcode diagnose}), the
 * metrics log ({@linkcode MetricsLog}); and, private to the examples and benchmarks, the fit
 * loop of train/fit.ts (progress, summary, checkpoint and resume, loss curves drawn lazily by
 * train/_chart.ts), its command line (train/args.ts over train/cli.ts) and the reference models
 * (train/models.ts).
 *
 * Scale-out goes beside this floor, in dist/: a process group that plugs into the gradient
 * hook between backward and the optimizer step (see {@linkcode Trainer}), the place where
 * dist/ plugs in, so the fit loop itself does not change.
 *
 * @module
 */

export * from "./trainer.ts";
export * from "./metrics.ts";
export * from "./doctor.ts";
export * from "./tfevents.ts";
