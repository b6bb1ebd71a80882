"""PyTorch side of bench/pipeline.ts: CIFAR-shaped batches, normalized and ready for a step.

Prints one JSON object on stdout: {"rows": [{"name", "samples", "seconds", "samples_per_s",
...}], "torch": version, "torchvision": version}. Run by bench/pipeline.ts; by hand:

    OPENBLAS_NUM_THREADS=1 python3 bench/pipeline_torch.py --mode cpu --samples 50000

Modes:
  cpu  (a) the standard torchvision pipeline: a Dataset over the uint8 HWC array returning
       PIL images (as torchvision.datasets.CIFAR10 does), RandomCrop(32, padding=4),
       RandomHorizontalFlip, ToTensor, Normalize; DataLoader(batch_size, shuffle=True,
       num_workers=workers). (b) its best vectorized form: the whole dataset as one uint8
       NCHW tensor, each batch gathered, padded, cropped and flipped with one advanced
       index, normalized with torch ops, float32 out, torch.set_num_threads(workers).
  cuda (a) the standard pipeline with pin_memory=True, persistent_workers=True and a
       side-stream prefetcher (non_blocking copies on a second stream, the compute stream
       waits on it), batches as float32 on the GPU; (b) the vectorized form with the uint8
       batch pinned, copied and augmented on the GPU (fp16 out); (c) the raw bound: the same
       uint8 bytes per batch copied from pinned memory with cudaMemcpyAsync back to back;
       (d) the resident form, pinstream's DeviceLoader peer: the whole set as one uint8 tensor
       on the GPU, each epoch's order drawn there, and per batch the index gather, crop, flip
       and normalize on the device (fp16 out, labels gathered too), eager and, where
       torch.compile works, compiled; (e) the streamed form that reuses its pinned buffers,
       pinstream's toDevice peer: a ring of pinned uint8 batches gathered into in place on
       the host, each copied on a side stream once the copy that last used its slot is done,
       augmented on the GPU (fp16 out), the compute stream waiting on the copy (the
       vectorized form (b) calls pin_memory() on every batch: a fresh pinned allocation each).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torchvision import transforms  # noqa: E402

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class ArrayCifar(Dataset):
    """torchvision.datasets.CIFAR10's __getitem__ over an in-memory N x 32 x 32 x 3 array."""

    def __init__(self, data, labels, transform):
        self.data, self.labels, self.transform = data, labels, transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        img = Image.fromarray(self.data[i])
        return self.transform(img), int(self.labels[i])


def make_data(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8),
            rng.integers(0, 10, size=n, dtype=np.int64))


def row(name, samples, seconds, **extra):
    return {"name": name, "samples": samples, "seconds": seconds,
            "samples_per_s": samples / seconds if seconds > 0 else 0.0, **extra}


def standard(data, labels, batch, workers, max_batches, device=None):
    tf = transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])
    cuda = device is not None
    loader = DataLoader(ArrayCifar(data, labels, tf), batch_size=batch, shuffle=True,
                        num_workers=workers, pin_memory=cuda,
                        persistent_workers=cuda and workers > 0)
    it = iter(loader)
    if cuda:
        it = SideStreamPrefetcher(it, device)
    next(it)  # worker start-up is not throughput
    if cuda:
        torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    for k, (x, y) in enumerate(it):
        n += x.shape[0]
        if k + 1 >= max_batches:
            break
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if not cuda:
        # Stop the worker processes now, so they do not compete with the next measurement.
        it._shutdown_workers()
    return n, seconds


class SideStreamPrefetcher:
    """The usual 'DataPrefetcher': the next batch is copied on a side stream while the
    current one is used; the compute stream waits on the copy (no host sync)."""

    def __init__(self, it, device):
        self.it, self.device = it, device
        self.stream = torch.cuda.Stream(device)
        self._preload()

    def _preload(self):
        try:
            x, y = next(self.it)
        except StopIteration:
            self.next_batch = None
            return
        with torch.cuda.stream(self.stream):
            self.next_batch = (x.to(self.device, non_blocking=True),
                               y.to(self.device, non_blocking=True))

    def __iter__(self):
        return self

    def __next__(self):
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        b = self.next_batch
        if b is None:
            raise StopIteration
        for t in b:
            t.record_stream(torch.cuda.current_stream(self.device))
        self._preload()
        return b


