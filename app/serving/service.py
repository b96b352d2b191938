"""The request path in one place: decode -> queue -> capture -> select -> encode.

Routes stay thin: they parse HTTP, take an admission slot and call :class:`AttentionService`.
POST and GET share one path (:meth:`AttentionService.attention`): the upload, if any, goes into
the byte-bounded cache; the capture comes from the cache or from the worker; the answer is
sliced and encoded on the worker thread. Follow-up queries (another layer, head or patch) are
answered from the cached capture without a forward pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

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
from . import images
from .cache import ByteLRU, CaptureKey, ImageKey
from .encoders import MEDIA_TYPES, Part, download_stem, encode
from .metrics import Metrics
from .params import AttentionParams
from .worker import Job, Worker

# What a cached entry costs beyond its buffers (the dataclass, dicts, the key).
ENTRY_OVERHEAD_BYTES = 4096
UPLOAD_OVERHEAD_BYTES = 512
# How often a waiting request checks whether its client is still there.
DISCONNECT_POLL_S = 0.1

Disconnected = Callable[[], Awaitable[bool]]


class ClientGone(Exception):
    """The client went away while its request waited; nothing is computed for it."""


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
    stats: dict = field(default_factory=dict)  # mass fraction -> head_stats(), computed once

    def head_stats(self, mass: float = 0.6, check: Callable[[], None] | None = None) -> dict:
        """The statistics for ``mass``, computed once; ``check`` may raise between layers to stop."""
        if mass not in self.stats:
            if isinstance(self.att, WindowedAttention):
                from ..engine.window_stats import window_head_stats

                self.stats[mass] = window_head_stats(self.att, self.input_size, mass, check=check)
            else:
                from ..engine.stats import head_stats

                assert isinstance(self.layout, TokenLayout)
                self.stats[mass] = head_stats(self.att, self.layout, self.input_size, mass, check=check)
        return self.stats[mass]

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
    body: list[Part]  # sent in order; b"".join(body) is the whole body
    headers: dict[str, str]
    media_type: str
    meta: dict[str, Any]


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

    def __init__(self, settings: Settings, registry: Registry, worker: Worker, metrics: Metrics):
        self.settings = settings
        self.registry = registry
        self.worker = worker
        self.metrics = metrics

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
    def _prepare(self, data: bytes, lm: LoadedModel) -> images.Prepared:
        img = images.decode(data, self.settings.max_image_pixels)
        return images.prepare(
            img,
            lm.input_size,
            lm.patch_size,
            lm.mean,
            lm.std,
            self.settings.resize,
            self.settings.max_aspect,
            lm.dynamic,
        )

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
        """Decode, queue, wait for the worker; the capture goes into the cache."""
        deadline = time.monotonic() + self.settings.request_timeout_s
        prep = await run_in_threadpool(self._prepare, upload.data, lm)
        layout = lm.layout(prep.input_size)
        materialise = every_row and isinstance(layout, TokenLayout) and lm.capture.materialise_pays(layout.count)
        job = Job(lm=lm, pixels=prep.pixels, deadline=deadline, fault=fault, materialise=materialise, ablate=ablate)
        fut = self.worker.submit(job)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise asyncio.TimeoutError()
                done, _ = await asyncio.wait({fut}, timeout=min(DISCONNECT_POLL_S, remaining))
                if done:
                    break
                if is_disconnected is not None and await is_disconnected():
                    fut.cancel()
                    raise ClientGone("the client closed the connection before the answer")
            computed = fut.result()
        except BaseException:
            if not fut.done():
                fut.cancel()
            raise
        cap = Capture(lm.id, computed.att, layout, prep.input_size, prep.image_size)
        # Batch-mates share the forward's buffers: the cache charges each buffer once.
        key = CaptureKey(image_id, lm.id, ablate)
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
        return Selection(
            layers=parse_indices(p.layers, att.num_layers, "layers"),
            heads=parse_indices(p.heads, att.num_heads, "heads"),
            rows=parse_query(p.query, cap.layout),
            aggregate=p.aggregate,
            rollout_start=p.rollout_start,
            head_fusion=p.head_fusion,
            discard_ratio=p.discard_ratio,
            temperature=p.temperature,
        )

    def _answer(
        self, image_id: str, filename: str | None, found: Found, p: AttentionParams, ablate: Ablation = ()
    ) -> Answer:
        t0 = time.perf_counter()
        cap = found.cap
        sel = self.selection(p, cap)
        dropped = cap.drop_columns(p.drop, sel.stage)
        tensor = analysis.attention_tensor(cap.att, sel)
        if dropped:
            tensor = analysis.drop_and_renormalise(tensor, dropped)
        # torch converts to float16 with SIMD; numpy's astype is ~60x slower on 18 MiB of maps.
        array = (tensor.to(torch.float16) if p.dtype == "float16" else tensor.float()).numpy()
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
            "shape": list(array.shape),
            "cached": found.cached,
            "dropped": dropped,
            "temperature": p.temperature,
            "ablated": [list(pair) for pair in ablate],
        }
        if isinstance(cap.layout, WindowedLayout):
            meta["stages"] = cap.layout.as_dict()
        if p.stats and p.format == "json":
            meta["stats"] = cap.head_stats()
        # "encode" in the body covers slicing and conversion; serialising the body itself is
        # added in the Server-Timing header, the only place it can still be written.
        timing = {**found.timing, "encode": (time.perf_counter() - t0) * 1000}
        meta["timing_ms"] = dict(timing)
        body, headers = encode(array, meta, p.format, download_stem(image_id, cap.model_id, p))
        timing["encode"] = (time.perf_counter() - t0) * 1000
        headers["Server-Timing"] = ", ".join(f"{k};dur={v:.2f}" for k, v in timing.items())
        return Answer(body, headers, MEDIA_TYPES[p.format], meta)

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

        # Uploads go first: the statistics of a picture already captured can wait for them.
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
        cap = found.cap
        if isinstance(cap.layout, WindowedLayout):  # the first stage's grid, and every stage's
            extra = {"tokens": cap.tokens(cap.layout.stages[0]), "stages": cap.layout.as_dict()}
        else:
            extra = {"tokens": cap.tokens()}
        return {"model": lm.id, "image_id": image_id, **stats, **extra, "ablated": [list(pair) for pair in pairs]}
