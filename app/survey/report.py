"""``headscope report``: one self-contained HTML page of charts from a survey.

Plotly's JavaScript is inlined from the installed ``plotly`` package and the charts carry their
data: the page loads nothing from anywhere (open it offline, mail it, attach it to a paper's
supplement). Aggregates are computed with pyarrow (means, standard deviations and t-digest
quantiles per head), so the page stays small however many pictures the survey holds.

Charts: mean attention distance against depth, one dot per head (the ViT paper's fig. 7);
entropy per head as distributions (all query rows, and the CLS row); prefix and artifact mass
per layer; a map of the heads (entropy against distance); the rank of the head outputs per
layer; and tables of the most similar head pairs and the most specialised heads. A survey run
with ``--faithfulness`` adds the faithfulness table (mean AUC per relevance method with its 95 %
interval, :mod:`app.survey.faithfulness_table`) and the mean perturbation curves.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..html_json import script_json
from .faithfulness_table import HEADER, PAPER_CAVEAT, PAPER_HEADER, cells, paper_rows, summarise
from .output import read_failures, read_faithfulness
from .report_input import ReportError as ReportError  # raised for the command line (cli.py)
from .report_input import checked_survey

QUANTILES = [0.05, 0.25, 0.5, 0.75, 0.95]
COLUMNS = [
    "image",
    "layer",
    "head",
    "entropy",
    "entropy_cls",
    "distance_px",
    "prefix_mass",
    "artifact_mass",
    "cls_cosine",
    "similarity",
    "rank_numerical",
    "rank_effective",
    "artifact_tokens",
    "grid_rows",
    "grid_cols",
    "stage",
]
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"scale": 2}}

CSS = """
body{font:15px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1d2433;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:19px;margin:28px 0 4px}
.sub{color:#5b6478;margin:0 0 16px}
.card{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:12px 16px;margin:12px 0}
.facts{display:flex;flex-wrap:wrap;gap:8px 28px} .facts b{display:block;font-size:20px}
p.note{color:#5b6478;font-size:13px;margin:4px 0}
table{border-collapse:collapse;font-size:14px;width:100%}
th,td{text-align:right;padding:3px 8px;border-bottom:1px solid #eef0f4}
th:first-child,td:first-child{text-align:left}
.two{display:grid;grid-template-columns:1fr 1fr;gap:16px;align-items:start}
@media (max-width:900px){.two{grid-template-columns:minmax(0,1fr)}}
#faithfulness-table{overflow-x:auto} #faithfulness-table td{white-space:nowrap}
#faithfulness-table th:nth-child(2),#faithfulness-table td:nth-child(2){text-align:left}
figure.chart{margin:0}
caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0}
details.chart-table{margin:4px 0 12px} details.chart-table summary{cursor:pointer;color:#1d4ed8}
.table-scroll{overflow:auto;max-height:420px} .table-scroll td,.table-scroll th{white-space:nowrap}
.failures td{overflow-wrap:anywhere}
/* phones: no chart toolbar (as on the page); it sat over the charts' titles */
@media (max-width:640px),(pointer:coarse){.js-plotly-plot .plotly .modebar-container{display:none!important}}
"""


# The names beside the outliers of "the heads at a glance" need room: on a narrow screen (a phone)
# they would sit on each other, and the names are left to the hover.
NARROW_SCRIPT = """
window.addEventListener('load', function () {
  var el = document.getElementById('fig-heads');
  if (!el || !window.Plotly) return;
  var named = true;
  function fit() {
    var want = el.clientWidth >= 640;
    if (want === named) return;
    named = want;
    Plotly.restyle(el, {mode: want ? 'markers+text' : 'markers'});
  }
  window.addEventListener('resize', fit);
  fit();
});
"""

# A screen reader would read each chart's drawing one text at a time (every tick label, the axis
# titles, the legend): noise beside the figure's name and its table, which say the same. The
# drawings' SVGs are hidden from it, again after each redraw; Plotly's toolbar is outside them.
HIDE_DRAWINGS_SCRIPT = """
window.addEventListener('load', function () {
  document.querySelectorAll('.js-plotly-plot').forEach(function (el) {
    function hide() {
      el.querySelectorAll('svg.main-svg').forEach(function (s) { s.setAttribute('aria-hidden', 'true'); });
    }
    hide();
    if (el.on) el.on('plotly_afterplot', hide);
  });
});
"""


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _head_aggregates(t: pa.Table) -> dict[str, Any]:
    """Per (layer, head): means, standard deviations and quantiles over images."""
    aggs: list[tuple] = [("image", "count")]
    for c in ("entropy", "entropy_cls", "distance_px", "prefix_mass", "artifact_mass"):
        aggs += [(c, "mean"), (c, "stddev")]
    for c in ("entropy", "entropy_cls"):
        aggs.append((c, "tdigest", pc.TDigestOptions(q=QUANTILES)))
    g = t.group_by(["layer", "head"]).aggregate(aggs).sort_by([("layer", "ascending"), ("head", "ascending")])
    out = {name: _np(g.column(name)) for name in g.column_names if not name.endswith("_tdigest")}
    for c in ("entropy", "entropy_cls"):
        q = g.column(f"{c}_tdigest").to_pylist()
        out[f"{c}_q"] = np.array([v if v else [np.nan] * len(QUANTILES) for v in q], dtype=float)
    return out


def _similarity(t: pa.Table, L: int, H: int) -> tuple[np.ndarray | None, str]:
    """Mean head-by-head similarity per layer ``[L, H, H]`` and what it is.

    Layers with fewer heads than ``H`` (Swin's early stages) leave the rest NaN.
    """
    for col, what in (
        ("similarity", "1 - JS/log 2 of the heads' attention rows (the stats endpoint's similarity)"),
        ("cls_cosine", "cosine similarity of the heads' CLS rows (survey without --similarity)"),
    ):
        if col not in t.column_names:
            continue
        c = t.column(col)
        ok = pc.invert(pc.is_null(c))
        if not pc.any(ok).as_py():
            continue
        sub = t.filter(ok)
        acc = np.full((L, H, H), np.nan)
        for lyr in np.unique(_np(sub.column("layer")).astype(int)):
            part = sub.filter(pc.equal(sub.column("layer"), lyr))
            vals = _np(pc.list_flatten(part.column(col)))
            h_l = len(vals) // part.num_rows  # this layer's heads: each row lists one value per head
            vals = vals.reshape(part.num_rows, h_l)
            head = _np(part.column("head")).astype(int)
            s = np.zeros((h_l, h_l))
            n = np.zeros((h_l, 1))
            np.add.at(s, head, vals)
            np.add.at(n, head, 1)
            acc[lyr, :h_l, :h_l] = s / np.maximum(n, 1)
        return acc, what
    return None, ""


def _grid(layer: np.ndarray, head: np.ndarray, v: np.ndarray, L: int, H: int) -> np.ndarray:
    """Per-head values ``[L, H]`` from parallel arrays; NaN where a layer has fewer heads."""
    out = np.full((L, H), np.nan)
    out[layer, head] = v
    return out


def _outlier_labels(
    x: np.ndarray, y: np.ndarray, names: list[str], most: int = 12, near: float = 0.045, group: int = 4
) -> list[str]:
    """The text beside each point of a scatter: the names of the heads that stand apart, else "".

    Points closer than ``near`` (both axes scaled to their range) form a group; a group of at most
    ``group`` points counts as one, named by all its members on its top point. Groups are taken
    most isolated first (distance to the nearest point outside), at most ``most``, none with an
    isolation under ``near`` and none whose label would sit on an earlier one's.

    Args:
        x: the points' x values (NaN: never labelled).
        y: the points' y values.
        names: each point's name.
        most: the most labels.
        near: how close two points of a group are (a share of the axes' ranges).
        group: the most points one label names.
    """
    ok = np.isfinite(x) & np.isfinite(y)
    text = [""] * len(x)
    if ok.sum() < 2:
        return text

    def scaled(v: np.ndarray) -> np.ndarray:
        return (v - np.nanmin(v[ok])) / max(float(np.ptp(v[ok])), 1e-12)

    pts = np.stack([scaled(x), scaled(y)], -1)  # P, 2
    d = np.hypot(pts[:, None, 0] - pts[None, :, 0], pts[:, None, 1] - pts[None, :, 1])  # P, P
    d[~ok] = np.inf
    d[:, ~ok] = np.inf
    np.fill_diagonal(d, np.inf)
    root = list(range(len(x)))  # single-linkage groups (union-find)

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for i, j in zip(*np.nonzero(d < near)):
        root[find(int(i))] = find(int(j))
    groups: dict[int, list[int]] = {}
    for i in np.flatnonzero(ok):
        groups.setdefault(find(int(i)), []).append(int(i))
    ranked = []
    for members in groups.values():
        if len(members) > group:
            continue
        outside = np.delete(d[members], members, axis=1)
        ranked.append((float(outside.min()) if outside.size else np.inf, members))
    ranked.sort(key=lambda r: -r[0])
    placed: list[np.ndarray] = []
    for isolation, members in ranked:
        if isolation < near or len(placed) == most:
            break
        top = max(members, key=lambda i: pts[i, 1])
        # A label is about a tenth of the x range wide (more for a group) and 0.06 of the y range tall.
        width = 0.05 + 0.045 * len(members)
        if any(abs(pts[top, 0] - q[0]) < width and abs(pts[top, 1] - q[1]) < 0.07 for q in placed):
            continue
        placed.append(pts[top])
        text[top] = ", ".join(names[i] for i in sorted(members, key=lambda i: (x[i], y[i])))
    return text


def _fig_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG)


def _table(header: list[str], rows: list[list[Any]], caption: str, row_headers: bool = False) -> str:
    """A table with its caption and column headers (and, with ``row_headers``, its first cells as
    row headers)."""
    th = "".join(f'<th scope="col">{html.escape(h)}</th>' for h in header)

    def cell(i: int, v: Any) -> str:
        if row_headers and i == 0:
            return f'<th scope="row">{html.escape(str(v))}</th>'
        return f"<td>{html.escape(str(v))}</td>"

    body = "".join("<tr>" + "".join(cell(i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><caption>{html.escape(caption)}</caption><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _scrolling(table: str, label: str) -> str:
    """``table`` in a region of its own that scrolls sideways where the window is narrower than the
    table (a phone, 400 % zoom), reached with Tab and named ``label`` (as the charts' tables)."""
    return (
        f'<div class="table-scroll" tabindex="0" role="region" aria-label="{html.escape(label)}: the table">'
        + table
        + "</div>"
    )


def _num(v: Any, spec: str) -> str:
    """A number of a chart's table as its hover writes it; a dash where there is none (NaN)."""
    v = float(v)
    return "–" if not np.isfinite(v) else format(v, spec)


def _chart(fig, div_id: str, label: str, header: list[str], rows: list[list[Any]]) -> str:
    """A chart for screen readers too: a figure named by ``label`` (what it shows), with "Show as
    table" after the drawing, the numbers it draws in a table captioned ``label``. The figure, not
    an image: Plotly's toolbar buttons inside it stay reachable."""
    name = html.escape(f"{label} (chart; “Show as table” below gives its numbers)")
    return (
        f'<figure class="chart" id="{div_id}-figure" aria-label="{name}">'
        + _fig_html(fig, div_id)
        + f'<details class="chart-table" id="{div_id}-table"><summary>Show as table</summary>'
        + f'<div class="table-scroll" tabindex="0" role="region" aria-label="{html.escape(label)}: the numbers">'
        + _table(header, rows, label, row_headers=True)
        + "</div></details></figure>"
    )


def _layer_head_rows(
    s: SurveyData, v: np.ndarray, spec: str, extra=None, sd: np.ndarray | None = None
) -> tuple[list[str], list[list[str]]]:
    """A layer x head table of per-head values ``v`` (parallel to ``s.layer``, ``s.head``), with
    ``± sd`` where given: a row per layer, a column per head (and ``extra``: (name, per-layer
    values) as a last column)."""
    grid = _grid(s.layer, s.head, v, s.layers, s.heads)
    sds = _grid(s.layer, s.head, sd, s.layers, s.heads) if sd is not None else None

    def cell(lyr: int, h: int) -> str:
        text = _num(grid[lyr, h], spec)
        return text if sds is None or text == "–" else f"{text} ± {_num(sds[lyr, h], spec)}"

    header = ["layer"] + [f"head {h}" for h in range(s.heads)] + ([extra[0]] if extra else [])
    rows = [
        [f"layer {lyr}"] + [cell(lyr, h) for h in range(s.heads)] + ([_num(extra[1][lyr], spec)] if extra else [])
        for lyr in range(s.layers)
    ]
    return header, rows


def faithfulness_section(tests: pa.Table) -> str:
    """The faithfulness table and the mean perturbation curves of a survey's ``--faithfulness`` rows."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    summaries = summarise(tests)
    fractions = tests.column("fractions")[0].as_py()
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=("positive: most relevant removed first (lower is better)", "negative: least relevant first"),
    )
    palette = ["#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2"]
    curves: list[tuple[str, str, np.ndarray]] = []  # (method, curve, mean y per fraction): the table
    for i, summ in enumerate(summaries):
        mine = pc.and_(pc.equal(tests.column("method"), summ.method), pc.equal(tests.column("target"), summ.target))
        if "protocol" in tests.column_names:  # tables before --protocol: live
            mine = pc.and_(mine, pc.equal(pc.fill_null(tests.column("protocol"), "live"), summ.protocol))
        rows = tests.filter(mine)
        name = summ.method if len({s.target for s in summaries}) == 1 else f"{summ.method} ({summ.target})"
        if summ.protocol == "paper":
            name += ", paper protocol (AUC %)"
        dash = "dash" if summ.method == "random" else "solid"
        color = "#6b7280" if summ.method == "random" else palette[i % len(palette)]
        for col, curve in enumerate(("positive", "negative"), 1):
            ys = np.array(rows.column(curve).to_pylist(), dtype=float)  # images, fractions
            curves.append((name, curve, np.nanmean(ys, axis=0)))
            fig.add_trace(
                go.Scatter(
                    x=fractions,
                    y=curves[-1][2],
                    mode="lines+markers",
                    name=f"{name}: AUC+ {summ.auc_positive.mean:.3f}, AUC− {summ.auc_negative.mean:.3f}",
                    legendgroup=name,
                    showlegend=col == 1,
                    line=dict(color=color, dash=dash, width=2),
                    marker=dict(size=5),
                    hovertemplate=f"{name}<br>%{{x:.2f}} removed: y / y₀ = %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="fraction of patches removed", range=[0, max(fractions) + 0.02])
    paper = any(s.protocol == "paper" for s in summaries)
    ylabel = "score / score₀ or top-1 hits (paper protocol)" if paper else "score(perturbed) / score₀"
    fig.update_yaxes(title_text=f"{ylabel} (mean over images)", col=1)
    fig.update_layout(
        height=420, margin=dict(t=40, r=10), template="plotly_white", legend=dict(orientation="h", y=-0.22)
    )
    target = ", ".join(dict.fromkeys(s.target for s in summaries))  # as resolved: output, top...
    methods_text = ", ".join(dict.fromkeys(s.method for s in summaries))
    return (
        "<h2>How faithful each relevance map is</h2>"
        '<p class="note">The perturbation test (Chefer et al. 2021) on every picture, for the target '
        f"<b>{html.escape(str(target))}</b> ({html.escape(methods_text)}): remove the patches a map calls most "
        "relevant (<i>positive</i>: the target should fall, a low area is better) or least relevant (<i>negative</i>: "
        "it should hold, a high area is better), fractions "
        f"{html.escape(', '.join(f'{f:g}' for f in fractions))}. Means over the pictures with a <b>t-based 95 % "
        "confidence interval</b> (mean ± t(0.975, n−1)·s/√n over pictures) in brackets; the differences to the "
        "random map are paired, picture by picture. A method is worth showing where it beats random on both "
        "curves.</p>"
        # Wider than the card with the paper's long target names: a region keyboard users can scroll.
        + '<div class="card" id="faithfulness-table" tabindex="0" role="region" aria-label="faithfulness table">'
        + _table(
            HEADER,
            [cells(s) for s in summaries],
            "Each relevance map's areas under the perturbation curves: means over the pictures [95 % interval]",
        )
        + "</div>"
        + _paper_section(summaries)
        + _chart(
            fig,
            "fig-faithfulness",
            "Mean perturbation curves per method (mean over images) against the fraction of patches removed",
            ["fraction of patches removed"] + [f"{name} ({curve})" for name, curve, _ in curves],
            [[f"{f:g}"] + [_num(ys[k], ".3f") for _, _, ys in curves] for k, f in enumerate(fractions)],
        )
    )


def _paper_section(summaries) -> str:
    """The ``--protocol paper`` rows in the paper's units beside its Table 1 ('' without them)."""
    rows = paper_rows(summaries)
    if not rows:
        return ""
    return (
        '<p class="note">With <code>--protocol paper</code> (Chefer et al. 2021\'s protocol: pixels of the bilinearly '
        "upsampled map set to black, top-1 hits of the target's class, AUC = trapz(y, x) &times; 100), in the paper's "
        "units beside its Table 1 (ViT-B/16, ImageNet validation set, predicted class). "
        + re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(PAPER_CAVEAT, quote=False))
        + "</p>"
        + '<div class="card" id="faithfulness-paper">'
        + _table(PAPER_HEADER, rows, "With the paper's protocol, beside the paper's Table 1")
        + "</div>"
    )


@dataclass
class SurveyData:
    """What every chart of the report reads: the survey's rows and their per-head aggregates."""

    path: Path
    table: pa.Table
    meta: dict[str, Any]
    failures: pa.Table | None
    layers: int
    heads: int
    images: int
    agg: dict[str, Any]
    layer: np.ndarray  # per aggregated head: its layer
    head: np.ndarray  # per aggregated head: its index
    heads_per_layer: np.ndarray
    windowed: bool

    @property
    def model(self) -> str:
        return self.meta.get("model", "?")

    @property
    def colors(self) -> list[str]:
        """One colour per head index, the same in every chart."""
        return [f"hsl({int(360 * h / self.heads)},65%,45%)" for h in range(self.heads)]


def read_survey(survey: Path) -> SurveyData:
    """The survey at ``survey`` (a dataset folder or one Parquet file), aggregated per head."""
    t, meta = checked_survey(survey, COLUMNS)  # a hostile file: ReportError, in bounded time
    if t.num_rows == 0:
        raise ReportError(f"{survey} holds no survey rows")
    L = int(pc.max(t.column("layer")).as_py()) + 1
    agg = _head_aggregates(t)
    layer = agg["layer"].astype(int)
    return SurveyData(
        path=survey,
        table=t,
        meta=meta,
        failures=read_failures(survey) if survey.is_dir() else None,
        layers=L,
        heads=int(pc.max(t.column("head")).as_py()) + 1,
        images=len(pc.unique(t.column("image"))),
        agg=agg,
        layer=layer,
        head=agg["head"].astype(int),
        heads_per_layer=np.bincount(layer, minlength=L),
        windowed="stage" in t.column_names and pc.any(pc.invert(pc.is_null(t.column("stage")))).as_py(),
    )


def build_report(survey: Path | str, title: str | None = None) -> str:
    """The report's HTML for the survey at ``survey`` (a dataset folder or one Parquet file)."""
    s = read_survey(Path(survey))
    title = title or f"Headscope survey: {s.model}, {s.images:,} images"
    ranks, similar = rank_section(s), similar_heads_section(s)
    sections = [distance_section(s), entropy_section(s), mass_section(s), heads_map_section(s), ranks, similar]
    tests = read_faithfulness(s.path) if s.path.is_dir() else None
    has_tests = tests is not None and tests.num_rows > 0
    if has_tests:
        sections.append(faithfulness_section(tests))
    sections.append(not_measured_section(s, ranks is None, similar is None, not has_tests and s.path.is_dir()))
    return page(title, header_html(s, title), [x for x in sections if x], failures_html(s), s.meta)


def not_measured_section(s: SurveyData, ranks: bool, similar: bool, tests: bool) -> str | None:
    """What the page leaves out because the survey did not measure it, and the flag that adds it;
    None when nothing is left out. A reader otherwise cannot tell a missing chart from a bug."""
    why = []
    if ranks:
        why.append("the rank of the head outputs per layer: survey with <code>--ranks</code>")
    if similar:
        why.append(
            "the most similar head pairs: every layer has one head"
            if s.heads < 2
            else "the most similar head pairs: survey with <code>--similarity</code> (a model without a CLS "
            "token has no CLS-row cosine to fall back on)"
        )
    if tests:
        why.append(
            "the faithfulness of relevance maps: survey with <code>--faithfulness</code> (a table beside "
            "the survey, OUT.faithfulness.parquet)"
        )
    if not why:
        return None
    return '<h2>Not in this survey</h2><ul class="note">' + "".join(f"<li>{w}</li>" for w in why) + "</ul>"


def distance_section(s: SurveyData) -> str:
    """Mean attention distance against depth, one dot per head (the ViT paper's fig. 7)."""
    import plotly.graph_objects as go

    L, H, layer, head, agg, colors = s.layers, s.heads, s.layer, s.head, s.agg, s.colors
    fig = go.Figure()
    for h in range(H):
        m = head == h
        fig.add_trace(
            go.Scatter(
                x=layer[m] + (h - (H - 1) / 2) * 0.06,
                y=agg["distance_px_mean"][m],
                error_y=dict(type="data", array=agg["distance_px_stddev"][m], thickness=1, width=0, color=colors[h]),
                mode="markers",
                marker=dict(size=9, color=colors[h], line=dict(width=0.5, color="#fff")),
                name=f"head {h}",
                customdata=np.stack([layer[m], agg["distance_px_stddev"][m], agg["image_count"][m]], -1),
                hovertemplate="layer %{customdata[0]} head " + str(h) + "<br>%{y:.1f} px ± %{customdata[1]:.1f} "
                "(sd over %{customdata[2]} images)<extra></extra>",
            )
        )
    fig.update_layout(
        xaxis=dict(title="network depth (layer)", dtick=1, range=[-0.5, L - 0.5]),
        yaxis=dict(title="mean attention distance (input pixels)", rangemode="tozero"),
        height=460,
        margin=dict(t=20, r=10),
        legend=dict(orientation="h", y=-0.18),
        template="plotly_white",
    )
    return (
        "<h2>Mean attention distance against depth</h2>"
        '<p class="note">One dot per head: the mean over images of its mean attention distance (for each patch '
        "query, the attention-weighted distance to the patch keys, in input pixels; Dosovitskiy et al. 2021, "
        "fig. 7). Bars: standard deviation over images."
        + (" Swin: between the cells of each layer's stage grid, within the query's window." if s.windowed else "")
        + "</p>"
        + _chart(
            fig,
            "fig-distance",
            "Mean attention distance in input pixels, plus or minus its standard deviation over images, "
            "per layer and head",
            *_layer_head_rows(s, agg["distance_px_mean"], ".1f", sd=agg["distance_px_stddev"]),
        )
    )


def entropy_section(s: SurveyData) -> str:
    """Each head's attention entropy as distributions over images, one group of boxes per layer."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    L, H, layer, head, agg, colors = s.layers, s.heads, s.layer, s.head, s.agg, s.colors
    # One group of boxes per layer (12 ticks, not 72), one colour per head as in the chart above.
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, subplot_titles=("all query rows", "CLS row")
    )
    for r, col in enumerate(("entropy", "entropy_cls"), start=1):
        q = agg[f"{col}_q"]
        if np.isnan(q).all():
            continue
        for h in range(H):
            m = head == h
            fig.add_trace(
                go.Box(
                    x=layer[m],
                    lowerfence=q[m, 0],
                    q1=q[m, 1],
                    median=q[m, 2],
                    q3=q[m, 3],
                    upperfence=q[m, 4],
                    mean=agg[f"{col}_mean"][m],
                    marker_color=colors[h],
                    line=dict(width=1.2),
                    name=f"head {h}",
                    legendgroup=f"head {h}",
                    showlegend=r == 1,
                    boxmean=True,
                    hovertemplate=f"layer %{{x}} head {h}<extra></extra>",
                ),
                row=r,
                col=1,
            )
    fig.update_yaxes(title_text="entropy / log W²" if s.windowed else "entropy / log N", range=[0, 1.02])
    fig.update_xaxes(tickmode="array", tickvals=list(range(L)), range=[-0.5, L - 0.5])
    fig.update_xaxes(title_text="layer", row=2, col=1)
    fig.update_layout(
        height=640,
        margin=dict(t=30, r=10),
        template="plotly_white",
        boxmode="group",
        boxgroupgap=0.25,
        boxgap=0.1,
        legend=dict(orientation="h", y=-0.12, x=0),
    )
    return (
        "<h2>Entropy per head</h2>"
        '<p class="note">Distribution over images of each head\'s normalised attention entropy (1 = uniform '
        + (
            "over the W x W keys of the query's window, as Swin's softmax runs, 0 = one key). "
            if s.windowed
            else "over all tokens, 0 = one token). "
        )
        + "One group of boxes per layer, one box per head (colours as above). "
        + "Boxes: quartiles; whiskers: 5th and 95th percentiles; dashed: mean. "
        + (
            "Mean over all query cells (Swin has no CLS token)."
            if s.windowed
            else "Top: mean over all query rows; bottom: the CLS token's row."
        )
        + "</p>"
        + _chart(fig, "fig-entropy", "Normalised attention entropy per layer and head", *_entropy_rows(s))
    )


def _entropy_rows(s: SurveyData) -> tuple[list[str], list[list[str]]]:
    """The entropy chart's numbers: a row per head, the box of each row kind (all rows, the CLS
    row): 5th, 25th, 50th, 75th and 95th percentiles and the mean."""
    kinds = [
        (c, w) for c, w in (("entropy", "all rows"), ("entropy_cls", "CLS row")) if not np.isnan(s.agg[f"{c}_q"]).all()
    ]
    stats = ["5th percentile", "25th percentile", "median", "75th percentile", "95th percentile", "mean"]
    header = ["head"] + [f"{w}: {st}" for _, w in kinds for st in stats]
    rows = []
    for i in range(len(s.layer)):
        row = [f"layer {s.layer[i]} head {s.head[i]}"]
        for c, _ in kinds:
            row += [_num(x, ".3f") for x in s.agg[f"{c}_q"][i]] + [_num(s.agg[f"{c}_mean"][i], ".3f")]
        rows.append(row)
    return header, rows


def mass_section(s: SurveyData) -> str:
    """The attention on prefix and on artifact tokens per layer (or why it was not measured)."""
    import plotly.graph_objects as go

    L, H, layer, head, agg, colors, t = s.layers, s.heads, s.layer, s.head, s.agg, s.colors, s.table
    img_rows = t.filter(pc.and_(pc.equal(t.column("layer"), 0), pc.equal(t.column("head"), 0)))
    arts = _np(img_rows.column("artifact_tokens")) if "artifact_tokens" in t.column_names else np.zeros(0)
    with_art = float((arts > 0).mean()) if arts.size else 0.0
    art_note = (
        f"{with_art:.0%} of the images have at least one artifact token "
        f"(mean {arts.mean() if arts.size else 0:.2f} per image)."
    )
    masses = [c for c in ("prefix_mass", "artifact_mass") if not np.isnan(agg[f"{c}_mean"]).all()]
    if masses:
        # One chart each, side by side on a wide screen and one under the other on a narrow one.
        titles = {"prefix_mass": "attention on prefix tokens", "artifact_mass": "attention on artifact tokens"}
        cards = []
        for i, col in enumerate(masses):
            v = agg[f"{col}_mean"]
            div_id = "fig-mass" if i == 0 else "fig-mass-artifacts"
            if not np.nanmax(v) > 0:
                cards.append(
                    f'<div class="card"><b>{titles[col].capitalize()}</b><p class="note" id="{div_id}-none">'
                    "0 for every head: no picture of this survey has such a token.</p></div>"
                )
                continue
            fig = go.Figure()
            per_layer = np.array([np.nanmean(v[layer == lyr]) for lyr in range(L)])
            for h in range(H):
                m = head == h
                fig.add_trace(
                    go.Scatter(
                        x=layer[m] + (h - (H - 1) / 2) * 0.06,
                        y=v[m],
                        mode="markers",
                        marker=dict(size=7, color=colors[h], opacity=0.85),
                        name=f"head {h}",
                        customdata=layer[m],
                        hovertemplate=f"layer %{{customdata}} head {h}: %{{y:.3f}}<extra></extra>",
                    )
                )
            fig.add_trace(
                go.Scatter(
                    x=np.arange(L),
                    y=per_layer,
                    mode="lines",
                    line=dict(color="#1d2433", width=2),
                    name="mean over heads",
                    hovertemplate="layer %{x}: mean %{y:.3f}<extra></extra>",
                )
            )
            fig.update_layout(
                title=dict(text=titles[col], x=0.5, font=dict(size=14)),
                xaxis=dict(title="layer", dtick=1, range=[-0.5, L - 0.5]),
                yaxis=dict(title="mean share of attention", rangemode="tozero"),
                height=420,
                margin=dict(t=40, r=10, l=60),
                template="plotly_white",
                legend=dict(orientation="h", y=-0.22, x=0),
            )
            label = f"Mean share of attention on {titles[col].removeprefix('attention on ')} per layer and head"
            table = _layer_head_rows(s, v, ".3f", ("mean over heads", per_layer))
            cards.append(f'<div class="card">{_chart(fig, div_id, label, *table)}</div>')
        return (
            "<h2>Prefix and artifact mass per layer</h2>"
            '<p class="note">Mean over query rows and images of the attention each head gives to the prefix '
            "tokens (CLS, registers) and to high-norm artifact tokens of the last layer (robust z-score of the "
            f"token norm above 6; Darcet et al. 2024). {art_note}</p>"
            + (f'<div class="two">{"".join(cards)}</div>' if len(cards) > 1 else cards[0])
        )
    else:
        return (
            "<h2>Prefix and artifact mass per layer</h2>"
            '<p class="note">Not measured for this model: it has no prefix tokens, and its high-norm tokens '
            "(robust z-score of the last layer's token norm above 6) sit on the last stage's grid, which the "
            f"other stages' attention does not address. {art_note}</p>"
        )


def heads_map_section(s: SurveyData) -> str:
    """Every head by its mean entropy and mean attention distance; the outliers named."""
    import plotly.graph_objects as go

    layer, head, agg = s.layer, s.head, s.agg
    # Every head is a dot (its name on hover); only the outliers carry their name, where it has room.
    ent_x, dist_y = agg["entropy_mean"], agg["distance_px_mean"]
    names = [f"L{lh[0]} H{lh[1]}" for lh in zip(layer, head)]
    fig = go.Figure(
        go.Scatter(
            x=ent_x,
            y=dist_y,
            mode="markers+text",
            text=_outlier_labels(ent_x, dist_y, names),
            customdata=names,
            textposition="top center",
            textfont=dict(size=11, color="#3b4256"),
            cliponaxis=False,
            marker=dict(
                size=10,
                color=layer,
                colorscale="Viridis",
                colorbar=dict(title="layer", thickness=14),
                line=dict(width=0.5, color="#fff"),
            ),
            hovertemplate="%{customdata}<br>entropy %{x:.3f}<br>distance %{y:.1f} px<extra></extra>",
        )
    )
    xaxis = "mean entropy / log W²" if s.windowed else "mean entropy / log N"
    fig.update_layout(
        xaxis_title=xaxis,
        yaxis_title="mean attention distance (px)",
        height=480,
        margin=dict(t=30, r=10),
        template="plotly_white",
    )
    return (
        "<h2>The heads at a glance</h2>"
        '<p class="note">Each head by its mean entropy and mean attention distance: focused local heads sit '
        "bottom left, broad global heads top right. Colour: the layer. The heads that stand apart are named "
        "(L layer H head); point at any dot for its name.</p>"
        + _chart(
            fig,
            "fig-heads",
            "Every head by its mean entropy and its mean attention distance",
            ["head", "layer", xaxis, "mean attention distance (px)"],
            [[n, str(lyr), _num(e, ".3f"), _num(d, ".1f")] for n, lyr, e, d in zip(names, layer, ent_x, dist_y)],
        )
    )


def rank_section(s: SurveyData) -> str | None:
    """The rank of the head outputs per layer; None when the survey did not measure it."""
    import plotly.graph_objects as go

    t = s.table
    if "rank_effective" not in t.column_names or not pc.any(pc.invert(pc.is_null(t.column("rank_effective")))).as_py():
        return None
    h0 = t.filter(pc.equal(t.column("head"), 0))
    g = (
        h0.group_by("layer")
        .aggregate([("rank_effective", "mean"), ("rank_effective", "stddev"), ("rank_numerical", "mean")])
        .sort_by("layer")
    )
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=_np(g.column("layer")),
            y=_np(g.column("rank_effective_mean")),
            error_y=dict(type="data", array=_np(g.column("rank_effective_stddev"))),
            mode="lines+markers",
            name="effective rank",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=_np(g.column("layer")),
            y=_np(g.column("rank_numerical_mean")),
            mode="lines+markers",
            name="numerical rank",
            line=dict(dash="dot"),
        )
    )
    fig.update_layout(
        xaxis=dict(title="layer", dtick=1),
        yaxis=dict(title="rank of the head outputs", rangemode="tozero"),
        height=380,
        margin=dict(t=20, r=10),
        template="plotly_white",
        legend=dict(orientation="h", y=1.12, x=0),
    )
    return (
        "<h2>Rank of the head outputs</h2>"
        '<p class="note">Per layer, mean over images (bars: standard deviation) of the effective rank (Roy & '
        "Vetterli 2007) and the numerical rank of the heads' outputs concatenated, tokens x (heads x head "
        "dim). Heads that duplicate each other lower both.</p>"
        + _chart(
            fig,
            "fig-rank",
            "Rank of the head outputs per layer",
            ["layer", "effective rank (mean)", "effective rank (standard deviation)", "numerical rank (mean)"],
            [
                [f"layer {lyr}", _num(e, ".2f"), _num(sd, ".2f"), _num(n, ".2f")]
                for lyr, e, sd, n in zip(
                    _np(g.column("layer")),
                    _np(g.column("rank_effective_mean")),
                    _np(g.column("rank_effective_stddev")),
                    _np(g.column("rank_numerical_mean")),
                )
            ],
        )
    )


def similar_heads_section(s: SurveyData) -> str | None:
    """The most similar head pairs and the most specialised heads; None without similarities."""
    L, H, layer, head, agg, heads_per_layer = s.layers, s.heads, s.layer, s.head, s.agg, s.heads_per_layer
    sim, what = _similarity(s.table, L, H)
    if sim is None or H < 2:
        return None
    pairs = sorted(
        (
            (float(sim[lyr, i, j]), lyr, i, j)
            for lyr in range(L)
            for i in range(heads_per_layer[lyr])
            for j in range(i + 1, heads_per_layer[lyr])
        ),
        reverse=True,
    )[:10]
    off = np.nan_to_num(sim, nan=-np.inf)
    off[:, np.arange(H), np.arange(H)] = -np.inf
    closest = off.max(-1)  # L, H: similarity to the closest other head of the layer
    ent = _grid(layer, head, agg["entropy_mean"], L, H)
    dist = _grid(layer, head, agg["distance_px_mean"], L, H)
    spec = sorted(
        (float(closest[lyr, h]), lyr, h)
        for lyr in range(L)
        if heads_per_layer[lyr] > 1
        for h in range(heads_per_layer[lyr])
    )[:10]
    return (
        "<h2>Most similar and most specialised heads</h2>"
        f'<p class="note">Similarity: {html.escape(what)}, averaged over images; 1 = identical. '
        "A head is specialised when even the closest other head of its layer is unlike it.</p>"
        '<div class="two"><div class="card">'
        + _scrolling(
            _table(
                ["layer", "heads", "similarity"],
                [[lyr, f"{i} & {j}", f"{v:.3f}"] for v, lyr, i, j in pairs],
                "Most similar pairs",
            ),
            "Most similar pairs",
        )
        + '</div><div class="card">'
        + _scrolling(
            _table(
                ["head", "closest other head", "entropy", "distance px"],
                [
                    [f"layer {lyr} head {h}", f"{v:.3f}", f"{ent[lyr, h]:.3f}", f"{dist[lyr, h]:.1f}"]
                    for v, lyr, h in spec
                ],
                "Most specialised heads",
                row_headers=True,
            ),
            "Most specialised heads",
        )
        + "</div></div>"
    )


def header_html(s: SurveyData, title: str) -> str:
    """The title, the model, the patch grids and the survey's facts at a glance."""
    t, L, H = s.table, s.layers, s.heads
    grids = t.filter(pc.and_(pc.equal(t.column("layer"), 0), pc.equal(t.column("head"), 0)))
    grid_counts = (
        grids.group_by(["grid_rows", "grid_cols"])
        .aggregate([("image", "count")])
        .sort_by([("image_count", "descending")])
    )
    grid_list = [
        f"{r}x{c} ({n})"
        for r, c, n in zip(*(grid_counts.column(k).to_pylist() for k in ("grid_rows", "grid_cols", "image_count")))
    ]
    top_grids = ", ".join(grid_list[:6]) + (f" and {len(grid_list) - 6} more" if len(grid_list) > 6 else "")
    n_fail = s.failures.num_rows if s.failures is not None else 0
    facts = [
        ("images", f"{s.images:,}"),
        ("failures (unreadable pictures, refused tests)", f"{n_fail:,}"),
        (
            ("layers x heads", f"{L} x {H}")
            if s.heads_per_layer.min() == H
            else ("layers, heads per layer", f"{L}, {s.heads_per_layer.min()}-{H}")
        ),
        ("rows", f"{t.num_rows:,}"),
    ]
    meta = s.meta
    return (
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="sub">model <b>{html.escape(str(s.model))}</b>'
        + (f" · precision {html.escape(str(meta.get('precision')))}" if meta.get("precision") else "")
        + f" · patch grids (rows x cols: images): {html.escape(top_grids)}"
        + f" · generated {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}</p>"
        + '<div class="card facts">'
        + "".join(f"<div><b>{html.escape(v)}</b>{html.escape(k)}</div>" for k, v in facts)
        + "</div>"
    )


def failures_html(s: SurveyData) -> str:
    """The first failures (pictures that could not be read or computed, refused perturbation
    tests), and how many more; empty when none failed."""
    n_fail = s.failures.num_rows if s.failures is not None else 0
    if s.failures is None or not n_fail:
        return ""
    shown = s.failures.slice(0, 20).to_pylist()
    return (
        "<h2>Failures: pictures that could not be read or computed, refused tests</h2>"
        + '<div class="failures">'
        + _table(
            ["image", "error", "message"],
            [[r["image"], r["error"], r["message"]] for r in shown],
            "The first failures",
        )
        + "</div>"
        + (f'<p class="note">… and {n_fail - 20:,} more (in the _failures table).</p>' if n_fail > 20 else "")
    )


def page(title: str, header: str, sections: list[str], failures: str, meta: dict[str, Any]) -> str:
    """The self-contained page: Plotly's script inlined, the survey's metadata as JSON."""
    from plotly.offline import get_plotlyjs

    # Script content is not HTML-decoded: raw JSON, with "</" broken so it cannot end the tag.
    meta_json = script_json(meta)
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head>"
        f"<body><main>{header}{''.join(sections)}{failures}"
        f"<script type='application/json' id='survey-meta'>{meta_json}</script>"
        f"<script type='text/javascript'>{HIDE_DRAWINGS_SCRIPT}{NARROW_SCRIPT}</script>"
        "</main></body></html>\n"
    )


def write_report(survey: Path | str, out: Path | str, title: str | None = None) -> Path:
    """Write the report of ``survey`` to ``out`` (atomically); returns the path."""
    page = build_report(survey, title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out
