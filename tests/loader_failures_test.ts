import assert from "node:assert";
import { DataLoader, WorkerError } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import type { RingBatch } from "../loader/ring.ts";
import { type Fault, FaultyDataset, HeapFillDataset } from "./loader_fixtures.ts";

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

// In a child process: Deno reports a worker's uncaught error on stderr ("error: Uncaught (in
// worker "") ...", with a stack) even when the parent handles the worker's "error" event, so
// in-process this passing test printed a stray error into the suite's output. The child's
// stderr is captured and checked instead.
Deno.test("DataLoader turns a worker crash (uncaught error) into an error", async () => {
  const { code, out, err } = await runChild("crash");
  assert.match(
    out,
    /error: Cannot load batches: DataLoader worker \d crashed: .*uncaught in worker/,
  );
  assert.match(out, /disposed, live workers 0/);
  // The runtime's own report of the crash, which is what must not reach the suite's output.
  assert.match(err, /Uncaught \(in worker ""\) Error: uncaught in worker/);
  assert.strictEqual(code, 0, out + err);
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

/** Runs tests/_loader_fault_child.ts; kills it (and fails) if it does not end within 60 s. */
async function runChild(fault: string): Promise<{ code: number; out: string; err: string }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL("./_loader_fault_child.ts", import.meta.url).pathname, fault],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let killed = false;
  const timer = setTimeout(() => {
    killed = true;
    child.kill("SIGKILL");
  }, 60_000);
  const r = await child.output();
  clearTimeout(timer);
  const err = new TextDecoder().decode(r.stderr);
  const out = new TextDecoder().decode(r.stdout) + err;
  assert.ok(!killed, `the process did not end on its own after dispose():\n${out}`);
  return { code: r.code, out, err };
}

Deno.test("a worker stuck in a JavaScript loop is stopped at the timeout and the process can end", async () => {
  const { code, out } = await runChild("spin");
  assert.match(out, /error: Cannot get batch 1 of epoch 0: DataLoader timed out after 0\.5 s/);
  assert.match(out, /disposed, live workers 0/);
  assert.strictEqual(code, 0, out);
});

Deno.test("a worker that runs out of heap fails the loader, not the process", async () => {
  const { code, out } = await runChild("oom");
  assert.match(out, /error: Cannot load batches: DataLoader worker \d ran out of memory/);
  assert.match(out, /maxOldGenerationSizeMb/);
  assert.match(out, /disposed, live workers 0/);
  assert.strictEqual(code, 0, out);
});

Deno.test("a worker that V8 stops at its heap limit inside one get(), with no timeout, fails the loader and the process can end", async () => {
  const { code, out } = await runChild("heapLimit");
  assert.match(out, /error: Cannot load batches: DataLoader worker \d stopped/);
  assert.match(out, /heap limit/);
  assert.match(out, /disposed, live workers 0/);
  assert.strictEqual(code, 0, out);
});

/** `p`'s outcome (its value or its error), or "still waiting" after `ms`. */
async function within<T>(p: Promise<T>, ms: number): Promise<T | Error | "still waiting"> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"still waiting">((resolve) => {
    timer = setTimeout(() => resolve("still waiting"), ms);
  });
  try {
    return await Promise.race([p.catch((e: Error) => e), late]);
  } finally {
    clearTimeout(timer);
  }
}

