"""Encoding cost of the answers: JSON (orjson with OPT_SERIALIZE_NUMPY vs stdlib json) and
safetensors bytes, for CLS rows ``[12, 6, 1, 257]`` and all maps ``[12, 6, 257, 257]``.

The orjson and safetensors rows call :func:`app.encoders.encode`, i.e. exactly what the API
does with a selection's array and its metadata; the stdlib row is ``json.dumps`` of the same
dict with ``array.tolist()``, what a hand-written endpoint would do. A safetensors answer is a
small header plus a view of the array's own buffer (no copy); the bytes are copied only by the
socket write, which the API part measures.
"""

from __future__ import annotations

import json

import numpy as np

from headscope.serving.encoders import encode

from .common import BenchFailure, Variant


def meta_for(shape: tuple[int, ...], n_tokens: int) -> dict:
    L, H, Q, N = shape
    return {
        "model": "dinov2-s14-focus",
        "image_id": "0" * 24,
        "filename": "bench.png",
        "image_size": [224, 224],
        "input_size": [224, 224],
        "tokens": {
            "count": n_tokens,
            "num_prefix": 1,
            "prefix": [{"index": 0, "kind": "cls"}],
            "grid": [16, 16],
            "patch_size": [14, 14],
        },
        "layers": list(range(L)),
        "heads": list(range(H)),
        "query": [0] if Q == 1 else list(range(Q)),
        "aggregate": "none",
        "dtype": "float32",
        "shape": list(shape),
        "cached": False,
        "dropped": [],
        "timing_ms": {"queue": 0.0, "compute": 0.0, "encode": 0.0},
    }


def build_variants(cls: np.ndarray, full: np.ndarray, stdlib_full_iters: int) -> list[Variant]:
    """``cls``/``full``: float32 arrays from a real capture of one image."""
    out = []
    for name, arr in (("cls", cls), ("full", full)):
        meta = meta_for(arr.shape, arr.shape[-1])
        mb = arr.nbytes / 2**20

        def orj(_x, arr=arr, meta=meta):
            return encode(arr, meta, "json")[0][0]

        def std(_x, arr=arr, meta=meta):
            return json.dumps({**meta, "attention": arr.tolist()}).encode()

        def st(_x, arr=arr, meta=meta):
            return encode(arr, meta, "safetensors")[0]  # header + the array's buffer, as the API sends it

        what = "CLS rows" if name == "cls" else "all maps"
        out += [
            Variant(
                f"enc_{name}_orjson",
                f"JSON {what} (orjson, numpy)",
                orj,
                _check_json(arr),
                "encode",
                note=f"{mb:.2f} MiB float32",
            ),
            Variant(
                f"enc_{name}_stdlib",
                f"JSON {what} (stdlib json)",
                std,
                _check_json(arr),
                "encode",
                max_iters=stdlib_full_iters if name == "full" else None,
            ),
            Variant(f"enc_{name}_safetensors", f"safetensors {what}", st, _check_st(arr), "encode"),
        ]
    return out


def _check_json(arr: np.ndarray):
    def check(body: bytes, _batch: int) -> None:
        import orjson

        got = np.asarray(orjson.loads(body)["attention"], dtype=np.float32)
        if got.shape != arr.shape or not np.array_equal(got, arr):
            raise BenchFailure(f"JSON round trip changed the array (shape {got.shape})")

    return check


def _check_st(arr: np.ndarray):
    def check(parts: list, _batch: int) -> None:
        from safetensors.numpy import load

        got = load(b"".join(parts))["attention"]
        if got.shape != arr.shape or not np.array_equal(got, arr):
            raise BenchFailure("safetensors round trip changed the array")

    return check
