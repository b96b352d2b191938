"""One result -> JSON (orjson, numpy-native), safetensors or npy bytes."""
from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import orjson

MEDIA_TYPES = {
    "json": "application/json",
    "safetensors": "application/octet-stream",
    "npy": "application/octet-stream",
}


def encode(array: np.ndarray, meta: dict[str, Any], fmt: str) -> tuple[bytes, dict[str, str]]:
    """Encode ``array`` (``[layers, heads, queries, tokens]``) with its metadata.

    Returns:
        The body and extra response headers. JSON carries the metadata inline with the array
        under ``attention``; safetensors stores it in the header's ``__metadata__`` (every value
        a JSON string) and npy answers carry it as the ``X-Headscope-Meta`` header (JSON, ASCII).
    """
    if fmt == "json":
        body = orjson.dumps({**meta, "attention": array}, option=orjson.OPT_SERIALIZE_NUMPY)
        return body, {}
    meta_json = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
    if fmt == "safetensors":
        from safetensors.numpy import save

        body = save({"attention": np.ascontiguousarray(array)},
                    metadata={"headscope": meta_json, "shape": json.dumps(list(array.shape))})
        return body, {"Content-Disposition": f'attachment; filename="attention-{meta.get("image_id", "x")}.safetensors"',
                      "X-Headscope-Meta": meta_json}
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        return buf.getvalue(), {"Content-Disposition": f'attachment; filename="attention-{meta.get("image_id", "x")}.npy"',
                                "X-Headscope-Meta": meta_json}
    raise ValueError(f"unknown format {fmt!r}")
