/**
 * The pinstream data loader: pure TypeScript, no FFI.
 *
 * @module
 */

export {
  type AugmentOptions,
  type BatchOf,
  DataLoader,
  type DataLoaderConstructor,
  DataLoaderImpl,
  type DataLoaderOptions,
  type EpochStats,
  type ModuleRef,
  WorkerError,
} from "./data_loader.ts";
export { EpochOrder, type EpochOrderOptions } from "./order.ts";
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
export { type Collated, type CollateFn, defaultCollate } from "./collate.ts";
export {
  type Dataset,
  type DTypeOf,
  dtypeOf,
  DTYPES,
  type FieldArray,
  type FieldArrays,
  type FieldDType,
  type FilledField,
  recordBytes,
  type RecordMap,
  type SampleContext,
  type SampleOf,
  sharedArray,
  type SharedField,
  type SharedFieldsOf,
  SKIP_SAMPLE,
  type TypedArray,
  type TypedArrayCtor,
  type WorkerSpec,
} from "./dataset.ts";
export { RingBatch, type RingField, ringLayout, StagingRing } from "./ring.ts";
export { getWorkerInfo, type WorkerInfo } from "./worker_info.ts";
export {
  TensorDataset,
  type TensorDatasetState,
  type TensorField,
  type TensorSample,
  type TensorSharedField,
} from "./datasets/tensor.ts";
export {
  ConcatDataset,
  type ConcatDatasetState,
  randomSplit,
  type RandomSplitOptions,
  Subset,
  type SubsetState,
} from "./datasets/subset.ts";
export {
  CIFAR10,
  CIFAR10_MD5,
  CIFAR10_URL,
  type CIFAR10Options,
  type CIFAR10State,
  downloadCIFAR10,
} from "./datasets/cifar10.ts";
export {
  FASHION_MNIST_DEBIAN_ROOT,
  FASHION_MNIST_MD5,
  FASHION_MNIST_MIRRORS,
  FashionMNIST,
  type IdxFile,
  MNIST,
  MNIST_MD5,
  MNIST_MIRRORS,
  type MNISTOptions,
  type MNISTState,
  parseIdx,
} from "./datasets/mnist.ts";
export { LabeledImages, type LabeledImagesState } from "./datasets/labeled_images.ts";
export {
  ImageFileList,
  type ImageFileListCsvOptions,
  type ImageFileListOptions,
  ImageFiles,
  type ImageFilesOptions,
  type ImageFilesState,
  type ImageSample,
  type OnError,
  type PathTable,
  type RandomResizedCrop,
  randomResizedCropBox,
} from "./datasets/image_files.ts";
export { IMAGE_EXTENSIONS, ImageFolder, type ImageFolderOptions } from "./datasets/image_folder.ts";
