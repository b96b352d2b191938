"""``headscope report`` in real Chromium: every chart draws, offline, with nothing loaded from outside."""

from __future__ import annotations

import json
import re

import pytest

from headscope.survey.report import build_report
from helpers.charts import assert_drawings_hidden

pytestmark = pytest.mark.browser


def test_the_report_draws_every_chart_without_any_outside_request(browser, report):
    page_path, lm = report
    html = page_path.read_text()
    # Nothing to fetch: no script or stylesheet is referenced by URL; Plotly is inlined.
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=['\"]?(https?:)?//", html, re.I)
    assert "cdn.plot.ly/plotly" not in html.split("</head>")[1]
    ctx = browser.new_context(viewport={"width": 1240, "height": 900}, offline=True)
    outside: list[str] = []
    errors: list[str] = []

    def route(r):
        url = r.request.url
        if url.startswith(("file:", "data:", "blob:")):
            return r.continue_()
        outside.append(url)
        return r.abort()

    ctx.route("**/*", route)
    pg = ctx.new_page()
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(page_path.as_uri())
    ids = ["fig-distance", "fig-entropy", "fig-mass", "fig-heads", "fig-rank"]
    pg.wait_for_function(
        "ids => ids.every(id => document.getElementById(id)?.querySelector('.main-svg'))", arg=ids, timeout=60_000
    )
    # The ViT paper's figure: one trace per head, one dot per layer.
    dots = pg.evaluate(
        "() => document.getElementById('fig-distance')._fullData.map(t => [t.name, t.x.length, t.y.length])"
    )
    assert dots == [[f"head {h}", lm.num_layers, lm.num_layers] for h in range(lm.num_heads)]
    assert pg.locator("text=Most similar pairs").count() == 1
    assert pg.locator("td", has_text="broken.png").count() == 1
    meta = json.loads(pg.locator("#survey-meta").inner_text())
    assert meta["model"] == "random:test_vit"
    assert_readable(pg, lm)
    pg.set_viewport_size({"width": 390, "height": 844})  # a phone: the names are left to the hover
    pg.wait_for_function("() => document.getElementById('fig-heads')._fullData[0].mode === 'markers'")
    ctx.close()
    assert outside == [] and errors == []


def boxes(pg, selector: str) -> list[dict]:
    return pg.eval_on_selector_all(
        selector,
        "els => els.filter(e => e.textContent.trim()).map(e => { const r = e.getBoundingClientRect();"
        " return {l: r.left, t: r.top, r: r.right, b: r.bottom, text: e.textContent}; })",
    )


def assert_readable(pg, lm) -> None:
    """What a reader sees (issue #30): ticks one per layer, upright; no label on another; titles whole."""
    L = lm.num_layers
    # The entropy chart: one group of boxes per layer, so at most L upright ticks on each x axis.
    ticks = pg.evaluate(
        r"""() => { const l = document.getElementById('fig-entropy')._fullLayout;
                   return Object.keys(l).filter(k => /^xaxis\d*$/.test(k))
                       .map(k => [l[k]._vals.length, l[k].tickangle]); }"""
    )
    assert ticks and all(n <= L and angle in (0, "auto", None) for n, angle in ticks), ticks
    assert {t["name"] for t in pg.evaluate("() => document.getElementById('fig-entropy')._fullData")} == {
        f"head {h}" for h in range(lm.num_heads)
    }
    rotated = pg.eval_on_selector_all(
        "#fig-entropy .xtick text",
        r"els => els.filter(e => /rotate\(-?[1-9]/.test(e.getAttribute('transform') || '')).length",
    )
    assert rotated == 0
    # The heads at a glance: a few names, on the points that stand apart, none on another.
    labels = boxes(pg, "#fig-heads .textpoint text")
    assert 0 < len(labels) <= 12, labels
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            assert a["r"] <= b["l"] or b["r"] <= a["l"] or a["b"] <= b["t"] or b["b"] <= a["t"], (a, b)
    # Every axis title lies whole inside its chart (the rank chart's y title was cut).
    for fig in pg.eval_on_selector_all(".plotly-graph-div", "els => els.map(e => e.id)"):
        frame = pg.eval_on_selector(f"#{fig}", "e => [e.getBoundingClientRect().top, e.getBoundingClientRect().bottom]")
        for t in boxes(pg, f"#{fig} .g-ytitle text, #{fig} .g-y2title text"):
            assert frame[0] - 0.5 <= t["t"] and t["b"] <= frame[1] + 0.5, (fig, t, frame)


def test_the_report_falls_back_to_cls_rows_without_the_similarity_column(tmp_path, report):
    page_path, _ = report
    html = build_report(page_path.parent / "s.parquet")
    assert "1 - JS/log 2" in html  # the survey above has the similarity column


# Each chart's table as the page has it: caption, column headers, {row header: cells}.
TABLE_JS = """id => {
    const fig = document.getElementById(id + '-figure');
    const det = fig.querySelector('details.chart-table');
    const t = det.querySelector('table');
    const rows = {};
    for (const tr of t.tBodies[0].rows) {
        const [th, ...tds] = tr.cells;
        rows[th.textContent] = {scope: th.tagName + ':' + th.scope, cells: tds.map(c => c.textContent)};
    }
    return {tag: fig.tagName, name: fig.getAttribute('aria-label'), summary: det.querySelector('summary').textContent,
            caption: t.caption ? t.caption.textContent : null,
            header: [...t.tHead.rows[0].cells].map(c => c.tagName + ':' + c.scope + ':' + c.textContent), rows};
}"""
# The chart's own numbers (Plotly's full data: typed arrays made plain).
TRACES_JS = """id => document.getElementById(id)._fullData.map(t => {
    const out = {};
    const list = v => v && typeof v === 'object' && 'length' in v;
    const keys = ['name', 'x', 'y', 'customdata', 'lowerfence', 'q1', 'median', 'q3', 'upperfence', 'mean', 'xaxis'];
    for (const k of keys) out[k] = list(t[k]) ? Array.from(t[k], e => (list(e) ? Array.from(e) : e)) : t[k];
    out.sd = t.error_y && t.error_y.array ? Array.from(t.error_y.array) : null;
    return out;
})"""


def test_every_chart_of_the_report_is_named_and_has_its_numbers_as_a_table(browser, report):
    """Screen readers: each chart a named figure with "Show as table" after it, a captioned table
    with column and row headers whose cells are the numbers the chart draws; the other tables
    captioned too."""
    page_path, lm = report
    L, H = lm.num_layers, lm.num_heads
    ctx = browser.new_context(viewport={"width": 1240, "height": 900}, offline=True)
    pg = ctx.new_page()
    pg.goto(page_path.as_uri())
    ids = ["fig-distance", "fig-entropy", "fig-mass", "fig-heads", "fig-rank"]
    pg.wait_for_function(
        "ids => ids.every(id => document.getElementById(id)?.querySelector('.main-svg'))", arg=ids, timeout=60_000
    )
    # The drawings' own text (tick labels, legends) is hidden from screen readers, the toolbar not.
    assert_drawings_hidden(pg, ", ".join(f"#{i}" for i in ids))
    tables = {i: pg.evaluate(TABLE_JS, i) for i in ids}
    traces = {i: pg.evaluate(TRACES_JS, i) for i in ids}
    for i, t in tables.items():
        assert t["tag"] == "FIGURE" and t["name"].endswith("(chart; “Show as table” below gives its numbers)"), t
        assert t["summary"] == "Show as table" and t["caption"] and t["caption"] in t["name"], t
        assert all(h.startswith("TH:col:") for h in t["header"]), t["header"]
        assert all(r["scope"] == "TH:row" for r in t["rows"].values()), i

    def cell(chart: str, row: str, col: str) -> str:
        t = tables[chart]
        return t["rows"][row]["cells"][[h.split(":", 2)[2] for h in t["header"]].index(col) - 1]

    # Distance: a row per layer, a column per head, "mean ± sd" as the dots and their bars.
    assert len(tables["fig-distance"]["rows"]) == L
    for tr in traces["fig-distance"]:
        for (lyr, _, _), y, sd in zip(tr["customdata"], tr["y"], tr["sd"], strict=True):
            assert cell("fig-distance", f"layer {int(lyr)}", tr["name"]) == f"{y:.1f} ± {sd:.1f}"
    # Entropy: a row per head, each box's five numbers and its mean, for all rows and the CLS row.
    assert len(tables["fig-entropy"]["rows"]) == L * H
    kinds = {"x": "all rows", "x2": "CLS row"}
    stats = ["5th percentile", "25th percentile", "median", "75th percentile", "95th percentile", "mean"]
    boxes = 0
    for tr in traces["fig-entropy"]:
        for k, lyr in enumerate(tr["x"]):
            row = f"layer {lyr} {tr['name']}"
            got = [cell("fig-entropy", row, f"{kinds[tr['xaxis']]}: {st}") for st in stats]
            want = [tr[f][k] for f in ("lowerfence", "q1", "median", "q3", "upperfence", "mean")]
            assert got == [f"{v:.3f}" for v in want], (row, got, want)
            boxes += 1
    assert boxes == 2 * L * H
    # Prefix mass: layer x head, and the mean over heads the line draws.
    for tr in traces["fig-mass"]:
        if tr["name"] == "mean over heads":
            for lyr, y in zip(tr["x"], tr["y"], strict=True):
                assert cell("fig-mass", f"layer {lyr}", "mean over heads") == f"{y:.3f}"
        else:
            for lyr, y in zip(tr["customdata"], tr["y"], strict=True):
                assert cell("fig-mass", f"layer {lyr}", tr["name"]) == f"{y:.3f}"
    # The heads at a glance: a row per head, its entropy and distance.
    (dots,) = traces["fig-heads"]
    assert len(tables["fig-heads"]["rows"]) == len(dots["customdata"]) == L * H
    for name, x, y in zip(dots["customdata"], dots["x"], dots["y"], strict=True):
        assert tables["fig-heads"]["rows"][name]["cells"][1:] == [f"{x:.3f}", f"{y:.1f}"]
    # Rank: a row per layer.
    eff, num = traces["fig-rank"]
    for lyr, e, sd, n in zip(eff["x"], eff["y"], eff["sd"], num["y"], strict=True):
        assert tables["fig-rank"]["rows"][f"layer {lyr}"]["cells"] == [f"{e:.2f}", f"{sd:.2f}", f"{n:.2f}"]
    # Every table of the page has a caption (the most similar pairs, the most specialised heads, failures).
    captions = pg.eval_on_selector_all("table", "ts => ts.map(t => t.caption ? t.caption.textContent : null)")
    assert None not in captions and len(captions) == len(ids) + 3, captions
    ctx.close()
