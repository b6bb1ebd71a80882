/**
 * An epoch-level training log in JSON Lines: one object per line (epoch, loss, accuracy,
 * samples/s, input-wait share, loss scale, ...), appended and flushed as each epoch ends, so a
 * run that dies keeps every finished epoch and another process can follow the file. The
 * examples write one beside their checkpoint and draw its curves as an SVG. With `tensorboard`,
 * the same numbers also go to a TensorBoard event file ({@linkcode TensorBoardWriter}).
 *
 * @example
 * ```ts
 * import { MetricsLog } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const path = await Deno.makeTempFile({ suffix: ".jsonl" });
 * {
 *   using log = await MetricsLog.open(path);
 *   await log.append({ epoch: 1, trainLoss: 1.9, testAcc: 0.41 });
 *   await log.append({ epoch: 2, trainLoss: 1.2, testAcc: 0.63 });
 * }
 * const rows = await MetricsLog.read(path);
 * assert.deepStrictEqual(rows.map((r) => r.epoch), [1, 2]);
 * assert.ok(typeof rows[0].time === "string"); // ISO time of each record
 * await Deno.remove(path);
 * ```
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";
import { TensorBoardWriter } from "./tfevents.ts";

/** One line of the log: numbers and strings by name (`time` is added when absent). */
export type MetricsRecord = Record<string, number | string | boolean | null>;

/** Options of {@linkcode MetricsLog.open}. */
export interface MetricsLogOptions {
  /** Keep what the file holds and append (default true); false starts it empty. */
  append?: boolean;
  /**
   * A TensorBoard log directory: each record's numbers also go to a new event file there, at
   * the record's `step` (else its `epoch`, else its index), and {@linkcode MetricsLog.addScalars}
   * writes points between records (default none).
   */
  tensorboard?: string;
}

/**
 * An open JSON Lines log. Each {@linkcode append} writes one whole line with a single write
 * call, so concurrent readers never see half a record.
 *
 * @example
 * ```ts
 * import { MetricsLog } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const path = await Deno.makeTempFile();
 * using log = await MetricsLog.open(path, { append: false });
 * await log.append({ epoch: 1, loss: 0.5 });
 * assert.strictEqual((await Deno.readTextFile(path)).split("\n").length, 2);
 * ```
 */
export class MetricsLog implements Disposable {
  /** The file. */
  readonly path: string;
  /** The TensorBoard event file, when `tensorboard` was given. */
  readonly tensorboard: TensorBoardWriter | undefined;
  #file: Deno.FsFile | undefined;
  #records = 0;

  private constructor(path: string, file: Deno.FsFile, tb: TensorBoardWriter | undefined) {
    this.path = path;
    this.#file = file;
    this.tensorboard = tb;
  }

  /**
   * Opens (creating) a log.
   *
   * @param path The .jsonl file.
   * @param options `append` (default true), `tensorboard`.
   * @returns The log; dispose it to close the file.
   * @throws {TypeError} On an unknown option.
   */
  static async open(path: string | URL, options: MetricsLogOptions = {}): Promise<MetricsLog> {
    refuseUnknownKeys(options ?? {}, ["append", "tensorboard"], "open the metrics log");
    const append = options.append ?? true;
    const file = await Deno.open(path, { create: true, write: true, append, truncate: !append });
    let tb: TensorBoardWriter | undefined;
    try {
      tb = options.tensorboard === undefined
        ? undefined
        : TensorBoardWriter.open(options.tensorboard);
    } catch (err) {
      file.close();
      throw err;
    }
    return new MetricsLog(path instanceof URL ? path.pathname : path, file, tb);
  }

  /**
   * Writes points between records (per step, at the log interval) to the TensorBoard file
   * only: the JSON Lines stay one line per epoch. Does nothing without `tensorboard`.
   *
   * @param values Numbers by tag (e.g. "train/loss").
   * @param step The x-axis: a whole number >= 0.
   * @throws {Error} When the log is closed.
   */
  addScalars(values: Readonly<Record<string, number>>, step: number): void {
    if (this.#file === undefined) {
      throw new Error(`Cannot write to ${this.path}: the log is closed`);
    }
    this.tensorboard?.addScalars(values, step);
  }

  /**
   * Appends one record as a line, with `time` (ISO 8601) unless it has one.
   *
   * @param record Numbers, strings, booleans or null by name.
   * @throws {TypeError} When a value is a non-finite number or not a plain value.
   * @throws {Error} When the log is closed.
   */
  async append(record: MetricsRecord): Promise<void> {
    if (this.#file === undefined) {
      throw new Error(`Cannot append to ${this.path}: the log is closed`);
    }
    for (const [k, v] of Object.entries(record)) {
      const ok = v === null || typeof v === "string" || typeof v === "boolean" ||
        (typeof v === "number" && Number.isFinite(v));
      if (!ok) {
        throw new TypeError(
          `Cannot append to ${this.path}: ${k} must be a finite number, a string, a boolean or ` +
            `null, got ${String(v)}`,
        );
      }
    }
    const line = JSON.stringify({ time: new Date().toISOString(), ...record }) + "\n";
    const bytes = new TextEncoder().encode(line);
    let off = 0;
    while (off < bytes.length) off += await this.#file.write(bytes.subarray(off));
    const index = this.#records++;
    if (this.tensorboard !== undefined) {
      const numbers: Record<string, number> = {};
      for (const [k, v] of Object.entries(record)) {
        if (typeof v === "number" && k !== "step" && k !== "epoch") numbers[k] = v;
      }
      const at = typeof record.step === "number"
        ? record.step
        : typeof record.epoch === "number"
        ? record.epoch
        : index;
      this.tensorboard.addScalars(numbers, at);
    }
  }

  /**
   * Reads a log: one record per non-empty line.
   *
   * @param path The .jsonl file.
   * @returns The records, in order.
   * @throws {SyntaxError} Naming the file and line when a line is not a JSON object.
   */
  static async read(path: string | URL): Promise<MetricsRecord[]> {
    const text = await Deno.readTextFile(path);
    const out: MetricsRecord[] = [];
    for (const [i, line] of text.split("\n").entries()) {
      if (line.trim() === "") continue;
      let v: unknown;
      try {
        v = JSON.parse(line);
      } catch (err) {
        throw new SyntaxError(`${path}:${i + 1}: not a JSON line (${(err as Error).message})`);
      }
      if (typeof v !== "object" || v === null || Array.isArray(v)) {
        throw new SyntaxError(`${path}:${i + 1}: expected a JSON object per line`);
      }
      out.push(v as MetricsRecord);
    }
    return out;
  }

  /** Closes the file. */
  [Symbol.dispose](): void {
    this.#file?.close();
    this.#file = undefined;
    this.tensorboard?.dispose();
  }
}
