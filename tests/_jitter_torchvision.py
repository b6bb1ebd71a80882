# torchvision's side of tests/image_jitter_torchvision_test.ts: reads a batch of uint8 CHW
# images and their transforms as JSON on stdin, applies RandomCrop's padding and window, the
# flips, then ColorJitter's functional ops in pinstream's fixed order (adjust_contrast,
# adjust_brightness, adjust_saturation, adjust_hue) on float images in [0, 1], and writes the
# results as JSON lists on stdout.
import json
import sys

import torch
import torchvision.transforms.functional as F

torch.set_num_threads(1)
batch = json.load(sys.stdin)
c, h, w, pad = batch["c"], batch["h"], batch["w"], batch["pad"]
out = []
for image, t in zip(batch["images"], batch["transforms"]):
    img = torch.tensor(image, dtype=torch.uint8).reshape(c, h, w).float() / 255.0
    padded = torch.nn.functional.pad(img, [pad, pad, pad, pad])
    img = padded[:, t["dy"] : t["dy"] + h, t["dx"] : t["dx"] + w]
    if t["flip"]:
        img = torch.flip(img, dims=[-1])
    if t["vflip"]:
        img = torch.flip(img, dims=[-2])
    if t["contrast"] != 1:
        img = F.adjust_contrast(img, t["contrast"])
    if t["brightness"] != 1:
        img = F.adjust_brightness(img, t["brightness"])
    if c == 3 and t["saturation"] != 1:
        img = F.adjust_saturation(img, t["saturation"])
    if c == 3 and t["hue"] != 0:
        img = F.adjust_hue(img, t["hue"])
    out.append(img.reshape(-1).tolist())
json.dump(out, sys.stdout)
