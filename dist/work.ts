/**
 * `Work`: a collective in flight, returned by the asynchronous forms of
 * {@linkcode ProcessGroup}'s collectives.
 *
 * @module
 */

import type { CollectiveOp } from "./process_group.ts";

/** @internal What runs a Work's collective: the group's MPI thread, or an NCCL communicator. */
export interface WorkOwner {
  _query(work: Work): boolean;
  _waitSync(work: Work): number;
  _wait(work: Work): Promise<number>;
  _failure(work: Work, status: number): Error;
}

/**
 * A collective in flight: wait on it with {@linkcode Work.wait} (the event loop keeps
 * running) or {@linkcode Work.waitSync} (the thread blocks). The buffers hold the result once
 * either returns, and must not be touched before.
 *
 * @example
 * ```ts
 * import { ProcessGroup } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using group = ProcessGroup.init(); // no launcher: rank 0 of 1
 * const x = new Float32Array([1, 2]);
 * const work = group.allReduceAsync(x, { op: "avg" });
 * await work.wait();
 * assert.strictEqual(work.completed, true);
 * assert.deepStrictEqual([...x], [1, 2]);
 * ```
 */
export class Work {
  /** The group's sequence number of this collective. */
  readonly seq: number;
  /** The collective's name. */
  readonly op: CollectiveOp;
  #group: WorkOwner;
  #finish: (() => void) | null;
  #done = false;
  #error: Error | null = null;
  /** Keeps the JS memory referenced while the worker may touch it. */
  #keep: unknown;

  /** @internal Made by the group. */
  constructor(
    group: WorkOwner,
    seq: number,
    op: CollectiveOp,
    finish: (() => void) | null,
    keep: unknown,
  ) {
    this.#group = group;
    this.seq = seq;
    this.op = op;
    this.#finish = finish;
    this.#keep = keep;
  }

  /** Whether a wait returned (and the result was put in place). */
  get completed(): boolean {
    return this.#done;
  }

  /**
   * Whether the collective finished on the communication thread, without waiting (PyTorch's
   * `is_completed()`); the result is in place only once a wait returned.
   *
   * @returns True once the collective ran.
   * @example
   * ```ts
   * import { ProcessGroup } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using group = ProcessGroup.init();
   * assert.strictEqual(group.barrierAsync().query(), true);
   * ```
   */
  query(): boolean {
    return this.#done || this.#group._query(this);
  }

  #settle(status: number): void {
    this.#done = true;
    this.#keep = null;
    const f = this.#finish;
    this.#finish = null;
    if (status !== 0) {
      this.#error = this.#group._failure(this, status);
      throw this.#error;
    }
    f?.();
  }

  /**
   * Blocks this thread until the collective finished, at most the group's timeout.
   *
   * @throws {Error} When it failed, or when it waited longer than the timeout (naming the
   *   ranks that did not arrive).
   */
  waitSync(): void {
    if (this.#error) throw this.#error;
    if (this.#done) return;
    this.#settle(this.#group._waitSync(this));
  }

  /**
   * Waits without blocking the event loop until the collective finished, at most the
   * group's timeout.
   *
   * @throws {Error} As {@linkcode Work.waitSync}.
   */
  async wait(): Promise<void> {
    if (this.#error) throw this.#error;
    if (this.#done) return;
    const status = await this.#group._wait(this);
    if (!this.#done) this.#settle(status);
    else if (this.#error) throw this.#error;
  }
}
