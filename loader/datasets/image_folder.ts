/**
 * `ImageFolder`: images in one folder per class (`root/dog/xxx.png`, `root/cat/123.jpg`),
 * with torchvision's conventions: classes are the sorted subfolder names, files are found
 * recursively in sorted order and kept when their extension is allowed (or an `isValidFile`
 * check says so). The file type itself comes from the bytes when decoding.
 *
 * @module
 */

import { join } from "node:path";
import { ImageFiles, type ImageFilesOptions } from "./image_files.ts";

/** The extensions ImageFolder keeps by default: the types pinstream decodes. */
export const IMAGE_EXTENSIONS: readonly string[] = [".jpg", ".jpeg", ".png"];

/** Options of {@linkcode ImageFolder}. */
export interface ImageFolderOptions extends ImageFilesOptions {
  /** Extensions kept, case ignored (default {@linkcode IMAGE_EXTENSIONS}). */
  extensions?: readonly string[];
  /** Keeps a file when it returns true; replaces the extension check (not both). */
  isValidFile?: (path: string) => boolean;
  /** Allow a class folder with no valid file (default false: refused, as torchvision). */
  allowEmpty?: boolean;
}

const FOLDER_KEYS = ["extensions", "isValidFile", "allowEmpty"];

/** Subdirectories of `dir`, following symbolic links. */
function isDir(path: string): boolean {
  try {
    return Deno.statSync(path).isDirectory;
  } catch {
    return false;
  }
}

/** Files of `dir` and below: directories in sorted path order, names sorted in each. */
function walk(dir: string): string[] {
  const dirs: string[] = [];
  const visit = (d: string) => {
    dirs.push(d);
    for (const e of Deno.readDirSync(d)) {
      const p = join(d, e.name);
      if (e.isDirectory || (e.isSymlink && isDir(p))) visit(p);
    }
  };
  visit(dir);
  dirs.sort();
  const out: string[] = [];
  for (const d of dirs) {
    const names: string[] = [];
    for (const e of Deno.readDirSync(d)) {
      const p = join(d, e.name);
      if (e.isFile || (e.isSymlink && !isDir(p))) names.push(e.name);
    }
    names.sort();
    for (const n of names) out.push(join(d, n));
  }
  return out;
}

/**
 * A folder of images, one subfolder per class, decoded on load (in the workers).
 *
 * @example
 * ```ts
 * import { ImageFolder } from "@pinstream/pinstream";
 * import assert from "node:assert";
 * import { join } from "node:path";
 * const root = await Deno.makeTempDir();
 * for (const c of ["dog", "cat"]) {
 *   await Deno.mkdir(join(root, c));
 *   await Deno.writeFile(join(root, c, "1.jpg"), new Uint8Array([0xff, 0xd8, 0xff]));
 *   await Deno.writeFile(join(root, c, "notes.txt"), new Uint8Array(1));
 * }
 * const ds = new ImageFolder(root);
 * assert.deepStrictEqual(ds.classes, ["cat", "dog"]);
 * assert.deepStrictEqual(ds.classToIndex, { cat: 0, dog: 1 });
 * assert.strictEqual(ds.length, 2);
 * assert.strictEqual(ds.path(1), join(root, "dog", "1.jpg"));
 * await Deno.remove(root, { recursive: true });
 * ```
 */
export class ImageFolder extends ImageFiles {
  /** The folder. */
  readonly root: string;

  /**
   * Scans `root`.
   *
   * @param root the folder of class folders
   * @param options file selection and decoding options
   * @throws {Error} when `root` has no class folder, or a class has no valid file (unless
   *   `allowEmpty`); {@linkcode TypeError} for both `extensions` and `isValidFile`
   */
  constructor(root: string, options: ImageFolderOptions = {}) {
    super(ImageFolder.#scan(root, options));
    this.root = root;
  }

  static #scan(root: string, options: ImageFolderOptions) {
    if (options.extensions !== undefined && options.isValidFile !== undefined) {
      throw new TypeError(
        "Cannot create ImageFolder: both extensions and isValidFile given; pass one of them",
      );
    }
    let entries: Deno.DirEntry[];
    try {
      entries = [...Deno.readDirSync(root)];
    } catch (e) {
      throw new Error(`Cannot read ImageFolder root ${root}: ${(e as Error).message}`, {
        cause: e,
      });
    }
    const classes = entries
      .filter((e) => e.isDirectory || (e.isSymlink && isDir(join(root, e.name))))
      .map((e) => e.name)
      .sort();
    if (classes.length === 0) {
      throw new Error(`Cannot create ImageFolder: no class folder found in ${root}`);
    }
    const exts = (options.extensions ?? IMAGE_EXTENSIONS).map((e) => e.toLowerCase());
    const valid = options.isValidFile ??
      ((p: string) => exts.some((e) => p.toLowerCase().endsWith(e)));
    const paths: string[] = [], labels: number[] = [];
    const empty: string[] = [];
    classes.forEach((c, k) => {
      let n = 0;
      for (const p of walk(join(root, c))) {
        if (!valid(p)) continue;
        paths.push(p);
        labels.push(k);
        n++;
      }
      if (n === 0) empty.push(c);
    });
    if (empty.length > 0 && !options.allowEmpty) {
      throw new Error(
        `Cannot create ImageFolder: found no valid file for class folder(s) ${
          empty.join(", ")
        } in ${root}. ${
          options.isValidFile
            ? "isValidFile refused them all"
            : `Allowed extensions: ${exts.join(", ")}`
        } (pass allowEmpty: true to accept empty classes)`,
      );
    }
    return ImageFiles.makeState(paths, labels, classes, options, "ImageFolder", FOLDER_KEYS);
  }
}
