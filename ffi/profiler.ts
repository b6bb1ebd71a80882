/**
 * A profiler of named ranges, like PyTorch's `torch.profiler` with `record_function`: time what
 * the host does and, on a stream, what the device does, per name; print a per-name table, or
 * export a Chrome trace that opens in Perfetto (ui.perfetto.dev) or chrome://tracing.
 *
 * Off by default, and free when off: {@linkcode range} then returns one shared object that does
 * nothing (no allocation, no clock read). The DataLoader, the device prefetcher and the training
 * ops open ranges of their own, so a profiled run shows the loader's stages, the copies, the
 * augment kernel and each op of a step without any code of yours.
 *
 * Host ranges are wall-clock intervals on the calling thread (`performance.now()`); device
 * ranges are timed by a pair of events on the stream, read when the profiler is collected, and
 * placed on the trace's timeline against a reference event recorded when the stream was first
 * seen.
 *
 * @example Timing the parts of a loop
 * ```ts
 * import { Profiler, range } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * using prof = new Profiler().start();
 * for (let step = 0; step < 3; step++) {
 *   using _ = range("step");
 *   { using _f = range("forward"); }
 * }
 * prof.stop();
 * const rows = await prof.collect();
 * assert.deepStrictEqual(rows.map((r) => [r.name, r.calls]), [["step", 3], ["forward", 3]]);
 * assert.match(prof.table(), /^name +calls +total ms/);
 * assert.ok(prof.chromeTrace().traceEvents.length >= 6);
 * ```
 *
 * @module
 */

import { Event, type Stream } from "./stream.ts";
import { OP_KINDS, type OpCounts, opCounts, opDelta, type OpKind } from "../internal/op_count.ts";
import { refuseUnknownKeys } from "../internal/options.ts";
import {
  activeRecorder,
  NOOP,
  range as traceRange,
  setActiveRecorder,
  span as traceSpan,
} from "../internal/trace.ts";

/** Options of {@linkcode range}. */
export interface RangeOptions {
  /**
   * Also time the device work queued on this stream between the range's start and end (two
   * timing events). Only when the profiler was created with `device: true`.
   */
  stream?: Stream;
}

/** Options of a {@linkcode Profiler}. */
export interface ProfilerOptions {
  /** Time device work of ranges given a `stream` (default true). */
  device?: boolean;
}

/** One name's totals. */
export interface ProfileRow {
  /** The range's name. */
  name: string;
  /** How many times it ran. */
  calls: number;
  /** Host milliseconds, all calls (nested ranges included in their parent's time). */
  totalMs: number;
  /** Host milliseconds per call. */
  meanMs: number;
  /** `totalMs` over the profiled wall-clock time (0 to 1; nested ranges overlap). */
  share: number;
  /** Device milliseconds, all calls with a stream (undefined when none). */
  deviceMs?: number;
  /**
   * Device operations and host synchronizations the backend was asked for inside the range,
   * all calls (divide by `calls` for one; see {@linkcode Profiler.opCounts}).
   */
  ops: OpCounts;
}

/** A Chrome trace (the JSON object format of the Trace Event Format). */
export interface ChromeTrace {
  /** Complete events ("ph": "X") and thread names ("ph": "M"). */
  traceEvents: Record<string, unknown>[];
  /** Always "ms". */
  displayTimeUnit: "ms";
}

interface HostSpan {
  name: string;
  start: number;
  end: number;
  /** The op counts at the start, then (ended) the operations inside. */
  ops?: OpCounts;
  /** The trace's track ("host" for ranges). */
  track?: string;
}

interface DeviceSpan {
  name: string;
  stream: Stream;
  start: Event;
  end: Event;
  /** Whether the range was closed (its end event recorded): collect() waits only for those. */
  closed: boolean;
  /** Filled by collect(). */
  ms?: number;
  at?: number;
}

/**
 * Opens a named range on the active profiler; dispose it (`using`) to close it. When no
 * profiler is active this returns a shared object that does nothing.
 *
 * @param name What the range is ("forward", "loader.wait", ...).
 * @param options `stream`: time the device work queued on it too.
 * @returns The range; `[Symbol.dispose]()` ends it.
 *
 * @example
 * ```ts
 * import { range } from "@pinstream/pinstream";
 * using _ = range("not profiled: costs nothing");
 * ```
 */
export function range(name: string, options?: RangeOptions): Disposable {
  return traceRange(name, options);
}

