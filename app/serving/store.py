"""Captures of the server: the byte-bounded cache, one computation per capture in flight, the
forward on the worker.

:meth:`CaptureStore.get` answers "the capture of this image under this model (with these heads
removed)": from the cache, or decoded and queued for the worker's next batch. Identical requests
in flight at once share one computation, each waiting until its own deadline; the computation is
cancelled only when every one of them has gone. A capture is kept as an :class:`CachedCapture`: the
image's :class:`~app.engine.captured_image.CapturedImage` and its statistics, computed once and
charged to the cache with it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch

from ..config import Settings
from ..engine.ablation import Ablation
from ..engine.captured_image import CapturedImage
from ..engine.model import LoadedModel
from ..engine.selection import Selection
from ..engine.stats import DEFAULT_MASS
from .admission import current_client_left, current_ticket
from .cache import ByteLRU, CaptureKey
from .flights import Flights
from .metrics import Metrics
from .uploads import ImageNotFound, Upload, Uploads
from .worker import Job, Worker

# What a cached entry costs beyond its buffers (the dataclass, dicts, the key).
ENTRY_OVERHEAD_BYTES = 4096
# Statistics for this many mass fractions are kept per capture (the rest is recomputed).
MASS_MEMO = 8


def _object_bytes(obj: Any) -> int:
    """What a JSON-like value (memoised statistics) costs in memory, about: Python floats and
    list slots take about twice their JSON text."""
    return 2 * len(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY))


@dataclass
class CachedCapture:
    """An image's capture under one model, as the cache keeps it: what it takes to read it, and
    its statistics once asked for."""

    model_id: str
    image: CapturedImage
    image_size: tuple[int, int]  # (height, width) of the picture as uploaded
    precision: str = "fp32"  # what the forward computed in: fp32, bf16 or fp16
    _stats: dict = field(default_factory=dict, repr=False)  # the mass-independent statistics
    _mass_patches: OrderedDict = field(default_factory=OrderedDict, repr=False)  # mass -> list, bounded

    @property
    def input_size(self) -> tuple[int, int]:
        return self.image.input_size

    def stats(self, mass: float = DEFAULT_MASS, check: Callable[[], None] | None = None) -> dict:
        """Per-head statistics as JSON (:meth:`CapturedImage.stats`); runs on the worker thread.

        Only ``mass_patches`` depends on ``mass``: the rest is computed once, and the mass
        thresholds of the last ``MASS_MEMO`` fractions asked for are kept (each a few hundred
        bytes), all of it charged to the cache (:meth:`extra_bytes`). Every fraction's
        ``mass_patches`` comes from the CLS rows alone, so they agree with each other.
        ``check`` may raise between layers to stop (the client left).
        """
        if not self._stats:
            self._stats = self.image.stats(None, check=check).as_dict(self.input_size)
        if mass not in self._mass_patches:
            self._mass_patches[mass] = self.image.mass_patches(mass)
            while len(self._mass_patches) > MASS_MEMO:
                self._mass_patches.popitem(last=False)
        self._mass_patches.move_to_end(mass)
        return {**self._stats, "mass_fraction": mass, "mass_patches": self._mass_patches[mass]}

    def extra_bytes(self) -> int:
        """Bytes the memoised statistics take (charged to the cache with the capture)."""
        if not self._stats:
            return 0
        return _object_bytes(self._stats) + sum(_object_bytes(v) + 64 for v in self._mass_patches.values())


@dataclass
class FoundCapture:
    """A cache entry and how it was got: from the cache, or computed now (with its timing)."""

    entry: CachedCapture
    cached: bool
    timing: dict[str, float]
    # The maps of one selection, computed with the batch-mates by the worker (the selection of
    # the request that started the computation), where the capture is: Worker._answer_maps.
    maps: tuple[Selection, torch.Tensor] | None = None

    def maps_of(self, sel: Selection) -> torch.Tensor | None:
        """The maps computed with the batch-mates, if they are ``sel``'s."""
        return self.maps[1] if self.maps is not None and self.maps[0] == sel else None


