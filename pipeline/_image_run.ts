/**
 * The image path's epoch: how a loader batch reaches its device slot (in place, copied from
 * the registered or pageable ring, from pinned staging, or built on the host) and the
 * transform chain queued on the compute stream (the geometry kernel, the fused augment
 * kernel, the label widening). The slot ring and the epoch's hand-off are
 * {@linkcode SlotRing} and {@linkcode SlotEpoch}; the lifetimes are described in
 * prefetcher.ts.
 *
 * @module
 */

import { DeviceBuffer, HostBuffer } from "../ffi/memory.ts";
import type { Stream } from "../ffi/stream.ts";
import { Tensor } from "../ffi/tensor.ts";
import { RingBatch, type RingField } from "../loader/ring.ts";
import { range } from "../internal/trace.ts";
import { imageAugment, imageGeometry, imageLabelsI32 } from "../ops/image.ts";
import { augmentHost } from "../augment/host.ts";
import { geometryHost } from "../augment/geometry_host.ts";
import type { ImageLayout } from "../augment/image.ts";
import { type Queued, type RingSlot, SlotEpoch, SlotRing } from "./_slot_ring.ts";
import { type Geometry, LABEL_BYTES } from "./_image_options.ts";
import type { DeviceBatch, DevicePrefetcher, PipelineStats } from "./prefetcher.ts";

/** A device slot and the events that guard it. */
interface Slot extends RingSlot {
  images: Tensor;
  labels: Tensor;
  /** Device mode: the raw slot bytes; host mode: unused. */
  raw: DeviceBuffer | undefined;
  /** Host mode: floats + int32 labels; "alloc" pinning: a copy of the loader slot. */
  staging: HostBuffer | undefined;
  /** With the loader's geometry: the transformed uint8 images, [n, h, w, c]. */
  pixels: Tensor | undefined;
  /** Tensors for short batches (the last of an epoch), keyed by size. */
  partial: Map<number, Views>;
}

/** A slot's tensors for a batch of one size. */
interface Views {
  images: Tensor;
  labels: Tensor;
  pixels: Tensor | undefined;
}

interface InFlight extends Queued<Slot> {
  index: number;
  epoch: number;
  /** The loader slot, held until the copy has fired (device mode with register/none). */
  host: RingBatch | undefined;
}

/**
 * How a loader batch reaches its device slot. Chosen once per prefetcher from its options
 * and backend (see {@linkcode stagingOf}); every step asks {@linkcode STAGING} what it means.
 *
 * - "in-place": device mode on the CPU backend with `copy: "auto"`: the kernel reads the
 *   registered loader slot where it is; nothing is copied.
 * - "registered": device mode, `pin: "register"`: the copy reads the registered loader slot.
 * - "pageable": device mode, `pin: "none"`: the copy reads the loader slot as plain memory.
 * - "pinned-copy": device mode, `pin: "alloc"`: the host copies the slot into pinned staging
 *   (the loader slot is free at once), and the copy reads that.
 * - "host": `augmentOn: "host"`: the host builds floats and int32 labels in pinned staging,
 *   and those are copied.
 */
type Staging = "in-place" | "registered" | "pageable" | "pinned-copy" | "host";

interface StagingTraits {
  /** A copy stream copy brings the batch to the device (the compute stream waits for it). */
  copies: boolean;
  /** The fused kernel runs on the device at delivery, on the raw slot bytes. */
  kernelAtDelivery: boolean;
  /** The copy reads the loader slot itself: the slot is held until the copy fired. */
  holdsLoaderSlot: boolean;
  /** The host rewrites pinned staging for each batch: it must wait for the last copy. */
  rewritesHostStaging: boolean;
}

