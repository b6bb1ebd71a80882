/**
 * Child of tests/nvjpeg_test.ts, run on the CUDA emulator with deferred streams
 * (`PINSTREAM_EMU_STREAMS=deferred`) and the nvJPEG stand-in in `PINSTREAM_NVJPEG_LIB`: decodes
 * a JPEG on a stream into a zeroed tensor and reads the tensor's memory directly, once at once
 * and once after the stream is synchronized. Prints one JSON line:
 * `{ "early": <bytes already written>, "late": <bytes that differ from TurboJPEG's decode> }`.
 *
 *     deno run -A tests/_nvjpeg_order_child.ts
 *
 * @module
 */

import { Device } from "../ffi/device.ts";
import { openNvjpeg } from "../ffi/nvjpeg.ts";
import { Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import { TurboJpeg } from "../decode/turbojpeg.ts";
import { jpegPattern } from "./_nvjpeg_fixtures.ts";

using device = Device.open("cuda");
using tj = new TurboJpeg();
const bytes = jpegPattern(tj, 24, 40, 3);
const header = tj.header(bytes);
const want = tj.decode(bytes, 3, header, header).data;
const decoder = openNvjpeg(device);
if (typeof decoder === "string") throw new Error(decoder);
using _ = decoder;
using stream = new Stream(device);
using out = Tensor.fromHost(device, new Uint8Array(want.length), [1, 24, 40, 3]);
await device.defaultStream.synchronize();
decoder.decode([{ name: "pattern.jpg", bytes }], { stream, out });
const view = () =>
  new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(out.pointer!, want.length).slice(0));
const early = view().filter((v) => v !== 0).length;
await stream.synchronize();
const got = view();
let late = 0;
for (let i = 0; i < want.length; i++) late += got[i] !== want[i] ? 1 : 0;
console.log(JSON.stringify({ early, late }));
