/**
 * The slot ring both prefetchers share: `depth + 1` device slots, each guarded by three events
 * (its copy's start and end on the copy stream, and `free`, recorded on the compute stream when
 * the consumer is done with it), and the epoch run that keeps `depth` of them in flight.
 *
 * What a slot holds (device tensors, staging, raw bytes) and how a batch fills it differ
 * between the image path and the any-batch path; the hand-off does not: a slot is claimed in
 * ring order, its copy waits on the device for its previous batch's `free`, the compute stream
 * waits for its `copyDone`, and the epoch's end returns every slot in that state. Keeping one
 * copy of these rules means both paths keep the same lifetimes.
 *
 * @module
 */

import type { Device } from "../ffi/device.ts";
import { Event, Stream } from "../ffi/stream.ts";
import { range } from "../internal/trace.ts";
import type { PipelineStats } from "./prefetcher.ts";

/** The events that guard one slot of the ring, and what was recorded on them. */
export interface RingSlot {
  copyStart: Event;
  copyDone: Event;
  /** Recorded on the compute stream when the slot's contents are no longer needed. */
  free: Event;
  /** Whether `free` was recorded since the slot was last filled. */
  freeRecorded: boolean;
  /** Whether `copyDone` of the previous fill was accounted (stats, staging reuse). */
  copyAccounted: boolean;
}

/** Adds a native resource to the ring's cleanup list and returns it. */
export type Keep = <T extends Disposable>(r: T) => T;

/** Collects the errors of a series of disposals, so that one failure does not leak the rest. */
export type Dispose = (r: Disposable | undefined) => void;

/** How a ring is built: its extra resources and its slots. */
export interface SlotRingParts<S extends RingSlot> {
  /** Resources of the ring as a whole, made after the copy stream and freed after the slots. */
  setup?: (keep: Keep) => void;
  /** Slot `i`: its own resources (kept) around the given events. */
  slot: (keep: Keep, events: RingSlot, i: number) => S;
  /** Frees what a slot holds besides its events (they are freed after it). */
  release: (slot: S, dispose: Dispose) => void;
  /** The message of the AggregateError when several disposals fail. */
  freeMessage: string;
}

/** Streams and slots: the native side of a prefetcher. */
export class SlotRing<S extends RingSlot> {
  readonly copyStream: Stream;
  readonly compute: Stream;
  readonly slots: S[] = [];
  readonly #extras: Disposable[] = [];
  readonly #parts: SlotRingParts<S>;
  #freed = false;

  constructor(
    device: Device,
    depth: number,
    userStream: Stream | undefined,
    parts: SlotRingParts<S>,
  ) {
    this.#parts = parts;
    const cleanup: Disposable[] = [];
    const keep: Keep = (r) => {
      cleanup.push(r);
      return r;
    };
    try {
      // Non-blocking: the step's kernels usually run on the default stream, and a blocking
      // copy stream would serialize with them; the copy is ordered by events instead.
      this.copyStream = keep(new Stream(device, { nonBlocking: true }));
      this.compute = userStream ?? device.defaultStream;
      parts.setup?.((r) => {
        this.#extras.push(r);
        return keep(r);
      });
      // R = depth + 1 slots: the consumer's, plus `depth` in flight.
      for (let i = 0; i <= depth; i++) {
        const events: RingSlot = {
          copyStart: keep(new Event(device, { timing: true })),
          // The host waits on copyDone off its thread (loader-slot releases, backpressure):
          // sleeping there leaves the core to the loader's workers.
          copyDone: keep(new Event(device, { timing: true, blocking: true })),
          free: keep(new Event(device)),
          freeRecorded: false,
          copyAccounted: true,
        };
        const made = parts.slot(keep, events, i);
        this.slots.push(made);
      }
    } catch (err) {
      for (const r of cleanup.reverse()) r[Symbol.dispose]();
      throw err;
    }
  }

