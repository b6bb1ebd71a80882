// A dataset whose workerSpec() state holds what structured clone refuses (Deno.args[0]:
// "function", "symbol", "weakmap" or "nested"), for loader_clone_test.ts: prints the error the
// loader raised, or "no error".
import { DataLoader } from "../loader/mod.ts";
import type { Dataset, WorkerSpec } from "../loader/dataset.ts";

const kind = Deno.args[0];
const bad: Record<string, unknown> = {
  function: { n: 8, transform: (x: number) => x },
  symbol: { n: 8, tag: Symbol("t") },
  weakmap: { n: 8, cache: new WeakMap() },
  nested: { n: 8, parts: [{ ok: new Float32Array(2) }, { hooks: new Map([["a", () => 1]]) }] },
};

class Bad implements Dataset<number> {
  readonly length = 8;
  get(i: number): number {
    return i;
  }
  workerSpec(): WorkerSpec {
    return { module: import.meta.url, export: "make", state: bad[kind] };
  }
}
export function make(): Bad {
  return new Bad();
}

try {
  await using loader = new DataLoader(new Bad(), { batchSize: 4, numWorkers: 1 });
  for await (const _ of loader) { /* nothing */ }
  console.log("no error");
} catch (err) {
  console.log(`error: ${(err as Error).message}`);
}
