/**
 * Internal: the lifetime rules shared by every native wrapper, and argument checks.
 *
 * - `dispose()` is idempotent and `[Symbol.dispose]` calls it;
 * - a resource used after dispose throws "Cannot <action>: the <Kind> is disposed";
 * - a parent (a Device) disposes the children still alive when it is disposed; it holds them
 *   through WeakRefs, so an abandoned child stays collectable and the FinalizationRegistry
 *   backstop can release its native memory.
 *
 * @module
 */

/** A native object with an explicit, idempotent `dispose()`. */
export abstract class Resource implements Disposable {
  #disposed = false;
  #parent: Resource | undefined;
  #children: Set<WeakRef<Resource>> | undefined;
  #selfRef: WeakRef<Resource> | undefined;
  readonly #kind: string;

  /**
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
      this.release();
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

  /** Frees the native object. Called once. */
  protected abstract release(): void;
}

/** Throws TypeError/RangeError unless `value` is a safe non-negative integer. */
export function checkCount(value: unknown, what: string, action: string): number {
  if (typeof value !== "number") {
    throw new TypeError(`Cannot ${action}: ${what} must be a number, got ${describe(value)}`);
  }
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(
      `Cannot ${action}: ${what} must be a non-negative integer, got ${value}`,
    );
  }
  return value;
}

/** A short description of a value for error messages. */
export function describe(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "object") return value.constructor?.name ?? "object";
  if (typeof value === "string") return JSON.stringify(value);
  return `${typeof value} ${String(value)}`;
}

/** A pointer plus an offset (the offset of a null pointer must be 0). */
export function offsetPointer(ptr: Deno.PointerValue, offset: number): Deno.PointerValue {
  if (offset === 0 || ptr === null) return ptr;
  return Deno.UnsafePointer.offset(ptr, offset);
}
