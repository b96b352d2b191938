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
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..serving.pictures import Prepared, read_picture_file
from ..serving.uploads import image_id_of

# PNG's deflate level for images and arrays: 0 stores the pixels (a 224 px picture encodes in
# about 2 ms and decodes in 1 ms; level 6, Pillow's default, takes 20 ms, a fifth of a forward).
PNG_LEVEL = 0
_PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}

PICTURE_TYPES = "a path, bytes, a PIL.Image or an HxWx3 uint8 array"


@dataclass(frozen=True)
class Picture:
    """One picture as the server would receive it: its bytes and a name (the upload's filename)."""

    data: bytes
    filename: str | None


@dataclass
class Prepped:
    """One picture, read and prepared for the model (what the server holds after an upload)."""

    picture: Picture
    prep: Prepared
    image_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.image_id = image_id_of(self.picture.data)


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
    """Whether ``image`` is a list (or tuple) of pictures rather than one picture."""
    return isinstance(image, (list, tuple))
