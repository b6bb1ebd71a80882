/**
 * The pinstream data loader: pure TypeScript, no FFI.
 *
 * @module
 */

export {
  type AugmentOptions,
  DataLoader,
  type DataLoaderOptions,
  type EpochStats,
  type ModuleRef,
  WorkerError,
} from "./data_loader.ts";
export {
  BatchSampler,
  type BatchSamplerLike,
  type BatchSamplerOptions,
  DistributedSampler,
  type DistributedSamplerOptions,
  RandomSampler,
  type RandomSamplerOptions,
  type Sampler,
  SequentialSampler,
  SubsetRandomSampler,
  type SubsetRandomSamplerOptions,
  WeightedRandomSampler,
  type WeightedRandomSamplerOptions,
} from "./sampler.ts";
export { type CollateFn, defaultCollate } from "./collate.ts";
export {
  type Dataset,
  type DType,
  dtypeOf,
  DTYPES,
  recordBytes,
  type SampleContext,
  sharedArray,
  type SharedField,
  type TypedArray,
  type WorkerSpec,
} from "./dataset.ts";
export { RingBatch, type RingField, ringLayout, StagingRing } from "./ring.ts";
export { getWorkerInfo, type WorkerInfo } from "./worker_info.ts";
export { TensorDataset, type TensorDatasetState, type TensorField } from "./datasets/tensor.ts";
