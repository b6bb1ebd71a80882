/**
 * The host half of the profiler: named ranges and finished spans, sent to the active
 * {@linkcode Recorder} if there is one. Every floor opens ranges here (the loader's stages, the
 * prefetcher's copies, each op of a step) without importing the FFI layer; ffi/profiler.ts's
 * `Profiler` is the recorder that also times device work with events.
 *
 * Free when nothing records: {@linkcode range} then returns one shared object that does nothing
 * (no allocation, no clock read).
 *
 * @example A recorder of host ranges
 * ```ts
 * import { range, type Recorder, setActiveRecorder } from "./trace.ts";
 * import assert from "node:assert";
 * const names: string[] = [];
 * const recorder: Recorder = {
 *   range: (name) => (names.push(name), { [Symbol.dispose]() {} }),
 *   span: (name) => void names.push(name),
 * };
 * setActiveRecorder(recorder);
 * { using _ = range("load"); }
 * setActiveRecorder(undefined);
 * { using _ = range("not recorded"); }
 * assert.deepStrictEqual(names, ["load"]);
 * ```
 *
 * @module
 */

/** Options of {@linkcode range}. */
export interface TraceOptions {
  /**
   * A device stream (ffi/stream.ts's `Stream`) whose work queued between the range's start
   * and end the recorder may time too.
   */
  stream?: object;
}

/** Where ranges and spans go while it is active (one at a time). */
export interface Recorder {
  /**
   * Opens a range.
   *
   * @param name What the range is.
   * @param options `stream`: time the device work queued on it too.
   * @returns The range; `[Symbol.dispose]()` ends it.
   */
  range(name: string, options?: TraceOptions): Disposable;
  /**
   * Records a finished interval.
   *
   * @param name What it was.
   * @param startMs Its start, `performance.now()` time.
   * @param endMs Its end.
   * @param track The trace track (default "host").
   */
  span(name: string, startMs: number, endMs: number, track?: string): void;
}

/** The range returned when nothing records: disposing it does nothing. */
export const NOOP: Disposable = Object.freeze({ [Symbol.dispose]() {} });

let active: Recorder | undefined;

/**
 * Opens a named range on the active recorder; dispose it (`using`) to close it. When none is
 * active this returns a shared object that does nothing.
 *
 * @param name What the range is ("forward", "loader.wait", ...).
 * @param options `stream`: time the device work queued on it too.
 * @returns The range; `[Symbol.dispose]()` ends it.
 *
 * @example
 * ```ts
 * import { range } from "./trace.ts";
 * using _ = range("not recorded: costs nothing");
 * ```
 */
export function range(name: string, options?: TraceOptions): Disposable {
  return active === undefined ? NOOP : active.range(name, options);
}

/**
 * Records a finished interval on the active recorder (nothing when none is): for work timed
 * elsewhere, like a batch from its hand-out to a worker until it came back.
 *
 * @param name What it was.
 * @param startMs Its start, `performance.now()` time.
 * @param endMs Its end.
 * @param track The trace track (default "host").
 *
 * @example
 * ```ts
 * import { span } from "./trace.ts";
 * span("worker fetch", 0, 5, "workers"); // nothing records: dropped
 * ```
 */
export function span(name: string, startMs: number, endMs: number, track?: string): void {
  if (active !== undefined) active.span(name, startMs, endMs, track);
}

/**
 * The recorder that {@linkcode range} sends to, if one is active.
 *
 * @returns It, or undefined.
 *
 * @example
 * ```ts
 * import { activeRecorder } from "./trace.ts";
 * import assert from "node:assert";
 * assert.strictEqual(activeRecorder(), undefined);
 * ```
 */
export function activeRecorder(): Recorder | undefined {
  return active;
}

/**
 * Makes `recorder` the one {@linkcode range} and {@linkcode span} send to (undefined: none).
 * The caller decides whether replacing another one is an error.
 *
 * @param recorder The recorder, or undefined to stop recording.
 *
 * @example
 * ```ts
 * import { activeRecorder, setActiveRecorder } from "./trace.ts";
 * import assert from "node:assert";
 * const r = { range: () => ({ [Symbol.dispose]() {} }), span() {} };
 * setActiveRecorder(r);
 * assert.strictEqual(activeRecorder(), r);
 * setActiveRecorder(undefined);
 * ```
 */
export function setActiveRecorder(recorder: Recorder | undefined): void {
  active = recorder;
}
