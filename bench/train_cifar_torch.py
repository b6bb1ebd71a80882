"""PyTorch twin of examples/cifar.ts's network, for step-time comparisons on the same machine.

Same layers (three conv3x3-BN-ReLU stages with max pooling, bias-free convs, linear 2048->10,
logits x 0.125),
batch size, SGD (momentum 0.9, weight decay 5e-4) and mixed precision (autocast fp16 +
GradScaler on CUDA; float32 on the CPU), on generated CIFAR-shaped batches already on the
device, so only the training step is timed. Prints one JSON line with the mean step time.

With --compile, the stronger peer: the model under torch.compile(mode="reduce-overhead")
(Inductor's fused kernels, replayed as CUDA graphs) and SGD with fused=True where this
PyTorch has it (the update as a few multi-tensor kernels that read GradScaler's scale and
found-inf flag on the device). A PyTorch without torch.compile, or a compile that fails,
prints {"compile_error": ...} and exits with status 3.

Usage:
    python3 bench/train_cifar_torch.py --device cuda --steps 300
    python3 bench/train_cifar_torch.py --device cuda --steps 300 --compile
    OPENBLAS_NUM_THREADS=1 python3 bench/train_cifar_torch.py --device cpu --steps 20 --threads 2
Compare with: deno run -A examples/cifar.ts --synthetic --limit 38400 --epochs 1 --device cuda
(300 steps of 128; its epoch line gives samples/s and the input-wait share).
"""
import argparse
import contextlib
import json
import sys
import time

import torch
from torch import nn


def block(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class Scale(nn.Module):
    """pinstream's Scale: a fixed factor on the logits."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


def cifar_model():
    return nn.Sequential(
        *block(3, 32), *block(32, 32), nn.MaxPool2d(2),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
        *block(64, 128), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 10), Scale(0.125),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile(mode='reduce-overhead') and fused SGD")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
    model = cifar_model().to(dev)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    fused = False
    if args.compile:
        if not hasattr(torch, "compile"):
            print(json.dumps({"compile_error": f"torch {torch.__version__} has no torch.compile"}))
            sys.exit(3)
        model = torch.compile(model, mode="reduce-overhead")
        try:
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4,
                                  fused=cuda)
            fused = cuda
        except (TypeError, RuntimeError):
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scaler = torch.cuda.amp.GradScaler(enabled=cuda)
    loss_fn = nn.CrossEntropyLoss()
    n = 8
    xs = torch.randn(n, args.batch_size, 3, 32, 32, device=dev).to(memory_format=fmt)
    ys = torch.randint(0, 10, (n, args.batch_size), device=dev)
    loss_sum = torch.zeros((), device=dev)

    amp = (lambda: torch.autocast(device_type="cuda", dtype=torch.float16)) if cuda \
        else contextlib.nullcontext

    def step(i):
        nonlocal loss_sum
        with amp():
            out = model(xs[i % n])
            loss = loss_fn(out, ys[i % n])
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss_sum += loss.detach()

    # With --compile the first steps compile and record the graphs: warm-up, not timed.
    try:
        for i in range(args.warmup):
            step(i)
    except Exception as e:  # noqa: BLE001 - any compile failure means "no compiled twin"
        if not args.compile:
            raise
        print(json.dumps({"compile_error": f"{type(e).__name__}: {e}"[:2000]}))
        sys.exit(3)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "amp": cuda,
        "compile": "reduce-overhead" if args.compile else None,
        "fused_sgd": fused,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "step_ms": 1000 * seconds / args.steps,
        "samples_per_s": args.steps * args.batch_size / seconds,
        "mean_loss": float(loss_sum) / (args.steps + args.warmup),
    }))


if __name__ == "__main__":
    main()