const STAGING: Record<Staging, StagingTraits> = {
  "in-place": {
    copies: false,
    kernelAtDelivery: false,
    holdsLoaderSlot: false,
    rewritesHostStaging: false,
  },
  registered: {
    copies: true,
    kernelAtDelivery: true,
    holdsLoaderSlot: true,
    rewritesHostStaging: false,
  },
  pageable: {
    copies: true,
    kernelAtDelivery: true,
    holdsLoaderSlot: true,
    rewritesHostStaging: false,
  },
  "pinned-copy": {
    copies: true,
    kernelAtDelivery: true,
    holdsLoaderSlot: false,
    rewritesHostStaging: true,
  },
  host: {
    copies: true,
    kernelAtDelivery: false,
    holdsLoaderSlot: false,
    rewritesHostStaging: true,
  },
};

function stagingOf(p: DevicePrefetcher): Staging {
  if (p.augmentOn === "host") return "host";
  if (p.pin === "alloc") return "pinned-copy";
  if (p.pin === "none") return "pageable";
  // The CPU backend's device memory is host memory and its streams are synchronous: the
  // kernel can read the pinned loader slot in place, and the slot is free when it returns.
  return p.device.kind === "cpu" && p.copy === "auto" ? "in-place" : "registered";
}

/** The native side of a prefetcher: streams, pinning and the device slots. */
export class Resources extends SlotRing<Slot> {
  readonly g: Geometry;
  readonly layout: ImageLayout;
  readonly staging: Staging;
  readonly traits: StagingTraits;
  /** The loader's ring, registered ("in-place" and "registered" staging). */
  readonly pinned: HostBuffer | undefined;
  readonly batchSize: number;
  /** Host mode: byte offset of the int32 labels in a staging buffer, after the images. */
  readonly labelsAt: number;

  constructor(
    owner: DevicePrefetcher,
    o: { geometry: Geometry; layout: ImageLayout; userStream: Stream | undefined },
  ) {
    const device = owner.device, g = o.geometry;
    const staging = stagingOf(owner), traits = STAGING[staging];
    const ring = owner.loader.ring!;
    const n = ring.batchSize, { c, h, w } = g, count = n * c * h * w;
    const esize = owner.dtype === "f16" ? 2 : 4;
    // 256-aligned, as an Int32Array view needs (and a DMA engine likes).
    const labelsAt = Math.ceil((count * esize) / 256) * 256;
    let pinned: HostBuffer | undefined;
    super(device, owner.depth, o.userStream, {
      setup: (keep) => {
        if (staging === "in-place" || staging === "registered") {
          pinned = keep(HostBuffer.register(device, ring.buffer));
        }
      },
      slot: (keep, events) => ({
        ...events,
        images: keep(Tensor.empty(device, [n, c, h, w], owner.dtype)),
        labels: keep(Tensor.empty(device, [n], "i32")),
        // The transformed bytes the augment kernel reads (device modes).
        pixels: g.transform && staging !== "host"
          ? keep(Tensor.empty(device, [n, h, w, c], "u8"))
          : undefined,
        raw: traits.kernelAtDelivery ? keep(DeviceBuffer.alloc(device, g.copyBytes)) : undefined,
        staging: staging === "pinned-copy"
          ? keep(HostBuffer.alloc(device, g.copyBytes))
          : staging === "host"
          ? keep(HostBuffer.alloc(device, labelsAt + n * 4))
          : undefined,
        partial: new Map(),
      }),
      release: (s, dispose) => {
        for (const p of s.partial.values()) {
          dispose(p.images);
          dispose(p.labels);
          dispose(p.pixels);
        }
        for (const r of [s.images, s.labels, s.pixels, s.raw, s.staging]) dispose(r);
      },
      freeMessage: "Cannot free the pipeline",
    });
    this.g = g;
    this.layout = o.layout;
    this.staging = staging;
    this.traits = traits;
    this.pinned = pinned;
    this.batchSize = n;
    this.labelsAt = labelsAt;
  }
}

