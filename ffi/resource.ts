/**
 * `Resource`: the lifetime rules shared by every native wrapper (Device, Stream, Event,
 * HostBuffer, DeviceBuffer).
 *
 * - `dispose()` is idempotent and `[Symbol.dispose]` calls it;
 * - a resource used after dispose throws "Cannot <action>: the <Kind> is disposed";
 * - a parent (a Device) disposes the children still alive when it is disposed; it holds them
 *   through WeakRefs, so an abandoned child stays collectable and the FinalizationRegistry
 *   backstop can release its native memory.
 *
 * @module
 */

/**
 * A native object with an explicit, idempotent `dispose()`. Subclasses implement `release()`
 * (free the native object) and may run [wait] calls through `whileInFlight`, which defers
 * the release until the call returns.
 *
 * @example A resource is disposed once, however often dispose() is called
 * ```ts
 * import { Resource } from "./resource.ts";
 * import assert from "node:assert";
 * class Counter extends Resource {
 *   released = 0;
 *   constructor() { super("Counter"); }
 *   protected release() { this.released++; }
 * }
 * const c = new Counter();
 * c.dispose();
 * c.dispose();
 * assert.strictEqual(c.released, 1);
 * assert.strictEqual(c.disposed, true);
 * ```
 */
export abstract class Resource implements Disposable {
  #disposed = false;
  #inflight = 0;
  #releasePending = false;
  #parent: Resource | undefined;
  #children: Set<WeakRef<Resource>> | undefined;
  #selfRef: WeakRef<Resource> | undefined;
  readonly #kind: string;

  /**
   * Registers the resource with its parent, which will dispose it.
   *
   * @param kind The class name used in messages.
   * @param parent The resource that disposes this one when it is disposed itself.
   */
  constructor(kind: string, parent?: Resource) {
    this.#kind = kind;
    if (parent !== undefined) {
      this.#parent = parent;
      this.#selfRef = new WeakRef(this);
      (parent.#children ??= new Set()).add(this.#selfRef);
    }
  }

  /** Whether `dispose()` was called (directly or by the parent). */
  get disposed(): boolean {
    return this.#disposed;
  }

  /** Throws when disposed: `Cannot <action>: the <Kind> is disposed`. */
  protected assertLive(action: string): void {
    if (this.#disposed) throw new Error(`Cannot ${action}: the ${this.#kind} is disposed`);
  }

  /** Releases the native object (children first). Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    const errors: unknown[] = [];
    if (this.#children !== undefined) {
      const children = [...this.#children];
      this.#children = undefined;
      for (const ref of children) {
        try {
          ref.deref()?.dispose();
        } catch (err) {
          errors.push(err);
        }
      }
    }
    if (this.#parent !== undefined && this.#selfRef !== undefined) {
      this.#parent.#children?.delete(this.#selfRef);
    }
    try {
      // Releasing a handle that a worker thread is waiting on is undefined behaviour in
      // CUDA: the last in-flight call releases it instead.
      if (this.#inflight > 0) this.#releasePending = true;
      else this.release();
    } catch (err) {
      errors.push(err);
    }
    if (errors.length === 1) throw errors[0];
    if (errors.length > 1) {
      throw new AggregateError(errors, `Cannot dispose the ${this.#kind}: several releases failed`);
    }
  }

  /** Same as `dispose()`. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /**
   * Runs a call that uses the native object on another thread (a `nonblocking` FFI call),
   * keeping the object alive until it settles even if `dispose()` runs meanwhile.
   *
   * @param action What is being done, for the use-after-dispose message.
   * @param call Starts the call.
   * @returns The call's result.
   * @throws {Error} When already disposed.
   */
  protected async whileInFlight<T>(action: string, call: () => Promise<T>): Promise<T> {
    this.assertLive(action);
    this.#inflight++;
    try {
      return await call();
    } finally {
      if (--this.#inflight === 0 && this.#releasePending) {
        this.#releasePending = false;
        this.release();
      }
    }
  }

  /** Frees the native object. Called once, after the children are disposed. */
  protected abstract release(): void;
}
