"""One result -> JSON (orjson, numpy-native), safetensors or npy.

Binary answers are returned as parts — a small header and the array's own buffer — so the
tensor bytes go from the array to the socket without being copied into a body first (an
18 MiB full-map answer would otherwise be copied once more, into freshly faulted pages). A
binary header needs only the shape and dtype (:func:`binary_header`), so large answers can be
streamed: the header first, then the array's bytes layer by layer (``answers.py``).

The ``X-Headscope-Meta`` header of binary answers is kept under 1 KB (common proxies buffer 4
to 8 KB of headers in all): :func:`short_meta` leaves out what does not fit (the query rows of
a ``query=all`` answer, long file names) and says so under ``omitted``; safetensors answers
carry the whole metadata in their own header, and the JSON answer of the same selection has it
too.
"""

from __future__ import annotations

import io
import json
import re
import struct
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import orjson

from ..engine.ablation import ablate_text

BodyPart = bytes | memoryview

MEDIA_TYPES = {
    "json": "application/json",
    "safetensors": "application/octet-stream",
    "npy": "application/octet-stream",
}

_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_STEM = 150  # characters of a download name before its extension


class NamedSelection(Protocol):
    """The request parameters a download name spells (AttentionParams has them)."""

    @property
    def query(self) -> str | None: ...

    @property
    def layers(self) -> str: ...

    @property
    def heads(self) -> str: ...

    @property
    def aggregate(self) -> str: ...

    @property
    def temperature(self) -> float: ...

    @property
    def drop(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def ablate(self) -> str: ...


def download_stem(image_id: str, model: str, p: NamedSelection) -> str:
    """The file name (less its extension) a binary attention answer is saved under: its Content-Disposition.

    ``headscope-<image id[:12]>-<model>-<query>`` plus what narrows the answer (``L<layers>``,
    ``H<heads>``, the aggregate, ``drop-<tokens>``, ``ablate-<heads off>``, the dtype,
    ``T<temperature>``), as :func:`answer_stem` spells them. The page's download links carry the
    same name (static/js/api.js ``downloadName``), so a browser saves the file under the name the
    page shows.
    """
    details = [p.query or "cls"]  # None: AnswerSubject.download_stem names the model's default row
    if p.layers != "all":
        details.append(f"L{p.layers}")
    if p.heads != "all" and p.aggregate == "none":
        details.append(f"H{p.heads}")
    if p.aggregate != "none":
        details.append(p.aggregate)
    if p.drop != "none":
        details.append(f"drop-{p.drop}")
    if p.ablate:  # the maps with heads off: not the model's own, so not their file name
        details.append(f"ablate-{p.ablate}")
    if p.dtype != "float32":
        details.append(p.dtype)
    if p.temperature != 1:
        details.append(f"T{p.temperature:g}")
    return answer_stem("headscope", image_id, model, *details)


def answer_stem(kind: str, image_id: str, model: str, *details: str) -> str:
    """``<kind>-<image id[:12]>-<model>[-<detail>...]``: the download name (less its extension) of
    every binary answer (attention, explain, output, relevance), each part reduced to
    ``[A-Za-z0-9._-]`` (a model id's ``:`` and ``/`` become ``_``).

    A name over ``MAX_STEM`` characters keeps every part: the longest of the model and what
    follows it are shortened until the name fits beside ``-`` and 8 hex digits of the whole
    name's FNV-1a hash, so two answers that differ only past the cut keep two names.
    """
    return fit_stem([_UNSAFE.sub("_", x).strip("_") for x in (kind, image_id[:12], model, *details)])


def ablate_detail(pairs: Iterable[tuple[int, int]]) -> list[str]:
    """The ``ablate-<layer>_<head>...`` detail of a name for heads removed (none: no detail)."""
    text = ablate_text(pairs)
    return [f"ablate-{text}"] if text else []


def fit_stem(parts: list[str], limit: int = MAX_STEM) -> str:
    """``parts`` joined by ``-``, at most ``limit`` characters (see :func:`answer_stem`): the
    first two (the kind and the image id) are kept whole."""
    stem = "-".join(parts)
    if len(stem) <= limit:
        return stem
    tag = f"{fnv1a32(stem):08x}"
    room = limit - len(tag) - 1
    parts = list(parts)
    while (excess := len("-".join(parts)) - room) > 0:
        i = max(range(2, len(parts)), key=lambda k: len(parts[k]))  # the first of the longest
        parts[i] = parts[i][: max(1, len(parts[i]) - excess)]
    return "-".join(parts) + "-" + tag


def fnv1a32(text: str) -> int:
    """The 32-bit FNV-1a hash of ``text``'s UTF-8 bytes (api.js ``fnv1a32``: the same number)."""
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def _raw(array: np.ndarray) -> memoryview:
    """The C-order bytes of ``array`` as a flat view (a copy only if it is not C-contiguous)."""
    return memoryview(np.ascontiguousarray(array)).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+ only


META_HEADER_MAX_BYTES = 1000


def safetensors_header(
    array: np.ndarray | None,
    name: str,
    metadata: dict[str, str],
    shape: tuple[int, ...] | None = None,
    dtype: np.dtype | None = None,
) -> bytes:
    """The safetensors prefix for one tensor: u64 little-endian header size, then the JSON header.

    Padded with spaces to a multiple of 8 bytes, as the safetensors library writes it, so the
    tensor data that follows is aligned. Give ``array``, or its ``shape`` and ``dtype``.
    """
    shape = tuple(array.shape) if array is not None else tuple(shape or ())
    dtype = np.dtype(array.dtype if array is not None else dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    header = {
        "__metadata__": metadata,
        name: {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [0, nbytes],
        },
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def npy_header(array: np.ndarray | None, shape: tuple[int, ...] | None = None, dtype: np.dtype | None = None) -> bytes:
    """The ``.npy`` format header for ``array`` (C order), or for its ``shape`` and ``dtype``."""
    buf = io.BytesIO()
    if array is not None:
        d = np.lib.format.header_data_from_array_1_0(np.ascontiguousarray(array))
    else:
        assert shape is not None and dtype is not None
        d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(buf, d)
    return buf.getvalue()


# Always kept in the short metadata: a client needs them to read the array.
_KEPT = ("image_id", "shape", "dtype", "model", "cached", "precision")


def short_meta(meta: dict[str, Any], limit: int = META_HEADER_MAX_BYTES) -> str:
    """``meta`` as ASCII JSON of at most ``limit`` bytes, for the ``X-Headscope-Meta`` header.

    The largest fields are left out until it fits, and named under ``omitted`` (the
    safetensors header and the JSON answer carry everything); ``image_id``, ``shape``,
    ``dtype``, ``model``, ``cached`` and ``precision`` always stay.
    """
    meta = dict(meta)
    omitted: list[str] = []

    def dumps() -> str:
        return json.dumps(
            {**meta, **({"omitted": omitted} if omitted else {})}, ensure_ascii=True, separators=(",", ":")
        )

    text = dumps()
    while len(text) > limit:
        droppable = [k for k in meta if k not in _KEPT]
        if not droppable:
            break
        biggest = max(droppable, key=lambda k: len(json.dumps(meta[k], ensure_ascii=True)))
        del meta[biggest]
        omitted.append(biggest)
        text = dumps()
    return text


def binary_header(
    fmt: str, meta: dict[str, Any], shape: tuple[int, ...], dtype: np.dtype, key: str = "attention"
) -> bytes:
    """What precedes the array's bytes in a safetensors or npy answer (``key``: the tensor's name)."""
    if fmt == "safetensors":
        meta_json = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
        return safetensors_header(None, key, {"headscope": meta_json, "shape": json.dumps(list(shape))}, shape, dtype)
    if fmt == "npy":
        return npy_header(None, shape, dtype)
    raise ValueError(f"unknown format {fmt!r}")


def binary_headers(fmt: str, meta: dict[str, Any], name: str | None = None) -> dict[str, str]:
    """The HTTP headers of a binary answer: a download name and the short metadata.

    ``name``: the download name without its extension (``download_stem``); ``attention-<image id>``
    when not given.
    """
    stem = name or f"attention-{meta.get('image_id', 'x')}"
    return {
        "Content-Disposition": f'attachment; filename="{stem}.{fmt}"',
        "X-Headscope-Meta": short_meta(meta),
    }


def encode(
    array: np.ndarray, meta: dict[str, Any], fmt: str, name: str | None = None, key: str = "attention"
) -> tuple[list[BodyPart], dict[str, str]]:
    """Encode ``array`` (``[layers, heads, queries, tokens]``) with its metadata.

    ``name``: the download name of a binary answer without its extension (``download_stem``);
    ``attention-<image id>`` when not given. ``key``: the array's name in the JSON answer and
    the safetensors file (``relevance`` for a relevance map).

    Returns:
        The body as parts to be sent in order (``b"".join(parts)`` is the whole body), and extra
        response headers. JSON carries the metadata inline with the array under ``attention``;
        safetensors stores it in the header's ``__metadata__`` (every value a JSON string); both
        binary formats carry it, shortened (:func:`short_meta`), as the ``X-Headscope-Meta``
        header (JSON, ASCII).
    """
    if fmt == "json":
        return [orjson.dumps({**meta, key: array}, option=orjson.OPT_SERIALIZE_NUMPY)], {}
    if fmt in ("safetensors", "npy"):
        head = binary_header(fmt, meta, tuple(array.shape), array.dtype, key)
        return [head, _raw(array)], binary_headers(fmt, meta, name)
    raise ValueError(f"unknown format {fmt!r}")
