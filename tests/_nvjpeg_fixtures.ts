// JPEGs for the nvJPEG tests, encoded with TurboJPEG from a deterministic pattern (gradients
// and 8-pixel checks, so the IDCT and chroma upsampling matter).

import type { TurboJpeg } from "../decode/turbojpeg.ts";

/**
 * A `height` x `width` JPEG of 1 or 3 channels (4:2:0 for colour).
 *
 * @param tj The encoder.
 * @param height Rows.
 * @param width Columns.
 * @param channels 1 or 3.
 * @param seed Varies the pattern.
 * @returns The file's bytes.
 */
export function jpegPattern(
  tj: TurboJpeg,
  height: number,
  width: number,
  channels: 1 | 3,
  seed = 0,
): Uint8Array {
  const data = new Uint8Array(height * width * channels);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      for (let c = 0; c < channels; c++) {
        const check = ((x >> 3) + (y >> 3)) % 2 === 0 ? 0 : 96;
        data[(y * width + x) * channels + c] =
          (x * 255 / width + y * 3 * (c + 1) + check + seed * 17) & 255;
      }
    }
  }
  return tj.encode({ data, height, width, channels }, 85);
}