def vectorized(data_nchw, batch, max_batches, seed=0, device=None, half=False):
    n_all = data_nchw.shape[0]
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_all, generator=g)
    dev = device or torch.device("cpu")
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1)
    scale = 1.0 / (255.0 * std)
    bias = -mean / std
    ar = torch.arange(32, device=dev)
    ch = torch.arange(3, device=dev).view(1, 3, 1, 1)
    pinned = data_nchw.pin_memory() if device is not None else data_nchw
    n, count = 0, 0
    t0 = None
    for start in range(0, n_all, batch):
        if count == 1:
            if device is not None:
                torch.cuda.synchronize()
            t0 = time.perf_counter()  # the first batch warms up the allocator
        idx = perm[start:start + batch]
        b = idx.shape[0]
        x = pinned[idx]  # gather: b x 3 x 32 x 32 uint8
        if device is not None:
            x = x.pin_memory().to(device, non_blocking=True)
        dy = torch.randint(0, 9, (b,), generator=g).to(dev)
        dx = torch.randint(0, 9, (b,), generator=g).to(dev)
        flip = (torch.rand(b, generator=g) < 0.5).to(dev)
        # Crop and flip as one gather on the padded uint8 batch, flattened per sample: element
        # (c, y, x) reads c * 1600 + (dy + y) * 40 + dx + x (x reversed for flipped samples).
        # Earlier measurements found a gather per axis fastest among a 4-index advanced index,
        # torch.take and unfold + index; this one gather beat it by 24% (2026-11-23, a one-off
        # script timing both on 50,000 random CIFAR-shaped samples, batch 128, 2 threads:
        # 119,709 vs 96,625 samples/s; torch.equal on their outputs).
        x = torch.nn.functional.pad(x, (4, 4, 4, 4)).reshape(b, -1)
        cols = dx[:, None] + torch.where(flip[:, None], ar.flip(0), ar)
        rows = dy[:, None] + ar
        flat = (ch * 1600 + rows.view(b, 1, 32, 1) * 40 + cols.view(b, 1, 1, 32)).reshape(b, -1)
        x = torch.gather(x, 1, flat).view(b, 3, 32, 32)
        out = x.float().mul_(scale).add_(bias)
        if half:
            out = out.half()
        if count >= 1:
            n += b
        count += 1
        if count > max_batches:
            break
    if device is not None:
        torch.cuda.synchronize()
    return n, time.perf_counter() - t0


def _augment(x, labels_all, idx, dy, dx, flip, ar, ch, scale, bias):
    """Crop (4 px padding), flip and normalize a uint8 NCHW batch on its device, fp16 out;
    the same single gather as vectorized()."""
    b = x.shape[0]
    x = torch.nn.functional.pad(x, (4, 4, 4, 4)).reshape(b, -1)
    cols = dx[:, None] + torch.where(flip[:, None], ar.flip(0), ar)
    rows = dy[:, None] + ar
    flat = (ch * 1600 + rows.view(b, 1, 32, 1) * 40 + cols.view(b, 1, 1, 32)).reshape(b, -1)
    x = torch.gather(x, 1, flat).view(b, 3, 32, 32)
    return (x.float() * scale + bias).half(), labels_all if idx is None else labels_all[idx]


def _augment_constants(dev):
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1)
    return (torch.arange(32, device=dev), torch.arange(3, device=dev).view(1, 3, 1, 1),
            1.0 / (255.0 * std), -mean / std)


def resident(data_nchw, labels, batch, epochs, device, compiled=False):
    """The whole set resident on the GPU as uint8; everything per batch happens there. Full
    batches only (a compiled function keeps one shape). The first epoch warms up (and
    compiles); the best later epoch is timed."""
    data = data_nchw.to(device)
    labels_all = torch.from_numpy(labels).to(device)
    ar, ch, scale, bias = _augment_constants(device)

    def one(idx, dy, dx, flip):
        return _augment(data[idx], labels_all, idx, dy, dx, flip, ar, ch, scale, bias)

    fn = torch.compile(one, dynamic=False) if compiled else one
    n_all = data.shape[0]
    full = n_all // batch
    best = None
    for epoch in range(epochs + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        perm = torch.randperm(n_all, device=device)
        draws = torch.randint(0, 9, (2, full * batch), device=device)
        flips = torch.rand(full * batch, device=device) < 0.5
        out = None
        for k in range(full):
            sl = slice(k * batch, (k + 1) * batch)
            out = fn(perm[sl], draws[0, sl], draws[1, sl], flips[sl])
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        del out
        if epoch >= 1 and (best is None or seconds < best):
            best = seconds
    return full * batch, best


def streamed_reused(data_nchw, labels, batch, max_batches, device, slots=4):
    """A ring of pinned uint8 batches reused in place: gather on the host into the slot,
    copy it on a side stream once that slot's previous copy is done, augment on the GPU."""
    ar, ch, scale, bias = _augment_constants(device)
    labels_t = torch.from_numpy(labels).to(torch.int32)
    pinned = [torch.empty(batch, 3, 32, 32, dtype=torch.uint8).pin_memory() for _ in range(slots)]
    pinned_y = [torch.empty(batch, dtype=torch.int32).pin_memory() for _ in range(slots)]
    copied = [torch.cuda.Event() for _ in range(slots)]
    side = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)
    g = torch.Generator().manual_seed(0)
    n_all = data_nchw.shape[0]
    full = n_all // batch
    perm = torch.randperm(n_all, generator=g)
    n, t0 = 0, None
    for k in range(min(full, max_batches + 1)):
        if k == 1:
            torch.cuda.synchronize()
            t0 = time.perf_counter()  # the first batch warms up the allocator
        slot = k % slots
        copied[slot].synchronize()  # the copy that last read this slot is done
        idx = perm[k * batch:(k + 1) * batch]
        torch.index_select(data_nchw, 0, idx, out=pinned[slot])
        torch.index_select(labels_t, 0, idx, out=pinned_y[slot])
        with torch.cuda.stream(side):
            x = pinned[slot].to(device, non_blocking=True)
            y = pinned_y[slot].to(device, non_blocking=True)
            copied[slot].record(side)
        compute.wait_stream(side)
        x.record_stream(compute)
        y.record_stream(compute)
        dy = torch.randint(0, 9, (batch,), device=device)
        dx = torch.randint(0, 9, (batch,), device=device)
        flip = torch.rand(batch, device=device) < 0.5
        _augment(x, y, None, dy, dx, flip, ar, ch, scale, bias)  # labels arrive gathered
        if k >= 1:
            n += batch
    torch.cuda.synchronize()
    return n, time.perf_counter() - t0


