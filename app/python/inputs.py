"""What the Python API takes as a picture, and how each kind reaches the one preparation path.

A picture is a path (``str`` or ``os.PathLike``), the file's bytes, a ``PIL.Image.Image``, an
``HxWx3`` numpy array (``HxWx4`` RGBA and ``HxW`` grey too; ``uint8`` 0..255, or floating 0..1
quantised as a tensor's are) or a torch tensor. Every kind is
prepared by the server's one preparation path (`Pictures`), so a picture gives the same pixels
whichever way it comes in:

* **paths and bytes** go the server's way (`Picture`): paths are read as the survey and
  ``headscope extract`` read them (`read_picture_file`: regular files only, at most
  ``HEADSCOPE_MAX_UPLOAD_BYTES``), bytes are taken as they are, decoded upright (EXIF
  orientation applied); ``image_id`` is the id the server gives the same bytes.
* **images and arrays** (`ImagePicture`) are used as they are, not encoded and decoded again:
  `Pictures.prepare_image` applies to the image in memory exactly what decoding its lossless
  PNG (`png_bytes`) would give, pixel for pixel (the same mode rules, the same early reduction
  and resize). An image is taken as its pixels are: an EXIF orientation a ``PIL.Image`` carries
  is not applied (``ImageOps.exif_transpose`` first where it should be). Modes a PNG cannot hold
  (CMYK, YCbCr, LAB, HSV, F, PA, ...) go through Pillow's ``convert("RGB")`` first, as
  `png_bytes` does; 16-bit grey of another byte order (``I;16B``: a big-endian TIFF) is taken
  as ``I;16`` of the same levels; 32-bit integer grey (``I``), which Pillow cannot write as PNG, goes through
  the server's colour rule for a decoded 32-bit grey file (scaled by 1/257, clipped), and its
  PNG is of the converted pixels (`picture_png`); a palette image whose palette has alpha is
  taken as RGBA (its PNG holds that alpha as transparency). The image is copied once (a
  snapshot: changing it afterwards changes no result). Its ``image_id`` is the
  hash of its pixels (`pixels_id`: an RGB image, an ``HxWx3`` array and the tensor of the same
  pixels share it), not the PNG's upload id: encoding a 640 x 480 photo as PNG takes longer
  than preparing it. Its ``image_bytes`` are the lossless PNG, made when first asked for.
* **a tensor** (`TensorPicture`) is pixels, channels first: ``[3, H, W]`` for one picture,
  ``[B, 3, H, W]`` for ``B`` of them (one result each), RGB, **not** the model's normalised
  input: ``uint8`` levels 0..255, or floating values 0..1 (quantised to the 256 levels,
  ``round(x * 255)``, on the tensor's own device, as a picture file stores them). Anything else
  is refused (`tensor_pictures`: a wrong shape, dtype, an empty tensor, values outside 0..1,
  which is what a normalised input looks like). A tensor whose size is already the one the
  model's input is planned at (`Pictures.fit`: no resize needed) is used where it is, a CUDA
  tensor computed on the GPU with no round trip through the host; another size is resized on
  the host by the one preparation path, as an RGB image of its pixels. Either way the result
  equals the bytes path for the same pixels. Its ``image_id`` is `pixels_id` of its levels, read
  from one host copy of the batch's uint8 levels made when an id is first needed (an attention
  result asks only when read; the other calls' results at once: 150 KB a 224 x 224 picture);
  its ``image_bytes`` are the lossless PNG, made when asked for.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.cached import cached_property
from ..paths import is_url
from ..serving.pictures import PictureFileError, PreparedPixels, picture_png, read_picture_file
from ..serving.preprocess import decode_errors, key_in_decoded_units
from ..serving.uploads import IMAGE_ID_HEX_CHARS, image_id_of

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from ..serving.pictures import Pictures

# PNG's deflate level for images and arrays: 0 stores the pixels (a 224 px picture encodes in
# about 2 ms and decodes in 1 ms; level 6, Pillow's default, takes 20 ms, a fifth of a forward).
PNG_LEVEL = 0
_PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}
_GREY16_ORDERS = {"I;16B", "I;16L", "I;16N"}  # 16-bit grey as I;16 (its PNG's mode)

PICTURE_TYPES = (
    "a path, bytes, a PIL.Image, an HxWx3 array or a torch tensor of pixels [3,H,W] / [B,3,H,W] "
    "(uint8 0..255 or float 0..1)"
)


@dataclass(frozen=True)
class Picture:
    """One picture as the server would receive it: its bytes and a name (the upload's filename)."""

    data: bytes
    filename: str | None

    @cached_property
    def image_id(self) -> str:
        """The server's id of these bytes."""
        return image_id_of(self.data)

    def prepared(self, pictures: Pictures) -> PreparedPixels:
        """The model's input, as the server prepares these bytes."""
        return pictures.prepare(self.data)


class ImagePicture:
    """A ``PIL.Image`` or an array as a picture: prepared from its pixels, its PNG made when asked.

    Args:
        image: the picture in a mode a PNG holds (`stored_image`), a snapshot of its own.
        filename: the name of the file it was opened from, if any.
    """

    def __init__(self, image: PILImage.Image, filename: str | None = None):
        self.image = image
        self.filename = filename

    @cached_property
    def data(self) -> bytes:
        """The lossless PNG of the image (what `png_bytes` gives)."""
        return _png(self.image)

    @cached_property
    def image_id(self) -> str:
        return pixels_id(self.image)

    def prepared(self, pictures: Pictures) -> PreparedPixels:
        """What `Picture.prepared` gives for `data`, without encoding and decoding it."""
        return pictures.prepare_image(self.image)


class TensorPicture:
    """A tensor picture: no name, its lossless PNG made when first asked for.

    Args:
        levels: ``[3, H, W]`` uint8 on any device (a picture of `tensor_pictures`).
        batch: the `TensorBatch` this picture is picture ``index`` of: its host copy and its id
            come from there (made for the whole batch when the first is asked for).
        index: its place in ``batch``.
    """

    filename = None

    def __init__(self, levels: Any, batch: TensorBatch | None = None, index: int = 0):
        self._levels = levels  # 3, H, W uint8, any device
        self._batch = batch
        self._index = index

    @cached_property
    def _host(self) -> Any:
        if self._batch is not None:
            return self._batch.host(self._index)
        return self._levels.cpu()

    @cached_property
    def data(self) -> bytes:
        return png_bytes(self._host.permute(1, 2, 0).numpy())

    @cached_property
    def image_id(self) -> str:
        if self._batch is not None:
            return self._batch.image_id(self._index)
        _, H, W = self._levels.shape
        return _rgb_id(H, W, self._host.numpy())

    def prepared(self, pictures: Pictures) -> PreparedPixels:
        """The levels where they are when no resize is needed, else resized on the host as an
        RGB image of the same pixels (what the bytes path gives for its PNG)."""
        from PIL import Image

        _, H, W = self._levels.shape
        if pictures.fit(W, H) == (W, H):
            return PreparedPixels(self._levels, (H, W), (H, W), pictures.mean, pictures.std)
        hwc = self._host.permute(1, 2, 0).contiguous().numpy()  # H, W, 3
        return pictures.prepare_image(Image.fromarray(hwc, "RGB"))


class TensorBatch:
    """The pictures of one ``[B, 3, H, W]`` tensor as they were when the call was made (`own_levels`:
    one copy on their device, since a caller's buffer may hold the next pictures by the time a
    result recomputes its capture or hashes its id), each picture a view of it. Their host copy
    and their ids are made when first asked for, for the whole batch at once: a call that reads
    neither spends nothing on them (on a GPU no copy to the host, no hashing threads beside the
    thread that dispatches the forward).

    Args:
        levels: ``[B, 3, H, W]`` uint8 on any device, contiguous and the batch's own (`own_levels`).
        threads: most threads hashing the ids, each a run of pictures (fewer for a small batch:
            below ``THREAD_BYTES`` a run is hashed on the thread that reads the first id).
    """

    THREAD_BYTES = 2 * 2**20  # a thread costs more than hashing less than this saves

    def __init__(self, levels: Any, threads: int = 1):
        if not levels.is_contiguous():
            raise ValueError("TensorBatch takes contiguous levels of its own (own_levels)")
        self.batch = levels  # B, 3, H, W
        self.levels = list(self.batch.unbind(0))
        _, _, self.H, self.W = self.batch.shape
        self.threads = threads
        self._hosts: list[Any] | None = None
        self._ids: list[str] | None = None
        self._lock = threading.RLock()

    def _host_all(self) -> list[Any]:
        with self._lock:
            if self._hosts is None:
                self._hosts = self.levels if self.batch.device.type == "cpu" else list(self.batch.cpu().unbind(0))
            return self._hosts

    def host(self, i: int) -> Any:
        """Picture ``i``'s levels on the host (the whole batch copied there when first asked)."""
        return self._host_all()[i]

    def image_id(self, i: int) -> str:
        """Picture ``i``'s id (`pixels_id` of its levels); every picture's is hashed when the first
        is asked for, on threads for a large batch."""
        with self._lock:
            if self._ids is None:
                self._ids = self._hash_all()
            return self._ids[i]

    def _hash_all(self) -> list[str]:
        hosts = self._host_all()
        B = len(hosts)
        n = max(1, min(self.threads, B, (B * hosts[0].numel()) // self.THREAD_BYTES))
        run = -(-B // n)  # pictures per thread

        def hashed(idx: range) -> list[str]:
            return [_rgb_id(self.H, self.W, hosts[i].numpy()) for i in idx]

        runs = [range(s, min(s + run, B)) for s in range(0, B, run)]
        if n == 1:
            return hashed(runs[0])
        with ThreadPoolExecutor(n, thread_name_prefix="headscope-ids") as pool:
            return [i for part in pool.map(hashed, runs) for i in part]

    def pictures(self) -> list[TensorPicture]:
        """One `TensorPicture` per picture, in order."""
        return [TensorPicture(lv, self, i) for i, lv in enumerate(self.levels)]


@dataclass
class PreparedPicture:
    """One picture, read and prepared for the model (what the server holds after an upload)."""

    picture: Picture | ImagePicture | TensorPicture
    prep: PreparedPixels

    @property
    def image_id(self) -> str:
        """The picture's id, computed when first read (a tensor batch's are hashed meanwhile)."""
        return self.picture.image_id


def _rgb_id(height: int, width: int, *chw: Any) -> str:
    """`image_id_of` the size line and the levels ``chw``: a uint8 array ``[3, H, W]`` (hashed
    where it is when contiguous), or its bytes in parts, in order (an image's channel planes)."""
    import numpy as np

    h = hashlib.sha256(f"pixels {height}x{width}\n".encode())
    for part in chw:
        h.update(part if isinstance(part, bytes) else np.ascontiguousarray(part).data)
    return h.hexdigest()[:IMAGE_ID_HEX_CHARS]


def pixels_id(image: PILImage.Image) -> str:
    """The id of a picture given as pixels: the hash of its size and its levels.

    An RGB image hashes its levels channels first, as a ``[3, H, W]`` uint8 tensor of the same
    pixels does (both get one id); another mode hashes its mode, size, stored bytes, palette
    and transparency.
    """
    W, H = image.size
    if image.mode == "RGB":
        # The channel planes in order are the [3, H, W] levels' bytes: hashed plane by plane
        # without a transposed copy (0.8 ms for a 640 x 480 photo, where the copy and its hash took 2).
        return _rgb_id(H, W, *(plane.tobytes() for plane in image.split()))
    extra = b""
    if image.mode == "P":
        pal = image.palette
        extra = (pal.mode.encode() + bytes(pal.palette)) if pal is not None else b""
    extra += repr(image.info.get("transparency")).encode()
    return image_id_of(f"pixels {image.mode} {H}x{W}\n".encode() + image.tobytes() + extra)


_reading = threading.Lock()  # the caller's PIL images are read under it (stored_image)


def stored_image(image: Any) -> PILImage.Image:
    """A ``PIL.Image`` or array as the image its lossless PNG holds, a copy of its own.

    A lazily opened file is decoded here, once: what Pillow raises doing it (a truncated file)
    is the :class:`~app.serving.preprocess.ImageError` the file's path gives (422
    ``corrupt_image``). 16-bit grey in another byte order (``I;16B``, ``I;16L``, ``I;16N``: a
    big-endian TIFF) is ``I;16`` of the same levels, as its PNG holds it.

    Raises:
        TypeError: another type, or an array of another dtype.
        ValueError: an array of another shape; an ``ImageError`` for a file that cannot be decoded.
    """
    from PIL import Image

    if not isinstance(image, Image.Image):
        return _array_image(image).copy()
    # Pillow cannot decode one lazily opened image from two threads at once (calls from threads
    # sharing one Image.open saw AssertionErrors and "broken PNG file"): read one at a time.
    with _reading, decode_errors():
        key_in_decoded_units(image)  # a lazily opened PNG: its colour key as the path takes it
        image.load()  # a lazily opened file: decoded once, here
        if image.mode in _GREY16_ORDERS:
            import numpy as np

            # Pillow's convert("I;16") would clip the levels to 0..255; the PNG holds them as they are
            grey = Image.fromarray(np.asarray(image).astype(np.uint16))
            if "transparency" in image.info:
                grey.info["transparency"] = image.info["transparency"]
            return grey
        if image.mode in ("La", "RGBa"):  # premultiplied alpha: Pillow converts it to LA/RGBA only
            return image.convert(image.mode.upper())
        if image.mode not in _PNG_MODES:  # CMYK, YCbCr, LAB, HSV, F...: what png_bytes converts to
            return image.convert("RGB")
        if image.mode == "P" and image.palette is not None and image.palette.mode == "RGBA":
            # the PNG holds the palette's alpha as its transparency, which the colour rule composites
            return image.convert("RGBA")
        return image.copy()


def _png(image: PILImage.Image) -> bytes:
    return picture_png(image, PNG_LEVEL)


def is_tensor(image: Any) -> bool:
    """Whether ``image`` is a torch tensor (one picture ``[3, H, W]`` or a batch ``[B, 3, H, W]``)."""
    import torch

    return isinstance(image, torch.Tensor)


def tensor_pictures(t: Any) -> Any:
    """A tensor of pixels -> the pictures' uint8 levels ``[B, 3, H, W]``, on the tensor's device
    (``t`` itself where it is a uint8 batch).

    Raises:
        TypeError: a dtype other than uint8 or float16/bfloat16/float32/float64 (float8 has no
            pixels' precision); a sparse, nested (or other non-dense) tensor, or one on the meta
            device (no values to read).
        ValueError: a shape other than ``[3, H, W]`` / ``[B, 3, H, W]``, an empty tensor, or
            float values outside 0..1 (a normalised input, or 0..255 values as floats).
    """
    import torch

    if t.layout != torch.strided or t.is_nested:
        got = (
            "a nested tensor (stack same-sized pictures, or pass a list)"
            if t.is_nested
            else f"{t.layout} (t.to_dense())"
        )
        raise TypeError(f"a tensor picture is a dense tensor; got {got}")
    if t.is_meta:
        raise TypeError("a tensor picture on the meta device has no pixels to read")
    if t.dim() not in (3, 4) or t.shape[-3] != 3:
        hint = " (channels last? use t.permute(2, 0, 1))" if t.dim() == 3 and t.shape[-1] == 3 else ""
        raise ValueError(
            f"a tensor picture is [3, H, W] or [B, 3, H, W] (RGB, channels first); got {tuple(t.shape)}{hint}"
        )
    if t.numel() == 0:
        raise ValueError(f"a tensor picture is empty: shape {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        levels = t
    elif t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        levels = _float_levels(t, "tensor")
    else:
        raise TypeError(f"a tensor picture is uint8 (0..255) or floating (0..1); got {t.dtype}")
    return levels if levels.dim() == 4 else levels.unsqueeze(0)


def _float_levels(t: Any, kind: str) -> Any:
    """Float pixels in 0..1 (a tensor, or an array's values as one) as their uint8 levels,
    ``round(x * 255)`` in float32 on ``t``'s device; :class:`ValueError` for other values (a
    normalised input, 0..255), ``kind`` naming the picture in the message."""
    import torch

    lo, hi = torch.stack(torch.aminmax(t)).tolist()  # one pass, one wait for a GPU
    if not (lo >= 0.0 and hi <= 1.0):  # NaN fails too
        raise ValueError(_out_of_range(t, lo, hi, kind))
    return (t.float() * 255.0).round_().to(torch.uint8)


def _out_of_range(t: Any, lo: float, hi: float, kind: str) -> str:
    """Why a float picture's values are not pixels in 0..1: NaN or infinity said as such, the
    bounds exactly (1.0000001 is not "1"), and in a batch the first picture at fault."""
    import torch

    where = ""
    if t.dim() == 4 and t.shape[0] > 1:
        flat = t.reshape(t.shape[0], -1)
        bad = ~((flat >= 0) & (flat <= 1)).all(1)  # NaN compares False: bad too
        where = f" (picture {int(bad.nonzero()[0])} of the batch)"
    if not bool(torch.isfinite(t).all()):
        return f"a float {kind} picture holds pixels in 0..1; it holds NaN or infinite values{where}"
    return (
        f"a float {kind} picture holds pixels in 0..1 (not the model's normalised input, not 0..255); "
        f"got values in {lo!r}..{hi!r}{where}"
    )


def own_levels(t: Any) -> Any:
    """`tensor_pictures` of ``t`` as a contiguous copy of their own, on the tensor's device: the
    pictures as they are when the call is made, whatever the caller's tensor holds afterwards.

    One copy whatever the dtype: a uint8 tensor is cloned, a float tensor's levels are a new
    tensor already (copied again only where ``t``'s strides made them non-contiguous).
    """
    import torch

    levels = tensor_pictures(t)
    if t.dtype == torch.uint8 or not levels.is_contiguous():
        levels = levels.clone(memory_format=torch.contiguous_format)
    return levels


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

    if isinstance(image, Image.Image) and image.mode in _PNG_MODES:
        with _reading:  # a lazily opened file is decoded here: one thread at a time (stored_image)
            return _png(image)
    return _png(stored_image(image))


def _array_image(a: Any):
    import numpy as np
    from PIL import Image

    if not isinstance(a, np.ndarray):
        raise TypeError(f"a picture is {PICTURE_TYPES}; got {type(a).__module__}.{type(a).__qualname__}")
    if a.ndim not in (2, 3):
        raise ValueError(f"an array picture is HxWx3 (RGB), HxWx4 (RGBA) or HxW (grey); got shape {a.shape}")
    if a.dtype.kind == "f" and a.dtype.itemsize in (2, 4, 8) and a.size:
        import torch

        # the tensors' rule itself: the same values give the same picture either way (a
        # big-endian float array, as FITS and some TIFF readers give, in this machine's order)
        native = a.astype(a.dtype.newbyteorder("="), copy=False)
        a = _float_levels(torch.from_numpy(np.ascontiguousarray(native)), "array").numpy()
    if a.dtype != np.uint8:
        if a.dtype == np.uint16:
            how = "(a // 257).astype(np.uint8) for 16-bit levels 0..65535 (astype alone would wrap them)"
        elif a.dtype == np.bool_:
            how = "a.astype(np.uint8) * 255 for a mask (astype alone gives levels 0 and 1: black)"
        else:
            how = "a.astype(np.uint8) for integer levels 0..255"
        raise TypeError(
            f"an array picture holds uint8 values (0..255) or floats (0..1); got {a.dtype}: convert it, e.g. {how}"
        )
    if a.size == 0:
        raise ValueError(f"the array picture has no pixels (shape {a.shape}); it needs a height and width of 1 or more")
    if a.ndim == 2:
        return Image.fromarray(np.ascontiguousarray(a), "L")
    if a.ndim == 3 and a.shape[2] in (3, 4):
        return Image.fromarray(np.ascontiguousarray(a), "RGB" if a.shape[2] == 3 else "RGBA")
    hint = " (channels first? use a.transpose(1, 2, 0))" if a.ndim == 3 and a.shape[0] in (3, 4) else ""
    raise ValueError(f"an array picture is HxWx3 (RGB), HxWx4 (RGBA) or HxW (grey); got shape {a.shape}{hint}")


def named(e: Exception, where: object) -> Exception:
    """``e`` again with ``where`` (a file, ``pictures[i]``) before its message, so that an error
    about one picture says which; an error with a ``status`` and ``code`` (an ``ImageError``, a
    ``PictureFileError``: the API's 4xx) keeps them."""
    status, code = getattr(e, "status", None), getattr(e, "code", None)
    if status is not None and code is not None:
        return type(e)(f"{where}: {e}", status, code)
    return type(e)(f"{where}: {e}")


def picture(image: Any, max_file_bytes: int) -> Picture | ImagePicture:
    """One picture that is not a tensor (see the module docstring for what it can be).

    Args:
        max_file_bytes: the largest file read from a path (``Settings.max_upload_bytes``).

    Raises:
        TypeError: not a picture type.
        ValueError: an unreadable file (`PictureFileError`, whose
            message names the file), an empty bytes object, an array of the wrong shape.
    """
    if isinstance(image, str) and is_url(image):
        raise PictureFileError(
            f"{image[:200]}: a URL; pictures are read from files, bytes, PIL images, arrays or tensors: download it "
            "first (urllib.request.urlopen(url).read() gives bytes to pass)",
            code="url",
        )
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        try:
            return Picture(read_picture_file(path, max_file_bytes), path.name)
        except ValueError as e:  # PictureFileError: its message does not repeat the path
            raise named(e, path) from None
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        if not data:
            raise ValueError("the picture's bytes are empty")
        return Picture(data, None)
    from PIL import Image

    if isinstance(image, Image.Image):
        name = getattr(image, "filename", None)
        return ImagePicture(stored_image(image), Path(name).name if name else None)
    return ImagePicture(stored_image(image), None)


def is_many(image: Any) -> bool:
    """Whether ``image`` is several pictures (a list, a tuple, a tensor ``[B, 3, H, W]``) rather than one."""
    return isinstance(image, (list, tuple)) or (is_tensor(image) and image.dim() == 4)
