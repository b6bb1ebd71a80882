#!/usr/bin/env python3
"""Pillow's own decode rate, one thread: every file named in LIST (one path a line) is read
into memory, then decoded in full to RGB (`Image.open(...).convert("RGB")`, what
torchvision's loader does per file). Prints {"imagesPerSecond": N} for a pass over the files
after a warm-up pass. The peer of bench/tj_decode.c for PNG files (and JPEGs).

Usage: python3 bench/pillow_decode.py LIST
"""
import io
import json
import sys
import time

from PIL import Image


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: pillow_decode.py LIST")
    with open(sys.argv[1]) as f:
        data = [open(p.strip(), "rb").read() for p in f if p.strip()]

    def one_pass():
        for d in data:
            Image.open(io.BytesIO(d)).convert("RGB").load()

    one_pass()
    t0 = time.perf_counter()
    one_pass()
    print(json.dumps({"imagesPerSecond": len(data) / (time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
