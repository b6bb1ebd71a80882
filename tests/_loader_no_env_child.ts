// A DataLoader with workers in a process that holds only read permission (no env, no prompt),
// for loader_failures_test.ts: prints the batch count, or fails with the error.
import { DataLoader, TensorDataset } from "../loader/mod.ts";

const dataset = new TensorDataset({ x: new Float32Array(64), y: new Int32Array(64) });
await using loader = new DataLoader(dataset, { batchSize: 8, numWorkers: 2 });
let batches = 0;
for await (const _ of loader) batches++;
console.log(`batches ${batches}`);
