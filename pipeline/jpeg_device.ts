/**
 * Batches of JPEG files to batches of pixels on the device, decoded by nvJPEG on a stream of
 * their own: while the consumer works on batch k, batch k + 1 is decoded into the other of two
 * device slots. An event hands each batch to the consumer's stream (the device waits, the host
 * does not), and a slot is decoded into again only after the work the consumer queued on it
 * before asking for the next batch is done.
 *
 * The files come from anywhere: a DataLoader whose workers read them (a dataset giving
 * `{ name, bytes }`, a collate putting them in a list) keeps the reading off the main thread.
 *
 * @module
 */

import type { JpegInput, NvjpegDecoder } from "../ffi/nvjpeg.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import { Event, Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";

/** A batch of JPEG files and whatever goes with them (labels, say). */
export interface JpegBatch<E = undefined> {
  /** The files, all of one size (or of any sizes that fit `stride`, with that option). */
  jpegs: readonly JpegInput[];
  /** Carried to the device batch untouched. */
  extra?: E;
}

/** A decoded batch: valid until the next iteration. */
export interface DeviceJpegBatch<E = undefined> {
  /**
   * u8 `[n, height, width, 3]`, RGB interleaved, ready for work on the consumer's stream; with
   * `stride`, u8 `[n, stride]`, each image at its own size (rows packed) at byte `i * stride`.
   */
  images: Tensor;
  /** The batch's `extra`. */
  extra: E | undefined;
}

/** Options of {@linkcode decodeJpegBatches}. */
export interface DecodeJpegBatchesOptions {
  /** The stream the consumer works on (default: the device's current stream). */
  stream?: Stream;
  /**
   * Bytes between images: files of different sizes in one batch, each decoded at its own size
   * (see `NvjpegDecoder.decode`); the caller knows each file's size from its header.
   */
  stride?: number;
}

interface Slot {
  images: Tensor | undefined;
  decoded: Event;
  free: Event;
  freeRecorded: boolean;
}

/**
 * Decodes each batch with nvJPEG, one batch ahead of the consumer. Leaving the loop early
 * waits for the decodes queued and frees the slots.
 *
 * @param batches The files, batch by batch.
 * @param decoder nvJPEG, from `openNvjpeg`.
 * @param options `stream`.
 * @returns The device batches, in order.
 * @throws {Error} Naming the file, when one cannot be decoded or is not its batch's size.
 *
 * @example
 * ```ts
 * import { decodeJpegBatches, Device, openNvjpeg } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using device = Device.open("auto");
 * const decoder = openNvjpeg(device);
 * if (typeof decoder === "string") {
 *   assert.match(decoder, /stays on the workers/); // decode on the loader's workers instead
 * } else {
 *   using _ = decoder;
 *   let n = 0;
 *   for await (const _batch of decodeJpegBatches([], decoder)) n++;
 *   assert.strictEqual(n, 0);
 * }
 * ```
 */
export async function* decodeJpegBatches<E = undefined>(
  batches: AsyncIterable<JpegBatch<E>> | Iterable<JpegBatch<E>>,
  decoder: NvjpegDecoder,
  options: DecodeJpegBatchesOptions = {},
): AsyncGenerator<DeviceJpegBatch<E>> {
  refuseUnknownKeys(options ?? {}, ["stream", "stride"], "decode JPEG batches on the device");
  const stride = options.stride;
  const device = decoder.device;
  const consumer = options.stream ?? device.currentStream;
  const decodeStream = new Stream(device);
  const slots: Slot[] = [0, 1].map(() => ({
    images: undefined,
    decoded: new Event(device),
    free: new Event(device),
    freeRecorded: false,
  }));
  let pending: { slot: Slot; extra: E | undefined } | undefined;
  let k = 0;
  try {
    for await (const batch of batches) {
      const slot = slots[k++ % 2];
      // The consumer's work on this slot's previous batch comes first.
      if (slot.freeRecorded) decodeStream.waitEvent(slot.free);
      const n = batch.jpegs.length;
      const first = n > 0 && stride === undefined ? decoder.info(batch.jpegs[0]) : undefined;
      const shape = stride !== undefined
        ? [n, stride]
        : first
        ? [n, first.height, first.width, 3]
        : [0, 0, 0, 3];
      if (slot.images !== undefined && slot.images.shape.join() !== shape.join()) {
        // Another size: the memory may go back to a pool at once, so the consumer's work on
        // it must be done first (the host waits, once per change of size).
        if (slot.freeRecorded) await slot.free.synchronize();
        slot.images.dispose();
        slot.images = undefined;
      }
      // An empty batch (its samples came another way) keeps its place in the order.
      slot.images = n === 0
        ? slot.images ?? Tensor.empty(device, shape, "u8")
        : decoder.decode(batch.jpegs, { stream: decodeStream, out: slot.images, stride });
      slot.decoded.record(decodeStream);
      if (pending !== undefined) yield* handOver(pending);
      pending = { slot, extra: batch.extra };
    }
    if (pending !== undefined) yield* handOver(pending);
  } finally {
    await decodeStream.synchronize().catch(() => {}); // an error already thrown comes first
    await consumer.synchronize().catch(() => {});
    for (const s of slots) {
      s.images?.dispose();
      s.decoded.dispose();
      s.free.dispose();
    }
    decodeStream.dispose();
  }

  function* handOver(p: { slot: Slot; extra: E | undefined }): Generator<DeviceJpegBatch<E>> {
    consumer.waitEvent(p.slot.decoded);
    yield { images: p.slot.images!, extra: p.extra };
    p.slot.free.record(consumer);
    p.slot.freeRecorded = true;
  }
}
