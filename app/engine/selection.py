"""Parse what a request selects: layers, heads and query rows.

Grammar (each a comma-separated list; whitespace ignored):
    layers / heads: ``all`` | items where an item is ``I`` (negative counts from the end) or
                    ``A-B`` (inclusive range; ``-3--1`` is the last three)
    query:          ``cls`` (row of the first prefix token) | ``all`` | token indices ``0,17,-1``
                    | ``patch:R,C`` (grid cell; several as ``patch:R,C;R,C``)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .layout import TokenLayout


class SelectionError(ValueError):
    """A malformed or out-of-range selection (answered as 422)."""


_ITEM = re.compile(r"^(-?\d{1,6})(?:-(-?\d{1,6}))?$")
MAX_SPEC = 4096


def parse_indices(spec: str | None, n: int, what: str) -> list[int]:
    """Resolve a layers/heads spec against ``n`` items; returns sorted-as-given unique indices.

    Args:
        spec: the text, e.g. ``"all"``, ``"0,5,-1"``, ``"0-3"``.
        n: how many layers (or heads) the model has.
        what: ``"layers"`` or ``"heads"``, for error messages.
    """
    spec = (spec or "all").strip().lower()
    if len(spec) > MAX_SPEC:
        raise SelectionError(f"{what}: specification too long")
    if spec == "all":
        return list(range(n))
    out: list[int] = []
    for raw in spec.replace(" ", "").split(","):
        m = _ITEM.match(raw)
        if not m:
            raise SelectionError(f"{what}: cannot read {raw!r}; use 'all', indices like 0,5,-1 or ranges like 0-3")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        for v in (a, b):
            if not -n <= v < n:
                raise SelectionError(f"{what}: index {v} is out of range for {n} {what} (valid: {-n}..{n - 1})")
        a, b = a % n, b % n
        if a > b:
            raise SelectionError(f"{what}: range {raw!r} runs backwards")
        out.extend(range(a, b + 1))
    return list(dict.fromkeys(out))


def needs_every_row(query: str | None, aggregate: str = "none") -> bool:
    """Whether an answer needs every row of every selected map: ``query=all``, or rollout.

    Known before the image's token layout is, so the capture can keep full maps for it.
    """
    return (query or "cls").strip().lower() == "all" or aggregate == "rollout"


def parse_query(spec: str | None, layout: TokenLayout) -> list[int] | None:
    """Resolve a query spec to token (row) indices; ``None`` means every row.

    Args:
        spec: ``cls``, ``all``, ``0,17,200`` or ``patch:R,C``.
        layout: the token layout of this image under this model.
    """
    spec = (spec or "cls").strip().lower()
    n = layout.count
    if len(spec) > MAX_SPEC:
        raise SelectionError("query: specification too long")
    if spec == "all":
        return None
    if spec == "cls":
        if layout.cls_index is None:
            raise SelectionError("query: this model has no CLS token; ask for token indices, 'patch:R,C' or 'all'")
        return [layout.cls_index]
    if spec.startswith("patch:"):
        gh, gw = layout.grid
        rows = []
        for cell in spec[len("patch:") :].replace(" ", "").split(";"):
            m = re.fullmatch(r"(-?\d{1,6}),(-?\d{1,6})", cell)
            if not m:
                raise SelectionError(f"query: cannot read patch {cell!r}; use patch:ROW,COL")
            r, c = int(m.group(1)), int(m.group(2))
            if not (-gh <= r < gh and -gw <= c < gw):
                raise SelectionError(f"query: patch ({r}, {c}) is outside the {gh} x {gw} grid")
            rows.append(layout.token_of_cell(r % gh, c % gw))
        return list(dict.fromkeys(rows))
    rows = []
    for raw in spec.replace(" ", "").split(","):
        if not re.fullmatch(r"-?\d{1,7}", raw):
            raise SelectionError(f"query: cannot read {raw!r}; use cls, all, token indices or patch:ROW,COL")
        v = int(raw)
        if not -n <= v < n:
            raise SelectionError(f"query: token {v} is out of range for {n} tokens")
        rows.append(v % n)
    return list(dict.fromkeys(rows))


@dataclass(frozen=True)
class Selection:
    """A fully resolved request: which slices, how aggregated, how encoded."""

    layers: list[int]
    heads: list[int]
    rows: list[int] | None
    aggregate: str = "none"
    rollout_start: int = 0
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    temperature: float = 1.0
