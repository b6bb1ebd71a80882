/**
 * MNIST and Fashion-MNIST from IDX files (gzip-compressed or not):
 * `train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`, `t10k-images-idx3-ubyte[.gz]`,
 * `t10k-labels-idx1-ubyte[.gz]`. Debian's `dataset-fashion-mnist` package installs the
 * gzip files under `/usr/share/datasets/fashion-mnist`, the default root of
 * {@linkcode FashionMNIST}. With `download: true`, missing files of the split are fetched
 * from the published mirrors into `root` and checked against their published MD5 digests.
 *
 * @module
 */

import { LabeledImages } from "./labeled_images.ts";
import { refuseUnknownKeys } from "../../internal/options.ts";
import { join } from "node:path";
import { sharedArray, type WorkerSpec } from "../dataset.ts";
import { downloadFile, gunzip, isGzip } from "./_files.ts";

/** A parsed IDX file of unsigned bytes. */
export interface IdxFile {
  /** Dimensions, e.g. [60000, 28, 28]. */
  dims: number[];
  /** The data, product(dims) bytes. */
  data: Uint8Array;
}

/**
 * Parses an IDX file of unsigned bytes (type 0x08), gzip or not.
 *
 * @param bytes the file's bytes
 * @param file the name used in errors
 * @param ndims the expected number of dimensions (3 for images, 1 for labels)
 * @returns dims and data (a view into the decompressed bytes)
 * @throws {Error} naming the file for a bad magic, a wrong rank, or a size mismatch
 *   (expected and found bytes)
 * @example A two-label file
 * ```ts
 * import { parseIdx } from "./mnist.ts";
 * import assert from "node:assert";
 * const bytes = new Uint8Array([0, 0, 8, 1, 0, 0, 0, 2, 4, 9]);
 * const idx = await parseIdx(bytes, "labels", 1);
 * assert.deepStrictEqual(idx.dims, [2]);
 * assert.deepStrictEqual([...idx.data], [4, 9]);
 * ```
 */
export async function parseIdx(bytes: Uint8Array, file: string, ndims: number): Promise<IdxFile> {
  if (isGzip(bytes)) bytes = await gunzip(bytes, file);
  if (bytes.length < 4) {
    throw new Error(
      `Cannot read IDX file ${file}: expected at least 4 bytes, found ${bytes.length}`,
    );
  }
  const magic = ((bytes[0] << 24) | (bytes[1] << 16) | (bytes[2] << 8) | bytes[3]) >>> 0;
  const expectedMagic = 0x800 | ndims;
  if (magic !== expectedMagic) {
    throw new Error(
      `Cannot read IDX file ${file}: magic 0x${magic.toString(16).padStart(8, "0")}, expected ` +
        `0x${expectedMagic.toString(16).padStart(8, "0")} (unsigned bytes, ${ndims} dimensions)`,
    );
  }
  const header = 4 + 4 * ndims;
  if (bytes.length < header) {
    throw new Error(
      `Cannot read IDX file ${file}: expected a ${header}-byte header, found ${bytes.length} bytes`,
    );
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const dims: number[] = [];
  for (let d = 0; d < ndims; d++) dims.push(view.getUint32(4 + 4 * d));
  const expected = header + dims.reduce((a, b) => a * b, 1);
  if (bytes.length !== expected) {
    throw new Error(
      `Cannot read IDX file ${file}: expected ${expected} bytes (${header}-byte header + ` +
        `${dims.join(" x ")}), found ${bytes.length}`,
    );
  }
  return { dims, data: bytes.subarray(header) };
}

/** Options of {@linkcode MNIST.load} and {@linkcode FashionMNIST.load}. */
export interface MNISTOptions {
  /** Directory of the IDX files (FashionMNIST defaults to /usr/share/datasets/fashion-mnist). */
  root?: string;
  /** Training set (60,000) or test set (10,000). Default true. */
  train?: boolean;
  /** Fetch the split's gzip files into `root` when missing (default false). */
  download?: boolean;
  /** Base URL of a mirror holding the gzip files (default: the published mirrors, in turn). */
  url?: string;
  /** Expected MD5 (hex) per file name, e.g. for a mirror of other files (default: published). */
  md5?: Readonly<Record<string, string>>;
  /** Print download progress (default true). */
  progress?: boolean;
}

const MNIST_OPTIONS = ["root", "train", "download", "url", "md5", "progress"] as const;

/** Where MNIST is published, tried in turn. */
export const MNIST_MIRRORS: readonly string[] = [
  "https://ossci-datasets.s3.amazonaws.com/mnist/",
  "http://yann.lecun.com/exdb/mnist/",
];

/** The MD5 digests of MNIST's published gzip files. */
export const MNIST_MD5: Readonly<Record<string, string>> = {
  "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
  "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
  "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
  "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
};

/** Where Fashion-MNIST is published. */
export const FASHION_MNIST_MIRRORS: readonly string[] = [
  "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
];

/** The MD5 digests of Fashion-MNIST's published gzip files. */
export const FASHION_MNIST_MD5: Readonly<Record<string, string>> = {
  "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
  "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
  "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
  "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
};

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

/**
 * Fetches the split's image and label files that `root` lacks (in any of the accepted names),
 * trying each mirror in turn on a network or HTTP failure; a checksum mismatch stops at once.
 */
async function downloadSplit(
  what: string,
  options: MNISTOptions & { root: string },
  mirrors: readonly string[],
  md5: Readonly<Record<string, string>>,
): Promise<void> {
  const prefix = (options.train ?? true) ? "train" : "t10k";
  for (const [kind, idx] of [["images", "idx3"], ["labels", "idx1"]]) {
    const names = [`${prefix}-${kind}-${idx}-ubyte.gz`, `${prefix}-${kind}-${idx}-ubyte`];
    names.push(`${prefix}-${kind}.${idx}-ubyte`);
    const present = await Promise.all(names.map((n) => exists(join(options.root, n))));
    if (present.some((p) => p)) continue;
    const file = names[0];
    const expected = (options.md5 ?? md5)[file];
    if (expected === undefined) {
      throw new TypeError(`Cannot download ${what}: md5 option has no digest for ${file}`);
    }
    const bases = options.url !== undefined ? [options.url] : mirrors;
    const failures: string[] = [];
    for (const base of bases) {
      const url = `${base.endsWith("/") ? base : `${base}/`}${file}`;
      try {
        await downloadFile(url, join(options.root, file), {
          md5: expected,
          progress: options.progress ?? true,
          what: `${what} ${file}`,
        });
        failures.length = 0;
        break;
      } catch (e) {
        if (/^Cannot verify/.test((e as Error).message)) throw e;
        failures.push((e as Error).message);
      }
    }
    if (failures.length > 0) {
      throw new Error(failures.length === 1 ? failures[0] : failures.join("; then "));
    }
  }
}

/** The serializable state a worker rebuilds the dataset from (shared memory). */
export interface MNISTState {
  /** Images in shared memory. */
  images: SharedArrayBuffer;
  /** Labels (i32) in shared memory. */
  labels: SharedArrayBuffer;
  /** Sample count. */
  length: number;
  /** Whether this is the training set. */
  train: boolean;
}

async function readFirst(paths: string[]): Promise<{ path: string; bytes: Uint8Array }> {
  for (const path of paths) {
    try {
      return { path, bytes: await Deno.readFile(path) };
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) {
        throw new Error(`Cannot read ${path}: ${(e as Error).message}`, { cause: e });
      }
    }
  }
  throw new Error(`none of ${paths.join(", ")} exists`);
}

