"""Figures for papers: one attention map over its picture, or a layers x heads grid of them.

Drawn with matplotlib's object API (a ``Figure`` of its own: no pyplot state, no backend
change in the user's session). SVG and PDF keep text, axes and colour bar as vectors (text as
text: ``svg.fonttype = none``, TrueType in PDF); the picture and the map over it are embedded
rasters. The map is the API's for the same parameters (`Attention.select` of the result's
capture: any layer, head and query without another forward); the patch tokens only, on the patch
grid, stretched over the whole picture (the model saw the whole picture, resized).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from . import params as P
from .extras import need

FORMATS = (".svg", ".pdf", ".png")
# Text stays text (SVG <text>, PDF TrueType): searchable, editable, sharp at any size.
RC = {"svg.fonttype": "none", "pdf.fonttype": 42, "ps.fonttype": 42}


def _first(values: Any) -> Any:
    """The first item of a result's list, or of its first stage's list (Swin's every layer)."""
    v = values[0]
    return v[0] if isinstance(v, list) else v


def _picture(att: Any) -> np.ndarray:
    """The picture as the page shows it (upright, longer side at most 1600 px), ``H x W x 3``."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(att.display_png)).convert("RGB"))


def _patches(maps: np.ndarray, tokens: dict[str, Any]) -> np.ndarray:
    """``[..., tokens]`` -> ``[..., rows, cols]``: the patch tokens on their grid (prefix left out)."""
    rows, cols = tokens["grid"]
    return maps[..., tokens["num_prefix"] :].reshape(*maps.shape[:-1], rows, cols)


def _query_text(att: Any, token: int) -> str:
    """A query token as a caption says it: ``CLS``, ``reg 2``, ``patch (3, 5)``."""
    tokens = att.tokens[0] if isinstance(att.tokens, list) else att.tokens
    for i, p in enumerate(tokens["prefix"]):
        if p["index"] == token:
            kinds = [q["kind"] for q in tokens["prefix"]]
            same = kinds.count(p["kind"])
            return p["kind"].upper() if same == 1 else f"{p['kind']} {kinds[: i + 1].count(p['kind']) - 1}"
    r, c = divmod(token - tokens["num_prefix"], tokens["grid"][1])
    return f"patch ({r}, {c})"


def _extras(att: Any) -> str:
    """What else the caption says: a temperature other than 1, the heads removed, dropped columns."""
    bits = []
    if att.params.temperature != 1:
        bits.append(f"T = {att.params.temperature:g}")
    if att.ablate:
        bits.append("ablated " + ",".join(f"{a}:{b}" for a, b in att.ablate))
    if att.params.drop != "none":
        bits.append(f"drop {att.params.drop}")
    return "".join(f"  ·  {b}" for b in bits)


def _one_query(att: Any, query: Any) -> Any:
    """The query of a figure: the one asked for, else this result's first."""
    return _first(att.query) if query is None else query


def _check_one(sel: Any) -> None:
    if sel.maps.shape[2] != 1:
        raise ValueError(f"a figure shows one query token; query {sel.params.query!r} gives {sel.maps.shape[2]}")


def _save(fig: Any, path: Any, dpi: int) -> Path:
    matplotlib = need("matplotlib", "Attention.save()")
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise ValueError(f"a figure is saved as {', '.join(FORMATS)}; got {out.name!r}")
    with matplotlib.rc_context(RC):
        fig.savefig(out, dpi=dpi, bbox_inches="tight", pad_inches=0.05)
    return out


def _vector_colorbar(fig: Any, mappable: Any, **kwargs: Any) -> Any:
    cbar = fig.colorbar(mappable, **kwargs)
    cbar.solids.set_rasterized(False)  # matplotlib rasterizes long colour bars; papers want vectors
    cbar.outline.set_linewidth(0.5)
    cbar.ax.tick_params(labelsize=7)
    cbar.set_label(cbar.ax.get_ylabel(), fontsize=8)
    return cbar


def map_figure(
    att: Any, layer: Any = None, head: Any = None, query: Any = None, *, colormap: str = "viridis", opacity: float = 0.6
) -> Any:
    """One map over the picture with its colour bar and a caption (model, layer, head, query).

    Args:
        att: an `Attention`.
        layer: a layer (default: the result's first); negative counts from the end.
        head: a head (default: the result's first), or ``mean`` / ``max`` (over the result's heads).
        query: one query token as `Scope.attention` spells it (default: the result's first).
    """
    need("matplotlib", "Attention.save()")
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    if not 0 <= opacity <= 1:
        raise ValueError(f"opacity: between 0 and 1; got {opacity}")
    layer = _first(att.layers) if layer is None else layer
    head = _first(att.heads) if head is None else head
    fused = head in ("mean", "max", "rollout")
    if isinstance(layer, list | tuple) or isinstance(head, list | tuple):
        raise TypeError("save() draws one layer and one head; figure() draws several")
    one: dict[str, Any] = {"layers": layer if isinstance(layer, str) else [layer], "query": _one_query(att, query)}
    if fused:
        one |= {"aggregate": head, "heads": att.params.heads}
    else:
        one |= {"aggregate": "none", "heads": head if isinstance(head, str) else [head]}
    sel = att.select(**one)
    _check_one(sel)
    values = _patches(sel.numpy()[0, 0, 0], sel.tokens)
    picture = _picture(att)
    H, W = att.image_size
    norm = Normalize(0.0, float(values.max()) or 1.0)

    fig = Figure(figsize=(5.2, 5.2 * H / W + 0.7), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(picture, extent=(0, W, H, 0), interpolation="antialiased")
    ax.imshow(values, cmap=colormap, norm=norm, alpha=opacity, extent=(0, W, H, 0), interpolation="nearest")
    ax.set_xlabel("x (pixels)", fontsize=8)
    ax.set_ylabel("y (pixels)", fontsize=8)
    ax.tick_params(labelsize=7)
    # The bar in the map's own axes coordinates: exactly the picture's height, whatever its aspect
    # (a colour bar beside the axes is as tall as the layout's box, taller than a landscape picture).
    cax = ax.inset_axes((1.04, 0.0, 0.04, 1.0))
    _vector_colorbar(fig, ScalarMappable(norm, colormap), cax=cax, label="attention weight")
    head_text = head if fused else f"head {sel.heads[0]}"
    ax.set_title(
        f"{att.model}  ·  layer {sel.layers[0]}  ·  {head_text}  ·  query {_query_text(sel, sel.query[0])}"
        + _extras(att),
        fontsize=8,
    )
    return fig


def save_map(
    att: Any, path: Any, layer: Any, head: Any, query: Any, *, colormap: str, opacity: float, dpi: int
) -> Path:
    """`map_figure` saved to ``path`` (``.svg``, ``.pdf`` or ``.png``); the path."""
    _format_of(path)
    return _save(map_figure(att, layer, head, query, colormap=colormap, opacity=opacity), path, dpi)


def _format_of(path: Any) -> None:
    """Refuse an unknown suffix before drawing anything."""
    if Path(path).suffix.lower() not in FORMATS:
        raise ValueError(f"a figure is saved as {', '.join(FORMATS)}; got {Path(path).name!r}")


def grid_figure(
    att: Any, layers: Any, heads: Any, query: Any, path: Any, *, colormap: str, opacity: float, dpi: int = 200
) -> Any:
    """A layers x heads grid of maps over the picture, one colour scale and colour bar for all.

    Args:
        layers, heads: as `Scope.attention` takes them (default: the result's; a Swin
            result of every stage: its last stage).
        query: one query token (default: the result's first).
        path: saved there too when given (``.svg``, ``.pdf``, ``.png``).
    """
    need("matplotlib", "Attention.figure()")
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    if not 0 <= opacity <= 1:  # before any drawing, in the words save() uses
        raise ValueError(f"opacity: between 0 and 1; got {opacity}")
    if path is not None:
        _format_of(path)
    if layers is None:
        layers = att.layers[-1] if att.per_stage else att.layers
    if heads is None:
        heads = att.params.heads if att.params.aggregate != "none" else (att.heads[-1] if att.per_stage else att.heads)
    sel = att.select(layers=P.indices(layers, "layers"), heads=P.indices(heads, "heads"), query=_one_query(att, query))
    sel = sel.select(aggregate="none")
    _check_one(sel)
    values = _patches(sel.numpy()[:, :, 0], sel.tokens)  # L, H, rows, cols
    L, nh = values.shape[:2]
    picture = _picture(att)
    Hpx, Wpx = att.image_size
    norm = Normalize(0.0, float(values.max()) or 1.0)
    cell = 1.6
    fig = Figure(figsize=(cell * nh + 1.0, cell * L * Hpx / Wpx + 0.6), layout="constrained")
    axes = fig.subplots(L, nh, squeeze=False)
    for i, layer in enumerate(sel.layers):
        for j, head in enumerate(sel.heads):
            ax = axes[i, j]
            ax.imshow(picture, extent=(0, Wpx, Hpx, 0), interpolation="antialiased")
            ax.imshow(
                values[i, j], cmap=colormap, norm=norm, alpha=opacity, extent=(0, Wpx, Hpx, 0), interpolation="nearest"
            )
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"head {head}", fontsize=7)
            if j == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=7)
    _vector_colorbar(fig, ScalarMappable(norm, colormap), ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"{att.model}  ·  query {_query_text(sel, sel.query[0])}" + _extras(att), fontsize=8)
    if path is not None:
        _save(fig, path, dpi)
    return fig
