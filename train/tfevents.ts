/**
 * TensorBoard event files, written without TensorFlow or TensorBoard: the `tfevents` record
 * format (a little-endian uint64 length, its masked CRC32C, the bytes of an `Event` protocol
 * buffer, their masked CRC32C), with scalar summaries. `tensorboard --logdir DIR` reads them.
 *
 * @example
 * ```ts
 * import { TensorBoardWriter } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const dir = await Deno.makeTempDir();
 * {
 *   using tb = TensorBoardWriter.open(dir);
 *   tb.addScalar("train/loss", 0.75, 10);
 *   tb.addScalars({ "test/loss": 0.8, "test/accuracy": 0.6 }, 10);
 *   assert.match(tb.path, /events\.out\.tfevents\.\d+\./);
 * }
 * assert.strictEqual([...Deno.readDirSync(dir)].length, 1);
 * await Deno.remove(dir, { recursive: true });
 * ```
 *
 * @module
 */

import { refuseUnknownKeys } from "../internal/options.ts";

/** Options of {@linkcode TensorBoardWriter.open}. */
export interface TensorBoardWriterOptions {
  /** Appended to the file name, as PyTorch's `filename_suffix` (default none). */
  filenameSuffix?: string;
}

const CRC32C_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/**
 * The CRC32C (Castagnoli) of `bytes`, masked as the record format stores it (a raw CRC of
 * data that itself holds CRCs is weak, hence the rotation and offset).
 *
 * @param bytes The bytes.
 * @returns The masked checksum, as an unsigned 32-bit number.
 * @example
 * ```ts
 * import { maskedCrc32c } from "./tfevents.ts";
 * import assert from "node:assert";
 * // CRC32C("123456789") is 0xe3069283, the check value of the Castagnoli polynomial.
 * const crc = 0xe3069283;
 * const masked = ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
 * assert.strictEqual(maskedCrc32c(new TextEncoder().encode("123456789")), masked);
 * ```
 */
