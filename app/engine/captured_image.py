"""One interface for a captured image, whatever the model's attention: :class:`CapturedImage`.

A capture (``ImageAttention`` of :mod:`~app.engine.block_capture`, ``WindowedAttention`` of
:mod:`~app.engine.windows`) holds the maps. What a caller asks of them depends on how the
model lays out its tokens: which layers, heads and query tokens a request names, the token
layout of an answer, the tokens ``drop`` removes, the statistics, one head's computation. A
global model has one token sequence with prefix tokens (:class:`GlobalImage`); a windowed one
(Swin) has one grid per stage, no prefix tokens, and a request's layers stay within one stage
(:class:`WindowedImage`). Both are a :class:`CapturedImage`, so the request path, the
survey and the command line never ask which one they hold: :func:`captured` (or
``LoadedModel.captured``) picks it once, from the capture and its layout.

Everything here is synchronous and runs where the capture is kept (the server's worker thread,
the survey's process, a notebook); nothing knows of HTTP or queues.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .block_capture import ImageAttention
from .capture_base import CapturedAttention
from .explain import HeadComputation, explain_head
from .layout import Stage, TokenLayout, WindowedLayout
from .selection import Selection, SelectionError, SelectionSyntaxError, parse_indices, parse_query, resolve_windowed
from .stats import DEFAULT_MASS, HeadStats, artifact_tokens, compute_stats, compute_stats_batch, mass_threshold_count
from .window_explain import explain_window_head
from .window_stats import window_stats
from .windows import WindowedAttention


class CapturedImage(ABC):
    """What a captured image offers every caller: the capture itself (``att``: softmax rows of
    any layer, head and query), read through the model's token layout at the image's
    ``input_size`` (height, width in pixels)."""

    att: CapturedAttention
    input_size: tuple[int, int]

    def select(
        self,
        layers: str | None,
        heads: str | None,
        query: str | None,
        aggregate: str = "none",
        rollout_start: int | None = None,
        head_fusion: str = "mean",
        discard_ratio: float = 0.0,
        temperature: float = 1.0,
    ) -> Selection:
        """Resolve a request's ``layers``, ``heads`` and ``query`` (grammar of
        :mod:`~app.engine.selection`; no query: :attr:`default_query`) against this image.

        Args:
            rollout_start: the first layer of a rollout (negative counts from the end); None
                for the first layer of the selected layers' stage (the model's first layer
                for global attention).

        Raises:
            SelectionError: a malformed or out-of-range selection, with the reason.
        """
        if query is None or not query.strip():
            query = self.default_query
        stage, chosen, picked, queries, start = self._resolve(layers, heads, query, aggregate, rollout_start)
        return Selection(chosen, picked, queries, aggregate, start, head_fusion, discard_ratio, temperature, stage)

    @property
    @abstractmethod
    def default_query(self) -> str:
        """The query of a request that names none: ``cls``, or the first patch (``patch:0,0``)
        on a model without a CLS token (SigLIP; a windowed stage's cell 0), as explain's default."""

    def stats(
        self,
        mass: float | None = DEFAULT_MASS,
        *,
        similarity: bool = True,
        ranks: bool = True,
        check: Callable[[], None] | None = None,
    ) -> HeadStats:
        """Every head's statistics (``mass``: the CLS mass fraction of ``mass_patches``, None to
        leave them out; ``check`` may raise between layers to stop)."""
        return self._stats(mass, similarity, ranks, check)

    @abstractmethod
    def stage_at(self, layer: int) -> Stage | None:
        """A windowed model's stage of ``layer``; None for global attention."""

    @abstractmethod
    def layout_at(self, layer: int) -> TokenLayout:
        """The token layout of ``layer``'s maps (a windowed stage's grid, no prefix tokens)."""

    @abstractmethod
    def tokens(self, stage: Stage | None = None) -> dict[str, Any]:
        """The token layout of an answer (``stage``: a windowed answer's stage, default the first)."""

    @abstractmethod
    def layout_meta(self) -> dict[str, Any]:
        """What an answer says of the whole layout besides its tokens (a windowed model's stages)."""

    @abstractmethod
    def drop_columns(self, drop: str, stage: Stage | None = None) -> list[int]:
        """Key tokens a ``drop`` option (``none``, ``prefix``, ``artifacts`` or both, comma-separated)
        removes from the maps of ``stage`` (None for global attention)."""

    @abstractmethod
    def mass_patches(self, mass: float) -> list[list[int]] | None:
        """``[L][H]`` patches holding ``mass`` of each head's CLS row (from the CLS rows alone);
        None without a CLS token."""

    @abstractmethod
    def explain_target(self, layer: int, head: int, query: str | None) -> tuple[int, int, int]:
        """``(layer, head, query token)`` of an explain request, each in range (negative counts
        from the end; ``query``: one token as the query grammar names it, None for the default)."""

    @abstractmethod
    def explain(self, module: Any, layer: int, head: int, query: int) -> HeadComputation:
        """One head's whole computation for one query token (``module``: the layer's attention)."""

    @abstractmethod
    def _resolve(self, layers, heads, query, aggregate: str, rollout_start: int | None) -> Resolved:
        """:meth:`select`'s ``(stage, layers, heads, queries, rollout start)``."""

    @abstractmethod
    def _stats(self, mass: float | None, similarity: bool, ranks: bool, check) -> HeadStats:
        """:meth:`stats`."""


