"""Bytes -> the model's input tensor: the one way a picture reaches a model.

The server (uploads, ablation, every follow-up), the survey (both engines), ``headscope extract``
and in-process callers all prepare pictures through :class:`Pictures`, so a picture gives the
same pixels, hence the same maps and statistics, whichever way it comes in:

1. :meth:`Pictures.probe` reads the header (format, size, the decompression-bomb limit) and
   estimates the decode's peak memory, which the server reserves before going on;
2. :meth:`Pictures.finish` decodes upright RGB with the **early reduction** of
   :mod:`app.serving.preprocess` (a picture more than 3x its target size along an axis is first
   shrunk by an integer box filter, or by the JPEG decoder's DCT scaling, to no less than 3x the
   target), then resizes it (bicubic) to the input size planned from the picture's *original*
   size, and normalises it with the model's mean and std.

:meth:`Pictures.prepare` does both. :meth:`Pictures.prepare_image` takes a picture already in
memory (a ``PIL.Image`` given to the Python API) through the same steps after the decode, so it
gives exactly what its lossless PNG would. Nothing else decodes pictures: the page's display PNG
(:func:`display_probe`, :func:`display_finish`) is the one other use, with a fit of its own
(:func:`app.serving.preprocess.display_fit`).

Pictures that come from files (the survey, ``headscope extract``, in-process callers given paths)
are read by :func:`read_picture_file`, the one way a picture file becomes bytes: a regular file
only (a FIFO, a device or a socket is refused without being opened, so nothing blocks on it), no
larger than the server's upload limit (refused before a byte is read), then its bytes.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..outputs import file_kind
from . import preprocess
from .preprocess import ImageError, PreparedPixels, Probe

if TYPE_CHECKING:
    from PIL import Image

    from ..config import Settings
    from ..engine.model import LoadedModel

__all__ = [
    "ImageError",
    "PictureFileError",
    "Pictures",
    "PreparedPixels",
    "Probe",
    "display_finish",
    "display_probe",
    "picture_png",
    "read_picture_file",
]


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
        h, w = preprocess.plan_size(
            width, height, self.input_size, self.patch_size, self.resize, self.max_aspect, self.dynamic
        )
        return w, h

    def probe(self, data: bytes) -> Probe:
        """Read the header; raises :class:`ImageError` (4xx) for what cannot be a picture."""
        return preprocess.probe(data, self.max_pixels, self.fit)

    def finish(self, probe: Probe) -> PreparedPixels:
        """Decode a probed picture (early reduction included), resize and normalise it."""
        return self._normalised(preprocess.load(probe))

    def prepare(self, data: bytes) -> PreparedPixels:
        """Bytes -> the normalised input tensor ``[3, H, W]`` with its input and image sizes."""
        return self.finish(self.probe(data))

    def prepare_image(self, img: Image.Image) -> PreparedPixels:
        """A picture in memory (a ``PIL.Image``) -> what :meth:`prepare` gives for its lossless
        PNG, pixel for pixel, without encoding and decoding it (no EXIF orientation applied:
        :func:`app.serving.preprocess.from_image`); raises :class:`ImageError` as it would."""
        return self._normalised(preprocess.from_image(img, self.max_pixels, self.fit))

    def _normalised(self, dec: preprocess.Decoded) -> PreparedPixels:
        """A decoded picture resized to the model's input plan and normalised."""
        return preprocess.prepare(
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


def picture_png(img: Image.Image, level: int = 0) -> bytes:
    """A picture in memory as lossless PNG bytes whose preparation gives what
    :meth:`Pictures.prepare_image` gives for ``img``: its own mode where a PNG holds it; 32-bit
    integer grey (mode ``I``, which Pillow cannot write as PNG) by the colour rule first.

    Args:
        level: deflate level (0: stored, the fastest).
    """
    if img.mode == "I":
        img = preprocess.to_rgb(img)
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=level)
    return buf.getvalue()


def display_probe(data: bytes, max_pixels: int) -> Probe:
    """Read the header of a picture shown on the page (longer side at most 1600 pixels)."""
    return preprocess.probe(data, max_pixels, preprocess.display_fit)


def display_finish(probe: Probe) -> bytes:
    """The probed picture as the page's PNG (early reduction to its display size included)."""
    return preprocess.display_png(preprocess.load(probe).img)


class PictureFileError(ImageError):
    """A picture file that cannot be read; :attr:`code` says why.

    Codes: ``not_found`` (no such file, or a symbolic link to none), ``symlink_loop``,
    ``not_a_file`` (a folder, FIFO, socket or device), ``permission_denied``,
    ``file_too_large`` (over the size limit; status 413), ``empty_file``, ``read_error``
    (any other error of the system), ``url`` (a URL given as a path: the Python API reads no
    URLs). The message does not repeat the path: callers name the file themselves.
    """


def _os_error(e: OSError) -> PictureFileError:
    if e.errno == errno.ENOENT:
        return PictureFileError("no such file (or a symbolic link to a missing file)", code="not_found")
    if e.errno == errno.ELOOP:
        return PictureFileError("a loop of symbolic links", code="symlink_loop")
    if e.errno in (errno.EACCES, errno.EPERM):
        return PictureFileError("permission denied", code="permission_denied")
    if e.errno == errno.EISDIR:
        return PictureFileError("not a regular file: a folder", code="not_a_file")
    return PictureFileError(f"cannot read it: {e.strerror or type(e).__name__}", code="read_error")


def _check(st: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise PictureFileError(f"not a regular file: {file_kind(st.st_mode)}", code="not_a_file")
    if st.st_size > max_bytes:
        raise PictureFileError(
            f"{st.st_size:,} bytes, over the {max_bytes:,}-byte limit (HEADSCOPE_MAX_UPLOAD_BYTES)",
            413,
            "file_too_large",
        )


def read_picture_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of a picture file, read safely: the one way a picture file is read.

    Symbolic links to files are followed. What is not a regular file (a FIFO, a device, a socket,
    a folder) is refused from its ``stat`` without being opened, so a FIFO cannot block the
    caller; a file over ``max_bytes`` is refused before a byte is read (a sparse 2 GiB file costs
    nothing). The file is then opened without blocking and checked again on the open descriptor
    (it may have been replaced meanwhile), and at most ``max_bytes`` are read (it may have grown).

    Args:
        path: the file.
        max_bytes: the largest file accepted (``Settings.max_upload_bytes``, the server's upload
            limit, 20 MiB by default: a file is refused where an upload of it would be).

    Raises:
        PictureFileError: the file is missing, not a regular file, unreadable, empty or too
            large; ``code`` says which.
    """
    path = Path(path)
    try:
        _check(path.stat(), max_bytes)  # follows links; a FIFO or device is never opened
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _os_error(e) from None
    try:
        _check(os.fstat(fd), max_bytes)  # the file opened, in case it changed since the stat
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        left = max_bytes + 1  # one byte more tells a file that grew past the limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise _os_error(e) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise PictureFileError(f"over the {max_bytes:,}-byte limit (HEADSCOPE_MAX_UPLOAD_BYTES)", 413, "file_too_large")
    if not data:
        raise PictureFileError("the file is empty", code="empty_file")
    return data
