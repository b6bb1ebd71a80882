/**
 * pinstream keeps a GPU fed during training: a worker-thread DataLoader that builds batches
 * straight into pinned shared memory, a side-stream prefetcher that copies them to the
 * device as bytes and augments them there in fp16, and a mixed-precision training stack.
 *
 * This module only re-exports; each piece is documented where it lives.
 *
 * @module
 */

// ffi
export { Device } from "./ffi/device.ts";
export type {
  DeviceKind,
  DeviceOpenOptions,
  DeviceProps,
  LiveObjects,
  MemInfo,
} from "./ffi/device.ts";
export { Event, Stream } from "./ffi/stream.ts";
export { captureRefused, CudaGraph } from "./ffi/graph.ts";
export type { EventOptions, StreamOptions } from "./ffi/stream.ts";
export { DeviceBuffer, HostBuffer, isPinnedMemory } from "./ffi/memory.ts";
export type { CopyOptions, FillOptions, HostMemory } from "./ffi/memory.ts";
export { DTYPE_BYTES, Tensor } from "./ffi/tensor.ts";
export type { DType, HostArray, ToHostOptions } from "./ffi/tensor.ts";
export { PinstreamError } from "./internal/errors.ts";
export { MemoryResource, Resource } from "./ffi/resource.ts";
export type { PinstreamErrorCode } from "./internal/errors.ts";
export { LibraryError, loadLibrary } from "./ffi/library.ts";
export { PermissionError } from "./internal/permissions.ts";
export { activeProfiler, Profiler, range, span } from "./ffi/profiler.ts";
export type { ChromeTrace, ProfilerOptions, ProfileRow, RangeOptions } from "./ffi/profiler.ts";
export { gpuLine, GpuSampler, Nvml, openNvml } from "./ffi/nvml.ts";
export type { GpuSample, GpuSamplerOptions, GpuStat, GpuSummary, NvmlOptions } from "./ffi/nvml.ts";
export { decodeJpegsOnDevice, NVJPEG_LIB_ENV, NvjpegDecoder, openNvjpeg } from "./ffi/nvjpeg.ts";
export type { JpegInput, NvjpegDecodeOptions, NvjpegOptions } from "./ffi/nvjpeg.ts";
export { decodeJpegBatches } from "./pipeline/jpeg_device.ts";
export type {
  DecodeJpegBatchesOptions,
  DeviceJpegBatch,
  JpegBatch,
} from "./pipeline/jpeg_device.ts";
export type { OpCounts, OpKind } from "./internal/op_count.ts";
export type { Backend, Library, LibraryFailure } from "./ffi/library.ts";
export { ABI_VERSION, signatures, symbols } from "./ffi/symbols.ts";
export type { Foreign, Param, ParamTypes, Signature } from "./ffi/symbols.ts";

// ops
export { backendOf, KERNELS, NativeBackend, useBackend } from "./ops/backend.ts";
export type {
  ArgValue,
  KernelArgs,
  KernelBackend,
  KernelEntries,
  KernelEntry,
  KernelName,
  MemoryAt,
  Operand,
  OpOptions,
  ParamsOf,
  RawMemory,
} from "./ops/backend.ts";
export { arange, fillInPlace, full, ones, rand, randn, zeros } from "./ops/fill.ts";
export type {
  ArangeOptions,
  FillInPlaceOptions,
  RandnOptions,
  RandOptions,
  TensorFillOptions,
} from "./ops/fill.ts";
export { imageAugment, imageGeometry, imageLabelsI32 } from "./ops/image.ts";
export type {
  ImageAugmentOptions,
  ImageGeometryOptions,
  ImageLabelsOptions,
  ImageOpOptions,
} from "./ops/image.ts";
export { gatherRows } from "./ops/gather.ts";
export type { GatherRowsOptions } from "./ops/gather.ts";
export { add, cat, catBackward, mul, mulBackward, stack, stackBackward } from "./ops/combine.ts";
export type { ConcatOptions, MulBackwardOptions } from "./ops/combine.ts";

// augment
export {
  AUGMENT_RECORD_LENGTH,
  augmentFromDraw,
  augmentHost,
  type AugmentHostOptions,
  type AugmentOptions,
  augmentRecord,
  type AugmentSpec,
  type ImageDtype,
  type ImageLayout,
  imageShape,
  type NormalizeAffine,
  normalizeAffine,
} from "./augment/mod.ts";
export {
  GEOMETRY_RECORD_LENGTH,
  type GeometryCrop,
  geometryHost,
  type GeometryHostOptions,
  type GeometryOptions,
  type GeometrySpec,
  resolveGeometry,
  writeGeometryRecord,
  writeGeometryRecords,
} from "./augment/mod.ts";

