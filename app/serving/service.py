"""The request path in one place: decode -> queue -> capture -> select -> encode.

Routes stay thin: they parse HTTP, take an admission slot and call :class:`AttentionService`.
POST and GET share one path (:meth:`AttentionService.attention`): the upload, if any, goes into
the byte-bounded cache; the capture comes from the cache or from the worker; the answer is
sliced and encoded on the worker thread. Follow-up queries (another layer, head or patch) are
answered from the cached capture without a forward pass.

Resources (``admission.py`` holds the policy): a decode reserves its estimated peak memory
first (413/429 before decoding); identical uploads in flight at once are decoded and computed
once, and every request waiting for that computation gets its result; an answer's size is
known before it is built (``answers.py``): JSON over the limit is refused, large answers take
a large-answer slot, and large binary answers are streamed layer by layer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import orjson
import torch
from starlette.concurrency import run_in_threadpool

from ..config import Settings
from ..engine import analysis
from ..engine.ablation import Ablation, parse_ablate
from ..engine.capture import ImageAttention
from ..engine.layout import Stage, TokenLayout, WindowedLayout
from ..engine.selection import Selection, SelectionError, parse_indices, parse_query, resolve_windowed
from ..engine.windows import WindowedAttention
from ..zoo.loaded import LoadedModel
from ..zoo.registry import Registry
from . import answers, pictures
from .admission import Admission, ClientGone, Ticket, current_ticket, using
from .cache import ByteLRU, CaptureKey, DisplayKey, ImageKey
from .encoders import MEDIA_TYPES, Part, binary_header, binary_headers, download_stem, encode
from .metrics import Metrics
from .params import AttentionParams
from .pictures import Pictures
from .worker import DISCONNECT_POLL_S, Job, Worker, wait_for_result

__all__ = ["AttentionService", "ClientGone", "DISCONNECT_POLL_S"]

log = logging.getLogger(__name__)

# What a cached entry costs beyond its buffers (the dataclass, dicts, the key).
ENTRY_OVERHEAD_BYTES = 4096
UPLOAD_OVERHEAD_BYTES = 512
# Statistics for this many mass fractions are kept per capture (the rest is recomputed).
MASS_MEMO = 8
DEFAULT_MASS = 0.6

Disconnected = Callable[[], Awaitable[bool]]
T = TypeVar("T")


class StreamAborted(Exception):
    """A streamed answer could not be finished (its next chunk missed its deadline); the
    connection is closed, which the client sees as a short body. Logged as one line."""


def _object_bytes(obj: Any) -> int:
    """What a JSON-like value (memoised statistics) costs in memory, about: Python floats and
    list slots take about twice their JSON text."""
    return 2 * len(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY))


@dataclass
class Upload:
    data: bytes
    filename: str | None


@dataclass
class Capture:
    """An image's capture under one model, with what it takes to read it."""

    model_id: str
    att: ImageAttention | WindowedAttention
    layout: TokenLayout | WindowedLayout  # windowed models (Swin): one grid per stage
    input_size: tuple[int, int]
    image_size: tuple[int, int]
    stats: dict = field(default_factory=dict)  # the mass-independent statistics, computed once
    mass_patches: OrderedDict = field(default_factory=OrderedDict)  # mass -> mass_patches, bounded

    def head_stats(self, mass: float = DEFAULT_MASS, check: Callable[[], None] | None = None) -> dict:
        """Per-head statistics (``engine.stats.head_stats``); runs on the worker thread.

        Only ``mass_patches`` depends on ``mass``: the rest is computed once, and the mass
        thresholds of the last ``MASS_MEMO`` fractions asked for are kept (each a few hundred
        bytes), all of it charged to the cache (:meth:`extra_bytes`). Every fraction's
        ``mass_patches`` comes from the CLS rows alone, so they agree with each other.
        ``check`` may raise between layers to stop (the client left).
        """
        if not self.stats:
            if isinstance(self.att, WindowedAttention):
                from ..engine.window_stats import window_head_stats

                self.stats = window_head_stats(self.att, self.input_size, DEFAULT_MASS, check=check)
            else:
                from ..engine.stats import head_stats

                assert isinstance(self.layout, TokenLayout)
                self.stats = head_stats(self.att, self.layout, self.input_size, DEFAULT_MASS, check=check)
        if mass not in self.mass_patches:
            self.mass_patches[mass] = self._mass_patches(mass)
            while len(self.mass_patches) > MASS_MEMO:
                self.mass_patches.popitem(last=False)
        self.mass_patches.move_to_end(mass)
        return {**self.stats, "mass_fraction": mass, "mass_patches": self.mass_patches[mass]}

    def _mass_patches(self, mass: float) -> list[list[int]] | None:
        from ..engine.stats import mass_threshold_count

        if not isinstance(self.layout, TokenLayout):
            return None  # windowed models have no CLS row (window_stats says why)
        cls, npf = self.layout.cls_index, self.layout.num_prefix
        if cls is None:
            return None
        return [
            mass_threshold_count(self.att.rows(layer, None, [cls])[:, 0, npf:].cpu(), mass).tolist()
            for layer in range(self.att.num_layers)
        ]

    def extra_bytes(self) -> int:
        """Bytes the memoised statistics take (charged to the cache with the capture)."""
        if not self.stats:
            return 0
        return _object_bytes(self.stats) + sum(_object_bytes(v) + 64 for v in self.mass_patches.values())

    def tokens(self, stage: Stage | None = None) -> dict[str, Any]:
        """The token layout of an answer: the image's, or the stage's for a windowed model."""
        if stage is None:
            assert isinstance(self.layout, TokenLayout)
            return self.layout.as_dict()
        return {**stage.tokens().as_dict(), "stage": stage.index, "window": list(stage.window)}

    def drop_columns(self, drop: str, stage: Stage | None = None) -> list[int]:
        """Token indices a ``drop`` option removes from maps (prefix and/or artifact tokens).

        Args:
            stage: a windowed model's stage of the answer: no prefix tokens, and artifact tokens
                only on the last stage's grid, where they are found.
        """
        from ..engine.stats import artifact_tokens

        parts = {p.strip() for p in drop.split(",")} - {"none", ""}
        if stage is not None:
            assert isinstance(self.layout, WindowedLayout)
            last = self.layout.stages[-1]
            if "artifacts" not in parts:
                return []
            if stage.index != last.index:
                raise SelectionError(
                    f"drop=artifacts: high-norm tokens are found on the last stage's grid (stage {last.index}, "
                    f"layers {last.first_layer}-{last.last_layer}); stage {stage.index} has another grid"
                )
            return artifact_tokens(self.att.last_norms, 0)[0]
        assert isinstance(self.layout, TokenLayout)
        cols: list[int] = []
        if "prefix" in parts:
            cols += list(range(self.layout.num_prefix))
        if "artifacts" in parts:
            cols += artifact_tokens(self.att.last_norms, self.layout.num_prefix)[0]
        return sorted(set(cols))


