// Child process of tests/loader_failures_test.ts: runs a faulty loader the way a user would
// and returns normally (never Deno.exit), so the parent sees whether the process can end on
// its own once the loader is disposed. Prints one line per step.
import { DataLoader } from "../loader/data_loader.ts";
import { type Fault, FaultyDataset } from "./loader_fixtures.ts";

const fault = Deno.args[0] as Fault;
const ds = new FaultyDataset({ length: fault === "oom" ? 400 : 40, fault, at: 6 });
const loader = new DataLoader(ds, {
  batchSize: 4,
  numWorkers: 2,
  timeout: fault === "spin" ? 0.5 : 0,
  workerResourceLimits: fault === "oom"
    ? { maxOldGenerationSizeMb: 256 }
    : fault === "heapLimit"
    ? { maxOldGenerationSizeMb: 64 }
    : undefined,
});
try {
  for await (const _ of loader) { /* drain */ }
  console.log("no error");
} catch (e) {
  console.log(`error: ${(e as Error).message}`);
}
await loader.dispose();
console.log(`disposed, live workers ${DataLoader.liveWorkers}`);
