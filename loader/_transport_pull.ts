// The zero-copy transport: tasks and free slots go through a shared control block that
// workers read on their own (see _protocol.ts), so a batch costs the main thread a few
// stores and no message; measured, this doubled the 2-worker rate over per-batch messages
// because workers no longer wait for the main thread to be scheduled between batches.
// postMessage carries start-up and errors only.

import { span } from "../internal/trace.ts";
import {
  C_CLAIM,
  C_DOORBELL,
  C_FREE_HEAD,
  C_FREE_TAIL,
  C_HEADER,
  C_PUBLISHED,
  C_SKIP_BELOW,
  C_STOP,
  controlLayout,
  initControl,
  W_GATHER,
  W_STOPPED,
  W_WAIT_SLOT,
  W_WAIT_TASK,
  WORKER_STATES,
} from "./_protocol.ts";
import {
  type EpochPlan,
  errorResult,
  type Pending,
  SLOT_FREE,
  SLOT_LOADER,
  type Transport,
  type TransportHost,
} from "./_transport.ts";
import {
  type BatchMessage,
  describeBatch,
  type WorkerHandle,
  WorkerPool,
} from "./_transport_workers.ts";

/** Workers pull tasks and free slots from a shared control block and gather into the ring. */
export class PullTransport implements Transport {
  readonly control: Int32Array;
  #host: TransportHost;
  #layout: ReturnType<typeof controlLayout>;
  #slotState: Uint8Array;
  #pool: WorkerPool;
  #pending = new Map<number, Pending>();
  #published = 0;
  #freeTail = 0;
  #stopped = false;

