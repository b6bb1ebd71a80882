/**
 * What a worker does for a sample of an image dataset with `decodeOn: "device"`: it reads the
 * file, checks what the device path cannot do from the header, and puts the bytes in the slot.
 *
 * @module
 */

/** The checks' limits, from the dataset's options. */
export interface JpegBytesLimits {
  /** The largest [height, width] a slot holds. */
  maxSize: readonly [number, number];
  /** Refuse larger images (default decode/'s limit). */
  maxPixels?: number;
  /** Whether EXIF orientation counts (default true): then only upright files pass. */
  exifOrientation?: boolean;
}

/**
 * Reads sample `index`'s JPEG into `slot`: its size from its header, its bytes at the start.
 *
 * @param index sample index
 * @param path its file
 * @param slot its image slot
 * @param limits see {@linkcode JpegBytesLimits}
 * @param decode decode/ (loaded by the worker with its decoders)
 * @returns height, width and byte length
 * @throws {Error} "Cannot load sample <index> (<path>): <reason>"
 */
export function readJpegInto(
  index: number,
  path: string,
  slot: Uint8Array,
  limits: JpegBytesLimits,
  decode: typeof import("../../decode/mod.ts"),
): [number, number, number] {
  try {
    let bytes: Uint8Array;
    try {
      bytes = Deno.readFileSync(path);
    } catch (e) {
      throw new Error(`the file cannot be read (${(e as Error).message})`, { cause: e });
    }
    if (bytes.length === 0) throw new Error("the file is empty");
    const type = decode.sniffImageType(bytes);
    if (type !== "jpeg") {
      throw new Error(
        `decodeOn "device" decodes JPEG files only, this is ${
          type ? `a ${type.toUpperCase()}` : "no JPEG"
        } (decode such files on the workers: decodeOn "workers")`,
      );
    }
    const info = decode.jpegInfo(bytes);
    const [mh, mw] = limits.maxSize;
    const maxPixels = limits.maxPixels ?? decode.DEFAULT_MAX_PIXELS;
    if (info.height * info.width > maxPixels) {
      throw new Error(`${info.width}x${info.height} is more than maxPixels (${maxPixels} pixels)`);
    }
    if (info.height > mh || info.width > mw) {
      throw new Error(
        `it is ${info.width}x${info.height}, larger than maxSize [${mh}, ${mw}] (height, width); ` +
          "decoding on the device does not shrink images: raise maxSize",
      );
    }
    if (info.colorspace === "cmyk" || info.colorspace === "ycck") {
      throw new Error(`it is a ${info.colorspace.toUpperCase()} JPEG, decoded on the workers only`);
    }
    const orientation = limits.exifOrientation === false ? 1 : decode.exifOrientation(bytes);
    if (orientation !== 1) {
      throw new Error(
        `it has EXIF orientation ${orientation}, which decoding on the device does not apply ` +
          "(pass exifOrientation: false to ignore it)",
      );
    }
    if (bytes.length > slot.length) {
      throw new Error(
        `its ${bytes.length} bytes do not fit the slot of ${slot.length} (maxSize's pixels)`,
      );
    }
    slot.set(bytes);
    return [info.height, info.width, bytes.length];
  } catch (e) {
    throw new Error(`Cannot load sample ${index} (${path}): ${(e as Error).message}`, {
      cause: e,
    });
  }
}
