/**
 * The device layer: every function of the core ABI, the typed wrappers over it, their error
 * paths and lifetimes, on every available backend (cpu always; cuda where a GPU is present).
 */

import assert from "node:assert";
// The ffi modules directly, not mod.ts: this suite must not depend on the layers above.
import { Device } from "../ffi/device.ts";
import { PinstreamError } from "../internal/errors.ts";
import { DeviceBuffer, HostBuffer, isPinnedMemory } from "../ffi/memory.ts";
import { Event, Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import { ABI_VERSION } from "../ffi/symbols.ts";
import { buildLibrary, cudaDriverProblem, cudaEmulated, loadLibrary } from "../ffi/library.ts";
import { Status } from "../ffi/errors.ts";
import { CUDA, testEachBackend } from "./_backends.ts";

/** Deterministic pseudo-random bytes (xorshift32), so a failure reproduces. */
function randomBytes(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out[i] = x & 0xff;
  }
  return out;
}

function assertBytesEqual(actual: Uint8Array, expected: Uint8Array, what: string): void {
  assert.strictEqual(actual.length, expected.length, `${what}: length`);
  for (let i = 0; i < expected.length; i++) {
    if (actual[i] !== expected[i]) {
      assert.fail(`${what}: byte ${i} is ${actual[i]}, expected ${expected[i]}`);
    }
  }
}

const ODD_SIZES = [1, 3, 17, 255, 4097, 65_537, 1_000_003];

// ---- the raw ABI -----------------------------------------------------------------------------

testEachBackend("every core ABI function answers through the raw symbols", async (dev) => {
  const s = dev.lib.symbols;
  const i32 = new Int32Array(1), u64a = new BigUint64Array(1), u64b = new BigUint64Array(1);
  assert.strictEqual(s.ps_abi_version(i32), 0);
  assert.strictEqual(i32[0], ABI_VERSION);
  assert.strictEqual(s.ps_backend(i32), 0);
  assert.strictEqual(i32[0], dev.kind === "cuda" ? 1 : 0);
  assert.strictEqual(s.ps_device_count(i32), 0);
  assert.ok(i32[0] >= 1);
  assert.strictEqual(s.ps_device_props_get(0, new Uint8Array(328)), 0);
  assert.strictEqual(s.ps_device_set(0), 0);
  assert.strictEqual(s.ps_device_get(i32), 0);
  assert.strictEqual(i32[0], 0);
  assert.strictEqual(s.ps_mem_info(u64a, u64b), 0);
  assert.ok(u64a[0] <= u64b[0] && u64b[0] > 0n);
  const msg = new Uint8Array(256);
  assert.strictEqual(await s.ps_device_synchronize(0, msg, BigInt(msg.length)), 0);

  const a = new BigInt64Array(1), st = new BigInt64Array(1), ev = new BigInt64Array(1);
  assert.strictEqual(s.ps_live_objects(a, st, ev), 0);
  const before = [a[0], st[0], ev[0]];

  const n = 1001;
  assert.strictEqual(s.ps_host_alloc(BigInt(n), u64a), 0);
  const host = Deno.UnsafePointer.create(u64a[0])!;
  assert.strictEqual(s.ps_device_alloc(BigInt(n), u64a), 0);
  const devp = Deno.UnsafePointer.create(u64a[0])!;
  assert.strictEqual(s.ps_device_alloc(BigInt(n), u64a), 0);
  const devq = Deno.UnsafePointer.create(u64a[0])!;
  const js = new Uint8Array(n);
  assert.strictEqual(s.ps_host_register(Deno.UnsafePointer.of(js), BigInt(n)), 0);
  assert.strictEqual(s.ps_stream_create(0, u64a), 0);
  const stream = Deno.UnsafePointer.create(u64a[0])!;
  assert.strictEqual(s.ps_event_create(0, u64a), 0);
  const e0 = Deno.UnsafePointer.create(u64a[0])!;
  assert.strictEqual(s.ps_event_create(1, u64a), 0);
  const e1 = Deno.UnsafePointer.create(u64a[0])!;
  assert.strictEqual(s.ps_event_create(2, u64a), 0); // PS_EVENT_BLOCKING_SYNC
  const e2 = Deno.UnsafePointer.create(u64a[0])!;
  assert.strictEqual(s.ps_live_objects(a, st, ev), 0);
  assert.deepStrictEqual([a[0], st[0], ev[0]], [before[0] + 4n, before[1] + 1n, before[2] + 3n]);

  new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(host, n)).set(randomBytes(n, 7));
  assert.strictEqual(s.ps_event_record(e0, stream), 0);
  assert.strictEqual(s.ps_memset_async(devq, 0x5a, BigInt(n), stream), 0);
  assert.strictEqual(s.ps_memcpy_h2d_async(devp, host, BigInt(n), stream), 0);
  assert.strictEqual(s.ps_memcpy_d2d_async(devq, devp, BigInt(n - 1), stream), 0);
  assert.strictEqual(s.ps_memcpy_d2h_async(Deno.UnsafePointer.of(js), devq, BigInt(n), stream), 0);
  assert.strictEqual(s.ps_event_record(e1, stream), 0);
  assert.strictEqual(s.ps_stream_wait_event(null, e1), 0);
  assert.strictEqual(s.ps_event_record(e2, stream), 0);
  assert.strictEqual(await s.ps_event_synchronize(e2, msg, BigInt(msg.length)), 0);
  assert.strictEqual(s.ps_event_query(e2), 0);
  assert.strictEqual(await s.ps_stream_synchronize(dev.index, stream, msg, BigInt(msg.length)), 0);
  assert.strictEqual(s.ps_stream_query(stream), 0);
  const ms = new Float32Array(1);
  assert.strictEqual(s.ps_event_elapsed_ms(e0, e2, ms), 0);
  assert.ok(ms[0] >= 0);
  const expected = randomBytes(n, 7);
  expected[n - 1] = 0x5a; // the d2d copy stopped one byte short of the memset
  assertBytesEqual(js, expected, "raw round trip");

  assert.strictEqual(
    await s.ps_bench_memcpy_loop(
      dev.index,
      devp,
      host,
      BigInt(n),
      1,
      3,
      stream,
      ms,
      msg,
      BigInt(msg.length),
    ),
    0,
  );
  assert.ok(ms[0] >= 0);

  assert.strictEqual(s.ps_event_destroy(e0), 0);
  assert.strictEqual(s.ps_event_destroy(e1), 0);
  assert.strictEqual(s.ps_event_destroy(e2), 0);
  assert.strictEqual(s.ps_stream_destroy(stream), 0);
  assert.strictEqual(s.ps_host_unregister(Deno.UnsafePointer.of(js)), 0);
  assert.strictEqual(s.ps_device_free(devq), 0);
  assert.strictEqual(s.ps_device_free(devp), 0);
  assert.strictEqual(s.ps_host_free(host), 0);
  assert.strictEqual(s.ps_live_objects(a, st, ev), 0);
  assert.deepStrictEqual([a[0], st[0], ev[0]], before);
});

