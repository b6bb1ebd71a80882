/**
 * Child of tests/emu_streams_test.ts: host code that orders its device work correctly, or skips
 * one of its waits (`--skip`), run on the CUDA emulator in the stream mode the parent chose
 * (`PINSTREAM_EMU_STREAMS`). Prints one JSON line: `{ "wrong": <bytes or batches that differ> }`.
 *
 *     deno run -A tests/_stream_order_child.ts <case> [--skip]
 *
 * Cases:
 * - `wait-event`: a copy stream fills a device buffer and records an event; the compute stream
 *   waits for it (`--skip`: does not), copies the buffer on and reads it back.
 * - `pinned-reuse`: a copy out of a pinned buffer; the host waits for its event before it
 *   overwrites the buffer with the next batch (`--skip`: overwrites at once).
 * - `read-early`: a copy from the device into pinned memory, read after the stream is
 *   synchronized (`--skip`: read at once).
 * - `prefetcher`: the real DevicePrefetcher over random CIFAR-shaped data, every batch checked
 *   against the TypeScript reference (`--skip`: `Stream.waitEvent` does nothing, as if the
 *   prefetcher forgot every cross-stream wait).
 * - `any-batch`: the any-batch prefetcher over collated audio, label and mask batches, two
 *   slots reused all epoch long, every tensor checked byte for byte against the host batch
 *   (`--skip`: `Stream.waitEvent` does nothing).
 * - `any-batch-reuse`: the same, the consumer queuing a device copy of every tensor on the
 *   compute stream and reading them all only at the epoch's end, so a slot is refilled while
 *   that work may still be queued (`--skip`: the copy stream's wait for the consumer's step is
 *   taken out, the compute stream's wait for the copy stays).
 *
 * @module
 */

import { Device } from "../ffi/device.ts";
import { DeviceBuffer, HostBuffer } from "../ffi/memory.ts";
import { Event, Stream } from "../ffi/stream.ts";
import { toDevice } from "../pipeline/prefetcher.ts";
import { DataLoader } from "../loader/data_loader.ts";
import { AudioDataset } from "./batch_fixtures.ts";
import { bitDiff } from "./_image_reference.ts";
import {
  expectedBatch,
  makeData,
  makeLoader,
  MEAN,
  plainBatches,
  readBatch,
  STD,
} from "./pipeline_fixtures.ts";

const BYTES = 1 << 16;

function pattern(seed: number): Uint8Array {
  const out = new Uint8Array(BYTES);
  for (let i = 0; i < BYTES; i++) out[i] = (i * 31 + seed * 7 + (i >> 8)) & 0xff;
  return out;
}

function differing(a: Uint8Array, b: Uint8Array): number {
  let n = 0;
  for (let i = 0; i < a.length; i++) n += a[i] !== b[i] ? 1 : 0;
  return n;
}

async function waitEvent(dev: Device, skip: boolean): Promise<number> {
  using copy = new Stream(dev), compute = new Stream(dev), done = new Event(dev);
  using src = HostBuffer.alloc(dev, BYTES), dst = HostBuffer.alloc(dev, BYTES);
  using a = DeviceBuffer.alloc(dev, BYTES), b = DeviceBuffer.alloc(dev, BYTES);
  const want = pattern(1);
  src.u8.set(want);
  a.copyFrom(src, { stream: copy });
  done.record(copy);
  if (!skip) compute.waitEvent(done);
  b.copyFrom(a, { stream: compute });
  b.copyTo(dst, { stream: compute });
  await compute.synchronize();
  const wrong = differing(dst.u8, want);
  await copy.synchronize();
  return wrong;
}

async function pinnedReuse(dev: Device, skip: boolean): Promise<number> {
  using copy = new Stream(dev), done = new Event(dev);
  using src = HostBuffer.alloc(dev, BYTES), dst = HostBuffer.alloc(dev, BYTES);
  using a = DeviceBuffer.alloc(dev, BYTES);
  const first = pattern(2);
  src.u8.set(first);
  a.copyFrom(src, { stream: copy });
  done.record(copy);
  if (!skip) await done.synchronize();
  src.u8.set(pattern(3)); // the next batch goes into the same pinned slot
  a.copyTo(dst, { stream: copy });
  await copy.synchronize();
  return differing(dst.u8, first);
}

async function readEarly(dev: Device, skip: boolean): Promise<number> {
  using s = new Stream(dev);
  using src = HostBuffer.alloc(dev, BYTES), dst = HostBuffer.alloc(dev, BYTES);
  using a = DeviceBuffer.alloc(dev, BYTES);
  const want = pattern(4);
  src.u8.set(want);
  dst.u8.fill(0);
  a.copyFrom(src, { stream: s });
  a.copyTo(dst, { stream: s });
  if (!skip) await s.synchronize();
  const wrong = differing(dst.u8, want);
  await s.synchronize();
  return wrong;
}

