/**
 * CIFAR-10 in its official binary format (`cifar-10-binary.tar.gz`): `data_batch_1.bin` ..
 * `data_batch_5.bin` (training) and `test_batch.bin`, each 10,000 records of one label byte
 * followed by 3,072 image bytes (3 x 32 x 32, channel-major: all red, then green, then blue).
 *
 * @module
 */

import { LabeledImages } from "./labeled_images.ts";
import { refuseUnknownKeys } from "../../internal/options.ts";
import { join } from "node:path";
import { sharedArray, type WorkerSpec } from "../dataset.ts";
import { downloadFile, extractTar, gunzip, readTar } from "./_files.ts";

/** The official archive. */
export const CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";
/** Its MD5. */
export const CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530";
/** Bytes of one record: label + image. */
export const CIFAR10_RECORD_BYTES = 3073;
/** Records per batch file. */
export const CIFAR10_RECORDS_PER_FILE = 10000;
/** Training files, in order. */
export const CIFAR10_TRAIN_FILES: readonly string[] = [1, 2, 3, 4, 5].map((i) =>
  `data_batch_${i}.bin`
);
/** Test file. */
export const CIFAR10_TEST_FILES: readonly string[] = ["test_batch.bin"];

/** Options of {@linkcode CIFAR10.load}. */
export interface CIFAR10Options {
  /**
   * Directory holding the `.bin` files, or a directory containing the archive's
   * `cifar-10-batches-bin/` folder (where `download` puts it).
   */
  root: string;
  /** Training set (50,000) or test set (10,000). Default true. */
  train?: boolean;
  /** Fetch and extract the official archive under root when the files are missing. */
  download?: boolean;
  /** Archive URL (default the official one). */
  url?: string;
  /** Expected archive MD5 (default the official one). */
  md5?: string;
  /** Print download progress (default true). */
  progress?: boolean;
}

const CIFAR10_OPTIONS = ["root", "train", "download", "url", "md5", "progress"] as const;