class CaptureStore:
    """Captures: the cache, in-flight dedupe, and the forward on the worker.

    Args:
        settings: the request timeout (a capture computed outside a request gets one).
        cache: the server's byte-bounded cache (shared with the uploads).
        uploads: where the pictures come from.
        worker: the batching worker that owns the device.
        metrics: cache hits and shared computations.
    """

    def __init__(self, settings: Settings, cache: ByteLRU, uploads: Uploads, worker: Worker, metrics: Metrics):
        self.settings = settings
        self.cache = cache
        self.uploads = uploads
        self.worker = worker
        self.metrics = metrics
        self._flights: Flights[FoundCapture] = Flights()

    async def get(
        self,
        image_id: str,
        lm: LoadedModel,
        *,
        upload: Upload | None = None,
        every_row: bool = False,
        fault: str | None = None,
        ablate: Ablation = (),
        answer: Callable[[CapturedImage], Selection] | None = None,
    ) -> FoundCapture:
        """The capture of an image: from the cache, else computed from ``upload`` or the cached
        upload. The wait ends early when the current request's client leaves.

        Args:
            upload: the image's bytes, when the request brought them.
            every_row: the answer will need every row (``query=all``, rollout): a capture
                computed now keeps full maps when that pays (``LoadedModel.keeps_maps``).
            fault: injected fault (tests only): computed apart, never shared.
            ablate: heads removed for this capture (cached per image and ablation set).
            answer: the selection the request will answer, of a capture: a capture computed
                now comes with those maps, computed with its batch-mates (``FoundCapture.maps``).

        Raises:
            ImageNotFound: neither the capture nor the upload is there any more.
        """
        entry = self.cache.get(CaptureKey(image_id, lm.id, ablate))
        if entry is not None:
            self.metrics.cache_hits.inc()
            ticket = current_ticket()
            if ticket is not None:
                ticket.queued()  # no forward: no batch waits for it while its answer is built
            return FoundCapture(entry, True, {"queue": 0.0, "compute": 0.0})
        upload = upload or self.uploads.get(image_id)
        if upload is None:
            raise ImageNotFound(image_id)
        return await self._shared(image_id, upload, lm, every_row, fault, ablate, answer)

    def recharge(self, image_id: str, lm: LoadedModel, ablate: Ablation, entry: CachedCapture) -> None:
        """Charge an entry anew once its memoised statistics have grown."""
        self.cache.recharge(CaptureKey(image_id, lm.id, ablate), ENTRY_OVERHEAD_BYTES + entry.extra_bytes())

    def free_device_memory(self) -> int:
        """Evict the cached captures kept in accelerator memory; returns the bytes freed.

        The worker calls this when a forward runs out of device memory: the forward of a new
        request matters more than a follow-up query on an old one.
        """
        return self.cache.evict_where(lambda v: isinstance(v, CachedCapture) and v.image.att.device.type != "cpu")

    async def _shared(
        self,
        image_id: str,
        upload: Upload,
        lm: LoadedModel,
        every_row: bool,
        fault: str | None,
        ablate: Ablation = (),
        answer: Callable[[CapturedImage], Selection] | None = None,
    ) -> FoundCapture:
        """Decode, queue, wait for the worker; the capture goes into the cache.

        Requests for a capture already being computed wait for that computation instead of
        starting another (each until its own deadline); it is cancelled only when every one
        of them has gone.
        """
        key = CaptureKey(image_id, lm.id, ablate)
        ticket = current_ticket()
        deadline = ticket.deadline if ticket else time.monotonic() + self.settings.request_timeout_s
        flight = self._flights.get(key) if fault is None else None
        if flight is not None:
            self.metrics.shared_computes.inc()
            if ticket is not None:
                ticket.queued()  # no forward of its own: no batch waits for it
        else:
            flight = self._flights.start(
                key,
                lambda: self._compute(key, upload, lm, every_row, fault, deadline, ablate, answer),
                shared=fault is None,
            )
        # Nobody waits for it any more once its last request has gone: its queued job is skipped.
        return await flight.wait(deadline, current_client_left())

    async def _compute(
        self,
        key: CaptureKey,
        upload: Upload,
        lm: LoadedModel,
        every_row: bool,
        fault: str | None,
        deadline: float,
        ablate: Ablation = (),
        answer: Callable[[CapturedImage], Selection] | None = None,
    ) -> FoundCapture:
        prep = await self.uploads.prepared(upload, lm)
        size = prep.input_size
        ticket = current_ticket()
        job = Job(
            lm=lm,
            pixels=prep.raw,
            deadline=deadline,
            fault=fault,
            materialise=every_row and lm.keeps_maps(prep.input_size),
            priority=ticket.priority if ticket else 0,
            ablate=ablate,
            answer=None if answer is None else (lambda att: answer(lm.captured(att, size))),
        )
        fut = self.worker.submit(job)
        try:
            computed = await fut
        except BaseException:
            if not fut.done():
                fut.cancel()
            raise
        entry = CachedCapture(lm.id, lm.captured(computed.att, prep.input_size), prep.image_size, self.worker.precision)
        # Batch-mates share the forward's buffers: the cache charges each buffer once.
        self.cache.put(key, entry, ENTRY_OVERHEAD_BYTES, shared=computed.att.storages())
        return FoundCapture(entry, False, {"queue": computed.queue_ms, "compute": computed.compute_ms}, computed.maps)