  constructor(host: TransportHost) {
    const cfg = host.cfg;
    this.#host = host;
    this.#slotState = cfg.slotState!;
    const slots = this.#slotState.length;
    // Published-but-unyielded tasks never exceed the in-flight limit; the margin covers
    // skipped tasks of an abandoned epoch still being read.
    const tasks = 2 * (cfg.prefetchFactor * cfg.numWorkers + slots);
    this.#layout = controlLayout(slots, tasks, cfg.ring!.batchSize, cfg.numWorkers);
    this.control = new Int32Array(new SharedArrayBuffer(this.#layout.ints * 4));
    initControl(this.control, this.#layout);
    this.#pool = new WorkerPool(
      cfg,
      {
        control: this.control.buffer as SharedArrayBuffer,
        slots,
        tasks: this.#layout.tasks,
        batch: cfg.ring!.batchSize,
      },
      (w, msg) => this.#onBatch(w, msg),
      (e) => host.fail(e),
      {
        busy: (w) =>
          !this.#stopped &&
          Atomics.load(this.control, this.#layout.worker + 2 * w.id) === W_GATHER,
        describe: (seq) => {
          const p = this.#pending.get(seq);
          return p ? describeBatch(p.batch, p.plan.epoch, p.plan.batches[p.batch]) : `task ${seq}`;
        },
        // The control block does not say which task a worker took: name those in flight.
        holding: () =>
          `one of the batches in flight (${
            [...this.#pending.values()].slice(0, 4).map((p) =>
              describeBatch(p.batch, p.plan.epoch, p.plan.batches[p.batch])
            ).join("; ")
          })`,
      },
    );
  }

  /** A worker's gather threw: the error travels as a value, the slot goes back. */
  #onBatch(w: WorkerHandle, msg: BatchMessage): void {
    // Results come through the control block; only errors come as messages.
    if (msg.t !== "e") return;
    const host = this.#host;
    const p = this.#pending.get(msg.seq);
    if (!p) {
      // A task of an abandoned epoch: nobody will see the error, but its slot goes back.
      if (msg.slot !== undefined && msg.slot >= 0) {
        this.#slotState[msg.slot] = SLOT_FREE;
        host.pump();
      }
      return;
    }
    this.#pending.delete(msg.seq);
    w.outstanding--;
    if (msg.slot !== undefined && msg.slot >= 0) this.#slotState[msg.slot] = SLOT_FREE;
    host.settle(p, errorResult(p, w.id, msg));
  }

  /** Collects the slots workers marked ready in the control block. */
  collect(): void {
    if (this.#stopped) return;
    const ctl = this.control;
    const L = this.#layout;
    const state = this.#slotState;
    let freed = false;
    for (let slot = 0; slot < state.length; slot++) {
      const v = Atomics.load(ctl, L.ready + slot);
      if (v === 0) continue;
      ctl[L.ready + slot] = 0;
      const seq = v - 1;
      this.#host.addBusy(ctl[L.busy + slot] / 1000);
      const p = this.#pending.get(seq);
      if (!p) {
        // A task of an abandoned epoch finished after it was dropped: recycle its slot.
        state[slot] = SLOT_FREE;
        freed = true;
        continue;
      }
      this.#pending.delete(seq);
      const size = p.plan.batches[p.batch].length;
      // From hand-out to back, on the workers' track of a profile (internal/trace.ts).
      span("loader.batch", p.dispatchedAt, performance.now(), "loader workers");
      this.#host.results.set(seq, {
        kind: "slot",
        seq,
        slot,
        epoch: p.plan.epoch,
        batch: p.batch,
        size,
      });
    }
    if (freed) this.#pushFreeSlots();
  }

  /** Hands every free slot to the workers' free queue. */
  #pushFreeSlots(): void {
    const ctl = this.control;
    const L = this.#layout;
    const state = this.#slotState;
    let pushed = false;
    for (let slot = 0; slot < state.length; slot++) {
      if (state[slot] !== SLOT_FREE) continue;
      const cell = L.freeQ + 2 * (this.#freeTail % L.freeCap);
      // Not yet read by the worker holding position freeTail - freeCap: the queue is full
      // for now; the slot stays free and goes out at the next pump (see _protocol.ts).
      if (Atomics.load(ctl, cell) !== this.#freeTail) break;
      state[slot] = SLOT_LOADER;
      ctl[cell + 1] = slot;
      Atomics.store(ctl, cell, this.#freeTail + 1);
      this.#freeTail++;
      pushed = true;
    }
    if (pushed) {
      Atomics.store(ctl, C_FREE_TAIL, this.#freeTail);
      Atomics.notify(ctl, C_FREE_TAIL);
    }
  }

  /** Returns free slots to the workers and publishes tasks up to the limit. */
  dispatch(limit: number): void {
    const host = this.#host;
    const ctl = this.control;
    const L = this.#layout;
    this.#pushFreeSlots();
    let published = false;
    while (host.outstanding() < limit) {
      const plan = host.nextPlan();
      if (!plan) break;
      const e = L.taskQ + (this.#published % L.tasks) * L.entry;
      // The entry's last reader has not copied it out yet: publish at the next pump (that
      // reader rings the doorbell when it has gathered or skipped its task, so it comes).
      if (Atomics.load(ctl, e) !== this.#published) break;
      const b = host.claim(plan);
      const seq = plan.startSeq + b;
      const indices = plan.batches[b];
      ctl[e + 1] = seq;
      ctl[e + 2] = plan.epoch;
      ctl[e + 3] = plan.positions[b];
      ctl[e + 4] = indices.length;
      ctl.set(indices, e + 5);
      Atomics.store(ctl, e, this.#published + 1);
      this.#published++;
      this.#pending.set(seq, { seq, plan, batch: b, worker: -1, dispatchedAt: performance.now() });
      published = true;
    }
    if (published) {
      Atomics.store(ctl, C_PUBLISHED, this.#published);
      Atomics.notify(ctl, C_PUBLISHED);
    }
  }

  async wait(woken: Promise<void>, due: () => boolean): Promise<void> {
    const ctl = this.control;
    const bell = Atomics.load(ctl, C_DOORBELL);
    this.collect();
    if (due()) return;
    const r = Atomics.waitAsync(ctl, C_DOORBELL, bell);
    if (r.async) await Promise.race([woken, r.value]);
  }

  abandon(plan: EpochPlan): void {
    // Published tasks of this plan: workers skip the unclaimed ones; the ones being
    // gathered come back as unknown seqs and their slots are recycled by collect().
    const end = plan.startSeq + plan.batches.length;
    for (const [seq, p] of this.#pending) {
      if (p.plan === plan) {
        this.#pending.delete(seq);
        this.#host.forget();
      }
    }
    const ctl = this.control;
    if (Atomics.load(ctl, C_SKIP_BELOW) < end) Atomics.store(ctl, C_SKIP_BELOW, end);
    this.#pushFreeSlots();
  }

  idle(): boolean {
    const ctl = this.control;
    const L = this.#layout;
    for (let w = 0; w < this.#host.cfg.numWorkers; w++) {
      const st = Atomics.load(ctl, L.worker + 2 * w);
      if (st !== W_WAIT_SLOT && st !== W_WAIT_TASK && st !== W_STOPPED) return false;
    }
    return true;
  }

  progress(): string {
    return `${Array.from(this.control.subarray(0, C_HEADER)).join(",")}|${this.#pending.size}`;
  }

  stop(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    const ctl = this.control;
    // Ends the workers' Atomics.wait loops and any waitAsync of ours.
    Atomics.store(ctl, C_STOP, 1);
    Atomics.add(ctl, C_DOORBELL, 1);
    Atomics.notify(ctl, C_DOORBELL);
    Atomics.notify(ctl, C_PUBLISHED);
    Atomics.notify(ctl, C_FREE_TAIL);
    // Slots in the free queue or being filled go back to the ring.
    const state = this.#slotState;
    for (let s = 0; s < state.length; s++) if (state[s] === SLOT_LOADER) state[s] = SLOT_FREE;
    this.#pool.stop();
    this.#pending.clear();
  }

  debugState(): { pending: number[]; control: Record<string, number>; workers: unknown[] } {
    const ctl = this.control;
    const L = this.#layout;
    return {
      pending: [...this.#pending.keys()].slice(0, 32),
      control: {
        doorbell: ctl[C_DOORBELL],
        stop: ctl[C_STOP],
        claimed: ctl[C_CLAIM],
        published: ctl[C_PUBLISHED],
        freeHead: ctl[C_FREE_HEAD],
        freeTail: ctl[C_FREE_TAIL],
        skipBelow: ctl[C_SKIP_BELOW],
      },
      workers: Array.from({ length: this.#host.cfg.numWorkers }, (_, w) => ({
        state: WORKER_STATES[ctl[L.worker + 2 * w]] ?? ctl[L.worker + 2 * w],
        done: ctl[L.worker + 2 * w + 1],
      })),
    };
  }
}