@dataclass
class Found:
    """A capture and how it was got: from the cache, or computed now (with its timing)."""

    cap: Capture
    cached: bool
    timing: dict[str, float]


@dataclass
class Answer:
    body: list[Part]  # sent in order; b"".join(body) is the whole body (empty when streamed)
    headers: dict[str, str]
    media_type: str
    meta: dict[str, Any]
    stream: AsyncIterator[Part] | None = None  # a large binary answer, chunk by chunk
    length: int = 0  # the body's length (Content-Length), also when streamed


@dataclass
class _Flight:
    """A computation in flight, shared by every request for the same capture."""

    task: asyncio.Task
    waiters: int = 0


IMAGE_ID_HEX_CHARS = 24  # 96 bits of the upload's sha256: collisions are out of reach
MAX_FILENAME_CHARS = 200  # an upload's name is shown, never used as a path


def image_id_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:IMAGE_ID_HEX_CHARS]


def safe_filename(name: str | None) -> str | None:
    """Keep only the last path part, printable and short: for display, never for paths."""
    if not name:
        return None
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable())[:MAX_FILENAME_CHARS]
    return name or None


class AttentionService:
    """Uploads, captures and answers.

    Args:
        settings: limits (upload, pixels, aspect, timeout) and the cache size.
        registry: the models.
        worker: the batching worker that owns the device.
        metrics: cache and hit counters.
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
        self._flights: dict[CaptureKey, _Flight] = {}

        def on_change(nbytes: int, entries: int) -> None:
            metrics.cache_bytes.set(nbytes)
            metrics.cache_entries.set(entries)

        self.cache = ByteLRU(settings.cache_bytes, on_change)

    def free_device_memory(self) -> int:
        """Evict the cached captures kept in accelerator memory; returns the bytes freed.

        The worker calls this when a forward runs out of device memory: the forward of a new
        request matters more than a follow-up query on an old one.
        """
        return self.cache.evict_where(lambda v: isinstance(v, Capture) and v.att.device.type != "cpu")

    # -- pieces ---------------------------------------------------------------------------
    async def _decode(self, probe: Callable[[], pictures.Probe], finish: Callable[[pictures.Probe], T]) -> T:
        """``finish(probe())`` within the decode budget, in threads.

        The header is read first (a thread of its own: a PNG's chunks before its pixels can be
        megabytes); the decode waits for a decode slot holding only its reservation.
        """
        p = await run_in_threadpool(probe)
        async with self.admission.decoding(p.peak_bytes):
            return await run_in_threadpool(finish, p)

    async def prepare(self, data: bytes, lm: LoadedModel) -> pictures.Prepared:
        """``lm``'s input tensor for the picture ``data`` (:class:`~app.serving.pictures.Pictures`,
        the one preparation path), decoded within the decode budget."""
        prep = Pictures.for_model(lm, self.settings)
        return await self._decode(lambda: prep.probe(data), prep.finish)

    async def model(self, model_id: str | None) -> LoadedModel:
        mid = self.registry.resolve(model_id)
        lm = self.registry.loaded(mid)
        if lm is not None:
            return lm
        # Loading is slow (weights, maybe a download): do it on the worker thread.
        return await self.worker.run_in_worker(self.registry.get, mid)

    def upload_of(self, image_id: str) -> Upload | None:
        return self.cache.get(ImageKey(image_id))

    async def _compute(
        self,
        image_id: str,
        upload: Upload,
        lm: LoadedModel,
        every_row: bool,
        fault: str | None,
        is_disconnected: Disconnected | None,
        ablate: Ablation = (),
    ) -> Found:
        """Decode, queue, wait for the worker; the capture goes into the cache.

        Requests for a capture already being computed wait for that computation instead of
        starting another (each until its own deadline); it is cancelled only when every one
        of them has gone.
        """
        key = CaptureKey(image_id, lm.id, ablate)
        ticket = current_ticket()
        deadline = ticket.deadline if ticket else time.monotonic() + self.settings.request_timeout_s
        is_disconnected = is_disconnected or (ticket.is_disconnected if ticket else None)
        flight = self._flights.get(key) if fault is None else None
        if flight is not None and not flight.task.done():
            self.metrics.shared_computes.inc()
        else:
            task = asyncio.create_task(self._compute_once(key, upload, lm, every_row, fault, deadline, ablate))
            task.add_done_callback(_retrieve)
            flight = _Flight(task)
            if fault is None:
                self._flights[key] = flight
                task.add_done_callback(
                    lambda t: self._flights.pop(key, None) if self._flights.get(key) is flight else None
                )
        flight.waiters += 1
        try:
            return await wait_for_result(asyncio.shield(flight.task), deadline, is_disconnected)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody waits for it any more: its queued job is skipped

    async def _compute_once(
        self,
        key: CaptureKey,
        upload: Upload,
        lm: LoadedModel,
        every_row: bool,
        fault: str | None,
        deadline: float,
        ablate: Ablation = (),
    ) -> Found:
        prep = await self.prepare(upload.data, lm)
        layout = lm.layout(prep.input_size)
        materialise = every_row and isinstance(layout, TokenLayout) and lm.capture.materialise_pays(layout.count)
        ticket = current_ticket()
        job = Job(
            lm=lm,
            pixels=prep.pixels,
            deadline=deadline,
            fault=fault,
            materialise=materialise,
            priority=ticket.priority if ticket else 0,
            ablate=ablate,
        )
        fut = self.worker.submit(job)
        try:
            computed = await fut
        except BaseException:
            if not fut.done():
                fut.cancel()
            raise
        cap = Capture(lm.id, computed.att, layout, prep.input_size, prep.image_size)
        # Batch-mates share the forward's buffers: the cache charges each buffer once.
        self.cache.put(key, cap, ENTRY_OVERHEAD_BYTES, shared=computed.att.storages())
        return Found(cap, False, {"queue": computed.queue_ms, "compute": computed.compute_ms})

    async def capture(
        self,
        image_id: str,
        lm: LoadedModel,
        *,
        upload: Upload | None = None,
        every_row: bool = False,
        fault: str | None = None,
        is_disconnected: Disconnected | None = None,
        ablate: Ablation = (),
    ) -> Found | None:
        """The capture of an image: from the cache, else computed from ``upload`` or the cached
        upload; None when neither is there any more.

        Args:
            upload: the image's bytes, when the request brought them.
            every_row: the answer will need every row (``query=all``, rollout): a capture
                computed now keeps full maps when that pays (see ``materialise_pays``).
            ablate: heads removed for this capture (cached per image and ablation set).
        """
        cap = self.cache.get(CaptureKey(image_id, lm.id, ablate))
        if cap is not None:
            self.metrics.cache_hits.inc()
            return Found(cap, True, {"queue": 0.0, "compute": 0.0})
        upload = upload or self.upload_of(image_id)
        if upload is None:
            return None
        return await self._compute(image_id, upload, lm, every_row, fault, is_disconnected, ablate)

    def selection(self, p: AttentionParams, cap: Capture) -> Selection:
        att = cap.att
        if isinstance(cap.layout, WindowedLayout):
            stage, layers, heads, rows = resolve_windowed(
                p.layers, p.heads, p.query, cap.layout, p.aggregate, p.rollout_start
            )
            return Selection(
                layers=layers,
                heads=heads,
                rows=rows,
                aggregate=p.aggregate,
                rollout_start=p.rollout_start,
                head_fusion=p.head_fusion,
                discard_ratio=p.discard_ratio,
                temperature=p.temperature,
                stage=stage,
            )
        layers = parse_indices(p.layers, att.num_layers, "layers")
        if p.aggregate == "rollout" and not -att.num_layers <= p.rollout_start < att.num_layers:
            n = att.num_layers
            raise SelectionError(
                f"rollout_start {p.rollout_start} is out of range for {n} layers (valid: {-n}..{n - 1})"
            )
        return Selection(
            layers=layers,
            heads=parse_indices(p.heads, att.num_heads, "heads"),
            rows=parse_query(p.query, cap.layout),
            aggregate=p.aggregate,
            rollout_start=p.rollout_start,
            head_fusion=p.head_fusion,
            discard_ratio=p.discard_ratio,
            temperature=p.temperature,
        )

    def _meta(
        self,
        image_id: str,
        filename: str | None,
        found: Found,
        sel: Selection,
        p: AttentionParams,
        shape,
        ablate: Ablation = (),
    ):
        cap = found.cap
        heads: list[Any] = list(sel.heads) if sel.aggregate == "none" else [sel.aggregate]
        tokens = cap.tokens(sel.stage)
        meta: dict[str, Any] = {
            "model": cap.model_id,
            "image_id": image_id,
            "filename": filename,
            "image_size": list(cap.image_size),
            "input_size": list(cap.input_size),
            "tokens": tokens,
            "layers": sel.layers,
            "heads": heads,
            "query": sel.rows if sel.rows is not None else list(range(tokens["count"])),
            "aggregate": sel.aggregate,
            "dtype": p.dtype,
            "shape": list(shape),
            "cached": found.cached,
            "dropped": cap.drop_columns(p.drop, sel.stage),
            "temperature": p.temperature,
            "ablated": [list(pair) for pair in ablate],
        }
        if isinstance(cap.layout, WindowedLayout):
            meta["stages"] = cap.layout.as_dict()
        return meta

    def _array(self, cap: Capture, sel: Selection, dropped: list[int], dtype: str):
        """The maps ``sel`` asks for as a numpy array (worker thread)."""
        tensor = analysis.attention_tensor(cap.att, sel)
        if dropped:
            tensor = analysis.drop_and_renormalise(tensor, dropped)
        # torch converts to float16 with SIMD; numpy's astype is ~60x slower on 18 MiB of maps.
        return (tensor.to(torch.float16) if dtype == "float16" else tensor.float()).numpy()

    def _answer(
        self, image_id: str, filename: str | None, found: Found, p: AttentionParams, ablate: Ablation = ()
    ) -> Answer:
        """Build a whole answer (worker thread): JSON, or a binary answer too small to stream."""
        t0 = time.perf_counter()
        cap = found.cap
        sel = self.selection(p, cap)
        dropped = cap.drop_columns(p.drop, sel.stage)
        array = self._array(cap, sel, dropped, p.dtype)
        meta = self._meta(image_id, filename, found, sel, p, array.shape, ablate)
        if p.stats and p.format == "json":
            meta["stats"] = cap.head_stats()
        # "encode" in the body covers slicing and conversion; serialising the body itself is
        # added in the Server-Timing header, the only place it can still be written.
        timing = {**found.timing, "encode": (time.perf_counter() - t0) * 1000}
        meta["timing_ms"] = dict(timing)
        body, headers = encode(array, meta, p.format, download_stem(image_id, cap.model_id, p))
        timing["encode"] = (time.perf_counter() - t0) * 1000
        headers["Server-Timing"] = _server_timing(timing)
        length = sum(len(memoryview(b).cast("B")) for b in body)
        return Answer(body, headers, MEDIA_TYPES[p.format], meta, length=length)

    def _streamed(
        self,
        image_id: str,
        filename: str | None,
        found: Found,
        p: AttentionParams,
        sel: Selection,
        ablate: Ablation = (),
    ) -> Answer:
        """A large binary answer: the header now, the layers when the socket has room for them.

        Runs on the worker thread (the metadata reads the capture); the chunks are computed there
        too, each when the previous one has been handed to the socket.
        """
        cap = found.cap
        shape = answers.answer_shape(sel, cap.att)
        dtype = np.dtype(np.float16 if p.dtype == "float16" else np.float32)
        dropped = cap.drop_columns(p.drop, sel.stage)
        meta = self._meta(image_id, filename, found, sel, p, shape, ablate)
        timing = {**found.timing, "encode": 0.0}
        meta["timing_ms"] = dict(timing)
        head = binary_header(p.format, meta, shape, dtype)
        headers = binary_headers(p.format, meta, download_stem(image_id, cap.model_id, p))
        headers["Server-Timing"] = _server_timing(timing)
        pieces = answers.chunks(shape, dtype.itemsize, heads_split=sel.aggregate == "none")
        ticket = current_ticket()

        def rows_of(chunk: answers.Chunk):
            if sel.aggregate == "rollout":  # a product over layers: computed once, sliced
                return self._array(cap, sel, dropped, p.dtype)
            part = dataclasses.replace(sel, layers=[sel.layers[i] for i in chunk.layers])
            if chunk.heads is not None:
                part = dataclasses.replace(part, heads=[sel.heads[j] for j in chunk.heads])
            return self._array(cap, part, dropped, p.dtype)

        async def body() -> AsyncIterator[Part]:
            yield head
            whole = None
            for chunk in pieces:
                # Each chunk has the request's priority and a deadline of its own: a slow
                # reader may take longer than one request deadline to read the whole answer.
                # A client that leaves cancels the stream itself (StreamingResponse), so the
                # chunks do not poll for it.
                child = None
                if ticket is not None:
                    timeout = self.settings.request_timeout_s
                    child = Ticket(ticket.cls, time.monotonic() + timeout, timeout_s=timeout)
                try:
                    with using(child):
                        if whole is None or sel.aggregate != "rollout":
                            whole = await self.worker.run_in_worker(rows_of, chunk)
                except (asyncio.TimeoutError, ClientGone, SelectionError, RuntimeError) as e:
                    log.warning("streamed answer for %s cut short: %s", image_id, type(e).__name__)
                    raise StreamAborted(type(e).__name__) from None
                part = whole[chunk.layers.start : chunk.layers.stop] if sel.aggregate == "rollout" else whole
                if sel.aggregate != "rollout":
                    whole = None  # this chunk only lives until the socket has it
                yield memoryview(np.ascontiguousarray(part)).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+ only
                del part

        length = len(head) + answers.binary_bytes(shape, p.dtype)
        return Answer([], headers, MEDIA_TYPES[p.format], meta, stream=body(), length=length)

    def plan(self, image_id: str, found: Found, p: AttentionParams) -> tuple[Selection, int]:
        """Check the selection and the answer's size before building it (event loop, no torch).

        Returns:
            The selection and the answer's (estimated) size in bytes.

        Raises:
            SelectionError: a malformed selection (422).
            answers.AnswerTooLarge: JSON over ``max_json_bytes`` (413).
            QueueFullError: a large answer while every large-answer slot is taken (429).
        """
        cap = found.cap
        sel = self.selection(p, cap)
        shape = answers.answer_shape(sel, cap.att)
        if p.format == "json":
            size = answers.check_json(shape, p.dtype, self.settings.max_json_bytes)
        else:
            size = answers.binary_bytes(shape, p.dtype)
        self.admission.large_answer(size)
        return sel, size

    # -- entry points ---------------------------------------------------------------------
    async def attention(
        self,
        image_id: str,
        p: AttentionParams,
        *,
        upload: Upload | None = None,
        fault: str | None = None,
        is_disconnected: Disconnected | None = None,
    ) -> Answer | None:
        """The attention a request selects for an image; None once a known image is evicted.

        Args:
            upload: the image, when the request brought it (POST); GETs find it in the cache.
        """
        lm = await self.model(p.model)
        ablate = parse_ablate(p.ablate, lm.num_layers, lm.num_heads, windowed=lm.stages is not None)
        found = await self.capture(
            image_id,
            lm,
            upload=upload,
            every_row=p.needs_every_row,
            fault=fault,
            is_disconnected=is_disconnected,
            ablate=ablate,
        )
        if found is None:
            return None
        upload = upload or self.upload_of(image_id)
        filename = upload.filename if upload else None
        sel, size = self.plan(image_id, found, p)
        if p.format != "json" and size >= answers.STREAM_MIN_BYTES:
            return await self.worker.run_in_worker(self._streamed, image_id, filename, found, p, sel, ablate)
        return await self.worker.run_in_worker(self._answer, image_id, filename, found, p, ablate)

    async def post(
        self,
        upload: Upload,
        p: AttentionParams,
        *,
        fault: str | None = None,
        is_disconnected: Disconnected | None = None,
    ) -> Answer:
        """Keep the upload (for follow-up queries and the page), then answer as :meth:`attention`."""
        image_id = image_id_of(upload.data)
        self.cache.put(ImageKey(image_id), upload, len(upload.data) + UPLOAD_OVERHEAD_BYTES)
        answer = await self.attention(image_id, p, upload=upload, fault=fault, is_disconnected=is_disconnected)
        assert answer is not None  # computed from the upload itself
        return answer

    async def stats(
        self,
        image_id: str,
        model_id: str | None,
        mass: float,
        is_disconnected: Disconnected | None = None,
        ablate: str = "",
    ) -> dict | None:
        """Per-head statistics of a known image (computed once per mass fraction), of the model
        with the ``ablate`` heads removed."""
        lm = await self.model(model_id)
        pairs = parse_ablate(ablate, lm.num_layers, lm.num_heads, windowed=lm.stages is not None)
        found = await self.capture(image_id, lm, is_disconnected=is_disconnected, ablate=pairs)
        if found is None:
            return None
        # The statistics hold the worker for seconds: when the client leaves (the page cancels them
        # for a new image), a queued run is dropped and a running one stops at its next layer.
        gone = threading.Event()

        def check() -> None:
            if gone.is_set():
                raise ClientGone("the client closed the connection before the statistics")

        # Uploads go first: the priority queue runs their forwards ahead of this call.
        fut = asyncio.ensure_future(self.worker.run_after_forwards(found.cap.head_stats, mass, check))
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=DISCONNECT_POLL_S)
                if done:
                    break
                if is_disconnected is not None and await is_disconnected():
                    gone.set()
                    fut.cancel()
                    raise ClientGone("the client closed the connection before the statistics")
        except BaseException:
            gone.set()
            if not fut.done():
                fut.cancel()
            raise
        stats = fut.result()
        self.cache.recharge(CaptureKey(image_id, lm.id, pairs), ENTRY_OVERHEAD_BYTES + found.cap.extra_bytes())
        cap = found.cap
        if isinstance(cap.layout, WindowedLayout):  # the first stage's grid, and every stage's
            extra = {"tokens": cap.tokens(cap.layout.stages[0]), "stages": cap.layout.as_dict()}
        else:
            extra = {"tokens": cap.tokens()}
        return {"model": lm.id, "image_id": image_id, **stats, **extra, "ablated": [list(pair) for pair in pairs]}

    async def display_png(self, image_id: str) -> bytes | None:
        """The upload as a PNG for the page (longer side at most 1600), made once and cached."""
        png = self.cache.get(DisplayKey(image_id))
        if png is not None:
            return png
        upload = self.upload_of(image_id)
        if upload is None:
            return None
        data = upload.data
        shown: bytes = await self._decode(
            lambda: pictures.display_probe(data, self.settings.max_image_pixels), pictures.display_finish
        )
        self.cache.put(DisplayKey(image_id), shown, len(shown) + UPLOAD_OVERHEAD_BYTES)
        return shown


def _server_timing(timing: dict[str, float]) -> str:
    return ", ".join(f"{k};dur={v:.2f}" for k, v in timing.items())


def _retrieve(task: asyncio.Task) -> None:
    """Mark a shared computation's exception as seen (its waiters may all have gone)."""
    if not task.cancelled():
        task.exception()
