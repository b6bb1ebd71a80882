/**
 * The types shared by pinstream's image decoders.
 *
 * @module
 */

/** Decoded pixels: `height` rows of `width` pixels of `channels` bytes (HWC, row-major). */
export interface DecodedImage {
  /** The pixels, `height * width * channels` bytes. */
  data: Uint8Array;
  /** Rows. */
  height: number;
  /** Pixels per row. */
  width: number;
  /** 1 (grey), 3 (RGB) or 4 (RGBA). */
  channels: 1 | 3 | 4;
}

/** Channels of a decoded image: 1 grey, 3 RGB (as torchvision's loader), 4 RGBA. */
export type Channels = 1 | 3 | 4;

/** An error decoding one image: the reason, without the file name (the caller adds it). */
export class ImageDecodeError extends Error {
  /** Makes the error; `options.cause` keeps the underlying one. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ImageDecodeError";
  }
}

/** A region of an image: rows `top..top+height`, columns `left..left+width`. */
export interface CropBox {
  /** First row. */
  top: number;
  /** First column. */
  left: number;
  /** Rows. */
  height: number;
  /** Columns. */
  width: number;
}
