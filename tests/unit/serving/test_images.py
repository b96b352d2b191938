"""Decoding and resizing: formats, modes, bombs, sizes."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from headscope.serving import preprocess
from headscope.serving.preprocess import ImageError, load, plan_size, prepare, probe, to_rgb

LIMIT = 40_000_000


def decode(data: bytes, max_pixels: int) -> Image.Image:
    """The colour rule's decode at full size (no fit: no early reduction)."""
    return load(probe(data, max_pixels)).img


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_formats_decode_to_rgb(fmt):
    img = Image.new("RGB", (40, 30), (200, 10, 10))
    out = decode(encode(img, fmt), LIMIT)
    assert out.mode == "RGB" and out.size == (40, 30)


def test_animated_gif_uses_first_frame():
    frames = [Image.new("P", (8, 8), i) for i in (1, 2)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert decode(data, LIMIT).size == (8, 8)


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 20))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    out = decode(encode(img, "JPEG", exif=exif), LIMIT)
    assert out.size == (20, 40)


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "CMYK", "1", "I;16", "I", "F", "YCbCr"])
def test_any_mode_becomes_rgb(mode):
    img = Image.new(mode, (5, 4))
    assert to_rgb(img).mode == "RGB"


def test_sixteen_bit_scales_full_range():
    img = Image.new("I;16", (3, 1))
    for x, v in enumerate((0, 65535, 32896)):
        img.putpixel((x, 0), v)
    out = np.asarray(decode(encode(img, "PNG"), LIMIT))
    assert out[0, :, 0].tolist() == [0, 255, 128]


def test_transparency_goes_over_white():
    img = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    assert np.asarray(to_rgb(img))[0, 0].tolist() == [255, 255, 255]


@pytest.mark.parametrize(
    "data,status,code",
    [
        (b"", 422, "empty_file"),
        (b"hello, this is text", 415, "not_an_image"),
        (encode(Image.new("RGB", (64, 64)), "PNG")[:60], 422, "corrupt_image"),
        (encode(Image.new("RGB", (8, 8)), "ICO"), 415, "unsupported_format"),
    ],
)
def test_bad_input_raises_with_status(data, status, code):
    with pytest.raises(ImageError) as e:
        decode(data, LIMIT)
    assert (e.value.status, e.value.code) == (status, code)


def test_decompression_bomb_is_an_error():
    data = encode(Image.new("1", (10_000, 10_000)), "PNG")  # 100 MP, a few KB
    # A library leaves Pillow's warning to its user's filters; Headscope's own limit refuses it.
    with pytest.warns(Image.DecompressionBombWarning), pytest.raises(ImageError) as e:
        decode(data, LIMIT)
    assert e.value.status == 413
    assert "10000 x 10000 pixels is over the limit of 40,000,000" in str(e.value)


def test_a_process_headscope_runs_takes_its_pixel_limit_as_pillows(monkeypatch):
    """Over Pillow's 89 M pixels but under a larger HEADSCOPE_MAX_IMAGE_PIXELS: accepted, no warning."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # set back afterwards
    data = encode(Image.new("1", (10_000, 10_000)), "PNG")
    preprocess.adopt_pixel_limit(120_000_000)
    assert probe(data, 120_000_000).size == (10_000, 10_000)
    preprocess.adopt_pixel_limit(LIMIT)  # over it: refused by Pillow's check, under Headscope's words
    with pytest.raises(ImageError) as e:
        probe(data, LIMIT)
    assert (e.value.status, e.value.code) == (413, "image_too_large")
    assert str(e.value) == "image of 100,000,000 pixels is over the limit of 40,000,000 pixels (decompression bomb?)"


def test_a_refusal_by_pillows_own_lower_limit_names_it(monkeypatch):
    """Pillow errors at twice its limit whatever Headscope's is: the answer says whose limit it was."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)
    data = encode(Image.new("1", (2_000, 2_000)), "PNG")  # 4 MP: over twice Pillow's limit
    with pytest.raises(ImageError) as e:
        probe(data, LIMIT)
    assert e.value.status == 413
    assert "Pillow's limit in this process (2,000,000 pixels: twice PIL.Image.MAX_IMAGE_PIXELS)" in str(e.value)
    assert "below Headscope's 40,000,000" in str(e.value)


def test_importing_headscope_leaves_pillow_and_warning_filters_alone():
    code = (
        "import warnings; from PIL import Image; import numpy, torch, timm, torchvision; "  # filters of their own
        "before = (list(warnings.filters), Image.MAX_IMAGE_PIXELS); "
        "import headscope, headscope.serving.preprocess, headscope.serving.pictures, headscope.python.scope; "
        "assert (list(warnings.filters), Image.MAX_IMAGE_PIXELS) == before, 'changed'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.parametrize(
    "w,h,want",
    [
        (224, 224, (224, 224)),  # unchanged
        (451, 300, (224, 336)),  # shorter side 224, longer follows, multiple of 14
        (300, 451, (336, 224)),
        (10, 5, (224, 448)),  # tiny: upscaled
        (5000, 100, (224, 672)),  # very wide: clamped to 3:1
    ],
)
def test_plan_size_keeps_aspect(w, h, want):
    assert plan_size(w, h, (224, 224), (14, 14)) == want


def test_square_mode_and_static_models():
    assert plan_size(451, 300, (224, 224), (16, 16), mode="square") == (224, 224)
    assert plan_size(451, 300, (224, 224), (16, 16), dynamic=False) == (224, 224)


def test_prepare_normalises():
    img = Image.new("RGB", (224, 224), (255, 0, 128))
    p = prepare(img, (224, 224), (14, 14), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert p.pixels.shape == (3, 224, 224)
    assert p.pixels[:, 0, 0].tolist() == pytest.approx([1.0, -1.0, 128 / 255 * 2 - 1], abs=1e-6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.binary(max_size=2048)
    | st.builds(
        lambda b, cut: encode(Image.new("RGB", (17, 9)), "PNG")[:cut] + b, st.binary(max_size=64), st.integers(0, 200)
    )
)
def test_decoder_fuzz_only_raises_image_errors(data):
    try:
        img = decode(data, LIMIT)
    except ImageError as e:
        assert 400 <= e.status < 500
        return
    assert img.mode == "RGB" and img.width >= 1