testEachBackend("a failing C call returns its status and names the failure", (dev) => {
  const s = dev.lib.symbols;
  const i32 = new Int32Array(1);
  assert.strictEqual(s.ps_device_set(99), Status.INVALID_DEVICE);
  const message = new Deno.UnsafePointerView(s.ps_last_error()!).getCString();
  assert.match(message, /\.(c|cu):\d+: /); // file:line of the failing check
  assert.strictEqual(s.ps_device_props_get(-1, new Uint8Array(328)), Status.INVALID_DEVICE);
  assert.strictEqual(s.ps_abi_version(null as unknown as Int32Array), Status.INVALID_ARGUMENT);
  assert.strictEqual(s.ps_event_create(4, new BigUint64Array(1)), Status.INVALID_ARGUMENT);
  assert.strictEqual(s.ps_device_get(i32), 0);
});

testEachBackend("[wait] calls deliver their failure message through the buffer", async (dev) => {
  const msg = new Uint8Array(256);
  const status = await dev.lib.symbols.ps_device_synchronize(99, msg, BigInt(msg.length));
  assert.strictEqual(status, Status.INVALID_DEVICE);
  assert.match(new TextDecoder().decode(msg.subarray(0, msg.indexOf(0))), /\d+: .*/);
  // A stream wait names its device (it runs on another thread): a bad one is refused.
  assert.strictEqual(
    await dev.lib.symbols.ps_stream_synchronize(99, null, msg, BigInt(msg.length)),
    Status.INVALID_DEVICE,
  );
  await assert.rejects(
    dev.lib.symbols.ps_bench_memcpy_loop(
      0,
      null,
      null,
      0n,
      9,
      1,
      null,
      new Float32Array(1),
      msg,
      256n,
    )
      .then((st) => {
        if (st !== 0) throw new Error(String(st));
      }),
  );
});

Deno.test("the cpu backend rejects stale and foreign pointers instead of faulting", () => {
  const lib = loadLibrary("cpu");
  const s = lib.symbols;
  const out = new BigUint64Array(1);
  assert.strictEqual(s.ps_device_alloc(64n, out), 0);
  const p = Deno.UnsafePointer.create(out[0])!;
  assert.strictEqual(s.ps_device_free(p), 0);
  assert.strictEqual(s.ps_device_free(p), Status.INVALID_ARGUMENT, "double free");
  assert.strictEqual(s.ps_memset_async(p, 0, 64n, null), Status.INVALID_ARGUMENT, "freed");
  const js = new Uint8Array(8);
  assert.strictEqual(
    s.ps_memcpy_h2d_async(Deno.UnsafePointer.of(js), Deno.UnsafePointer.of(js), 8n, null),
    Status.INVALID_ARGUMENT,
    "host memory is not device memory",
  );
  assert.strictEqual(s.ps_stream_destroy(Deno.UnsafePointer.of(js)), Status.INVALID_ARGUMENT);
  assert.strictEqual(s.ps_event_query(Deno.UnsafePointer.of(js)), Status.INVALID_ARGUMENT);
  assert.strictEqual(s.ps_device_alloc(64n, out), 0);
  const q = Deno.UnsafePointer.create(out[0])!;
  assert.strictEqual(s.ps_memset_async(q, 0, 65n, null), Status.INVALID_ARGUMENT, "overrun");
  assert.strictEqual(s.ps_memset_async(q, 1, 64n, null), 0);
  assert.strictEqual(s.ps_device_free(q), 0);
  const msg = new Deno.UnsafePointerView(s.ps_last_error()!).getCString();
  assert.match(msg, /not inside a live allocation/);
});

Deno.test("the cpu backend aligns big allocations to 2 MiB for huge pages, small ones to a page", () => {
  // A resident dataset is read at random; on Linux the backend advises allocations of 4 MiB or
  // more into transparent huge pages, which needs them 2 MiB-aligned (core.c, PS_HUGE_MIN).
  const s = loadLibrary("cpu").symbols;
  const out = new BigUint64Array(1);
  for (
    const [bytes, align] of [[64n, 4096n], [(4n << 20n) - 1n, 4096n], [4n << 20n, 2n << 20n], [
      (9n << 20n) + 5n,
      2n << 20n,
    ]]
  ) {
    assert.strictEqual(s.ps_device_alloc(bytes, out), 0);
    const p = Deno.UnsafePointer.create(out[0])!;
    assert.strictEqual(out[0] % align, 0n, `${bytes} bytes at ${out[0].toString(16)}`);
    assert.strictEqual(s.ps_memset_async(p, 7, bytes, null), 0, "the whole allocation is usable");
    assert.strictEqual(s.ps_device_free(p), 0);
  }
});

