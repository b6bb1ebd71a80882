// Tests of nn/checkpoint.ts under faults: a checkpoint is one unit (weights and training state
// bound by hash, SIGKILL during saves never yields a mixed pair), a failed save leaves no
// temporary files, and a refused load changes nothing and names the file and the tensor.
import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import {
  BatchNorm2d,
  Conv2d,
  decodeSafetensors,
  encodeSafetensors,
  Flatten,
  GradScaler,
  Linear,
  loadCheckpoint,
  type Module,
  saveCheckpoint,
  Sequential,
  SGD,
  statePathFor,
  StepLR,
  Xoshiro128,
} from "../nn/mod.ts";

const CHILD = new URL("./_checkpoint_kill_child.ts", import.meta.url).pathname;
const FAULT_CHILD = new URL("./_checkpoint_fault_child.ts", import.meta.url).pathname;

async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

async function listDir(dir: string): Promise<string[]> {
  return (await Array.fromAsync(Deno.readDir(dir), (e) => e.name)).sort();
}

/** A model with every kind of saved entry: conv and linear weights, BN buffers and counter. */
function net(seed: number): Sequential {
  return new Sequential([
    new Conv2d(1, 2, { kernelSize: 3, rng: new Xoshiro128(seed) }),
    new BatchNorm2d(2),
    new Flatten(),
    new Linear(2 * 2 * 2, 3, { rng: new Xoshiro128(seed + 1) }),
  ]);
}

/** The parts of one run: own properties are exactly the checkpoint's parts (dispose is a method). */
class Run {
  constructor(
    readonly model: Module,
    readonly optimizer: SGD,
    readonly scaler: GradScaler,
    readonly scheduler: StepLR,
    readonly rng: Xoshiro128,
  ) {}
  dispose(): void {
    this.scaler.dispose();
    this.optimizer.dispose();
    this.model.dispose();
  }
}

function build(device: Device, seed: number): Run {
  const model = net(seed).to(device);
  const optimizer = new SGD(model.parameters(), { lr: 0.1 * seed, momentum: 0.9 });
  const scaler = new GradScaler(device, { initScale: 2 ** seed });
  const scheduler = new StepLR(optimizer, { stepSize: 1, gamma: 0.5 });
  return new Run(model, optimizer, scaler, scheduler, new Xoshiro128(seed));
}

/** Everything a load could change, as plain values. */
async function snapshot(run: Run): Promise<unknown> {
  const weights = [...await run.model.stateDict()].map(([k, t]) => [k, [...t.data].map(String)]);
  const opt = await run.optimizer.stateDict();
  return {
    weights,
    opt: { ...opt, momentumBuffers: opt.momentumBuffers.map((b) => [...b]) },
    scaler: await run.scaler.stateDict(),
    scheduler: run.scheduler.stateDict(),
    rng: run.rng.getState(),
  };
}

/** Saves run `seed` (its optimizer stepped, so momentum buffers are set) to dir/m.safetensors. */
async function saveRun(device: Device, dir: string, seed: number, epoch: number): Promise<string> {
  const run = build(device, seed);
  for (const p of run.model.parameters()) p.grad.buffer.fill(0);
  run.optimizer.step();
  run.scheduler.step();
  run.rng.nextU32();
  const path = `${dir}/m.safetensors`;
  await saveCheckpoint(path, run, { epoch, step: 10 * epoch });
  run.dispose();
  return path;
}

/** Rewrites a checkpoint's files as a broken writer would, keeping the pair bound by hash. */
async function tamper(
  path: string,
  edit: {
    weights?: (t: Map<string, import("../nn/mod.ts").HostTensor>) => void;
    state?: (
      json: Record<string, unknown>,
      t: Map<string, import("../nn/mod.ts").HostTensor>,
    ) => string | void;
  },
): Promise<void> {
  const w = decodeSafetensors(await Deno.readFile(path));
  edit.weights?.(w.tensors);
  const wBytes = encodeSafetensors(w.tensors, w.metadata);
  await Deno.writeFile(path, wBytes);
  const sp = statePathFor(path);
  const s = decodeSafetensors(await Deno.readFile(sp));
  const json = JSON.parse(s.metadata["pinstream.state"]);
  // Keeps the pair bound (the faults below are in one file, not in the pairing).
  if (json.weights) json.weights.sha256 = await sha256Hex(wBytes);
  const raw = edit.state?.(json, s.tensors) ?? JSON.stringify(json);
  await Deno.writeFile(sp, encodeSafetensors(s.tensors, { "pinstream.state": raw }));
}

