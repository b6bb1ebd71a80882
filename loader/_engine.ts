// The scheduler behind a DataLoader: plans epochs, hands batches to workers (at most
// prefetchFactor x numWorkers outstanding, one refilled per batch yielded), keeps a reorder
// buffer, and turns every failure (worker throw, worker exit or crash, timeout, a stall) into
// an error for the consumer instead of a hang.
//
// How batches reach workers is a Transport's business (see _transport.ts), chosen once:
// - zero-copy with workers: PullTransport (_transport_pull.ts), a shared control block the
//   workers read on their own, no message per batch;
// - generic with workers: PushTransport (_transport_push.ts), one message per batch each way;
// - numWorkers 0: no transport; InlineLoader (_transport_inline.ts) loads each batch on
//   demand on the main thread, as PyTorch's single-process iterator does.

import { span } from "../internal/trace.ts";
import {
  type EngineConfig,
  type EpochPlan,
  type Result,
  SLOT_CONSUMER,
  SLOT_FREE,
  timeoutError,
  type Transport,
  type TransportHost,
} from "./_transport.ts";
import { InlineLoader } from "./_transport_inline.ts";
import { PullTransport } from "./_transport_pull.ts";
import { PushTransport } from "./_transport_push.ts";

export {
  type EngineConfig,
  type EpochPlan,
  type Result,
  SLOT_CONSUMER,
  SLOT_FREE,
  SLOT_LOADER,
  TimeoutError,
  WorkerError,
  type WorkerResourceLimits,
} from "./_transport.ts";
export { liveWorkerCount } from "./_transport_workers.ts";

export class Engine {
  #cfg: EngineConfig;
  #plans: EpochPlan[] = [];
  #nextSeq = 0;
  #dispatchPlan: EpochPlan | undefined;
  /** The reorder buffer: finished batches by seq, filled by the transport. */
  #results = new Map<number, Result>();
  #outstanding = 0;
  #failure: Error | undefined;
  #closed = false;
  #wake: (() => void) | undefined;
  /** With workers: how batches reach them. */
  #transport: Transport | undefined;
  /** Without workers: loads each batch on demand. */
  #inline: InlineLoader | undefined;
  /** Milliseconds workers spent loading (summed over workers), for stats. */
  busyMs = 0;

