"""What ``Scope.attention`` gives back: `Attention`, one picture's maps and its capture.

The maps are the API's answer for the same picture and parameters (computed by
`app.serving.answers.maps`, described by `app.serving.answers.meta`). A result keeps what it
was asked for: the maps (its own memory), their metadata and the picture's bytes. The capture
behind the maps (every layer's q and k: megabytes, and in a batch views of the whole batch's
buffers) is not kept: other selections (`Attention.select`), the statistics, one head's
computation and the widget compute it again on first use (one forward of this picture) and keep
it from then on; ``keep_capture=True`` keeps it from the start (this picture's part only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields as dataclass_fields
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..config import Settings
from ..engine import analysis
from ..engine.ablation import Ablation
from ..engine.batching import BatchRunner
from ..engine.cached import cached_property
from ..engine.capture_base import CapturedAttention as Capture
from ..engine.captured_image import CapturedImage
from ..engine.layout import WindowedLayout
from ..engine.model import LoadedModel
from ..engine.selection import Selection
from ..engine.stats import DEFAULT_MASS
from ..engine.verdicts import Verdict
from ..serving import answers
from ..serving.params import ROLLOUT_OPTIONS, AttentionParams, StatsParams
from ..serving.pictures import Pictures
from ..serving.preprocess import PreparedPixels
from ..serving.store import CachedCapture, FoundCapture
from . import params as P
from .computing import computing, numerics
from .extras import need
from .inputs import PreparedPicture

if TYPE_CHECKING:
    import pandas


class PartMeta:
    """What one answer part says besides its maps (`answers.meta`), made when first read.

    Batch-mates of one selection and input size share everything of it but four fields (the
    picture's id, name and size, and the tokens it drops): that part is made once per batch (the
    ``template``), and each picture's dict, with lists of its own, only when it is read. A
    picture's id is a hash of its pixels, and a batch's results wait for nothing that no one
    reads (on a GPU the results of a batch are made while the forward runs; what is left after
    it, per picture, is a copy of the maps).

    Args:
        template: `answers.meta` of a batch-mate (shared, never changed).
        item: the picture (its id and name; read when the metadata is).
        image_size: the picture's size as sent.
        dropped: the key tokens its maps dropped.
    """

    __slots__ = ("template", "item", "image_size", "dropped", "_meta")

    def __init__(self, template: dict[str, Any], item: PreparedPicture, image_size: Any, dropped: list[int]):
        self.template, self.item, self.image_size, self.dropped = template, item, image_size, dropped
        self._meta: dict[str, Any] | None = None

    def get(self) -> dict[str, Any]:
        if self._meta is None:
            meta = _fresh(self.template)
            meta["image_id"] = self.item.image_id
            meta["filename"] = self.item.picture.filename
            meta["image_size"] = list(self.image_size)
            meta["dropped"] = list(self.dropped)
            self._meta = meta
        return self._meta


def _fresh(v: Any) -> Any:
    """``v`` with dicts and lists of its own (a template's values are shared by batch-mates)."""
    if isinstance(v, dict):
        return {k: _fresh(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_fresh(x) for x in v]
    return v


class AnswerPart:
    """One answer's worth of an `Attention`: the maps and what the answer says of them (a
    windowed model asked for every layer has one part per stage). Nothing of the capture."""

    __slots__ = ("maps", "_meta")

    def __init__(self, maps: torch.Tensor, meta: PartMeta):
        self.maps = maps  # [layers, heads, queries, tokens] float32, on the host, its own memory
        self._meta = meta

    @property
    def meta(self) -> dict[str, Any]:
        return self._meta.get()


class AskedPart:
    """An `AnswerPart` before its maps: what needs no number of the capture (the selection, the
    tokens dropped, the metadata's template) is done here, while a GPU may still be computing the
    maps; `answer` takes them.

    Args:
        found: the capture.
        item: the picture, without its pixels (what the result keeps).
        params: the request's parameters.
        pairs: the heads removed.
        sel: what ``params`` select of this capture, already resolved (a batch-mate's:
            `batch_selections`); None resolves it here.
        templates: the metadata templates of the call's batch-mates, by selection and input
            size (filled here); None makes this part's own.

    Raises:
        ValueError: the parameters select nothing valid of this capture (the API's 4xx message).
    """

    def __init__(
        self,
        found: FoundCapture,
        item: PreparedPicture,
        params: AttentionParams,
        pairs: Ablation,
        sel: Selection | None = None,
        templates: dict[tuple, tuple[Selection, dict[str, Any]]] | None = None,
    ):
        self.found = found
        entry = found.entry
        if sel is None:
            sel = answers.selection(params, entry.image)
        self.sel = sel
        subject = answers.AnswerSubject("", None, found, params, sel, pairs)
        self.dropped = subject.dropped()
        key = (id(sel), entry.input_size, found.cached, entry.precision, entry.model_id)
        kept = templates.get(key) if templates is not None else None
        if kept is not None and kept[0] is sel:
            template = kept[1]
        else:
            template = answers.meta(subject, analysis.answer_shape(sel, entry.image.att), [])
            if templates is not None:  # the selection kept with it: its id is not reused meanwhile
                templates[key] = (sel, template)
        self.meta = PartMeta(template, item, entry.image_size, self.dropped)

    def answer(self, tensor: torch.Tensor | None = None) -> AnswerPart:
        """The part, with its maps (``tensor``: the selection's maps already computed, on the
        host; None computes them now)."""
        maps = answers.map_tensor(self.found.entry.image, self.sel, self.dropped, tensor)
        if maps.untyped_storage().nbytes() != maps.numel() * maps.element_size():
            maps = maps.clone()  # a view of a batch's or the capture's buffers would keep them all alive
        return AnswerPart(maps, self.meta)


def batch_selections(founds: list[FoundCapture], params: AttentionParams) -> list[Selection | None]:
    """What ``params`` select of each capture of one batch; None where the selection is bad (its
    `AskedPart` resolves it again and raises the error with its message).

    A selection depends on the capture only through its kind, its input size (the token layout)
    and its layers and heads, so it is resolved once per such key, not once per picture: batch-
    mates share one (read-only: `answers.meta` copies its lists)."""
    resolved: dict[tuple, Selection | None] = {}
    out: list[Selection | None] = []
    for f in founds:
        image = f.entry.image
        key = (type(image), image.input_size, image.att.num_layers, image.att.num_heads)
        if key not in resolved:
            try:
                resolved[key] = answers.selection(params, image)
            except ValueError:
                resolved[key] = None
        out.append(resolved[key])
    return out


def batch_maps(
    founds: list[FoundCapture],
    sels: list[Selection | None],
    waits: list[Callable[[], None]] | None = None,
) -> list[torch.Tensor | None]:
    """The maps ``sels`` select of each capture of one batch (`batch_selections`), computed for
    them all at once (:func:`app.engine.analysis.batch_mates_tensors`); None where a capture's
    selection is not its batch-mates' (a bad selection: its `AskedPart` answers it alone, with
    its error). ``waits``: the copies to the host only started, their waits appended there (call
    them before reading a map)."""
    return analysis.batch_mates_tensors([f.entry.image.att for f in founds], sels, waits=waits)


def _stage_params(lm: LoadedModel, params: Any, input_size: tuple[int, int], every_stage: bool) -> list[Any]:
    """The request's parameters once, or for a windowed model asked for every layer, once per
    stage (its layers; a rollout starting at the stage's first layer)."""
    if not every_stage:
        return [params]
    layout = lm.layout(input_size)
    assert isinstance(layout, WindowedLayout)
    rollout = params.aggregate == "rollout"
    return [
        params.model_copy(
            update={
                "layers": f"{s.first_layer}-{s.last_layer}",
                **({"rollout_start": s.first_layer} if rollout else {}),
            }
        )
        for s in layout.stages
    ]


_NO_PIXELS = torch.empty(0, dtype=torch.uint8)


def _without_pixels(item: PreparedPicture) -> PreparedPicture:
    """``item`` without its input tensor (its bytes and sizes stay)."""
    prep = item.prep
    if prep.raw.numel() == 0:
        return item
    light = PreparedPixels(_NO_PIXELS, prep.input_size, prep.image_size, prep.mean, prep.std)
    return PreparedPicture(item.picture, light)


def _own(found: FoundCapture) -> FoundCapture:
    """``found`` with this picture's capture in memory of its own: a capture of a batch holds
    views of the whole batch's buffers, which one result must not keep alive."""

    def owned(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, list):
            return [owned(x) for x in v]
        return v

    image: Any = found.entry.image
    att: Any = image.att
    if not (hasattr(image, "__dataclass_fields__") and hasattr(att, "__dataclass_fields__")):
        return found
    if hasattr(att, "owned"):  # ImageAttention: its views made and copied, no batch left
        copy = att.owned()
    else:
        copy = replace(att, **{f.name: owned(getattr(att, f.name)) for f in dataclass_fields(att)})
    image = replace(image, att=copy)
    entry = found.entry
    return FoundCapture(
        CachedCapture(entry.model_id, image, entry.image_size, entry.precision), found.cached, found.timing
    )


def found_of(lm: LoadedModel, item: PreparedPicture, att: Capture, precision: str = "fp32") -> FoundCapture:
    """A capture as the server's store keeps it (an `CachedCapture`); ``precision``: what it was computed in."""
    image = lm.captured(att, item.prep.input_size)
    return FoundCapture(CachedCapture(lm.id, image, item.prep.image_size, precision), False, {})


class PendingAttention:
    """The API's answer for ``params`` of a capture (per stage for Swin's every layer) before its
    maps: `AskedPart` per answer part, made while the maps may still be computed; `answer`
    takes them and gives the `Attention`.

    Args:
        amp_dtype: the autocast the capture was computed with (a capture computed again for
            `select`, `stats`, ... uses it too).
        keep_capture: keep the capture from the start (else it is computed again on first use,
            see the module docstring).
        sel: what ``params`` select of the capture, already resolved (`batch_selections`; one
            stage only); None resolves it here.
        templates: the call's metadata templates, shared by batch-mates (see `AskedPart`).
    """

    def __init__(
        self,
        lm: LoadedModel,
        settings: Settings,
        item: PreparedPicture,
        found: FoundCapture,
        params: AttentionParams,
        ablate: Ablation,
        per_stage: bool,
        amp_dtype: torch.dtype | None = None,
        keep_capture: bool = False,
        sel: Selection | None = None,
        templates: dict[tuple, tuple[Selection, dict[str, Any]]] | None = None,
    ):
        self.lm, self.settings, self.found = lm, settings, found
        # The picture's bytes and sizes; its input tensor is made again when a capture is needed.
        self.item = _without_pixels(item)
        self.params, self.ablate, self.per_stage = params, ablate, per_stage
        self.amp_dtype, self.keep_capture = amp_dtype, keep_capture
        stages = _stage_params(lm, params, item.prep.input_size, per_stage)
        given = sel if len(stages) == 1 else None
        self.asks = [AskedPart(found, self.item, p, ablate, given, templates) for p in stages]

    def answer(self, tensor: torch.Tensor | None = None) -> Attention:
        """The result (``tensor``: the maps already computed with batch-mates, one stage only)."""
        return Attention(self, [a.answer(tensor if len(self.asks) == 1 else None) for a in self.asks])


class Attention:
    """The softmax attention of one picture under one model, as the REST API answers it.

    ``maps`` is ``[layers, heads, queries, tokens]`` (float32, on the host), the same numbers
    as the API's ``attention`` for the same picture and parameters. For a windowed model (Swin)
    asked for every layer, ``maps``, ``grid``, ``tokens`` and ``meta`` are lists, one item per
    stage (each stage has its own grid and heads). Made by `PendingAttention.answer`.
    """

    def __init__(self, asked: PendingAttention, parts: list[AnswerPart]):
        self.lm = asked.lm
        self.settings = asked.settings
        self._item = asked.item  # without its pixels
        self._found: FoundCapture | None = _own(asked.found) if asked.keep_capture else None
        self._precision = asked.found.entry.precision
        self._amp_dtype = asked.amp_dtype
        self._parts = parts
        self.params = asked.params
        self.ablate: Ablation = asked.ablate
        self.per_stage = asked.per_stage

    # Pickling: a result is tied to its loaded model (select, stats, explain, the widget compute
    # with it), which holds a lock and the module; a copy shares the model, never copies it.
    def __getstate__(self) -> Any:
        raise TypeError(
            "an Attention is tied to its loaded model and is not pickled: keep its numbers instead, e.g. "
            "torch.save({'maps': att.maps, 'meta': att.meta}, 'att.pt'), att.stats().to_parquet('heads.parquet'), "
            "or att.save('map.png') for a figure; copy.deepcopy(att) copies it in this process"
        )

    def __copy__(self) -> Attention:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Attention:
        import copy

        for shared in (self.lm, self.lm.model, self.settings):  # wherever referred to: the same ones
            memo[id(shared)] = shared
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = copy.deepcopy(v, memo)
        return new

    def _capture_found(self) -> FoundCapture:
        """The capture behind the maps: kept, or computed again now (one forward of this picture,
        with the same heads removed) and kept from then on."""
        if self._found is None:
            prep = self._item.picture.prepared(Pictures.for_model(self.lm, self.settings))
            materialise = self.params.needs_every_row and self.lm.keeps_maps(prep.input_size)
            runner = BatchRunner(self.lm, self._amp_dtype, 1)
            with computing(self.lm):
                att = runner.run(
                    lambda raws: list(runner.capture(raws, materialise=materialise, ablate=self.ablate)), [prep.raw]
                )[0]
            if isinstance(att, BaseException):
                raise att
            self._found = found_of(self.lm, PreparedPicture(self._item.picture, prep), att, self._precision)
        return self._found

    def select(self, **fields: Any) -> Attention:
        """Another selection of the same capture, without another forward: the API's answer for
        these parameters (``GET /api/v1/attention/{image_id}`` of the cached picture).

        Args:
            **fields: ``query``, ``layers``, ``heads``, ``temperature``, ``aggregate``, ``drop``,
                ``rollout_start``, ``head_fusion``, ``discard_ratio``, spelled as for
                `attention`; the ones left out keep this result's
                values (but for another ``aggregate`` than ``rollout``, the rollout's options,
                which it refuses). The heads removed (``ablate``) are the capture's own.

        Raises:
            ValueError: a bad value (the API's message); TypeError: an unknown field.
        """
        spell = {"layers": lambda v: P.indices(v, "layers"), "heads": lambda v: P.indices(v, "heads"), "query": P.query}
        allowed = set(AttentionParams.model_fields) - {"ablate", "model", "format", "dtype", "stats"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            hint = (
                " (the heads removed are the capture's: scope.attention(image, ablate=...) computes another)"
                if "ablate" in unknown
                else ""
            )
            raise TypeError(f"select() takes {', '.join(sorted(allowed))}; got {', '.join(unknown)}{hint}")
        update = {k: spell[k](v) if k in spell else v for k, v in fields.items()}
        merged = {**self.params.model_dump(), **update}
        if merged["aggregate"] != "rollout":  # another aggregate: the rollout's options stay behind
            merged.update({k: AttentionParams.model_fields[k].default for k in ROLLOUT_OPTIONS if k not in update})
        params = P.build(AttentionParams, **merged)
        # Swin: every layer is one answer per stage, as in Scope.attention
        per_stage = self.lm.windowed and fields["layers"] is None if "layers" in fields else self.per_stage
        found = self._capture_found()
        pending = PendingAttention(
            self.lm, self.settings, self._item, found, params, self.ablate, per_stage, self._amp_dtype
        )
        with numerics(self.lm):
            return pending.answer()

    def _one(self, values: list) -> Any:
        return values if self.per_stage else values[0]

    # -- the answer -----------------------------------------------------------------------
    @property
    def maps(self) -> torch.Tensor | list[torch.Tensor]:
        """``[layers, heads, queries, tokens]`` float32 (per stage for Swin's every layer)."""
        return self._one([p.maps for p in self._parts])

    def numpy(self) -> np.ndarray | list[np.ndarray]:
        """`maps` as numpy arrays (the same memory)."""
        return self._one([p.maps.numpy() for p in self._parts])

    @property
    def meta(self) -> dict[str, Any] | list[dict[str, Any]]:
        """What the API's answer says besides the maps (model, image_id, tokens, layers, heads,
        query, shape, dropped, temperature, ablated, ...)."""
        return self._one([p.meta for p in self._parts])

    @property
    def tokens(self) -> dict[str, Any] | list[dict[str, Any]]:
        """The token layout of the maps: ``count``, ``num_prefix``, ``prefix`` (index and kind:
        cls, dist, reg), ``grid`` (rows, cols), ``patch_size`` (and a Swin stage's ``window``)."""
        return self._one([p.meta["tokens"] for p in self._parts])

    @property
    def grid(self) -> tuple[int, int] | list[tuple[int, int]]:
        """The patch grid ``(rows, cols)`` of the maps."""
        return self._one([tuple(p.meta["tokens"]["grid"]) for p in self._parts])

    @property
    def layers(self) -> list[int] | list[list[int]]:
        """The layers of the maps' first axis (resolved: non-negative)."""
        return self._one([p.meta["layers"] for p in self._parts])

    @property
    def heads(self) -> list[Any] | list[list[Any]]:
        """The heads of the second axis (or ``["mean"]``, ``["max"]``, ``["rollout"]``)."""
        return self._one([p.meta["heads"] for p in self._parts])

    @property
    def query(self) -> list[int] | list[list[int]]:
        """The query tokens of the third axis."""
        return self._one([p.meta["query"] for p in self._parts])

    @property
    def model(self) -> str:
        """The model's id."""
        return self.lm.id

    @property
    def image_id(self) -> str:
        """The picture's id: the server's id of its bytes (paths, bytes), else the hash of its pixels."""
        return self._item.image_id

    @property
    def filename(self) -> str | None:
        return self._item.picture.filename

    @property
    def image_bytes(self) -> bytes:
        """The picture's bytes as the server would be sent them (a lossless PNG for images, arrays
        and tensors, made when first asked for)."""
        return self._item.picture.data

    @property
    def image_size(self) -> tuple[int, int]:
        """``(height, width)`` of the picture."""
        return self._item.prep.image_size

    @property
    def input_size(self) -> tuple[int, int]:
        """``(height, width)`` the model saw."""
        return self._item.prep.input_size

    @property
    def precision(self) -> str:
        """What the maps were computed in: ``fp32`` (exact, no TF32), ``bf16`` or ``fp16``."""
        return self._precision

    @property
    def capture(self) -> CapturedImage:
        """The capture behind the maps: every layer's and head's attention, any row, any temperature."""
        return self._capture_found().entry.image

    def __repr__(self) -> str:
        shapes = ", ".join("x".join(map(str, p.maps.shape)) for p in self._parts)
        name = f" {self.filename!r}" if self.filename else ""
        return f"<headscope.Attention{name} {self.image_id} {self.model!r}: maps {shapes}>"

    # -- more of the same capture ---------------------------------------------------------
    def stats(self, mass: float = DEFAULT_MASS) -> pandas.DataFrame:
        """Every head's statistics (``GET …/stats``), one row per layer and head, with the
        survey's Parquet columns (``entropy``, ``entropy_cls``, ``distance_px``, ``prefix_mass``,
        ``artifact_mass``, ``mass_patches``, ``cls_cosine``, ``similarity``, the ranks, the sizes).

        Args:
            mass: the CLS-row mass fraction ``mass_patches`` counts patches for (0 < mass <= 1).
        """
        from ..survey.compute import Surveyor

        need("pandas", "Attention.stats()")
        mass = P.build(StatsParams, mass=mass).mass
        image = self.capture
        with computing(self.lm):
            st = image.stats(None)  # as the endpoint: everything once, then the mass thresholds
            patches = image.mass_patches(mass)
        if patches is not None:
            st.mass, st.mass_patches = mass, torch.tensor(patches, dtype=torch.int64)
        name = self.filename or self.image_id
        return Surveyor.head_rows(name, self.image_size, self.input_size, image, st, self.precision).to_pandas()

    def explain(self, layer: int | None = -1, head: int | None = 0, query: Any = None) -> dict[str, Any]:
        """One head's whole computation for one query token (``GET …/explain``): the answer's
        fields, and its arrays as torch tensors: ``q``, ``k``, ``v``, ``dot`` (q . k before the
        scale), ``scores``, ``attention``, ``head_output``, ``proj_input`` (every head's output,
        concatenated), ``head_contributions``, ``proj_bias``, ``attn_output``, and ``bias``
        where the model adds one (BEiT).

        Args:
            layer: block index (negative counts from the end; None: the last, as by default).
            head: head index (within the layer's stage for Swin; None: 0, as by default).
            query: one token: ``"cls"``, an index, a cell ``(row, col)`` or ``"patch:R,C"``;
                None for the CLS token (the first patch without one; Swin: cell 0).
        """
        from ..serving.explain import ExplainParams, explain_fields

        q = None if query is None else P.query(query)
        # None is the default here as everywhere in the Python API (query=None, layers=None)
        how = P.build(ExplainParams, layer=-1 if layer is None else layer, head=0 if head is None else head, query=q)
        found = self._capture_found()  # takes the model's lock itself when it computes
        with computing(self.lm):
            meta, hc = explain_fields(self.image_id, self.filename, self.lm, found, how, self.ablate)
        return {**meta, **dict.fromkeys(hc.OPTIONAL), **hc.tensors()}

    # -- the interactive view (app/python/view.py) ------------------------------------------
    def widget(self, max_bytes: int = 64 * 2**20) -> Any:
        """The interactive view as an anywidget (its ``layer``, ``head``, ``query``,
        ``temperature`` follow the clicks); needs ``headscope[notebook]``.

        Args:
            max_bytes: refuse (ValueError) a view shipping more (every row of the result's layers,
                float16).
        """
        from . import view

        return view.widget(self, max_bytes)

    def show(self, max_bytes: int = 64 * 2**20) -> None:
        """Draw the interactive view in the notebook (overlay, layer and head controls, the heads
        at a glance, click a patch to make it the query, the temperature); see :meth:`widget`."""
        from . import view

        view.show(self, max_bytes)

    def to_html(self, path: str | Path, max_bytes: int = 64 * 2**20) -> Path:
        """Write the interactive view to one self-contained HTML file that opens offline in any
        browser (data embedded); returns the path. See :meth:`widget`."""
        from . import view

        return view.to_html(self, path, max_bytes)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        from . import view

        return view.mimebundle(self, **kwargs)

    # -- pictures -------------------------------------------------------------------------
    @cached_property
    def display_png(self) -> bytes:
        """The picture as the page shows it (``GET /api/v1/images/{id}``: upright, longer side at
        most 1600 pixels), PNG."""
        from ..serving.pictures import display_finish, display_probe

        return display_finish(display_probe(self.image_bytes, self.settings.max_image_pixels))

    # -- figures --------------------------------------------------------------------------
    def save(
        self,
        path: Any,
        layer: Any = None,
        head: Any = None,
        query: Any = None,
        *,
        colormap: str = "viridis",
        opacity: float = 0.6,
        dpi: int = 200,
    ) -> Path:
        """A figure of one map over the picture, with its colour bar and a caption (model, layer,
        head, query): ``.svg`` and ``.pdf`` keep text, axes and colour bar as vectors (the
        picture and the map are embedded rasters), ``.png`` is a raster at ``dpi``.

        Any layer, head and query of the capture can be drawn, not only this result's (the same
        capture, no forward): the map is the API's for them.

        Args:
            path: where (its suffix picks the format).
            layer: a layer (default: this result's first); negative counts from the end.
            head: a head (default: this result's first), or ``"mean"`` / ``"max"`` over this
                result's heads.
            query: one query token: ``"cls"``, a token index, a cell ``(row, col)`` or
                ``"patch:R,C"`` (default: this result's first).
            colormap: a matplotlib colormap name.
            opacity: the map's opacity over the picture (0..1).
            dpi: the resolution of ``.png`` (and of the rasters inside ``.svg`` / ``.pdf``).

        Returns:
            The path written.

        Raises:
            ImportError: matplotlib is missing (the ``notebook`` extra).
            ValueError: a bad layer, head or query (the API's message), a query of several
                tokens, an unknown suffix.
        """
        from .figures import save_map

        return save_map(self, path, layer, head, query, colormap=colormap, opacity=opacity, dpi=dpi)

    def figure(
        self,
        layers: Any = None,
        heads: Any = None,
        query: Any = None,
        path: Any = None,
        *,
        colormap: str = "viridis",
        opacity: float = 0.6,
        dpi: int = 200,
    ) -> Any:
        """A layers x heads grid of maps over the picture with one colour scale and colour bar
        (a matplotlib ``Figure``), saved to ``path`` when given, as `save` saves.

        Args:
            layers: as `attention` takes them (default: this
                result's; a Swin result of every stage: its last stage).
            heads: likewise (default: this result's).
            query: one query token (default: this result's first).
            path: ``.svg``, ``.pdf`` or ``.png``, or None to only return the figure.
        """
        from .figures import grid_figure

        return grid_figure(self, layers, heads, query, path, colormap=colormap, opacity=opacity, dpi=dpi)


class FaithfulnessResult(dict):
    """What ``Scope.faithfulness`` gives back for one picture: the API's answer (a dict: ``methods``
    with the curves and AUCs, ``verdicts``, ``target``, ``y``, ...) that also says what it means.

    ``result.verdicts`` is each method's verdict against the random map
    (:class:`app.engine.verdicts.Verdict`: ``verdict`` is ``both``, ``positive``, ``negative`` or
    ``neither``, with the margins and a sentence in ``text``); ``repr`` prints them, one line per
    method, so a notebook shows the verdict and not only the numbers.
    """

    @property
    def verdicts(self) -> dict[str, Verdict]:
        """Each method's verdict, in the order of the methods (computed once by the engine)."""
        return {
            m: Verdict(method=m, **{k: v for k, v in d.items() if k != "above_one"})
            for m, d in self["verdicts"].items()
        }

    def __repr__(self) -> str:
        head = (
            f"FaithfulnessResult(model={self.get('model')!r}, target={self.get('target')!r}, y={self.get('y', 0):.4g}"
        )
        lines = [head + f", {len(self.get('fractions', []))} fractions,"]
        width = max((len(m) for m in self.get("methods", {})), default=0)
        for m, c in self.get("methods", {}).items():
            v = self.get("verdicts", {}).get(m, {})
            pos, neg = c.get("auc_positive"), c.get("auc_negative")
            aucs = f"AUC+ {_num(pos)}  AUC− {_num(neg)}"
            lines.append(f"  {m:<{width}}  {aucs}  {v.get('text', '')}")
        return "\n".join(lines) + "\n)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython prints this, not the dict
        p.text(repr(self))


def _num(v: Any) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{v:.3f}"