async function prefetcher(dev: Device, skip: boolean): Promise<number> {
  if (skip) Stream.prototype.waitEvent = function () {};
  const d = makeData(75, [3, 32, 32], 7);
  const expected = await plainBatches(d, {});
  await using loader = makeLoader(d, { numWorkers: 0, heldBatches: 8 });
  await using p = toDevice(loader, dev, { dtype: "f16", mean: MEAN, std: STD, depth: 2 });
  // The references first: the loop below keeps the host busy with the device, as a training
  // loop does, so a copy the host never waits for is still pending when the kernel runs.
  const wants = expected.map((e) => expectedBatch(d, e.indices, e.params, "nchw", "f16", 4));
  let k = 0, wrong = 0;
  for await (const b of p) {
    const got = await readBatch(b);
    if (bitDiff(got.images, wants[k].images).length > 0) wrong++;
    k++;
  }
  return wrong;
}

async function anyBatch(dev: Device, skip: boolean): Promise<number> {
  if (skip) Stream.prototype.waitEvent = function () {};
  const make = () =>
    new DataLoader(new AudioDataset(45, 5), {
      batchSize: 4,
      shuffle: true,
      seed: 2,
      collate: {
        module: new URL("./batch_fixtures.ts", import.meta.url).href,
        export: "audioCollate",
      },
      numWorkers: 1,
    });
  const wants: Uint8Array[][] = [];
  {
    await using plain = make();
    for await (const b of plain) {
      const o = b as Record<string, ArrayBufferView>;
      wants.push(["audio", "label", "mask"].map((k) => bytes(o[k]).slice()));
    }
  }
  await using loader = make();
  await using p = toDevice(loader, dev, { batch: "any", depth: 1 });
  let k = 0, wrong = 0;
  for await (const b of p) {
    const o = b as Record<string, { toHost(): Promise<ArrayBufferView> }>;
    const got = await Promise.all(["audio", "label", "mask"].map((f) => o[f].toHost()));
    if (got.some((g, i) => differing(bytes(g), wants[k][i]) > 0)) wrong++;
    k++;
  }
  return wrong;
}

async function anyBatchReuse(dev: Device, skip: boolean): Promise<number> {
  if (skip) {
    const wait = Stream.prototype.waitEvent;
    Stream.prototype.waitEvent = function (this: Stream, e: Event) {
      if (this === dev.defaultStream) wait.call(this, e);
    };
  }
  const make = () =>
    new DataLoader(new AudioDataset(45, 6), {
      batchSize: 4,
      collate: {
        module: new URL("./batch_fixtures.ts", import.meta.url).href,
        export: "audioCollate",
      },
    });
  const wants: Uint8Array[] = [];
  {
    await using plain = make();
    for await (const b of plain) wants.push(bytes((b as { audio: Float32Array }).audio).slice());
  }
  await using loader = make();
  await using p = toDevice(loader, dev, { batch: "any", depth: 1 });
  const copies: DeviceBuffer[] = [];
  try {
    for await (const b of p) {
      const audio = (b as { audio: { buffer: DeviceBuffer } }).audio.buffer;
      const c = DeviceBuffer.alloc(dev, audio.bytes);
      copies.push(c);
      // The consumer's step: device work on the batch, on the compute stream, not waited for.
      c.copyFrom(audio, { stream: dev.defaultStream });
    }
    await dev.defaultStream.synchronize();
    let wrong = 0;
    for (let k = 0; k < copies.length; k++) {
      const host = new Uint8Array(copies[k].bytes);
      copies[k].copyTo(host, { stream: dev.defaultStream });
      await dev.defaultStream.synchronize();
      if (differing(host, wants[k]) > 0) wrong++;
    }
    return wrong;
  } finally {
    for (const c of copies) c.dispose();
  }
}

function bytes(v: ArrayBufferView): Uint8Array {
  return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
}

const CASES: Record<string, (dev: Device, skip: boolean) => Promise<number>> = {
  "wait-event": waitEvent,
  "pinned-reuse": pinnedReuse,
  "read-early": readEarly,
  prefetcher,
  "any-batch": anyBatch,
  "any-batch-reuse": anyBatchReuse,
};

if (import.meta.main) {
  const [name, flag] = Deno.args;
  const run = CASES[name];
  if (run === undefined || (flag !== undefined && flag !== "--skip")) {
    console.error(`usage: _stream_order_child.ts <${Object.keys(CASES).join("|")}> [--skip]`);
    Deno.exit(2);
  }
  using dev = Device.open("cuda");
  console.log(JSON.stringify({ wrong: await run(dev, flag === "--skip") }));
}