  constructor(cfg: EngineConfig) {
    this.#cfg = cfg;
    if (cfg.numWorkers === 0) {
      this.#inline = new InlineLoader(cfg);
      return;
    }
    const host: TransportHost = {
      cfg,
      results: this.#results,
      outstanding: () => this.#outstanding,
      nextPlan: () => this.#nextDispatchPlan(),
      claim: (plan) => {
        this.#outstanding++;
        return plan.dispatched++;
      },
      settle: (p, result) => {
        if (p.plan.abandoned) {
          this.#outstanding--;
          this.pump();
          return;
        }
        this.#results.set(result.seq, result);
        // From hand-out to back, on the workers' track of a profile (internal/trace.ts).
        span("loader.batch", p.dispatchedAt, performance.now(), "loader workers");
        this.#wake?.();
      },
      forget: () => {
        this.#outstanding--;
      },
      pump: () => this.pump(),
      fail: (e) => this.#fail(e),
      wake: () => this.#wake?.(),
      addBusy: (ms) => {
        this.busyMs += ms;
      },
    };
    // A zero-copy loader with workers always pulls; only the generic path pushes.
    this.#transport = cfg.gather ? new PullTransport(host) : new PushTransport(host);
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** @internal The zero-copy control block, for fault-injection tests only. */
  get _control(): Int32Array | undefined {
    return this.#transport?.control;
  }

  get failure(): Error | undefined {
    return this.#failure;
  }

  #fail(error: Error): void {
    if (this.#failure || this.#closed) return;
    this.#failure = error;
    this.#stop();
    this.#wake?.();
  }

  /** Stops the workers; slots of results nobody will take go back to the ring. */
  #stop(): void {
    // Slots the workers held go back in the transport's stop.
    this.#transport?.stop();
    const state = this.#cfg.slotState;
    if (state) {
      for (const r of this.#results.values()) if (r.kind === "slot") state[r.slot] = SLOT_FREE;
    }
    this.#results.clear();
  }

  /** Stops every worker and frees every slot the engine holds. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#stop();
    this.#closed = true;
    this.#wake?.();
  }

  #planEpoch(epoch: number): EpochPlan {
    const map = this.#cfg.recordMap;
    // Sample -> record; an index outside the dataset becomes -1, which the gather reports as
    // out of range.
    const batches = map === undefined
      ? this.#cfg.order.batches(epoch)
      : this.#cfg.order.batches(epoch).map((b) =>
        b.map((i) => (i >= 0 && i < map.length ? map[i] : -1))
      );
    const cap = this.#cfg.ring?.batchSize;
    if (cap !== undefined) {
      for (let b = 0; b < batches.length; b++) {
        if (batches[b].length > cap) {
          throw new RangeError(
            `Cannot plan batch ${b} of epoch ${epoch}: it has ${batches[b].length} indices, ` +
              `the staging ring holds ${cap} per batch (sized from the sampler's length, or ` +
              "a batchSampler's largest batch of epoch 0)",
          );
        }
      }
    }
    // Each batch's first draw position: the key of its samples' streams (augment/record.ts).
    const order = this.#cfg.order;
    const positions = new Array<number>(batches.length);
    let pos = 0;
    for (let b = 0; b < batches.length; b++) {
      positions[b] = order.drawPosition(pos);
      pos += batches[b].length;
    }
    const plan: EpochPlan = {
      epoch,
      batches,
      positions,
      startSeq: this.#nextSeq,
      dispatched: 0,
      yielded: 0,
      abandoned: false,
    };
    this.#nextSeq += batches.length;
    this.#plans.push(plan);
    return plan;
  }

  /** Makes `epoch` the consumer's epoch, reusing a prefetched plan when it matches. */
  startEpoch(epoch: number): EpochPlan {
    if (this.#failure) throw this.#failure;
    // Only a plan nothing was taken from: one the consumer already went through (an epoch
    // run again after setEpoch) starts over.
    let plan = this.#plans.find((p) => p.epoch === epoch && !p.abandoned && p.yielded === 0);
    // A finished plan needs nothing undone (abandoning one would also wake the workers).
    for (const p of this.#plans) {
      if (p !== plan && p.yielded < p.batches.length) this.#abandon(p);
    }
    if (!plan) {
      plan = this.#planEpoch(epoch);
      this.#dispatchPlan = plan;
    }
    this.#plans = [plan];
    this.pump();
    return plan;
  }

  /** Drops what is left of an epoch (the consumer stopped early). */
  abandon(plan: EpochPlan): void {
    this.#abandon(plan);
    this.#plans = this.#plans.filter((p) => p !== plan);
    if (this.#cfg.persistent && this.#cfg.order.pure && !this.#failure) this.pump();
  }

  #abandon(plan: EpochPlan): void {
    if (plan.abandoned) return;
    plan.abandoned = true;
    const state = this.#cfg.slotState;
    for (const [seq, r] of this.#results) {
      if (r.epoch !== plan.epoch || seq < plan.startSeq) continue;
      if (seq >= plan.startSeq + plan.batches.length) continue;
      this.#results.delete(seq);
      this.#outstanding--;
      if (r.kind === "slot" && state) state[r.slot] = SLOT_FREE;
    }
    if (this.#dispatchPlan === plan) this.#dispatchPlan = undefined;
    this.#transport?.abandon(plan);
  }

  /** The next plan to dispatch from, planning the next epoch ahead when allowed. */
  #nextDispatchPlan(): EpochPlan | undefined {
    const cur = this.#dispatchPlan;
    if (cur && !cur.abandoned && cur.dispatched < cur.batches.length) return cur;
    if (!this.#canPrefetch()) return undefined;
    // Prefetch into the epoch after the consumer's, but never more than one ahead.
    const last = this.#plans[this.#plans.length - 1];
    if (!last) return undefined;
    if (last !== cur && !last.abandoned && last.dispatched < last.batches.length) {
      this.#dispatchPlan = last; // planned ahead while the consumer was waiting
      return last;
    }
    if (this.#plans.length >= 2) return undefined;
    if (last.dispatched < last.batches.length && !last.abandoned) return undefined;
    const next = this.#tryPlan(last.epoch + 1);
    if (!next) return undefined;
    this.#dispatchPlan = next;
    return next.batches.length > 0 ? next : undefined;
  }

  #canPrefetch(): boolean {
    return this.#cfg.persistent && this.#cfg.order.pure && this.#cfg.numWorkers > 0;
  }

  /**
   * Plans the next epoch while the consumer waits anyway, so that crossing the epoch
   * boundary costs no planning (a 50,000-sample shuffle is about half a millisecond).
   */
  #planAhead(): void {
    if (!this.#canPrefetch() || this.#plans.length !== 1) return;
    const cur = this.#plans[0];
    // Not at the start of an epoch: there the consumer's wait is for the boundary batch itself,
    // and planning would delay it by the planning time. Mid-epoch it costs one late batch.
    if (cur.abandoned || cur.yielded < cur.batches.length / 2) return;
    this.#tryPlan(cur.epoch + 1);
  }

  /**
   * Plans an epoch ahead of the consumer. A sampler that fails doing so (bad indices) fails
   * the loader; the consumer gets the error at its next batch, not the caller of release().
   */
  #tryPlan(epoch: number): EpochPlan | undefined {
    try {
      return this.#planEpoch(epoch);
    } catch (e) {
      this.#fail(e as Error);
      return undefined;
    }
  }

  /** Dispatches tasks until the in-flight limit, the plan's end or the ring's free slots. */
  pump(): void {
    if (!this.#transport || this.#failure || this.#closed) return;
    this.#transport.dispatch(this.#cfg.prefetchFactor * this.#cfg.numWorkers);
  }

  /** Moves finished batches into the reorder buffer. */
  #collect(): void {
    if (this.#closed || this.#failure) return;
    this.#transport?.collect();
  }

  /** The next result of `plan` for the consumer, or undefined at the end of the epoch. */
  async next(plan: EpochPlan): Promise<Result | undefined> {
    if (this.#failure) throw this.#failure;
    if (this.#closed) throw new Error("Cannot get a batch: the DataLoader was disposed");
    if (plan.yielded >= plan.batches.length) return undefined;
    if (this.#inline) {
      return await this.#inline.load(plan, (ms) => {
        this.busyMs += ms;
      });
    }
    const transport = this.#transport!;
    const t0 = performance.now();
    let depth = -1;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let watchdog: ReturnType<typeof setInterval> | undefined;
    try {
      while (true) {
        this.#collect();
        if (this.#failure) throw this.#failure;
        if (this.#closed) throw new Error("Cannot get a batch: the DataLoader was disposed");
        if (depth < 0) depth = this.#readyCount(plan);
        const r = this.#take(plan);
        if (r?.kind === "error") {
          this.#fail(r.error);
          throw r.error;
        }
        if (r) {
          this.#cfg.onWait((performance.now() - t0) / 1000, depth);
          this.#outstanding--;
          plan.yielded++;
          this.pump();
          return r;
        }
        this.pump();
        this.#checkStarved(plan);
        this.#planAhead();
        if (watchdog === undefined && this.#cfg.watchdog > 0) {
          watchdog = this.#watch(plan);
        }
        if (timer === undefined && this.#cfg.timeout > 0) {
          const b = plan.yielded;
          timer = setTimeout(() => {
            this.#fail(
              timeoutError(
                b,
                plan.epoch,
                this.#cfg.timeout,
                "every worker was stopped, including one stuck in a JavaScript loop",
              ),
            );
          }, this.#cfg.timeout * 1000);
        }
        const woken = new Promise<void>((resolve) => (this.#wake = resolve));
        await transport.wait(woken, () => this.#results.size > 0 && this.#hasDue(plan));
        this.#wake = undefined;
      }
    } finally {
      if (timer !== undefined) clearTimeout(timer);
      if (watchdog !== undefined) clearInterval(watchdog);
    }
  }

  /**
   * The stall watchdog of one wait: every quarter of the watchdog period it looks again
   * (collect, pump: a lost wake-up heals here), and when nothing moved for the whole period
   * while every worker sat idle, the loader cannot make progress on its own: that is a bug
   * in the loader, reported with its state instead of waiting forever.
   */
  #watch(plan: EpochPlan): ReturnType<typeof setInterval> {
    const period = this.#cfg.watchdog * 1000;
    let last = "";
    let since = performance.now();
    return setInterval(() => {
      if (this.#failure || this.#closed) return;
      this.#wake?.();
      const idle = this.#workersIdle();
      const now = performance.now();
      const sig = idle ? this.#progressSignature() : "";
      if (!idle || sig !== last) {
        last = sig;
        since = now;
        return;
      }
      if (now - since < period) return;
      this.#fail(
        new Error(
          `Cannot get batch ${plan.yielded} of epoch ${plan.epoch}: the DataLoader made no ` +
            `progress for ${((now - since) / 1000).toFixed(1)} s while every worker was idle. ` +
            "This is a bug in the loader, not in your dataset; please report it with this " +
            `state: ${JSON.stringify(this.debugState(plan))}`,
        ),
      );
    }, Math.max(10, period / 4));
  }

  /** Whether no worker is loading anything (every live one waits for work). */
  #workersIdle(): boolean {
    return this.#transport?.idle() ?? true;
  }

  #progressSignature(): string {
    return `${this.#transport?.progress() ?? "|0"}|${this.#results.size}|${this.#outstanding}`;
  }

  /**
   * The engine's bookkeeping, for stall reports: counters of the control block, what each
   * worker is doing, slot states, pending and ready batches of the consumer's epoch.
   */
  debugState(plan?: EpochPlan): Record<string, unknown> {
    const t = this.#transport?.debugState() ?? { pending: [], workers: [] };
    const out: Record<string, unknown> = {
      numWorkers: this.#cfg.numWorkers,
      outstanding: this.#outstanding,
      pending: t.pending,
      ready: [...this.#results.keys()].slice(0, 32),
      slots: this.#cfg.slotState ? Array.from(this.#cfg.slotState) : undefined,
      plans: this.#plans.map((p) => ({
        epoch: p.epoch,
        startSeq: p.startSeq,
        batches: p.batches.length,
        dispatched: p.dispatched,
        yielded: p.yielded,
        abandoned: p.abandoned,
      })),
    };
    if (plan) out.due = plan.startSeq + plan.yielded;
    if (t.control) out.control = t.control;
    out.workers = t.workers;
    return out;
  }

  #hasDue(plan: EpochPlan): boolean {
    if (this.#cfg.inOrder) return this.#results.has(plan.startSeq + plan.yielded);
    for (const seq of this.#results.keys()) {
      if (seq >= plan.startSeq && seq < plan.startSeq + plan.batches.length) return true;
    }
    return false;
  }

  #readyCount(plan: EpochPlan): number {
    let n = 0;
    for (const r of this.#results.values()) if (r.epoch === plan.epoch) n++;
    return n;
  }

  #take(plan: EpochPlan): Result | undefined {
    if (this.#cfg.inOrder) {
      const seq = plan.startSeq + plan.yielded;
      const r = this.#results.get(seq);
      if (r) this.#results.delete(seq);
      return r;
    }
    for (const [seq, r] of this.#results) {
      if (seq >= plan.startSeq && seq < plan.startSeq + plan.batches.length) {
        this.#results.delete(seq);
        return r;
      }
    }
    return undefined;
  }

  /** Zero-copy: the consumer holds every slot and waits for a batch no worker can fill. */
  #checkStarved(plan: EpochPlan): void {
    const state = this.#cfg.slotState;
    if (!state) return;
    if (state.every((s) => s === SLOT_CONSUMER) && !this.#hasDue(plan)) {
      throw new Error(
        `Cannot get batch ${plan.yielded} of epoch ${plan.epoch}: all ${state.length} ring ` +
          `slots are held by the consumer (${state.length} unreleased batches); call ` +
          "release() on batches you are done with, or raise the heldBatches option",
      );
    }
  }
}