// ---- devices --------------------------------------------------------------------------------

testEachBackend("Device reports its properties, memory and live objects", async (dev) => {
  assert.ok(dev.props.name.length > 0);
  assert.ok(dev.props.totalMemory > 0);
  assert.ok(dev.props.multiprocessors >= 1);
  if (dev.kind === "cuda") assert.ok(dev.props.major >= 7);
  // Only the cuda backend built against kernels/emu says it is the emulator.
  assert.strictEqual(dev.props.emulated, dev.kind === "cuda" && cudaEmulated());
  if (dev.props.emulated) assert.match(dev.props.name, /^pinstream CUDA emulator \(sm_90/);
  const { free, total } = dev.memInfo();
  assert.ok(free > 0 && free <= total);
  const live = dev.liveObjects();
  for (const v of Object.values(live)) assert.ok(Number.isInteger(v) && v >= 0);
  await dev.synchronize();
  assert.strictEqual(String(dev), `${dev.kind}:0`);
  assert.strictEqual(Device.count(dev.kind) >= 1, true);
});

Deno.test("Device.open validates its arguments before any native call", () => {
  assert.throws(() => Device.open("gpu" as "cpu"), TypeError);
  assert.throws(() => Device.open("cpu", { index: -1 }), RangeError);
  assert.throws(() => Device.open("cpu", { index: 0.5 }), RangeError);
  assert.throws(() => Device.open("cpu", { index: "0" as unknown as number }), TypeError);
});

testEachBackend("Device.open rejects a device index past the last device", (dev) => {
  const count = Device.count(dev.kind);
  assert.throws(
    () => Device.open(dev.kind, { index: count }),
    (err: unknown) =>
      err instanceof PinstreamError && err.code === "INVALID_DEVICE" &&
      err.message.startsWith(`Cannot open ${dev.kind} device ${count}: `),
  );
});

// On the CUDA emulator these run in a child without it: what a machine without a GPU does.
const NO_GPU = CUDA.ignore || cudaEmulated();
const WITHOUT_EMULATOR = { NO_COLOR: "1", PINSTREAM_CUDA_EMULATOR: "0" };

Deno.test({
  name: "Device.open('cuda') says why it cannot open on a machine without a GPU",
  ignore: !NO_GPU,
  async fn() {
    const script = `import { Device } from ${
      JSON.stringify(new URL("../ffi/device.ts", import.meta.url).href)
    };
      import { LibraryError } from ${
      JSON.stringify(new URL("../ffi/library.ts", import.meta.url).href)
    };
      try { Device.open("cuda"); console.log("opened"); } catch (err) {
        console.log(JSON.stringify({ code: err.code, library: err instanceof LibraryError,
          message: err.message, count: Device.count("cuda") }));
      }`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      stdout: "piped",
      stderr: "piped",
      env: WITHOUT_EMULATOR,
    }).output();
    const stdout = new TextDecoder().decode(out.stdout).trim();
    assert.ok(out.success, new TextDecoder().decode(out.stderr));
    const err = JSON.parse(stdout);
    assert.ok(["NO_DRIVER", "NO_DEVICE"].includes(err.code) || err.library, err.message);
    assert.match(err.message, /^Cannot (open cuda device 0|load the cuda backend): \S/);
    assert.strictEqual(err.count, 0);
  },
});

Deno.test({
  name: "Device.open('auto') falls back to the cpu with one line on stderr",
  ignore: !NO_GPU,
  async fn() {
    const script = `import { Device } from ${
      JSON.stringify(new URL("../ffi/device.ts", import.meta.url).href)
    };
      const a = Device.open("auto"); const b = Device.open();
      console.log(a.kind, b.kind); a.dispose(); b.dispose();`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      stdout: "piped",
      stderr: "piped",
      env: WITHOUT_EMULATOR,
    }).output();
    const stderr = new TextDecoder().decode(out.stderr).trim().split("\n");
    assert.ok(out.success, stderr.join("\n"));
    assert.strictEqual(new TextDecoder().decode(out.stdout).trim(), "cpu cpu");
    assert.strictEqual(stderr.length, 1, stderr.join("\n"));
    assert.match(
      stderr[0],
      /^pinstream: using the CPU backend: (no CUDA driver|no CUDA device|nvcc)/,
    );
  },
});

Deno.test({
  name: "the CUDA library builds, loads without a driver and reports NO_DRIVER",
  // Needs nvcc; meaningful only where the driver is absent (elsewhere the GPU suite runs).
  ignore: cudaDriverProblem() === undefined || !hasNvcc(),
  fn() {
    const path = buildLibrary("cuda", { emulator: false });
    // Only the symbols this test needs: the check does not depend on the kernel files.
    const lib = Deno.dlopen(path, {
      ps_device_count: { parameters: ["buffer"], result: "i32" },
      ps_backend: { parameters: ["buffer"], result: "i32" },
      ps_last_error: { parameters: [], result: "pointer" },
    });
    try {
      const out = new Int32Array(1);
      assert.strictEqual(lib.symbols.ps_backend(out), 0);
      assert.strictEqual(out[0], 1);
      assert.strictEqual(lib.symbols.ps_device_count(out), Status.NO_DRIVER);
      const msg = new Deno.UnsafePointerView(lib.symbols.ps_last_error()!).getCString();
      assert.match(msg, /cudaGetDeviceCount\(&n\) failed: cudaError\w+: /);
    } finally {
      lib.close();
    }
  },
});

