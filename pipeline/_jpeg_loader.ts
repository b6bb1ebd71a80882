/**
 * One epoch of a DevicePrefetcher whose dataset hands JPEG bytes on (`decodeOn: "device"`): the
 * workers read each file into its image slot, `decodeJpegBatches` decodes each batch with nvJPEG
 * on a stream of its own (each image at its own size, packed at the start of its slot), and the
 * geometry kernel, the fused augment kernel and the label widening follow on the consumer's
 * stream, as on the workers' path.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { DeviceBuffer } from "../ffi/memory.ts";
import type { NvjpegDecoder } from "../ffi/nvjpeg.ts";
import type { Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import type { DataLoader } from "../loader/data_loader.ts";
import type { RingBatch } from "../loader/ring.ts";
import type { ImageDtype, NormalizeAffine } from "../augment/image.ts";
import { imageAugment, imageGeometry, imageLabelsI32 } from "../ops/image.ts";
import { decodeJpegBatches, type JpegBatch } from "./jpeg_device.ts";

/** What the epoch needs of its DevicePrefetcher. */
export interface DecodeRun {
  loader: DataLoader<unknown>;
  device: Device;
  decoder: NvjpegDecoder;
  dtype: ImageDtype;
  padding: number;
  affine: NormalizeAffine;
  stream: Stream | undefined;
  labelField: string;
  serial: () => boolean;
}

/** A device batch, as the DevicePrefetcher delivers it. */
export interface DecodedBatch {
  images: Tensor;
  labels: Tensor;
  size: number;
  index: number;
  epoch: number;
}

interface Extra {
  n: number;
  index: number;
  epoch: number;
  labels: ArrayBufferView<ArrayBuffer>;
  geometry: Int32Array<ArrayBuffer>;
  augment: Int32Array<ArrayBuffer> | undefined;
  /** The sample of each file decoded, in order. */
  where: number[];
  /** The samples the workers decoded (their `jpegLength` is -1): their pixels. */
  pixels: { sample: number; bytes: Uint8Array<ArrayBuffer> }[];
}

const LABEL_BYTES: Record<string, number> = { u8: 1, u16: 2, i32: 4 };

/**
 * The epoch's batches. Leaving early stops the loader's epoch and, once the work queued is
 * done, frees the decode slots and this epoch's tensors.
 */
export async function* decodedBatches(p: DecodeRun): AsyncGenerator<DecodedBatch> {
  const ring = p.loader.ring!, spec = p.loader.geometry!;
  const has = (n: string) => ring.fields.some((f) => f.name === n);
  const image = ring.field("image"), label = ring.field(p.labelField);
  const geometry = ring.field("geometry");
  const augment = has("augment") ? ring.field("augment") : undefined;
  const stride = image.sampleBytes, batchSize = p.loader.batchSize!;
  const [, , c] = image.sampleShape;
  const consumer = p.stream ?? p.device.currentStream;
  const dataset = p.loader.dataset as unknown as { path?: (i: number) => string };
  const nameOf = (i: number) => `sample ${i} (${dataset.path?.(i) ?? "?"})`;

  async function* files(): AsyncGenerator<JpegBatch<Extra>> {
    for await (const b of p.loader as AsyncIterable<RingBatch>) {
      let batch: JpegBatch<Extra>;
      try {
        const n = b.size, bytes = b.fields.image as Uint8Array;
        const lengths = b.fields.jpegLength as Int32Array;
        const sizes = b.fields.imageSize as Int32Array;
        // Copies: the slot goes back to the loader now; nvJPEG may read the bytes later.
        const jpegs = [], where: number[] = [], pixels: Extra["pixels"] = [];
        for (let i = 0; i < n; i++) {
          const at = i * stride;
          if (lengths[i] >= 0) {
            jpegs.push({ name: nameOf(b.indices[i]), bytes: bytes.slice(at, at + lengths[i]) });
            where.push(i);
          } else {
            const length = sizes[2 * i] * sizes[2 * i + 1] * c;
            pixels.push({ sample: i, bytes: bytes.slice(at, at + length) });
          }
        }
        const labels = b.fields[p.labelField];
        batch = {
          jpegs,
          extra: {
            n,
            index: b.index,
            epoch: b.epoch,
            labels: labels.slice() as unknown as ArrayBufferView<ArrayBuffer>,
            geometry: b.geometry!.slice(),
            augment: b.augment?.slice(),
            where,
            pixels,
          },
        };
      } finally {
        b.release();
      }
      yield batch;
    }
  }

  const made: (Tensor | DeviceBuffer)[] = [];
  const views = new Map<number, { pixels: Tensor; images: Tensor; labels: Tensor }>();
  const viewsOf = (n: number) => {
    let v = views.get(n);
    if (v === undefined) {
      const make = (shape: number[], dtype: "f16" | "f32" | "i32" | "u8") => {
        const t = Tensor.empty(p.device, shape, dtype);
        made.push(t);
        return t;
      };
      v = {
        pixels: make([n, spec.height, spec.width, c], "u8"),
        images: make([n, c, spec.height, spec.width], p.dtype),
        labels: make([n], "i32"),
      };
      views.set(n, v);
    }
    return v;
  };
  const buffer = (bytes: number) => {
    const b = DeviceBuffer.alloc(p.device, Math.max(1, bytes));
    made.push(b);
    return b;
  };
  try {
    const geoParams = buffer(geometry.sampleBytes * batchSize);
    const augParams = augment ? buffer(augment.sampleBytes * batchSize) : undefined;
    const labelRaw = buffer(label.sampleBytes * batchSize);
    let mixed: DeviceBuffer | undefined;
    const contrast = (p.loader.augment?.contrast ?? 0) > 0;
    for await (const d of decodeJpegBatches(files(), p.decoder, { stream: consumer, stride })) {
      const e = d.extra!, v = viewsOf(e.n);
      // Pageable copies: the host arrays may go as soon as the calls return, and the copies
      // run after the kernels that read the last batch's parameters (one stream).
      geoParams.copyFrom(e.geometry, { stream: consumer });
      if (augParams && e.augment) augParams.copyFrom(e.augment, { stream: consumer });
      labelRaw.copyFrom(e.labels, { stream: consumer });
      let src = d.images.buffer;
      if (e.pixels.length > 0) {
        // Some samples the workers decoded: the batch is put together in one more buffer.
        mixed ??= buffer(stride * batchSize);
        e.where.forEach((i, k) =>
          mixed!.copyFrom(src, {
            srcOffset: k * stride,
            dstOffset: i * stride,
            bytes: stride,
            stream: consumer,
          })
        );
        for (const x of e.pixels) {
          mixed.copyFrom(x.bytes, { dstOffset: x.sample * stride, stream: consumer });
        }
        src = mixed;
      }
      imageGeometry(src, v.pixels, {
        params: geoParams,
        srcStride: stride,
        antialias: spec.antialias,
        fill: spec.fill,
        serial: p.serial(),
        stream: consumer,
      });
      imageAugment(v.pixels.buffer, v.images, {
        layout: "nhwc",
        affine: p.affine,
        padding: p.padding,
        params: augParams ?? null,
        serial: p.serial(),
        contrast,
        stream: consumer,
      });
      imageLabelsI32(labelRaw, v.labels, {
        labelBytes: LABEL_BYTES[label.dtype],
        stream: consumer,
      });
      yield { images: v.images, labels: v.labels, size: e.n, index: e.index, epoch: e.epoch };
    }
  } finally {
    await consumer.synchronize().catch(() => {}); // an error already thrown comes first
    for (const t of made) t.dispose();
  }
}