def raw_copy_bound(batch, batches, device):
    src = torch.empty(batch * 3 * 32 * 32, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device=device)
    s = torch.cuda.Stream(device)
    with torch.cuda.stream(s):
        for _ in range(10):
            dst.copy_(src, non_blocking=True)
        s.synchronize()
        t0 = time.perf_counter()
        for _ in range(batches):
            dst.copy_(src, non_blocking=True)
        s.synchronize()
    return batch * batches, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--samples", type=int, default=50000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--standard-batches", type=int, default=60,
                    help="batches timed for the (slow) standard pipeline")
    ap.add_argument("--resident-epochs", type=int, default=3,
                    help="timed epochs of the resident forms (after one warm-up epoch)")
    args = ap.parse_args()
    torch.set_num_threads(args.workers)
    data, labels = make_data(args.samples)
    data_nchw = torch.from_numpy(np.ascontiguousarray(data.transpose(0, 3, 1, 2)))
    rows = []
    all_batches = (args.samples + args.batch - 1) // args.batch
    if args.mode == "cpu":
        # With 2 OpenMP threads on a 2-core machine, any other busy process makes torch's
        # threads spin at barriers: 2,000-3,600 samples/s under load against 90,000-136,000
        # on a quiet machine. The 1-thread row shows the form without that effect.
        # f32 (PyTorch's usual form) and fp16 (the dtype pinstream delivers), at both thread
        # counts: bench/pipeline.ts compares against the fastest of these four.
        n, s = vectorized(data_nchw, args.batch, all_batches)
        rows.append(row(f"torch vectorized (threads={args.workers}, f32)", n, s))
        n, s = vectorized(data_nchw, args.batch, all_batches, half=True)
        rows.append(row(f"torch vectorized (threads={args.workers}, f16)", n, s))
        torch.set_num_threads(1)
        n, s = vectorized(data_nchw, args.batch, all_batches)
        rows.append(row("torch vectorized (threads=1, f32)", n, s))
        n, s = vectorized(data_nchw, args.batch, all_batches, half=True)
        rows.append(row("torch vectorized (threads=1, f16)", n, s))
        torch.set_num_threads(args.workers)
        n, s = standard(data, labels, args.batch, args.workers, args.standard_batches)
        rows.append(row(f"torch standard (workers={args.workers}, f32)", n, s))
    else:
        if not torch.cuda.is_available():
            print(json.dumps({"skipped": "torch.cuda.is_available() is False"}))
            return
        dev = torch.device("cuda")
        n, s = standard(data, labels, args.batch, args.workers, args.standard_batches, dev)
        rows.append(row(f"torch standard + pin_memory + side stream (workers={args.workers})",
                        n, s))
        n, s = vectorized(data_nchw, args.batch, all_batches, device=dev, half=True)
        rows.append(row("torch vectorized on GPU (uint8 sent, fp16 out)", n, s))
        n, s = raw_copy_bound(args.batch, all_batches, dev)
        rows.append(row("raw pinned cudaMemcpyAsync bound (uint8 bytes)", n, s))
        n, s = streamed_reused(data_nchw, labels, args.batch, all_batches, dev)
        rows.append(row("torch streamed on GPU, pinned ring reused (uint8 sent, fp16 out)", n, s))
        n, s = resident(data_nchw, labels, args.batch, args.resident_epochs, dev)
        rows.append(row("torch resident on GPU (uint8 set, fp16 out)", n, s))
        try:
            n, s = resident(data_nchw, labels, args.batch, args.resident_epochs, dev,
                            compiled=True)
            rows.append(row("torch resident on GPU, torch.compile (uint8 set, fp16 out)", n, s))
        except Exception as e:  # noqa: BLE001 - any compile failure means "no compiled row"
            print(f"torch.compile of the resident form failed: {type(e).__name__}: {e}",
                  file=sys.stderr)
    print(json.dumps({"rows": rows, "torch": torch.__version__,
                      "torchvision": torchvision.__version__}))


if __name__ == "__main__":
    sys.exit(main())