Deno.test({
  name: "with a prebuilt CUDA library but no driver, Device.open('cuda') reports NO_DRIVER",
  ignore: cudaDriverProblem() === undefined || !hasNvcc(),
  async fn() {
    const script = `import { Device } from ${
      JSON.stringify(new URL("../ffi/device.ts", import.meta.url).href)
    };
      try { Device.open("cuda"); console.log("opened"); }
      catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }
      console.log(Device.open("auto").kind);`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      env: { PINSTREAM_LIB_CUDA: buildLibrary("cuda", { emulator: false }), NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.ok(out.success, stderr);
    const [first, second] = new TextDecoder().decode(out.stdout).trim().split("\n");
    const err = JSON.parse(first);
    assert.strictEqual(err.code, "NO_DRIVER");
    assert.match(err.message, /^Cannot open cuda device 0: no CUDA driver: .*cudaGetDeviceCount/);
    assert.strictEqual(second, "cpu");
    assert.match(stderr, /^pinstream: using the CPU backend: no CUDA driver/);
  },
});

function hasNvcc(): boolean {
  for (const nvcc of ["nvcc", "/usr/local/cuda/bin/nvcc"]) {
    try {
      if (new Deno.Command(nvcc, { args: ["--version"], stdout: "null" }).outputSync().success) {
        return true;
      }
    } catch {
      // try the next
    }
  }
  return false;
}

// ---- copies ---------------------------------------------------------------------------------

testEachBackend(
  "random bytes of odd sizes survive host -> device -> host (pinned)",
  async (dev) => {
    using stream = new Stream(dev);
    for (const [i, n] of ODD_SIZES.entries()) {
      const data = randomBytes(n, 100 + i);
      using src = HostBuffer.alloc(dev, n);
      using dst = HostBuffer.alloc(dev, n);
      using buf = DeviceBuffer.alloc(dev, n);
      src.u8.set(data);
      buf.copyFrom(src, { stream });
      buf.copyTo(dst, { stream });
      await stream.synchronize();
      assertBytesEqual(dst.u8, data, `pinned ${n} bytes`);
    }
  },
);

testEachBackend(
  "random bytes of odd sizes survive host -> device -> host (pageable)",
  async (dev) => {
    for (const [i, n] of ODD_SIZES.entries()) {
      const data = randomBytes(n, 200 + i);
      using buf = DeviceBuffer.alloc(dev, n + 5);
      // Views with odd byte offsets into larger buffers, and an ArrayBuffer source.
      const padded = new Uint8Array(n + 3);
      padded.set(data, 3);
      buf.copyFrom(padded.subarray(3), { dstOffset: 5 });
      const back = new Uint8Array(n + 7);
      buf.copyTo(back, { srcOffset: 5, dstOffset: 7, bytes: n });
      await dev.defaultStream.synchronize();
      assertBytesEqual(back.subarray(7), data, `pageable ${n} bytes`);
      const shared = new SharedArrayBuffer(n + 9);
      new Uint8Array(shared, 9).set(data);
      buf.copyFrom(new Uint8Array(shared, 9));
      const viaShared = new Uint8Array(new SharedArrayBuffer(n + 1));
      buf.copyTo(viaShared, { dstOffset: 1, bytes: n });
      await dev.defaultStream.synchronize();
      assertBytesEqual(viaShared.subarray(1), data, `SharedArrayBuffer ${n} bytes`);
      buf.copyFrom(data.slice().buffer);
      const again = new Uint8Array(n);
      buf.copyTo(again.buffer, { bytes: n });
      await dev.defaultStream.synchronize();
      assertBytesEqual(again, data, `ArrayBuffer ${n} bytes`);
    }
  },
);

testEachBackend("registered memory (SharedArrayBuffer) copies like pinned memory", async (dev) => {
  const n = 65_539;
  const sab = new SharedArrayBuffer(n + 16);
  const data = randomBytes(n, 5);
  new Uint8Array(sab, 16).set(data);
  using pinned = HostBuffer.register(dev, new Uint8Array(sab, 16));
  assert.strictEqual(pinned.bytes, n);
  assert.strictEqual(pinned.origin, "register");
  using buf = DeviceBuffer.alloc(dev, n);
  buf.copyFrom(pinned);
  await dev.defaultStream.synchronize(); // pinned copies are asynchronous: wait before reuse
  pinned.u8.fill(0);
  buf.copyTo(pinned);
  await dev.defaultStream.synchronize();
  assertBytesEqual(new Uint8Array(sab, 16), data, "registered round trip");
  pinned.dispose();
  // Unregistering leaves the JS memory intact and registrable again.
  assertBytesEqual(new Uint8Array(sab, 16), data, "after unregister");
  HostBuffer.register(dev, sab).dispose();
});

testEachBackend("device-to-device copies honour offsets", async (dev) => {
  const n = 12_345;
  const data = randomBytes(n, 9);
  using a = DeviceBuffer.alloc(dev, n);
  using b = DeviceBuffer.alloc(dev, n + 100);
  a.copyFrom(data);
  b.fill(0);
  b.copyFrom(a, { srcOffset: 45, dstOffset: 100, bytes: n - 45 });
  const c = DeviceBuffer.alloc(dev, n);
  a.copyTo(c);
  const back = new Uint8Array(n + 100), back2 = new Uint8Array(n);
  b.copyTo(back);
  c.copyTo(back2);
  c.dispose();
  await dev.synchronize();
  assertBytesEqual(back.subarray(0, 100), new Uint8Array(100), "untouched prefix");
  assertBytesEqual(back.subarray(100, 100 + n - 45), data.subarray(45), "copied range");
  assertBytesEqual(back2, data, "whole copy");
});

testEachBackend("fill sets exactly the requested range", async (dev) => {
  using buf = DeviceBuffer.alloc(dev, 1000);
  using stream = new Stream(dev);
  buf.fill(0x11, { stream });
  buf.fill(0xee, { stream, offset: 10, bytes: 33 });
  buf.fill(255, { stream, offset: 999 });
  const back = new Uint8Array(1000);
  await stream.synchronize();
  buf.copyTo(back, { stream });
  await stream.synchronize();
  const expected = new Uint8Array(1000).fill(0x11);
  expected.fill(0xee, 10, 43);
  expected[999] = 255;
  assertBytesEqual(back, expected, "fill");
});

testEachBackend("zero-byte buffers and copies are valid no-ops", async (dev) => {
  using d = DeviceBuffer.alloc(dev, 0);
  using h = HostBuffer.alloc(dev, 0);
  assert.strictEqual(d.pointer, null);
  assert.strictEqual(h.u8.length, 0);
  d.copyFrom(h);
  d.copyTo(new Uint8Array(0));
  d.fill(1);
  using big = DeviceBuffer.alloc(dev, 8);
  big.copyFrom(new Uint8Array(8), { bytes: 0 });
  await dev.synchronize();
});

// ---- streams and events ---------------------------------------------------------------------

testEachBackend("a stream waiting on an event runs after the recorded work", async (dev) => {
  const n = 1 << 20;
  const data = randomBytes(n, 11);
  using producer = new Stream(dev), consumer = new Stream(dev);
  using ready = new Event(dev);
  using src = HostBuffer.alloc(dev, n);
  using out = HostBuffer.alloc(dev, n);
  using buf = DeviceBuffer.alloc(dev, n);
  src.u8.set(data);
  for (let round = 0; round < 4; round++) {
    buf.fill(0, { stream: producer });
    buf.copyFrom(src, { stream: producer });
    ready.record(producer);
    consumer.waitEvent(ready);
    buf.copyTo(out, { stream: consumer });
    await consumer.synchronize();
    assertBytesEqual(out.u8, data, `round ${round}`);
    out.u8.fill(0);
  }
  assert.strictEqual(producer.query(), true);
  assert.strictEqual(consumer.query(), true);
});

testEachBackend("events complete, synchronize and time the work between them", async (dev) => {
  using stream = new Stream(dev);
  using start = new Event(dev, { timing: true });
  // A blocking event's host wait sleeps instead of spinning; it still times and orders.
  using end = new Event(dev, { timing: true, blocking: true });
  assert.strictEqual(end.blocking, true);
  using plain = new Event(dev);
  assert.strictEqual(plain.query(), true, "a never-recorded event is complete");
  using buf = DeviceBuffer.alloc(dev, 1 << 22);
  start.record(stream);
  for (let i = 0; i < 8; i++) buf.fill(i, { stream });
  end.record(stream);
  plain.record(stream);
  await end.synchronize();
  await plain.synchronize();
  assert.strictEqual(end.query(), true);
  assert.strictEqual(plain.query(), true);
  const ms = start.elapsedMs(end);
  assert.ok(Number.isFinite(ms) && ms >= 0, String(ms));
  assert.throws(() => start.elapsedMs(plain), /timing/);
  using unrecorded = new Event(dev, { timing: true });
  assert.throws(() => start.elapsedMs(unrecorded), PinstreamError);
  start.record(); // the default stream
  await start.synchronize();
});

testEachBackend("streams and events check what they are given", (dev) => {
  using other = Device.open(dev.kind);
  using foreign = new Stream(other);
  using buf = DeviceBuffer.alloc(dev, 16);
  using ev = new Event(dev);
  assert.throws(() => buf.fill(0, { stream: foreign }), TypeError);
  assert.throws(() => buf.fill(0, { stream: {} as Stream }), TypeError);
  assert.throws(() => ev.record(foreign), TypeError);
  assert.throws(() => dev.defaultStream.waitEvent({} as Event), TypeError);
  assert.throws(() => new Event(dev, { timing: 1 as unknown as boolean }), TypeError);
  assert.throws(() => new Event(dev, { blocking: "yes" as unknown as boolean }), /blocking/);
  assert.throws(() => new Stream({} as Device), TypeError);
});

testEachBackend(
  "waits on worker threads run alongside allocations on the JS thread",
  async (dev) => {
    const live = dev.liveObjects();
    using stream = new Stream(dev);
    using ev = new Event(dev);
    const waits: Promise<void>[] = [];
    for (let i = 0; i < 500; i++) {
      ev.record(stream);
      waits.push(i % 2 === 0 ? stream.synchronize() : ev.synchronize());
      const buf = DeviceBuffer.alloc(dev, 4096 + i);
      buf.fill(i & 0xff, { stream });
      buf.dispose();
    }
    await Promise.all(waits);
    await dev.synchronize();
    assert.deepStrictEqual(dev.liveObjects(), {
      ...live,
      streams: live.streams + 1,
      events: live.events + 1,
    });
  },
);

// ---- argument errors ------------------------------------------------------------------------

testEachBackend(
  "bad sizes and offsets throw TypeError/RangeError before any native call",
  (dev) => {
    const live = dev.liveObjects();
    for (const bad of [-1, 1.5, NaN, Infinity, 2 ** 53]) {
      assert.throws(() => DeviceBuffer.alloc(dev, bad), RangeError, String(bad));
      assert.throws(() => HostBuffer.alloc(dev, bad), RangeError, String(bad));
    }
    assert.throws(() => DeviceBuffer.alloc(dev, "8" as unknown as number), TypeError);
    assert.throws(() => DeviceBuffer.alloc(dev, 8n as unknown as number), TypeError);
    assert.throws(() => DeviceBuffer.alloc(null as unknown as Device, 8), TypeError);
    assert.deepStrictEqual(dev.liveObjects(), live);

    using buf = DeviceBuffer.alloc(dev, 100);
    const host = new Uint8Array(100);
    assert.throws(() => buf.copyFrom(new Uint8Array(101)), RangeError);
    assert.throws(() => buf.copyFrom(host, { dstOffset: 1 }), RangeError);
    assert.throws(() => buf.copyFrom(host, { srcOffset: 101 }), RangeError);
    assert.throws(() => buf.copyFrom(host, { srcOffset: -1 }), RangeError);
    assert.throws(() => buf.copyFrom(host, { bytes: 2.5 }), RangeError);
    assert.throws(() => buf.copyTo(new Uint8Array(99)), RangeError);
    assert.throws(() => buf.copyTo(host, { srcOffset: 50, bytes: 51 }), RangeError);
    assert.throws(() => buf.copyFrom([1, 2, 3] as unknown as Uint8Array), TypeError);
    assert.throws(() => buf.copyFrom("abc" as unknown as Uint8Array), TypeError);
    assert.throws(() => buf.copyFrom(buf, { srcOffset: 0, dstOffset: 10, bytes: 20 }), RangeError);
    buf.copyFrom(buf, { srcOffset: 0, dstOffset: 50, bytes: 50 }); // disjoint halves are fine
    assert.throws(() => buf.fill(256), RangeError);
    assert.throws(() => buf.fill(-1), RangeError);
    assert.throws(() => buf.fill(0, { offset: 101 }), RangeError);
    assert.throws(() => buf.fill(0, { offset: 50, bytes: 51 }), RangeError);
    const detached = new ArrayBuffer(8);
    detached.transfer();
    assert.throws(() => buf.copyFrom(detached), TypeError);
    assert.throws(
      () => HostBuffer.register(dev, new ArrayBuffer(8, { maxByteLength: 16 })),
      TypeError,
    );
    assert.throws(() => HostBuffer.register(dev, {} as ArrayBuffer), TypeError);
  },
);

testEachBackend("registering the same memory twice is a backend error", (dev) => {
  const sab = new SharedArrayBuffer(8192);
  using first = HostBuffer.register(dev, sab);
  // INVALID_ARGUMENT on both backends (CUDA: cudaErrorHostMemoryAlreadyRegistered).
  assert.throws(
    () => HostBuffer.register(dev, sab),
    (e) => e instanceof PinstreamError && e.code === "INVALID_ARGUMENT",
  );
  assert.strictEqual(first.bytes, 8192);
});

// ---- lifetimes ------------------------------------------------------------------------------

testEachBackend("use after dispose throws, and dispose is idempotent", async (dev) => {
  const buf = DeviceBuffer.alloc(dev, 64);
  const host = HostBuffer.alloc(dev, 64);
  const stream = new Stream(dev);
  const ev = new Event(dev);
  const t = Tensor.empty(dev, [4], "f32");
  for (const r of [buf, host, stream, ev, t]) {
    r.dispose();
    r.dispose();
    assert.strictEqual(r.disposed, true);
  }
  assert.throws(() => buf.fill(0), /Cannot fill a device buffer: the DeviceBuffer is disposed/);
  assert.throws(() => buf.copyTo(new Uint8Array(64)), /disposed/);
  assert.throws(() => host.u8, /disposed/);
  using live = DeviceBuffer.alloc(dev, 64);
  assert.throws(() => live.copyFrom(host), /disposed/, "a freed source");
  assert.throws(() => live.copyTo(buf), /disposed/, "a freed destination");
  assert.throws(() => live.fill(0, { stream }), /disposed/);
  await assert.rejects(stream.synchronize(), /disposed/);
  assert.throws(() => stream.query(), /disposed/);
  assert.throws(() => ev.record(), /disposed/);
  assert.throws(() => ev.query(), /disposed/);
  await assert.rejects(ev.synchronize(), /disposed/);
  assert.throws(() => dev.defaultStream.waitEvent(ev), /disposed/);
  assert.throws(() => t.pointer, /disposed/);
  await assert.rejects(t.toHost(), /disposed/);
});

testEachBackend("freed pinned memory is unreachable from JS", (dev) => {
  const host = HostBuffer.alloc(dev, 4096);
  const view = host.u8;
  const ab = host.arrayBuffer;
  view.fill(1);
  host.dispose();
  assert.strictEqual(view.length, 0);
  assert.strictEqual(ab.byteLength, 0);
  assert.strictEqual((ab as ArrayBuffer).detached, true);
});

testEachBackend(
  "views of pinned memory are known as pinned while a HostBuffer pins them",
  async (dev) => {
    const host = HostBuffer.alloc(dev, 256);
    const sab = new SharedArrayBuffer(512);
    const reg1 = HostBuffer.register(dev, new Uint8Array(sab, 0, 256));
    const reg2 = HostBuffer.register(dev, new Uint8Array(sab, 256, 256));
    assert.ok(isPinnedMemory(host.arrayBuffer));
    assert.ok(isPinnedMemory(sab));
    assert.ok(!isPinnedMemory(new ArrayBuffer(8)));
    // Tensor.fromHost copies a pinned view out first: the caller may refill it at once.
    host.u8.fill(7);
    using t = Tensor.fromHost(dev, host.u8.subarray(0, 16));
    host.u8.fill(9);
    assert.deepStrictEqual([...await t.toHost()], new Array(16).fill(7));
    reg1.dispose();
    assert.ok(isPinnedMemory(sab), "still pinned by the second registration");
    reg2.dispose();
    assert.ok(!isPinnedMemory(sab));
    const ab = host.arrayBuffer;
    host.dispose();
    assert.ok(!isPinnedMemory(ab));
  },
);

Deno.test("disposing a device disposes everything still alive on it", async () => {
  const dev = Device.open("cpu");
  const start = dev.liveObjects();
  const buf = DeviceBuffer.alloc(dev, 128);
  const host = HostBuffer.alloc(dev, 128);
  const reg = HostBuffer.register(dev, new SharedArrayBuffer(128));
  const stream = new Stream(dev);
  const ev = new Event(dev);
  const t = Tensor.empty(dev, [2, 2], "i32");
  const syncing = stream.synchronize();
  dev.dispose();
  await syncing;
  for (const r of [buf, host, reg, stream, ev, t]) assert.strictEqual(r.disposed, true);
  assert.deepStrictEqual(loadLibraryLive(), start);
  assert.throws(() => DeviceBuffer.alloc(dev, 8), /the Device is disposed/);
  await assert.rejects(dev.synchronize(), /disposed/);
});

function loadLibraryLive() {
  const lib = loadLibrary("cpu");
  const a = new BigInt64Array(1), s = new BigInt64Array(1), e = new BigInt64Array(1);
  lib.symbols.ps_live_objects(a, s, e);
  return { allocations: Number(a[0]), streams: Number(s[0]), events: Number(e[0]) };
}

// ---- tensors --------------------------------------------------------------------------------

testEachBackend("tensors round-trip every dtype", async (dev) => {
  const cases = [
    new Uint8Array([0, 1, 254, 255, 7]),
    new Int32Array([-2147483648, -1, 0, 1, 2147483647, 42]),
    new Float16Array([0, -0.5, 65504, 1e-4, -3.25, Infinity]),
    new Float32Array([Math.PI, -1e30, 1e-30, 0, NaN, 1]),
  ];
  for (const data of cases) {
    using t = Tensor.fromHost(dev, data, [data.length]);
    assert.strictEqual(t.numel, data.length);
    assert.strictEqual(t.byteLength, data.byteLength);
    const back = await t.toHost();
    assert.strictEqual(back.constructor, data.constructor);
    assert.deepStrictEqual([...back], [...data]);
  }
  using m = Tensor.fromHost(dev, new Float32Array(12).map((_, i) => i), [3, 4]);
  assert.deepStrictEqual(m.shape, [3, 4]);
  assert.ok(Object.isFrozen(m.shape));
  using scalar = Tensor.empty(dev, [], "f32");
  assert.strictEqual(scalar.numel, 1);
  using empty = Tensor.empty(dev, [0, 3], "f16");
  assert.strictEqual(empty.numel, 0);
  assert.deepStrictEqual([...(await empty.toHost())], []);
  using stream = new Stream(dev);
  const v = await m.toHost({ stream });
  assert.strictEqual(v[11], 11);
});

testEachBackend("tensor constructors validate shape and dtype", (dev) => {
  assert.throws(() => Tensor.empty(dev, [2, -1], "f32"), RangeError);
  assert.throws(() => Tensor.empty(dev, [2.5], "f32"), RangeError);
  assert.throws(() => Tensor.empty(dev, 4 as unknown as number[], "f32"), TypeError);
  assert.throws(() => Tensor.empty(dev, [4], "f64" as "f32"), TypeError);
  assert.throws(() => Tensor.fromHost(dev, new Float32Array(6), [4]), RangeError);
  assert.throws(
    () => Tensor.fromHost(dev, new Float64Array(2) as unknown as Float32Array),
    TypeError,
  );
});

testEachBackend("narrow views the same memory along dimension 0 and frees nothing", async (dev) => {
  using t = Tensor.fromHost(dev, Int32Array.from({ length: 12 }, (_, i) => i), [4, 3]);
  const live = dev.liveObjects().allocations, bytes = dev.memoryAllocated();
  const mid = t.narrow(0, 1, 2);
  assert.deepStrictEqual([mid.shape, mid.numel, mid.byteLength], [[2, 3], 6, 24]);
  assert.deepStrictEqual([dev.liveObjects().allocations, dev.memoryAllocated()], [live, bytes]);
  mid.buffer.copyFrom(new Int32Array([-1, -2, -3]), { dstOffset: 12 });
  assert.deepStrictEqual([...await mid.toHost()], [3, 4, 5, -1, -2, -3]);
  assert.deepStrictEqual([...await t.toHost()].slice(6, 9), [-1, -2, -3], "written through");
  assert.deepStrictEqual(t.narrow(0, 4, 0).shape, [0, 3]);
  mid.dispose();
  assert.strictEqual(dev.liveObjects().allocations, live, "disposing a view frees nothing");
  assert.deepStrictEqual([...await t.toHost()].slice(0, 3), [0, 1, 2]);
  assert.throws(() => t.narrow(1, 0, 1), /only dimension 0/);
  assert.throws(() => t.narrow(0, 3, 2), /\[3, 5\) is outside dimension 0 of \[4,3\]/);
  assert.throws(() => t.narrow(0, -1, 1), RangeError);
  assert.throws(() => t.buffer.view(40, 16), /16 bytes at offset 40 overrun 48 bytes/);
  using s = Tensor.empty(dev, [], "f32");
  assert.throws(() => s.narrow(0, 0, 1), /scalar/);
  const last = t.narrow(0, 3, 1);
  t.dispose();
  assert.ok(last.disposed, "disposing the tensor disposes its views");
  assert.throws(() => last.pointer, /disposed/);
});

// ---- leaks ----------------------------------------------------------------------------------

testEachBackend("thousands of alloc/free and create/dispose cycles leak nothing", async (dev) => {
  const cycle = async (rounds: number) => {
    const sab = new SharedArrayBuffer(64 * 1024);
    const scratch = new Uint8Array(256 * 1024);
    for (let i = 0; i < rounds; i++) {
      const d = DeviceBuffer.alloc(dev, 256 * 1024 + (i % 7));
      const h = HostBuffer.alloc(dev, 64 * 1024 + (i % 5));
      d.copyFrom(h);
      d.copyTo(scratch, { bytes: h.bytes });
      h.dispose();
      d.dispose();
      using reg = HostBuffer.register(dev, sab);
      using s = new Stream(dev);
      using e = new Event(dev, { timing: i % 2 === 0 });
      e.record(s);
      s.waitEvent(e);
      if (i % 50 === 0) {
        await s.synchronize();
        await e.synchronize();
        using t = Tensor.fromHost(dev, new Float32Array(1000));
        await t.toHost();
      }
      reg.u8[0] = i & 0xff;
    }
  };
  await cycle(200); // warm-up: allocator arenas, JIT, caches
  const live = dev.liveObjects();
  const rss = Deno.memoryUsage().rss;
  await cycle(3000);
  assert.deepStrictEqual(dev.liveObjects(), live);
  const grownMiB = (Deno.memoryUsage().rss - rss) / 2 ** 20;
  // 3000 rounds move ~960 MiB through alloc/free: a leak of either would show as hundreds
  // of MiB; a generous bound leaves room for V8 heap growth.
  assert.ok(grownMiB < 96, `RSS grew by ${grownMiB.toFixed(1)} MiB`);
});

Deno.test("wrappers lost without dispose are freed by the garbage-collection backstop", async () => {
  // In a child process: forcing collection needs --expose-gc.
  const ffi = (name: string) => JSON.stringify(new URL(`../ffi/${name}`, import.meta.url).href);
  const script = `import { Device } from ${ffi("device.ts")};
    import { DeviceBuffer, HostBuffer } from ${ffi("memory.ts")};
    import { Event, Stream } from ${ffi("stream.ts")};
    const dev = Device.open("cpu");
    const start = JSON.stringify(dev.liveObjects());
    (() => {
      for (let i = 0; i < 50; i++) {
        DeviceBuffer.alloc(dev, 1000); HostBuffer.alloc(dev, 1000);
        HostBuffer.register(dev, new ArrayBuffer(100)); new Stream(dev); new Event(dev);
      }
    })();
    const during = dev.liveObjects().allocations;
    for (let i = 0; i < 10 && JSON.stringify(dev.liveObjects()) !== start; i++) {
      globalThis.gc();
      await new Promise((r) => setTimeout(r, 10));
    }
    console.log(JSON.stringify({ start, during, end: JSON.stringify(dev.liveObjects()) }));`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--v8-flags=--expose-gc", script],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  const got = JSON.parse(new TextDecoder().decode(out.stdout));
  assert.ok(got.during >= 150, JSON.stringify(got));
  assert.strictEqual(got.end, got.start);
});

testEachBackend("a non-blocking stream orders with events and refuses bad flags", async (dev) => {
  const s = dev.lib.symbols;
  const out = new BigUint64Array(1);
  assert.strictEqual(s.ps_stream_create(7, out), Status.INVALID_ARGUMENT);
  assert.throws(
    () => new Stream(dev, { nonBlocking: "yes" as unknown as boolean }),
    TypeError,
  );
  using copy = new Stream(dev, { nonBlocking: true });
  assert.strictEqual(copy.nonBlocking, true);
  using done = new Event(dev);
  const n = 4099;
  using src = HostBuffer.alloc(dev, n), back = HostBuffer.alloc(dev, n);
  using dst = DeviceBuffer.alloc(dev, n);
  crypto.getRandomValues(src.u8);
  dst.copyFrom(src, { stream: copy });
  done.record(copy);
  // The default stream does not wait for a non-blocking stream by itself: it waits on the event.
  dev.defaultStream.waitEvent(done);
  dst.copyTo(back, { stream: dev.defaultStream });
  await dev.defaultStream.synchronize();
  assert.deepStrictEqual(back.u8, src.u8);
});

testEachBackend("pinned host memory is counted while held, allocated or registered", (dev) => {
  dev.resetPeakMemoryStats();
  const before = dev.pinnedMemoryAllocated();
  const deviceBefore = dev.memoryAllocated();
  const a = HostBuffer.alloc(dev, 12288);
  const ring = new SharedArrayBuffer(8192);
  const r = HostBuffer.register(dev, ring);
  const empty = HostBuffer.alloc(dev, 0);
  assert.strictEqual(dev.pinnedMemoryAllocated(), before + 12288 + 8192);
  assert.strictEqual(dev.memoryAllocated(), deviceBefore, "pinned memory is not device memory");
  a.dispose();
  a.dispose(); // once only
  r.dispose();
  empty.dispose();
  assert.strictEqual(dev.pinnedMemoryAllocated(), before);
  assert.strictEqual(dev.maxPinnedMemoryAllocated(), before + 12288 + 8192);
  dev.resetPeakMemoryStats();
  assert.strictEqual(dev.maxPinnedMemoryAllocated(), before);
});
