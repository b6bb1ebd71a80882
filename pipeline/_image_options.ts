/**
 * The image path's option checks: the field names, the crop padding, the per-channel mean
 * and std, and the {@linkcode Geometry} a loader's ring gives the kernels.
 *
 * @module
 */

import type { RingField, StagingRing } from "../loader/ring.ts";
import type { GeometrySpec } from "../augment/geometry.ts";
import { type ImageLayout, imageShape } from "../augment/image.ts";

/** Where the image path finds its fields in a ring slot, and the size it makes. */
export interface Geometry {
  /** The channels, height and width of the images the augment kernel reads and writes. */
  c: number;
  h: number;
  w: number;
  imageField: RingField;
  labelField: RingField;
  augmentField: RingField | undefined;
  /**
   * The loader's geometry records and transforms: the images of `imageField` (each up to its
   * slot's size, its size in its record) are cropped, resized and rotated to h x w first.
   */
  transform: { field: RingField; spec: GeometrySpec } | undefined;
  /** Bytes of a slot that device mode copies: up to the end of the last needed field. */
  copyBytes: number;
}

/** A value as an error message shows it: strings quoted, so "1" and 1 differ. */
export function describe(v: unknown): string {
  return typeof v === "string" ? `the string ${JSON.stringify(v)}` : String(v);
}

export function fieldName(v: unknown, name: string): string {
  if (typeof v !== "string") {
    throw new TypeError(
      `Cannot create a DevicePrefetcher: ${name} must be a ring field name, got ${describe(v)}`,
    );
  }
  return v;
}

/**
 * The crop padding: the loader's, which its offsets were drawn for. An explicit `padding`
 * may only repeat it: any other value would crop with offsets that mean something else
 * (or, without parameters, promise a crop that never happens).
 */
export function cropPadding(
  requested: unknown,
  drawn: Readonly<{ padding: number }> | undefined,
): number {
  const action = "create a DevicePrefetcher";
  if (requested === undefined) return drawn?.padding ?? 0;
  if (typeof requested !== "number" || !Number.isInteger(requested) || requested < 0) {
    throw new RangeError(
      `Cannot ${action}: padding must be an integer >= 0, got ${describe(requested)}`,
    );
  }
  if (drawn === undefined && requested !== 0) {
    throw new RangeError(
      `Cannot ${action}: padding ${requested} contradicts the loader, which draws no crop ` +
        `offsets (no augment option), so nothing would be cropped; leave padding out, or ` +
        `build the loader with augment: { padding: ${requested} }`,
    );
  }
  if (drawn !== undefined && requested !== drawn.padding) {
    throw new RangeError(
      `Cannot ${action}: padding ${requested} contradicts the loader's augment.padding ` +
        `${drawn.padding}, which its crop offsets were drawn for; leave padding out`,
    );
  }
  return requested;
}

/** `mean` or `std` as one checked number per channel (`fill` for each when undefined). */
export function perChannel(
  v: ArrayLike<number> | undefined,
  name: "mean" | "std",
  channels: number,
  fill: number,
): number[] {
  const action = "create a DevicePrefetcher";
  if (v === undefined) return new Array(channels).fill(fill);
  if (v === null || typeof v !== "object" || typeof v.length !== "number") {
    throw new TypeError(
      `Cannot ${action}: ${name} must be an array of numbers, one per channel, got ${describe(v)}`,
    );
  }
  if (v.length !== channels) {
    throw new RangeError(
      `Cannot ${action}: ${name} has ${v.length} value${v.length === 1 ? "" : "s"}, the images ` +
        `have ${channels} channel${channels === 1 ? "" : "s"}; give one per channel`,
    );
  }
  const out: number[] = [];
  for (let c = 0; c < channels; c++) {
    const x: unknown = v[c];
    const need = name === "std" ? "a finite number > 0" : "a finite number";
    if (typeof x !== "number") {
      throw new TypeError(`Cannot ${action}: ${name}[${c}] is ${describe(x)}, need ${need}`);
    }
    // The kernels compute in fp32: the value must survive the rounding (1e-50 becomes 0).
    const f = Math.fround(x);
    if (!Number.isFinite(f) || (name === "std" && !(f > 0))) {
      const rounded = Number.isFinite(x) && f !== x ? ` (${f} in fp32)` : "";
      throw new RangeError(`Cannot ${action}: ${name}[${c}] is ${x}${rounded}, need ${need}`);
    }
    out.push(x);
  }
  return out;
}

export function oneOf<T extends string>(value: unknown, allowed: readonly T[], name: string): T {
  if (typeof value !== "string" || !(allowed as readonly string[]).includes(value)) {
    throw new RangeError(
      `Cannot create a DevicePrefetcher: ${name} must be one of ${allowed.join(", ")}, ` +
        `got ${String(value)}`,
    );
  }
  return value as T;
}

// Unsigned narrow types widen with zeros on the device; signed ones would differ between
// the device and host paths, so they are refused.
export const LABEL_BYTES: Record<string, number> = { u8: 1, u16: 2, i32: 4 };

export function geometry(
  ring: StagingRing,
  imageName: string,
  labelName: string,
  layout: ImageLayout,
  spec: GeometrySpec | undefined,
): Geometry {
  const action = "create a DevicePrefetcher";
  const has = (n: string) => ring.fields.some((f) => f.name === n);
  if (!has(imageName) || !has(labelName)) {
    throw new RangeError(
      `Cannot ${action}: the ring has fields ${ring.fields.map((f) => f.name).join(", ")}; ` +
        `need "${imageName}" and "${labelName}" (see the imageField/labelField options)`,
    );
  }
  const imageField = ring.field(imageName), labelField = ring.field(labelName);
  if (imageField.dtype !== "u8") {
    throw new RangeError(
      `Cannot ${action}: field "${imageName}" is ${imageField.dtype}, need u8 images`,
    );
  }
  let { c, h, w } = imageShape(imageField.sampleShape, layout, `${action}: field "${imageName}"`);
  if (LABEL_BYTES[labelField.dtype] === undefined || labelField.sampleShape.length !== 0) {
    throw new RangeError(
      `Cannot ${action}: field "${labelName}" is ${labelField.dtype} [${labelField.sampleShape}], ` +
        `need one integer label (u8, u16 or i32) per sample`,
    );
  }
  const augmentField = has("augment") ? ring.field("augment") : undefined;
  const transform = spec && has("geometry") ? { field: ring.field("geometry"), spec } : undefined;
  if (transform && imageName !== "image") {
    throw new RangeError(
      `Cannot ${action}: imageField "${imageName}" with the loader's geometry, whose records ` +
        `are of the field "image"`,
    );
  }
  if (transform) {
    if (c > 4) {
      throw new RangeError(
        `Cannot ${action}: field "${imageName}" has ${c} channels; the geometry kernel takes 1 to 4`,
      );
    }
    h = spec!.height, w = spec!.width;
  }
  const used = [
    imageField,
    labelField,
    ...(augmentField ? [augmentField] : []),
    ...(transform ? [transform.field] : []),
  ];
  const copyBytes = Math.max(...used.map((f) => f.byteOffset + f.byteLength));
  return { c, h, w, imageField, labelField, augmentField, transform, copyBytes };
}
