"""Decoding in bounded memory: the header's estimate holds, early reduction, unchanged pixels."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from headscope.serving import preprocess
from headscope.serving.pictures import Pictures
from helpers.server import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import load as loadscript  # noqa: E402

FIT = Pictures((224, 224), (14, 14), (0.5,) * 3, (0.5,) * 3).fit


def full_size(data: bytes):
    """The picture decoded at full size (no fit): the pipeline before early reduction."""
    return preprocess.load(preprocess.probe(data, 40_000_000)).img


MiB = 2**20

# Decode and prepare one file in a fresh process; print the peak memory growth and the estimate.
_MEASURE = """
import json, sys
from pathlib import Path
from headscope.serving.pictures import Pictures
data = Path(sys.argv[1]).read_bytes()
pictures = Pictures((224, 224), (14, 14), (0.5,) * 3, (0.5,) * 3)
def status():
    lines = open('/proc/self/status').read().splitlines()
    return {l.split(':')[0]: int(l.split()[1]) * 1024 for l in lines if l.startswith(('VmRSS', 'VmHWM'))}
base = status()['VmRSS']
Path('/proc/self/clear_refs').write_text('5')
p = pictures.probe(data)
prep = pictures.finish(p)
print(json.dumps({'peak': status()['VmHWM'] - base, 'estimate': p.peak_bytes,
                  'input_size': list(prep.input_size), 'image_size': list(prep.image_size)}))
