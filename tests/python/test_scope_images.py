"""PIL images and arrays go straight into the one preparation path (no PNG encode and decode):
the prepared pixels and the maps equal those of the same picture's lossless PNG sent as bytes,
bit for bit, for every mode the PNG path knows; the id is the hash of the pixels; the PNG is
made only when asked for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import headscope
from headscope.python.inputs import ImagePicture, Picture, picture, pixels_id, png_bytes
from headscope.serving.preprocess import ImageError

MODEL = "random:test_vit"


@pytest.fixture(scope="module")
def scope(tmp_path_factory):
    return headscope.load(MODEL, device="cpu", models_dir=tmp_path_factory.mktemp("models"))


def _rgb(seed: int, w: int, h: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _modes() -> dict[str, Image.Image]:
    rng = np.random.default_rng(7)
    base = _rgb(1, 53, 37)  # odd sizes: resized, not square
    alpha = base.convert("RGBA")
    alpha.putalpha(Image.fromarray(rng.integers(0, 256, (37, 53), dtype=np.uint8)))
    la = base.convert("LA")
    la.putalpha(Image.fromarray(rng.integers(0, 256, (37, 53), dtype=np.uint8)))
    p_trans = base.convert("P")
    p_trans.info["transparency"] = 3
    p_rgba = Image.new("P", (41, 29))
    p_rgba.putpalette(rng.integers(0, 256, 256 * 4, dtype=np.uint8).tobytes(), "RGBA")
    p_rgba.putdata(rng.integers(0, 256, 41 * 29).tolist())
    return {
        "RGB": base,
        "RGBA": alpha,
        "L": base.convert("L"),
        "LA": la,
        "1": base.convert("1"),
        "P": base.convert("P"),
        "P+transparency": p_trans,
        "P+RGBA palette": p_rgba,
        "I;16": Image.fromarray(rng.integers(0, 65536, (37, 53), dtype=np.uint16)),
        "CMYK": base.convert("CMYK"),
        "YCbCr": base.convert("YCbCr"),
        "F": Image.fromarray(rng.random((37, 53)).astype(np.float32) * 300),
        "PA": base.convert("PA"),
        "RGB 1x1": _rgb(2, 1, 1),
        "RGB tall 5x301": _rgb(3, 5, 301),
        "RGB large 1501x2003": _rgb(4, 1501, 2003),  # early reduction on both axes
        "L large 2003x700": _rgb(5, 2003, 700).convert("L"),
        "RGBA large 1400x1400": _rgb(6, 1400, 1400).convert("RGBA"),
    }


@pytest.mark.parametrize("name", list(_modes()))
def test_an_image_prepares_as_its_png_does(scope, name):
    img = _modes()[name]
    want = scope.pictures.prepare(png_bytes(img))
    got = picture(img, scope.settings.max_upload_bytes)
    assert isinstance(got, ImagePicture)
    prep = got.prepared(scope.pictures)
    assert torch.equal(prep.raw, want.raw), name
    assert (prep.input_size, prep.image_size) == (want.input_size, want.image_size)
    assert "data" not in vars(got)  # no PNG was made


@pytest.mark.parametrize("name", ["RGBA", "P+transparency", "I;16", "CMYK", "RGB large 1501x2003"])
def test_the_maps_equal_the_bytes_path(scope, name):
    img = _modes()[name]
    got = scope.attention(img, query="all", layers=[0, -1])
    want = scope.attention(png_bytes(img), query="all", layers=[0, -1])
    assert torch.equal(got.maps, want.maps)
    assert got.image_size == want.image_size and got.input_size == want.input_size
    assert got.image_bytes == png_bytes(img)  # the lossless PNG, made when asked for
    again = got.select(query="cls")  # the capture computed again from the kept pixels
    assert torch.equal(again.maps, want.select(query="cls").maps)


def test_arrays_are_images_and_share_the_tensors_id(scope):
    a = np.random.default_rng(3).integers(0, 256, (30, 45, 3), dtype=np.uint8)
    pil, arr, t = Image.fromarray(a), a, torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))
    many = scope.attention([pil, arr, t, png_bytes(a)])
    assert all(torch.equal(m.maps, many[3].maps) for m in many)
    assert many[0].image_id == many[1].image_id == many[2].image_id == pixels_id(pil)
    assert many[3].image_id == Picture(png_bytes(a), None).image_id != many[0].image_id
    grey = scope.attention(a[..., 0])
    assert torch.equal(grey.maps, scope.attention(png_bytes(a[..., 0])).maps)
    assert grey.image_id != many[0].image_id


def test_the_image_is_a_snapshot_and_exif_is_not_applied(scope):
    img = _rgb(8, 40, 60)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90": applied to files, not to images in memory
    img.info["exif"] = exif.tobytes()
    pic = picture(img, scope.settings.max_upload_bytes)
    before = pic.prepared(scope.pictures)
    assert before.image_size == (60, 40)
    img.paste((0, 0, 0), (0, 0, 40, 60))  # the caller changes its image afterwards
    assert torch.equal(pic.prepared(scope.pictures).raw, before.raw)


def test_32_bit_grey_follows_the_colour_rule(scope):
    # Pillow writes no PNG of mode I: the server's rule for a decoded 32-bit grey file instead
    a = np.random.default_rng(9).integers(-1000, 70000, (33, 47), dtype=np.int32)
    prep = picture(Image.fromarray(a), scope.settings.max_upload_bytes).prepared(scope.pictures)
    grey = np.clip(a / 257.0, 0, 255).round().astype(np.uint8)
    assert torch.equal(prep.raw, scope.pictures.prepare(png_bytes(grey)).raw)


def test_limits_and_repeats(scope):
    small = scope.pictures.__class__(**{**vars(scope.pictures), "max_pixels": 100})
    with pytest.raises(ImageError, match="over the limit") as e:
        small.prepare_image(_rgb(0, 20, 20))
    assert e.value.status == 413
    img = _rgb(10, 50, 50)
    many = scope.attention([img] * 5 + [_rgb(11, 50, 50)])  # one object several times: prepared once
    assert all(torch.equal(m.maps, many[0].maps) for m in many[:5])
    assert not torch.equal(many[5].maps, many[0].maps)
