"""Bytes -> RGB picture -> normalised tensor on the model's patch grid, in bounded memory.

The steps live here; :class:`app.serving.pictures.Pictures` puts them together for a model, and
every caller (server, survey, ``headscope extract``) goes through it.

Colour rule (documented in docs/images.md): EXIF orientation is applied; the first frame of an
animation is used; transparency is composited over white (alpha channels, a palette's
transparency, and the colour key of a grey, 16-bit grey or RGB PNG, ``tRNS``, which Pillow gives
as ``info["transparency"]``); 16-bit and 32-bit integer greyscale is scaled by 1/257 (full 16-bit
range to 0..255, values clipped); float greyscale is min-max stretched over its finite pixels (NaN
and -inf become the minimum, +inf the maximum; none finite: 422 ``corrupt_image``); every other
mode goes through Pillow's own conversion to RGB (CMYK, YCbCr, LAB, P, L, 1).

Memory. Decoding happens in two steps so that the server can refuse a picture before it costs
anything: :func:`probe` reads only the header and estimates the decode's peak memory
(:func:`peak_bytes`), and :func:`load` decodes. The pipeline keeps that peak close to the
decoded picture itself:

* **early reduction**: a picture more than ``GAP`` (3) times larger than what it will be
  resized to, along an axis, is first shrunk by an integer box filter (Pillow's ``reduce``;
  for JPEG, the decoder's DCT scaling through ``Image.draft``) to no less than ``GAP`` times
  the target, then resized as usual (bicubic). This is Pillow's own ``reducing_gap`` scheme
  (``reducing_gap=3`` is "indistinguishable from the standard resampling in most cases", its
  docs say); it also keeps the bicubic filter's coefficient tables small (resizing a 1 x
  40,000,000 picture to 672 pixels directly allocates 1.3 GB of them). A picture that needs no
  early reduction gives exactly the pixels it gave before.
* **tiles**: modes whose conversion needs temporaries (16-bit, 32-bit and float greyscale,
  transparency, a colour key) are converted tile by tile (256 K pixels each) into the RGB result, so no
  float64 copy of the whole picture ever exists; each tile is converted by the rule above
  exactly as the whole picture was (the float stretch uses the whole picture's extrema).

The estimate (:func:`peak_bytes`): the decoded picture (width x height x bytes per pixel of
its mode as Pillow stores it: 1 for 1/L/P, 2 for I;16, 4 otherwise), times 4 for WebP and
times 2 for TIFF (their decoders fill buffers of their own first: :data:`DECODER_FACTOR`; at the
default 512 MiB budget a WebP over about 32 megapixels is refused), plus the coefficient buffer of a
progressive JPEG (2 bytes per sample at full size), plus twice the RGB result after early
reduction (4 bytes per pixel: the result and its EXIF-rotated copy), plus 16 MiB for tiles and
the model input. ``tests/unit/serving/test_decode_memory.py`` decodes adversarial pictures in fresh
processes and checks the real peak stays under it.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..engine.batching import normal_table, normalise
from ..engine.cached import cached_property

ALLOWED_FORMATS = {"PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF"}
# Shrink by an integer factor first when a picture is more than GAP times its target size.
GAP = 3.0
TILE_PIXELS = 1 << 18
OVERHEAD_BYTES = 16 * 2**20
DISPLAY_MAX_SIDE = 1600
# Decoders that fill buffers of their own before Pillow copies the pixels: libwebp's animation
# decoder keeps two RGBA canvases and, for lossless files, its own ARGB rows (measured: 14.7
# bytes per pixel for a lossless 6000 x 6000 RGB WebP); libtiff may read through an RGBA buffer.
DECODER_FACTOR = {"WEBP": 4, "TIFF": 2}
# Bytes per pixel as Pillow stores a mode (image8 or image32 lines).
_STORED_BPP = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}
_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")
_INT_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

# (width, height) of the picture as shown -> (width, height) it will be resized to.
Fit = Callable[[int, int], tuple[int, int]]


def adopt_pixel_limit(max_pixels: int) -> None:
    """Make Pillow's decompression-bomb limit Headscope's, in a process Headscope runs.

    Pillow checks every ``Image.open`` against its process-wide ``Image.MAX_IMAGE_PIXELS`` (89 M
    pixels: a warning over it, an error over twice it) before :func:`probe` can check
    ``max_pixels``. Left alone, that refuses pictures a larger ``HEADSCOPE_MAX_IMAGE_PIXELS``
    allows and prints a warning for each bomb. The server's lifespan, ``headscope extract`` and
    ``survey`` (and its Ray actors) call this once; the Python API does not, as a library must
    not change its user's Pillow or warning filters (there Pillow's limit applies as the user
    set it, and a refusal by it says so). The filter is installed once, not per decode:
    ``warnings.catch_warnings`` is not thread-safe, and decodes run on several threads.

    Args:
        max_pixels: the process's ``max_image_pixels`` setting.
    """
    Image.MAX_IMAGE_PIXELS = max_pixels
    warnings.simplefilter("error", Image.DecompressionBombWarning)


class ImageError(ValueError):
    """An upload that is not a usable image; ``status`` and ``code`` go into the 4xx answer."""

    def __init__(self, message: str, status: int = 422, code: str = "bad_image"):
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass
class Probe:
    """A picture whose header has been read (and JPEG decoder scaling set); not decoded yet."""

    img: Image.Image
    fmt: str
    size: tuple[int, int]  # (width, height) as stored, before decoder scaling
    peak_bytes: int  # estimated peak memory of load(); see peak_bytes()
    fit: Fit | None = None
    max_pixels: int = 0


@dataclass
class Decoded:
    """An RGB picture, upright, perhaps shrunk early; ``image_size`` is the original's (height, width)."""

    img: Image.Image
    image_size: tuple[int, int]


