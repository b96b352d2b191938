"""``python -m bench.pil_inputs``: what preparing PIL images without a PNG round trip saves.

The Python API used to encode a ``PIL.Image`` (or an array) as a lossless PNG and decode it
again before preparing it; it now prepares the image's pixels directly
(`Pictures.prepare_image`), to the same pixels. This times, on one thread, per picture:

* ``png_round_trip``: the old path, ``Pictures.prepare(png_bytes(img))``;
* ``direct``: the new one, ``Pictures.prepare_image(stored_image(img))`` (the snapshot copy
  included), and the pixel id (``pixels_id``) the new path computes instead of hashing the PNG;

for a sample photo at 640 x 480 (RGB and RGBA) and 224 x 224, and 640 x 480 noise (the PNG's
worst case), and checks both give the same pixels.
Paired rounds, medians; the ratio is old / new. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from headscope.python.inputs import pixels_id, png_bytes, stored_image
from headscope.serving.pictures import Pictures

from .common import paired, summary

SAMPLES = Path(__file__).resolve().parents[1] / "static" / "samples"


def _picture(w: int, h: int, mode: str, kind: str) -> Image.Image:
    if kind == "noise":  # the PNG's worst case: its filters find nothing to shorten
        a = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
        return Image.fromarray(a).convert(mode)
    photo = Image.open(SAMPLES / "coffee.png").convert("RGB")  # a photo
    return photo.resize((w, h), Image.Resampling.BICUBIC).convert(mode)


def measure(rounds: int = 20) -> dict[str, Any]:
    pics = Pictures(input_size=(224, 224), patch_size=(14, 14), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    out: dict[str, Any] = {"threads": 1, "rounds": rounds}
    for name, (w, h, mode, kind) in {
        "photo 640x480 RGB": (640, 480, "RGB", "photo"),
        "photo 640x480 RGBA": (640, 480, "RGBA", "photo"),
        "photo 224x224 RGB": (224, 224, "RGB", "photo"),
        "noise 640x480 RGB": (640, 480, "RGB", "noise"),
    }.items():
        img = _picture(w, h, mode, kind)
        old_t, new_t = [], []
        for _ in range(rounds + 2):  # two warm-up rounds
            t0 = time.perf_counter()
            data = png_bytes(img)
            old = pics.prepare(data)
            t1 = time.perf_counter()
            snap = stored_image(img)
            pixels_id(snap)
            new = pics.prepare_image(snap)
            t2 = time.perf_counter()
            old_t.append((t1 - t0) * 1000)
            new_t.append((t2 - t1) * 1000)
            assert torch.equal(old.raw, new.raw)
        old_t, new_t = old_t[2:], new_t[2:]
        out[name] = {
            "png_round_trip_ms": round(summary(old_t)["median"], 2),
            "direct_ms": round(summary(new_t)["median"], 2),
            "speedup": round(paired(old_t, new_t)["median"], 2),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pil_inputs", description=__doc__)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(measure(args.rounds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
