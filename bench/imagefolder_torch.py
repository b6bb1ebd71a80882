#!/usr/bin/env python3
"""PyTorch peer of bench/imagefolder.ts: torchvision.datasets.ImageFolder (Pillow decode,
libjpeg-turbo inside) with transforms.Compose([RandomResizedCrop(224),
RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet mean/std)]) and
torch.utils.data.DataLoader(batch_size=64, shuffle=True, num_workers=W), each batch cast to
float16 (the same output as pinstream's: normalized fp16). One intra-op thread. Prints one
JSON line per worker count: samples/s of each measured epoch after a warm-up epoch.

Usage: python3 bench/imagefolder_torch.py --data DIR --workers 0,1,2 [--epochs 1] [--batch 64]
"""
import argparse
import json
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torchvision  # noqa: E402
import torchvision.transforms as T  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=1, help="measured epochs after the warm-up one")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(a.data, transform=tf)
    for w in [int(x) for x in a.workers.split(",")]:
        torch.manual_seed(0)
        loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=w, persistent_workers=w > 0)
        rates = []
        for e in range(1 + a.epochs):
            t0 = time.perf_counter()
            n = 0
            for x, y in loader:
                x = x.half()
                n += x.shape[0]
            rate = n / (time.perf_counter() - t0)
            if e > 0:
                rates.append(rate)
        print(json.dumps({"impl": "torchvision", "workers": w, "epochs": rates,
                          "torch": torch.__version__, "torchvision": torchvision.__version__,
                          "pillow": __import__("PIL").__version__}), flush=True)
        del loader


if __name__ == "__main__":
    main()
