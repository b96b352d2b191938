"""``headscope survey --faithfulness``: the perturbation test of every picture, a table beside the survey's.

For each batch of pictures the survey has just captured, :meth:`FaithfulnessPlan.table` computes
every asked method's relevance map for the target (one forward that keeps the maps and one
backward for the batch, :func:`app.engine.relevance.relevance`) and runs each picture's
perturbation test (:func:`app.engine.faithfulness.faithfulness`, its perturbed forwards in
batches of the survey's ``--batch-size``): the numbers ``GET …/faithfulness`` answers for the
same picture, one row per (picture, method) of :data:`app.survey.schema.FAITHFULNESS`.

The plan is checked in two steps: what needs no model (methods, fractions, the target's
spelling) before anything loads (:meth:`FaithfulnessPlan.parse`), the rest against the loaded
model (:meth:`FaithfulnessPlan.resolve`: the target's kind, windowed models refused). A box that
reaches outside a picture's output map is that picture's failure (``bad_target``); its survey rows
are kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch

from ..engine.clip_text import check_phrase
from ..engine.faithfulness import DEFAULT_BATCH, faithfulness, parse_fractions
from ..engine.model import LoadedModel
from ..engine.relevance import (
    TargetError,
    check_target,
    parse_methods,
    parse_target,
    refuse_windowed,
    relevance,
)
from ..engine.text_relevance import PREFIX, TEXT_METHODS, is_text
from . import schema

TARGET_HEADS = ("output", "box", "top", "class", "embedding", "default")


@dataclass(frozen=True)
class FaithfulnessPlan:
    """What ``--faithfulness``, ``--target`` and ``--fractions`` ask for.

    Args:
        methods: relevance methods, in the order given.
        target: the target's spelling (None: the model's default).
        fractions: the fractions of patches removed.
        seed: the random map's seed.
    """

    methods: tuple[str, ...]
    target: str | None = None
    fractions: tuple[float, ...] = ()
    seed: int = 0

    @classmethod
    def parse(
        cls, methods: str | Sequence[str], target: str | None = None, fractions: str | Sequence[float] | None = None
    ) -> FaithfulnessPlan:
        """Check what needs no model (raises MethodError, FractionsError, TargetError)."""
        if is_text(target):  # a phrase keeps its case and spaces; legrad is defined for it
            phrase = PREFIX + check_phrase(str(target).lstrip()[len(PREFIX) :])
            items = [m.strip().lower() for m in (methods.split(",") if isinstance(methods, str) else methods)]
            rest = [m for m in items if m not in TEXT_METHODS]
            names = tuple(
                dict.fromkeys([*(parse_methods(rest) if rest else ()), *(m for m in items if m in TEXT_METHODS)])
            )
            return cls(names, phrase, parse_fractions(fractions))
        names = parse_methods(methods)
        text = (target or "").strip().lower().replace(" ", "") or None
        if text is not None and text.split(":", 1)[0] not in TARGET_HEADS:
            raise TargetError(
                f"target {text[:40]!r}: unknown; use output or box:X0,Y0,X1,Y1 (saliency), top or class:N "
                "(classes), embedding"
            )
        return cls(names, text, parse_fractions(fractions))

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> FaithfulnessPlan:
        return cls(tuple(meta["methods"]), meta["target"], tuple(meta["fractions"]), int(meta["seed"]))

    def meta(self) -> dict[str, Any]:
        """What decides the table's values (in the survey's metadata; compared on ``--resume``)."""
        fractions = list(self.fractions)
        return {"methods": list(self.methods), "target": self.target, "fractions": fractions, "seed": self.seed}

    def resolve(self, lm: LoadedModel) -> str:
        """The target against the model: its normalised spelling (raises TargetError,
        RelevanceUnsupportedError for a windowed model)."""
        refuse_windowed(lm)
        return str(parse_target(self.target, lm))

    def table(
        self,
        lm: LoadedModel,
        images: Sequence[str],
        x: torch.Tensor,
        amp_dtype: torch.dtype | None = None,
        batch_size: int = DEFAULT_BATCH,
    ) -> tuple[pa.Table, list[tuple[str, str, str]]]:
        """The rows of a batch of pictures of one input size, and the pictures that failed.

        Args:
            lm: the model.
            images: each picture's name.
            x: ``[B, 3, H, W]`` their normalised pixels on the model's device.
            amp_dtype: autocast dtype, or None for plain fp32.
            batch_size: perturbed pictures per forward.
        """
        target = parse_target(self.target, lm)
        hw = (int(x.shape[-2]), int(x.shape[-1]))
        try:
            check_target(target, hw)
        except TargetError as e:
            return schema.empty_faithfulness(), [(name, "bad_target", str(e)) for name in images]
        with lm.lock:
            rels = relevance(lm, x, target, self.methods, seed=self.seed, amp_dtype=amp_dtype)
        rows: dict[str, list] = {f.name: [] for f in schema.FAITHFULNESS}
        for name, pixels, rel in zip(images, x, rels):
            with lm.lock:
                res = faithfulness(
                    lm, pixels, rel.maps, rel.target, self.fractions, batch_size=batch_size, amp_dtype=amp_dtype
                )
            for method in self.methods:
                c = res.methods[method]
                rows["image"].append(name)
                rows["method"].append(method)
                rows["target"].append(res.target)
                rows["class_index"].append(res.class_index)
                rows["y"].append(res.y)
                rows["auc_positive"].append(_finite(c.auc_positive))
                rows["auc_negative"].append(_finite(c.auc_negative))
                rows["fractions"].append(list(res.fractions))
                rows["positive"].append(c.positive)
                rows["negative"].append(c.negative)
                rows["removed"].append(c.removed)
                rows["num_patches"].append(res.num_patches)
                rows["seed"].append(self.seed if method == "random" else None)
        return pa.table(rows, schema=schema.FAITHFULNESS), []


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None
