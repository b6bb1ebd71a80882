/**
 * `deno task bench`: every benchmark of the project in one run, each printing its table and
 * writing bench/results/<name>.json. Pass names to run a subset:
 * `deno task bench transfer loader`.
 *
 * @module
 */

import { parseCli } from "../train/cli.ts";

const BENCHES: Record<string, () => Promise<{ main: (args: string[]) => Promise<unknown> }>> = {
  transfer: () => import("./transfer.ts"),
  loader: () => import("./loader.ts"),
  pipeline: () => import("./pipeline.ts"),
  train: () => import("./train.ts"),
  kernels: () => import("./kernels.ts"),
  precision: () => import("./precision.ts"),
  seed_claims: () => import("./seed_claims.ts"),
};

const cli = parseCli(Deno.args, {
  usage: "deno task bench [NAME...]",
  summary: "Runs every benchmark (or the named ones), each printing its table and writing " +
    "bench/out/<name>.json (bench/results/ with --save).",
  options: {
    save: { kind: "boolean", help: "write to bench/results/ (tracked) instead of bench/out/" },
  },
  positionals: {
    name: "NAME...",
    help: `benchmarks to run (default all): ${Object.keys(BENCHES).join(", ")}`,
    choices: Object.keys(BENCHES),
    noun: "benchmark",
  },
});
const wanted = cli.positionals.length > 0 ? cli.positionals : Object.keys(BENCHES);
for (const name of wanted) {
  const load = BENCHES[name];
  console.log(`\n=== bench: ${name} ===`);
  const { main } = await load();
  // Each benchmark's defaults (its own flags are for running it directly); Deno.args here
  // are benchmark names, which their flag parsers would refuse.
  await main(cli.save ? ["--save"] : []);
}
