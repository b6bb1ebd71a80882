// TensorBoard event files (train/tfevents.ts, MetricsLog's `tensorboard`): decoded by an
// independent reader in plain Python (tests/_read_tfevents.py: its own CRC32C table and
// protocol buffer parser) that checks every record's checksums; by TensorBoard's own reader
// too where the `tensorboard` package is installed.

import assert from "node:assert";
import { MetricsLog } from "../train/metrics.ts";
import { maskedCrc32c, TensorBoardWriter } from "../train/tfevents.ts";

const READER = new URL("./_read_tfevents.py", import.meta.url).pathname;

function python(): string | undefined {
  for (const py of ["/usr/bin/python3", "python3"]) {
    try {
      if (new Deno.Command(py, { args: ["-c", "pass"] }).outputSync().success) return py;
    } catch { /* not there */ }
  }
  return undefined;
}

const PY = python();
if (PY === undefined) console.warn("tfevents_test: no python3, the independent reader is skipped");

interface Event {
  wall_time: number;
  step: number;
  file_version?: string;
  summary?: { tag: string; simple_value: number | "NaN" }[];
  other_fields?: number[];
}

async function readEvents(path: string): Promise<{ ok: boolean; events: Event[]; err: string }> {
  const out = await new Deno.Command(PY!, { args: [READER, path] }).output();
  const err = new TextDecoder().decode(out.stderr);
  if (!out.success) return { ok: false, events: [], err };
  return { ok: true, events: JSON.parse(new TextDecoder().decode(out.stdout))[0].events, err };
}

function files(dir: string): string[] {
  return [...Deno.readDirSync(dir)].map((e) => `${dir}/${e.name}`).sort();
}

Deno.test("CRC32C matches the Castagnoli check value, masked as the record format stores it", () => {
  const crc = 0xe3069283; // CRC32C of "123456789"
  const masked = ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
  assert.strictEqual(maskedCrc32c(new TextEncoder().encode("123456789")), masked);
  assert.notStrictEqual(maskedCrc32c(new TextEncoder().encode("123456788")), masked);
});

Deno.test({
  name: "scalars written by TensorBoardWriter decode with the independent reader",
  ignore: PY === undefined,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const t0 = Date.now() / 1000;
      {
        using tb = TensorBoardWriter.open(dir);
        assert.match(tb.path, /\/events\.out\.tfevents\.\d{10}\.[^/]+$/);
        tb.addScalar("train/loss", 2.5, 0);
        tb.addScalars({ "train/loss": 1.25, "train/accuracy": 0.375 }, 300);
        tb.addScalar("big/step", -0.5, 2 ** 40 + 3, 1234.5);
        tb.addScalar("diverged", NaN, 301);
        assert.throws(() => tb.addScalar("x", 1, -1), /step must be a whole number >= 0/);
        assert.throws(() => tb.addScalar("x", 1, 1.5), /step must be a whole number >= 0/);
      }
      const [path] = files(dir);
      const r = await readEvents(path);
      assert.ok(r.ok, r.err);
      const ev = r.events;
      assert.strictEqual(ev.length, 5);
      assert.strictEqual(ev[0].file_version, "brain.Event:2");
      assert.ok(Math.abs(ev[0].wall_time - t0) < 60);
      assert.deepStrictEqual(ev.slice(1).map((e) => e.step), [0, 300, 2 ** 40 + 3, 301]);
      assert.deepStrictEqual(ev[1].summary, [{ tag: "train/loss", simple_value: 2.5 }]);
      assert.deepStrictEqual(ev[2].summary, [
        { tag: "train/loss", simple_value: 1.25 },
        { tag: "train/accuracy", simple_value: 0.375 },
      ]);
      assert.strictEqual(ev[3].wall_time, 1234.5);
      assert.deepStrictEqual(ev[3].summary, [{ tag: "big/step", simple_value: -0.5 }]);
      assert.deepStrictEqual(ev[4].summary, [{ tag: "diverged", simple_value: "NaN" }]);
      assert.ok(ev.every((e) => e.other_fields === undefined));

      // The reader is not a rubber stamp: one flipped byte fails a checksum.
      const bytes = await Deno.readFile(path);
      bytes[bytes.length - 10] ^= 0x01;
      await Deno.writeFile(path, bytes);
      const bad = await readEvents(path);
      assert.ok(!bad.ok);
      assert.match(bad.err, /bad data checksum/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "MetricsLog with tensorboard writes each record's numbers and the points between",
  ignore: PY === undefined,
  async fn() {
    const dir = await Deno.makeTempDir();
    const path = `${dir}/run.jsonl`;
    try {
      {
        using log = await MetricsLog.open(path, { tensorboard: `${dir}/tb` });
        log.addScalars({ "train/loss": 2 }, 10);
        await log.append({ epoch: 1, step: 20, trainLoss: 1.5, data: "x", ok: true });
        await log.append({ epoch: 2, testAcc: 0.75 });
      }
      {
        // Without tensorboard, addScalars is a no-op and nothing else changes.
        using plain = await MetricsLog.open(`${dir}/plain.jsonl`);
        plain.addScalars({ "train/loss": 2 }, 10);
        assert.strictEqual(plain.tensorboard, undefined);
      }
      assert.strictEqual((await MetricsLog.read(path)).length, 2, "the JSON Lines are unchanged");
      const tbFiles = files(`${dir}/tb`);
      assert.strictEqual(tbFiles.length, 1);
      const r = await readEvents(tbFiles[0]);
      assert.ok(r.ok, r.err);
      const points = r.events.slice(1).map((e) => ({ step: e.step, summary: e.summary }));
      assert.deepStrictEqual(points, [
        { step: 10, summary: [{ tag: "train/loss", simple_value: 2 }] },
        { step: 20, summary: [{ tag: "trainLoss", simple_value: 1.5 }] },
        { step: 2, summary: [{ tag: "testAcc", simple_value: 0.75 }] },
      ]);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("two writers opened in the same second get files of their own", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const a = TensorBoardWriter.open(dir);
    const b = TensorBoardWriter.open(dir);
    a.dispose();
    b.dispose();
    assert.notStrictEqual(a.path, b.path);
    assert.strictEqual(files(dir).length, 2);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the writer and the log's tensorboard option refuse typos", async () => {
  const dir = await Deno.makeTempDir();
  try {
    assert.throws(
      () => TensorBoardWriter.open(dir, { filenameSufix: "x" } as never),
      /Cannot open the TensorBoard writer: unknown option "filenameSufix" \(did you mean "filenameSuffix"\?\)/,
    );
    await assert.rejects(
      () => MetricsLog.open(`${dir}/a.jsonl`, { tensorbord: dir } as never),
      /unknown option "tensorbord" \(did you mean "tensorboard"\?\)/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "TensorBoard's own reader loads the scalars (where the tensorboard package is installed)",
  ignore: PY === undefined ||
    !new Deno.Command(PY, { args: ["-c", "import tensorboard"], stderr: "null" }).outputSync()
      .success,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      {
        using tb = TensorBoardWriter.open(dir);
        tb.addScalar("train/loss", 0.5, 7);
      }
      const script = "import sys\n" +
        "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n" +
        "a = EventAccumulator(sys.argv[1]); a.Reload()\n" +
        "print([(s.step, s.value) for s in a.Scalars('train/loss')])\n";
      const out = await new Deno.Command(PY!, { args: ["-c", script, dir] }).output();
      assert.ok(out.success, new TextDecoder().decode(out.stderr));
      assert.strictEqual(new TextDecoder().decode(out.stdout).trim(), "[(7, 0.5)]");
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
