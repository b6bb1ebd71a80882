import assert from "node:assert";
import { DataLoader, WorkerError } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import type { RingBatch } from "../loader/ring.ts";
import { type Fault, FaultyDataset } from "./loader_fixtures.ts";

function faulty(fault: Fault, at: number, length = 40): FaultyDataset {
  return new FaultyDataset({ length, fault, at });
}

async function drain(loader: DataLoader<unknown>): Promise<number> {
  let n = 0;
  for await (const _ of loader) n++;
  return n;
}

for (const numWorkers of [0, 2]) {
  Deno.test(`DataLoader surfaces a throw in get() naming the sample index with its stack (numWorkers ${numWorkers})`, async () => {
    await using loader = new DataLoader(faulty("throw", 17), { batchSize: 4, numWorkers });
    const err = await drain(loader).then(() => undefined, (e) => e);
    assert.ok(err instanceof WorkerError, String(err));
    assert.strictEqual(err.index, 17);
    assert.match(err.message, /Cannot load sample 17 \(batch 4 of epoch 0\)/);
    assert.match(err.message, /injected failure at 17/);
    assert.match(err.workerStack, /FaultyDataset\.get/);
    assert.match(err.stack!, /injected failure at 17/);
    assert.strictEqual(DataLoader.liveWorkers, 0);
  });
}