Resolved = tuple[Stage | None, list[int], list[int], list[int] | None, int]


def captured(
    att: CapturedAttention, layout: TokenLayout | WindowedLayout, input_size: tuple[int, int]
) -> CapturedImage:
    """The :class:`CapturedImage` of a capture and its model's token layout at ``input_size``."""
    hw = (int(input_size[0]), int(input_size[1]))
    if isinstance(att, WindowedAttention) and isinstance(layout, WindowedLayout):
        return WindowedImage(att, layout, hw)
    if isinstance(att, ImageAttention) and isinstance(layout, TokenLayout):
        return GlobalImage(att, layout, hw)
    raise TypeError(f"a {type(att).__name__} does not go with a {type(layout).__name__}")


def stats_batch(
    images: Sequence[CapturedImage],
    mass: float | None = DEFAULT_MASS,
    *,
    similarity: bool = True,
    ranks: bool = True,
) -> list[HeadStats]:
    """:meth:`CapturedImage.stats` of every image of a batch captured together (the survey's):
    global captures that kept their maps go through :func:`~.stats.compute_stats_batch`, on the
    forward's own batch tensors; the values are the same as image by image."""
    plain = [i for i in images if isinstance(i, GlobalImage)]
    if plain and len(plain) == len(images):
        atts = [i.att for i in plain]
        return compute_stats_batch(atts, plain[0].layout, mass, similarity=similarity, with_ranks=ranks)
    return [i.stats(mass, similarity=similarity, ranks=ranks) for i in images]


def _drops(drop: str) -> set[str]:
    """What ``drop`` names (``prefix``, ``artifacts``, comma-separated; ``none`` or empty: nothing)."""
    return {part.strip() for part in drop.split(",")} - {"none", ""}


def _index(i: int, n: int, what: str) -> int:
    if not -n <= i < n:
        raise SelectionError(f"{what} {i} is out of range for {n} {what}s (valid: {-n}..{n - 1})")
    return i % n


@dataclass
class GlobalImage(CapturedImage):
    """A capture of global attention (ViT and kin): one token sequence, prefix tokens first."""

    att: ImageAttention
    layout: TokenLayout
    input_size: tuple[int, int]

    @property
    def default_query(self) -> str:
        return "cls" if self.layout.cls_index is not None else "patch:0,0"

    def stage_at(self, layer: int) -> None:
        return None

    def layout_at(self, layer: int) -> TokenLayout:
        return self.layout

    def _resolve(self, layers, heads, query, aggregate: str, rollout_start: int | None) -> Resolved:
        n = self.att.num_layers
        chosen = parse_indices(layers, n, "layers")
        start = 0 if rollout_start is None else rollout_start
        if aggregate == "rollout":
            if not -n <= start < n:
                raise SelectionError(f"rollout_start {start} is out of range for {n} layers (valid: {-n}..{n - 1})")
            if (layers or "all").strip().lower() == "all":  # every layer that has a rollout
                chosen = chosen[start % n :]
        picked = parse_indices(heads, self.att.num_heads, "heads")
        return None, chosen, picked, parse_query(query, self.layout), start

    def tokens(self, stage: Stage | None = None) -> dict[str, Any]:
        return self.layout.as_dict()

    def layout_meta(self) -> dict[str, Any]:
        return {}

    def drop_columns(self, drop: str, stage: Stage | None = None) -> list[int]:
        parts = _drops(drop)
        npf = self.layout.num_prefix
        cols: list[int] = []
        if "prefix" in parts:
            cols += list(range(npf))
        if "artifacts" in parts:
            cols += artifact_tokens(self.att.last_norms, npf)[0]
        return sorted(set(cols))

    def _stats(self, mass: float | None, similarity: bool, ranks: bool, check) -> HeadStats:
        return compute_stats(self.att, self.layout, mass, similarity=similarity, with_ranks=ranks, check=check)

    def mass_patches(self, mass: float) -> list[list[int]] | None:
        cls, npf = self.layout.cls_index, self.layout.num_prefix
        if cls is None:
            return None
        return [
            mass_threshold_count(self.att.rows(layer, None, [cls])[:, 0, npf:].cpu(), mass).tolist()
            for layer in range(self.att.num_layers)
        ]

    def explain_target(self, layer: int, head: int, query: str | None) -> tuple[int, int, int]:
        layer = _index(layer, self.att.num_layers, "layer")
        head = _index(head, self.att.num_heads, "head")
        if query is None or not query.strip():
            cls = self.layout.cls_index
            return layer, head, cls if cls is not None else self.layout.num_prefix
        one = f"query: explain takes one query token ('cls', a token index or 'patch:R,C'); got {query.strip()!r}"
        try:
            queries = parse_query(query, self.layout)
        except SelectionSyntaxError:
            # The general advice (all, several indices, boxes) is what explain refuses next; a
            # cell outside the grid or a token out of range keeps its own words.
            raise SelectionError(one) from None
        if queries is None or len(queries) != 1:
            raise SelectionError(one)
        return layer, head, queries[0]

    def explain(self, module: Any, layer: int, head: int, query: int) -> HeadComputation:
        return explain_head(self.att, module, layer, head, query)


