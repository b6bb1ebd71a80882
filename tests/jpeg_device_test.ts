// decodeJpegBatches on the CUDA emulator with the nvJPEG stand-in: every batch equals the
// workers' TurboJPEG decode when the consumer's copy of it runs late, behind slow work on its
// stream (without the decode stream's wait for the consumer, the next-but-one batch lands in the
// slot first and the test fails), across a change of size and a short last batch; leaving early
// and a bad file free everything; with a stride, files of different sizes share a batch.

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { openNvjpeg } from "../ffi/nvjpeg.ts";
import { Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import { TurboJpeg } from "../decode/turbojpeg.ts";
import { decodeJpegBatches, type JpegBatch } from "../pipeline/jpeg_device.ts";
import { cudaIsEmulated } from "./_backends.ts";
import { jpegPattern } from "./_nvjpeg_fixtures.ts";
import { nvjpegStandIn } from "./_nvjpeg_stand_in.ts";

const LIB = cudaIsEmulated() ? nvjpegStandIn() : undefined;
let TJ: TurboJpeg | undefined;
try {
  TJ = new TurboJpeg();
} catch {
  TJ = undefined;
}
const ignore = LIB === undefined || TJ === undefined;

function open(device: Device) {
  const d = openNvjpeg(device, { library: LIB });
  if (typeof d === "string") throw new Error(d);
  return d;
}

/** Batches of `sizes[k]` files each, of `shapes[k]`; file j of batch k has seed 10 k + j. */
function batches(sizes: number[], shapes: [number, number][]): JpegBatch<number>[] {
  return sizes.map((n, k) => ({
    jpegs: Array.from({ length: n }, (_, j) => ({
      name: `b${k}-${j}.jpg`,
      bytes: jpegPattern(TJ!, shapes[k][0], shapes[k][1], 3, 10 * k + j),
    })),
    extra: k,
  }));
}

Deno.test({
  name: "decodeJpegBatches: each batch exact, read only after the last one is decoded [cuda]",
  ignore,
  async fn() {
    using device = Device.open("cuda");
    using decoder = open(device);
    using consumer = new Stream(device);
    const shapes: [number, number][] = [
      ...Array<[number, number]>(6).fill([16, 24]),
      ...Array<[number, number]>(4).fill([8, 40]),
    ];
    const input = batches([3, 3, 3, 3, 3, 3, 3, 3, 3, 2], shapes);
    // Made first: an allocation may wait for the device, which would hide a missing wait.
    const copies = input.map((b, k) =>
      Tensor.empty(device, [b.jpegs.length, ...shapes[k], 3], "u8")
    );
    using busyA = Tensor.empty(device, [4 << 20], "u8"),
      busyB = Tensor.empty(device, [4 << 20], "u8");
    const extras: number[] = [];
    try {
      for await (const b of decodeJpegBatches(input, decoder, { stream: consumer })) {
        // Slow work first, so the copy runs well after the next batch's decode was queued.
        for (let i = 0; i < 16; i++) busyB.buffer.copyFrom(busyA.buffer, { stream: consumer });
        copies[b.extra!].buffer.copyFrom(b.images.buffer, { stream: consumer });
        extras.push(b.extra!);
      }
      assert.deepStrictEqual(extras, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
      for (const [k, copy] of copies.entries()) {
        const got = await copy.toHost({ stream: consumer }) as Uint8Array;
        const want = input[k].jpegs.flatMap((f) => {
          const h = TJ!.header(f.bytes);
          return [...TJ!.decode(f.bytes, 3, h, h).data];
        });
        assert.deepStrictEqual(copy.shape, [input[k].jpegs.length, ...shapes[k], 3]);
        assert.ok(got.every((v, i) => v === want[i]), `batch ${k} differs`);
      }
    } finally {
      for (const c of copies) c.dispose();
    }
  },
});

Deno.test({
  name:
    "decodeJpegBatches: leaving early or a bad file frees the slots; the decoder goes on [cuda]",
  ignore,
  async fn() {
    using device = Device.open("cuda");
    using decoder = open(device);
    const input = batches([2, 2, 2], [[16, 16], [16, 16], [16, 16]]);
    let seen = 0;
    for await (const _ of decodeJpegBatches(input, decoder)) {
      if (++seen === 1) break;
    }
    assert.strictEqual(seen, 1);
    const bad = batches([2, 2], [[16, 16], [16, 16]]);
    bad[1].jpegs = [bad[1].jpegs[0], {
      name: "cut.jpg",
      bytes: bad[1].jpegs[1].bytes.slice(0, 200),
    }];
    await assert.rejects(
      async () => {
        for await (const _ of decodeJpegBatches(bad, decoder)) {
          // consume
        }
      },
      /Cannot (read|decode) cut\.jpg/,
    );
    const again = batches([1], [[16, 16]]);
    for await (const b of decodeJpegBatches(again, decoder)) {
      const h = TJ!.header(again[0].jpegs[0].bytes);
      assert.deepStrictEqual(
        await b.images.toHost(),
        TJ!.decode(again[0].jpegs[0].bytes, 3, h, h).data,
      );
    }
  },
});

Deno.test({
  name: "decodeJpegBatches with a stride: files of different sizes in one batch, each exact [cuda]",
  ignore,
  async fn() {
    using device = Device.open("cuda");
    using decoder = open(device);
    const shapes: [number, number][] = [[16, 24], [9, 31], [20, 8]];
    const stride = 20 * 31 * 3;
    const jpegs = shapes.map(([h, w], j) => ({
      name: `s${j}.jpg`,
      bytes: jpegPattern(TJ!, h, w, 3, j),
    }));
    let seen = 0;
    for await (const b of decodeJpegBatches([{ jpegs }], decoder, { stride })) {
      seen++;
      assert.deepStrictEqual(b.images.shape, [3, stride]);
      const got = await b.images.toHost() as Uint8Array;
      for (const [j, f] of jpegs.entries()) {
        const h = TJ!.header(f.bytes), want = TJ!.decode(f.bytes, 3, h, h).data;
        assert.deepStrictEqual(got.subarray(j * stride, j * stride + want.length), want);
      }
    }
    assert.strictEqual(seen, 1);
    await assert.rejects(
      async () => {
        for await (const _ of decodeJpegBatches([{ jpegs }], decoder, { stride: 1000 })) {
          // consume
        }
      },
      /Cannot decode s0\.jpg on the device: its 24x16 RGB pixels need 1152 bytes, more than the stride of 1000/,
    );
  },
});
