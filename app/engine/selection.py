"""Parse what a request selects: layers, heads and query rows.

Grammar (each a comma-separated list; whitespace ignored):
    layers / heads: ``all`` | items where an item is ``I`` (negative counts from the end) or
                    ``A-B`` (inclusive range; ``-3--1`` is the last three)
    query:          ``cls`` (row of the first prefix token) | ``all`` | token indices ``0,17,-1``
                    | ``patch:R,C`` (grid cell; several as ``patch:R,C;R,C``)

Negative indices count from the end, as Python's do, everywhere: layer ``-1`` is the last
layer, token ``-1`` the last token, ``patch:-1,0`` the first cell of the grid's last row. An
index is valid from ``-n`` to ``n - 1``; anything else is refused with the valid range in the
message. Answers give the resolved, non-negative indices (``query``, ``layers``, ``heads``).

Numbers are ASCII digits only: other Unicode digits (``٣``, ``３``), which ``int()`` would
read, are refused like any other character the grammar does not have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .layout import MAX_DENSE_CELLS, Stage, TokenLayout, WindowedLayout


class SelectionError(ValueError):
    """A malformed or out-of-range selection (answered as 422 with :attr:`code`)."""

    code = "bad_selection"


class SelectionSyntaxError(SelectionError):
    """A selection that cannot be read at all (not one out of range): a caller with a narrower
    grammar (explain's one query token) gives its own advice instead of the general one."""


class StageSpanError(SelectionError):
    """A windowed model's request whose layers (or rollout) reach over more than one stage."""

    code = "layers_span_stages"


# ASCII digits, as many as given: a huge index is out of range, said as such, not "cannot read"
# (indices are compared, never used to size anything; MAX_SPEC bounds the text). fullmatch.
_ITEM = re.compile(r"(-?[0-9]+)(?:-(-?[0-9]+))?")


def number_text(v: int) -> str:
    """An index as a message says it: itself, or how long it is when it is too long to show."""
    text = str(v)
    return text if len(text) <= 12 else f"of {len(text.lstrip('-'))} digits"


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
        m = _ITEM.fullmatch(raw)
        if not m:
            raise SelectionSyntaxError(
                f"{what}: cannot read {raw!r}; use 'all', indices like 0,5,-1 or ranges like 0-3"
            )
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        for v in (a, b):
            if not -n <= v < n:
                raise SelectionError(
                    f"{what}: index {number_text(v)} is out of range for {n} {what} (valid: {-n}..{n - 1})"
                )
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
            m = re.fullmatch(r"(-?[0-9]+),(-?[0-9]+)", cell)
            if not m:
                raise SelectionSyntaxError(f"query: cannot read patch {cell[:40]!r}; use patch:ROW,COL")
            r, c = int(m.group(1)), int(m.group(2))
            if not (-gh <= r < gh and -gw <= c < gw):
                raise SelectionError(
                    f"query: patch ({number_text(r)}, {number_text(c)}) is outside the {gh} x {gw} grid "
                    f"(rows {-gh}..{gh - 1}, "
                    f"columns {-gw}..{gw - 1}; negative counts from the end)"
                )
            rows.append(layout.token_of_cell(r % gh, c % gw))
        return list(dict.fromkeys(rows))
    rows = []
    for raw in spec.replace(" ", "").split(","):
        if not re.fullmatch(r"-?[0-9]+", raw):
            raise SelectionSyntaxError(f"query: cannot read {raw[:40]!r}; use cls, all, token indices or patch:ROW,COL")
        v = int(raw)
        if not -n <= v < n:
            raise SelectionError(
                f"query: token {number_text(v)} is out of range for {n} tokens (valid: {-n}..{n - 1}; negative "
                "counts from the end)"
            )
        rows.append(v % n)
    return list(dict.fromkeys(rows))


@dataclass(frozen=True)
class Selection:
    """A fully resolved request: which slices, how aggregated, how encoded."""

    layers: list[int]
    heads: list[int]
    queries: list[int] | None  # query tokens (rows of every map), None for all
    aggregate: str = "none"
    rollout_start: int = 0
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    temperature: float = 1.0
    stage: Stage | None = None  # windowed models: the one stage of the layers; queries are its cells

    @property
    def head_labels(self) -> list[int | str]:
        """What the answer's head axis holds: the heads, or the one fused entry (``["mean"]``)."""
        return list(self.heads) if self.aggregate == "none" else [self.aggregate]


def _spans(layers: list[int]) -> str:
    """``0-1, 4`` for [0, 1, 4]: a short spelling of layer indices."""
    out: list[str] = []
    for v in sorted(layers):
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def resolve_windowed(
    layers_spec: str | None,
    heads_spec: str | None,
    query_spec: str | None,
    layout: WindowedLayout,
    aggregate: str = "none",
    rollout_start: int | None = 0,
) -> tuple[Stage, list[int], list[int], list[int] | None]:
    """Resolve a request against a windowed model (Swin): ``(stage, layers, heads, rows)``.

    A request's layers belong to one stage: stages have different grids (and head counts), so
    one answer tensor ``[layers, heads, queries, cells]`` cannot hold two. ``heads`` count in the
    stage's heads; ``patch:R,C`` names a cell of the stage's grid and token ``t`` is cell ``t``,
    row-major (there are no prefix tokens). Rollout runs within the stage.

    Args:
        layers_spec, heads_spec, query_spec: as for :func:`parse_indices` / :func:`parse_query`.
        layout: the image's stages.
        aggregate: ``rollout`` checks ``rollout_start`` against the stage.
        rollout_start: the first layer of a rollout (negative counts from the end); None for
            the stage's first layer.

    Raises:
        StageSpanError: layers (or the rollout) of more than one stage; the message says which
            layers form each stage.
        SelectionError: anything else malformed or out of range.
    """
    L = layout.num_layers
    layers = parse_indices(layers_spec, L, "layers")
    stages = {layout.stage_of(i).index for i in layers}
    if len(stages) > 1:
        raise StageSpanError(
            f"layers: {_spans(layers)} reach over stages {', '.join(map(str, sorted(stages)))}, whose grids "
            f"differ; ask for the layers of one stage per request: {layout.describe()}"
        )
    stage = layout.stage_of(layers[0])
    if aggregate == "rollout" and rollout_start is not None:
        start = rollout_start % L if -L <= rollout_start < 0 else rollout_start
        if not (stage.first_layer <= start <= stage.last_layer):
            a, b = stage.first_layer, stage.last_layer
            raise StageSpanError(
                f"rollout: a windowed model's rollout runs within one stage (the stages' grids differ); "
                f"rollout_start={rollout_start} is not a layer of stage {stage.index} ({a}-{b}) of the "
                f"selected layers: use rollout_start={a}. {layout.describe()}"
            )
    heads = parse_indices(heads_spec, stage.heads, "heads")
    q = (query_spec or "cls").strip().lower()
    cells = stage.grid[0] * stage.grid[1]
    if cells > MAX_DENSE_CELLS and (q == "all" or aggregate == "rollout"):
        what = "rollout would multiply" if aggregate == "rollout" else "query=all would return"
        small = [s.index for s in layout.stages if s.grid[0] * s.grid[1] <= MAX_DENSE_CELLS]
        raise SelectionError(
            f"{what} {cells} x {cells} maps for stage {stage.index} ({stage.grid[0]} x {stage.grid[1]} cells), "
            f"almost all zeros (a row has at most {stage.window[0] * stage.window[1]} cells of its window); "
            f"Headscope answers that for stages of at most {MAX_DENSE_CELLS} cells"
            + (f" (stages {', '.join(map(str, small))} here)" if small else "")
            + "; ask for cells 'patch:R,C;R,C' of this stage"
        )
    if q == "cls":
        raise SelectionError(
            "query: Swin has no CLS token (no prefix tokens at all: every token is a cell of the "
            "stage's grid); ask for cells 'patch:R,C' of the stage grid, cell indices or 'all'"
        )
    return stage, layers, heads, parse_query(query_spec, stage.tokens())  # a stage's cells are its tokens
