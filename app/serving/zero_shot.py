"""``GET …/zero-shot``: which of a few labels a CLIP-style model finds in a picture (issue #42).

The probabilities are the model's own (:func:`app.engine.text_relevance.zero_shot`: CLIP's
softmax over the labels of ``exp(logit_scale)`` times the cosines, SigLIP's sigmoid of each
logit); one forward of the image tower on the worker, each label's text embedding cached per
model and phrase (:meth:`app.engine.clip_text.TextTower.embeddings`). With ``maps=true`` each
label also gets its relevance map (``method``) and its tokens' relevance, through the relevance
service's cache (one forward and backward of both towers per label not yet cached).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from pydantic import Field

from ..engine.clip_text import MAX_LABELS, MAX_PHRASE_CHARS, TextError, TextTower, check_phrase
from ..engine.model import LoadedModel
from ..engine.relevance import refuse_windowed_relevance
from ..engine.text_relevance import TextTarget, parse_method, require_text, zero_shot
from . import preprocess
from .params import DEFAULT_METHOD, RelevanceMethod, RequestParams
from .relevance import RelevanceService, method_map


class ZeroShotParams(RequestParams):
    """``GET …/zero-shot``: the labels, and whether to add each one's relevance map."""

    model: str | None = Field(None, description="model id (a CLIP-style model; default: the server's default model)")
    labels: str = Field(
        ...,
        max_length=MAX_LABELS * (MAX_PHRASE_CHARS + 1),
        description=f"the labels, comma-separated (each a phrase of at most {MAX_PHRASE_CHARS} characters; at most "
        f"{MAX_LABELS} labels; a repeated label counts once)",
        examples=["dog,cat,a red car"],
    )
    maps: bool = Field(False, description="also each label's relevance map on the patch grid and its tokens' relevance")
    method: RelevanceMethod = Field(
        DEFAULT_METHOD, description="the relevance method of the maps (maps=true); checked without maps too"
    )


@dataclass(frozen=True)
class Labels:
    """Zero-shot labels as checked: each distinct one once, in the order first given, with its
    place (0-based) in the list the request gave (a repeat counts once, at its first place)."""

    texts: list[str]
    places: list[int]


def parse_labels(text: str, tower: TextTower | None = None) -> Labels:
    """``dog, cat,a red car`` -> the labels, each checked as a phrase, repeats dropped.

    Raises:
        TextError: an empty label, one too long or not text, more than :data:`MAX_LABELS`, one
            with more tokens than ``tower`` reads.
    """
    return check_labels(text.split(","), tower)


def check_labels(raw: list[str], tower: TextTower | None = None) -> Labels:
    """Labels given one by one, each checked as a phrase (and against ``tower``'s context length
    when given), repeats dropped. Errors name the label by its place in ``raw`` (from 1).

    Raises:
        TextError: none, an empty label, one too long or not text, more than :data:`MAX_LABELS`,
            one with more tokens than ``tower`` reads.
    """
    if not raw:
        raise TextError("no labels given: write phrases like 'a dog, a cat'")
    first: dict[str, int] = {}  # label -> its first place
    for i, r in enumerate(raw):
        if not r.strip():
            raise TextError(f"label {i + 1} is empty: write the labels as phrases between commas, e.g. 'a dog, a cat'")
        try:
            first.setdefault(check_phrase(r), i)
        except TextError as e:
            raise TextError(f"label {i + 1}: {e}") from None
    if len(first) > MAX_LABELS:  # counted once repeated, as the parameter's description says
        raise TextError(f"{len(first)} labels; at most {MAX_LABELS}")
    if tower is not None:
        for lab, i in first.items():
            try:
                tower.check(lab)
            except TextError as e:
                raise TextError(f"label {i + 1}: {e}") from None
    return Labels(list(first), list(first.values()))


def scores(
    lm: LoadedModel, prep: preprocess.PreparedPixels, labels: list[str], amp_dtype: torch.dtype | None, device
) -> dict[str, Any]:
    """The zero-shot scores of one prepared picture (on the worker thread)."""
    with lm.lock:
        return zero_shot(lm, prep.pixels[None].to(device), labels, amp_dtype)


def ranked_rows(labels: Labels, res: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's ``labels``: ``{label, index, logit, probability}`` by probability, highest
    first (``index``: the label's place in the request's list)."""
    rows = [
        {"label": lab, "index": i, "logit": lo, "probability": p}
        for lab, i, lo, p in zip(labels.texts, labels.places, res["logits"], res["probabilities"], strict=True)
    ]
    rows.sort(key=lambda r: -r["probability"])
    return rows


async def zero_shot_answer(rel: RelevanceService, image_id: str, params: ZeroShotParams) -> dict[str, Any]:
    """The answer of ``GET …/zero-shot``: the labels ranked by probability."""
    t0 = time.perf_counter()
    due = rel.deadline()  # the request's one deadline: each label's map took a fresh one (64 maps: minutes)
    lm = await rel.model(params.model)
    tower = require_text(lm)  # first: a Swin has no text tower, the reason that matters here
    refuse_windowed_relevance(lm)
    labels = parse_labels(params.labels, tower)
    targets = {lab: TextTarget("text", phrase=lab, tower=tower) for lab in labels.texts}
    method = parse_method(params.method, targets[labels.texts[0]], lm)  # with or without maps: a typo is not ignored
    upload = rel.uploads.require(image_id)
    prep = await rel.prepared(upload, lm)
    res = await rel.piece(partial(scores, lm, prep, labels.texts, rel.worker.amp_dtype, rel.device))
    rows = ranked_rows(labels, res)
    grid = None
    if params.maps:
        for r in rows:
            maps, _ = await rel.maps(image_id, lm, (), targets[r["label"]], prep, upload=upload, deadline=due)
            r["relevance"] = method_map(maps, method).tolist()
            r["text_tokens"] = maps.relevance.text_tokens
            grid = list(maps.relevance.grid)
    return {
        "model": lm.id,
        "image_id": image_id,
        "rule": res["rule"],
        "precision": rel.worker.precision,
        "logit_scale": tower.logit_scale,
        "logit_bias": tower.logit_bias,
        "labels": rows,
        "method": method if params.maps else None,
        "grid": grid,
        "input_size": list(prep.input_size),
        "timing_ms": {"total": (time.perf_counter() - t0) * 1000},
    }
