"""What the Python API takes as a picture, and the bytes the server would be sent for it.

A picture is a path (``str`` or ``os.PathLike``), the file's bytes, a ``PIL.Image.Image`` or an
``HxWx3`` ``uint8`` array (``HxWx4`` RGBA and ``HxW`` grey too). Paths are read as the survey and
``headscope extract`` read them (`read_picture_file`: regular files
only, at most ``HEADSCOPE_MAX_UPLOAD_BYTES``); bytes are taken as they are. Images and arrays are
encoded losslessly as PNG (`png_bytes`), so that every picture reaches the model as bytes,
through the server's one preparation path (`Pictures`), and its
``image_id`` is the id the server gives the same bytes. Images and arrays are taken as their
pixels are: an EXIF orientation a ``PIL.Image`` carries is not applied (``ImageOps.exif_transpose``
first where it should be); paths and bytes go the server's way, orientation applied.

A ``torch.Tensor`` is pixels, channels first: ``[3, H, W]`` for one picture, ``[B, 3, H, W]``
for ``B`` of them (one result each), RGB, **not** the model's normalised input: ``uint8``
levels 0..255, or floating values 0..1 (quantised to the 256 levels, ``round(x * 255)``, on the
tensor's own device, as a picture file stores them). Anything else is refused
(`tensor_pictures`: a wrong shape, dtype, an empty tensor, values outside 0..1, which is what a
normalised input looks like). A tensor whose size is already the one the model's input is
planned at (`Pictures.fit`: no resize needed) is used where it is, a CUDA tensor on the GPU
with no copy to the host; another size is resized on the host by the one preparation path, as
its lossless PNG would be. Either way the result equals the bytes path for the same pixels.
A tensor picture's ``image_id`` is the hash of its pixels (shape and bytes, computed from a
host copy of the uint8 levels); its ``image_bytes`` are the lossless PNG, made when asked for.
"""

from __future__ import annotations

import functools
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..serving.pictures import PreparedPixels, read_picture_file
from ..serving.uploads import image_id_of

# PNG's deflate level for images and arrays: 0 stores the pixels (a 224 px picture encodes in
# about 2 ms and decodes in 1 ms; level 6, Pillow's default, takes 20 ms, a fifth of a forward).
PNG_LEVEL = 0
_PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}

PICTURE_TYPES = (
    "a path, bytes, a PIL.Image, an HxWx3 uint8 array or a torch tensor of pixels [3,H,W] / [B,3,H,W] "
    "(uint8 0..255 or float 0..1)"
)


@dataclass(frozen=True)
class Picture:
    """One picture as the server would receive it: its bytes and a name (the upload's filename)."""

    data: bytes
    filename: str | None


class TensorPicture:
    """A tensor picture as a `Picture`: no name, its lossless PNG made when first asked for."""

    filename = None

    def __init__(self, levels: Any):
        self._levels = levels  # 3, H, W uint8, any device

    @functools.cached_property
    def data(self) -> bytes:
        return png_bytes(self._levels.cpu().permute(1, 2, 0).numpy())


@dataclass
class PreparedPicture:
    """One picture, read and prepared for the model (what the server holds after an upload)."""

    picture: Picture | TensorPicture
    prep: PreparedPixels
    image_id: str = ""

    def __post_init__(self) -> None:
        if not self.image_id:
            self.image_id = image_id_of(self.picture.data)


def is_tensor(image: Any) -> bool:
    """Whether ``image`` is a torch tensor (one picture ``[3, H, W]`` or a batch ``[B, 3, H, W]``)."""
    import torch

    return isinstance(image, torch.Tensor)