  /** Waits for every queued copy and kernel of the pipeline, then frees everything. */
  async free(): Promise<void> {
    if (this.#freed) return;
    this.#freed = true;
    // Device work may still read the slots' buffers or staging, and the consumer's last step
    // may still read a slot: let both streams drain first.
    await this.copyStream.synchronize();
    await this.compute.synchronize();
    const errors: unknown[] = [];
    const dispose: Dispose = (r) => {
      try {
        r?.[Symbol.dispose]();
      } catch (err) {
        errors.push(err);
      }
    };
    for (const s of this.slots) {
      this.#parts.release(s, dispose);
      for (const r of [s.copyStart, s.copyDone, s.free]) dispose(r);
    }
    for (const r of this.#extras) dispose(r);
    dispose(this.copyStream);
    if (errors.length > 0) {
      throw errors.length === 1 ? errors[0] : new AggregateError(errors, this.#parts.freeMessage);
    }
  }
}

/** A batch between its copy and the consumer. */
export interface Queued<S extends RingSlot> {
  slot: S;
  /** Samples of the batch. */
  size: number;
}

/**
 * One epoch over a {@linkcode SlotRing}: the async iterator handed to `for await`. A path
 * says how a batch is pulled into a slot (`submit`) and handed out (`deliver`); the run keeps
 * `depth` batches in flight, serializes `next()` calls, keeps the stats and ends the epoch.
 */
export abstract class SlotEpoch<S extends RingSlot, Q extends Queued<S>, V>
  implements AsyncIterableIterator<V> {
  protected readonly ring: SlotRing<S>;
  protected readonly source: AsyncIterator<unknown>;
  protected readonly queue: Q[] = [];
  /** The batch the consumer holds. */
  protected current: Q | undefined;
  protected exhausted = false;
  protected epoch = -1;
  protected hostWaitMs = 0;
  protected copyBytes = 0;
  readonly #depth: number;
  #next = 0;
  #finished = false;
  #t0 = -1;
  #batches = 0;
  #samples = 0;
  #waitMs = 0;
  #deviceWaitMs = 0;
  #copyMs = 0;
  #copiesTimed = 0;
  #failure: unknown;

  /**
   * @param epoch The epoch the stats name, or -1 to take it from the first batch. A loader
   * moves its epoch on when iterated, so read it before making `source`.
   */
  constructor(ring: SlotRing<S>, depth: number, epoch: number, source: AsyncIterator<unknown>) {
    this.ring = ring;
    this.#depth = depth;
    this.epoch = epoch;
    this.source = source;
  }

  /** Pulls one loader batch and queues it for a slot; false at the epoch's end. */
  protected abstract submit(): Promise<boolean>;
  /** Hands a queued batch to the compute stream; the value the consumer gets. */
  protected abstract deliver(b: Q): V;
  /** Tells the owner the epoch ended. */
  protected abstract ended(stats: PipelineStats, early: boolean): Promise<void>;
  /** At the epoch's end, before the queue is dropped: gives back what queued batches hold. */
  protected releaseQueued(_errors: unknown[]): Promise<void> {
    return Promise.resolve();
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<V> {
    return this;
  }

  snapshot(): PipelineStats {
    const wallMs = this.#t0 < 0 ? 0 : performance.now() - this.#t0;
    return {
      epoch: this.epoch,
      batches: this.#batches,
      samples: this.#samples,
      wallMs,
      waitMs: this.#waitMs,
      hostWaitMs: this.hostWaitMs,
      deviceWaitMs: this.#deviceWaitMs,
      copyMs: this.#copyMs,
      copiesTimed: this.#copiesTimed,
      copyBytes: this.copyBytes,
      inputBoundFraction: wallMs > 0 ? Math.min(1, this.#waitMs / wallMs) : 0,
      samplesPerSecond: wallMs > 0 ? this.#samples / (wallMs / 1000) : 0,
    };
  }

  /**
   * The previous next() call. Each call awaits the loader and the device several times while
   * it moves batches between the loader, the in-flight queue and the consumer; a call that
   * started in one of those gaps took batches out of order (even "done" before the last
   * batch). Calls therefore run one after another, as an async generator's do.
   */
  #serial: Promise<unknown> = Promise.resolve();

  next(): Promise<IteratorResult<V>> {
    const r = this.#serial.then(() => this.#step());
    this.#serial = r.catch(() => {});
    return r;
  }

  async #step(): Promise<IteratorResult<V>> {
    if (this.#finished) return { done: true, value: undefined };
    using _ = range("pipeline.next");
    const t = performance.now();
    if (this.#t0 < 0) this.#t0 = t;
    const deviceWait0 = this.#deviceWaitMs;
    try {
      // The consumer is done queuing work on the batch it holds: mark the compute stream.
      const cur = this.current;
      if (cur !== undefined) {
        cur.slot.free.record(this.ring.compute);
        cur.slot.freeRecorded = true;
        this.current = undefined;
      }
      // Keep `depth` batches in flight, plus the one about to be handed out.
      while (!this.exhausted && this.queue.length < this.#depth + 1) {
        if (!(await this.submit())) break;
      }
      const b = this.queue.shift();
      if (b === undefined) {
        await this.#finish(false);
        return { done: true, value: undefined };
      }
      const value = this.deliver(b);
      this.current = b;
      this.#batches++;
      this.#samples += b.size;
      this.#waitMs += performance.now() - t - (this.#deviceWaitMs - deviceWait0);
      return { done: false, value };
    } catch (err) {
      this.#failure ??= err;
      await this.#finish(true).catch(() => {});
      throw err;
    }
  }

  async return(): Promise<IteratorResult<V>> {
    await this.#finish(true);
    return { done: true, value: undefined };
  }

  async throw(err?: unknown): Promise<IteratorResult<V>> {
    await this.#finish(true);
    throw err;
  }

  /** The next slot in ring order. */
  protected nextSlot(): S {
    const slot = this.ring.slots[this.#next];
    this.#next = (this.#next + 1) % this.ring.slots.length;
    return slot;
  }

  /** Orders the next copy into `slot` after the consumer's (or the kernel's) last use of it. */
  protected orderAfterFree(slot: S): void {
    if (slot.freeRecorded) this.ring.copyStream.waitEvent(slot.free);
    slot.freeRecorded = false;
  }

  /** Awaits `p`, counted as time spent waiting for the device (`deviceWaitMs`). */
  protected async waitForDevice(p: Promise<unknown>): Promise<void> {
    const td = performance.now();
    await p;
    this.#deviceWaitMs += performance.now() - td;
  }

  /**
   * Reads the copy time of the slot's previous fill. With `mustWait` (host staging about to
   * be rewritten) the host waits for that copy, which waits for the device to finish the step
   * that last used the slot (device-bound time).
   */
  protected async accountCopy(slot: S, mustWait: boolean): Promise<void> {
    if (slot.copyAccounted) return;
    if (!slot.copyDone.query()) {
      if (!mustWait) {
        // Only the statistic needs it: never stall the host for it (the device-side
        // waitEvent already orders the reuse). This copy stays untimed.
        slot.copyAccounted = true;
        return;
      }
      await this.waitForDevice(slot.copyDone.synchronize());
    }
    this.#copyMs += slot.copyStart.elapsedMs(slot.copyDone);
    this.#copiesTimed++;
    slot.copyAccounted = true;
  }

  async #finish(early: boolean): Promise<void> {
    if (this.#finished) return;
    this.#finished = true;
    const errors: unknown[] = [];
    try {
      if (early) await this.source.return?.();
    } catch (err) {
      errors.push(err);
    }
    await this.releaseQueued(errors);
    this.queue.length = 0;
    // The consumer's last batch: later copies into its slot must wait for its work.
    try {
      if (this.current !== undefined) {
        this.current.slot.free.record(this.ring.compute);
        this.current.slot.freeRecorded = true;
      }
    } catch (err) {
      errors.push(err);
    }
    this.current = undefined;
    for (const slot of this.ring.slots) {
      try {
        await this.accountCopy(slot, true);
      } catch (err) {
        errors.push(err);
      }
    }
    const stats = this.snapshot();
    try {
      await this.ended(stats, early);
    } catch (err) {
      errors.push(err);
    }
    if (errors.length > 0 && this.#failure === undefined) {
      throw errors.length === 1 ? errors[0] : new AggregateError(errors, "Cannot end the epoch");
    }
  }
}

/**
 * A prefetcher's ring and running epoch across its epochs: the ring is made for the first
 * epoch, kept for the next one with `persistent`, and freed when an epoch ends early or the
 * prefetcher is disposed.
 */
export class RingLease<
  R extends { free(): Promise<void> },
  E extends { snapshot(): PipelineStats },
> {
  /** The native side, while it is held. */
  ring: R | undefined;
  /** The epoch in progress. */
  active: E | undefined;
  readonly #history: PipelineStats[];

  /** @param history The owner's list of finished epochs' stats, appended to here. */
  constructor(history: PipelineStats[]) {
    this.#history = history;
  }

  /** The epoch in progress, else the last finished one (undefined before any). */
  stats(): PipelineStats | undefined {
    return this.active?.snapshot() ?? this.#history[this.#history.length - 1];
  }

  /** Records an epoch's end; frees the ring when `free` (early end, not persistent, disposed). */
  async ended(run: E, stats: PipelineStats, free: boolean): Promise<void> {
    if (this.active === run) this.active = undefined;
    this.#history.push(stats);
    if (free) await this.free();
  }

  /** Frees the ring (after the copies in flight); the next epoch makes a new one. */
  async free(): Promise<void> {
    const ring = this.ring;
    this.ring = undefined;
    await ring?.free();
  }
}
