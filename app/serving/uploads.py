"""Uploads: an image's id (its content hash), its bytes kept in the cache, decoding them within the
decode budget, and the PNG the page shows.

Every request about a picture names it by the id its POST answered; the bytes stay in the
byte-bounded cache (:mod:`.cache`) beside the captures, so that a capture evicted on the way can
be computed again. An id the cache no longer holds is :class:`ImageNotFound` (404).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from ..config import Settings
from ..engine.cached import cached_property
from ..engine.model import LoadedModel
from . import pictures
from .admission import Admission
from .cache import ByteLRU, DisplayKey, ImageKey, PreparedKey
from .pictures import Pictures

IMAGE_ID_HEX_CHARS = 24  # 96 bits of the upload's sha256: collisions are out of reach
MAX_FILENAME_CHARS = 200  # an upload's name is shown, never used as a path
UPLOAD_OVERHEAD_BYTES = 512  # what a cached upload costs beyond its bytes
T = TypeVar("T")


@dataclass
class Upload:
    """An uploaded picture: its bytes, and the name its request gave it (shown, never a path)."""

    data: bytes
    filename: str | None

    @cached_property
    def image_id(self) -> str:
        """:func:`image_id_of` its bytes, hashed once (keeping and preparing both need it)."""
        return image_id_of(self.data)


class ImageNotFound(LookupError):
    """The image is not (or no longer) in the server's cache (answered 404 ``image_not_found``)."""

    def __init__(self, image_id: str):
        super().__init__(f"image {image_id} is not (or no longer) cached; POST it again")
        self.image_id = image_id


def image_id_of(data: bytes) -> str:
    """The id of an upload: the first hex digits of its sha256."""
    return hashlib.sha256(data).hexdigest()[:IMAGE_ID_HEX_CHARS]


def is_image_id(text: str) -> bool:
    """Whether ``text`` can be an image id (hexadecimal, 8 to 64 digits)."""
    return 8 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)


def safe_filename(name: str | None) -> str | None:
    """Keep only the last path part, printable and short: for display, never for paths."""
    if not name:
        return None
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable())[:MAX_FILENAME_CHARS]
    return name or None


class Uploads:
    """The uploads the server keeps, and their decoding.

    Args:
        settings: the decoding limits and how pictures are resized.
        cache: where the bytes (and the page's PNGs) are kept, beside the captures.
        admission: the decode budget.
    """

    def __init__(self, settings: Settings, cache: ByteLRU, admission: Admission):
        self.settings = settings
        self.cache = cache
        self.admission = admission

    def keep(self, upload: Upload) -> str:
        """Keep an upload's bytes (for follow-up requests and the page); returns its id.

        The name is not kept: the id is the content's, so two people who send the same bytes
        share it, and a name one of them gave must not show in the other's follow-ups. It is in
        the answer to the request that sent it, and nowhere else.
        """
        image_id = upload.image_id
        kept = Upload(upload.data, None)
        kept.image_id = image_id
        self.cache.put(ImageKey(image_id), kept, len(upload.data) + UPLOAD_OVERHEAD_BYTES)
        return image_id

    def get(self, image_id: str) -> Upload | None:
        return self.cache.get(ImageKey(image_id))

    def require(self, image_id: str) -> Upload:
        """The upload, or :class:`ImageNotFound`."""
        upload = self.get(image_id)
        if upload is None:
            raise ImageNotFound(image_id)
        return upload

    async def _decode(self, probe: Callable[[], pictures.Probe], finish: Callable[[pictures.Probe], T]) -> T:
        """``finish(probe())`` within the decode budget, in threads.

        The header is read first (a thread of its own: a PNG's chunks before its pixels can be
        megabytes); the decode waits for a decode thread holding nothing, then reserves its estimate.
        """
        p = await run_in_threadpool(probe)
        async with self.admission.decoding(p.peak_bytes):
            return await run_in_threadpool(finish, p)

    async def prepared(self, upload: Upload, lm: LoadedModel) -> pictures.PreparedPixels:
        """The upload as ``lm``'s input (:class:`~app.serving.pictures.Pictures`, the one
        preparation path), decoded within the decode budget once: the uint8 pixels are kept
        in the cache beside the bytes, so the follow-ups (relevance, faithfulness, output,
        importance) of an upload do not decode it again."""
        prep = Pictures.for_model(lm, self.settings)
        key = PreparedKey(upload.image_id, prep)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        done = await self._decode(lambda: prep.probe(upload.data), prep.finish)
        self.cache.put(key, done, done.raw.numel() * done.raw.element_size() + UPLOAD_OVERHEAD_BYTES)
        return done

    async def display_png(self, image_id: str) -> bytes:
        """The upload as a PNG for the page (longer side at most 1600), made once and cached."""
        png = self.cache.get(DisplayKey(image_id))
        if png is not None:
            return png
        data = self.require(image_id).data
        shown: bytes = await self._decode(
            lambda: pictures.display_probe(data, self.settings.max_image_pixels), pictures.display_finish
        )
        self.cache.put(DisplayKey(image_id), shown, len(shown) + UPLOAD_OVERHEAD_BYTES)
        return shown
