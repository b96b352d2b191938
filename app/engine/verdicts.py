"""What a perturbation test's numbers mean: a verdict per method against the random map.

The rule (the same one ``headscope report`` counts as "beats random"): a method is better than
the random baseline on the **positive** curve when its AUC is *lower* than the random map's
(removing the patches it ranks first makes the target fall faster), and on the **negative**
curve when its AUC is *higher* (removing the patches it ranks last keeps the target better).
Ties are not better. The verdict is ``both``, ``positive``, ``negative`` or ``neither``, with the
two margins, each signed so that above 0 is better than random:

* ``margin_positive = AUC+(random) - AUC+(method)``;
* ``margin_negative = AUC-(method) - AUC-(random)``.

A margin under :data:`NARROW` (0.05) is said to be narrow; the paper protocol's AUCs are in
percent (100x the live protocol's units), so there the bound is 5 (:func:`narrow_margin`).

``random`` itself is the ``baseline``; without a random map among the methods there is no
verdict (``untested``); a target of 0 has no ratio, so no AUC and no verdict (``undefined``);
nor has a class the model gives less than a uniform guess would (probability under 1/classes,
:func:`improbable`): a ratio of so small a probability swings by orders of magnitude whichever
patches go (1.8e-16 rose 13,604-fold on a random classifier), so the curves measure that swing,
not the map.

A curve above 1 (removing patches *raised* the target) is said where it occurs, with how high
it went: on a target that is small or spread over the output (the whole saliency map), removing
what the model looks at moves its output elsewhere rather than lowering it. The explanation
lives in docs/relevance.md, section "Reading the verdict" (:data:`DOCS_ANCHOR`).

Everything works from AUCs and curves alone, for any list of methods: the server's answer, the
Python API's result and the survey's table share it (:func:`beats`, :func:`verdicts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

BASELINE = "random"
# docs/relevance.md's section that explains verdicts and curves above 1 (the page links to it).
DOCS_ANCHOR = "relevance.md#reading-the-verdict"
# A margin below this is within what the random map's seed alone moves its mean AUC by on the
# sample photos (docs/relevance.md: about ±0.05): better, but narrowly. In the live protocol's
# units (a ratio of scores); see :func:`narrow_margin` for the paper protocol's.
NARROW = 0.05
# AUCs of each protocol in the live protocol's units: paper AUCs are trapz(y, x) x 100, percent.
# Its curves are top-1 hits (0 or 1) where live's are ratios near 1, so the same share of the
# curves' area is 100x the number; the narrow margin scales with it (0.05 -> 5 percentage points).
UNITS = {"live": 1.0, "paper": 100.0}
# A curve is said to rise above 1 when it goes more than this above it (less is the noise of a
# target that barely moves).
ABOVE = 0.01

Rating = Literal["both", "positive", "negative", "neither", "baseline", "untested", "undefined"]

_WORDS = {
    "both": "better than random on both curves",
    "positive": "better than random on the positive curve only",
    "negative": "better than random on the negative curve only",
    "neither": "not better than random on either curve",
}


def beats(
    auc_positive: float, auc_negative: float, random_positive: float, random_negative: float
) -> tuple[bool, bool]:
    """Whether a method beats the random map on the positive and on the negative curve.

    Positive: a lower AUC is better; negative: a higher one. NaN (no ratio) never beats.
    """
    return auc_positive < random_positive, auc_negative > random_negative


@dataclass(frozen=True)
class Verdict:
    """One method's verdict (see the module docstring)."""

    method: str
    verdict: Rating
    margin_positive: float | None  # AUC+(random) - AUC+(method): above 0 is better
    margin_negative: float | None  # AUC-(method) - AUC-(random): above 0 is better
    max_ratio: float | None  # the highest point of its two curves (above 1: a removal raised the target)
    text: str

    @property
    def above_one(self) -> bool:
        return self.max_ratio is not None and self.max_ratio > 1.0 + ABOVE

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "margin_positive": self.margin_positive,
            "margin_negative": self.margin_negative,
            "max_ratio": self.max_ratio,
            "above_one": self.above_one,
            "text": self.text,
        }


def _finite(v: Any) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _highest(curves: Sequence[Any]) -> float | None:
    values = [float(v) for c in curves for v in (c or []) if v is not None and math.isfinite(float(v))]
    return max(values) if values else None


def narrow_margin(protocol: str = "live") -> float:
    """:data:`NARROW` in ``protocol``'s units: 0.05 (live) or 5 percentage points (paper).

    Raises:
        ValueError: an unknown protocol.
    """
    if protocol not in UNITS:
        raise ValueError(f"protocol {protocol!r}: use one of {', '.join(UNITS)}")
    return NARROW * UNITS[protocol]