class _Errors:
    """Translate whatever Pillow raises while opening or decoding into an :class:`ImageError`."""

    def __init__(self, max_pixels: int):
        self.max_pixels = max_pixels

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> Literal[False]:
        if exc is None or isinstance(exc, ImageError):
            return False
        if isinstance(exc, UnidentifiedImageError):
            raise ImageError(
                "the file is not an image Headscope can read (PNG, JPEG, WebP, GIF, BMP, TIFF)", 415, "not_an_image"
            ) from None
        if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
            raise ImageError(_bomb_message(exc, self.max_pixels), 413, "image_too_large") from None
        if isinstance(exc, (OSError, SyntaxError, ValueError, EOFError)):
            raise ImageError(
                f"the image could not be decoded (truncated or corrupt): {str(exc)[:120]}", 422, "corrupt_image"
            ) from None
        return False


def decode_errors(max_pixels: int | None = None) -> _Errors:
    """A context in which whatever Pillow raises while decoding becomes the :class:`ImageError`
    the preparation path gives (422 ``corrupt_image`` for a truncated file...): for pictures
    decoded elsewhere (a ``PIL.Image`` opened lazily, given to the Python API).

    Args:
        max_pixels: the limit a decompression bomb's message names (default: Pillow's).
    """
    return _Errors(max_pixels if max_pixels is not None else (Image.MAX_IMAGE_PIXELS or 0))


def _bomb_message(exc: Exception, max_pixels: int) -> str:
    """Name the limit that refused the picture (Headscope's, or Pillow's where that is lower) and
    the picture's size where Pillow's words give it ("Image size (N pixels) exceeds ...")."""
    found = re.search(r"\((\d+) pixels\)", str(exc))
    image = f"image of {int(found.group(1)):,} pixels" if found else "image"
    pillow = Image.MAX_IMAGE_PIXELS
    if pillow is not None:
        twice = isinstance(exc, Image.DecompressionBombError)  # Pillow's error is at twice its limit
        limit = 2 * pillow if twice else pillow
        if limit < max_pixels:
            return (
                f"{image} is over Pillow's limit in this process ({limit:,} pixels: "
                f"{'twice ' if twice else ''}PIL.Image.MAX_IMAGE_PIXELS), below Headscope's {max_pixels:,} "
                "(decompression bomb?)"
            )
    return f"{image} is over the limit of {max_pixels:,} pixels (decompression bomb?)"


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception:  # a broken EXIF block is not worth refusing the picture for
        return 1


