"""PyTorch side of bench/dist.ts: DistributedDataParallel over Gloo on the CPU, Fashion-MNIST
MLP or CNN, fp32 SGD, a fixed batch per rank, one intra-op thread per rank. Spawns the ranks
itself (torch.multiprocessing, MASTER_ADDR=127.0.0.1) and prints one JSON line from rank 0:
{"model": ..., "world": N, "msPerStep": ...}.

Usage: OPENBLAS_NUM_THREADS=1 python3 bench/dist_torch.py --model cnn --world 2 --steps 60
"""
import argparse
import gzip
import json
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

BATCH = 64


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def build(name):
    torch.manual_seed(0)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 10),
    )


def rank_main(rank, args, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    x = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    batches = []
    for k in range(min(args.steps, 50)):
        first = ((k * args.world + rank) * BATCH) % (len(x) - BATCH)
        xb = (torch.from_numpy(x[first:first + BATCH].astype(np.float32) / 255.0) - 0.286) / 0.353
        batches.append((xb.unsqueeze(1).contiguous(),
                        torch.from_numpy(y[first:first + BATCH].astype(np.int64))))
    model = nn.parallel.DistributedDataParallel(build(args.model))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(k):
        xb, yb = batches[k % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        opt.step()

    for k in range(5):
        step(k)
    dist.barrier()
    t0 = time.perf_counter()
    for k in range(args.steps):
        step(k)
    dist.barrier()
    ms = (time.perf_counter() - t0) * 1000 / args.steps
    if rank == 0:
        print(json.dumps({"model": args.model, "world": args.world, "msPerStep": ms,
                          "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