/** The serializable state a worker rebuilds a CIFAR10 from (shared memory, not copied). */
export interface CIFAR10State {
  /** Images in shared memory. */
  images: SharedArrayBuffer;
  /** Labels (i32) in shared memory. */
  labels: SharedArrayBuffer;
  /** Sample count. */
  length: number;
  /** Whether this is the training set. */
  train: boolean;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * The CIFAR-10 dataset, held in shared memory: `images` u8 [N, 3, 32, 32] and `labels` i32
 * [N]. Samples are `{ image, label }` (image a view into shared memory); `sharedFields()`
 * gives the zero-copy layout `image` u8 [3,32,32] + `label` i32.
 *
 * @example From generated files in the official format
 * ```ts
 * import { CIFAR10, CIFAR10_RECORD_BYTES } from "./cifar10.ts";
 * import assert from "node:assert";
 * const dir = await Deno.makeTempDir();
 * const bytes = new Uint8Array(10000 * CIFAR10_RECORD_BYTES);
 * bytes[0] = 7; // label of record 0
 * await Deno.writeFile(`${dir}/test_batch.bin`, bytes);
 * const test = await CIFAR10.load({ root: dir, train: false });
 * assert.strictEqual(test.length, 10000);
 * assert.strictEqual(test.get(0).label, 7);
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export class CIFAR10 extends LabeledImages {
  /** Class names, by label. */
  static readonly classes: readonly string[] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
  ];
  private constructor(state: CIFAR10State) {
    super(state, [3, 32, 32]);
  }

  /**
   * Reads the binary files (downloading them first when asked and missing).
   *
   * @param options root, train, download
   * @returns the dataset
   * @throws {Error} naming the file, expected and found size for a truncated or malformed
   *   file; naming what to do when files are missing or the network is unreachable
   */
  static async load(options: CIFAR10Options): Promise<CIFAR10> {
    refuseUnknownKeys(options, CIFAR10_OPTIONS, "load CIFAR-10");
    const train = options.train ?? true;
    const names = train ? CIFAR10_TRAIN_FILES : CIFAR10_TEST_FILES;
    const candidates = [join(options.root, "cifar-10-batches-bin"), options.root];
    let dir: string | undefined;
    for (const c of candidates) if (await exists(join(c, names[0]))) dir = c;
    if (dir === undefined && options.download) {
      await downloadCIFAR10(options.root, options);
      dir = candidates[0];
    }
    if (dir === undefined) {
      throw new Error(
        `Cannot load CIFAR-10: ${names[0]} not found in ${candidates.join(" or ")}. Pass ` +
          `download: true, or point root (--data) at the extracted cifar-10-batches-bin ` +
          `directory of ${CIFAR10_URL}`,
      );
    }
    const n = names.length * CIFAR10_RECORDS_PER_FILE;
    const images = sharedArray("u8", n * 3072);
    const labels = sharedArray("i32", n);
    let r = 0;
    for (const name of names) {
      const path = join(dir, name);
      let bytes: Uint8Array;
      try {
        bytes = await Deno.readFile(path);
      } catch (e) {
        throw new Error(`Cannot read CIFAR-10 file ${path}: ${(e as Error).message}`, { cause: e });
      }
      const expected = CIFAR10_RECORDS_PER_FILE * CIFAR10_RECORD_BYTES;
      if (bytes.length !== expected) {
        throw new Error(
          `Cannot read CIFAR-10 file ${path}: expected ${expected} bytes ` +
            `(${CIFAR10_RECORDS_PER_FILE} records of ${CIFAR10_RECORD_BYTES}), found ${bytes.length}`,
        );
      }
      for (let k = 0; k < CIFAR10_RECORDS_PER_FILE; k++, r++) {
        const off = k * CIFAR10_RECORD_BYTES;
        const label = bytes[off];
        if (label > 9) {
          throw new Error(
            `Cannot read CIFAR-10 file ${path}: record ${k} (byte ${off}) has label ${label}, ` +
              "expected 0..9; is this the binary version of CIFAR-10?",
          );
        }
        labels[r] = label;
        images.set(bytes.subarray(off + 1, off + CIFAR10_RECORD_BYTES), r * 3072);
      }
    }
    return new CIFAR10({
      images: images.buffer as SharedArrayBuffer,
      labels: labels.buffer as SharedArrayBuffer,
      length: n,
      train,
    });
  }

  /**
   * Rebuilds the dataset from its state (used by workers; the memory is shared).
   *
   * @param state from `workerSpec().state`
   * @returns the dataset
   */
  static fromState(state: CIFAR10State): CIFAR10 {
    return new CIFAR10(state);
  }

  /**
   * How workers rebuild this dataset.
   *
   * @returns how workers rebuild this dataset
   */
  workerSpec(): WorkerSpec {
    return { module: import.meta.url, export: "CIFAR10.fromState", state: this.state() };
  }
}

/**
 * Downloads the official CIFAR-10 binary archive into `root`, verifies its MD5, and
 * extracts it (creating `root/cifar-10-batches-bin/`).
 *
 * @param root target directory
 * @param options url, md5, progress
 * @returns the directory holding the .bin files
 * @throws {Error} without network (saying how to supply the data), on a checksum mismatch
 * @example Without network the error says what to do
 * ```ts
 * import { downloadCIFAR10 } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const dir = await Deno.makeTempDir();
 * await assert.rejects(
 *   downloadCIFAR10(dir, { url: "http://127.0.0.1:9/none.tar.gz", progress: false }),
 *   /Cannot download CIFAR-10/,
 * );
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function downloadCIFAR10(
  root: string,
  options: { url?: string; md5?: string; progress?: boolean } = {},
): Promise<string> {
  const url = options.url ?? CIFAR10_URL;
  const archive = join(root, "cifar-10-binary.tar.gz");
  await downloadFile(url, archive, {
    md5: options.md5 ?? CIFAR10_MD5,
    progress: options.progress,
    what: "CIFAR-10",
    offlineHint: `Without network, fetch ${CIFAR10_URL} elsewhere, extract it, and pass the ` +
      "directory holding cifar-10-batches-bin/ (or the .bin files) as root, e.g. --data <dir>.",
  });
  const tar = await gunzip(await Deno.readFile(archive), archive);
  await extractTar(readTar(tar, archive), root);
  return join(root, "cifar-10-batches-bin");
}
