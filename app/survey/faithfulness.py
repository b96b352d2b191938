"""``headscope survey --faithfulness``: the perturbation test of every picture, a table beside the survey's.

For each batch of pictures the survey has just captured, :meth:`FaithfulnessPlan.table` computes
every asked method's relevance map for the target (one forward that keeps the maps and one
backward for the batch, :func:`app.engine.relevance.relevance`) and runs every picture's
perturbation test (:func:`app.engine.faithfulness.run_tests`: the pictures' perturbed forwards
stacked across pictures in batches of the survey's ``--batch-size``): the numbers ``GET …/faithfulness`` answers for the
same picture, one row per (picture, method) of :data:`app.survey.schema.FAITHFULNESS`.

The plan is checked in two steps: what needs no model (methods, fractions, the target's
spelling) before anything loads (:meth:`FaithfulnessPlan.parse`), the rest against the loaded
model (:meth:`FaithfulnessPlan.resolve`: the target's kind, windowed models refused). A box that
reaches outside a picture's output map is that picture's failure (``bad_target``); its survey rows
are kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch

from ..engine.batching import split_on_oom
from ..engine.clip_text import check_phrase
from ..engine.device import autocast, precision_name
from ..engine.faithfulness import (
    DEFAULT_BATCH,
    DEFAULT_PROTOCOL,
    PerturbationTest,
    ProtocolError,
    check_protocol,
    parse_fractions,
    parse_protocol,
    run_tests,
)
from ..engine.model import LoadedModel
from ..engine.output import head_output, timm_model
from ..engine.relevance import (
    LRP_METHODS,
    METHODS,
    MethodError,
    TargetError,
    check_target,
    parse_methods,
    parse_target,
    refuse_windowed_relevance,
    relevance,
)
from ..engine.text_relevance import PREFIX, TEXT_METHODS, is_text
from . import schema

TARGET_HEADS = ("output", "box", "top", "class", "embedding", "default", "region")
ALL = "all"  # --faithfulness with no value: every method
# The target a survey explains by default, by the model's output kind: one thing the model decided
# on each picture. A saliency model's *predicted region* (REGION): the box around the output-map
# pixels at least REGION_SHARE of the map's peak, found per picture from its unperturbed output.
# The whole map (`output`) is a poor target: removing the patches the model looks at moves its
# saliency elsewhere, the total hardly falls, and on the sample photos no map beat random on it.
REGION = "region"
REGION_SHARE = 0.5
DEFAULT_TARGETS = {"saliency": REGION, "classes": "top", "embedding": "embedding"}
# Targets a survey warns about (docs/relevance.md, "What it measured on the four sample photos").
WEAK_TARGETS = {
    "output": "the whole saliency map is a poor target: removing the patches the model looks at moves its "
    "saliency elsewhere, so the total hardly falls and no map may beat random (on the sample photos none did); "
    "leave --target out for the predicted region of each picture, or give a box:X0,Y0,X1,Y1",
}


@dataclass(frozen=True)
class FaithfulnessPlan:
    """What ``--faithfulness``, ``--target`` and ``--fractions`` ask for.

    Args:
        methods: relevance methods, in the order given.
        target: the target's spelling (None: the model's default).
        fractions: the fractions of patches removed.
        seed: the random map's seed.
        protocol: ``live`` or ``paper`` (:class:`app.engine.faithfulness.PerturbationTest`).
    """

    methods: tuple[str, ...]
    target: str | None = None
    fractions: tuple[float, ...] = ()
    seed: int = 0
    protocol: str = DEFAULT_PROTOCOL

    @classmethod
    def parse(
        cls,
        methods: str | Sequence[str],
        target: str | None = None,
        fractions: str | Sequence[float] | None = None,
        protocol: str | None = None,
    ) -> FaithfulnessPlan:
        """Check what needs no model (raises MethodError, FractionsError, TargetError, ProtocolError)."""
        every = isinstance(methods, str) and methods.strip().lower() == ALL
        if is_text(target):  # a phrase keeps its case and spaces; legrad is defined for it
            phrase = PREFIX + check_phrase(str(target).lstrip()[len(PREFIX) :])
            if every:
                items = [m for m in METHODS if m not in LRP_METHODS]
            else:
                items = [m.strip().lower() for m in (methods.split(",") if isinstance(methods, str) else methods)]
            lrp = [m for m in items if m in LRP_METHODS]
            if lrp:
                raise MethodError(f"{lrp[0]} is not offered for a phrase: its LRP rules cover the image tower alone")
            rest = [m for m in items if m not in TEXT_METHODS]
            names = tuple(
                dict.fromkeys([*(parse_methods(rest) if rest else ()), *(m for m in items if m in TEXT_METHODS)])
            )
            return cls(names, phrase, parse_fractions(fractions), protocol=parse_protocol(protocol))
        names = parse_methods(None if every else methods)
        text = (target or "").strip().lower().replace(" ", "") or None
        if text is not None and text.split(":", 1)[0] not in TARGET_HEADS:
            raise TargetError(
                f"target {text[:40]!r}: unknown; use region, output or box:X0,Y0,X1,Y1 (saliency), top or "
                "class:N (classes), embedding"
            )
        if text == "default":
            text = None
        return cls(names, text, parse_fractions(fractions), protocol=parse_protocol(protocol))

    def weak(self) -> str | None:
        """Why the asked target makes a poor test (None: it does not)."""
        return WEAK_TARGETS.get(self.target or "")

    def target_for(self, lm: LoadedModel) -> str:
        """The target's spelling for this model: the one asked for, else the kind's default."""
        return self.target or DEFAULT_TARGETS.get(lm.output_kind, "")

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> FaithfulnessPlan:
        protocol = meta.get("protocol", DEFAULT_PROTOCOL)
        return cls(tuple(meta["methods"]), meta["target"], tuple(meta["fractions"]), int(meta["seed"]), protocol)

    def meta(self) -> dict[str, Any]:
        """What decides the table's values (in the survey's metadata; compared on ``--resume``)."""
        fractions = list(self.fractions)
        out = {"methods": list(self.methods), "target": self.target, "fractions": fractions, "seed": self.seed}
        if self.protocol != DEFAULT_PROTOCOL:  # absent: surveys written before the option resume as they were
            out["protocol"] = self.protocol
        return out

    def resolve(self, lm: LoadedModel) -> str:
        """The target against the model: its normalised spelling (raises TargetError, ProtocolError,
        RelevanceUnsupportedError for a windowed model)."""
        refuse_windowed_relevance(lm)
        spelled = self.target_for(lm)
        if spelled == REGION:
            if lm.output_kind != "saliency":
                raise TargetError(f"target 'region' is for saliency models; this model's output is {lm.output_kind}")
            if self.protocol != DEFAULT_PROTOCOL:
                raise ProtocolError(
                    f"protocol={self.protocol} scores whether the top-1 class survives: it needs a class target "
                    "(top or class:N) of a classifier, not a saliency model's predicted region; use protocol=live"
                )
            return REGION
        try:
            target = parse_target(spelled, lm)
        except TargetError as e:  # the engine's words name what the API takes; the survey takes region too
            also = "; the survey also takes region (the default: each picture's predicted region)"
            raise TargetError(f"--target: {e}{also if lm.output_kind == 'saliency' else ''}") from None
        check_protocol(self.protocol, lm, target)
        return str(target)

    def table(
        self,
        lm: LoadedModel,
        images: Sequence[str],
        x: torch.Tensor,
        amp_dtype: torch.dtype | None = None,
        batch_size: int = DEFAULT_BATCH,
        progress: Callable[[float], None] | None = None,
    ) -> tuple[pa.Table, list[tuple[str, str, str]]]:
        """The rows of a batch of pictures of one input size, and the pictures that failed.

        Args:
            lm: the model.
            images: each picture's name.
            x: ``[B, 3, H, W]`` their normalised pixels on the model's device.
            amp_dtype: autocast dtype, or None for plain fp32.
            batch_size: perturbed pictures per forward.
            progress: called after each batch of perturbed forwards with the share of one
                picture's test it did (a picture's whole test adds up to 1).
        """
        hw = (int(x.shape[-2]), int(x.shape[-1]))
        region = self.target_for(lm) == REGION
        boxes: list[list[int] | None]
        if region:
            boxes = [list(b) for b in predicted_boxes(lm, x, amp_dtype)]
            targets = [parse_target("box:" + ",".join(map(str, b)), lm) for b in boxes]  # type: ignore[arg-type]
        else:
            target = parse_target(self.target_for(lm), lm)
            try:
                check_target(target, hw)
            except TargetError as e:
                return schema.empty_faithfulness(), [(name, "bad_target", str(e)) for name in images]
            boxes, targets = [None] * len(images), [target] * len(images)
        with lm.lock:  # one forward and backward for the batch, a box per picture where region
            rels = relevance(
                lm, x, targets if region else targets[0], self.methods, seed=self.seed, amp_dtype=amp_dtype
            )
        rows: dict[str, list] = {f.name: [] for f in schema.FAITHFULNESS}
        tests = [
            PerturbationTest(
                lm,
                pixels,
                rel.maps,
                rel.target,
                self.fractions,
                batch_size=batch_size,
                amp_dtype=amp_dtype,
                protocol=self.protocol,
            )
            for pixels, rel in zip(x, rels)
        ]
        # every picture's perturbed forwards stacked across the pictures, batch_size at a time
        with lm.lock:
            results = run_tests(
                tests,
                batch_size,
                run=lambda fn, items: split_on_oom(fn, items, x.device),
                progress=_shares(progress, len(tests)),
            )
        for name, res, box in zip(images, results, boxes):
            if isinstance(res, BaseException):
                raise res
            for method in self.methods:
                c = res.methods[method]
                rows["image"].append(name)
                rows["method"].append(method)
                rows["target"].append(REGION if region else res.target)
                rows["box"].append(box)
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
                rows["protocol"].append(res.protocol)
                rows["score0"].append(res.score0)
                rows["precision"].append(precision_name(amp_dtype))
        return pa.table(rows, schema=schema.FAITHFULNESS), []


def predicted_boxes(lm: LoadedModel, x: torch.Tensor, amp_dtype: torch.dtype | None = None) -> list[tuple[int, ...]]:
    """Each picture's predicted region of a saliency model: the box ``(X0, Y0, X1, Y1)`` (output-map
    pixels, end-exclusive) around the pixels at least :data:`REGION_SHARE` of its map's peak.

    Args:
        x: ``[B, 3, H, W]`` normalised pixels on the model's device.
    """
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    with lm.lock, torch.inference_mode(), autocast(x.device.type, amp_dtype):
        out = head_output(lm, timm_model(lm).forward_features(x), hw)  # B, H, W saliency
    boxes: list[tuple[int, ...]] = []
    for m in out.float():
        ys, xs = torch.nonzero(m >= REGION_SHARE * m.max(), as_tuple=True)
        boxes.append((int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1))
    return boxes


def _shares(progress: Callable[[float], None] | None, pictures: int = 1) -> Callable[[int, int], None] | None:
    """The engine's ``progress(done, total)`` over ``pictures`` pictures' tests as the pictures'
    worth each step added (the whole run adds up to ``pictures``)."""
    if progress is None:
        return None
    said = [0.0]

    def tick(done: int, total: int) -> None:
        if total:
            progress(pictures * done / total - said[0])
            said[0] = pictures * done / total

    return tick


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None