/**
 * Records a finished interval on the active profiler (nothing when none is): for work timed
 * elsewhere, like a batch from its hand-out to a worker until it came back. It counts in the
 * table like a range and gets its own track in the Chrome trace.
 *
 * @param name What it was.
 * @param startMs Its start, `performance.now()` time.
 * @param endMs Its end.
 * @param track The trace track (default "host").
 *
 * @example
 * ```ts
 * import { Profiler, span } from "./profiler.ts";
 * import assert from "node:assert";
 * using prof = new Profiler().start();
 * const t = performance.now();
 * span("worker fetch", t - 5, t, "workers");
 * prof.stop();
 * assert.strictEqual((await prof.collect())[0].calls, 1);
 * ```
 */
export function span(name: string, startMs: number, endMs: number, track?: string): void {
  traceSpan(name, startMs, endMs, track);
}

/**
 * The profiler that {@linkcode range} records into, if one is started.
 *
 * @returns It, or undefined.
 *
 * @example
 * ```ts
 * import { activeProfiler, Profiler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(activeProfiler(), undefined);
 * using p = new Profiler().start();
 * assert.strictEqual(activeProfiler(), p);
 * ```
 */
export function activeProfiler(): Profiler | undefined {
  const recorder = activeRecorder();
  return recorder instanceof Profiler ? recorder : undefined;
}

/**
 * Collects named ranges while started. One profiler is active at a time; starting a second
 * while one runs is an error (stop the first). Dispose it to stop it and free its events.
 *
 * @example
 * ```ts
 * import { Profiler } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const prof = new Profiler({ device: false }).start();
 * { using _ = prof.range("load"); }
 * prof.stop();
 * assert.strictEqual((await prof.collect())[0].calls, 1);
 * prof[Symbol.dispose]();
 * ```
 */
export class Profiler implements Disposable {
  /** Whether ranges with a stream time the device too. */
  readonly device: boolean;
  #host: HostSpan[] = [];
  #devices: DeviceSpan[] = [];
  #refs = new Map<Stream, { event: Event; at: number }>();
  #spare: Event[] = [];
  #t0 = 0;
  #t1 = 0;
  #running = false;
  #ops: OpCounts = opDelta(opCounts(), opCounts());
  #opsAt: OpCounts | null = null;
  #disposed = false;

  /**
   * Creates a stopped profiler.
   *
   * @param options `device`: time device work of ranges given a stream (default true).
   * @throws {TypeError} On an unknown option or a non-boolean `device`.
   */
  constructor(options: ProfilerOptions = {}) {
    refuseUnknownKeys(options ?? {}, ["device"], "create a Profiler");
    const device = options.device ?? true;
    if (typeof device !== "boolean") {
      throw new TypeError(`Cannot create a Profiler: device must be a boolean, got ${device}`);
    }
    this.device = device;
  }

