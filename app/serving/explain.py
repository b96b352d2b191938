"""GET .../explain: one head's whole computation for one query token, from the cached capture.

The capture already holds what it takes (q, k, v, the bias and the head outputs of every layer,
see :mod:`app.engine.capture`), so an image that is cached is answered without a forward pass;
the worker thread does the few small products (:func:`app.engine.explain.explain_head`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine.ablation import Ablation, parse_ablate
from ..engine.capture import ImageAttention
from ..engine.explain import explain_head, inner_steps
from ..engine.layout import TokenLayout
from ..engine.selection import MAX_SPEC, SelectionError, parse_query
from ..zoo.loaded import LoadedModel
from .service import Answer, AttentionService, Disconnected, Found


class ExplainParams(BaseModel):
    """Which head, layer and query token to explain (GET query parameters)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="model id (default: the server's default model)")
    layer: int = Field(-1, ge=-100_000, le=100_000, description="block index; negative counts from the end")
    head: int = Field(0, ge=-100_000, le=100_000, description="head index; negative counts from the end")
    query: str | None = Field(
        None,
        max_length=MAX_SPEC,
        description="one query token: 'cls', a token index or 'patch:R,C' "
        "(default: the CLS token, or the first patch where the model has none)",
        examples=["cls", "0", "patch:3,5"],
    )
    format: Literal["json", "safetensors"] = "json"
    ablate: str = Field(
        "",
        max_length=MAX_SPEC,
        description="explain the model with these heads removed: layer:head pairs '0:1,11:5' (see GET …/output)",
    )


def _index(i: int, n: int, what: str) -> int:
    if not -n <= i < n:
        raise SelectionError(f"{what} {i} is out of range for {n} {what}s (valid: {-n}..{n - 1})")
    return i % n


def resolve(p: ExplainParams, found: Found) -> tuple[int, int, int]:
    """(layer, head, query token) of a request, each in range."""
    att, layout = found.cap.att, found.cap.layout
    if not isinstance(layout, TokenLayout) or not isinstance(att, ImageAttention):
        raise SelectionError("explain: windowed models (Swin) are not explained yet; their rows are served")
    layer = _index(p.layer, att.num_layers, "layer")
    head = _index(p.head, att.num_heads, "head")
    if p.query is None or not p.query.strip():
        cls = layout.cls_index
        return layer, head, cls if cls is not None else layout.num_prefix
    rows = parse_query(p.query, layout)
    if rows is None or len(rows) != 1:
        raise SelectionError("query: explain takes one query token ('cls', a token index or 'patch:R,C')")
    return layer, head, rows[0]


def _answer(
    image_id: str, filename: str | None, lm: LoadedModel, found: Found, p: ExplainParams, ablate: Ablation = ()
) -> Answer:
    t0 = time.perf_counter()
    cap = found.cap
    layer, head, query = resolve(p, found)
    attn = lm.capture.layers[layer][0]
    att = cap.att
    assert isinstance(att, ImageAttention)  # resolve() refused the rest
    hc = explain_head(att, attn, layer, head, query)
    N, H, d = att.num_tokens, att.num_heads, hc.head_dim
    D = int(hc.attn_output.shape[0])
    meta: dict[str, Any] = {
        "model": cap.model_id,
        "image_id": image_id,
        "filename": filename,
        "image_size": list(cap.image_size),
        "input_size": list(cap.input_size),
        "tokens": cap.layout.as_dict(),
        "cached": found.cached,
        "ablated": [list(pair) for pair in ablate],
        "layer": layer,
        "head": head,
        "query": query,
        "num_layers": cap.att.num_layers,
        "num_heads": H,
        "head_dim": d,
        "embed_dim": D,
        "scale": hc.scale,
        # Every key token this row covers, in the order of k, v and the rows: all N for global
        # attention (a windowed model would list its window).
        "key_tokens": list(range(N)),
        "steps": inner_steps(lm.model, attn),
        "shapes": {
            "x": [N, D],
            "w_q": [D, d],
            "w_k": [D, d],
            "w_v": [D, d],
            "q": [N, d],
            "k": [N, d],
            "v": [N, d],
            "w_o": [D, H * d],
        },
    }
    tensors = {name: t.numpy() for name, t in hc.tensors().items()}
    timing = {**found.timing, "encode": (time.perf_counter() - t0) * 1000}
    meta["timing_ms"] = dict(timing)
    if p.format == "json":
        import orjson

        body = orjson.dumps({**meta, "bias": None, **tensors}, option=orjson.OPT_SERIALIZE_NUMPY)
        headers: dict[str, str] = {}
        media = "application/json"
    else:
        from safetensors.numpy import save

        # The metadata travels in the file only: with key_tokens it grows with N, too long for a header.
        meta_json = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
        body = save(tensors, metadata={"headscope": meta_json})
        headers = {
            "Content-Disposition": f'attachment; filename="explain-{image_id}-L{layer}-H{head}-T{query}.safetensors"'
        }
        media = "application/octet-stream"
    timing["encode"] = (time.perf_counter() - t0) * 1000
    headers["Server-Timing"] = ", ".join(f"{k};dur={v:.2f}" for k, v in timing.items())
    return Answer([body], headers, media, meta)


async def explain(
    service: AttentionService, image_id: str, p: ExplainParams, is_disconnected: Disconnected | None = None
) -> Answer | None:
    """One head's computation for an image the server has; None once it is evicted."""
    lm = await service.model(p.model)
    # With heads removed, the capture of the ablated model (cached per ablation set like the maps').
    ablate = parse_ablate(p.ablate, lm.num_layers, lm.num_heads, windowed=lm.stages is not None)
    found = await service.capture(image_id, lm, is_disconnected=is_disconnected, ablate=ablate)
    if found is None:
        return None
    upload = service.upload_of(image_id)
    filename = upload.filename if upload else None
    return await service.worker.run_in_worker(_answer, image_id, filename, lm, found, p, ablate)