/** One epoch: the async iterator handed to `for await`. */
export class EpochRun extends SlotEpoch<Slot, InFlight, DeviceBatch> {
  readonly #p: DevicePrefetcher;
  readonly #r: Resources;
  /**
   * Releases of loader slots whose copies have not fired yet, oldest first; each removes
   * itself when done.
   */
  readonly #pending: Promise<void>[] = [];

  constructor(p: DevicePrefetcher, r: Resources) {
    super(r, p.depth, -1, p.loader[Symbol.asyncIterator]());
    this.#p = p;
    this.#r = r;
  }

  protected ended(stats: PipelineStats, early: boolean): Promise<void> {
    return this.#p._epochEnded(this, stats, early);
  }

  /** Host slots still held go back once their copies fired. */
  protected override async releaseQueued(errors: unknown[]): Promise<void> {
    await Promise.allSettled([...this.#pending]);
    for (const b of this.queue) {
      try {
        if (b.host !== undefined) {
          await b.slot.copyDone.synchronize();
          b.host.release();
        }
      } catch (err) {
        errors.push(err);
      }
    }
  }

  /** Pulls one loader batch and queues it for a device slot; false at the epoch's end. */
  protected async submit(): Promise<boolean> {
    await this.#holdBack();
    const hb = await this.#pull();
    if (hb === undefined) return false;
    const slot = await this.#claimSlot();
    const b: InFlight = { slot, size: hb.size, index: hb.index, epoch: hb.epoch, host: undefined };
    const res = this.#r;
    if (res.staging === "in-place") this.#readInPlace(slot, hb);
    else {
      if (res.staging === "host") this.#copyAugmentedOnHost(slot, hb);
      else this.#copyRaw(slot, hb);
      slot.copyDone.record(res.copyStream);
      slot.copyAccounted = false;
      if (res.traits.holdsLoaderSlot) await this.#releaseAfterCopy(b, hb);
    }
    this.queue.push(b);
    return true;
  }

  /**
   * Backpressure. Each loader slot kept here waits for its copy, and the copy for the device
   * to finish the step that last used its device slot. Nothing else stops a host that
   * queues steps faster than the device runs them, so without this wait it would soon hold
   * every slot of the loader's ring and starve the loader. Waiting on the oldest copy keeps
   * the host a bounded number of steps ahead of the device.
   */
  async #holdBack(): Promise<void> {
    while (this.#pending.length >= this.#p.loader.maxHeldBatches) {
      await this.waitForDevice(this.#pending[0]);
    }
  }

  /** The loader's next batch, or undefined when its epoch ended. */
  async #pull(): Promise<RingBatch | undefined> {
    const th = performance.now();
    const r = await this.source.next();
    this.hostWaitMs += performance.now() - th;
    if (r.done) {
      this.exhausted = true;
      return undefined;
    }
    const hb = r.value;
    if (!(hb instanceof RingBatch)) {
      throw new TypeError(
        "Cannot prefetch: the loader yielded a batch outside its staging ring (generic path)",
      );
    }
    if (this.epoch < 0) this.epoch = hb.epoch;
    return hb;
  }

  /** The next device slot in ring order, ordered after every use of its previous batch. */
  async #claimSlot(): Promise<Slot> {
    const slot = this.nextSlot();
    // Host staging is rewritten by the host: its last copy must be done. Device buffers are
    // guarded on the device instead.
    await this.accountCopy(slot, this.#r.traits.rewritesHostStaging);
    // The slot's previous batch: the consumer's work (host mode) or the kernel that read the
    // raw bytes (device mode) must be done before the copy overwrites it.
    this.orderAfterFree(slot);
    return slot;
  }

  /** "in-place" staging: the kernel reads the registered loader slot, free when it returns. */
  #readInPlace(slot: Slot, hb: RingBatch): void {
    const res = this.#r;
    const views = this.#views(slot, hb.size);
    this.#launch((f) => res.pinned!.pointerAt(hb.byteOffset + f.byteOffset, "read"), views);
    hb.release();
  }

