"""One result -> JSON (orjson, numpy-native), safetensors or npy.

Binary answers are returned as parts — a small header and the array's own buffer — so the
tensor bytes go from the array to the socket without being copied into a body first (an
18 MiB full-map answer would otherwise be copied once more, into freshly faulted pages).
"""

from __future__ import annotations

import io
import json
import re
import struct
from typing import Any, Protocol

import numpy as np
import orjson

Part = bytes | memoryview

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
    def query(self) -> str: ...

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


def download_stem(image_id: str, model: str, p: NamedSelection) -> str:
    """The file name (less its extension) a binary answer is saved under: its Content-Disposition.

    ``headscope-<image id[:12]>-<model>-<query>`` plus what narrows the answer (``L<layers>``,
    ``H<heads>``, the aggregate, ``drop-<tokens>``, the dtype, ``T<temperature>``), each part reduced to
    ``[A-Za-z0-9._-]``. The page's download links carry the same name (static/js/api.js
    ``downloadName``), so a browser saves the file under the name the page shows.
    """
    parts = ["headscope", image_id[:12], model, p.query]
    if p.layers != "all":
        parts.append(f"L{p.layers}")
    if p.heads != "all" and p.aggregate == "none":
        parts.append(f"H{p.heads}")
    if p.aggregate != "none":
        parts.append(p.aggregate)
    if p.drop != "none":
        parts.append(f"drop-{p.drop}")
    if p.dtype != "float32":
        parts.append(p.dtype)
    if p.temperature != 1:
        parts.append(f"T{p.temperature:g}")
    stem = "-".join(_UNSAFE.sub("_", x).strip("_") for x in parts)
    return stem[:MAX_STEM]


def _raw(array: np.ndarray) -> memoryview:
    """The C-order bytes of ``array`` as a flat view (a copy only if it is not C-contiguous)."""
    return memoryview(np.ascontiguousarray(array)).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+ only


def safetensors_header(array: np.ndarray, name: str, metadata: dict[str, str]) -> bytes:
    """The safetensors prefix for one tensor: u64 little-endian header size, then the JSON header.

    Padded with spaces to a multiple of 8 bytes, as the safetensors library writes it, so the
    tensor data that follows is aligned.
    """
    header = {
        "__metadata__": metadata,
        name: {
            "dtype": _SAFETENSORS_DTYPES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [0, array.nbytes],
        },
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def npy_header(array: np.ndarray) -> bytes:
    """The ``.npy`` format header for ``array`` (C order)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(np.ascontiguousarray(array)))
    return buf.getvalue()


def encode(
    array: np.ndarray, meta: dict[str, Any], fmt: str, name: str | None = None
) -> tuple[list[Part], dict[str, str]]:
    """Encode ``array`` (``[layers, heads, queries, tokens]``) with its metadata.

    ``name``: the download name of a binary answer without its extension (``download_stem``);
    ``attention-<image id>`` when not given.

    Returns:
        The body as parts to be sent in order (``b"".join(parts)`` is the whole body), and extra
        response headers. JSON carries the metadata inline with the array under ``attention``;
        safetensors stores it in the header's ``__metadata__`` (every value a JSON string) and
        npy answers carry it as the ``X-Headscope-Meta`` header (JSON, ASCII).
    """
    if fmt == "json":
        return [orjson.dumps({**meta, "attention": array}, option=orjson.OPT_SERIALIZE_NUMPY)], {}
    meta_json = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
    stem = name or f"attention-{meta.get('image_id', 'x')}"
    if fmt == "safetensors":
        head = safetensors_header(array, "attention", {"headscope": meta_json, "shape": json.dumps(list(array.shape))})
        return [head, _raw(array)], {
            "Content-Disposition": f'attachment; filename="{stem}.safetensors"',
            "X-Headscope-Meta": meta_json,
        }
    if fmt == "npy":
        return [npy_header(array), _raw(array)], {
            "Content-Disposition": f'attachment; filename="{stem}.npy"',
            "X-Headscope-Meta": meta_json,
        }
    raise ValueError(f"unknown format {fmt!r}")