// loader
export {
  type BatchOf,
  BatchSampler,
  type BatchSamplerLike,
  CIFAR10,
  type CIFAR10Options,
  type Collated,
  type CollateFn,
  ConcatDataset,
  DataLoader,
  type DataLoaderConstructor,
  DataLoaderImpl,
  type DataLoaderOptions,
  type Dataset,
  defaultCollate,
  DistributedSampler,
  downloadCIFAR10,
  type DTypeOf,
  EpochOrder,
  type EpochOrderOptions,
  type EpochStats,
  FASHION_MNIST_MD5,
  FASHION_MNIST_MIRRORS,
  FashionMNIST,
  type FieldArray,
  type FieldArrays,
  type FieldDType,
  type FilledField,
  getWorkerInfo,
  IMAGE_EXTENSIONS,
  ImageFileList,
  type ImageFileListCsvOptions,
  type ImageFileListOptions,
  ImageFiles,
  type ImageFilesOptions,
  type ImageFilesState,
  ImageFolder,
  type ImageFolderOptions,
  type ImageSample,
  LabeledImages,
  type LabeledImagesState,
  MNIST,
  MNIST_MD5,
  MNIST_MIRRORS,
  type MNISTOptions,
  type ModuleRef,
  type OnError,
  type PathTable,
  type RandomResizedCrop,
  randomResizedCropBox,
  RandomSampler,
  randomSplit,
  type RandomSplitOptions,
  type RecordMap,
  RingBatch,
  type RingField,
  type SampleContext,
  type SampleOf,
  type Sampler,
  SequentialSampler,
  sharedArray,
  type SharedField,
  type SharedFieldsOf,
  SKIP_SAMPLE,
  StagingRing,
  Subset,
  SubsetRandomSampler,
  TensorDataset,
  type TensorField,
  type TensorSample,
  type TensorSharedField,
  type TypedArray,
  WeightedRandomSampler,
  WorkerError,
  type WorkerInfo,
  type WorkerSpec,
} from "./loader/mod.ts";

// decode: image decoders (libjpeg-turbo and libspng through FFI, loaded on first use, or TypeScript)
export {
  type Channels,
  type CropBox,
  cropImage,
  type DecodedImage,
  type DecoderBackend,
  type DecodeTarget,
  DEFAULT_MAX_PIXELS,
  encodeJpeg,
  ImageDecodeError,
  ImageDecoder,
  type ImageDecoderOptions,
  type ImageType,
  resizeBilinear,
  sniffImageType,
} from "./decode/mod.ts";

// pipeline
export {
  type DeviceBatch,
  DevicePrefetcher,
  type ImagePathOptions,
  type PipelineStats,
  toDevice,
  type ToDeviceBatch,
  type ToDeviceOptions,
  type ToDeviceResult,
} from "./pipeline/prefetcher.ts";
export {
  BatchPrefetcher,
  type BatchPrefetcherOptions,
  type OnDevice,
} from "./pipeline/batch_prefetcher.ts";
export { DeviceDataset, DeviceLoader } from "./pipeline/resident.ts";
export type { DeviceDatasetOptions, DeviceLoaderOptions } from "./pipeline/resident.ts";

// nn
export {
  type BackwardOptions,
  BatchNorm2d,
  type BatchNorm2dOptions,
  BufferTensor,
  type CheckpointParts,
  type CheckpointProgress,
  Conv2d,
  type Conv2dOptions,
  CosineAnnealingLR,
  type CosineAnnealingLROptions,
  CrossEntropyLoss,
  decodeSafetensors,
  defaultInitRng,
  encodeSafetensors,
  type ExtraStateLoad,
  Flatten,
  type GradReadyHook,
  GradScaler,
  type GradScalerOptions,
  type GradScalerState,
  type GradScalerStepOptions,
  type HostData,
  type HostTensor,
  kaimingUniform,
  Linear,
  LinearLR,
  type LinearLROptions,
  type LinearOptions,
  loadCheckpoint,
  type LoadStateDictOptions,
  type LossStats,
  LRScheduler,
  type LRSchedulerState,
  MaxPool2d,
  type MaxPool2dOptions,
  Module,
  type ModuleToOptions,
  OneCycleLR,
  type OneCycleLROptions,
  Parameter,
  type ParameterOptions,
  type Precision,
  ReLU,
  type RngState,
  type SafetensorsContents,
  type SafetensorsDtype,
  saveCheckpoint,
  Scale,
  type ScheduledOptimizer,
  Sequential,
  SGD,
  type SGDOptions,
  type SGDState,
  type SGDStepOptions,
  statePathFor,
  StepLR,
  type StepLROptions,
  uniform,
  Xoshiro128,
} from "./nn/mod.ts";
export {
  type CopyEntry,
  type SgdEntry,
  TensorList,
  type TensorListKind,
} from "./ops/tensor_list.ts";

// train
export {
  diagnose,
  type DoctorOptions,
  type DoctorReport,
  type DoctorRun,
  doctorVerdict,
  MetricsLog,
  type MetricsLogOptions,
  type MetricsRecord,
  TensorBoardWriter,
  type TensorBoardWriterOptions,
  Trainer,
  type TrainerOptions,
} from "./train/mod.ts";

// dist
export {
  type BroadcastOptions,
  type CollectiveBuffer,
  type CollectiveOp,
  DEFAULT_TIMEOUT_MS,
  ProcessGroup,
  type ProcessGroupOptions,
  type ReduceOp,
  type ReduceOptions,
} from "./dist/process_group.ts";
export { Work } from "./dist/work.ts";
export { type LaunchEnv, launchEnv, type MpiFlavor } from "./dist/launch_env.ts";
export { availableMpi, mpirunCommand, type MpirunOptions } from "./dist/launcher.ts";
export { DataParallel, type DataParallelOptions } from "./dist/data_parallel.ts";
export { SyncBatchNorm } from "./dist/sync_batch_norm.ts";
