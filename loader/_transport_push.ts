// The generic transport: one postMessage per batch each way (the indices out, the collated
// value back, its buffers transferred), each batch to the least-loaded worker. Used for
// datasets without shared fields; a zero-copy loader with workers always pulls.

import {
  type EpochPlan,
  errorResult,
  type Pending,
  type Transport,
  type TransportHost,
} from "./_transport.ts";
import {
  type BatchMessage,
  describeBatch,
  type WorkerHandle,
  WorkerPool,
} from "./_transport_workers.ts";

/** Sends each batch's indices to a worker, which sends the batch back. */
export class PushTransport implements Transport {
  #host: TransportHost;
  #pool: WorkerPool;
  #pending = new Map<number, Pending>();
  #rr = 0;

  constructor(host: TransportHost) {
    this.#host = host;
    this.#pool = new WorkerPool(
      host.cfg,
      {},
      (w, msg) => this.#onBatch(w, msg),
      (e) => host.fail(e),
      {
        busy: (w) => w.outstanding > 0,
        describe: (seq) => {
          const p = this.#pending.get(seq);
          return p ? describeBatch(p.batch, p.plan.epoch, p.plan.batches[p.batch]) : `task ${seq}`;
        },
        holding: (w) => {
          // A worker loads its batches in order: the oldest is the one it is on.
          for (const p of this.#pending.values()) {
            if (p.worker === w.id) {
              return describeBatch(p.batch, p.plan.epoch, p.plan.batches[p.batch]);
            }
          }
          return "no batch";
        },
      },
    );
  }

  #onBatch(w: WorkerHandle, msg: BatchMessage): void {
    if (msg.t === "b") return this.#complete(w, msg.seq, msg.busy, msg.value);
    // Errors travel as values: rethrown when that batch is due, like PyTorch.
    const p = this.#pending.get(msg.seq);
    if (!p) return;
    this.#pending.delete(msg.seq);
    w.outstanding--;
    this.#host.settle(p, errorResult(p, w.id, msg));
  }

  /** A worker sent a batch's value back. */
  #complete(w: WorkerHandle, seq: number, busy: number, value: unknown): void {
    const p = this.#pending.get(seq);
    if (!p) return;
    this.#pending.delete(seq);
    w.outstanding--;
    this.#host.addBusy(busy);
    const { epoch } = p.plan;
    const size = p.plan.batches[p.batch].length;
    this.#host.settle(p, { kind: "value", value, seq, epoch, batch: p.batch, size });
  }

  /** One message per batch to the least-loaded worker, until `limit` are outstanding. */
  dispatch(limit: number): void {
    const host = this.#host;
    const workers = this.#pool.workers;
    while (host.outstanding() < limit) {
      const plan = host.nextPlan();
      if (!plan) return;
      const b = host.claim(plan);
      const seq = plan.startSeq + b;
      const indices = plan.batches[b];
      // Least-loaded worker, round-robin among equals.
      let w = workers[this.#rr];
      for (let k = 1; k < workers.length; k++) {
        const c = workers[(this.#rr + k) % workers.length];
        if (c.outstanding < w.outstanding) w = c;
      }
      this.#rr = (w.id + 1) % workers.length;
      w.outstanding++;
      this.#pending.set(seq, {
        seq,
        plan,
        batch: b,
        worker: w.id,
        dispatchedAt: performance.now(),
      });
      this.#pool.send(w, { t: "c", seq, idx: indices, epoch: plan.epoch, pos: plan.positions[b] });
    }
  }

  /** Nothing to collect: batches arrive as messages, which wake the engine. */
  collect(): void {}

  async wait(woken: Promise<void>): Promise<void> {
    await woken;
  }

  /** Batches of `plan` in flight stay pending: when they come back they are dropped. */
  abandon(_plan: EpochPlan): void {}

  idle(): boolean {
    return this.#pending.size === 0;
  }

  progress(): string {
    return `|${this.#pending.size}`;
  }

  stop(): void {
    this.#pool.stop();
    this.#pending.clear();
  }

  debugState(): { pending: number[]; workers: unknown[] } {
    return {
      pending: [...this.#pending.keys()].slice(0, 32),
      workers: this.#pool.workers.map((w) => ({ alive: w.alive, outstanding: w.outstanding })),
    };
  }
}
