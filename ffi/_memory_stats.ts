/**
 * Internal: the bytes of device memory held by live DeviceBuffers, per device ("cuda:0"), and
 * their peak since the last reset: what Device.memoryAllocated / maxMemoryAllocated report
 * (PyTorch's torch.cuda.memory_allocated / max_memory_allocated). Kept here, not on a Device
 * object, because several Device objects may stand for one device. Pinned host memory
 * (HostBuffers) is counted beside it, per the device whose backend pinned it.
 *
 * @module
 */

/** Bytes in DeviceBuffers alive now, and the most alive at once since the last reset. */
export interface MemoryCounter {
  allocated: number;
  peak: number;
  /** Bytes of pinned host memory held by live HostBuffers (allocated or registered). */
  pinned: number;
  /** The most pinned bytes at once since the last reset. */
  pinnedPeak: number;
}

const COUNTERS = new Map<string, MemoryCounter>();

/**
 * The counter of a device.
 *
 * @param device The device's name ("cpu:0", "cuda:1").
 * @returns Its live counter (created at zero).
 */
export function memoryCounter(device: string): MemoryCounter {
  let c = COUNTERS.get(device);
  if (!c) {
    c = { allocated: 0, peak: 0, pinned: 0, pinnedPeak: 0 };
    COUNTERS.set(device, c);
  }
  return c;
}

/**
 * Counts an allocation (bytes > 0) or a free (bytes < 0) on a device.
 *
 * @param device The device's name.
 * @param bytes Bytes allocated (positive) or freed (negative).
 */
export function noteDeviceMemory(device: string, bytes: number): void {
  const c = memoryCounter(device);
  c.allocated += bytes;
  if (c.allocated > c.peak) c.peak = c.allocated;
}

/**
 * Counts host memory pinned (bytes > 0) or unpinned (bytes < 0) through a device's backend.
 *
 * @param device The device's name.
 * @param bytes Bytes pinned (positive) or unpinned (negative).
 */
export function notePinnedMemory(device: string, bytes: number): void {
  const c = memoryCounter(device);
  c.pinned += bytes;
  if (c.pinned > c.pinnedPeak) c.pinnedPeak = c.pinned;
}
