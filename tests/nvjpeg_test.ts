// nvJPEG on the device: on the CUDA emulator with its stand-in (kernels/emu/nvjpeg_stand_in.c),
// the decoded bytes equal the workers' TurboJPEG decode, the pixels land at the decode's place
// in the stream (in deferred-stream mode too), and every way it cannot run says so in one line;
// a file that cannot be decoded is named.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { decodeJpegsOnDevice, NVJPEG_LIB_ENV, openNvjpeg } from "../ffi/nvjpeg.ts";
import { Event, Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import { TurboJpeg } from "../decode/turbojpeg.ts";
import { CUDA, cudaIsEmulated } from "./_backends.ts";
import { jpegPattern } from "./_nvjpeg_fixtures.ts";
import { nvjpegStandIn } from "./_nvjpeg_stand_in.ts";

const EMULATED = cudaIsEmulated();
const LIB = EMULATED ? nvjpegStandIn() : undefined;
const ignore = LIB === undefined;
const MISSING = "/nonexistent/libnvjpeg.so.12";

function turbo(): TurboJpeg | undefined {
  try {
    return new TurboJpeg();
  } catch {
    return undefined;
  }
}
const TJ = turbo();

/** The workers' decode of a JPEG to RGB. */
function workerDecode(bytes: Uint8Array): Uint8Array {
  const h = TJ!.header(bytes);
  return TJ!.decode(bytes, 3, h, h).data;
}

function open(device: Device) {
  const d = openNvjpeg(device, { library: LIB });
  if (typeof d === "string") throw new Error(d);
  return d;
}

Deno.test("nvJPEG on a CPU device: one line saying decoding stays on the workers", () => {
  using device = Device.open("cpu");
  const why = openNvjpeg(device, { library: LIB ?? MISSING });
  assert.strictEqual(
    why,
    "JPEG decoding stays on the workers: nvJPEG needs a CUDA device, not cpu",
  );
});

Deno.test("openNvjpeg refuses an unknown option with a suggestion", () => {
  using device = Device.open("cpu");
  assert.throws(() => openNvjpeg(device, { hardwre: false } as never), /hardware/);
});

Deno.test({
  name: "nvJPEG absent: one line naming what was tried [cuda]",
  ignore: CUDA.ignore,
  fn() {
    using device = Device.open("cuda");
    const why = openNvjpeg(device, { library: MISSING });
    assert.strictEqual(
      why,
      `JPEG decoding stays on the workers: nvJPEG not found (tried ${MISSING}; name it in ` +
        `${NVJPEG_LIB_ENV})`,
    );
  },
});

Deno.test({
  name: "the emulator's stand-in: no hardware decoder, so the default backend [cuda]",
  ignore,
  fn() {
    using device = Device.open("cuda");
    using d = open(device);
    assert.strictEqual(d.standIn, true);
    assert.strictEqual(d.backend, "default");
    assert.strictEqual(d.version, "12.0.0");
  },
});

Deno.test({
  name: "nvJPEG decodes a batch to the same bytes as the workers' TurboJPEG [cuda]",
  ignore: ignore || TJ === undefined,
  async fn() {
    using device = Device.open("cuda");
    using d = open(device);
    using stream = new Stream(device);
    // Colour (4:2:0) and grey, sizes that are not multiples of the 16-pixel MCU.
    const files = [
      jpegPattern(TJ!, 37, 53, 3, 0),
      jpegPattern(TJ!, 37, 53, 1, 1),
      jpegPattern(TJ!, 37, 53, 3, 2),
    ];
    using out = d.decode(files.map((bytes, i) => ({ name: `f${i}.jpg`, bytes })), { stream });
    assert.deepStrictEqual(out.shape, [3, 37, 53, 3]);
    const got = await out.toHost({ stream }) as Uint8Array;
    const frame = 37 * 53 * 3;
    files.forEach((bytes, i) => {
      // A grey JPEG comes out as RGB with three equal channels on both paths.
      assert.deepStrictEqual(
        got.subarray(i * frame, (i + 1) * frame),
        workerDecode(bytes),
        `file ${i}`,
      );
    });
    // A second batch of another size and count reuses the decoder.
    using again = d.decode([{ name: "g.jpg", bytes: jpegPattern(TJ!, 8, 16, 3, 5) }], { stream });
    const one = await again.toHost({ stream }) as Uint8Array;
    assert.deepStrictEqual(one, workerDecode(jpegPattern(TJ!, 8, 16, 3, 5)));
  },
});

Deno.test({
  name: "a stream that waits for the decode's event sees its pixels [cuda]",
  ignore: ignore || TJ === undefined,
  async fn() {
    using device = Device.open("cuda");
    using d = open(device);
    using decodeStream = new Stream(device), compute = new Stream(device);
    using done = new Event(device);
    const bytes = jpegPattern(TJ!, 32, 48, 3, 7);
    using out = d.decode([{ name: "a.jpg", bytes }], { stream: decodeStream });
    done.record(decodeStream);
    compute.waitEvent(done);
    using copy = Tensor.empty(device, out.shape, "u8");
    copy.buffer.copyFrom(out.buffer, { stream: compute });
    assert.deepStrictEqual(await copy.toHost({ stream: compute }), workerDecode(bytes));
    await decodeStream.synchronize();
  },
});

Deno.test({
  name: "deferred streams: the pixels are not there before the stream runs, then exact [cuda]",
  ignore: ignore || TJ === undefined,
  async fn() {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", new URL("./_nvjpeg_order_child.ts", import.meta.url).pathname],
      env: {
        PINSTREAM_CUDA_EMULATOR: "1",
        PINSTREAM_EMU_STREAMS: "deferred",
        [NVJPEG_LIB_ENV]: LIB!,
      },
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assert.ok(out.success, new TextDecoder().decode(out.stderr));
    assert.deepStrictEqual(JSON.parse(text), { early: 0, late: 0 });
  },
});

Deno.test({
  name: "a corrupt or truncated JPEG fails naming the file; a mixed size is refused [cuda]",
  ignore: ignore || TJ === undefined,
  async fn() {
    using device = Device.open("cuda");
    using d = open(device);
    using stream = new Stream(device);
    const good = jpegPattern(TJ!, 16, 16, 3);
    assert.throws(
      () =>
        d.decode([{ name: "good.jpg", bytes: good }, {
          name: "junk.jpg",
          bytes: new Uint8Array(64).fill(7),
        }]),
      /^Error: Cannot read junk\.jpg as a JPEG: nvJPEG says NVJPEG_STATUS_BAD_JPEG$/,
    );
    // Cut inside its tables: the header fails, and the next file still reads.
    assert.throws(
      () => d.info({ name: "short.jpg", bytes: good.slice(0, 200) }),
      /^Error: Cannot read short\.jpg as a JPEG/,
    );
    assert.deepStrictEqual(d.info({ name: "good.jpg", bytes: good }), {
      height: 16,
      width: 16,
      components: 3,
    });
    const cut = good.slice(0, good.length - 40);
    assert.throws(
      () =>
        d.decode([{ name: "good.jpg", bytes: good }, { name: "cut.jpg", bytes: cut }], { stream }),
      /^Error: Cannot decode cut\.jpg on the device: nvJPEG says NVJPEG_STATUS_BAD_JPEG$/,
    );
    assert.throws(
      () =>
        d.decode([
          { name: "good.jpg", bytes: good },
          { name: "wide.jpg", bytes: jpegPattern(TJ!, 16, 24, 3) },
        ]),
      /Cannot decode wide\.jpg on the device: it is 24x16, the batch 16x16 \(good\.jpg\); device decoding does not resize/,
    );
    using wrong = Tensor.empty(device, [1, 16, 16, 4], "u8");
    assert.throws(
      () => d.decode([{ name: "good.jpg", bytes: good }], { out: wrong }),
      /out must be a u8 \[1,16,16,3\] tensor/,
    );
    await stream.synchronize();
    // The decoder still works after the failures.
    using ok = d.decode([{ name: "good.jpg", bytes: good }], { stream });
    assert.deepStrictEqual(await ok.toHost({ stream }), workerDecode(good));
  },
});

Deno.test({
  name: "decodeJpegsOnDevice reads files and names the one that fails [cuda]",
  ignore: ignore || TJ === undefined,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "pinstream-nvjpeg-files-" });
    const prev = Deno.env.get(NVJPEG_LIB_ENV);
    Deno.env.set(NVJPEG_LIB_ENV, LIB!);
    try {
      using device = Device.open("cuda");
      const a = jpegPattern(TJ!, 20, 12, 3, 1), b = jpegPattern(TJ!, 20, 12, 3, 2);
      await Deno.writeFile(`${dir}/a.jpg`, a);
      await Deno.writeFile(`${dir}/b.jpg`, b);
      await Deno.writeFile(`${dir}/bad.jpg`, b.slice(0, 100));
      using out = await decodeJpegsOnDevice(device, [`${dir}/a.jpg`, `${dir}/b.jpg`]);
      const got = await out.toHost() as Uint8Array;
      assert.deepStrictEqual(got, new Uint8Array([...workerDecode(a), ...workerDecode(b)]));
      await assert.rejects(
        decodeJpegsOnDevice(device, [`${dir}/a.jpg`, `${dir}/bad.jpg`]),
        new RegExp(`${dir}/bad\\.jpg`),
      );
    } finally {
      if (prev === undefined) Deno.env.delete(NVJPEG_LIB_ENV);
      else Deno.env.set(NVJPEG_LIB_ENV, prev);
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "bench/nvjpeg.ts runs its GPU path on the stand-in, its bytes equal TurboJPEG's [cuda]",
  ignore: ignore || TJ === undefined,
  async fn() {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", new URL("../bench/nvjpeg.ts", import.meta.url).pathname],
      env: {
        PINSTREAM_CUDA_EMULATOR: "1",
        PINSTREAM_BENCH_SMOKE: "1",
        [NVJPEG_LIB_ENV]: LIB!,
        NO_COLOR: "1",
      },
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assert.ok(out.success, text + new TextDecoder().decode(out.stderr));
    assert.match(text, /bytes differing from libjpeg-turbo in the first batch: 0 of 3072/);
  },
});
