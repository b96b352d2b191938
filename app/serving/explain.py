"""GET .../explain: one head's whole computation for one query token, from the cached capture.

The capture already holds what it takes (q, k, v, the bias and the head outputs of every layer,
see :mod:`app.engine.block_capture`), so an image that is cached is answered without a forward pass;
the worker thread does the few small products (:func:`app.engine.explain.explain_head`).
A windowed model (Swin) keeps each window's tokens instead of q, k and v: the query's window is
projected again with the block's weights (:func:`app.engine.window_explain.explain_window_head`),
and the keys are that window's places (``key_tokens``: their cells, -1 for padding).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..engine.ablation import Ablation
from ..engine.explain import HeadComputation, inner_steps
from ..engine.model import LoadedModel
from .answers import Answer, server_timing
from .encoders import ablate_detail, answer_stem
from .params import ExplainParams
from .service import AttentionService
from .store import FoundCapture


def explained(
    image_id: str,
    filename: str | None,
    lm: LoadedModel,
    found: FoundCapture,
    params: ExplainParams,
    ablate: Ablation = (),
) -> Answer:
    """The explain answer (JSON or safetensors) of a capture in hand (worker thread)."""
    t0 = time.perf_counter()
    meta, hc = explain_fields(image_id, filename, lm, found, params, ablate)
    tensors = {name: t.numpy() for name, t in hc.tensors().items()}
    timing = {**found.timing, "encode": (time.perf_counter() - t0) * 1000}
    meta["timing_ms"] = dict(timing)
    if params.format == "json":
        import orjson

        empty = dict.fromkeys(hc.OPTIONAL)
        body = orjson.dumps({**meta, **empty, **tensors}, option=orjson.OPT_SERIALIZE_NUMPY)
        headers: dict[str, str] = {}
        media = "application/json"
    else:
        from safetensors.numpy import save

        # The metadata travels in the file only: with key_tokens it grows with N, too long for a header.
        meta_json = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
        body = save(tensors, metadata={"headscope": meta_json})
        layer, head, query = meta["layer"], meta["head"], meta["query"]
        stem = answer_stem(
            "explain", image_id, meta["model"], f"L{layer}", f"H{head}", f"token{query}", *ablate_detail(ablate)
        )
        headers = {"Content-Disposition": f'attachment; filename="{stem}.safetensors"'}
        media = "application/octet-stream"
    timing["encode"] = (time.perf_counter() - t0) * 1000
    headers["Server-Timing"] = server_timing(timing)
    return Answer([body], headers, media, meta)


def explain_fields(
    image_id: str,
    filename: str | None,
    lm: LoadedModel,
    found: FoundCapture,
    params: ExplainParams,
    ablate: Ablation = (),
) -> tuple[dict[str, Any], HeadComputation]:
    """What the explain answer says of a capture in hand: its fields besides the tensors (no
    timing), and the head's computation, whose ``tensors()`` are the answer's arrays. The
    answer (:func:`explained`) and the Python API (``Attention.explain``) both come from here."""
    entry = found.entry
    image = entry.image
    layer, head, query = image.explain_target(params.layer, params.head, params.query)
    attn = lm.capture.layers[layer][0]
    hc = image.explain(attn, layer, head, query)
    meta: dict[str, Any] = {
        "model": entry.model_id,
        "image_id": image_id,
        "filename": filename,
        "image_size": list(entry.image_size),
        "input_size": list(entry.input_size),
        "tokens": image.tokens(image.stage_at(layer)),
        **image.layout_meta(),
        "cached": found.cached,
        "ablated": [list(pair) for pair in ablate],
        "precision": entry.precision,
        "layer": layer,
        "head": head,
        "query": query,
        "num_layers": image.att.num_layers,
        "head_dim": hc.head_dim,
        "embed_dim": int(hc.attn_output.shape[0]),
        "scale": hc.scale,
        # The heads, every key token this row covers (in the order of k, v and the rows: all N
        # for global attention, a windowed model's window) and the shapes.
        **hc.meta(),
        "steps": {**inner_steps(lm.model, attn), **hc.steps()},
    }
    return meta, hc


async def explain(service: AttentionService, image_id: str, params: ExplainParams) -> Answer:
    """One head's computation for an image the server has (ImageNotFound once it is evicted)."""
    lm = await service.model(params.model)
    # With heads removed, the capture of the ablated model (cached per ablation set like the maps').
    ablate = lm.ablation(params.ablate)
    found = await service.store.get(image_id, lm, ablate=ablate)
    # No filename: a follow-up never carries one (whoever sent the same bytes may have named them).
    return await service.worker.run_answer(explained, image_id, None, lm, found, params, ablate)
