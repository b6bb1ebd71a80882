"""PyTorch side of bench/train.ts: one Fashion-MNIST epoch of the small CNN or the MLP on the CPU.

Same model, batch size, optimizer and data order rule (a shuffled epoch) as the pinstream run;
the whole data set is in memory as one float32 tensor before the clock starts, so only the
training step is timed. Prints one JSON line.

Usage: OPENBLAS_NUM_THREADS=1 python3 bench/train_torch.py --model cnn|mlp --threads 1|2
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
from torch import nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1, help="peak lr of the one-cycle schedule")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N samples only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    x = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    xs = (torch.from_numpy(x.astype(np.float32) / 255.0) - 0.2860) / 0.3530
    xs = xs.unsqueeze(1).contiguous()
    ys = torch.from_numpy(y.astype(np.int64))

    if args.model == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    else:
        model = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(3136, 10),
        )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    # The same schedule as pinstream's OneCycleLR (defaults: 30% warm-up, cos, momentum
    # cycled 0.95 -> 0.85 -> 0.95), stepped per batch over the one epoch.
    steps = (xs.shape[0] + args.batch_size - 1) // args.batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    n = xs.shape[0]
    perm = torch.randperm(n)
    model.train()
    t0 = time.perf_counter()
    correct = 0
    loss_sum = 0.0
    for i in range(0, n, args.batch_size):
        idx = perm[i: i + args.batch_size]
        xb, yb = xs[idx], ys[idx]
        out = model(xb)
        loss = loss_fn(out, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        # Accumulated without a per-step sync, like pinstream's device-side counters.
        loss_sum += loss.detach() * yb.shape[0]
        correct += (out.detach().argmax(1) == yb).sum()
    loss_sum = float(loss_sum)
    correct = int(correct)
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "torch": torch.__version__,
        "model": args.model,
        "threads": torch.get_num_threads(),
        "samples": n,
        "batch_size": args.batch_size,
        "seconds": seconds,
        "samples_per_s": n / seconds,
        "train_loss": loss_sum / n,
        "train_acc": correct / n,
    }))


if __name__ == "__main__":
    main()
