/**
 * Per-sample image augmentation: the options a loader draws from, the record it writes for
 * each sample, and the host reference of the fused kernel that applies it. Imports nothing
 * above the ground floor: the loader draws with it and the pipeline applies it.
 *
 * @module
 */

export { AUGMENT_OFF, type AugmentOptions, type AugmentSpec, resolveAugment } from "./options.ts";
export {
  AUGMENT_RECORD_LENGTH,
  augmentFromDraw,
  augmentRecord,
  sampleKey,
  writeAugmentRecords,
} from "./record.ts";
export {
  type ImageDtype,
  type ImageLayout,
  imageShape,
  MAX_CHANNELS,
  type NormalizeAffine,
  normalizeAffine,
} from "./image.ts";
export { augmentHost, type AugmentHostOptions } from "./host.ts";
export {
  GEOMETRY_FIRST_DRAW,
  GEOMETRY_RECORD_LENGTH,
  type GeometryCrop,
  type GeometryOptions,
  type GeometrySpec,
  resolveGeometry,
  writeGeometryRecord,
  writeGeometryRecords,
} from "./geometry.ts";
export { geometryHost, type GeometryHostOptions } from "./geometry_host.ts";
