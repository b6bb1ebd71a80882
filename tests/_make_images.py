"""Writes the image files the decoder tests read, and Pillow's pixels of each.

Usage: python3 tests/_make_images.py OUT_DIR

Every file is written with Pillow (or, for what Pillow cannot write, 16-bit RGB and
interlaced PNGs, by a small PNG writer here) from a deterministic pattern. manifest.json
lists each file with the size and channels Pillow decodes it to (EXIF orientation applied,
converted to RGB) and the name of a .rgb file holding those pixels. For 16-bit PNGs the
expected pixels are the high bytes of the samples written (Pillow clips 16-bit grey to 255
instead).
"""

import json
import os
import struct
import sys
import zlib

from PIL import Image, ImageOps

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
manifest = []


def pattern(w, h, seed=0):
    """An RGB image with gradients, edges and texture (exercises the IDCT and upsampling)."""
    px = bytearray()
    for y in range(h):
        for x in range(w):
            r = (x * 255 // max(1, w - 1) + seed) & 255
            g = (y * 255 // max(1, h - 1)) & 255
            b = ((x * 7 + y * 13 + (x * y) % 31) * 3 + seed) & 255
            if (x // 8 + y // 8) % 2 == 0:
                b = 255 - b
            px += bytes((r, g, b))
    return Image.frombytes("RGB", (w, h), bytes(px))


def record(name, kind, expected=None):
    path = os.path.join(out, name)
    if expected is None:
        im = Image.open(path)
        im = ImageOps.exif_transpose(im)
        expected = im.convert("RGB")
    raw = expected.tobytes() if isinstance(expected, Image.Image) else expected[2]
    w, h = expected.size if isinstance(expected, Image.Image) else expected[:2]
    with open(path + ".rgb", "wb") as f:
        f.write(raw)
    manifest.append({"file": name, "kind": kind, "width": w, "height": h})


def chunk(t, data):
    c = struct.pack(">I", len(data)) + t + data
    return c + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)


def write_png(path, w, h, bit_depth, color_type, rows, interlace=False):
    """rows(y) -> bytes of row y, samples packed big-endian."""
    spp = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    bpp = spp * bit_depth // 8
    raw = bytearray()
    if not interlace:
        for y in range(h):
            raw += b"\x00" + rows(y)
    else:
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
        for x0, y0, dx, dy in passes:
            if x0 >= w or y0 >= h:
                continue
            for y in range(y0, h, dy):
                r = rows(y)
                raw += b"\x01"  # Sub filter, to exercise unfiltering in a pass
                prev = bytes(bpp)
                for x in range(x0, w, dx):
                    px = r[x * bpp:(x + 1) * bpp]
                    raw += bytes((px[i] - prev[i]) & 255 for i in range(bpp))
                    prev = px
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b""))


# JPEG: sizes, subsampling, progressive, greyscale, CMYK, EXIF-rotated, restart markers.
for w, h, sub, q in [(500, 375, 2, 90), (37, 23, 2, 90), (64, 48, 0, 95), (123, 77, 1, 75)]:
    name = f"rgb_{w}x{h}_s{sub}_q{q}.jpg"
    pattern(w, h).save(os.path.join(out, name), quality=q, subsampling=sub)
    record(name, "jpeg")
pattern(200, 150, 5).save(os.path.join(out, "progressive.jpg"), quality=90, progressive=True)
record("progressive.jpg", "jpeg")
pattern(97, 61).convert("L").save(os.path.join(out, "grey.jpg"), quality=90)
record("grey.jpg", "jpeg-grey")
pattern(80, 60, 9).convert("CMYK").save(os.path.join(out, "cmyk.jpg"), quality=90)
record("cmyk.jpg", "jpeg-cmyk")
for o in (3, 6, 8):
    exif = Image.Exif()
    exif[0x0112] = o
    name = f"exif{o}.jpg"
    pattern(90, 50, o).save(os.path.join(out, name), quality=90, exif=exif)
    record(name, "jpeg-exif")

# PNG: RGB, RGBA, greyscale, palette with transparency, 4-bit palette, 1-bit, EXIF-rotated.
base = pattern(45, 31, 3)
base.save(os.path.join(out, "rgb.png"))
record("rgb.png", "png")
rgba = base.copy()
rgba.putalpha(Image.frombytes("L", base.size, bytes((i * 7) & 255 for i in range(45 * 31))))
rgba.save(os.path.join(out, "rgba.png"))
record("rgba.png", "png-alpha")
base.convert("L").save(os.path.join(out, "grey.png"))
record("grey.png", "png")
pal = base.convert("P", palette=Image.Palette.ADAPTIVE, colors=200)
pal.info["transparency"] = 3
pal.save(os.path.join(out, "palette.png"), transparency=3)
record("palette.png", "png-palette")
base.convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(os.path.join(out, "palette4.png"), bits=4)
record("palette4.png", "png-palette")
base.convert("1").save(os.path.join(out, "bilevel.png"))
record("bilevel.png", "png")
exif = Image.Exif()
exif[0x0112] = 6
base.save(os.path.join(out, "exif6.png"), exif=exif)
record("exif6.png", "png-exif")

# 16-bit PNGs (written here): the expected pixels are the high bytes.
W, H = 29, 17
def s16(x, y, k):
    return (x * 2311 + y * 977 + k * 13331 + (x * y * 37)) & 0xFFFF
write_png(os.path.join(out, "rgb16.png"), W, H, 16, 2,
          lambda y: b"".join(struct.pack(">HHH", *(s16(x, y, k) for k in range(3))) for x in range(W)))
record("rgb16.png", "png-16", (W, H, bytes(s16(x, y, k) >> 8 for y in range(H) for x in range(W) for k in range(3))))
write_png(os.path.join(out, "grey16.png"), W, H, 16, 0,
          lambda y: b"".join(struct.pack(">H", s16(x, y, 0)) for x in range(W)))
record("grey16.png", "png-16", (W, H, bytes(s16(x, y, 0) >> 8 for y in range(H) for x in range(W) for _ in range(3))))
# Interlaced (Adam7) RGB 8-bit, odd size.
iw, ih = 19, 13
ipx = pattern(iw, ih, 11)
ib = ipx.tobytes()
write_png(os.path.join(out, "interlaced.png"), iw, ih, 8, 2, lambda y: ib[y * iw * 3:(y + 1) * iw * 3], interlace=True)
record("interlaced.png", "png-interlaced", (iw, ih, ib))

# Pillow's bilinear resize (antialiased) of decoded images, for the host resize.
resized = []
for name, size in [("rgb_500x375_s2_q90.jpg", (160, 120)), ("rgb_500x375_s2_q90.jpg", (224, 224)),
                   ("rgb.png", (100, 70)), ("grey.jpg", (40, 33))]:
    im = Image.open(os.path.join(out, name)).convert("RGB").resize(size, Image.Resampling.BILINEAR)
    ref = f"{name}.{size[0]}x{size[1]}.rgb"
    with open(os.path.join(out, ref), "wb") as f:
        f.write(im.tobytes())
    resized.append({"file": name, "width": size[0], "height": size[1], "ref": ref})

with open(os.path.join(out, "resized.json"), "w") as f:
    json.dump(resized, f, indent=1)
with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
print(f"wrote {len(manifest)} images to {out}")
