/**
 * What a worker does for a sample of an image dataset with `decodeOn: "device"`: it reads the
 * file and, when it is a JPEG the device path decodes as the workers would, puts its bytes in the
 * slot; anything else (a PNG, a CMYK or turned JPEG, one larger than the slot, a file that cannot
 * be read or parsed) is left to the workers' decoder, which decodes it or names what is wrong.
 *
 * @module
 */

/** The checks' limits, from the dataset's options. */
export interface JpegBytesLimits {
  /** The largest [height, width] a slot holds. */
  maxSize: readonly [number, number];
  /** Larger images go to the workers' decoder, which refuses them (default decode/'s limit). */
  maxPixels?: number;
  /** Whether EXIF orientation counts (default true): then only upright files pass. */
  exifOrientation?: boolean;
}

/**
 * Reads a JPEG into `slot`: its size from its header, its bytes at the start.
 *
 * @param path the sample's file
 * @param slot its image slot
 * @param limits see {@linkcode JpegBytesLimits}
 * @param decode decode/ (loaded by the worker with its decoders)
 * @returns height, width and byte length; undefined when the workers should decode the file
 */
export function readJpegInto(
  path: string,
  slot: Uint8Array,
  limits: JpegBytesLimits,
  decode: typeof import("../../decode/mod.ts"),
): [number, number, number] | undefined {
  let bytes: Uint8Array;
  try {
    bytes = Deno.readFileSync(path);
  } catch {
    return undefined; // the workers' decoder reads it again and says why it cannot
  }
  if (bytes.length > slot.length || decode.sniffImageType(bytes) !== "jpeg") return undefined;
  let info;
  try {
    info = decode.jpegInfo(bytes);
  } catch {
    return undefined;
  }
  const [mh, mw] = limits.maxSize;
  if (
    info.height > mh || info.width > mw ||
    info.height * info.width > (limits.maxPixels ?? decode.DEFAULT_MAX_PIXELS) ||
    info.colorspace === "cmyk" || info.colorspace === "ycck" ||
    (limits.exifOrientation !== false && decode.exifOrientation(bytes) !== 1)
  ) {
    return undefined;
  }
  slot.set(bytes);
  return [info.height, info.width, bytes.length];
}
