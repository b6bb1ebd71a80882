/**
 * `deno task bench`: every benchmark of the project in one run, each printing its table and
 * writing bench/results/<name>.json. Pass names to run a subset:
 * `deno task bench transfer loader`.
 *
 * @module
 */

const BENCHES: Record<string, () => Promise<{ main: (args: string[]) => Promise<unknown> }>> = {
  transfer: () => import("./transfer.ts"),
  loader: () => import("./loader.ts"),
  pipeline: () => import("./pipeline.ts"),
  train: () => import("./train.ts"),
  kernels: () => import("./kernels.ts"),
};

const wanted = Deno.args.length > 0 ? Deno.args : Object.keys(BENCHES);
for (const name of wanted) {
  const load = BENCHES[name];
  if (load === undefined) {
    throw new RangeError(
      `Cannot run benchmark "${name}": known ones are ${Object.keys(BENCHES).join(", ")}`,
    );
  }
  console.log(`\n=== bench: ${name} ===`);
  const { main } = await load();
  // Each benchmark's defaults (its own flags are for running it directly); Deno.args here
  // are benchmark names, which their flag parsers would refuse.
  await main([]);
}
