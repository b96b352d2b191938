"""Bytes -> RGB picture -> normalised tensor on the model's patch grid.

Colour rule (documented in the README): EXIF orientation is applied; the first frame of an
animation is used; transparency is composited over white; 16-bit and 32-bit integer greyscale is
scaled by 1/257 (full 16-bit range to 0..255, values clipped); float greyscale is min-max
stretched; every other mode goes through Pillow's own conversion to RGB (CMYK, YCbCr, LAB, P, L, 1).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

ALLOWED_FORMATS = {"PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF"}


class ImageError(ValueError):
    """An upload that is not a usable image; ``status`` and ``code`` go into the 4xx answer."""

    def __init__(self, message: str, status: int = 422, code: str = "bad_image"):
        super().__init__(message)
        self.status = status
        self.code = code


def decode(data: bytes, max_pixels: int) -> Image.Image:
    """Decode image bytes into an RGB picture, refusing bombs and non-images.

    Args:
        data: the uploaded file's bytes.
        max_pixels: refuse images with more pixels than this (decompression bombs).
    """
    if not data:
        raise ImageError("the uploaded file is empty", 422, "empty_file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img: Image.Image = Image.open(io.BytesIO(data))
            fmt = img.format
            if fmt not in ALLOWED_FORMATS:
                raise ImageError(
                    f"image format {fmt} is not supported; send PNG, JPEG, WebP, GIF, BMP or TIFF",
                    415,
                    "unsupported_format",
                )
            w, h = img.size
            if w * h > max_pixels:
                raise ImageError(
                    f"image of {w} x {h} pixels is over the limit of {max_pixels:,} pixels", 413, "image_too_large"
                )
            if getattr(img, "n_frames", 1) > 1:
                img.seek(0)
            img.load()
            img = ImageOps.exif_transpose(img)
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(
            "the file is not an image Headscope can read (PNG, JPEG, WebP, GIF, BMP, TIFF)", 415, "not_an_image"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(
            f"image is over the limit of {max_pixels:,} pixels (decompression bomb?)", 413, "image_too_large"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(
            f"the image could not be decoded (truncated or corrupt): {str(e)[:120]}", 422, "corrupt_image"
        ) from None
    if img.width < 1 or img.height < 1:
        raise ImageError("the image has no pixels", 422, "corrupt_image")
    return to_rgb(img)


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB by the rule in this module's docstring."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        a = np.asarray(img.convert("I"), dtype=np.float64)
        a = np.clip(a / 257.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if mode == "F":
        a = np.asarray(img, dtype=np.float64)
        lo, hi = float(a.min()), float(a.max())
        a = (a - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(a)
        return Image.fromarray(a.round().astype(np.uint8), "L").convert("RGB")
    if mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB")


def plan_size(
    width: int,
    height: int,
    input_size: tuple[int, int],
    patch: tuple[int, int],
    mode: str = "aspect",
    max_aspect: float = 3.0,
    dynamic: bool = True,
) -> tuple[int, int]:
    """Pick the model input ``(height, width)`` for an image.

    ``aspect`` (default, needs a dynamic-size model): the shorter side becomes the model's input
    size, the longer side follows the aspect ratio up to ``max_aspect`` times the shorter, and
    both are rounded to multiples of the patch size, so the patch grid follows the picture.
    ``square``: the model's native input size.
    """
    if mode == "square" or not dynamic:
        return input_size[0], input_size[1]
    s = min(input_size)
    ph, pw = patch
    scale = s / min(width, height)
    h = min(height * scale, s * max_aspect)
    w = min(width * scale, s * max_aspect)
    return max(ph, round(h / ph) * ph), max(pw, round(w / pw) * pw)


@dataclass
class Prepared:
    pixels: torch.Tensor  # 3, H, W float32, normalised
    input_size: tuple[int, int]  # H, W
    image_size: tuple[int, int]  # H, W of the decoded picture


def prepare(img: Image.Image, input_size, patch, mean, std, mode="aspect", max_aspect=3.0, dynamic=True) -> Prepared:
    """Resize (bicubic; untouched when already the right size) and normalise an RGB picture."""
    H, W = plan_size(img.width, img.height, input_size, patch, mode, max_aspect, dynamic)
    resized = img if (img.height, img.width) == (H, W) else img.resize((W, H), Image.Resampling.BICUBIC)
    a: np.ndarray = np.asarray(resized, dtype=np.float32) / 255.0  # H, W, 3
    a = (a - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    pixels = torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))
    return Prepared(pixels, (H, W), (img.height, img.width))


def display_png(img: Image.Image, max_side: int = 1600) -> bytes:
    """The picture as PNG for the page, at most ``max_side`` pixels on its longer side."""
    if max(img.size) > max_side:
        img = img.copy()
        img.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=3)
    return buf.getvalue()
