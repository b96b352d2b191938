"""The interactive view of an :class:`~app.python.result.Attention`: in a notebook, or one HTML file.

In Jupyter, JupyterLab, VS Code or Colab, ``att.show()`` (or ``att`` as a cell's last line: the
result's rich display) draws the picture with the attention of one layer, head and query over
it, the colour bar, the layer and head controls, the heads of the layer at a glance (a click on
a thumbnail picks the head), the query (a click on a patch of the picture makes it the query;
"first token" goes back to CLS) and the softmax temperature (a log-scale slider, 0.1 to 10).
``att.widget()`` gives the widget itself: its ``layer``, ``head``, ``query`` (a token index),
``temperature`` and ``colormap`` follow the clicks and can be set from Python (a negative
``layer``, ``head`` or ``query`` counts from the end, as everywhere in the API: ``w.layer = -1``
is the last layer the view holds).

``att.to_html("view.html")`` writes the same view as one self-contained file: the data, the
picture and the script are inside it, so it opens offline in any browser, from disk or mail,
without a server or a kernel.

What travels. The view ships every row of every head of the result's layers (``layers=`` of
``scope.attention``), as log-probabilities at temperature 1 less their row's largest, in float16
(``log p - max log p``: 0 at the row's peak), with each row's largest ``log p`` in float32:
``layers x heads x N x (2N + 4)`` bytes for N tokens, sent as binary buffers (``bytes`` traits,
``DataView``s in the browser; base64 in the HTML file), never as JSON lists, plus the picture as
PNG. The browser takes the row of the clicked query from them, and a temperature T as
``softmax((log p - max) / T)``, which is ``softmax(scores / T)`` since log-probabilities differ
from the scores by a constant per row: clicks and the slider need no kernel and no forward. For
the default model and a 224 x 336 picture (16 x 24 patches, N = 385): 12 x 6 x 385 x 774 bytes =
21 MB (29 MB of base64 in the HTML file); for one layer, 1.8 MB. Past ``max_bytes`` (64 MiB by
default) the view refuses with the size and asks for fewer layers
(``scope.attention(image, layers="-1")``). Float16 keeps each weight within
``2^-11 |log(p / max p)|`` of its value: exact at the row's peak, 0.34 % at a thousandth of it,
so a near-uniform row (a random model's, an early layer's) keeps its small differences instead of
drawing float16's steps. The view is for looking, ``att.maps`` holds the exact numbers. A
Swin model's view covers the layers of one stage. The view shows every head unfused and every
key column: a result fused over heads (``aggregate=``) or with dropped columns (``drop=``) opens
on head 0 of its layers.

The view needs the notebook extra (``pip install 'headscope[notebook]'``: anywidget);
``to_html`` needs nothing beyond Headscope itself.
"""

from __future__ import annotations

import base64
import functools
import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ..html_json import script_json
from ..serving import answers
from . import params as P
from .computing import computing
from .esm import assemble, entry_var
from .extras import need

if TYPE_CHECKING:
    from ..engine.captured_image import CapturedImage
    from ..engine.model import LoadedModel


class ViewedAttention(Protocol):
    """What the view reads of a result (:class:`~app.python.result.Attention`, which calls this
    module: a Protocol rather than an import keeps the two modules out of a circle)."""

    @property
    def capture(self) -> CapturedImage: ...
    @property
    def display_png(self) -> bytes: ...
    @property
    def filename(self) -> str | None: ...
    @property
    def heads(self) -> Any: ...
    @property
    def image_id(self) -> Any: ...
    @property
    def layers(self) -> Any: ...
    @property
    def lm(self) -> LoadedModel: ...
    @property
    def maps(self) -> Any: ...
    @property
    def model(self) -> str: ...
    @property
    def params(self) -> Any: ...
    @property
    def per_stage(self) -> bool: ...
    @property
    def query(self) -> Any: ...


MAX_BYTES = 64 * 2**20
ENTRY = "widget"
BINARY = ("logp", "logp_max", "image")
# The colour maps the view's front end draws (static/js/colormaps.js COLORMAPS; a test keeps them
# equal): not matplotlib's whole set, which `save()` and `figure()` take.
VIEW_COLORMAPS = ("viridis", "inferno", "magma", "plasma", "cividis", "grey")


def _layers(att: ViewedAttention) -> list[int]:
    if att.per_stage:
        raise ValueError(
            "the view shows the layers of one stage of a windowed model: ask for them, e.g. "
            "scope.attention(image, layers='-1')"
        )
    return list(att.layers)


