/**
 * The per-sample augmentation a loader draws: the options, their defaults and their checks.
 * Every option defaults to off, and an option that is off changes no output bit.
 *
 * @module
 */

import { optionError, refuseUnknownKeys } from "../internal/options.ts";

/**
 * Per-sample augmentation parameters drawn by the loader (zero-copy path), each from the
 * sample's seeded stream, into the batch's `augment` records (see {@linkcode augmentRecord});
 * the {@linkcode DevicePrefetcher} and {@linkcode DeviceLoader} apply them in one fused kernel.
 * Every option defaults to off, and an option that is off changes no output bit.
 */
export interface AugmentOptions {
  /** Random-crop padding p: `dy, dx` drawn in [0, 2p] (default 0: no crop). */
  padding?: number;
  /** Draw a horizontal-flip bit per sample, torchvision's RandomHorizontalFlip (default false). */
  flip?: boolean;
  /** Draw a vertical-flip bit per sample, torchvision's RandomVerticalFlip (default false). */
  vflip?: boolean;
  /**
   * Cutout: the side in pixels of a square, centred on a random pixel of each image and
   * clipped at its borders, whose normalized values become 0 (the channel mean), as Cutout
   * (DeVries & Taylor) or RandomErasing after Normalize (default 0: off).
   */
  cutout?: number;
  /**
   * Brightness jitter j: each image's bytes are multiplied by a factor drawn uniformly in
   * [max(0, 1 - j), 1 + j] and clamped to [0, 255], as torchvision's ColorJitter(brightness=j)
   * (default 0: off).
   */
  brightness?: number;
  /**
   * Contrast jitter j: a factor f drawn uniformly in [max(0, 1 - j), 1 + j] blends each byte
   * toward the image's own mean grey m, `f * v + (1 - f) * m`, clamped to [0, 255], as
   * torchvision's ColorJitter(contrast=j) (adjust_contrast). m is the mean over the image's
   * crop window (padding included) of torchvision's grey, 0.2989 R + 0.587 G + 0.114 B, for
   * 3-channel images, and of every value otherwise (default 0: off).
   */
  contrast?: number;
  /**
   * Saturation jitter j: a factor f drawn uniformly in [max(0, 1 - j), 1 + j] blends each
   * pixel with its own grey, `f * v + (1 - f) * grey`, clamped, as ColorJitter(saturation=j)
   * (adjust_saturation). 3-channel images only; others are left as they are (default 0: off).
   */
  saturation?: number;
  /**
   * Hue jitter h in [0, 0.5]: a shift drawn uniformly in [-h, h] turns of the hue wheel, in
   * HSV with value and saturation kept, as ColorJitter(hue=h) (adjust_hue). 3-channel images
   * only (default 0: off).
   */
  hue?: number;
}

/** {@linkcode AugmentOptions} with every default filled in, frozen: what a loader draws. */
export type AugmentSpec = Readonly<Required<AugmentOptions>>;

// Every key of AugmentOptions, checked by the compiler against the interface.
const AUGMENT_KEYS = Object.keys(
  {
    padding: true,
    flip: true,
    vflip: true,
    cutout: true,
    brightness: true,
    contrast: true,
    saturation: true,
    hue: true,
  } satisfies Record<keyof AugmentOptions, true>,
);

/**
 * No augmentation: every option off.
 *
 * @example
 * ```ts
 * import { AUGMENT_OFF, resolveAugment } from "./options.ts";
 * import assert from "node:assert";
 * assert.deepStrictEqual(resolveAugment({}, "augment"), AUGMENT_OFF);
 * ```
 */
export const AUGMENT_OFF: AugmentSpec = Object.freeze({
  padding: 0,
  flip: false,
  vflip: false,
  cutout: 0,
  brightness: 0,
  contrast: 0,
  saturation: 0,
  hue: 0,
});

/**
 * Checks augment options and fills in the defaults.
 *
 * @param options What the caller passed as its `augment` option.
 * @param action What the caller was doing, for "Cannot <action>: ...".
 * @returns The options with defaults filled in, frozen (a loader hands out this very object).
 * @throws {TypeError} When `options` is not an object, has a key outside
 * {@linkcode AugmentOptions} (with a did-you-mean), or a value of the wrong type.
 * @throws {RangeError} When a value is out of range, naming the option and the value.
 *
 * @example Defaults filled in; a bad value named
 * ```ts
 * import { resolveAugment } from "./options.ts";
 * import assert from "node:assert";
 *
 * const spec = resolveAugment({ padding: 4, flip: true }, "create DataLoader");
 * assert.deepStrictEqual(spec, {
 *   padding: 4, flip: true, vflip: false, cutout: 0, brightness: 0, contrast: 0,
 *   saturation: 0, hue: 0,
 * });
 * assert.ok(Object.isFrozen(spec));
 * assert.throws(
 *   () => resolveAugment({ cutout: -2 }, "create DataLoader"),
 *   /Cannot create DataLoader: augment\.cutout option should be an integer/,
 * );
 * ```
 */
export function resolveAugment(options: AugmentOptions, action: string): AugmentSpec {
  const fail = (key: string, message: string, type: "type" | "range" = "range"): never =>
    optionError(action, key ? `augment.${key}` : "augment", message, type);
  if (typeof options !== "object" || options === null) {
    fail("", "should be an object such as { padding: 4, flip: true }", "type");
  }
  refuseUnknownKeys(options, AUGMENT_KEYS, `${action} with augment`);
  const o = options;
  const padding = o.padding ?? 0;
  if (!Number.isInteger(padding) || padding < 0) {
    fail("padding", `should be a non-negative integer, got ${String(padding)}`);
  }
  const cutout = o.cutout ?? 0;
  if (!Number.isInteger(cutout) || cutout < 0 || cutout > 2 ** 31 - 1) {
    fail(
      "cutout",
      "should be an integer in 0..2147483647 (the square's side in pixels, 0: off), got " +
        String(cutout),
    );
  }
  const bool = (key: "flip" | "vflip"): boolean => {
    const v = o[key] ?? false;
    if (typeof v !== "boolean") fail(key, `should be a boolean value, got ${String(v)}`, "type");
    return v;
  };
  const jitter = (key: "brightness" | "contrast" | "saturation"): number => {
    const j = o[key] ?? 0;
    if (typeof j !== "number") {
      fail(key, `should be a number (a jitter j >= 0), got ${String(j)}`, "type");
    }
    if (!Number.isFinite(j) || j < 0) {
      fail(
        key,
        `should be a finite number >= 0 (factors drawn in [max(0, 1 - j), 1 + j]), got ${j}`,
      );
    }
    return j;
  };
  const hue = o.hue ?? 0;
  if (typeof hue !== "number") {
    fail("hue", `should be a number (a hue jitter h in [0, 0.5]), got ${String(hue)}`, "type");
  }
  if (!(hue >= 0 && hue <= 0.5)) {
    fail(
      "hue",
      `should be a number in [0, 0.5] (shifts drawn in [-h, h] turns, as ColorJitter), got ${hue}`,
    );
  }
  return Object.freeze({
    padding,
    flip: bool("flip"),
    vflip: bool("vflip"),
    cutout,
    brightness: jitter("brightness"),
    contrast: jitter("contrast"),
    saturation: jitter("saturation"),
    hue,
  });
}
