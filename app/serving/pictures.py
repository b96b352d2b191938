"""Bytes -> the model's input tensor: the one way a picture reaches a model.

The server (uploads, ablation, every follow-up), the survey (both engines), ``headscope extract``
and in-process callers all prepare pictures through :class:`Pictures`, so a picture gives the
same pixels, hence the same maps and statistics, whichever way it comes in:

1. :meth:`Pictures.probe` reads the header (format, size, the decompression-bomb limit) and
   estimates the decode's peak memory, which the server reserves before going on;
2. :meth:`Pictures.finish` decodes upright RGB with the **early reduction** of
   :mod:`app.serving.images` (a picture more than 3x its target size along an axis is first
   shrunk by an integer box filter, or by the JPEG decoder's DCT scaling, to no less than 3x the
   target), then resizes it (bicubic) to the input size planned from the picture's *original*
   size, and normalises it with the model's mean and std.

:meth:`Pictures.prepare` does both. Nothing else decodes pictures: the page's display PNG
(:func:`display_probe`, :func:`display_finish`) is the one other use, with a fit of its own
(:func:`app.serving.images.display_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import images
from .images import ImageError, Prepared, Probe

if TYPE_CHECKING:
    from ..config import Settings
    from ..engine.model import LoadedModel

__all__ = ["ImageError", "Pictures", "Prepared", "Probe", "display_finish", "display_probe"]


@dataclass(frozen=True)
class Pictures:
    """How pictures are prepared for one model under one configuration.

    Args:
        input_size: the model's native (height, width).
        patch_size: (height, width) of a patch: input sizes are multiples of it.
        mean: the model's normalisation mean (RGB, 0..1 scale).
        std: the model's normalisation std.
        resize: ``aspect`` (the shorter side to the input size, the grid follows the picture)
            or ``square`` (the native input size).
        max_aspect: the longer side is at most this many times the shorter.
        dynamic: the model takes any grid; else every picture is resized square.
        max_pixels: pictures with more pixels are refused (decompression bombs).
    """

    input_size: tuple[int, int]
    patch_size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize: str = "aspect"
    max_aspect: float = 3.0
    dynamic: bool = True
    max_pixels: int = 40_000_000

    @classmethod
    def for_model(cls, lm: LoadedModel, settings: Settings) -> Pictures:
        """The preparation ``settings`` prescribe for ``lm`` (what the server does)."""
        return cls(
            input_size=lm.input_size,
            patch_size=lm.patch_size,
            mean=lm.mean,
            std=lm.std,
            resize=settings.resize,
            max_aspect=settings.max_aspect,
            dynamic=lm.dynamic,
            max_pixels=settings.max_image_pixels,
        )

    def fit(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) a picture of (width, height) pixels is resized to."""
        h, w = images.plan_size(
            width, height, self.input_size, self.patch_size, self.resize, self.max_aspect, self.dynamic
        )
        return w, h

    def probe(self, data: bytes) -> Probe:
        """Read the header; raises :class:`ImageError` (4xx) for what cannot be a picture."""
        return images.probe(data, self.max_pixels, self.fit)

    def finish(self, probe: Probe) -> Prepared:
        """Decode a probed picture (early reduction included), resize and normalise it."""
        dec = images.load(probe)
        return images.prepare(
            dec.img,
            self.input_size,
            self.patch_size,
            self.mean,
            self.std,
            self.resize,
            self.max_aspect,
            self.dynamic,
            image_size=dec.image_size,
        )

    def prepare(self, data: bytes) -> Prepared:
        """Bytes -> the normalised input tensor ``[3, H, W]`` with its input and image sizes."""
        return self.finish(self.probe(data))


def display_probe(data: bytes, max_pixels: int) -> Probe:
    """Read the header of a picture shown on the page (longer side at most 1600 pixels)."""
    return images.probe(data, max_pixels, images.display_fit)


def display_finish(probe: Probe) -> bytes:
    """The probed picture as the page's PNG (early reduction to its display size included)."""
    return images.display_png(images.load(probe).img)
