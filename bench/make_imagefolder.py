#!/usr/bin/env python3
"""Writes an ImageNet-like folder of images for bench/imagefolder.ts: CLASSES class folders of
photo-like pictures (smooth gradients, shapes and texture noise, so JPEG sizes are realistic)
of random size around 500x375, as JPEG at quality 90 (default) or PNG.

Usage: python3 bench/make_imagefolder.py OUT_DIR [--count 2000] [--classes 10] [--png]
       [--seed 0]

The same arguments give the same files.
"""
import argparse
import os
import random

from PIL import Image, ImageDraw, ImageFilter


def picture(rnd, w, h):
    # A two-colour gradient background ...
    c0 = [rnd.randrange(256) for _ in range(3)]
    c1 = [rnd.randrange(256) for _ in range(3)]
    grad = Image.linear_gradient("L").resize((w, h)).rotate(rnd.uniform(0, 360), expand=False)
    bg = Image.composite(Image.new("RGB", (w, h), tuple(c0)), Image.new("RGB", (w, h), tuple(c1)), grad)
    # ... with shapes ...
    d = ImageDraw.Draw(bg)
    for _ in range(rnd.randrange(3, 9)):
        x0, y0 = rnd.randrange(w), rnd.randrange(h)
        x1, y1 = x0 + rnd.randrange(20, w // 2), y0 + rnd.randrange(20, h // 2)
        col = tuple(rnd.randrange(256) for _ in range(3))
        (d.ellipse if rnd.random() < 0.5 else d.rectangle)((x0, y0, x1, y1), fill=col)
    # ... and fine texture, as photographs have.
    noise = Image.effect_noise((w, h), rnd.uniform(10, 40)).convert("RGB")
    img = Image.blend(bg.filter(ImageFilter.GaussianBlur(rnd.uniform(0, 1.5))), noise, 0.3)
    return img


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--png", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    ext = "png" if a.png else "jpg"
    for i in range(a.count):
        c = i % a.classes
        d = os.path.join(a.out, f"class{c:03d}")
        os.makedirs(d, exist_ok=True)
        # ImageNet's typical sizes: 500 on the long side, 4:3 and 3:4 mostly.
        w, h = rnd.choice([(500, 375), (500, 333), (375, 500), (500, 400), (640, 480), (400, 300)])
        w += rnd.randrange(-40, 41)
        h += rnd.randrange(-30, 31)
        img = picture(rnd, w, h)
        path = os.path.join(d, f"{i:06d}.{ext}")
        if a.png:
            img.save(path, optimize=False)
        else:
            img.save(path, quality=90)
    print(f"wrote {a.count} {ext.upper()} files in {a.classes} classes to {a.out}")


if __name__ == "__main__":
    main()