async function loadIdxPair(root: string, train: boolean, what: string) {
  const prefix = train ? "train" : "t10k";
  const img = await readFirst([
    join(root, `${prefix}-images-idx3-ubyte.gz`),
    join(root, `${prefix}-images-idx3-ubyte`),
    join(root, `${prefix}-images.idx3-ubyte`),
  ]).catch((e) => {
    throw new Error(`Cannot load ${what}: ${(e as Error).message}`, { cause: e });
  });
  const lab = await readFirst([
    join(root, `${prefix}-labels-idx1-ubyte.gz`),
    join(root, `${prefix}-labels-idx1-ubyte`),
    join(root, `${prefix}-labels.idx1-ubyte`),
  ]).catch((e) => {
    throw new Error(`Cannot load ${what}: ${(e as Error).message}`, { cause: e });
  });
  const images = await parseIdx(img.bytes, img.path, 3);
  const labels = await parseIdx(lab.bytes, lab.path, 1);
  if (images.dims[0] !== labels.dims[0]) {
    throw new Error(
      `Cannot load ${what}: ${img.path} has ${images.dims[0]} images but ${lab.path} has ` +
        `${labels.dims[0]} labels`,
    );
  }
  if (images.dims[1] !== 28 || images.dims[2] !== 28) {
    throw new Error(
      `Cannot load ${what}: ${img.path} has ${images.dims[1]} x ${images.dims[2]} images, ` +
        "expected 28 x 28",
    );
  }
  const n = images.dims[0];
  const sImages = sharedArray("u8", n * 784);
  sImages.set(images.data);
  const sLabels = sharedArray("i32", n);
  for (let i = 0; i < n; i++) {
    const l = labels.data[i];
    if (l > 9) {
      throw new Error(`Cannot load ${what}: ${lab.path} has label ${l} at ${i}, expected 0..9`);
    }
    sLabels[i] = l;
  }
  return {
    images: sImages.buffer as SharedArrayBuffer,
    labels: sLabels.buffer as SharedArrayBuffer,
    length: n,
    train,
  };
}