def _stored_target(size: tuple[int, int], orientation: int, fit: Fit) -> tuple[int, int]:
    """What ``fit`` makes of a stored ``size``, in stored axes (EXIF 5-8 swap the axes)."""
    swap = orientation in (5, 6, 7, 8)
    w, h = size
    tw, th = fit(h, w) if swap else fit(w, h)
    return (th, tw) if swap else (tw, th)


def _factors(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """Pillow's ``reducing_gap`` rule: shrink by ``int(in / (out * GAP))`` per axis, at least 1."""
    return tuple(max(1, int(n / (max(1, t) * GAP))) for n, t in zip(size, target))  # type: ignore[return-value]


def _raw_mode(img: Image.Image) -> str | None:
    """The raw mode the file stores its pixels in (a PNG's ``RGBA;16B``, ``L;4``), known until the
    picture is decoded (``ImageFile.tile``); None when there is none."""
    try:
        args = getattr(img, "tile", [])[0][3]
        return args if isinstance(args, str) else str(args[0])
    except (IndexError, TypeError):
        return None


def _file_bytes_per_pixel(img: Image.Image) -> int:
    """Bytes per pixel of a PNG's rows in the file, from its raw mode (``RGBA;16B``: 8)."""
    raw = _raw_mode(img)
    if raw is None:
        return 8
    base = raw.split(";")[0]
    return max(1, len(base)) * (2 if "16" in raw else 1)


def peak_bytes(
    fmt: str,
    mode: str,
    size: tuple[int, int],
    full_size: tuple[int, int],
    factors: tuple[int, int],
    info: dict,
    row_bytes: int = 0,
) -> int:
    """Estimated peak memory of decoding and converting a picture (see the module docstring).

    Args:
        fmt: the file format.
        mode: the decoded mode.
        size: (width, height) the decoder produces (after JPEG scaling).
        full_size: (width, height) as stored in the file.
        factors: the early reduction per axis.
        info: Pillow's ``info`` (progressive JPEGs).
        row_bytes: bytes of one row in the file (PNG: the decoder keeps two).
    """
    w, h = size
    decoded = w * h * _STORED_BPP.get(mode, 4)
    decoded *= DECODER_FACTOR.get(fmt, 1)
    if fmt in ("JPEG", "MPO") and (info.get("progressive") or info.get("progression")):
        decoded += full_size[0] * full_size[1] * len(mode) * 2
    out = math.ceil(w / factors[0]) * math.ceil(h / factors[1]) * 4
    return decoded + 2 * row_bytes + 2 * out + OVERHEAD_BYTES


def probe(data: bytes, max_pixels: int, fit: Fit | None = None) -> Probe:
    """Read the header: format, size and mode checks, JPEG decoder scaling, the peak estimate.

    Args:
        data: the uploaded file's bytes.
        max_pixels: refuse images with more pixels than this (decompression bombs).
        fit: what the picture will be resized to (:meth:`app.serving.pictures.Pictures.fit`);
            enables early reduction. None decodes at full size (the page's display picture
            has a fit of its own, :func:`display_fit`).
    """
    if not data:
        raise ImageError("the uploaded file is empty", 422, "empty_file")
    with _Errors(max_pixels):
        img: Image.Image = Image.open(io.BytesIO(data))
        fmt = img.format or "unknown"
        if fmt not in ALLOWED_FORMATS:
            raise ImageError(
                f"image format {fmt} is not supported; send PNG, JPEG, WebP, GIF, BMP or TIFF",
                415,
                "unsupported_format",
            )
        w, h = img.size
        _check_size(w, h, max_pixels)
        # An animation opens on its first frame, the one used.
        full = img.size
        factors = (1, 1)
        if fit is not None:
            if fmt in ("JPEG", "MPO"):
                # DCT scaling: the decoder itself produces 1/2, 1/4 or 1/8 of the size, no less
                # than GAP times the target (Image.thumbnail does the same with its gap). A
                # JPEG's EXIF comes before its pixels; a PNG's may come after them (getexif()
                # would decode the picture), hence only here.
                target = _stored_target(full, _orientation(img), fit)
                img.draft(None, (int(target[0] * GAP), int(target[1] * GAP)))
            # The orientation may only be known once decoded (PNG eXIf after the pixels): the
            # estimate takes the smaller reduction of the two orientations.
            factors = tuple(  # type: ignore[assignment]
                min(a, b)
                for a, b in zip(
                    _factors(img.size, _stored_target(full, 1, fit)), _factors(img.size, _stored_target(full, 6, fit))
                )
            )
        row = full[0] * _file_bytes_per_pixel(img) if fmt == "PNG" else 0
        peak = peak_bytes(fmt, img.mode, img.size, full, factors, img.info, row)
    return Probe(img, fmt, full, peak, fit, max_pixels)


def _check_size(w: int, h: int, max_pixels: int) -> None:
    if w * h > max_pixels:
        raise ImageError(
            f"image of {w} x {h} pixels is over the limit of {max_pixels:,} pixels: make it smaller first (the model "
            "sees it at a few hundred pixels a side), or raise the limit (HEADSCOPE_MAX_IMAGE_PIXELS)",
            413,
            "image_too_large",
        )
    if w < 1 or h < 1:
        raise ImageError("the image has no pixels", 422, "corrupt_image")


def load(p: Probe) -> Decoded:
    """Decode a probed picture into upright RGB, shrunk early when its ``fit`` allows."""
    img = p.img
    with _Errors(p.max_pixels):
        key_in_decoded_units(img)
        img.load()
        orientation = _orientation(img)
        factors = _factors(img.size, _stored_target(p.size, orientation, p.fit)) if p.fit else (1, 1)
        if factors != (1, 1):
            img = _reduce_rgb(img, factors)
        else:
            img = to_rgb(img)
        if orientation in _TRANSPOSE:
            img = img.transpose(_TRANSPOSE[orientation])
    if img.width < 1 or img.height < 1:
        raise ImageError("the image has no pixels", 422, "corrupt_image")
    w, h = p.size
    return Decoded(img, (w, h) if orientation in (5, 6, 7, 8) else (h, w))


def from_image(img: Image.Image, max_pixels: int, fit: Fit) -> Decoded:
    """A picture already decoded (a ``PIL.Image`` in memory) as :func:`load` gives its lossless PNG.

    The same checks (size, the pixel limit), the same colour rule and the same early reduction
    as probing and loading the image's PNG, without encoding and decoding it. No EXIF
    orientation is applied (the image is taken as its pixels are; its PNG carries no EXIF
    either) and there is no decoder scaling (a PNG has none). ``img`` is not changed.

    Args:
        img: the picture, in a mode a PNG holds (``1``, ``L``, ``LA``, ``I;16``, ``P``,
            ``RGB``, ``RGBA``; other modes are converted by the same rule, as a decoded file's).
        max_pixels: refuse images with more pixels than this.
        fit: what the picture will be resized to (:meth:`app.serving.pictures.Pictures.fit`).
    """
    w, h = img.size
    _check_size(w, h, max_pixels)
    with _Errors(max_pixels):
        factors = _factors(img.size, fit(w, h))
        out = _reduce_rgb(img, factors) if factors != (1, 1) else to_rgb(img)
    return Decoded(out, (h, w))


# -- colour ------------------------------------------------------------------------------
def _tiles(size: tuple[int, int], factors: tuple[int, int] = (1, 1)) -> Iterator[tuple[int, int, int, int]]:
    """Boxes of about ``TILE_PIXELS`` covering ``size``, aligned to the reduction blocks."""
    w, h = size
    fx, fy = factors
    tw = fx * max(1, int(math.sqrt(TILE_PIXELS)) // fx)
    th = fy * max(1, TILE_PIXELS // tw // fy)
    for y in range(0, h, th):
        for x in range(0, w, tw):
            yield x, y, min(w, x + tw), min(h, y + th)


def _tile_to_rgb(img: Image.Image, float_range: tuple[float, float] | None = None) -> Image.Image:
    """The colour rule for one picture (or tile): see the module docstring."""
    mode = img.mode
    key = _colour_key(img)
    if mode == "RGB" and key is None:
        return img
    if mode in _INT_GREY:
        a = np.asarray(img.convert("I"), dtype=np.float64)
        grey = np.clip(a / 257.0, 0, 255).round().astype(np.uint8)
        if key is not None:
            grey[a == key] = 255  # the colour key's pixels: transparent, over white
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "F":
        a = np.asarray(img, dtype=np.float64)
        lo, hi = float_range if float_range is not None else _finite_range([a])
        a = np.nan_to_num(a, nan=lo, posinf=hi, neginf=lo)
        a = (a - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(a)
        return Image.fromarray(a.round().astype(np.uint8), "L").convert("RGB")
    if (mode == "P" and "transparency" in img.info) or key is not None:
        img = img.convert("RGBA")  # Pillow honours the palette's transparency, or the colour key
        mode = "RGBA"
    if mode in _ALPHA:
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB")


def _colour_key(img: Image.Image) -> int | tuple[int, int, int] | None:
    """The colour key of a grey or RGB picture (a PNG's ``tRNS``: the one value, or RGB colour,
    whose pixels are transparent), as Pillow gives it in ``info["transparency"]``; None for
    other modes, no key, or a key of another shape."""
    key = img.info.get("transparency")
    if img.mode in ("1", "L", *_INT_GREY) and isinstance(key, int) and not isinstance(key, bool):
        return key
    if img.mode == "RGB" and isinstance(key, tuple) and len(key) == 3 and all(isinstance(v, int) for v in key):
        return key
    return None


def key_in_decoded_units(img: Image.Image) -> None:
    """Put a PNG's colour key (``info["transparency"]``) in the units of the pixels Pillow will
    decode, while the file's raw mode is still known (before ``load()``): Pillow scales 2- and
    4-bit grey to 0..255 but leaves the key as stored, and decodes 16-bit RGB to its high bytes
    while the key keeps 16 bits (no pixel can be matched exactly: the key is dropped, as Pillow's
    own conversion ignores it)."""
    key = img.info.get("transparency")
    raw = _raw_mode(img)
    if key is None or raw is None or img.format != "PNG":
        return
    if img.mode == "L" and isinstance(key, int) and raw in ("L;2", "L;4"):
        bits = int(raw[-1])
        img.info["transparency"] = key * 255 // (2**bits - 1)
    elif img.mode == "RGB" and raw.startswith("RGB;16"):
        del img.info["transparency"]


def _needs_tiles(img: Image.Image) -> bool:
    return (
        img.mode in _INT_GREY
        or img.mode in ("F", *_ALPHA)
        or (img.mode == "P" and "transparency" in img.info)
        or _colour_key(img) is not None
    )


def _finite_range(arrays: Iterable[np.ndarray]) -> tuple[float, float]:
    """The extrema of the finite values of ``arrays`` (a float picture's tiles, or the whole of
    it), which the picture is stretched by; :class:`ImageError` (422 ``corrupt_image``) when
    none of its pixels is finite (nothing to stretch by)."""
    lo, hi = math.inf, -math.inf
    for a in arrays:
        finite = np.isfinite(a)
        if not finite.all():
            a = a[finite]  # NaN and infinities take no part in the stretch
        if a.size:
            lo, hi = min(lo, float(a.min())), max(hi, float(a.max()))
    if lo > hi:
        raise ImageError("the float image has no finite pixel (all NaN or infinite)", 422, "corrupt_image")
    return lo, hi


def _float_range(img: Image.Image) -> tuple[float, float] | None:
    """The extrema a float picture is stretched by: of its finite pixels over the whole picture,
    found tile by tile (:func:`_finite_range`)."""
    if img.mode != "F":
        return None
    return _finite_range(np.asarray(img.crop(box)) for box in _tiles(img.size))


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB by the rule in this module's docstring.

    Modes whose conversion needs temporaries are converted tile by tile into the result; the
    pixels are those of converting the whole picture at once.
    """
    if img.mode == "RGB" and _colour_key(img) is None:
        return img
    if not _needs_tiles(img) or img.width * img.height <= TILE_PIXELS:
        return _tile_to_rgb(img)
    rng = _float_range(img)
    out = Image.new("RGB", img.size)
    for box in _tiles(img.size):
        out.paste(_tile_to_rgb(img.crop(box), rng), box[:2])
    return out


def _reduce_rgb(img: Image.Image, factors: tuple[int, int]) -> Image.Image:
    """Convert to RGB and shrink by the integer ``factors`` (box filter), tile by tile.

    The tiles are aligned to the reduction's blocks, so the result equals reducing the whole
    converted picture; only a tile's worth of converted pixels exists at a time.
    """
    if img.mode in ("RGB", "L") and _colour_key(img) is None:
        return to_rgb(img.reduce(factors))  # reduced in place of its own mode: no copy
    fx, fy = factors
    rng = _float_range(img)
    out = Image.new("RGB", (math.ceil(img.width / fx), math.ceil(img.height / fy)))
    for box in _tiles(img.size, factors):
        out.paste(_tile_to_rgb(img.crop(box), rng).reduce(factors), (box[0] // fx, box[1] // fy))
    return out


# -- to the model ------------------------------------------------------------------------
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


def display_fit(width: int, height: int, max_side: int = DISPLAY_MAX_SIDE) -> tuple[int, int]:
    """The :data:`Fit` of :func:`display_png`: the longer side at most ``max_side``."""
    k = min(1.0, max_side / max(width, height))
    return max(1, round(width * k)), max(1, round(height * k))


@dataclass
class PreparedPixels:
    """A picture resized for the model: its uint8 pixels (what goes to the device) and sizes.

    ``pixels`` is the normalised float32 input on the host, computed from ``raw`` when first
    asked for (the batch runner normalises on the device instead, to the same values).
    """

    raw: torch.Tensor  # 3, H, W uint8: the resized RGB picture
    input_size: tuple[int, int]  # H, W
    image_size: tuple[int, int]  # H, W of the picture as sent (before any early reduction)
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    @cached_property
    def pixels(self) -> torch.Tensor:
        """The normalised input ``[3, H, W]`` float32 on the host."""
        return normalise(self.raw, normal_table(self.mean, self.std))


def prepare(
    img: Image.Image,
    input_size,
    patch,
    mean,
    std,
    mode="aspect",
    max_aspect=3.0,
    dynamic=True,
    image_size: tuple[int, int] | None = None,
) -> PreparedPixels:
    """Resize (bicubic; untouched when already the right size) and normalise an RGB picture.

    Args:
        image_size: (height, width) of the picture as sent, when ``img`` was shrunk early
            (:func:`load`); the model input is planned from it.
    """
    image_size = image_size or (img.height, img.width)
    H, W = plan_size(image_size[1], image_size[0], input_size, patch, mode, max_aspect, dynamic)
    resized = img if (img.height, img.width) == (H, W) else img.resize((W, H), Image.Resampling.BICUBIC)
    a: np.ndarray = np.asarray(resized, dtype=np.uint8)  # H, W, 3
    raw = torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))  # 3, H, W
    # normalised where it is used (engine/batching.py: the same float32 values on every device)
    return PreparedPixels(raw, (H, W), image_size, tuple(mean), tuple(std))


def display_png(img: Image.Image, max_side: int = DISPLAY_MAX_SIDE) -> bytes:
    """The picture as PNG for the page, at most ``max_side`` pixels on its longer side."""
    if max(img.size) > max_side:
        img = img.copy()
        img.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=3)
    return buf.getvalue()
