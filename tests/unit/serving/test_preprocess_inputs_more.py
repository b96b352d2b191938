"""Colour rule corner cases: PNG colour-key transparency (tRNS) in grey, 16-bit grey and RGB
pictures, float pictures with NaN or infinite pixels, and the docs' decode estimate."""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pytest
from PIL import Image

from headscope.config import Settings
from headscope.serving import preprocess
from headscope.serving.pictures import Pictures
from headscope.serving.preprocess import ImageError
from helpers.server import ROOT

PICTURES = Pictures((224, 224), (14, 14), (0.5,) * 3, (0.5,) * 3)


def _encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


# -- colour-key transparency -------------------------------------------------------------
def _keyed(mode: str, w: int, h: int) -> tuple[bytes, bytes, np.ndarray]:
    """A PNG of ``mode`` whose left third is the tRNS key colour, the same picture with an explicit
    alpha channel (alpha 0 where the key is), and the key pixels' mask (h, w)."""
    rng = np.random.default_rng(w * h)
    grey = rng.integers(1, 256, (h, w), dtype=np.uint8)  # never 0, the key
    key_mask = np.zeros((h, w), bool)
    key_mask[:, : w // 3] = True
    grey[key_mask] = 0
    alpha = np.where(key_mask, 0, 255).astype(np.uint8)
    if mode == "L":
        img, key = Image.fromarray(grey, "L"), 0
        same = Image.fromarray(np.stack([grey, alpha], -1), "LA")
    elif mode == "I;16":
        wide = grey.astype(np.uint16) * 257  # levels a 1/257 scale maps back to ``grey`` exactly
        img, key = Image.fromarray(wide), 0
        same = Image.fromarray(np.stack([grey, alpha], -1), "LA")
    else:
        rgb = np.stack([grey, rng.integers(1, 256, (h, w), dtype=np.uint8), grey // 2 + 1], -1)
        rgb[key_mask] = (0, 0, 0)
        img, key = Image.fromarray(rgb, "RGB"), (0, 0, 0)
        same = Image.fromarray(np.concatenate([rgb, alpha[..., None]], -1), "RGBA")
    data = _encode(img, transparency=key)
    assert Image.open(io.BytesIO(data)).info.get("transparency") == key  # a tRNS chunk
    return data, _encode(same), key_mask


@pytest.mark.parametrize("mode", ["L", "I;16", "RGB"])
@pytest.mark.parametrize(
    "size",
    [(40, 30), (913, 611), (1400, 1400)],  # whole, in tiles of 256 K pixels, and reduced early (x2)
    ids=["small", "tiled", "reduced"],
)
def test_a_colour_key_is_composited_over_white_as_an_alpha_channel_is(mode, size):
    keyed, alpha, mask = _keyed(mode, *size)
    want = PICTURES.prepare(alpha)
    got = PICTURES.prepare(keyed)
    assert got.input_size == want.input_size
    assert np.array_equal(got.raw.numpy(), want.raw.numpy())
    full = preprocess.load(preprocess.probe(keyed, 40_000_000)).img  # full size, no reduction
    assert (np.asarray(full)[mask] == 255).all()  # the key's pixels are white


def test_a_colour_key_in_an_image_in_memory_is_composited_too():
    keyed, alpha, mask = _keyed("L", 60, 40)
    img = Image.open(io.BytesIO(keyed))
    img.load()
    got = PICTURES.prepare_image(img)
    assert np.array_equal(got.raw.numpy(), PICTURES.prepare(alpha).raw.numpy())


def _png(width: int, height: int, depth: int, colour: int, rows: list[bytes], trns: bytes) -> bytes:
    """A PNG written chunk by chunk: bit depths and keys Pillow's encoder does not write."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\x00" + r for r in rows))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"tRNS", trns)
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    "data,want",
    [
        # 2-bit grey 0, 1, 2, 3 (Pillow: 0, 85, 170, 255) with key 1: the second pixel transparent
        (_png(4, 1, 2, 0, [bytes([0b00011011])], b"\x00\x01"), [0, 255, 170, 255]),
        # 4-bit grey 3, 15 (Pillow: 51, 255) with key 3
        (_png(2, 1, 4, 0, [bytes([0x3F])], b"\x00\x03"), [255, 255]),
        # 16-bit RGB: the key (0x0100, 0x0200, 0x0300) is the first pixel, but Pillow keeps the
        # high bytes, (1, 2, 3) and (0, 0, 0): the key matches no decoded pixel exactly, so none is erased
        (_png(2, 1, 16, 2, [bytes.fromhex("010002000300000100020003")], bytes.fromhex("010002000300")), [1, 0]),
    ],
    ids=["2-bit grey", "4-bit grey", "16-bit RGB"],
)
def test_a_colour_key_is_read_in_the_units_of_the_decoded_pixels(data, want):
    # Before: the 2- and 4-bit keys matched no pixel (Pillow scales the pixels, not the key), and
    # the 16-bit RGB key's low bytes erased an unrelated pixel, (0, 0, 0) of (1, 2, 3).
    got = np.asarray(preprocess.load(preprocess.probe(data, 40_000_000)).img)[0, :, 0].tolist()
    assert got == want
    img = Image.open(io.BytesIO(data))  # the Python API's lazily opened image: the same rule
    from headscope.python.inputs import stored_image

    assert np.asarray(preprocess.to_rgb(stored_image(img)))[0, :, 0].tolist() == want


# -- float pictures ----------------------------------------------------------------------
def _float_picture(w: int, h: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return (np.sin(x / 17.0) * np.cos(y / 13.0) * 40 + 3).astype(np.float32)


def _stretched(a: np.ndarray) -> np.ndarray:
    """The documented rule: min-max over the finite pixels; NaN and -inf as the minimum (black),
    +inf as the maximum (white)."""
    finite = a[np.isfinite(a)]
    lo, hi = float(finite.min()), float(finite.max())
    b = np.nan_to_num(a.astype(np.float64), nan=lo, posinf=hi, neginf=lo)
    out = (b - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(b)
    return out.round().astype(np.uint8)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("size", [(60, 40), (913, 611)], ids=["small", "tiled"])
def test_one_non_finite_pixel_leaves_the_rest_of_a_float_picture_stretched(value, size):
    w, h = size
    a = _float_picture(w, h)
    a[7, 600 % w] = value
    img = Image.frombytes("F", (w, h), a.tobytes())
    with np.errstate(all="raise"):  # no "invalid value" on the way either
        out = np.asarray(preprocess.to_rgb(img))
    want = _stretched(a)
    assert np.array_equal(out[..., 0], want)
    assert out[7, 600 % w, 0] == (255 if value == math.inf else 0)
    assert out.std() > 30  # a picture, not a black square


def test_a_float_tiff_with_nan_and_inf_is_still_the_picture():
    a = _float_picture(300, 200)
    clean = PICTURES.prepare(_encode(Image.fromarray(a), "TIFF")).raw.float()
    a[0, 0], a[0, 1] = math.nan, math.inf
    dirty = PICTURES.prepare(_encode(Image.fromarray(a), "TIFF")).raw.float()
    assert float(dirty.std()) > 30
    assert float((dirty - clean).abs().mean()) < 2  # two pixels of 60,000 differ


@pytest.mark.parametrize("fill", [math.nan, math.inf], ids=["all nan", "all inf"])
@pytest.mark.parametrize("size", [(60, 40), (913, 611)], ids=["small", "tiled"])
def test_a_float_picture_without_a_finite_pixel_is_corrupt(fill, size):
    w, h = size
    data = _encode(Image.fromarray(np.full((h, w), fill, np.float32)), "TIFF")
    with pytest.raises(ImageError) as e:
        PICTURES.prepare(data)
    assert (e.value.status, e.value.code) == (422, "corrupt_image")
    assert "finite" in str(e.value)


# -- the decode estimate as documented ---------------------------------------------------
def _largest_webp_megapixels(budget: int) -> int:
    """Megapixels of the largest 4:3 RGB WebP photo whose estimate fits ``budget`` (whole MP)."""
    mp = 1
    while True:
        h = int(math.sqrt((mp + 1) * 1e6 * 3 / 4))
        w = h * 4 // 3
        fit = PICTURES.fit
        factors = preprocess._factors((w, h), fit(w, h))
        if preprocess.peak_bytes("WEBP", "RGB", (w, h), (w, h), factors, {}) > budget:
            return mp
        mp += 1


def test_the_docs_give_the_decode_estimates_factors_and_the_webp_limit():
    limits = (ROOT / "docs" / "limits.md").read_text()
    images = (ROOT / "docs" / "images.md").read_text()
    doc = " ".join((preprocess.__doc__ or "").split())
    text = " ".join(limits.split())
    for fmt, name in (("WEBP", "WebP"), ("TIFF", "TIFF")):
        factor = preprocess.DECODER_FACTOR[fmt]
        assert f"x{factor} for {name}" in text, (fmt, factor)
        assert f"times {factor} for {name}" in doc, (fmt, factor)
    mp = _largest_webp_megapixels(Settings().decode_budget_bytes)
    for page in (text, " ".join(images.split())):
        found = re.search(r"WebP[^.]*?about (\d+) megapixels", page)
        assert found and int(found.group(1)) == mp, (found and found.group(0), mp)