/**
 * MNIST handwritten digits, in shared memory: `images` u8 [N, 1, 28, 28], `labels` i32 [N].
 * Samples are `{ image, label }`; `sharedFields()` gives `image` u8 [1,28,28] + `label` i32.
 *
 * @example From generated IDX files
 * ```ts
 * import { MNIST } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * const dir = await Deno.makeTempDir();
 * const be = (n: number) => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255];
 * await Deno.writeFile(
 *   `${dir}/t10k-images-idx3-ubyte`,
 *   new Uint8Array([0, 0, 8, 3, ...be(1), ...be(28), ...be(28), ...new Array(784).fill(5)]),
 * );
 * await Deno.writeFile(`${dir}/t10k-labels-idx1-ubyte`, new Uint8Array([0, 0, 8, 1, ...be(1), 3]));
 * const ds = await MNIST.load({ root: dir, train: false });
 * assert.strictEqual(ds.get(0).label, 3);
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export class MNIST extends LabeledImages {
  /** Class names, by label. */
  static readonly classes: readonly string[] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
  /** @internal Use `load` or `fromState`. */
  constructor(state: MNISTState) {
    super(state, [1, 28, 28]);
  }

  /**
   * Reads the IDX files.
   *
   * @param options root (required for MNIST), train, download (with url, md5, progress)
   * @returns the dataset
   * @throws {Error} naming the file and the expected and found sizes for a truncated or
   *   malformed file, or listing the paths tried when files are missing
   */
  static async load(options: MNISTOptions = {}): Promise<MNIST> {
    refuseUnknownKeys(options ?? {}, MNIST_OPTIONS, "load MNIST");
    if (options.root === undefined) {
      throw new TypeError("Cannot load MNIST: pass root, the directory of the IDX files");
    }
    if (options.download) {
      await downloadSplit("MNIST", { ...options, root: options.root }, MNIST_MIRRORS, MNIST_MD5);
    }
    return new MNIST(await loadIdxPair(options.root, options.train ?? true, "MNIST"));
  }

  /**
   * Rebuilds the dataset from its worker state (the memory is shared, not copied).
   *
   * @param state from `workerSpec().state`
   * @returns the dataset over the same shared memory
   */
  static fromState(state: MNISTState): MNIST {
    return new MNIST(state);
  }

  /**
   * How workers rebuild this dataset.
   *
   * @returns how workers rebuild this dataset
   */
  workerSpec(): WorkerSpec {
    const name = this instanceof FashionMNIST ? "FashionMNIST" : "MNIST";
    return { module: import.meta.url, export: `${name}.fromState`, state: this.state() };
  }
}

/** Where Debian's dataset-fashion-mnist package puts the files. */
export const FASHION_MNIST_DEBIAN_ROOT = "/usr/share/datasets/fashion-mnist";

/**
 * Fashion-MNIST (Zalando): the MNIST format with clothing classes. `root` defaults to
 * {@linkcode FASHION_MNIST_DEBIAN_ROOT}.
 *
 * @example Class names
 * ```ts
 * import { FashionMNIST } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * assert.strictEqual(FashionMNIST.classes[9], "Ankle boot");
 * ```
 */
export class FashionMNIST extends MNIST {
  /** Class names, by label. */
  static override readonly classes: readonly string[] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
  ];

  /**
   * Reads the IDX files.
   *
   * @param options root (default /usr/share/datasets/fashion-mnist), train, download (with
   *   url, md5, progress)
   * @returns the dataset
   * @throws {Error} naming the file and sizes for a truncated or malformed file; saying
   *   how to install the data when missing
   */
  static override async load(options: MNISTOptions = {}): Promise<FashionMNIST> {
    refuseUnknownKeys(options ?? {}, MNIST_OPTIONS, "load FashionMNIST");
    const root = options.root ?? FASHION_MNIST_DEBIAN_ROOT;
    if (options.download) {
      if (options.root === undefined) {
        throw new TypeError(
          "Cannot load FashionMNIST: download needs root, a directory to download into",
        );
      }
      await downloadSplit(
        "Fashion-MNIST",
        { ...options, root },
        FASHION_MNIST_MIRRORS,
        FASHION_MNIST_MD5,
      );
    }
    try {
      return new FashionMNIST(await loadIdxPair(root, options.train ?? true, "Fashion-MNIST"));
    } catch (e) {
      if (options.root === undefined && /none of/.test((e as Error).message)) {
        throw new Error(
          `${(e as Error).message}. Install it with \`apt-get install dataset-fashion-mnist\` ` +
            "or pass root, the directory of the IDX files",
        );
      }
      throw e;
    }
  }

  /**
   * Rebuilds the dataset from its worker state (the memory is shared, not copied).
   *
   * @param state from `workerSpec().state`
   * @returns the dataset over the same shared memory
   */
  static override fromState(state: MNISTState): FashionMNIST {
    return new FashionMNIST(state);
  }
}
