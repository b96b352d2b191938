"""Answers to attention requests: selection -> metadata -> encoded body (or a stream).

The steps, each a function of its own so that any caller can take them (the service on the
worker thread, the command line, a notebook): :func:`selection` resolves a request's parameters
against a captured image, :func:`maps` slices and fuses the maps it asks for, :func:`meta` says
what they are (of an :class:`AnswerSubject`: the request and what it selects), :func:`built` encodes the
whole answer (JSON, safetensors or npy). The service's
:class:`Answers` checks an answer's size before it is built and streams the large binary ones.

An answer's shape follows from the selection alone (``[layers, heads, queries, tokens]``), so
its size is known before any of it is computed:

* JSON: about ``JSON_BYTES_PER_NUMBER`` (14) bytes per number (orjson's output for attention
  maps, float32 or float16 alike: both print as float32). Over ``HEADSCOPE_MAX_JSON_BYTES``
  (64 MiB) the request is refused with 413 ``answer_too_large`` before anything is computed,
  with the binary size and a smaller selection to ask for instead.
* binary (safetensors, npy): 4 or 2 bytes per number plus a header. Answers of
  ``STREAM_MIN_BYTES`` (1 MiB) or more are streamed: the header first, then the layers in
  chunks of about ``CHUNK_BYTES`` (4 MiB: several layers, or one layer's heads when a layer is
  larger), each computed on the worker thread when the socket has taken the previous one. A
  client that reads slowly (or not at all) holds about two chunks in the server (the one
  waiting to be sent and the rest of the one before, in the socket's buffer), not the whole
  answer; ``HEADSCOPE_SEND_TIMEOUT_S`` closes a connection whose reader stalls.

Answers of ``HEADSCOPE_LARGE_ANSWER_BYTES`` or more also take a large-answer slot (see
``admission.py``) until they are sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import Settings
from ..engine import analysis
from ..engine.ablation import Ablation
from ..engine.analysis import answer_shape
from ..engine.captured_image import CapturedImage
from ..engine.device import to_host
from ..engine.selection import Selection, SelectionError
from .admission import Admission, Ticket, current_ticket, using
from .encoders import MEDIA_TYPES, BodyPart, binary_header, binary_headers, download_stem, encode
from .params import AttentionParams
from .store import FoundCapture
from .waiting import ClientGone
from .worker import Worker

log = logging.getLogger(__name__)

JSON_BYTES_PER_NUMBER = 14
STREAM_MIN_BYTES = 2**20
CHUNK_BYTES = 4 * 2**20
MiB = 2**20


class AnswerTooLarge(ValueError):
    """The answer would be over a size limit (answered 413 ``answer_too_large``)."""


def numbers(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def binary_bytes(shape: Sequence[int], dtype: str) -> int:
    return numbers(shape) * np.dtype(dtype).itemsize


def json_bytes(shape: Sequence[int]) -> int:
    """Estimated size of the JSON answer (the metadata around the maps is small next to them)."""
    return numbers(shape) * JSON_BYTES_PER_NUMBER + 64 * 1024


def check_json(shape: Sequence[int], dtype: str, limit: int, cls_token: bool = True) -> int:
    """The JSON answer's estimated size; raise :class:`AnswerTooLarge` when it is over ``limit``
    (``cls_token``: whether ``query=cls`` is advice this model can take; Swin has no CLS token)."""
    size = json_bytes(shape)
    if size > limit:
        L, H, Q, N = shape
        rows = "query=cls or query=patch:R,C" if cls_token else "query=patch:R,C"
        raise AnswerTooLarge(
            f"this selection ({L} layers x {H} heads x {Q} query rows x {N} tokens) would be about "
            f"{size / MiB:,.0f} MiB of JSON, over the {limit / MiB:,.0f} MiB limit for JSON answers; ask for "
            f"format=safetensors or format=npy ({binary_bytes(shape, dtype) / MiB:,.1f} MiB, streamed), or select "
            f"less: fewer layers (layers=-1), heads (heads=0 or aggregate=mean) or query rows ({rows})"
        )
    return size


def chunks(shape: Sequence[int], itemsize: int, heads_split: bool, chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """The answer's body in pieces of about ``chunk_bytes``, in order: runs of whole layers, or,
    when one layer is larger than that and its heads may be computed apart (``heads_split``:
    no fusion over heads), one layer's heads in runs."""
    L, H = shape[0], shape[1]
    per_head = max(1, numbers(shape[2:]) * itemsize)
    per_layer = per_head * H
    if per_layer > chunk_bytes and heads_split and H > 1:
        step = max(1, chunk_bytes // per_head)
        return [Chunk(range(i, i + 1), range(j, min(H, j + step))) for i in range(L) for j in range(0, H, step)]
    step = max(1, chunk_bytes // per_layer)
    return [Chunk(range(i, min(L, i + step)), None) for i in range(0, L, step)]


@dataclass(frozen=True)
class Chunk:
    """Positions on the answer's layer axis and, when a layer is split, on its heads axis."""

    layers: range
    heads: range | None = None


class StreamAborted(Exception):
    """A streamed answer could not be finished (its next chunk missed its deadline); the
    connection is closed, which the client sees as a short body. Logged as one line."""


@dataclass
class Answer:
    body: list[BodyPart]  # sent in order; b"".join(body) is the whole body (empty when streamed)
    headers: dict[str, str]
    media_type: str
    meta: dict[str, Any]
    stream: AsyncIterator[BodyPart] | None = None  # a large binary answer, chunk by chunk
    length: int = 0  # the body's length (Content-Length), also when streamed


def server_timing(timing: dict[str, float]) -> str:
    """The ``Server-Timing`` header of an answer's timing (milliseconds by part)."""
    return ", ".join(f"{k};dur={v:.2f}" for k, v in timing.items())


def selection(params: AttentionParams, image: CapturedImage) -> Selection:
    """What ``params`` select of ``image`` (:meth:`CapturedImage.select`)."""
    return image.select(
        params.layers,
        params.heads,
        params.query,
        params.aggregate,
        params.rollout_start,
        params.head_fusion,
        params.discard_ratio,
        params.temperature,
    )


def map_tensor(
    image: CapturedImage, sel: Selection, dropped: list[int], tensor: torch.Tensor | None = None
) -> torch.Tensor:
    """The maps ``sel`` asks for, ``dropped`` key tokens zeroed and rows renormalised,
    ``[layers, heads, queries, tokens]`` float32 on the host (it may be a view of a batch's or
    the capture's memory); ``tensor``: the selection already computed
    (:func:`app.engine.analysis.batch_mates_tensors`, with batch-mates)."""
    if tensor is None:
        tensor = analysis.attention_tensor(image.att, sel)
    elif tensor.device.type != "cpu":
        tensor = to_host(tensor)
    if dropped:
        tensor = analysis.drop_and_renormalise(tensor, dropped)
    return tensor if tensor.dtype == torch.float32 else tensor.float()


def maps(
    image: CapturedImage, sel: Selection, dropped: list[int], dtype: str, tensor: torch.Tensor | None = None
) -> np.ndarray:
    """:func:`map_tensor` as a numpy array of ``dtype``."""
    tensor = map_tensor(image, sel, dropped, tensor)
    # torch converts to float16 with SIMD; numpy's astype is ~60x slower on 18 MiB of maps.
    return (tensor.to(torch.float16) if dtype == "float16" else tensor).numpy()


@dataclass
class AnswerSubject:
    """What an answer answers: an image (its id and name), its capture as found, the request's
    parameters, what they select of the capture, and the heads removed."""

    image_id: str
    filename: str | None
    found: FoundCapture
    params: AttentionParams
    sel: Selection
    ablate: Ablation = ()

    @property
    def image(self) -> CapturedImage:
        return self.found.entry.image

    def dropped(self) -> list[int]:
        """Key tokens the ``drop`` parameter removes from these maps."""
        return self.image.drop_columns(self.params.drop, self.sel.stage)

    def download_stem(self) -> str:
        params = self.params
        if params.query is None:  # the name says which row the default was
            params = params.model_copy(update={"query": self.image.default_query})
        return download_stem(self.image_id, self.found.entry.model_id, params)


def meta(asked: AnswerSubject, shape: Sequence[int], dropped: list[int] | None = None) -> dict[str, Any]:
    """What an attention answer says besides its maps (``dropped``: ``asked.dropped()``, where the
    caller has it already). Its lists are its own (a selection may be shared by batch-mates)."""
    entry, image, sel, params = asked.found.entry, asked.image, asked.sel, asked.params
    tokens = image.tokens(sel.stage)
    return {
        "model": entry.model_id,
        "image_id": asked.image_id,
        "filename": asked.filename,
        "image_size": list(entry.image_size),
        "input_size": list(entry.input_size),
        "tokens": tokens,
        "layers": list(sel.layers),
        "heads": sel.head_labels,
        "query": list(sel.queries) if sel.queries is not None else list(range(tokens["count"])),
        "aggregate": sel.aggregate,
        "dtype": params.dtype,
        "shape": list(shape),
        "cached": asked.found.cached,
        "dropped": list(dropped) if dropped is not None else asked.dropped(),
        "temperature": params.temperature,
        "ablated": [list(pair) for pair in asked.ablate],
        "precision": entry.precision,
        **image.layout_meta(),
    }


def built(asked: AnswerSubject) -> Answer:
    """A whole answer, encoded (JSON, or a binary answer too small to stream)."""
    t0 = time.perf_counter()
    params = asked.params
    array = maps(asked.image, asked.sel, asked.dropped(), params.dtype, asked.found.maps_of(asked.sel))
    head = meta(asked, array.shape)
    if params.stats and params.format == "json":
        head["stats"] = asked.found.entry.stats()
    # "encode" in the body covers slicing and conversion; serialising the body itself is
    # added in the Server-Timing header, the only place it can still be written.
    timing = {**asked.found.timing, "encode": (time.perf_counter() - t0) * 1000}
    head["timing_ms"] = dict(timing)
    body, headers = encode(array, head, params.format, asked.download_stem())
    timing["encode"] = (time.perf_counter() - t0) * 1000
    headers["Server-Timing"] = server_timing(timing)
    length = sum(len(memoryview(b).cast("B")) for b in body)
    return Answer(body, headers, MEDIA_TYPES[params.format], head, length=length)


def stats_body(image_id: str, found: FoundCapture, stats: dict[str, Any], ablate: Ablation = ()) -> dict[str, Any]:
    """The answer of ``GET …/stats``: ``stats`` (:meth:`Entry.stats`) with what they are of (a
    windowed model: the first stage's grid, and every stage)."""
    image = found.entry.image
    return {
        "model": found.entry.model_id,
        "image_id": image_id,
        **stats,
        "tokens": image.tokens(),
        **image.layout_meta(),
        "ablated": [list(pair) for pair in ablate],
        "precision": found.entry.precision,
    }


class Answers:
    """The service's answers: sized before they are built, built or streamed on the worker.

    Args:
        settings: the JSON limit and the request timeout (each streamed chunk gets one).
        worker: where answers are built (every torch operation runs there).
        admission: the large-answer slots.
    """

    def __init__(self, settings: Settings, worker: Worker, admission: Admission):
        self.settings = settings
        self.worker = worker
        self.admission = admission

    def plan(self, found: FoundCapture, params: AttentionParams) -> tuple[Selection, int]:
        """Check the selection and the answer's size before building it (event loop, no torch).

        Returns:
            The selection and the answer's (estimated) size in bytes.

        Raises:
            SelectionError: a malformed selection (422).
            AnswerTooLarge: JSON over ``max_json_bytes`` (413).
            QueueFullError: a large answer while every large-answer slot is taken (429).
        """
        sel = selection(params, found.entry.image)
        shape = answer_shape(sel, found.entry.image.att)
        if params.format == "json":
            # Swin, avg-pooled ViTs: no CLS token to advise
            cls_token = found.entry.image.layout_at(sel.layers[0]).cls_index is not None
            size = check_json(shape, params.dtype, self.settings.max_json_bytes, cls_token)
        else:
            size = binary_bytes(shape, params.dtype)
        self.admission.large_answer(size)
        return sel, size

    async def answer(
        self, image_id: str, filename: str | None, found: FoundCapture, params: AttentionParams, ablate: Ablation = ()
    ) -> Answer:
        """The answer, sized first; a large binary one is streamed. One that carries a
        ``filename`` (the answer to an upload) is sent with ``Cache-Control: no-store``."""
        sel, size = self.plan(found, params)
        asked = AnswerSubject(image_id, filename, found, params, sel, ablate)
        if params.format != "json" and size >= STREAM_MIN_BYTES:
            answer = await self.worker.run_answer(self._streamed, asked)
        else:
            answer = await self.worker.run_answer(built, asked)
        if filename is not None:
            # The name an uploader gave (in the body or X-Headscope-Meta): no cache keeps it.
            answer.headers["Cache-Control"] = "no-store"
        return answer

    def _streamed(self, asked: AnswerSubject) -> Answer:
        """A large binary answer: the header now, the layers when the socket has room for them.

        Runs on the worker thread (the metadata reads the capture); the chunks are computed there
        too, each when the previous one has been handed to the socket.
        """
        image, sel, params = asked.image, asked.sel, asked.params
        shape = answer_shape(sel, image.att)
        dtype = np.dtype(np.float16 if params.dtype == "float16" else np.float32)
        dropped = asked.dropped()
        head_meta = meta(asked, shape)
        timing = {**asked.found.timing, "encode": 0.0}
        head_meta["timing_ms"] = dict(timing)
        head = binary_header(params.format, head_meta, shape, dtype)
        headers = binary_headers(params.format, head_meta, asked.download_stem())
        headers["Server-Timing"] = server_timing(timing)
        pieces = chunks(shape, dtype.itemsize, heads_split=sel.aggregate == "none")
        ticket = current_ticket()

        def maps_of(chunk: Chunk) -> np.ndarray:
            if sel.aggregate == "rollout":  # a product over layers: computed once, sliced
                return maps(image, sel, dropped, params.dtype)
            part = dataclasses.replace(sel, layers=[sel.layers[i] for i in chunk.layers])
            if chunk.heads is not None:
                part = dataclasses.replace(part, heads=[sel.heads[j] for j in chunk.heads])
            return maps(image, part, dropped, params.dtype)

        async def body() -> AsyncIterator[BodyPart]:
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
                            whole = await self.worker.run_answer(maps_of, chunk)
                except (asyncio.TimeoutError, ClientGone, SelectionError, RuntimeError) as e:
                    log.warning("streamed answer for %s cut short: %s", asked.image_id, type(e).__name__)
                    raise StreamAborted(type(e).__name__) from None
                part = whole[chunk.layers.start : chunk.layers.stop] if sel.aggregate == "rollout" else whole
                if sel.aggregate != "rollout":
                    whole = None  # this chunk only lives until the socket has it
                yield memoryview(np.ascontiguousarray(part)).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+ only
                del part

        length = len(head) + binary_bytes(shape, params.dtype)
        return Answer([], headers, MEDIA_TYPES[params.format], head_meta, stream=body(), length=length)
