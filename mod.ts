/**
 * pinstream keeps a GPU fed during training: a Web-Worker DataLoader that builds batches
 * straight into pinned shared memory, a side-stream prefetcher that copies them to the
 * device as bytes and augments them there in fp16, and a mixed-precision training stack.
 *
 * This module only re-exports; each piece is documented where it lives.
 *
 * @module
 */

// ffi

// loader
export {
  type AugmentOptions,
  BatchSampler,
  type BatchSamplerLike,
  type CollateFn,
  DataLoader,
  type DataLoaderOptions,
  type Dataset,
  defaultCollate,
  DistributedSampler,
  type EpochStats,
  getWorkerInfo,
  type ModuleRef,
  RandomSampler,
  RingBatch,
  type RingField,
  type SampleContext,
  type Sampler,
  SequentialSampler,
  type SharedField,
  StagingRing,
  SubsetRandomSampler,
  TensorDataset,
  WeightedRandomSampler,
  WorkerError,
  type WorkerInfo,
  type WorkerSpec,
} from "./loader/mod.ts";

// pipeline

// nn