"""


@pytest.fixture(scope="module")
def bombs():
    return loadscript.decode_bombs()


@pytest.mark.parametrize("name", list(range(4)))
def test_decoding_a_bomb_stays_under_its_estimate(bombs, tmp_path, name):
    """Each of the issue's pictures (78 KB files of 40 megapixels) in a fresh process: the peak
    memory of decoding and preparing it stays under the header's estimate, and under a fifth of
    what the full-size pipeline took (1.0-1.4 GB in the issue)."""
    key = list(bombs)[name]
    f = tmp_path / "bomb"
    f.write_bytes(bombs[key])
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(f)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["peak"] <= r["estimate"], (key, r)
    assert r["peak"] < 250 * MiB, (key, r)
    assert max(r["input_size"]) <= 672 and min(r["input_size"]) == 224


def _encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _old_to_rgb(img: Image.Image) -> Image.Image:
    """The conversion as it was before tiles (whole-picture float64), for comparison."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        a = np.asarray(img.convert("I"), dtype=np.float64)
        return Image.fromarray(np.clip(a / 257.0, 0, 255).round().astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        a = np.asarray(img, dtype=np.float64)
        lo, hi = float(a.min()), float(a.max())
        a = (a - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(a)
        return Image.fromarray(a.round().astype(np.uint8), "L").convert("RGB")
    if mode == "P" and "transparency" in img.info:
        img, mode = img.convert("RGBA"), "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255,) * 4), rgba).convert("RGB")
    return img.convert("RGB")


def _picture(mode: str, w: int, h: int) -> Image.Image:
    rng = np.random.default_rng(w * h)
    if mode == "I;16":
        return Image.frombytes("I;16", (w, h), rng.integers(0, 65536, (h, w), dtype=np.uint16).tobytes())
    if mode == "I":
        return Image.frombytes("I", (w, h), rng.integers(-(10**5), 10**6, (h, w), dtype=np.int32).tobytes())
    if mode == "F":
        a = (rng.standard_normal((h, w)) * 100).astype(np.float32)
        a[3, 4] = 1e30  # one outlier squeezes the rest into a few grey levels
        return Image.frombytes("F", (w, h), a.tobytes())
    rgba = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA")
    if mode == "P":
        p = rgba.convert("RGB").convert("P")
        p.info["transparency"] = 7
        return p
    return rgba.convert(mode)


@pytest.mark.parametrize("mode", ["I;16", "I", "F", "RGBA", "LA", "P", "PA", "RGBa", "CMYK", "L"])
def test_tiled_conversion_gives_the_pixels_of_the_whole_picture_conversion(mode):
    img = _picture(mode, 913, 611)  # 2.1 tiles of 512 x 512 each way
    assert np.array_equal(np.asarray(preprocess.to_rgb(img)), np.asarray(_old_to_rgb(img)))


def test_a_float_picture_with_nan_becomes_black_as_before():
    a = np.zeros((600, 900), np.float32)
    a[5, 5] = np.nan
    img = Image.frombytes("F", (900, 600), a.tobytes())
    with np.errstate(invalid="ignore"):
        assert np.array_equal(np.asarray(preprocess.to_rgb(img)), np.asarray(_old_to_rgb(img)))


@pytest.mark.parametrize(
    "make,fmt",
    [
        (lambda: Image.open(ROOT / "static" / "samples" / "cat.png"), "PNG"),
        (lambda: _picture("RGBA", 1300, 700), "PNG"),  # under 3x the 224 x 416 target: no early reduction
        (lambda: _picture("I;16", 640, 480), "PNG"),
        (lambda: _picture("RGBA", 1000, 600).convert("RGB"), "JPEG"),
    ],
)
def test_a_picture_that_needs_no_early_reduction_gives_the_same_pixels(make, fmt):
    data = _encode(make(), fmt)
    p = preprocess.probe(data, 40_000_000, FIT)
    dec = preprocess.load(p)
    whole = full_size(data)  # no fit: full size, the old pipeline
    assert dec.img.size == whole.size
    assert np.array_equal(np.asarray(dec.img), np.asarray(whole))
    a = preprocess.prepare(dec.img, (224, 224), (14, 14), (0.5,) * 3, (0.5,) * 3, image_size=dec.image_size)
    b = preprocess.prepare(whole, (224, 224), (14, 14), (0.5,) * 3, (0.5,) * 3)
    assert a.input_size == b.input_size and a.image_size == b.image_size
    assert (a.pixels == b.pixels).all()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_early_reduction_is_close_to_resizing_the_whole_picture(fmt):
    """A 4000 x 2400 photo-like picture: shrunk early (box filter, or the JPEG decoder's DCT
    scaling) then resized, it stays close to the direct bicubic resize."""
    y, x = np.mgrid[0:2400, 0:4000]
    a = np.stack([(x // 7) % 256, (y // 5) % 256, ((x + y) // 11) % 256], -1).astype(np.uint8)
    data = _encode(Image.fromarray(a, "RGB"), fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    p = preprocess.probe(data, 40_000_000, FIT)
    dec = preprocess.load(p)
    assert dec.img.width < 4000 and dec.image_size == (2400, 4000)
    early = preprocess.prepare(dec.img, (224, 224), (14, 14), (0,) * 3, (1,) * 3, image_size=dec.image_size)
    whole = preprocess.prepare(full_size(data), (224, 224), (14, 14), (0,) * 3, (1,) * 3)
    assert early.input_size == whole.input_size == (224, 378)
    assert float((early.pixels - whole.pixels).abs().mean()) < 0.02


@pytest.mark.parametrize("orientation,size", [(1, (60, 20)), (6, (20, 60)), (8, (20, 60)), (3, (60, 20))])
def test_exif_orientation_with_early_reduction(orientation, size):
    img = Image.new("RGB", (6000, 2000), (200, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encode(img, "JPEG", exif=exif)
    dec = preprocess.load(preprocess.probe(data, 40_000_000, FIT))
    w, h = dec.img.size
    assert (w > h) == (size[0] > size[1])
    assert dec.image_size == (size[1] * 100, size[0] * 100)


def test_the_estimate_refuses_nothing_ordinary():
    """A 12-megapixel JPEG photo and a 24 MP PNG stay well under the default decode budget."""
    jpeg = _encode(Image.new("RGB", (4000, 3000), (1, 2, 3)), "JPEG")
    png = _encode(Image.new("RGB", (6000, 4000), (1, 2, 3)), "PNG")
    assert preprocess.probe(jpeg, 40_000_000, FIT).peak_bytes < 64 * MiB  # decoded at 1/4 by libjpeg
    assert preprocess.probe(png, 40_000_000, FIT).peak_bytes < 128 * MiB
