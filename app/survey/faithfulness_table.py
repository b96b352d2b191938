"""The table a paper prints from a survey's faithfulness rows: mean AUC per method, with a 95 % interval.

Over the pictures of the survey (one AUC per picture and method, :data:`app.survey.schema.FAITHFULNESS`):

* the mean AUC of each curve (positive: lower is better; negative: higher is better) with a
  **t-based 95 % confidence interval over pictures**, ``mean ± t(0.975, n - 1) · s / √n`` (``s`` the
  sample standard deviation; pictures taken as independent draws; no interval for one picture);
* where ``random`` was tested, each method's **paired** difference to the random map on the same
  pictures (``AUC(method) - AUC(random)``, the same t interval over the per-picture differences)
  and on how many pictures the method beat random on both curves: the comparison that says
  whether a method is better than the baseline on *these* pictures, not only on average.

Pictures whose target was 0 (no ratio: null AUCs) are left out of that method's means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..engine.verdicts import beats

# Student's t, the 0.975 quantile, for 1..30 degrees of freedom.
_T975 = [
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
]  # fmt: skip
_Z975 = 1.959964


def t975(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` >= 1 degrees of freedom (a table to 30, then the
    Cornish-Fisher expansion around the normal quantile: within 1e-4)."""
    if df < 1:
        raise ValueError("t975: at least 1 degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass
class Interval:
    """A mean and its t-based 95 % interval over ``n`` values (``lo``/``hi`` NaN for n < 2)."""

    mean: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: np.ndarray) -> Interval:
        v = np.asarray(values, float)
        v = v[np.isfinite(v)]
        n = len(v)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        m = float(v.mean())
        if n < 2:
            return cls(m, math.nan, math.nan, 1)
        half = t975(n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
        return cls(m, m - half, m + half, n)

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "–"
        if self.n < 2:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


@dataclass
class MethodSummary:
    """One method's row: its AUCs over the pictures, and against the random map where tested."""

    method: str
    target: str
    images: int
    auc_positive: Interval
    auc_negative: Interval
    vs_random_positive: Interval | None = None  # mean of AUC+(method) - AUC+(random): < 0 is better
    vs_random_negative: Interval | None = None  # mean of AUC-(method) - AUC-(random): > 0 is better
    beats_random: int | None = None  # pictures where both curves beat random's
    protocol: str = "live"  # paper: AUCs in percent of top-1 accuracy (Chefer et al. 2021's units)


def summarise(table: pa.Table) -> list[MethodSummary]:
    """One :class:`MethodSummary` per (target, method) of a faithfulness table, in the order the
    methods first appear."""
    rows = table.select(["image", "method", "target", "auc_positive", "auc_negative"]).to_pylist()
    # tables written before --protocol have no such column: they are live
    protocols = table.column("protocol").to_pylist() if "protocol" in table.column_names else [None] * len(rows)
    for r, p in zip(rows, protocols):
        r["protocol"] = p or "live"
    groups = list(dict.fromkeys((r["protocol"], r["target"]) for r in rows))
    out: list[MethodSummary] = []
    for protocol, target in groups:
        mine = [r for r in rows if r["target"] == target and r["protocol"] == protocol]
        by: dict[str, dict[str, tuple[float, float]]] = {}
        for r in mine:
            pos = math.nan if r["auc_positive"] is None else r["auc_positive"]
            neg = math.nan if r["auc_negative"] is None else r["auc_negative"]
            by.setdefault(r["method"], {})[r["image"]] = (pos, neg)
        random = by.get("random")
        for method, per in by.items():
            pos = np.array([p for p, _ in per.values()])
            neg = np.array([n for _, n in per.values()])
            s = MethodSummary(method, target, len(per), Interval.of(pos), Interval.of(neg), protocol=protocol)
            if random is not None and method != "random":
                both = [i for i in per if i in random]
                dp = np.array([per[i][0] - random[i][0] for i in both])
                dn = np.array([per[i][1] - random[i][1] for i in both])
                s.vs_random_positive, s.vs_random_negative = Interval.of(dp), Interval.of(dn)
                s.beats_random = int(sum(1 for i in both if all(beats(*per[i], *random[i]))))
            out.append(s)
    return out


HEADER = [
    "target",
    "method",
    "images",
    "AUC+ (lower is better)",
    "AUC− (higher is better)",
    "AUC+ − random",
    "AUC− − random",
    "beats random (both curves)",
]


def cells(s: MethodSummary) -> list[str]:
    """A summary row as text: means with their 95 % intervals in brackets."""
    vs = [s.vs_random_positive, s.vs_random_negative]
    return [
        s.target if s.protocol == "live" else f"{s.target} (paper protocol, %)",
        s.method,
        str(s.images),
        s.auc_positive.text(),
        s.auc_negative.text(),
        *(v.text() if v is not None else "" for v in vs),
        f"{s.beats_random} of {s.vs_random_positive.n}" if s.beats_random is not None and s.vs_random_positive else "",
    ]


def markdown(summaries: list[MethodSummary]) -> str:
    """The table as Markdown (what ``headscope report`` prints)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells(s)) + " |" for s in summaries]
    return "\n".join(lines)


# Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention Visualization", CVPR 2021,
# Table 1: ViT-B/16 on the ImageNet validation set, the *predicted* class, AUC in percent of top-1
# accuracy (positive: lower is better; negative: higher is better). Each row: the paper's name,
# the Headscope method whose rule is the paper's own (checked against Transformer-Explainability's
# baselines/ViT code) or None, and the two figures. Matched:
# * raw attention (generate_visualizations.py's attn_last_layer: the last block's attention,
#   clamped at 0, mean over heads, the CLS row) is ``attention``'s rule;
# * transformer attribution (generate_LRP(..., method="transformer_attribution", start_layer=1))
#   is ``chefer2021``'s at its default start layer (1), the only one a survey computes.
# Not matched, listed as the paper's for reference:
# * rollout (generate_rollout(start_layer=1): prod over layers 1..L-1 of rownorm(A + I)) leaves
#   layer 0 out; Headscope's ``rollout`` is the product over every layer, 0 included, so it is
#   another map and its figure is not Headscope's method's;
# * GradCAM (the last layer's heads weighted by their mean gradient) and LRP (the full LRP to the
#   pixels) are no Headscope method; partial LRP (the last layer's LRP relevance) neither.
PAPER_TABLE1 = [
    ("rollout (from layer 1; Headscope's rollout starts at layer 0)", None, 20.05, 53.1),
    ("raw attention", "attention", 23.99, 45.55),
    ("GradCAM", None, 34.06, 41.52),
    ("LRP", None, 41.94, 43.49),
    ("partial LRP", None, 19.64, 50.49),
    ("transformer attribution (theirs)", "chefer2021", 17.03, 54.16),
]
# The target whose runs Table 1 reports: the predicted class. ``class:N`` rows are the paper's
# *target-class* runs, a different table; they get no Table 1 figure beside them.
PAPER_TARGET = "top"
PAPER_HEADER = [
    "target",
    "method",
    "images",
    "AUC+ % (lower is better)",
    "Table 1 AUC+",
    "AUC− % (higher is better)",
    "Table 1 AUC−",
]


def paper_rows(summaries: list[MethodSummary]) -> list[list[str]]:
    """The ``protocol=paper`` rows in the paper's units (AUC in percent of top-1 accuracy). A row of
    target ``top`` (the paper's predicted class) whose method is the rule of a Table 1 row gets
    that row's figures beside it (ViT-B, ImageNet, predicted class); other rows (``class:N``: the
    paper's target-class runs, which Table 1 does not report) get none. Then the Table 1 rows no
    ``top`` row matched, for reference, with the paper's names (rollout's saying how it differs)."""
    ref = {ours: (pos, neg) for _, ours, pos, neg in PAPER_TABLE1 if ours}
    out = []
    for s in summaries:
        if s.protocol != "paper":
            continue
        pos, neg = ref.get(s.method, (None, None)) if s.target == PAPER_TARGET else (None, None)
        out.append(
            [
                s.target,
                s.method,
                str(s.images),
                s.auc_positive.text(2),
                "" if pos is None else f"{pos:.2f}",
                s.auc_negative.text(2),
                "" if neg is None else f"{neg:.2f}",
            ]
        )
    if out:
        seen = {s.method for s in summaries if s.protocol == "paper" and s.target == PAPER_TARGET}
        for name, ours, pos, neg in PAPER_TABLE1:
            if ours is None or ours not in seen:
                out.append(["(Table 1)", name, "", "", f"{pos:.2f}", "", f"{neg:.2f}"])
    return out


# What the paper-protocol table cannot say by its numbers alone (the report's page and the terminal)
PAPER_CAVEAT = (
    "Headscope has no labels: a hit is the model still predicting the target's class (for `top`, the "
    "unperturbed prediction, so x = 0 scores 1 where the paper's x = 0 is the model's accuracy; for `class:N`, "
    "class N), so compare rankings of methods, not the digits, unless your pictures, labels and model are the paper's."
)


def paper_markdown(summaries: list[MethodSummary]) -> str:
    """:func:`paper_rows` as Markdown ('' when no row used the paper's protocol)."""
    rows = paper_rows(summaries)
    if not rows:
        return ""
    lines = ["| " + " | ".join(PAPER_HEADER) + " |", "|" + "---|" * len(PAPER_HEADER)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
