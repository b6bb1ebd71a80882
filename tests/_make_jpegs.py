"""Writes the JPEG files the TypeScript JPEG decoder's tests compare with libjpeg-turbo.

Usage: python3 tests/_make_jpegs.py OUT_DIR

Pillow files: odd and even sizes (1x1 to 500x375), 4:4:4 / 4:2:2 / 4:2:0, baseline and
progressive, quality 10 to 100, greyscale and CMYK (Adobe, inverted). cjpeg files (when
cjpeg is installed): every sampling factor cjpeg takes (1x1, 2x1, 1x2, 2x2, 4x1, 1x4, 4x2,
and components of different factors), progressive, restart intervals (every row, every 3
blocks, also progressive), optimized Huffman tables, RGB (Adobe transform 0) and an
arithmetic-coded file (which the TypeScript decoder refuses). YCCK through libturbojpeg
(TurboJPEG writes CMYK pixels as YCCK) when it loads. names.txt lists the files to compare.
"""

import ctypes
import os
import random
import shutil
import subprocess
import sys

from PIL import Image, ImageFile

# Pillow writes small progressive files in one buffer; the default is too small for 1x1.
ImageFile.MAXBLOCK = 1 << 22

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = random.Random(7)
names = []


def pattern(w, h, seed=0):
    """Gradients, 8x8 checks and noise: every DCT frequency and the upsampling edges."""
    px = bytearray()
    for y in range(h):
        for x in range(w):
            r = (x * 255 // max(1, w - 1) + seed) & 255
            g = (y * 255 // max(1, h - 1)) & 255
            b = ((x * 7 + y * 13 + (x * y) % 31) * 3 + seed + rng.randrange(40)) & 255
            if (x // 8 + y // 8) % 2 == 0:
                b = 255 - b
            px += bytes((r, g, b))
    return Image.frombytes("RGB", (w, h), bytes(px))


def add(name):
    names.append(name)
    return os.path.join(out, name)


SIZES = [(1, 1), (2, 2), (17, 9), (9, 17), (33, 31), (101, 7), (500, 375)]
for i, (w, h) in enumerate(SIZES):
    im = pattern(w, h, i)
    for sub in (0, 1, 2):
        for q in (10, 50, 90, 100) if (w, h) != (500, 375) else (90,):
            for prog in (False, True):
                im.save(add(f"pil_{w}x{h}_s{sub}_q{q}_{'p' if prog else 'b'}.jpg"),
                        quality=q, subsampling=sub, progressive=prog)
    im.convert("L").save(add(f"pil_{w}x{h}_grey.jpg"), quality=80)
    im.convert("L").save(add(f"pil_{w}x{h}_grey_p.jpg"), quality=80, progressive=True)
    im.convert("CMYK").save(add(f"pil_{w}x{h}_cmyk.jpg"), quality=85)

cjpeg = shutil.which("cjpeg")
if cjpeg:
    for i, (w, h) in enumerate([(1, 1), (17, 9), (33, 31), (101, 7), (64, 48)]):
        ppm = os.path.join(out, f"src_{w}x{h}.ppm")
        pattern(w, h, 20 + i).save(ppm)
        for samp in ("1x1", "2x1", "1x2", "2x2", "4x1", "1x4", "4x2", "2x1,1x2,1x1", "2x2,1x2,2x1"):
            for args, tag in (([], "b"), (["-progressive"], "p"), (["-restart", "1"], "r1"),
                              (["-restart", "3B", "-progressive"], "r3p"), (["-optimize"], "o")):
                name = f"cj_{w}x{h}_{samp.replace(',', '_')}_{tag}.jpg"
                subprocess.run([cjpeg, "-quality", "75", "-sample", samp, *args,
                                "-outfile", add(name), ppm], check=True)
        subprocess.run([cjpeg, "-grayscale", "-restart", "2", "-outfile", add(f"cj_{w}x{h}_grey_r2.jpg"),
                        ppm], check=True)
        subprocess.run([cjpeg, "-rgb", "-outfile", add(f"cj_{w}x{h}_rgb.jpg"), ppm], check=True)
        os.remove(ppm)
    ppm = os.path.join(out, "src.ppm")
    pattern(40, 24).save(ppm)
    subprocess.run([cjpeg, "-arithmetic", "-outfile", os.path.join(out, "arithmetic.jpg"), ppm], check=True)
    os.remove(ppm)

# YCCK: TurboJPEG compresses CMYK pixels as YCCK (Adobe transform 2).
try:
    tj = ctypes.CDLL("libturbojpeg.so.0")
except OSError:
    tj = None
if tj is not None:
    tj.tjInitCompress.restype = ctypes.c_void_p
    tj.tjCompress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_ulong),
                               ctypes.c_int, ctypes.c_int, ctypes.c_int]
    tj.tjFree.argtypes = [ctypes.c_void_p]
    tj.tjDestroy.argtypes = [ctypes.c_void_p]
    handle = tj.tjInitCompress()
    for w, h, samp in ((37, 23, 2), (64, 48, 0)):
        cmyk = pattern(w, h, 3).convert("CMYK").tobytes()
        buf, size = ctypes.c_void_p(), ctypes.c_ulong(0)
        # TJPF_CMYK = 11; TJSAMP_444 = 0, TJSAMP_420 = 2.
        if tj.tjCompress2(handle, cmyk, w, 0, h, 11, ctypes.byref(buf), ctypes.byref(size), samp, 85, 0) == 0:
            with open(add(f"tj_{w}x{h}_ycck.jpg"), "wb") as f:
                f.write(ctypes.string_at(buf, size.value))
            tj.tjFree(buf)
    tj.tjDestroy(handle)

with open(os.path.join(out, "names.txt"), "w") as f:
    f.write("\n".join(names) + "\n")