Deno.test("DataLoader delivers the batches before a failing one, in order", async () => {
  await using loader = new DataLoader<{ x: Float32Array }>(faulty("throw", 17), {
    batchSize: 4,
    numWorkers: 2,
  });
  const got: number[] = [];
  await assert.rejects(async () => {
    for await (const b of loader) got.push(b.x[0]);
  }, /sample 17/);
  assert.deepStrictEqual(got, [0, 4, 8, 12]);
  // The loader can run again after a failure (fresh workers).
  loader.setEpoch(0);
  await assert.rejects(drain(loader), /sample 17/);
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader turns a worker that calls self.close() into an error", async () => {
  await using loader = new DataLoader(faulty("close", 9), { batchSize: 4, numWorkers: 2 });
  await assert.rejects(
    drain(loader),
    /DataLoader worker \d exited unexpectedly \(the worker called self\.close\(\)\)/,
  );
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader turns a worker that calls Deno.exit() into an error", async () => {
  await using loader = new DataLoader(faulty("exit", 9), { batchSize: 4, numWorkers: 1 });
  await assert.rejects(drain(loader), /exited unexpectedly \(the worker called Deno\.exit\(3\)\)/);
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader turns a worker crash (uncaught error) into an error", async () => {
  await using loader = new DataLoader(faulty("crash", 5), { batchSize: 4, numWorkers: 2 });
  await assert.rejects(drain(loader), /DataLoader worker \d crashed: .*uncaught in worker/);
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader fails a hung worker after timeout instead of hanging", async () => {
  await using loader = new DataLoader(faulty("hang", 6), {
    batchSize: 4,
    numWorkers: 2,
    timeout: 0.5,
  });
  await assert.rejects(
    drain(loader),
    /Cannot get batch 1 of epoch 0: DataLoader timed out after 0\.5 s/,
  );
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader reports a worker that cannot rebuild its dataset", async () => {
  const ds = {
    length: 4,
    get: (i: number) => i,
    workerSpec: () => ({
      module: new URL("./loader_fixtures.ts", import.meta.url).href,
      export: "Nope.fromState",
      state: null,
    }),
  };
  await using loader = new DataLoader(ds, { numWorkers: 1 });
  await assert.rejects(
    drain(loader),
    /Cannot start DataLoader worker 0: TypeError: Cannot resolve Nope\.fromState/,
  );
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader zero-copy path names an out-of-range index from the sampler", async () => {
  const ds = new TensorDataset({ x: new Int32Array(8) });
  for (const numWorkers of [0, 1]) {
    await using loader = new DataLoader<RingBatch>(ds, {
      batchSize: 2,
      numWorkers,
      sampler: { length: 4, indices: () => [0, 1, 2, 99] },
    });
    await assert.rejects(
      drain(loader),
      /Cannot load sample 99 \(batch 1 of epoch 0\).*out of range/,
    );
  }
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("a persistent zero-copy worker keeps serving after a sample error in an epoch left early", async () => {
  const ds = new TensorDataset({ label: Int32Array.from({ length: 16 }, (_, i) => i) });
  // Epoch 0's batch 1 has an out-of-range index; the consumer leaves after batch 0, so
  // nobody sees that error. Epoch 1 is clean and must not wait for a worker that quit.
  const sampler = {
    length: 16,
    indices: (e: number) => Array.from({ length: 16 }, (_, i) => (e === 0 && i === 2 ? 99 : i)),
  };
  await using loader = new DataLoader<RingBatch>(ds, {
    batchSize: 2,
    numWorkers: 1,
    persistentWorkers: true,
    sampler,
    timeout: 20,
  });
  for await (const _ of loader) {
    await new Promise((r) => setTimeout(r, 100)); // the worker reaches the bad batch
    break;
  }
  const labels: number[] = [];
  for await (const b of loader) labels.push(...(b.fields.label as Int32Array));
  assert.deepStrictEqual(labels, Array.from({ length: 16 }, (_, i) => i));
});

for (const path of ["zero-copy", "generic"]) {
  Deno.test(`DataLoader break mid-epoch terminates every worker and frees the ring (${path})`, async () => {
    const ds = new TensorDataset({ x: { data: new Float32Array(400), shape: [4] } });
    await using loader = new DataLoader<unknown>(ds, {
      batchSize: 4,
      numWorkers: 2,
      zeroCopy: path === "zero-copy",
    });
    let n = 0;
    for await (const _ of loader) if (++n === 3) break;
    assert.strictEqual(DataLoader.liveWorkers, 0);
    assert.strictEqual(loader.workers, 0);
    // A throw in the consumer's loop body does the same.
    await assert.rejects(async () => {
      for await (const _ of loader) throw new Error("consumer failed");
    }, /consumer failed/);
    assert.strictEqual(DataLoader.liveWorkers, 0);
    // And the loader still works afterwards: every slot came back.
    assert.strictEqual(await drain(loader), 25);
  });
}

Deno.test("DataLoader dispose mid-epoch stops persistent workers and ends the iterator", async () => {
  const ds = new TensorDataset({ x: { data: new Float32Array(400), shape: [4] } });
  const loader = new DataLoader<RingBatch>(ds, {
    batchSize: 4,
    numWorkers: 2,
    persistentWorkers: true,
  });
  const it = loader[Symbol.asyncIterator]();
  await it.next();
  for await (const _ of loader) break; // persistent: workers stay
  assert.strictEqual(DataLoader.liveWorkers, 2);
  const it2 = loader[Symbol.asyncIterator]();
  await it2.next();
  loader.dispose();
  assert.strictEqual(DataLoader.liveWorkers, 0);
  assert.deepStrictEqual(await it2.next(), { done: true, value: undefined });
  // `it` was stopped by the for-await's newer iterator, not by dispose: that is an error.
  await assert.rejects(it.next(), /a newer iterator/);
});

Deno.test("DataLoader reports a stall with its state when every worker idles and nothing arrives (watchdog)", async () => {
  const ds = new TensorDataset({ x: new Int32Array(4096) });
  await using loader = new DataLoader<RingBatch>(ds, {
    batchSize: 8,
    numWorkers: 2,
    watchdog: 0.5,
  });
  const it = loader[Symbol.asyncIterator]();
  (await it.next()).value!.release();
  // Inject a lost-task fault: workers skip every task from now on (as for an abandoned
  // epoch), so they sit idle holding slots while the consumer waits for its batch.
  const ctl = loader._engine(loader.epoch)._control!;
  Atomics.store(ctl, 6, /* C_SKIP_BELOW */ 2 ** 31 - 1);
  const err = await (async () => {
    for (let k = 0; k < 512; k++) {
      const r = await it.next();
      if (r.done) return undefined;
      r.value.release();
    }
  })().then(() => undefined, (e) => e);
  assert.ok(err instanceof Error, `expected a stall error, got ${err}`);
  assert.match(err.message, /made no progress for \d+\.\d s while every worker was idle/);
  assert.match(err.message, /"state":"waiting for a (task|slot)"/);
  assert.match(err.message, /"due":\d+/);
  await loader.dispose();
  assert.strictEqual(DataLoader.liveWorkers, 0);
});

Deno.test("DataLoader refuses a watchdog that is not a non-negative number of seconds", () => {
  const ds = new TensorDataset({ x: new Int32Array(8) });
  for (const watchdog of [-1, Number.NaN, Infinity, "5" as unknown as number]) {
    assert.throws(
      () => new DataLoader(ds, { watchdog }),
      /Cannot create DataLoader: watchdog option should be a non-negative number of seconds/,
    );
  }
});