def tensor_pictures(t: Any) -> list[Any]:
    """A tensor of pixels -> one ``[3, H, W]`` uint8 tensor per picture, on the tensor's device.

    Raises:
        TypeError: a dtype other than uint8 or floating.
        ValueError: a shape other than ``[3, H, W]`` / ``[B, 3, H, W]``, an empty tensor, or
            float values outside 0..1 (a normalised input, or 0..255 values as floats).
    """
    import torch

    if t.dim() not in (3, 4) or t.shape[-3] != 3:
        hint = " (channels last? use t.permute(2, 0, 1))" if t.dim() == 3 and t.shape[-1] == 3 else ""
        raise ValueError(
            f"a tensor picture is [3, H, W] or [B, 3, H, W] (RGB, channels first); got {tuple(t.shape)}{hint}"
        )
    if t.numel() == 0:
        raise ValueError(f"a tensor picture is empty: shape {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        levels = t
    elif t.is_floating_point():
        lo, hi = float(t.min()), float(t.max())
        if not (lo >= 0.0 and hi <= 1.0):  # NaN fails too
            raise ValueError(
                f"a float tensor picture holds pixels in 0..1 (not the model's normalised input, not 0..255); "
                f"got values in {lo:.4g}..{hi:.4g}"
            )
        levels = (t.float() * 255.0).round_().to(torch.uint8)
    else:
        raise TypeError(f"a tensor picture is uint8 (0..255) or floating (0..1); got {t.dtype}")
    return list(levels) if levels.dim() == 4 else [levels]


def png_bytes(image: Any) -> bytes:
    """A ``PIL.Image`` or a ``uint8`` array as PNG bytes (lossless; the same bytes every time).

    Args:
        image: a ``PIL.Image.Image``, or a ``uint8`` numpy array ``HxWx3`` (RGB), ``HxWx4``
            (RGBA) or ``HxW`` (grey).

    Raises:
        TypeError: another type, or an array of another dtype.
        ValueError: an array of another shape.
    """
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = _array_image(image)
    if image.mode not in _PNG_MODES:  # CMYK, YCbCr, LAB, HSV, F...: what the server decodes to
        image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=PNG_LEVEL)
    return buf.getvalue()


def _array_image(a: Any):
    import numpy as np
    from PIL import Image

    if not isinstance(a, np.ndarray):
        raise TypeError(f"a picture is {PICTURE_TYPES}; got {type(a).__module__}.{type(a).__qualname__}")
    if a.dtype != np.uint8:
        raise TypeError(
            f"an array picture holds uint8 values (0..255); got {a.dtype}: convert it, e.g. "
            "(a * 255).round().clip(0, 255).astype(np.uint8) for values in 0..1"
        )
    if a.size == 0:
        raise ValueError(f"the array picture has no pixels (shape {a.shape}); it needs a height and width of 1 or more")
    if a.ndim == 2:
        return Image.fromarray(np.ascontiguousarray(a), "L")
    if a.ndim == 3 and a.shape[2] in (3, 4):
        return Image.fromarray(np.ascontiguousarray(a), "RGB" if a.shape[2] == 3 else "RGBA")
    hint = " (channels first? use a.transpose(1, 2, 0))" if a.ndim == 3 and a.shape[0] in (3, 4) else ""
    raise ValueError(f"an array picture is HxWx3 (RGB), HxWx4 (RGBA) or HxW (grey); got shape {a.shape}{hint}")


def picture(image: Any, max_file_bytes: int) -> Picture:
    """The bytes and name of one picture (see the module docstring for what it can be).

    Args:
        max_file_bytes: the largest file read from a path (``Settings.max_upload_bytes``).

    Raises:
        TypeError: not a picture type.
        ValueError: an unreadable file (`PictureFileError`, whose
            message names the file), an empty bytes object, an array of the wrong shape.
    """
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        try:
            return Picture(read_picture_file(path, max_file_bytes), path.name)
        except ValueError as e:  # PictureFileError: its message does not repeat the path
            raise type(e)(f"{path}: {e}", e.status, e.code) from None  # type: ignore[attr-defined]
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        if not data:
            raise ValueError("the picture's bytes are empty")
        return Picture(data, None)
    from PIL import Image

    if isinstance(image, Image.Image):
        name = getattr(image, "filename", None)
        return Picture(png_bytes(image), Path(name).name if name else None)
    return Picture(png_bytes(image), None)


def is_many(image: Any) -> bool:
    """Whether ``image`` is several pictures (a list, a tuple, a tensor ``[B, 3, H, W]``) rather than one."""
    return isinstance(image, (list, tuple)) or (is_tensor(image) and image.dim() == 4)
