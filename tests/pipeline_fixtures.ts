/**
 * Fixtures of the pipeline suites: random CIFAR-shaped data in shared memory, a loader that
 * draws crop and flip parameters, what the plain loader yields for a seed, and the
 * independent TypeScript reference of a device batch.
 *
 * @module
 */

import { DataLoader, type DataLoaderOptions } from "../loader/data_loader.ts";
import { TensorDataset } from "../loader/datasets/tensor.ts";
import type { RingBatch } from "../loader/ring.ts";
import type { DeviceBatch } from "../pipeline/prefetcher.ts";
import { augmentHost } from "../augment/host.ts";
import type { NormalizeAffine } from "../augment/image.ts";
import { referenceAugment, rng } from "./_image_reference.ts";

/** CIFAR-10's per-channel mean, in [0, 1] units. */
export const MEAN = [0.4914, 0.4822, 0.4465];
/** CIFAR-10's per-channel std, in [0, 1] units. */
export const STD = [0.247, 0.2435, 0.2616];

/** uint8 images and labels in SharedArrayBuffers. */
export interface Data {
  images: Uint8Array;
  labels: Uint8Array;
  n: number;
  shape: [number, number, number];
}

/** `n` random images of `shape` and labels in 0..9, a pure function of `seed`. */
export function makeData(n: number, shape: [number, number, number], seed: number): Data {
  const r = rng(seed);
  const [a, b, c] = shape;
  const images = new Uint8Array(new SharedArrayBuffer(n * a * b * c));
  for (let i = 0; i < images.length; i++) images[i] = (r() * 256) | 0;
  const labels = new Uint8Array(new SharedArrayBuffer(n));
  for (let i = 0; i < n; i++) labels[i] = (r() * 10) | 0;
  return { images, labels, n, shape };
}

/**
 * A zero-copy loader over `d`: batches of 16, shuffled, crop padding 4 and flip,
 * `autoRelease: false`; `options` override.
 */
/** The batches of {@linkcode makeLoader}. */
export type ImageRingBatch = RingBatch<{ image: Uint8Array; label: Uint8Array }>;

export function makeLoader(
  d: Data,
  options: Omit<DataLoaderOptions, "collate"> = {},
): DataLoader<ImageRingBatch> {
  const ds = new TensorDataset({
    image: { data: d.images, shape: d.shape },
    label: { data: d.labels, shape: [] },
  });
  return new DataLoader<ImageRingBatch>(ds, {
    batchSize: 16,
    shuffle: true,
    seed: 1234,
    augment: { padding: 4, flip: true },
    autoRelease: false,
    ...options,
  });
}

/** What the plain loader yields for (seed, epoch): indices and params of every batch. */
export async function plainBatches(
  d: Data,
  options: DataLoaderOptions,
): Promise<{ indices: Int32Array; params: Int32Array | null }[]> {
  await using loader = makeLoader(d, { ...options, numWorkers: 0, autoRelease: true });
  const out = [];
  for await (const b of loader) {
    const rb = b as RingBatch;
    out.push({ indices: rb.indices.slice(), params: rb.augment?.slice() ?? null });
  }
  return out;
}

/** The reference batch for given sample indices and params (MEAN/STD normalization). */
export function expectedBatch(
  d: Data,
  indices: Int32Array,
  params: Int32Array | null,
  layout: "nchw" | "nhwc",
  dtype: "f16" | "f32",
  pad: number,
): { images: number[]; labels: number[] } {
  const per = d.shape[0] * d.shape[1] * d.shape[2];
  const src = new Uint8Array(indices.length * per);
  indices.forEach((s, k) => src.set(d.images.subarray(s * per, (s + 1) * per), k * per));
  const [c, h, w] = layout === "nchw" ? d.shape : [d.shape[2], d.shape[0], d.shape[1]];
  const images = referenceAugment({
    src,
    params,
    n: indices.length,
    c,
    h,
    w,
    pad,
    layout,
    mean: MEAN.slice(0, c),
    std: STD.slice(0, c),
    dtype,
  });
  return { images, labels: [...indices].map((s) => d.labels[s]) };
}

/** A device batch's images and labels as plain numbers. */
export async function readBatch(b: DeviceBatch): Promise<{ images: number[]; labels: number[] }> {
  const images = await b.images.toHost();
  const labels = await b.labels.toHost();
  return { images: [...images], labels: [...labels] };
}

/** Geometry and normalization of {@linkcode hostAugmented}. */
export interface HostAugmentGeometry {
  n: number;
  c: number;
  h: number;
  w: number;
  layout: "nhwc" | "nchw";
  pad: number;
  affine: NormalizeAffine;
}

/** `augmentHost` of a batch into a new f16 or f32 NCHW array. */
export function hostAugmented(
  src: Uint8Array,
  params: Int32Array | null,
  dtype: "f16" | "f32",
  g: HostAugmentGeometry,
): Float16Array | Float32Array {
  const count = g.n * g.c * g.h * g.w;
  const out = dtype === "f16" ? new Float16Array(count) : new Float32Array(count);
  augmentHost(src, params, out, {
    n: g.n,
    channels: g.c,
    height: g.h,
    width: g.w,
    layout: g.layout,
    pad: g.pad,
    affine: g.affine,
  });
  return out;
}
