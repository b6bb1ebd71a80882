#!/usr/bin/env python3
"""PyTorch peer of bench/loader.ts: the standard torchvision CIFAR-10 training pipeline
(RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize) over the same
CIFAR-10 binary files, with torch.utils.data.DataLoader(batch_size=128, shuffle=True,
num_workers=W, persistent_workers=W>0). The dataset mirrors torchvision.datasets.CIFAR10
(HWC uint8 array, PIL image per sample) but reads the binary format. Prints one JSON line
per worker count: samples/s of each measured epoch after a warm-up epoch.

Usage: python3 bench/loader_torch.py --data DIR --workers 0,1,2 [--epochs 2] [--batch 128]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
import torchvision.transforms as T  # noqa: E402


class CIFAR10Bin(Dataset):
    def __init__(self, root, transform):
        recs = []
        for i in range(1, 6):
            raw = np.fromfile(os.path.join(root, f"data_batch_{i}.bin"), dtype=np.uint8)
            recs.append(raw.reshape(-1, 3073))
        recs = np.concatenate(recs)
        self.targets = recs[:, 0].astype(np.int64).tolist()
        # torchvision keeps HWC uint8 and makes a PIL image per sample.
        self.data = np.ascontiguousarray(recs[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        img = Image.fromarray(self.data[i])
        return self.transform(img), self.targets[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=2, help="measured epochs after the warm-up one")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup-batches", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    transform = T.Compose([
        T.RandomCrop(32, padding=4),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    ])
    ds = CIFAR10Bin(args.data, transform)
    for w in [int(x) for x in args.workers.split(",")]:
        g = torch.Generator()
        g.manual_seed(0)
        loader = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=w,
                            persistent_workers=w > 0, generator=g)
        # Warm-up: start workers and run a few batches (not a full epoch: it is slow).
        it = iter(loader)
        for _ in range(args.warmup_batches):
            next(it)
        del it
        rates = []
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            n = 0
            for x, y in loader:
                n += x.shape[0]
            rates.append(n / (time.perf_counter() - t0))
        print(json.dumps({"workers": w, "samplesPerSecond": rates, "torch": torch.__version__}),
              flush=True)
        del loader


if __name__ == "__main__":
    sys.exit(main())
