// bf16 batches for a bf16 model: the data path delivers f32 (the prefetcher and the image
// kernels have no bf16 output) and one cast on the device rounds each batch, as
// torch.autocast casts its inputs. Used by the fit loop and the doctor.

import { Tensor } from "../ffi/tensor.ts";
import { cast } from "../ops/elementwise.ts";

/** Casts f32 batches into a bf16 tensor it keeps (one per shape), or passes them through. */
export class Bf16Batches implements Disposable {
  #out: Tensor | null = null;

  /** @param enabled Whether the model computes in bf16 (false: batches pass unchanged). */
  constructor(readonly enabled: boolean) {}

  /**
   * The batch as the model reads it: `images` itself, or its bf16 rounding (valid until the
   * next call), queued on the device's current stream after the producer's work.
   */
  of(images: Tensor): Tensor {
    if (!this.enabled) return images;
    if (this.#out === null || this.#out.shape.join() !== images.shape.join()) {
      this.#out?.dispose();
      this.#out = Tensor.empty(images.device, [...images.shape], "bf16");
    }
    cast(images, this.#out);
    return this.#out;
  }

  /** Frees the bf16 tensor. */
  dispose(): void {
    this.#out?.dispose();
    this.#out = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
