"""Answer sizes, known before an answer is built, and binary answers streamed layer by layer.

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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.hooks import Attention
from ..engine.selection import Selection

JSON_BYTES_PER_NUMBER = 14
STREAM_MIN_BYTES = 2**20
CHUNK_BYTES = 4 * 2**20
MiB = 2**20


class AnswerTooLarge(ValueError):
    """The answer would be over a size limit (answered 413 ``answer_too_large``)."""


def answer_shape(sel: Selection, att: Attention) -> tuple[int, int, int, int]:
    """``[layers, heads, queries, tokens]`` of the answer to ``sel`` (a windowed model's selected
    layers are of one stage: its grid and heads)."""
    first = sel.layers[0]
    num_tokens = att.tokens_at(first)
    selected = len(sel.heads) if sel.heads is not None else att.heads_at(first)
    heads = 1 if sel.aggregate in ("mean", "max", "rollout") else selected
    queries = num_tokens if sel.queries is None else len(sel.queries)
    return len(sel.layers), heads, queries, num_tokens


def numbers(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def binary_bytes(shape: Sequence[int], dtype: str) -> int:
    return numbers(shape) * np.dtype(dtype).itemsize


def json_bytes(shape: Sequence[int]) -> int:
    """Estimated size of the JSON answer (the metadata around the maps is small next to them)."""
    return numbers(shape) * JSON_BYTES_PER_NUMBER + 64 * 1024


def check_json(shape: Sequence[int], dtype: str, limit: int) -> int:
    """The JSON answer's estimated size; raise :class:`AnswerTooLarge` when it is over ``limit``."""
    size = json_bytes(shape)
    if size > limit:
        L, H, Q, N = shape
        raise AnswerTooLarge(
            f"this selection ({L} layers x {H} heads x {Q} query rows x {N} tokens) would be about "
            f"{size / MiB:,.0f} MiB of JSON, over the {limit / MiB:,.0f} MiB limit for JSON answers; ask for "
            f"format=safetensors or format=npy ({binary_bytes(shape, dtype) / MiB:,.1f} MiB, streamed), or select "
            f"less: fewer layers (layers=-1), heads (heads=0 or aggregate=mean) or query rows (query=cls or "
            f"query=patch:R,C)"
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
