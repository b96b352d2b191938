"""PIL images the Python API takes as they come from ``Image.open``: 16-bit grey of either byte
order, a PNG's colour key (tRNS), a truncated file. Each gives what its file's path gives: the
same pixels, or the same error (a ``ValueError`` with the path's 422 ``corrupt_image``, naming
the picture's place in a list)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import headscope
from headscope.python.inputs import picture, png_bytes, stored_image
from headscope.serving.preprocess import ImageError

MODEL = "random:test_vit"


@pytest.fixture(scope="module")
def scope(tmp_path_factory):
    return headscope.load(MODEL, device="cpu", models_dir=tmp_path_factory.mktemp("models"))


def _grey16(w: int = 53, h: int = 37) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 65536, (h, w), dtype=np.uint16)


def _tiff_16(tmp_path, order: str):
    """A 16-bit grey TIFF in byte order ``order`` (``>`` big-endian: Pillow opens it as I;16B)."""
    a = _grey16()
    mode = "I;16B" if order == ">" else "I;16"
    img = Image.frombytes(mode, (a.shape[1], a.shape[0]), a.astype(f"{order}u2").tobytes())
    path = tmp_path / f"grey16{'be' if order == '>' else 'le'}.tiff"
    img.save(path)
    return path


@pytest.mark.parametrize("order", [">", "<"], ids=["big-endian", "little-endian"])
def test_a_16_bit_tiff_opened_with_pil_gives_what_its_path_gives(scope, tmp_path, order):
    path = _tiff_16(tmp_path, order)
    opened = Image.open(path)
    assert opened.mode == ("I;16B" if order == ">" else "I;16")
    want = scope.pictures.prepare(path.read_bytes())
    got = picture(Image.open(path), scope.settings.max_upload_bytes).prepared(scope.pictures)
    assert torch.equal(got.raw, want.raw)
    assert 60 < float(got.raw.float().mean()) < 200  # the picture, not a white square
    maps = scope.attention(Image.open(path), layers=-1, heads=0).maps
    assert torch.equal(maps, scope.attention(path, layers=-1, heads=0).maps)


@pytest.mark.parametrize("mode", ["I;16B", "I;16L", "I;16N"])
def test_16_bit_modes_of_any_byte_order_are_16_bit_grey(scope, mode):
    a = _grey16()
    order = {"I;16B": ">", "I;16L": "<", "I;16N": "="}[mode]
    img = Image.frombytes(mode, (a.shape[1], a.shape[0]), a.astype(f"{order}u2").tobytes())
    stored = stored_image(img)
    assert stored.mode == "I;16"
    assert np.array_equal(np.asarray(stored), a)
    want = scope.pictures.prepare(png_bytes(Image.fromarray(a)))
    assert torch.equal(scope.pictures.prepare_image(stored).raw, want.raw)
    assert png_bytes(img) == png_bytes(Image.fromarray(a))


def test_a_colour_keyed_png_opened_with_pil_gives_what_its_path_gives(scope, tmp_path):
    a = np.random.default_rng(2).integers(1, 256, (40, 60), dtype=np.uint8)
    a[:, :20] = 0
    path = tmp_path / "keyed.png"
    Image.fromarray(a, "L").save(path, transparency=0)
    want = scope.pictures.prepare(path.read_bytes())
    assert (want.raw[:, :, :50] == 255).all()  # the key's third, over white (resized: a margin)
    got = picture(Image.open(path), scope.settings.max_upload_bytes)
    assert torch.equal(got.prepared(scope.pictures).raw, want.raw)
    maps = scope.attention(Image.open(path), layers=-1, heads=0).maps
    assert torch.equal(maps, scope.attention(path, layers=-1, heads=0).maps)


@pytest.fixture
def truncated(tmp_path):
    rng = np.random.default_rng(4)
    data = png_bytes(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    path = tmp_path / "trunc.png"
    path.write_bytes(data[: len(data) // 2])
    return path


def test_a_truncated_file_opened_with_pil_is_the_paths_corrupt_image_error(scope, truncated):
    with pytest.raises(ImageError) as by_path:
        scope.attention(truncated, layers=-1, heads=0)
    with pytest.raises(ValueError) as by_image:
        scope.attention(Image.open(truncated), layers=-1, heads=0)
    assert isinstance(by_image.value, ImageError)
    assert (by_image.value.status, by_image.value.code) == (by_path.value.status, by_path.value.code)
    assert (by_image.value.status, by_image.value.code) == (422, "corrupt_image")
    assert str(by_path.value).endswith(str(by_image.value))  # the path's message names the file too


def test_a_truncated_image_in_a_list_is_named_by_its_place(scope, truncated):
    good = Image.fromarray(np.full((30, 40, 3), 90, np.uint8))
    with pytest.raises(ImageError) as e:
        scope.attention([good, Image.open(truncated)], layers=-1, heads=0)
    assert (e.value.status, e.value.code) == (422, "corrupt_image")
    assert str(e.value).startswith("pictures[1]: the image could not be decoded")


def test_a_truncated_cmyk_jpeg_opened_with_pil_is_corrupt_too(scope):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(6).integers(0, 256, (64, 64, 3), dtype=np.uint8)).convert("CMYK").save(
        buf, "JPEG"
    )
    data = buf.getvalue()
    img = Image.open(io.BytesIO(data[: len(data) // 2]))  # the header whole, half the scans
    assert img.mode == "CMYK"
    with pytest.raises(ImageError) as e:
        scope.attention(img, layers=-1, heads=0)
    assert e.value.code == "corrupt_image"


def test_one_lazily_opened_image_from_four_threads_at_once(scope, samples):
    """Pillow cannot decode one ``Image.open`` from two threads at once: four calls sharing one
    lazily opened PNG each get its pixels (they got AssertionErrors, ``'NoneType' object has no
    attribute 'read'`` and "broken PNG file" as corrupt_image)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    path = samples["cat"]
    want = Image.open(path).convert("RGB").tobytes()
    for _ in range(5):
        lazy = Image.open(path)
        start = threading.Barrier(4)

        def read(_: int, lazy=lazy, start=start) -> bytes:
            start.wait(30)
            return stored_image(lazy).tobytes()

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(read, range(4))) == [want] * 4
    a = scope.attention(Image.open(path), layers=-1)
    assert torch.equal(a.maps, scope.attention(path, layers=-1).maps)


@pytest.mark.parametrize("mode, plain", [("La", "LA"), ("RGBa", "RGBA")])
def test_premultiplied_alpha_is_its_plain_alpha_image(scope, mode, plain):
    """``La`` and ``RGBa`` (premultiplied alpha) are the LA/RGBA image Pillow converts them to
    (they were refused as a corrupt file: "conversion from La to L not supported")."""
    rgba = Image.fromarray(np.random.default_rng(3).integers(0, 256, (40, 56, 4), dtype=np.uint8), "RGBA")
    img = rgba.convert(plain).convert(mode)
    assert torch.equal(scope.attention(img, layers=-1).maps, scope.attention(img.convert(plain), layers=-1).maps)
