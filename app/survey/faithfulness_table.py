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


def summarise(table: pa.Table) -> list[MethodSummary]:
    """One :class:`MethodSummary` per (target, method) of a faithfulness table, in the order the
    methods first appear."""
    rows = table.select(["image", "method", "target", "auc_positive", "auc_negative"]).to_pylist()
    targets = list(dict.fromkeys(r["target"] for r in rows))
    out: list[MethodSummary] = []
    for target in targets:
        mine = [r for r in rows if r["target"] == target]
        by: dict[str, dict[str, tuple[float, float]]] = {}
        for r in mine:
            pos = math.nan if r["auc_positive"] is None else r["auc_positive"]
            neg = math.nan if r["auc_negative"] is None else r["auc_negative"]
            by.setdefault(r["method"], {})[r["image"]] = (pos, neg)
        random = by.get("random")
        for method, per in by.items():
            pos = np.array([p for p, _ in per.values()])
            neg = np.array([n for _, n in per.values()])
            s = MethodSummary(method, target, len(per), Interval.of(pos), Interval.of(neg))
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
        s.target,
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