export function maskedCrc32c(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC32C_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  const crc = (c ^ 0xffffffff) >>> 0;
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

/** A protocol buffer message under construction (only the wire types an Event needs). */
class Proto {
  #parts: number[] = [];

  #varint(v: number): void {
    while (v >= 0x80) {
      this.#parts.push((v % 0x80) | 0x80);
      v = Math.floor(v / 0x80);
    }
    this.#parts.push(v);
  }

  varint(field: number, v: number): this {
    this.#varint(field << 3);
    this.#varint(v);
    return this;
  }

  double(field: number, v: number): this {
    this.#varint((field << 3) | 1);
    const b = new Uint8Array(8);
    new DataView(b.buffer).setFloat64(0, v, true);
    this.#parts.push(...b);
    return this;
  }

  float(field: number, v: number): this {
    this.#varint((field << 3) | 5);
    const b = new Uint8Array(4);
    new DataView(b.buffer).setFloat32(0, v, true);
    this.#parts.push(...b);
    return this;
  }

  bytes(field: number, v: Uint8Array): this {
    this.#varint((field << 3) | 2);
    this.#varint(v.length);
    for (const x of v) this.#parts.push(x);
    return this;
  }

  string(field: number, v: string): this {
    return this.bytes(field, new TextEncoder().encode(v));
  }

  done(): Uint8Array {
    return Uint8Array.from(this.#parts);
  }
}

/** One record: length, masked CRC of the length, data, masked CRC of the data. */
function record(data: Uint8Array): Uint8Array {
  const out = new Uint8Array(8 + 4 + data.length + 4);
  const view = new DataView(out.buffer);
  view.setBigUint64(0, BigInt(data.length), true);
  view.setUint32(8, maskedCrc32c(out.subarray(0, 8)), true);
  out.set(data, 12);
  view.setUint32(12 + data.length, maskedCrc32c(data), true);
  return out;
}

function hostname(): string {
  // Without the permission, a name that says so rather than a prompt in the middle of a run.
  if (Deno.permissions.querySync({ name: "sys", kind: "hostname" }).state !== "granted") {
    return "localhost";
  }
  return Deno.hostname().replace(/[^A-Za-z0-9._-]/g, "_");
}

/**
 * An open TensorBoard event file in a log directory, as PyTorch's `SummaryWriter` for
 * scalars. Each call writes its record at once, so a run that dies keeps every point written
 * and TensorBoard can follow the file.
 *
 * @example
 * ```ts
 * import { TensorBoardWriter } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const dir = await Deno.makeTempDir();
 * const tb = TensorBoardWriter.open(dir, { filenameSuffix: ".run1" });
 * tb.addScalar("lr", 0.1, 0);
 * tb.dispose();
 * assert.ok(tb.path.endsWith(".run1"));
 * assert.throws(() => tb.addScalar("lr", 0.1, 1), /the writer is closed/);
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export class TensorBoardWriter implements Disposable {
  /** The event file. */
  readonly path: string;
  #file: Deno.FsFile | undefined;

  private constructor(path: string, file: Deno.FsFile) {
    this.path = path;
    this.#file = file;
  }

  /**
   * Creates a new event file `events.out.tfevents.<unix seconds>.<hostname>` in `dir`
   * (created when missing) and writes its version record.
   *
   * @param dir The log directory (`tensorboard --logdir` takes it or a parent).
   * @param options `filenameSuffix`.
   * @returns The writer; dispose it to close the file.
   * @throws {TypeError} On an unknown option.
   */
  static open(dir: string, options: TensorBoardWriterOptions = {}): TensorBoardWriter {
    refuseUnknownKeys(options ?? {}, ["filenameSuffix"], "open the TensorBoard writer");
    Deno.mkdirSync(dir, { recursive: true });
    const now = Date.now() / 1000;
    const base = `${dir}/events.out.tfevents.${Math.floor(now)}.${hostname()}`;
    const suffix = options.filenameSuffix ?? "";
    // Two writers opened in the same second (a resumed run, a test) get files of their own.
    for (let n = 0;; n++) {
      const path = `${base}${n === 0 ? "" : `.${n}`}${suffix}`;
      try {
        const file = Deno.openSync(path, { createNew: true, write: true });
        const w = new TensorBoardWriter(path, file);
        w.#write(new Proto().double(1, now).varint(2, 0).string(3, "brain.Event:2").done());
        return w;
      } catch (err) {
        if (!(err instanceof Deno.errors.AlreadyExists)) throw err;
      }
    }
  }

  /**
   * Writes one scalar.
   *
   * @param tag The series, e.g. "train/loss" (TensorBoard groups by the part before "/").
   * @param value The value (stored as a float32; NaN and infinities are kept: a diverging
   *   loss is worth seeing).
   * @param step The x-axis: a whole number >= 0.
   * @param wallTime Seconds since the epoch (default now).
   * @throws {TypeError} When the value is not a number.
   * @throws {RangeError} When the step is not a whole number >= 0.
   * @throws {Error} When the writer is closed.
   */
  addScalar(tag: string, value: number, step: number, wallTime?: number): void {
    this.addScalars({ [tag]: value }, step, wallTime);
  }

  /**
   * Writes several scalars of one step as one event.
   *
   * @param values Values by tag.
   * @param step The x-axis: a whole number >= 0.
   * @param wallTime Seconds since the epoch (default now).
   * @throws {TypeError} When a value is not a number.
   * @throws {RangeError} When the step is not a whole number >= 0.
   * @throws {Error} When the writer is closed.
   */
  addScalars(values: Readonly<Record<string, number>>, step: number, wallTime?: number): void {
    if (this.#file === undefined) {
      throw new Error(`Cannot write to ${this.path}: the writer is closed`);
    }
    if (!Number.isSafeInteger(step) || step < 0) {
      throw new RangeError(
        `Cannot write to ${this.path}: step must be a whole number >= 0, got ${step}`,
      );
    }
    const summary = new Proto();
    for (const [tag, v] of Object.entries(values)) {
      if (typeof v !== "number") {
        throw new TypeError(
          `Cannot write to ${this.path}: ${tag} must be a number, got ${typeof v}`,
        );
      }
      summary.bytes(1, new Proto().string(1, tag).float(2, v).done());
    }
    this.#write(
      new Proto().double(1, wallTime ?? Date.now() / 1000).varint(2, step)
        .bytes(5, summary.done()).done(),
    );
  }

  #write(event: Uint8Array): void {
    const bytes = record(event);
    let off = 0;
    while (off < bytes.length) off += this.#file!.writeSync(bytes.subarray(off));
  }

  /** Closes the file. */
  dispose(): void {
    this.#file?.close();
    this.#file = undefined;
  }

  /** Closes the file. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