def rows_logp(att: ViewedAttention, max_bytes: int = MAX_BYTES) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Every row of every head of the result's layers at temperature 1, as the API answers
    ``query=all`` for them, in log space less each row's largest:
    ``([layers, heads, N, N] float16 log p - max, [layers, heads, N] float32 max log p, meta)``.

    Args:
        att: the result.
        max_bytes: refuse (ValueError) past this many bytes.
    """
    layers = _layers(att)
    image = att.capture
    params = P.build(type(att.params), layers=",".join(map(str, layers)), heads="all", query="all", temperature=1.0)
    sel = answers.selection(params, image)
    heads = len(sel.heads)
    n = image.tokens(sel.stage)["count"]
    size = len(sel.layers) * heads * n * (2 * n + 4)
    if size > max_bytes:
        raise ValueError(
            f"the view would ship {size / 2**20:.1f} MiB (every row of {len(sel.layers)} layers x {heads} heads x "
            f"{n} tokens, float16), more than max_bytes={max_bytes}: ask for fewer layers, e.g. "
            "scope.attention(image, layers='-1'), or pass a larger max_bytes"
        )
    with computing(att.lm):
        maps = answers.map_tensor(image, sel, [])  # may share the capture's memory
        logp = torch.log(maps)  # L, H, N, N
        # Shifted so that each row peaks at 0, where float16 is finest: a near-uniform row's small
        # differences would otherwise drown in float16's steps at log p ~ -log N.
        top = logp.amax(-1, keepdim=True)  # L, H, N, 1
        rel = (logp - top).to(torch.float16).numpy()
        # A Swin stage padded to whole windows: the padding keys hold part of each row's softmax
        # and are not among the N tokens, so a row sums to less than 1 and no tempered row can be
        # made from it (the view then draws T = 1 only, exactly: exp(logp + logp_max), not renormalised).
        complete = bool((maps.sum(-1) > 1 - 1e-3).all())
    meta = {"layers": list(sel.layers), "tokens": image.tokens(sel.stage), "complete": complete}
    return rel, top.squeeze(-1).to(torch.float32).numpy(), meta


def _state(att: ViewedAttention, max_bytes: int) -> dict[str, Any]:
    """The view's traits: the binary ones as bytes, the rest plain JSON values."""
    logp, top, meta = rows_logp(att, max_bytes)
    layers = meta["layers"]
    shown = [h for h in att.heads if isinstance(h, int)]
    asked_layers: list[int] = att.layers  # one stage (see _layers)
    return {
        "logp": logp.astype("<f2", copy=False).tobytes(),
        "logp_max": top.astype("<f4", copy=False).tobytes(),
        "shape": list(logp.shape),
        "layers": layers,
        "tokens": meta["tokens"],
        "image": att.display_png,
        "model_name": att.model,
        "image_id": att.image_id,
        "filename": att.filename or "",
        "layer": asked_layers[-1] if asked_layers else layers[-1],
        "head": shown[0] if shown else 0,
        "query": att.query[0],
        "complete": meta["complete"],
        "temperature": float(att.params.temperature) if meta["complete"] else 1.0,
        "colormap": "viridis",
        "opacity": 0.6,
    }


@functools.cache
def esm() -> str:
    """The widget's ES module: the page's modules assembled (:mod:`app.python.esm`)."""
    return assemble(ENTRY) + f"export default {{ render: {entry_var(ENTRY)}.render }};\n"