Deno.test("loadCheckpoint refuses weights and training state from different saves, naming both files", async () => {
  using device = Device.open("cpu");
  const dir = await Deno.makeTempDir();
  await Deno.mkdir(`${dir}/a`);
  await Deno.mkdir(`${dir}/b`);
  const path = await saveRun(device, `${dir}/a`, 1, 1);
  await saveRun(device, `${dir}/b`, 2, 2);
  // Weights one epoch ahead of the state: what a save killed after its first rename left.
  await Deno.copyFile(`${dir}/b/m.safetensors`, path);
  const target = build(device, 3);
  const before = await snapshot(target);
  await assert.rejects(
    loadCheckpoint(path, target),
    (e: Error) => {
      assert.ok(e instanceof RangeError, String(e));
      assert.match(e.message, new RegExp(escape(path)));
      assert.match(e.message, new RegExp(escape(statePathFor(path))));
      assert.match(e.message, /epoch 2, state for epoch 1/);
      return true;
    },
  );
  // Also when only the model is asked for: the returned epoch would belong to other weights.
  await assert.rejects(loadCheckpoint(path, { model: target.model }), RangeError);
  assert.deepStrictEqual(await snapshot(target), before);
  target.dispose();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("a save interrupted between its two renames loads as the new checkpoint", async () => {
  using device = Device.open("cpu");
  const dir = await Deno.makeTempDir();
  await Deno.mkdir(`${dir}/a`);
  await Deno.mkdir(`${dir}/b`);
  const path = await saveRun(device, `${dir}/a`, 1, 1);
  await saveRun(device, `${dir}/b`, 2, 2);
  // The new weights are in place, the new state is still at its temporary name.
  await Deno.copyFile(`${dir}/b/m.safetensors`, path);
  await Deno.copyFile(`${dir}/b/m.state.safetensors`, `${statePathFor(path)}.tmp`);
  const target = build(device, 3);
  assert.deepStrictEqual(await loadCheckpoint(path, target), { epoch: 2, step: 20 });
  const expected = build(device, 4);
  await loadCheckpoint(`${dir}/b/m.safetensors`, expected);
  assert.deepStrictEqual(await snapshot(target), await snapshot(expected));
  // A partial file at the temporary name (a save killed while writing it) is no candidate.
  await Deno.writeFile(`${statePathFor(path)}.tmp`, new Uint8Array(10));
  await assert.rejects(loadCheckpoint(path, target), /belongs to other weights/);
  target.dispose();
  expected.dispose();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("a failed save leaves no temporary files and names the path", async () => {
  using device = Device.open("cpu");
  using model = new Linear(2, 2).to(device);
  const dir = await Deno.makeTempDir();
  // Into a missing directory.
  const missing = `${dir}/nope/m.safetensors`;
  await assert.rejects(
    saveCheckpoint(missing, { model }),
    (e: Error) => e instanceof Deno.errors.NotFound && e.message.includes(missing),
  );
  assert.deepStrictEqual(await listDir(dir), []);
  // Onto a directory, for the weights and for the training state.
  await Deno.mkdir(`${dir}/m.safetensors`);
  await assert.rejects(
    saveCheckpoint(`${dir}/m.safetensors`, { model }),
    (e: Error) => e instanceof Deno.errors.IsADirectory && e.message.includes("m.safetensors"),
  );
  assert.deepStrictEqual(await listDir(dir), ["m.safetensors"]);
  await Deno.remove(`${dir}/m.safetensors`);
  await saveCheckpoint(`${dir}/m.safetensors`, { model }, { epoch: 1, step: 1 });
  await Deno.remove(`${dir}/m.state.safetensors`);
  await Deno.mkdir(`${dir}/m.state.safetensors`);
  await assert.rejects(
    saveCheckpoint(`${dir}/m.safetensors`, { model }, { epoch: 2, step: 2 }),
    (e: Error) =>
      e instanceof Deno.errors.IsADirectory && e.message.includes("m.state.safetensors"),
  );
  assert.deepStrictEqual(await listDir(dir), ["m.safetensors", "m.state.safetensors"]);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("a checkpoint SIGKILLed during saves always loads as one complete save, never mixed", async () => {
  // Each round starts a process that saves in a loop (save e holds e in every value), kills it
  // at a random moment after its first save, and loads what it left. PINSTREAM_CHECKPOINT_KILLS
  // sets the number of rounds (default 24, about 3 s).
  const rounds = Number(Deno.env.get("PINSTREAM_CHECKPOINT_KILLS") ?? 24);
  using device = Device.open("cpu");
  using model = new Linear(256, 256).to(device);
  using optimizer = new SGD(model.parameters(), { lr: 1 });
  const rng = new Xoshiro128(7);
  const outcomes = { loaded: 0, killedMidSave: 0 };
  const dir = await Deno.makeTempDir();
  const path = `${dir}/m.safetensors`;
  for (let round = 0; round < rounds; round++) {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CHILD, path],
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const reader = child.stdout.getReader();
    await reader.read(); // "saved": the first save completed
    await new Promise((r) => setTimeout(r, rng.random() * 20));
    child.kill("SIGKILL");
    await reader.cancel();
    const status = await child.status;
    assert.strictEqual(status.signal, "SIGKILL", `round ${round}: the saver exited by itself`);
    const pending = (await listDir(dir)).includes("m.state.safetensors.tmp");
    try {
      const p = await loadCheckpoint(path, { model, optimizer });
      const e = p.epoch;
      assert.strictEqual(p.step, e);
      const s = await optimizer.stateDict();
      assert.strictEqual(s.stepsDone, e, `round ${round}: optimizer from another save`);
      for (const [i, param] of model.parameters().entries()) {
        assert.ok((await param.read()).every((v) => v === e), `round ${round}: weights not ${e}`);
        assert.ok(s.momentumBuffers[i].every((v) => v === e), `round ${round}: momentum not ${e}`);
      }
      outcomes.loaded++;
      if (pending) outcomes.killedMidSave++;
    } catch (err) {
      throw new Error(`round ${round}: the checkpoint left by a kill does not load`, {
        cause: err,
      });
    }
  }
  assert.strictEqual(outcomes.loaded, rounds);
  console.log(`${rounds} kills: ${JSON.stringify(outcomes)}`);
  await Deno.remove(dir, { recursive: true });
});

// ---- A refused load changes nothing ----------------------------------------------------

const FAULTS: {
  name: string;
  edit: Parameters<typeof tamper>[1];
  error: (path: string) => RegExp;
}[] = [
  {
    name: "a missing tensor",
    edit: { weights: (t) => void t.delete("3.bias") },
    error: (p) => new RegExp(`${escape(p)}: missing keys \\[3\\.bias\\]`),
  },
  {
    name: "a wrong shape",
    edit: {
      weights: (t) =>
        void t.set("3.weight", { dtype: "F32", shape: [8, 3], data: new Float32Array(24) }),
    },
    error: (p) => new RegExp(`"3\\.weight" from ${escape(p)}: shape \\[8,3\\]`),
  },
  {
    name: "an extra key",
    edit: {
      weights: (t) =>
        void t.set("4.weight", { dtype: "F32", shape: [1], data: new Float32Array(1) }),
    },
    error: (p) => new RegExp(`${escape(p)}: missing keys \\[\\], unexpected keys \\[4\\.weight\\]`),
  },
  {
    name: "a non-integer num_batches_tracked",
    edit: {
      weights: (t) =>
        void t.set("1.num_batches_tracked", {
          dtype: "F32",
          shape: [],
          data: new Float32Array([0.5]),
        }),
    },
    error: (p) => new RegExp(`"1\\.num_batches_tracked" from ${escape(p)}`),
  },
  {
    name: "a momentum buffer of the wrong shape",
    edit: {
      state: (_j, t) =>
        void t.set("optimizer.momentum_buffer.3.bias", {
          dtype: "F32",
          shape: [4],
          data: new Float32Array(4),
        }),
    },
    error: (p) =>
      new RegExp(`"optimizer\\.momentum_buffer\\.3\\.bias" from ${escape(statePathFor(p))}`),
  },
  {
    name: "a missing momentum buffer",
    edit: { state: (_j, t) => void t.delete("optimizer.momentum_buffer.0.weight") },
    error: (p) =>
      new RegExp(
        `${
          escape(statePathFor(p))
        }: missing tensors \\[optimizer\\.momentum_buffer\\.0\\.weight\\]`,
      ),
  },
  {
    name: "a bad optimizer hyper-parameter",
    edit: { state: (j) => void ((j.optimizer as { hyper: { lr: unknown } }).hyper.lr = "fast") },
    error: (p) => new RegExp(`${escape(statePathFor(p))}: optimizer\\.hyper\\.lr is "fast"`),
  },
  {
    name: "a bad scheduler state",
    edit: { state: (j) => void delete (j.scheduler as { lastLr?: number }).lastLr },
    error: (p) => new RegExp(`${escape(statePathFor(p))}: scheduler\\.lastLr`),
  },
  {
    name: "a non-JSON training state",
    edit: { state: () => "{not json" },
    error: (p) =>
      new RegExp(`${escape(statePathFor(p))}: the "pinstream.state" metadata is not JSON`),
  },
];

for (const fault of FAULTS) {
  Deno.test(`a load refused for ${fault.name} names the file and changes nothing`, async () => {
    using device = Device.open("cpu");
    const dir = await Deno.makeTempDir();
    const path = await saveRun(device, dir, 1, 5);
    await tamper(path, fault.edit);
    const target = build(device, 2);
    target.model.namedModules().forEach(([, m]) => {
      if (m instanceof BatchNorm2d) m.numBatchesTracked = 9;
    });
    const before = await snapshot(target);
    await assert.rejects(loadCheckpoint(path, target), (e: Error) => {
      assert.ok(e instanceof RangeError, String(e));
      assert.match(e.message, fault.error(path));
      return true;
    });
    assert.deepStrictEqual(await snapshot(target), before);
    target.dispose();
    await Deno.remove(dir, { recursive: true });
  });
}

Deno.test("an untampered checkpoint does load into the objects the fault tests use", async () => {
  // The control of the tests above: the same load, unbroken, changes every part.
  using device = Device.open("cpu");
  const dir = await Deno.makeTempDir();
  const path = await saveRun(device, dir, 1, 5);
  await tamper(path, {});
  const target = build(device, 2);
  const before = (await snapshot(target)) as Record<string, unknown>;
  const progress = await loadCheckpoint(path, target);
  assert.deepStrictEqual([progress.epoch, progress.step], [5, 50]);
  const after = (await snapshot(target)) as Record<string, unknown>;
  for (const k of Object.keys(before)) assert.notDeepStrictEqual(after[k], before[k], k);
  target.dispose();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("two interrupted saves in a row, at every step of the save protocol, leave the last complete checkpoint loadable", async () => {
  // Save 1 completes; save 2 (after resuming) dies at p1; save 3 (after resuming from what
  // save 2 left) dies at p2. A save is complete once its weights are renamed into place (the
  // commit point), so a kill before the state's rename still counts it. "settle" kills the
  // rename that finishes an earlier interrupted commit, where there is one to finish.
  const points = [
    "weights-write",
    "state-write",
    "settle",
    "weights-rename",
    "state-rename",
    "none",
  ];
  /** Runs one save; whether it completed its commit. */
  const run = async (path: string, epoch: number, killAt: string) => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", FAULT_CHILD, path, String(epoch), killAt],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const died = out.code === 9;
    assert.ok(
      died || out.code === 0,
      `save ${epoch} killed at ${killAt}: ${new TextDecoder().decode(out.stderr)}`,
    );
    assert.ok(died || killAt === "none" || killAt === "settle", `save ${epoch} was not killed`);
    return !died || killAt === "state-rename";
  };
  using device = Device.open("cpu");
  using model = new Linear(8, 8).to(device);
  using optimizer = new SGD(model.parameters(), { lr: 1 });
  const root = await Deno.makeTempDir();
  await Deno.mkdir(`${root}/base`);
  await run(`${root}/base/m.safetensors`, 1, "none");
  for (const p1 of points) {
    const after2 = `${root}/${p1}`;
    await Deno.mkdir(after2);
    for (const f of await listDir(`${root}/base`)) {
      await Deno.copyFile(`${root}/base/${f}`, `${after2}/${f}`);
    }
    const done2 = await run(`${after2}/m.safetensors`, 2, p1);
    for (const p2 of points) {
      const dir = `${root}/${p1}-${p2}`;
      await Deno.mkdir(dir);
      for (const f of await listDir(after2)) await Deno.copyFile(`${after2}/${f}`, `${dir}/${f}`);
      const done3 = await run(`${dir}/m.safetensors`, 3, p2);
      const want = done3 ? 3 : done2 ? 2 : 1;
      const where = `save 2 killed at ${p1}, save 3 at ${p2}`;
      const p = await loadCheckpoint(`${dir}/m.safetensors`, { model, optimizer });
      assert.strictEqual(p.epoch, want, where);
      assert.strictEqual(p.step, want, where);
      const s = await optimizer.stateDict();
      assert.strictEqual(s.stepsDone, want, `${where}: optimizer from another save`);
      for (const [i, param] of model.parameters().entries()) {
        assert.ok((await param.read()).every((v) => v === want), `${where}: weights`);
        assert.ok(s.momentumBuffers[i].every((v) => v === want), `${where}: momentum`);
      }
    }
  }
  await Deno.remove(root, { recursive: true });
});