// Batch 1 is worker 1's first task (it starts as the worker's set-up ends); with
// prefetchFactor 1, batch 3 reaches worker 1 while it waits idle for a message.
const heapCases = [
  { at: 6, prefetchFactor: 2, batch: 1, persistentWorkers: false },
  { at: 6, prefetchFactor: 2, batch: 1, persistentWorkers: true },
  { at: 14, prefetchFactor: 1, batch: 3, persistentWorkers: true },
];
for (const { at, prefetchFactor, batch, persistentWorkers } of heapCases) {
  Deno.test(`a worker stopped at its heap limit inside a get() is an error naming it, its samples and the limit; the next epoch runs on new workers (batch ${batch}, persistentWorkers ${persistentWorkers})`, async () => {
    await using loader = new DataLoader<{ x: Float32Array }>(faulty("heapLimit", at, 16), {
      batchSize: 4,
      numWorkers: 2,
      prefetchFactor,
      persistentWorkers,
      workerResourceLimits: { maxOldGenerationSizeMb: 64 },
    });
    const err = await within(drain(loader), 30_000);
    assert.ok(err instanceof Error, `the loader did not fail: ${String(err)}`);
    const samples = [0, 1, 2, 3].map((k) => 4 * batch + k).join(", ");
    // Either the worker reports the ended call (get(at)), or it stays silent and idle.
    assert.ok(
      err.message.startsWith(
        `Cannot load batches: DataLoader worker 1 stopped while loading batch ${batch} of ` +
          `epoch 0 (samples ${samples}): `,
      ),
      err.message,
    );
    assert.match(err.message, new RegExp(`get\\(${at}\\)|used no CPU time and answered nothing`));
    assert.match(err.message, /heap limit \(64 MB, workerResourceLimits\.maxOldGenerationSizeMb\)/);
    assert.strictEqual(DataLoader.liveWorkers, 0);
    // The fault fires in epoch 0 only: epoch 1 loads every batch on workers of its own.
    const got: number[] = [];
    for await (const b of loader) got.push(...b.x);
    assert.deepStrictEqual(got, Array.from({ length: 16 }, (_, i) => i));
  });
}

Deno.test("a zero-copy worker stopped at its heap limit inside a fill fails the loader naming its batch; the next epoch runs on new workers", async () => {
  await using loader = new DataLoader(new HeapFillDataset({ length: 16, at: 6 }), {
    batchSize: 4,
    numWorkers: 2,
    persistentWorkers: true,
    workerResourceLimits: { maxOldGenerationSizeMb: 64 },
  });
  const err = await within(drain(loader), 30_000);
  assert.ok(err instanceof Error, `the loader did not fail: ${String(err)}`);
  assert.match(
    err.message,
    /^Cannot load batches: DataLoader worker \d stopped while loading (batch 1 of epoch 0 \(samples 4, 5, 6, 7\): V8 ended its gather|one of the batches in flight \(.*batch 1 of epoch 0 .*\): for [\d.]+ s it used no CPU time)/,
  );
  assert.match(err.message, /heap limit \(64 MB, workerResourceLimits\.maxOldGenerationSizeMb\)/);
  assert.strictEqual(DataLoader.liveWorkers, 0);
  const labels: number[] = [], xs: number[] = [];
  for await (const b of loader) {
    labels.push(...(b.fields.label as Int32Array));
    xs.push(...(b.fields.x as Float32Array));
  }
  const all = Array.from({ length: 16 }, (_, i) => i);
  assert.deepStrictEqual(labels, all);
  assert.deepStrictEqual(xs, all);
});

Deno.test("timeout applies with numWorkers 0: a get() promise that never settles fails the batch", async () => {
  await using loader = new DataLoader(faulty("never", 6), { batchSize: 4, timeout: 0.2 });
  let batches = 0;
  const err = await (async () => {
    for await (const _ of loader) batches++;
  })().then(() => undefined, (e) => e);
  assert.ok(err instanceof Error && err.name === "TimeoutError", String(err));
  assert.match(err.message, /Cannot get batch 1 of epoch 0: DataLoader timed out after 0\.2 s/);
  assert.strictEqual(batches, 1);
});

Deno.test("timeout applies with numWorkers 0: a synchronous get() that overruns fails the batch", async () => {
  await using loader = new DataLoader(faulty("slow", 6), { batchSize: 4, timeout: 0.1 });
  await assert.rejects(
    drain(loader),
    /batch 1 of epoch 0: DataLoader timed out after 0\.1 s.*returned after the deadline/,
  );
});

for (const [fault, shown] of [["throwString", "injected string at 17"], ["throwNull", "null"]]) {
  Deno.test(`a get() that throws a non-Error (${fault}) is reported with the value, with and without workers`, async () => {
    const messages: string[] = [];
    for (const numWorkers of [0, 2]) {
      await using loader = new DataLoader(faulty(fault as Fault, 17), { batchSize: 4, numWorkers });
      const err = await drain(loader).then(() => undefined, (e) => e);
      assert.ok(err instanceof WorkerError, String(err));
      assert.strictEqual(err.index, 17);
      messages.push(err.message.replace(/DataLoader worker \d|the main thread/, "<where>"));
    }
    const want = `Cannot load sample 17 (batch 4 of epoch 0): caught Error in <where>: ${shown}`;
    assert.deepStrictEqual(messages, [want, want]);
  });
}

