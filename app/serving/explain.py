"""GET .../explain: one head's whole computation for one query token, from the cached capture.

The capture already holds what it takes (q, k, v, the bias and the head outputs of every layer,
see :mod:`app.engine.capture`), so an image that is cached is answered without a forward pass;
the worker thread does the few small products (:func:`app.engine.explain.explain_head`).
A windowed model (Swin) keeps each window's tokens instead of q, k and v: the query's window is
projected again with the block's weights (:func:`app.engine.window_explain.explain_window_head`),
and the keys are that window's places (``key_tokens``: their cells, -1 for padding).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine.ablation import Ablation, parse_ablate
from ..engine.capture import ImageAttention
from ..engine.explain import HeadComputation, explain_head, inner_steps
from ..engine.layout import TokenLayout, WindowedLayout
from ..engine.selection import MAX_SPEC, SelectionError, parse_query
from ..engine.window_explain import WindowHeadComputation, explain_window_head
from ..engine.windows import WindowedAttention
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
        "(default: the CLS token, or the first patch where the model has none; windowed models (Swin): "
        "a cell of the layer's stage grid, default cell 0)",
        examples=["cls", "0", "patch:3,5"],
    )
    format: Literal["json", "safetensors"] = Field(
        "json", description="answer format: JSON, or safetensors (every tensor of the computation, exact)"
    )
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
    """(layer, head, query token) of a request, each in range.

    Windowed models (Swin): ``head`` counts in the layer's stage, the query is a cell of the
    stage's grid (``patch:R,C`` or a cell index, row-major; default cell 0); there is no CLS.
    """
    att, layout = found.cap.att, found.cap.layout
    if isinstance(layout, WindowedLayout):
        layer = _index(p.layer, layout.num_layers, "layer")
        stage = layout.stage_of(layer)
        head = _index(p.head, stage.heads, "head")
        spec = (p.query or "").strip().lower()
        if not spec:
            return layer, head, 0
        if spec == "cls":
            raise SelectionError(
                "query: Swin has no CLS token (no prefix tokens at all: every token is a cell of the "
                f"stage's grid); ask for a cell 'patch:R,C' of stage {stage.index}'s {stage.grid[0]} x "
                f"{stage.grid[1]} grid or a cell index"
            )
        rows = parse_query(p.query, stage.tokens())
        if rows is None or len(rows) != 1:
            raise SelectionError("query: explain takes one query cell ('patch:R,C' of the stage grid or a cell index)")
        return layer, head, rows[0]
    assert isinstance(att, ImageAttention) and isinstance(layout, TokenLayout)
    layer = _index(p.layer, att.num_layers, "layer")
    head = _index(p.head, att.num_heads, "head")
    if p.query is None or not p.query.strip():
        cls = layout.cls_index
        return layer, head, cls if cls is not None else layout.num_prefix
    rows = parse_query(p.query, layout)
    if rows is None or len(rows) != 1:
        raise SelectionError("query: explain takes one query token ('cls', a token index or 'patch:R,C')")
    return layer, head, rows[0]


def _windowed_meta(
    found: Found, layer: int, head: int, query: int, attn: Any, meta: dict[str, Any]
) -> WindowHeadComputation:
    """A windowed layer's computation; ``meta`` gets the metadata that differs from a global model's."""
    cap = found.cap
    att, layout = cap.att, cap.layout
    assert isinstance(att, WindowedAttention) and isinstance(layout, WindowedLayout)
    hc = explain_window_head(att, attn, layer, head, query)
    stage = att.stage_of(layer)
    A, H, d, D = len(hc.key_tokens), stage.heads, hc.head_dim, int(hc.attn_output.shape[0])
    gh, gw = stage.grid
    meta |= {
        "tokens": cap.tokens(stage),
        "stages": layout.as_dict(),
        "stage": stage.index,
        "num_heads": H,
        # The keys are the query's window: its W*W places, row-major in the window of the rolled,
        # padded grid; each place's cell of the stage grid (row-major), or -1 for padding.
        "key_tokens": hc.key_tokens,
        "key_cells": [[t // gw, t % gw] if t >= 0 else None for t in hc.key_tokens],
        "window": {
            "index": hc.window,
            "size": list(stage.window),
            "shift": list(stage.shift_of(layer)),
            "query_place": hc.place,
            "padding": sum(t < 0 for t in hc.key_tokens),
        },
        "shapes": {
            "x": [A, D],
            "w_q": [D, d],
            "w_k": [D, d],
            "w_v": [D, d],
            "q": [A, d],
            "k": [A, d],
            "v": [A, d],
            "w_o": [D, H * d],
        },
    }
    return hc


def _answer(
    image_id: str, filename: str | None, lm: LoadedModel, found: Found, p: ExplainParams, ablate: Ablation = ()
) -> Answer:
    t0 = time.perf_counter()
    cap = found.cap
    layer, head, query = resolve(p, found)
    attn = lm.capture.layers[layer][0]
    att = cap.att
    windowed: dict[str, Any] = {}
    hc: HeadComputation
    whc: WindowHeadComputation | None = None
    if isinstance(att, WindowedAttention):
        hc = whc = _windowed_meta(found, layer, head, query, attn, windowed)
        H, N = att.heads_at(layer), att.tokens_at(layer)
    else:
        hc = explain_head(att, attn, layer, head, query)
        H, N = att.num_heads, att.num_tokens
    d = hc.head_dim
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
        # attention; a windowed model's window (see _windowed_meta).
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
    if whc is not None:
        # Swin: a relative bias in both versions (v2's from an MLP), cosine attention in v2, and
        # the shift mask in shifted blocks.
        steps = {**inner_steps(lm.model, attn), "relative_bias": True, "windowed": True}
        meta.update(windowed, steps={**steps, "cosine": whc.cosine, "shift_mask": whc.mask is not None})
    tensors = {name: t.numpy() for name, t in hc.tensors().items()}
    timing = {**found.timing, "encode": (time.perf_counter() - t0) * 1000}
    meta["timing_ms"] = dict(timing)
    if p.format == "json":
        import orjson

        empty = {"bias": None, "mask": None} if whc is not None else {"bias": None}
        body = orjson.dumps({**meta, **empty, **tensors}, option=orjson.OPT_SERIALIZE_NUMPY)
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