@functools.cache
def _widget_class() -> type:
    anywidget = need("anywidget", "The interactive view (att.show(), att.widget())")
    import traitlets as t

    class AttentionWidget(anywidget.AnyWidget):  # type: ignore[name-defined]
        """One picture's attention, drawn by the page's modules; the traits are the view's state."""

        _esm = esm()
        logp = t.Bytes().tag(sync=True)  # float16 log p - max log p per row, [L, H, N, N]
        logp_max = t.Bytes().tag(sync=True)  # float32 max log p per row, [L, H, N]
        shape = t.List(t.Int()).tag(sync=True)
        layers = t.List(t.Int()).tag(sync=True)
        tokens = t.Dict().tag(sync=True)
        image = t.Bytes().tag(sync=True)
        model_name = t.Unicode().tag(sync=True)  # (ipywidgets owns model_id: the comm id)
        image_id = t.Unicode().tag(sync=True)
        filename = t.Unicode().tag(sync=True)
        layer = t.Int().tag(sync=True)
        head = t.Int().tag(sync=True)
        query = t.Int().tag(sync=True)
        complete = t.Bool(True).tag(sync=True)  # every row holds all of its softmax (else T = 1 only)
        temperature = t.Float(1.0).tag(sync=True)
        colormap = t.Unicode("viridis").tag(sync=True)
        opacity = t.Float(0.6).tag(sync=True)

        # What the view can draw, checked where it is set (w.head = 99 was taken, drawn as nothing).
        @t.validate("layer")
        def _layer(self, proposal: Any) -> int:
            v = proposal["value"]
            if isinstance(v, bool):  # t.Int takes True, which would travel as JSON true
                raise t.TraitError(f"layer {v!r}: an int")
            if self.layers and v < 0 and -len(self.layers) <= v:  # as Python counts: -1 is the last layer held
                v = self.layers[v]
            if self.layers and v not in self.layers:
                raise t.TraitError(f"layer {v}: this view holds layers {self.layers} (negative counts from the end)")
            return v

        @t.validate("head", "query")
        def _index(self, proposal: Any) -> int:
            name, v = proposal["trait"].name, proposal["value"]
            if isinstance(v, bool):
                raise t.TraitError(f"{name} {v!r}: an int")
            if len(self.shape) == 4:
                n = self.shape[1] if name == "head" else self.shape[2]
                if not -n <= v < n:
                    raise t.TraitError(
                        f"{name} {v}: {-n}..{n - 1} ({n} {'heads' if name == 'head' else 'tokens'}; negative counts "
                        "from the end)"
                    )
                v %= n
            return v

        @t.validate("temperature")
        def _temperature(self, proposal: Any) -> float:
            v = proposal["value"]
            if not (v > 0 and math.isfinite(v)):
                raise t.TraitError(f"temperature {v}: a number above 0")
            if not self.complete and v != 1.0:
                raise t.TraitError(
                    f"temperature {v}: this view's rows miss their windows' padding keys (a Swin stage padded to "
                    "whole windows), so it draws T = 1 only; att.select(temperature=...) computes a tempered map"
                )
            return v

        @t.validate("colormap")
        def _colormap(self, proposal: Any) -> str:
            v = proposal["value"]
            if v not in VIEW_COLORMAPS:  # the front end drew an unknown name as viridis, saying nothing
                raise t.TraitError(f"colormap {v!r}: the view draws {', '.join(VIEW_COLORMAPS)}")
            return v

        @t.validate("opacity")
        def _opacity(self, proposal: Any) -> float:
            v = proposal["value"]
            if not 0 <= v <= 1:
                raise t.TraitError(f"opacity {v}: 0..1")
            return v

    return AttentionWidget


def widget(att: ViewedAttention, max_bytes: int = MAX_BYTES) -> Any:
    """The anywidget of ``att`` (needs the notebook extra)."""
    cls = _widget_class()
    return cls(**_state(att, max_bytes))


def show(att: ViewedAttention, max_bytes: int = MAX_BYTES) -> None:
    """Display the view of ``att`` in the notebook (needs the notebook extra)."""
    w = widget(att, max_bytes)
    from IPython.display import display

    display(w)


def html_text(att: ViewedAttention, max_bytes: int = MAX_BYTES) -> str:
    """The view of ``att`` as one self-contained HTML page."""
    state = _state(att, max_bytes)
    for name in BINARY:
        state[name] = base64.b64encode(state[name]).decode("ascii")
    # Nothing in the data (a file name) may end or change the script element.
    data = script_json({"values": state, "binary": list(BINARY)}, separators=(",", ":"))
    title = html.escape(f"Headscope · {att.filename or att.image_id} · {att.model}")
    host = (
        f"const {{ render, localModel }} = {entry_var(ENTRY)};\n"
        'const state = JSON.parse(document.getElementById("headscope-state").textContent);\n'
        'render({ model: localModel(state), el: document.getElementById("headscope-view") });\n'
    )
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '</head>\n<body style="margin: 16px; background: #fff">\n<div id="headscope-view"></div>\n'
        f'<script type="application/json" id="headscope-state">{data}</script>\n'
        f'<script type="module">\n{assemble(ENTRY)}{host}</script>\n</body>\n</html>\n'
    )


def to_html(att: ViewedAttention, path: str | Path, max_bytes: int = MAX_BYTES) -> Path:
    """Write the view of ``att`` to ``path`` (one file, opens offline); returns the path."""
    out = Path(path)
    out.write_text(html_text(att, max_bytes), encoding="utf-8")
    return out


def mimebundle(att: ViewedAttention, **kwargs: Any) -> Any:
    """The result's rich display: the widget where anywidget is installed, else its text."""
    try:
        w = widget(att)
    except (ImportError, ValueError) as e:  # a display shows the text and why, never a traceback
        return {"text/plain": f"{att!r}\n(no interactive view: {e})"}
    return w._repr_mimebundle_(**kwargs)
