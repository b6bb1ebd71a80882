// Times a one-worker DataLoader's whole life, `--cycles` times: create, one epoch over a small
// TensorDataset (256 samples of 64 floats, batch 32), dispose; and the bare start of a node
// worker against a Web Worker (the module posts one message), each to its first message.
// Worker start-up dominates the cycle. `--root` points at another checkout of the package, to
// compare two versions back to back:
//
//   deno run -A tools/measure_loader_cycle.ts [--cycles=10] [--root=/path/to/checkout]
//   deno run -A tools/measure_loader_cycle.ts --workers-only
//
// Prints milliseconds per cycle (or per worker start). Time each as a whole process, several
// runs interleaved, on a shared machine (see docs/benchmarks.md).

import { Worker as NodeWorker } from "node:worker_threads";

const flag = (name: string, fallback: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
const cycles = Number(flag("cycles", "10"));

async function workerStarts(n: number): Promise<void> {
  const code = "data:text/javascript," +
    encodeURIComponent(
      "import { parentPort } from 'node:worker_threads';" +
        "if (parentPort) parentPort.postMessage(1); else self.postMessage(1);",
    );
  for (const kind of ["web", "node"]) {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) {
      if (kind === "web") {
        const w = new Worker(code, { type: "module" });
        await new Promise((r) => (w.onmessage = r));
        w.terminate();
      } else {
        const w = new NodeWorker(new URL(code), { env: {} });
        await new Promise((r) => w.once("message", r));
        await w.terminate();
      }
    }
    console.log(`${kind} worker: ${((performance.now() - t0) / n).toFixed(1)} ms to first message`);
  }
}

if (Deno.args.includes("--workers-only")) {
  await workerStarts(cycles);
} else {
  const root = new URL(flag("root", new URL("..", import.meta.url).pathname) + "/", "file:///");
  const { DataLoader, TensorDataset } = await import(new URL("loader/mod.ts", root).href);
  const x = new Float32Array(256 * 64);
  const ds = new TensorDataset({ x: { data: x, shape: [64] }, y: new Int32Array(256) });
  const t0 = performance.now();
  for (let c = 0; c < cycles; c++) {
    const loader = new DataLoader(ds, { batchSize: 32, numWorkers: 1 });
    for await (const _ of loader) { /* one epoch */ }
    await loader.dispose();
  }
  console.log(`${((performance.now() - t0) / cycles).toFixed(1)} ms per create-epoch-dispose`);
}
