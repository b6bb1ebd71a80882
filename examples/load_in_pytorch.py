"""Loads a pinstream checkpoint (safetensors) into the same model in PyTorch and evaluates it.

Shows that the weights file is plain safetensors with PyTorch's parameter names: it is parsed
here with the standard library and numpy only (the `safetensors` package would do the same:
`model.load_state_dict(safetensors.torch.load_file(path))`).

Usage (after `deno run -A examples/fashion_mnist.ts --model mlp --checkpoint /tmp/mlp.safetensors`):
    python3 examples/load_in_pytorch.py /tmp/mlp.safetensors --model mlp
"""
import argparse
import gzip
import json
import os
import struct

import numpy as np
import torch
from torch import nn

DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I32": np.int32,
          "I64": np.int64, "U8": np.uint8}


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        tensors[name] = torch.from_numpy(arr.copy())
    return tensors, metadata


def fashion_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 10),
    )


def read_idx(path):
    with gzip.open(path, "rb") as f:
        d = f.read()
    dims = [int.from_bytes(d[4 + 4 * i: 8 + 4 * i], "big") for i in range(d[3])]
    return np.frombuffer(d, np.uint8, offset=4 + 4 * d[3]).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    state, metadata = load_safetensors(args.checkpoint)
    model = fashion_model(args.model)
    model.load_state_dict(state, strict=True)
    model.eval()
    x = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"))
    xs = ((torch.from_numpy(x.astype(np.float32)) / 255 - 0.2860) / 0.3530).unsqueeze(1)
    with torch.no_grad():
        acc = (model(xs).argmax(1).numpy() == y).mean()
    print(f"metadata {metadata}; PyTorch float32 test accuracy with these weights: {acc:.4f}")


if __name__ == "__main__":
    main()
