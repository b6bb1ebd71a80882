/**
 * Mixed-precision training: fp16 layers with hand-written backward, cross-entropy with
 * device-side statistics, SGD on fp32 master weights, dynamic loss scaling, learning-rate
 * schedules, safetensors checkpoints. The loop that drives them (Trainer, the doctor, the
 * metrics log) is in train/, one floor up.
 *
 * @module
 */

export * from "./init.ts";
export * from "./module.ts";
export { BufferTensor, Parameter, type ParameterOptions, type Precision } from "./parameter.ts";
export * from "./layers.ts";
export * from "./scale.ts";
export * from "./loss.ts";
export * from "./optim.ts";
export * from "./grad_scaler.ts";
export * from "./lr_scheduler.ts";
export * from "./safetensors.ts";
export * from "./checkpoint.ts";