@dataclass
class WindowedImage(CapturedImage):
    """A capture of windowed attention (Swin): one grid per stage, no prefix tokens; a request's
    layers, heads and query cells are those of one stage."""

    att: WindowedAttention
    layout: WindowedLayout
    input_size: tuple[int, int]

    @property
    def default_query(self) -> str:
        return "patch:0,0"

    def stage_at(self, layer: int) -> Stage:
        return self.layout.stage_of(layer)

    def layout_at(self, layer: int) -> TokenLayout:
        return self.layout.stage_of(layer).tokens()

    def _resolve(self, layers, heads, query, aggregate: str, rollout_start: int | None) -> Resolved:
        stage, chosen, picked, queries = resolve_windowed(layers, heads, query, self.layout, aggregate, rollout_start)
        return stage, chosen, picked, queries, stage.first_layer if rollout_start is None else rollout_start

    def tokens(self, stage: Stage | None = None) -> dict[str, Any]:
        stage = stage or self.layout.stages[0]
        return {**stage.tokens().as_dict(), "stage": stage.index, "window": list(stage.window)}

    def layout_meta(self) -> dict[str, Any]:
        return {"stages": self.layout.as_dict()}

    def drop_columns(self, drop: str, stage: Stage | None = None) -> list[int]:
        """No prefix tokens to drop; artifact tokens only on the last stage's grid, where they are found."""
        if "artifacts" not in _drops(drop):
            return []
        stage = stage or self.layout.stages[0]
        last = self.layout.stages[-1]
        if stage.index != last.index:
            raise SelectionError(
                f"drop=artifacts: high-norm tokens are found on the last stage's grid (stage {last.index}, "
                f"layers {last.first_layer}-{last.last_layer}); stage {stage.index} has another grid"
            )
        return artifact_tokens(self.att.last_norms, 0)[0]

    def _stats(self, mass: float | None, similarity: bool, ranks: bool, check) -> HeadStats:
        return window_stats(self.att, mass, similarity=similarity, ranks=ranks, check=check)

    def mass_patches(self, mass: float) -> None:
        return None  # no CLS row (window_stats says why)

    def explain_target(self, layer: int, head: int, query: str | None) -> tuple[int, int, int]:
        """``head`` counts in the layer's stage; the query is a cell of the stage's grid
        (``patch:R,C`` or a cell index, row-major; default cell 0); there is no CLS."""
        layer = _index(layer, self.layout.num_layers, "layer")
        stage = self.layout.stage_of(layer)
        head = _index(head, stage.heads, "head")
        spec = (query or "").strip().lower()
        if not spec:
            return layer, head, 0
        if spec == "cls":
            raise SelectionError(
                "query: Swin has no CLS token (no prefix tokens at all: every token is a cell of the "
                f"stage's grid); ask for a cell 'patch:R,C' of stage {stage.index}'s {stage.grid[0]} x "
                f"{stage.grid[1]} grid or a cell index"
            )
        queries = parse_query(query, stage.tokens())
        if queries is None or len(queries) != 1:
            raise SelectionError("query: explain takes one query cell ('patch:R,C' of the stage grid or a cell index)")
        return layer, head, queries[0]

    def explain(self, module: Any, layer: int, head: int, query: int) -> HeadComputation:
        return explain_window_head(self.att, module, layer, head, query)