  /**
   * Starts recording: {@linkcode range} records here until {@linkcode stop}.
   *
   * @returns this.
   * @throws {Error} When another profiler is active.
   */
  start(): this {
    const active = activeRecorder();
    if (active !== undefined && active !== this) {
      throw new Error("Cannot start a Profiler: another one is active (stop it first)");
    }
    setActiveRecorder(this);
    if (!this.#running) {
      this.#opsAt = opCounts();
      this.#running = true;
      if (this.#t0 === 0 && this.#host.length === 0) this.#t0 = performance.now();
    }
    return this;
  }

  /** Stops recording (ranges still open record their end when closed). */
  stop(): void {
    if (activeRecorder() === this) setActiveRecorder(undefined);
    if (this.#running) {
      this.#t1 = performance.now();
      const d = opDelta(opCounts(), this.#opsAt!);
      for (const k of OP_KINDS) this.#ops[k] += d[k];
    }
    this.#running = false;
  }

  /**
   * The device operations (kernel launches, copies, memsets, allocations, frees) and host
   * synchronizations the backend was asked for while this profiler ran, on every backend alike:
   * each call of the backend library counts once, whatever it runs (internal/op_count.ts). For
   * one training step, profile one step; per range, see {@linkcode ProfileRow.ops}.
   *
   * @returns The counts by kind.
   * @example
   * ```ts
   * import { Device, Profiler, Tensor } from "@pinstream/pinstream";
   * import assert from "node:assert";
   * using device = Device.open("cpu");
   * using t = Tensor.empty(device, [4], "f32");
   * using prof = new Profiler({ device: false }).start();
   * t.buffer.copyFrom(new Float32Array(4));
   * t.buffer.fill(0);
   * prof.stop();
   * assert.deepStrictEqual(prof.opCounts(), {
   *   kernels: 0, copies: 1, memsets: 1, allocations: 0, frees: 0, syncs: 0,
   * });
   * ```
   */
  opCounts(): OpCounts {
    const out = { ...this.#ops };
    if (this.#running) {
      const d = opDelta(opCounts(), this.#opsAt!);
      for (const k of OP_KINDS) out[k] += d[k];
    }
    return out;
  }

  /**
   * Opens a range on this profiler (what {@linkcode range} does when this one is active).
   *
   * @param name What the range is.
   * @param options `stream`: time the device work queued on it too.
   * @returns The range; `[Symbol.dispose]()` ends it.
   */
  range(name: string, options?: RangeOptions): Disposable {
    if (!this.#running) return NOOP;
    const span: HostSpan = { name, start: performance.now(), end: 0, ops: opCounts() };
    this.#host.push(span);
    const stream = options?.stream;
    const end = () => {
      span.ops = opDelta(opCounts(), span.ops!);
      span.end = performance.now();
    };
    if (stream === undefined || !this.device) return { [Symbol.dispose]: end };
    this.#reference(stream);
    const dev: DeviceSpan = {
      name,
      stream,
      start: this.#event(stream),
      end: this.#event(stream),
      closed: false,
    };
    dev.start.record(stream);
    this.#devices.push(dev);
    return {
      [Symbol.dispose]: () => {
        end();
        // Profiling never changes the program's outcome: a range closed after its profiler
        // was disposed (its events freed), or on a stream disposed meanwhile, keeps only its
        // host time.
        if (this.#disposed || dev.closed) return;
        try {
          dev.end.record(stream);
          dev.closed = true;
        } catch {
          // the stream is gone: the device time of this range is unknown
        }
      },
    };
  }

  /**
   * Records a finished interval (what {@linkcode span} does when this one is active).
   *
   * @param name What it was.
   * @param startMs Its start, `performance.now()` time.
   * @param endMs Its end.
   * @param track The trace track (default "host").
   */
  span(name: string, startMs: number, endMs: number, track?: string): void {
    if (!this.#running) return;
    this.#host.push({ name, start: startMs, end: Math.max(startMs, endMs), track });
  }

  #event(stream: Stream): Event {
    const spare = this.#spare.findIndex((e) => e.device === stream.device);
    if (spare >= 0) return this.#spare.splice(spare, 1)[0];
    return new Event(stream.device, { timing: true });
  }

  #reference(stream: Stream): void {
    if (this.#refs.has(stream)) return;
    const event = this.#event(stream);
    event.record(stream);
    this.#refs.set(stream, { event, at: performance.now() });
  }

  /**
   * Waits for the device ranges' events and totals every name. Call after {@linkcode stop}
   * (or between steps: what is recorded so far is read).
   *
   * @returns One row per name, by total host time, largest first.
   */
  async collect(): Promise<ProfileRow[]> {
    for (const d of this.#devices) {
      // A range still open has no end on the device yet: it is read by a later collect().
      if (d.ms !== undefined || !d.closed) continue;
      await d.end.synchronize();
      d.ms = d.start.elapsedMs(d.end);
      // The reference was recorded earlier on the same stream: done once `end` is.
      const ref = this.#refs.get(d.stream)!;
      d.at = ref.at + ref.event.elapsedMs(d.start);
      this.#spare.push(d.start, d.end);
    }
    return this.stats();
  }

  /**
   * The totals of what is recorded and collected so far (see {@linkcode collect}).
   *
   * @returns One row per name, by total host time, largest first.
   */
  stats(): ProfileRow[] {
    const wall = Math.max(1e-9, (this.#running ? performance.now() : this.#t1) - this.#t0);
    const rows = new Map<string, ProfileRow>();
    for (const s of this.#host) {
      if (s.end === 0) continue;
      const r = rows.get(s.name) ??
        {
          name: s.name,
          calls: 0,
          totalMs: 0,
          meanMs: 0,
          share: 0,
          ops: opDelta(opCounts(), opCounts()),
        } as ProfileRow;
      r.calls++;
      r.totalMs += s.end - s.start;
      if (s.ops) { for (const k of OP_KINDS) r.ops[k] += s.ops[k]; }
      rows.set(s.name, r);
    }
    for (const d of this.#devices) {
      if (d.ms === undefined) continue;
      const r = rows.get(d.name);
      if (r !== undefined) r.deviceMs = (r.deviceMs ?? 0) + d.ms;
    }
    const out = [...rows.values()];
    for (const r of out) {
      r.meanMs = r.totalMs / r.calls;
      r.share = r.totalMs / wall;
    }
    return out.sort((a, b) => b.totalMs - a.totalMs);
  }

  /**
   * The per-name table: calls, total and mean host milliseconds, share of the profiled time,
   * device milliseconds where timed, and per call the device operations queued (kernels,
   * copies, memsets, allocations and frees) and host synchronizations.
   *
   * @returns The table as text.
   */
  table(): string {
    const rows = this.stats();
    const width = Math.max(4, ...rows.map((r) => r.name.length));
    const line = (cells: string[]) =>
      [
        cells[0].padEnd(width),
        ...cells.slice(1).map((c, i) => c.padStart([5, 9, 9, 6, 10, 8, 6][i])),
      ].join(" ").trimEnd();
    const perCall = (r: ProfileRow, kinds: readonly OpKind[]) =>
      String(Math.round(kinds.reduce((s, k) => s + r.ops[k], 0) / r.calls * 10) / 10);
    const queued = OP_KINDS.filter((k) => k !== "syncs");
    return [
      line(["name", "calls", "total ms", "mean ms", "share", "device ms", "ops", "syncs"]),
      ...rows.map((r) =>
        line([
          r.name,
          String(r.calls),
          r.totalMs.toFixed(2),
          r.meanMs.toFixed(3),
          `${(r.share * 100).toFixed(1)}%`,
          r.deviceMs === undefined ? "" : r.deviceMs.toFixed(2),
          perCall(r, queued),
          perCall(r, ["syncs"]),
        ])
      ),
    ].join("\n");
  }

  /**
   * The recorded ranges as a Chrome trace: host ranges on thread "host", device ranges on one
   * thread per stream, times in microseconds from the profiler's start.
   *
   * @returns The trace object (`JSON.stringify` it, or use {@linkcode exportChromeTrace}).
   */
  chromeTrace(): ChromeTrace {
    const us = (ms: number) => Math.round((ms - this.#t0) * 1000);
    const events: Record<string, unknown>[] = [
      { ph: "M", pid: 1, tid: 0, name: "thread_name", args: { name: "host" } },
    ];
    const tracks = new Map<string, number>([["host", 0]]);
    for (const s of this.#host) {
      if (s.end === 0) continue;
      const track = s.track ?? "host";
      let tid = tracks.get(track);
      if (tid === undefined) {
        tid = 1000 + tracks.size;
        tracks.set(track, tid);
        events.push({ ph: "M", pid: 1, tid, name: "thread_name", args: { name: track } });
      }
      events.push({
        ph: "X",
        pid: 1,
        tid,
        name: s.name,
        cat: "host",
        ts: us(s.start),
        dur: Math.max(0, Math.round((s.end - s.start) * 1000)),
      });
    }
    const tids = new Map<Stream, number>();
    for (const d of this.#devices) {
      if (d.ms === undefined || d.at === undefined) continue;
      let tid = tids.get(d.stream);
      if (tid === undefined) {
        tid = tids.size + 1;
        tids.set(d.stream, tid);
        events.push({
          ph: "M",
          pid: 1,
          tid,
          name: "thread_name",
          args: { name: `device stream ${tid}` },
        });
      }
      events.push({
        ph: "X",
        pid: 1,
        tid,
        name: d.name,
        cat: "device",
        ts: us(d.at),
        dur: Math.max(0, Math.round(d.ms * 1000)),
      });
    }
    return { traceEvents: events, displayTimeUnit: "ms" };
  }

  /**
   * Collects, then writes the Chrome trace as JSON (open it in ui.perfetto.dev).
   *
   * @param path The file to write.
   */
  async exportChromeTrace(path: string | URL): Promise<void> {
    await this.collect();
    await Deno.writeTextFile(path, JSON.stringify(this.chromeTrace()));
  }

  /** Stops it and frees its events. */
  [Symbol.dispose](): void {
    this.#disposed = true;
    this.stop();
    for (const d of this.#devices) this.#spare.push(d.start, d.end);
    for (const r of this.#refs.values()) this.#spare.push(r.event);
    for (const e of new Set(this.#spare)) {
      try {
        e[Symbol.dispose]();
      } catch {
        // its device is gone already: nothing to free
      }
    }
    this.#spare = [];
    this.#devices = [];
    this.#refs.clear();
  }
}
