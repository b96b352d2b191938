"""The request path in one place: decode -> queue -> capture -> select -> encode.

Routes stay thin: they parse HTTP and call :class:`AttentionService`. The service keeps the
uploads and their captures in a byte-bounded cache so follow-up queries (another layer, head or
patch) are answered without a forward pass.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Awaitable

import torch
from starlette.concurrency import run_in_threadpool

from . import analysis, images
from .cache import ByteLRU
from .capture import ImageAttention
from .config import Settings
from .encoders import Part, encode
from .registry import LoadedModel, Registry, TokenLayout
from .schemas import AttentionParams
from .selection import Selection, asks_every_row, parse_indices, parse_query
from .worker import Job, Worker


class ClientGone(Exception):
    """The client went away while its request waited; nothing is computed for it."""


@dataclass
class Upload:
    data: bytes
    filename: str | None


@dataclass
class Capture:
    model_id: str
    att: ImageAttention
    layout: TokenLayout
    input_size: tuple[int, int]
    image_size: tuple[int, int]
    stats: dict = field(default_factory=dict)  # mass fraction -> head_stats(), computed once

    def head_stats(self, mass: float = 0.6) -> dict:
        if mass not in self.stats:
            from .stats import head_stats
            self.stats[mass] = head_stats(self.att, self.layout, self.input_size, mass)
        return self.stats[mass]

    def drop_columns(self, drop: str) -> list[int]:
        """Token indices a ``drop`` option removes from maps (prefix and/or artifact tokens)."""
        from .stats import artifact_tokens

        parts = {p.strip() for p in drop.split(",")} - {"none", ""}
        cols: list[int] = []
        if "prefix" in parts:
            cols += list(range(self.layout.num_prefix))
        if "artifacts" in parts:
            cols += artifact_tokens(self.att.last_norms, self.layout.num_prefix)[0]
        return sorted(set(cols))


@dataclass
class Answer:
    body: list[Part]  # sent in order; b"".join(body) is the whole body
    headers: dict[str, str]
    media_type: str
    meta: dict[str, Any]


def image_id_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:24]


def safe_filename(name: str | None) -> str | None:
    """Keep only the last path part, printable and short: for display, never for paths."""
    if not name:
        return None
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable())[:200]
    return name or None


def wants_every_row(p: AttentionParams) -> bool:
    """Whether an answer needs every row of every selected map (``query=all``, rollout).

    Such captures keep the full softmax maps from the unfused forward rather than q and k: one
    pass that builds the maps costs less than a fused pass plus recomputing all of them. Large
    inputs still keep q and k (:meth:`AttentionCapture.materialise_pays`): N^2 maps outgrow them.
    """
    return asks_every_row(p.query) or p.aggregate == "rollout"


class AttentionService:
    def __init__(self, settings: Settings, registry: Registry, worker: Worker):
        self.settings = settings
        self.registry = registry
        self.worker = worker
        m = worker.metrics

        def on_change(nbytes: int, entries: int) -> None:
            m.cache_bytes.set(nbytes)
            m.cache_entries.set(entries)

        self.cache = ByteLRU(settings.cache_bytes, on_change)
        worker.on_oom.append(self.free_device_memory)

    def free_device_memory(self) -> int:
        """Evict the cached captures kept in accelerator memory; returns the bytes freed.

        The worker calls this when a forward runs out of device memory: the forward of a new
        request matters more than a follow-up query on an old one.
        """
        return self.cache.evict_where(lambda v: isinstance(v, Capture) and v.att.device.type != "cpu")

    # -- pieces ---------------------------------------------------------------------------
    def _prepare(self, data: bytes, lm: LoadedModel) -> images.Prepared:
        img = images.decode(data, self.settings.max_image_pixels)
        return images.prepare(img, lm.input_size, lm.patch_size, lm.mean, lm.std,
                              self.settings.resize, self.settings.max_aspect, lm.dynamic)

    async def model(self, model_id: str | None) -> LoadedModel:
        mid = self.registry.resolve(model_id)
        if self.registry.is_loaded(mid):
            return self.registry.get(mid)
        # Loading is slow (weights, maybe a download): do it on the worker thread.
        return await self.worker.run_in_worker(self.registry.get, mid)

    async def _capture(self, image_id: str, data: bytes, lm: LoadedModel, fault: str | None,
                       is_disconnected: Callable[[], Awaitable[bool]] | None,
                       materialise: bool = False) -> tuple[Capture, dict]:
        deadline = time.monotonic() + self.settings.request_timeout_s
        self.worker.admit()
        try:
            prep = await run_in_threadpool(self._prepare, data, lm)
            materialise = materialise and lm.capture.materialise_pays(lm.layout(prep.input_size).count)
            job = Job(lm=lm, pixels=prep.pixels, deadline=deadline, fault=fault, materialise=materialise)
            return await self._wait(job, deadline, is_disconnected, prep, image_id, lm)
        finally:
            self.worker.release()

    async def _wait(self, job, deadline, is_disconnected, prep, image_id, lm) -> tuple[Capture, dict]:
        fut = self.worker.submit(job)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise asyncio.TimeoutError()
                done, _ = await asyncio.wait({fut}, timeout=min(0.1, remaining))
                if done:
                    break
                if is_disconnected is not None and await is_disconnected():
                    fut.cancel()
                    raise ClientGone("the client closed the connection before the answer")
            att = fut.result()
        except BaseException:
            if not fut.done():
                fut.cancel()
            raise
        cap = Capture(lm.id, att, lm.layout(prep.input_size), prep.input_size, prep.image_size)
        # Batch-mates share the forward's buffers: the cache charges each buffer once.
        self.cache.put(("att", image_id, lm.id), cap, 4096, shared=att.storages())
        timing = {"queue": (job.started - job.enqueued) * 1000, "compute": (job.finished - job.started) * 1000}
        return cap, timing

    def selection(self, p: AttentionParams, cap: Capture) -> Selection:
        att = cap.att
        return Selection(
            layers=parse_indices(p.layers, att.num_layers, "layers"),
            heads=parse_indices(p.heads, att.num_heads, "heads"),
            rows=parse_query(p.query, cap.layout),
            aggregate=p.aggregate, rollout_start=p.rollout_start,
            head_fusion=p.head_fusion, discard_ratio=p.discard_ratio,
        )

    def _answer(self, image_id: str, upload: Upload | None, cap: Capture, p: AttentionParams,
                sel: Selection, timing: dict, cached: bool) -> Answer:
        t0 = time.perf_counter()
        tensor = analysis.attention_tensor(cap.att, sel)
        dropped = cap.drop_columns(p.drop)
        if dropped:
            tensor = analysis.drop_and_renormalise(tensor, dropped)
        # torch converts to float16 with SIMD; numpy's astype is ~60x slower on 18 MiB of maps.
        array = (tensor.to(torch.float16) if p.dtype == "float16" else tensor.float()).numpy()
        heads: list[Any] = list(sel.heads) if sel.aggregate == "none" else [sel.aggregate]
        meta: dict[str, Any] = {
            "model": cap.model_id, "image_id": image_id,
            "filename": upload.filename if upload else None,
            "image_size": list(cap.image_size), "input_size": list(cap.input_size),
            "tokens": cap.layout.as_dict(), "layers": sel.layers, "heads": heads,
            "query": sel.rows if sel.rows is not None else list(range(cap.layout.count)),
            "aggregate": sel.aggregate, "dtype": p.dtype, "shape": list(array.shape), "cached": cached,
            "dropped": dropped,
        }
        if p.stats and p.format == "json":
            meta["stats"] = cap.head_stats()
        # "encode" in the body covers slicing and conversion; serialising the body itself is
        # added in the Server-Timing header, the only place it can still be written.
        timing = {**timing, "encode": (time.perf_counter() - t0) * 1000}
        meta["timing_ms"] = dict(timing)
        body, headers = encode(array, meta, p.format)
        timing["encode"] = (time.perf_counter() - t0) * 1000
        headers["Server-Timing"] = ", ".join(f"{k};dur={v:.2f}" for k, v in timing.items())
        return Answer(body, headers, "application/json" if p.format == "json" else "application/octet-stream", meta)

    # -- entry points ---------------------------------------------------------------------
    async def post(self, upload: Upload, p: AttentionParams, fault: str | None = None,
                   is_disconnected=None) -> Answer:
        lm = await self.model(p.model)
        image_id = image_id_of(upload.data)
        record = (upload.data, upload.filename)
        self.cache.put(("img", image_id), record, len(upload.data) + 512)
        cap = self.cache.get(("att", image_id, lm.id))
        if cap is not None:
            self.worker.metrics.cache_hits.inc()
            timing, cached = {"queue": 0.0, "compute": 0.0}, True
        else:
            cap, timing = await self._capture(image_id, upload.data, lm, fault, is_disconnected, wants_every_row(p))
            cached = False
        sel = self.selection(p, cap)
        return await self._encode(image_id, upload, cap, p, sel, timing, cached)

    async def get(self, image_id: str, p: AttentionParams, is_disconnected=None) -> Answer | None:
        """Answer from the cache; recompute from a cached upload for another model; None if gone."""
        lm = await self.model(p.model)
        cap = self.cache.get(("att", image_id, lm.id))
        record = self.cache.get(("img", image_id))
        upload = Upload(record[0], record[1]) if record else None
        if cap is not None:
            self.worker.metrics.cache_hits.inc()
            timing, cached = {"queue": 0.0, "compute": 0.0}, True
        elif upload is not None:
            cap, timing = await self._capture(image_id, upload.data, lm, None, is_disconnected, wants_every_row(p))
            cached = False
        else:
            return None
        sel = self.selection(p, cap)
        return await self._encode(image_id, upload, cap, p, sel, timing, cached)

    async def _encode(self, image_id, upload, cap, p, sel, timing, cached) -> Answer:
        # Every torch op runs on the worker thread. A second thread that runs parallel torch ops
        # (event loop, AnyIO pool) gets its own OpenMP team, and from then on every forward is
        # ~16 % slower on a 2-core machine (bench/: lock-step A/B, 0.82-0.84x).
        return await self.worker.run_in_worker(self._answer, image_id, upload, cap, p, sel, timing, cached)

    async def stats(self, image_id: str, model_id: str | None, mass: float, is_disconnected=None) -> dict | None:
        """Per-head statistics of a cached image (computed once per mass fraction)."""
        lm = await self.model(model_id)
        cap = self.cache.get(("att", image_id, lm.id))
        if cap is None:
            upload = self.upload_of(image_id)
            if upload is None:
                return None
            cap, _ = await self._capture(image_id, upload.data, lm, None, is_disconnected)
        stats = await self.worker.run_in_worker(cap.head_stats, mass)
        return {"model": lm.id, "image_id": image_id, **stats, "tokens": cap.layout.as_dict()}

    def upload_of(self, image_id: str) -> Upload | None:
        record = self.cache.get(("img", image_id))
        return Upload(record[0], record[1]) if record else None