Deno.test("DataLoader refuses unknown augment keys, naming the key", () => {
  const ds = new TensorDataset({ x: new Int32Array(8) });
  assert.throws(
    () => new DataLoader(ds, { batchSize: 2, augment: { padding: 1, rotate: 15 } as never }),
    /Cannot create DataLoader with augment: unknown option "rotate"; options are padding, flip, vflip, cutout, brightness, contrast, saturation, hue/,
  );
  assert.throws(
    () => new DataLoader(ds, { batchSize: 2, augment: { paddng: 1 } as never }),
    /unknown option "paddng" \(did you mean "padding"\?\)/,
  );
  assert.throws(
    () => new DataLoader(ds, { batchSize: 2, numWorker: 2 } as never),
    /Cannot create DataLoader: unknown option "numWorker" \(did you mean "numWorkers"\?\)/,
  );
});

for (
  const [bad, pattern] of [
    [1.5, /index 1\.5 \(number\) at position 1/],
    [Number.NaN, /index NaN \(number\)/],
    [-1, /index -1 \(number\)/],
    [2 ** 32 + 1, /index 4294967297 \(number\)/],
    ["3", /index "3" \(string\)/],
  ] as const
) {
  for (const numWorkers of [0, 2]) {
    Deno.test(`DataLoader refuses sampler index ${String(bad)} naming it and its batch (numWorkers ${numWorkers})`, async () => {
      const ds = new TensorDataset({ x: new Int32Array(8) });
      for (const zeroCopy of [true, false]) {
        await using loader = new DataLoader(ds, {
          batchSize: 2,
          numWorkers,
          zeroCopy,
          sampler: { length: 4, indices: () => [0, 1, 2, bad as number] },
        });
        await assert.rejects(drain(loader), (e: Error) => {
          assert.match(e.message, /Cannot plan batch 1 of epoch 0: the sampler gave/);
          assert.match(e.message, pattern);
          return true;
        });
      }
    });
  }
}

Deno.test("DataLoader sizes its staging ring by what a batch can hold, not by batchSize", async () => {
  const ds = new TensorDataset({ x: new Int32Array(10) });
  for (const batchSize of [1e6, 1e8]) {
    await using loader = new DataLoader<RingBatch>(ds, { batchSize, numWorkers: 2 });
    assert.strictEqual(loader.ring!.batchSize, 10);
    const sizes = [];
    for await (const b of loader) sizes.push(b.size);
    assert.deepStrictEqual(sizes, [10]);
  }
});

Deno.test("DataLoader refuses a sampler that yields more indices than its length says", async () => {
  const ds = new TensorDataset({ x: new Int32Array(8) });
  await using loader = new DataLoader(ds, {
    batchSize: 100,
    sampler: { length: 2, indices: () => [0, 1, 2, 3] },
  });
  await assert.rejects(
    drain(loader),
    /Cannot plan batch 0 of epoch 0: it has 4 indices, the staging ring holds 2 per batch/,
  );
});

Deno.test("unknown option keys are refused across the public API, naming the key", async () => {
  const { RandomSampler, BatchSampler, SequentialSampler } = await import("../loader/sampler.ts");
  const { SGD } = await import("../nn/optim.ts");
  const { StepLR } = await import("../nn/lr_scheduler.ts");
  const { Device } = await import("../ffi/device.ts");
  assert.throws(
    () => new RandomSampler(10, { replacment: true } as never),
    /Cannot create RandomSampler: unknown option "replacment" \(did you mean "replacement"\?\)/,
  );
  assert.throws(
    () => new BatchSampler(new SequentialSampler(4), { batchSize: 2, drop_last: true } as never),
    /Cannot create BatchSampler: unknown option "drop_last"/,
  );
  assert.throws(
    () => new SGD([], { lr: 0.1, weight_decay: 1e-4 } as never),
    /Cannot create SGD: unknown option "weight_decay"/,
  );
  const opt = { lr: 0.1 };
  assert.throws(
    () => new StepLR(opt, { stepSize: 1, step_size: 2 } as never),
    /Cannot create StepLR: unknown option "step_size"/,
  );
  assert.throws(
    () => Device.open("cpu", { indx: 1 } as never),
    /Cannot open a device: unknown option "indx" \(did you mean "index"\?\)/,
  );
});
