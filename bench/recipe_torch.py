"""PyTorch twin of the CIFAR example's recipe on the generated shapes set, to tell a recipe
problem from a kernel problem (docs/recipe.md): the same net as bench/train_cifar_torch.py
without its logit scale unless --logit-scale is given, OneCycleLR (momentum cycled, as the
example), SGD momentum 0.9 and weight decay 5e-4, batch 64, crop 4 + flip (one crop per batch),
fp32 on the CPU. Prints each epoch's training loss and training accuracy.

The data: the first 4,000 training images of the example's generated set (seed 1), written by

    deno eval 'import { generateShapes } from "./examples/_shapes.ts";
      const s = generateShapes(4000, 1); Deno.mkdirSync("bench/out", { recursive: true });
      Deno.writeFileSync("bench/out/shapes_x.bin", s.images);
      Deno.writeFileSync("bench/out/shapes_y.bin", new Uint8Array(new Int32Array(s.labels).buffer));'

Usage:
    OPENBLAS_NUM_THREADS=1 python3 bench/recipe_torch.py --lr 0.05 --seed 0 [--zero-head]
        [--label-smoothing 0.1] [--logit-scale 0.125] [--verbose]
"""
import argparse

import numpy as np
import torch
from torch import nn


def block(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--zero-head", action="store_true")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--logit-scale", type=float, default=1.0)
    ap.add_argument("--verbose", action="store_true", help="every 5th step of epoch 1")
    ap.add_argument("--data", default="bench/out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    x = np.fromfile(f"{args.data}/shapes_x.bin", dtype=np.uint8).reshape(-1, 3, 32, 32)
    y = np.fromfile(f"{args.data}/shapes_y.bin", dtype=np.int32)
    n = len(y)
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)
    xs = (torch.from_numpy(x).float() / 255 - mean) / std
    ys = torch.from_numpy(y).long()
    m = nn.Sequential(
        *block(3, 32), *block(32, 32), nn.MaxPool2d(2),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
        *block(64, 128), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2048, 10),
    )
    if args.zero_head:
        nn.init.zeros_(m[-1].weight)
        nn.init.zeros_(m[-1].bias)
    bs = 64
    steps = (n + bs - 1) // bs
    opt = torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sch = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * steps)
    for ep in range(args.epochs):
        perm = torch.randperm(n)
        total = correct = seen = 0
        for i in range(steps):
            idx = perm[i * bs:(i + 1) * bs]
            xb = nn.functional.pad(xs[idx], (4, 4, 4, 4))
            dy, dx = np.random.randint(0, 9, 2)
            xb = xb[:, :, dy:dy + 32, dx:dx + 32]
            if np.random.rand() < 0.5:
                xb = xb.flip(3)
            out = m(xb) * args.logit_scale
            loss = nn.functional.cross_entropy(out, ys[idx], label_smoothing=args.label_smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sch.step()
            total += loss.item() * len(idx)
            correct += (out.argmax(1) == ys[idx]).sum().item()
            seen += len(idx)
            if args.verbose and ep == 0 and i % 5 == 0:
                head = m[-1].weight
                print(f"  step {i} lr {sch.get_last_lr()[0]:.4f} loss {loss.item():.3f} "
                      f"|logits| max {out.abs().max().item():.1f} head grad norm "
                      f"{head.grad.norm().item():.2f} head weight norm {head.norm().item():.2f} "
                      f"predictions {torch.bincount(out.argmax(1), minlength=10).tolist()}",
                      flush=True)
        print(f"epoch {ep + 1} train loss {total / seen:.4f} train accuracy {correct / seen:.3f}",
              flush=True)


if __name__ == "__main__":
    main()