  /** Device mode: queues the copy of the slot's raw bytes (the kernel runs at delivery). */
  #copyRaw(slot: Slot, hb: RingBatch): void {
    const res = this.#r, copy = res.copyStream, raw = slot.raw!;
    using _ = range("pipeline.copy", { stream: copy });
    const bytes = this.#copyExtent(hb.size);
    if (res.staging === "pinned-copy") {
      // One host copy into pinned memory; the loader slot is free after it.
      const staging = slot.staging!;
      staging.u8.set(new Uint8Array(hb.ring.buffer, hb.byteOffset, bytes));
      hb.release();
      slot.copyStart.record(copy);
      raw.copyFrom(staging, { stream: copy, bytes });
    } else if (res.staging === "registered") {
      slot.copyStart.record(copy);
      raw.copyFrom(res.pinned!, { stream: copy, srcOffset: hb.byteOffset, bytes });
    } else {
      slot.copyStart.record(copy);
      raw.copyFrom(new Uint8Array(hb.ring.buffer, hb.byteOffset, bytes), { stream: copy, bytes });
    }
    this.copyBytes += bytes;
  }

  /** Host mode: floats and int32 labels built in pinned staging, then copied as they are. */
  #copyAugmentedOnHost(slot: Slot, hb: RingBatch): void {
    const res = this.#r, g = res.g, p = this.#p, n = hb.size;
    const esize = p.dtype === "f16" ? 2 : 4;
    const count = n * g.c * g.h * g.w;
    const st = slot.staging!;
    using _ = range("pipeline.augmentOnHost");
    const out = p.dtype === "f16"
      ? new Float16Array(st.arrayBuffer, st.u8.byteOffset, count)
      : new Float32Array(st.arrayBuffer, st.u8.byteOffset, count);
    let bytes = hb.fields[g.imageField.name] as Uint8Array;
    if (g.transform) {
      const transformed = new Uint8Array(n * g.h * g.w * g.c);
      geometryHost(bytes, hb.geometry!, transformed, {
        n,
        channels: g.c,
        srcStride: g.imageField.sampleBytes,
        height: g.h,
        width: g.w,
        antialias: g.transform.spec.antialias,
        fill: g.transform.spec.fill,
      });
      bytes = transformed;
    }
    augmentHost(bytes, hb.augment ?? null, out, {
      n,
      channels: g.c,
      height: g.h,
      width: g.w,
      layout: res.layout,
      pad: p.padding,
      affine: p._affine(),
    });
    new Int32Array(st.arrayBuffer, st.u8.byteOffset + res.labelsAt, n)
      .set(hb.fields[g.labelField.name] as ArrayLike<number>);
    hb.release();
    const { images, labels } = this.#views(slot, n);
    const copy = res.copyStream;
    using _copy = range("pipeline.copy", { stream: copy });
    slot.copyStart.record(copy);
    images.buffer.copyFrom(st, { stream: copy, bytes: count * esize });
    labels.buffer.copyFrom(st, { stream: copy, srcOffset: res.labelsAt, bytes: n * 4 });
    this.copyBytes += count * esize + n * 4;
  }

  /**
   * Gives the loader slot a queued copy reads back to the loader once that copy fired: at
   * once when it has, else when a nonblocking wait says so (in `#pending`, which
   * {@linkcode EpochRun.#holdBack} bounds).
   */
  async #releaseAfterCopy(b: InFlight, hb: RingBatch): Promise<void> {
    const done = b.slot.copyDone;
    if (this.#p.loader.autoRelease) {
      // The loader releases this slot when we ask for the next batch: the copy must be
      // done by then. (Build the loader with autoRelease: false to avoid this wait.)
      await this.waitForDevice(done.synchronize());
    } else if (done.query()) {
      hb.release();
    } else {
      b.host = hb;
      const p = done.synchronize().then(() => {
        hb.release();
        b.host = undefined;
      });
      this.#pending.push(p);
      p.finally(() => this.#pending.splice(this.#pending.indexOf(p), 1)).catch(() => {});
    }
  }

  /** Bytes of a slot a batch of `n` needs on the device. */
  #copyExtent(n: number): number {
    const g = this.#r.g;
    const ends = [
      g.imageField,
      g.labelField,
      ...(g.augmentField ? [g.augmentField] : []),
      ...(g.transform ? [g.transform.field] : []),
    ].map((f) => f.byteOffset + n * f.sampleBytes);
    return Math.max(...ends);
  }

  /** The tensors of a slot for a batch of `n`. */
  #views(slot: Slot, n: number): Views {
    if (n === this.#r.batchSize) {
      return { images: slot.images, labels: slot.labels, pixels: slot.pixels };
    }
    let v = slot.partial.get(n);
    if (v === undefined) {
      const { c, h, w } = this.#r.g, device = this.#p.device;
      // Tensors own exactly their bytes (no views), so a short batch gets its own tensors,
      // allocated once per slot and size (one size per epoch in practice).
      const made: Tensor[] = [];
      try {
        const make = (shape: number[], dtype: "f16" | "f32" | "i32" | "u8") => {
          made.push(Tensor.empty(device, shape, dtype));
          return made[made.length - 1];
        };
        v = {
          images: make([n, c, h, w], this.#p.dtype),
          labels: make([n], "i32"),
          pixels: slot.pixels ? make([n, h, w, c], "u8") : undefined,
        };
      } catch (err) {
        for (const t of made) t.dispose();
        throw err;
      }
      slot.partial.set(n, v);
    }
    return v;
  }

  /** Hands a batch to the compute stream: wait for its copy there, run the kernel. */
  protected deliver(b: InFlight): DeviceBatch {
    const res = this.#r, slot = b.slot;
    if (res.traits.copies) res.compute.waitEvent(slot.copyDone);
    const views = this.#views(slot, b.size), { images, labels } = views;
    if (res.traits.kernelAtDelivery) {
      const raw = slot.raw!;
      this.#launch((f) => raw.pointerAt(f.byteOffset, "augment a batch"), views);
    }
    return { images, labels, size: b.size, index: b.index, epoch: b.epoch };
  }

  /**
   * Queues the geometry kernel (with the loader's geometry), the fused kernel and the label
   * widening on the compute stream. The wrappers read the batch size (and c, h, w) from the
   * views, [n, c, h, w] and [n]; `at` gives where a ring field of the batch is.
   */
  #launch(at: (f: RingField) => Deno.PointerValue, { images, labels, pixels }: Views): void {
    const res = this.#r, g = res.g, stream = res.compute;
    let src = at(g.imageField);
    const params = g.augmentField ? at(g.augmentField) : null;
    const labelSrc = at(g.labelField);
    const geoParams = g.transform ? at(g.transform.field) : null;
    using _ = range("pipeline.augment", { stream });
    if (g.transform) {
      const spec = g.transform.spec;
      imageGeometry(src, pixels!, {
        params: geoParams,
        srcStride: g.imageField.sampleBytes,
        antialias: spec.antialias,
        fill: spec.fill,
        serial: this.#p._serialKernel(),
        stream,
      });
      src = pixels!.buffer.pointerAt(0, "augment a batch");
    }
    // Bare pointers: the ring's fields were laid out and checked when it was built.
    imageAugment(src, images, {
      layout: res.layout,
      affine: this.#p._affine(),
      padding: this.#p.padding,
      params,
      serial: this.#p._serialKernel(),
      // Without the loader's contrast option the records carry none: no mean-grey pre-pass.
      contrast: (this.#p.loader.augment?.contrast ?? 0) > 0,
      stream,
    });
    imageLabelsI32(labelSrc, labels, { labelBytes: LABEL_BYTES[g.labelField.dtype], stream });
  }
}
