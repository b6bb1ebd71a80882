/**
 * Image file types by their first bytes (the magic number), never by the file name: a
 * ".jpg" that holds a PNG is read as a PNG, and a file that is neither is refused by name.
 *
 * @module
 */

/** The image file types pinstream recognises. Only "jpeg" and "png" are decoded. */
export type ImageType = "jpeg" | "png" | "gif" | "bmp" | "webp" | "tiff";

/**
 * The type of an image file from its first bytes.
 *
 * @param bytes the file's bytes (the first 12 are enough)
 * @returns the type, or undefined when the bytes are no image pinstream knows
 * @example
 * ```ts
 * import { sniffImageType } from "./format.ts";
 * import assert from "node:assert";
 * assert.strictEqual(sniffImageType(new Uint8Array([0xff, 0xd8, 0xff, 0xe0])), "jpeg");
 * assert.strictEqual(
 *   sniffImageType(new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])),
 *   "png",
 * );
 * assert.strictEqual(sniffImageType(new TextEncoder().encode("hello")), undefined);
 * ```
 */
export function sniffImageType(bytes: Uint8Array): ImageType | undefined {
  const b = bytes;
  const at = (i: number, ...v: number[]) => v.every((x, k) => b[i + k] === x);
  if (b.length >= 3 && at(0, 0xff, 0xd8, 0xff)) return "jpeg";
  if (b.length >= 8 && at(0, 0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a)) return "png";
  if (
    b.length >= 6 &&
    (at(0, 0x47, 0x49, 0x46, 0x38, 0x37, 0x61) || at(0, 0x47, 0x49, 0x46, 0x38, 0x39, 0x61))
  ) {
    return "gif";
  }
  if (b.length >= 2 && at(0, 0x42, 0x4d)) return "bmp";
  if (b.length >= 12 && at(0, 0x52, 0x49, 0x46, 0x46) && at(8, 0x57, 0x45, 0x42, 0x50)) {
    return "webp";
  }
  if (b.length >= 4 && (at(0, 0x49, 0x49, 0x2a, 0x00) || at(0, 0x4d, 0x4d, 0x00, 0x2a))) {
    return "tiff";
  }
  return undefined;
}
