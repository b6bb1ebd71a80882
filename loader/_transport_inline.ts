// numWorkers 0: no workers and nothing in flight. Each batch is loaded on the main thread
// when the consumer asks for it (gather into a free ring slot, or get + collate), as
// PyTorch's single-process iterator does; `timeout` bounds the batch's get() calls.

import { range } from "../internal/trace.ts";
import { Gatherer, SampleError } from "./_gather.ts";
import { fetchSamples, SampleFailure } from "./_fetch.ts";
import { errorFields, resolveRef } from "./_protocol.ts";
import {
  type EngineConfig,
  type EpochPlan,
  type Result,
  sampleError,
  SLOT_CONSUMER,
  SLOT_FREE,
  timeoutError,
} from "./_transport.ts";
import { defaultCollate } from "./collate.ts";

/** Loads batches on the main thread, one at a time, on demand. */
export class InlineLoader {
  #cfg: EngineConfig;
  #gatherer: Gatherer | undefined;
  #mainCollate: ((s: unknown[]) => unknown) | undefined;

  constructor(cfg: EngineConfig) {
    this.#cfg = cfg;
    if (cfg.gather) {
      this.#gatherer = new Gatherer(cfg.gather, cfg.dataset, -1, cfg.order.drawStride);
    }
  }

  /** Whether the dataset's fillRecord is ready (prepareFill awaited once). */
  #prepared = false;

  /** Waits for a promise from get() at most until the `timeout` deadline of this batch. */
  async #withDeadline<T>(p: Promise<T>, t0: number, b: number, plan: EpochPlan): Promise<T> {
    const limit = this.#cfg.timeout;
    if (!(limit > 0)) return await p;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(timeoutError(b, plan.epoch, limit, "numWorkers 0: get() did not settle")),
        Math.max(0, t0 + limit * 1000 - performance.now()),
      );
    });
    try {
      return await Promise.race([p, expired]);
    } finally {
      clearTimeout(timer);
    }
  }

  #checkDeadline(t0: number, b: number, plan: EpochPlan): void {
    const limit = this.#cfg.timeout;
    if (limit > 0 && performance.now() - t0 > limit * 1000) {
      throw timeoutError(b, plan.epoch, limit, "numWorkers 0: get() returned after the deadline");
    }
  }

  #freeSlot(): number {
    const state = this.#cfg.slotState!;
    for (let s = 0; s < state.length; s++) if (state[s] === SLOT_FREE) return s;
    return -1;
  }

  /**
   * Loads the consumer's next batch of `plan` and counts it yielded; `busy` gets the
   * milliseconds it took.
   */
  async load(plan: EpochPlan, busy: (ms: number) => void): Promise<Result> {
    using _ = range("loader.batch");
    const cfg = this.#cfg;
    const b = plan.yielded;
    const seq = plan.startSeq + b;
    const indices = plan.batches[b];
    const pos = plan.positions[b];
    const t0 = performance.now();
    let result: Result;
    if (cfg.ring) {
      const slot = this.#freeSlot();
      if (slot < 0) {
        // Nothing is in flight without workers: every slot is held by the consumer.
        const state = cfg.slotState!;
        let held = 0;
        for (const s of state) if (s === SLOT_CONSUMER) held++;
        throw new Error(
          `Cannot get batch ${plan.yielded} of epoch ${plan.epoch}: all ${state.length} ring ` +
            `slots are held by the consumer (${held} unreleased batches); call release() on ` +
            "batches you are done with, or raise the heldBatches option",
        );
      }
      (cfg.ring.view(slot, "indices", indices.length) as Int32Array).set(indices);
      if (!this.#prepared && cfg.gather?.filled?.length) {
        await cfg.dataset.prepareFill?.();
        this.#prepared = true;
      }
      try {
        this.#gatherer!.gather(slot, indices.length, plan.epoch, pos);
      } catch (e) {
        throw sampleError(
          e instanceof SampleError ? e.index : -1,
          b,
          plan.epoch,
          -1,
          errorFields(e),
        );
      }
      result = { kind: "slot", seq, slot, epoch: plan.epoch, batch: b, size: indices.length };
    } else {
      const deadline = {
        wait: <T>(p: Promise<T>) => this.#withDeadline(p, t0, b, plan),
        check: () => this.#checkDeadline(t0, b, plan),
      };
      const at = {
        seed: cfg.seed,
        epoch: plan.epoch,
        position: pos,
        stride: cfg.order.drawStride,
        workerId: -1,
      };
      let samples: unknown[];
      try {
        samples = await fetchSamples(cfg.dataset, indices, at, deadline);
      } catch (e) {
        if (!(e instanceof SampleFailure)) throw e;
        throw sampleError(e.index, b, plan.epoch, -1, errorFields(e.thrown));
      }
      let value: unknown = samples;
      const mode = cfg.collateMode;
      if (mode === "default") value = defaultCollate(samples);
      else if (typeof mode === "object") {
        this.#mainCollate ??= (await resolveRef(mode)) as (s: unknown[]) => unknown;
        value = this.#mainCollate(samples);
      }
      result = { kind: "value", seq, value, epoch: plan.epoch, batch: b, size: indices.length };
    }
    plan.dispatched = Math.max(plan.dispatched, b + 1);
    plan.yielded++;
    const dt = performance.now() - t0;
    busy(dt);
    cfg.onWait(dt / 1000, 0);
    return result;
  }
}
