"""The request path in one place: the routes' one entry, over the pieces that do the work.

Routes stay thin: they parse HTTP, take an admission slot and call :class:`AttentionService`,
which only strings the pieces together:

* :mod:`.uploads`: image ids, the uploads kept in the cache, decoding within the decode budget;
* :mod:`.store`: captures from the cache, or one computation per capture in flight on the worker;
* :mod:`.answers`: selection -> metadata -> encoded body, sized before it is built, streamed
  when large.

POST and GET share one path (:meth:`AttentionService.attention`): the upload, if any, goes into
the byte-bounded cache; the capture comes from the cache or from the worker; the answer is
sliced and encoded on the worker thread. Follow-up queries (another layer, head or patch) are
answered from the cached capture without a forward pass. The same pieces serve the other
endpoints (:mod:`.explain`, :mod:`.ablation`) and work without HTTP: given a ``LoadedModel``,
:class:`~app.engine.captured_image.CapturedImage` and the functions of :mod:`.answers` give the same
numbers in plain Python.
"""

from __future__ import annotations

import asyncio
import copy
import threading

from ..config import Settings
from ..engine.model import LoadedModel
from ..engine.selection import SelectionError
from ..zoo.registry import Registry
from .admission import Admission, current_client_left
from .answers import Answer, Answers, selection, stats_body
from .cache import ByteLRU
from .metrics import Metrics
from .params import AttentionParams
from .store import CaptureStore
from .tasks import model_of
from .uploads import Upload, Uploads
from .waiting import ClientGone, wait_for_result
from .worker import Worker


def _kept_note(e: SelectionError, image_id: str) -> SelectionError:
    """``e`` again (the same class and code) with where its POST's picture is kept."""
    kept = copy.copy(e)
    kept.args = (
        f"{e}; the picture is kept as image {image_id}: GET /api/v1/attention/{image_id} with other parameters "
        "needs no new upload",
    )
    return kept


class AttentionService:
    """Uploads, captures and answers.

    Args:
        settings: limits (upload, pixels, aspect, timeout) and the cache size.
        registry: the models.
        worker: the batching worker that owns the device.
        metrics: cache and hit counters.
        admission: the server's resource pools (the worker's by default).
    """

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        worker: Worker,
        metrics: Metrics,
        admission: Admission | None = None,
    ):
        self.settings = settings
        self.registry = registry
        self.worker = worker
        self.metrics = metrics
        self.admission = admission or worker.admission

        def on_change(nbytes: int, entries: int) -> None:
            metrics.cache_bytes.set(nbytes)
            metrics.cache_entries.set(entries)

        self.cache = ByteLRU(settings.cache_bytes, on_change, settings.variant_bytes)
        self.uploads = Uploads(settings, self.cache, self.admission)
        self.store = CaptureStore(settings, self.cache, self.uploads, worker, metrics)
        self.answers = Answers(settings, worker, self.admission)

    def free_device_memory(self) -> int:
        """Evict the cached captures kept in accelerator memory (the worker's OOM hook)."""
        return self.store.free_device_memory()

    async def model(self, model_id: str | None) -> LoadedModel:
        """A model by id (the default for None), loaded on the worker thread on first use."""
        return await model_of(self.registry, self.worker, model_id)

    # -- entry points ---------------------------------------------------------------------
    async def attention(
        self,
        image_id: str,
        params: AttentionParams,
        *,
        upload: Upload | None = None,
        fault: str | None = None,
    ) -> Answer:
        """The attention a request selects for an image.

        Args:
            upload: the image, when the request brought it (POST); GETs find it in the cache.
                Only then does the answer carry a ``filename``.

        Raises:
            ImageNotFound: the image is no longer cached (404).
        """
        lm = await self.model(params.model)
        ablate = lm.ablation(params.ablate)
        found = await self.store.get(
            image_id,
            lm,
            upload=upload,
            every_row=params.needs_every_row,
            fault=fault,
            ablate=ablate,
            answer=lambda image: selection(params, image),
        )
        # The name only in the answer to the upload that gave it (see Uploads.keep).
        filename = upload.filename if upload is not None else None
        return await self.answers.answer(image_id, filename, found, params, ablate)

    async def post(
        self,
        upload: Upload,
        params: AttentionParams,
        *,
        fault: str | None = None,
    ) -> Answer:
        """Keep the upload (for follow-up queries and the page), then answer as :meth:`attention`.

        A selection the picture cannot answer (a Swin's default ``layers=all``, a layer out of
        range) is refused after the picture is kept: the refusal says its id, so that the client
        asks again with GET instead of uploading it again (the error body has one shape: the id
        goes in its message)."""
        image_id = self.uploads.keep(upload)
        try:
            return await self.attention(image_id, params, upload=upload, fault=fault)
        except SelectionError as e:
            refused = e.with_traceback(None)  # no frames held: a frame holding its own error is a cycle
        raise _kept_note(refused, image_id)

    async def stats(
        self,
        image_id: str,
        model_id: str | None,
        mass: float,
        ablate: str = "",
    ) -> dict:
        """Per-head statistics of a known image (computed once per mass fraction), of the model
        with the ``ablate`` heads removed."""
        lm = await self.model(model_id)
        pairs = lm.ablation(ablate)
        found = await self.store.get(image_id, lm, ablate=pairs)
        # The statistics hold the worker for seconds: when the client leaves (the page cancels them
        # for a new image), a queued run is dropped and a running one stops at its next layer.
        gone = threading.Event()

        def check() -> None:
            if gone.is_set():
                raise ClientGone("the client closed the connection before the statistics")

        # Uploads go first: the priority queue runs their forwards ahead of this call.
        fut = asyncio.ensure_future(self.worker.run_after_forwards(found.entry.stats, mass, check))
        try:
            stats = await wait_for_result(fut, None, current_client_left(), "the statistics")
        except BaseException:
            gone.set()
            raise
        self.store.recharge(image_id, lm, pairs, found.entry)
        return stats_body(image_id, found, stats, pairs)

    async def display_png(self, image_id: str) -> bytes:
        """The upload as a PNG for the page (see :meth:`Uploads.display_png`)."""
        return await self.uploads.display_png(image_id)