def _margin(label: str, margin: float, better: str, narrow: float = NARROW) -> str:
    # "AUC+ lower by 0.109" / "AUC+ higher by 0.054, worse" — the sign said in words.
    if margin > 0:
        return f"{label} {better} by {margin:.3f}" + (" (narrowly)" if margin < narrow else "")
    if margin < 0:
        worse = "higher" if better == "lower" else "lower"
        return f"{label} {worse} by {-margin:.3f}"
    return f"{label} equal"


def _above_one(curves: Mapping[str, Any]) -> str:
    """The sentence for curves that rise above 1 (by more than :data:`ABOVE`), or ""."""
    said = []
    for sign, ranked in (("positive", "most"), ("negative", "least")):
        high = _highest([curves.get(sign)])
        if high is not None and high > 1.0 + ABOVE:
            said.append(
                f"its {sign} curve rises to {high:.2f}x the unperturbed target (removing the patches it "
                f"ranks {ranked} relevant raised the target)"
            )
    if not said:
        return ""
    text = "; ".join(said)
    return (
        " " + text[0].upper() + text[1:] + ": a curve above 1 means the model's output moved elsewhere "
        "rather than fell, as it does for a target spread over the output or one that is small."
    )


def improbable(score: str | None, score0: float | None, classes: int | None) -> str | None:
    """Why a class target's curves say nothing of the maps, or None: the model gives the class a
    probability under a uniform guess's (``score0 < 1 / classes``, ``score`` ``probability``).

    Args:
        score: what the curves divide (the faithfulness answer's ``score``).
        score0: its unperturbed value (the class's probability).
        classes: how many classes the model has (None: not a class target).
    """
    if score != "probability" or score0 is None or not classes or not math.isfinite(score0):
        return None
    if score0 >= 1.0 / classes:
        return None
    return (
        f"no verdict: the model gives this class a probability of {score0:.2g}, less than a uniform guess among "
        f"its {classes:,} classes would (1/{classes:,}); a ratio of so small a probability swings by orders of "
        "magnitude whichever patches go. Explain a class the model considers, such as its prediction (top)."
    )


def verdict_of(
    method: str,
    curves: Mapping[str, Any],
    random: Mapping[str, Any] | None,
    baseline: str = BASELINE,
    protocol: str = "live",
    unrated: str | None = None,
) -> Verdict:
    """One method's verdict from its curves and AUCs and the random map's (None: not tested).

    Args:
        method: the method's name.
        curves: ``auc_positive``, ``auc_negative`` and (optionally) the ``positive`` and
            ``negative`` curves: the faithfulness answer's entry of the method.
        random: the same of the baseline, or None.
        protocol: the protocol the AUCs are of (``live`` or ``paper``): which margin is narrow
            (:func:`narrow_margin`).
        unrated: why the target allows no verdict (:func:`improbable`), or None.
    """
    narrow = narrow_margin(protocol)
    high = _highest([curves.get("positive"), curves.get("negative")])
    pos, neg = _finite(curves.get("auc_positive")), _finite(curves.get("auc_negative"))
    if method == baseline:
        return Verdict(
            method, "baseline", None, None, high, "the baseline every method has to beat." + _above_one(curves)
        )
    if unrated is not None:
        return Verdict(method, "undefined", None, None, high, unrated)
    if random is None:
        return Verdict(
            method, "untested", None, None, high, f"no verdict: the {baseline} map was not tested." + _above_one(curves)
        )
    rpos, rneg = _finite(random.get("auc_positive")), _finite(random.get("auc_negative"))
    if pos is None or neg is None or rpos is None or rneg is None:
        return Verdict(
            method, "undefined", None, None, high, "no verdict: the target is 0 here, so the curves have no ratio."
        )
    on_pos, on_neg = beats(pos, neg, rpos, rneg)
    rating: Rating = "both" if on_pos and on_neg else "positive" if on_pos else "negative" if on_neg else "neither"
    mp, mn = rpos - pos, neg - rneg
    text = (
        f"{_WORDS[rating]} ({_margin('AUC+', mp, 'lower', narrow)}: {pos:.3f} against {rpos:.3f}; "
        f"{_margin('AUC−', mn, 'higher', narrow)}: {neg:.3f} against {rneg:.3f})." + _above_one(curves)
    )
    return Verdict(method, rating, mp, mn, high, text)


def verdicts(
    methods: Mapping[str, Mapping[str, Any]],
    baseline: str = BASELINE,
    protocol: str = "live",
    unrated: str | None = None,
) -> dict[str, Verdict]:
    """Every method's verdict, in the methods' order (``methods``: name -> its curves and AUCs,
    as in the faithfulness answer's ``methods``; ``protocol``: the one they are of, whose units
    set the narrow margin; ``unrated``: why the target allows none, :func:`improbable`)."""
    random = methods.get(baseline)
    return {name: verdict_of(name, c, random, baseline, protocol, unrated) for name, c in methods.items()}
