"""The interactive view (``att.widget()``, ``att.show()``, the rich display, ``att.to_html()``) on
the embedded model and a sample photo: the widget's binary traits hold the API's rows (any query,
any temperature), its ES module loads and draws in real Chromium through a minimal anywidget
host, and the standalone file opened from disk shows the overlay and takes a click on a patch as
the query. The first draw's time is printed (``-s``), never asserted."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import headscope
from headscope.python import view
from helpers.chromium import chromium
from helpers.view_host import click_cell, draw_widget, open_file, widget_values

SAMPLE = Path(__file__).resolve().parents[2] / "static" / "samples" / "cat.png"


@pytest.fixture(scope="module")
def scope():
    return headscope.load(device="cpu")


@pytest.fixture(scope="module")
def att(scope):
    return scope.attention(SAMPLE)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # Offline: nothing but the file itself, data: and blob: URLs may load.
    local = ("file:", "data:", "blob:")
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(local) else r.abort())
    yield pg
    context.close()
    assert errors == []


def _logp(w) -> np.ndarray:
    """The view's log-probabilities: the float16 ones less the row's largest, plus that largest."""
    rel = np.frombuffer(w.logp, dtype="<f2").reshape(w.shape).astype(np.float64)
    return rel + np.frombuffer(w.logp_max, dtype="<f4").reshape(w.shape[:3])[..., None]  # as the page: in float64


def _assert_rounded(view_logp: torch.Tensor, api: torch.Tensor, T: float = 1.0) -> None:
    """``softmax(view_logp / T)`` equals the API's rows within float16 rounding of the log-probabilities:
    half an ulp is at most 2^-11 |log p| per value (a row's renormalisation moves it by about as much)."""
    got = torch.log_softmax(view_logp / T, -1)
    want = api.log()
    bound = 2 * 2**-11 * view_logp.abs().amax(-1, keepdim=True) / T + 1e-5
    finite = want > -80
    assert torch.all((got - want).abs()[finite] <= bound.expand_as(got)[finite])


def test_widget_traits_hold_every_row_as_float16_bytes(scope, att):
    w = att.widget()
    L, H, N = len(att.layers), att.maps.shape[1], att.tokens["count"]
    assert w.shape == [L, H, N, N] and w.layers == att.layers
    assert isinstance(w.logp, bytes) and len(w.logp) == L * H * N * N * 2
    assert isinstance(w.logp_max, bytes) and len(w.logp_max) == L * H * N * 4
    assert w.image == att.display_png and w.tokens == att.tokens
    assert (w.layer, w.head, w.query, w.temperature) == (att.layers[-1], 0, 0, 1.0)
    logp = torch.from_numpy(_logp(w))
    # The CLS rows are the API's maps; another query's rows are the API's answer for that query.
    _assert_rounded(logp[:, :, 0], att.maps[:, :, 0])
    other = scope.attention(SAMPLE, query="patch:3,5")
    q = other.query[0]
    assert q == 1 + 3 * att.grid[1] + 5
    _assert_rounded(logp[:, :, q], other.maps[:, :, 0])
    # Any temperature from the same bytes: softmax(logp / T) is the API's answer at T.
    hot = scope.attention(SAMPLE, temperature=2.5)
    _assert_rounded(logp[:, :, 0], hot.maps[:, :, 0], T=2.5)
    # The rich display is the widget's.
    bundle = att._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data


def test_view_weights_keep_their_precision_near_the_rows_peak(att):
    """At T = 1 the view draws ``exp(log p - max + max)``: float16 rounds ``log(p / max p)``, so a
    weight is within ``2^-11 |log(p / max p)|`` of the API's, exact at the peak. Float16 ``log p``
    (what it shipped before) was off by up to ``2^-11 |log p|``, 0.2 % at the peak of a row over 385
    tokens: a near-uniform row's small differences drew as float16's steps."""
    w = att.widget()
    got = torch.from_numpy(_logp(w)).double().exp()  # L, H, N, N
    want = att.select(query="all").maps.double()
    L, H, N = len(att.layers), att.maps.shape[1], att.tokens["count"]
    assert want.shape == (L, H, N, N)
    log_ratio = (want / want.amax(-1, keepdim=True)).log().abs()
    bound = (want * (2**-11 * log_ratio * 1.01 + 1e-6)).nan_to_num(0.0)  # a weight of 0 (exp(-inf)) is 0
    assert torch.all((got - want).abs() <= bound)
    peak = want == want.amax(-1, keepdim=True)
    assert torch.allclose(got[peak], want[peak], rtol=1e-6, atol=0)


def test_widget_traits_refuse_what_the_view_cannot_draw(att):
    """A layer, head or query the view does not hold, a temperature of 0 or less, an opacity past 1:
    a TraitError that says what it holds (they were taken and drawn as nothing)."""
    import traitlets

    w = att.widget()
    L, H, N = len(att.layers), att.maps.shape[1], att.tokens["count"]
    missing = next(i for i in range(100) if i not in att.layers)
    for name, value, message in [
        ("layer", missing, f"layer {missing}: this view holds layers"),
        ("head", H, f"head {H}: {-H}..{H - 1}"),
        ("head", -H - 1, f"head {-H - 1}: {-H}..{H - 1}"),
        ("query", N, f"query {N}: {-N}..{N - 1}"),
        ("layer", -L - 1, f"layer {-L - 1}: this view holds layers"),
        ("temperature", 0.0, "above 0"),
        ("opacity", 1.5, "0..1"),
        ("head", True, "head True: an int"),  # t.Int takes a bool, which would travel as JSON true
        ("layer", True, "layer True: an int"),
        ("colormap", "jet", "colormap 'jet': the view draws viridis"),  # was drawn as viridis, silently
    ]:
        with pytest.raises(traitlets.TraitError, match=message):
            setattr(w, name, value)
    w.layer, w.head, w.query, w.temperature = att.layers[0], H - 1, N - 1, 0.5  # in range: taken
    assert (w.layer, w.head, w.query, w.temperature) == (att.layers[0], H - 1, N - 1, 0.5) and L >= 1
    # Negative counts from the end, as everywhere in the API: the last layer the view holds, the last head.
    w.layer, w.head, w.query = -1, -1, -2
    assert (w.layer, w.head, w.query) == (att.layers[-1], H - 1, N - 2)
    for cmap in view.VIEW_COLORMAPS:
        w.colormap = cmap


def test_the_views_colour_maps_are_the_front_ends():
    import re

    js = (Path(__file__).resolve().parents[2] / "static" / "js" / "colormaps.js").read_text()
    anchors = js.split("const ANCHORS = {", 1)[1].split("};", 1)[0]
    assert tuple(re.findall(r"^\s*(\w+):", anchors, re.M)) == view.VIEW_COLORMAPS


def test_figure_refuses_an_opacity_past_1_before_drawing(att, tmp_path):
    with pytest.raises(ValueError, match=r"opacity: between 0 and 1; got 2"):
        att.figure(path=tmp_path / "grid.svg", opacity=2)
    assert not (tmp_path / "grid.svg").exists()


def test_view_refuses_too_many_bytes_and_names_the_extra(att, monkeypatch):
    with pytest.raises(ValueError, match=r"MiB .*fewer layers"):
        att.widget(max_bytes=1000)
    view._widget_class.cache_clear()
    monkeypatch.setitem(sys.modules, "anywidget", None)  # as if it were not installed
    try:
        with pytest.raises(ImportError, match=r"pip install 'headscope\[notebook\]'"):
            att.show()
        text = att._repr_mimebundle_()["text/plain"]
        assert "headscope[notebook]" in text and att.image_id in text
    finally:
        view._widget_class.cache_clear()


@pytest.mark.browser
def test_widget_esm_draws_in_chromium(att, page, tmp_path):
    w = att.widget()
    assert set(widget_values(w)) >= {"logp", "image", "shape", "layers", "tokens", "layer", "head", "query"}
    ms = draw_widget(page, w, tmp_path)
    print(f"\nwidget first draw (render -> overlay): {ms} ms")
    assert page.text_content("[data-testid=hs-query]") == "cls"
    assert page.locator(".hs-tile").count() == att.maps.shape[1]
    R, C = att.grid
    click_cell(page, 1, 2, att.grid)
    assert page.text_content("[data-testid=hs-query]") == "patch:1,2"
    assert page.evaluate("window.saved.at(-1).query") == 1 + 1 * C + 2  # what the kernel would get
    page.locator(".hs-tile").nth(3).click()
    assert page.evaluate("window.saved.at(-1).head") == 3


def _pixels(page) -> list[int]:
    return page.evaluate(
        """() => { const c = document.querySelector("[data-testid=hs-overlay]");
        return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data); }"""
    )


def _picture_difference(page) -> float:
    """Mean absolute difference between the drawn overlay and the bare picture at its size."""
    return page.evaluate(
        """async () => {
        const c = document.querySelector("[data-testid=hs-overlay]");
        const bare = document.createElement("canvas");
        bare.width = c.width; bare.height = c.height;
        const state = JSON.parse(document.getElementById("headscope-state").textContent);
        const blob = await (await fetch("data:image/png;base64," + state.values.image)).blob();
        const bmp = await createImageBitmap(blob);
        const ctx = bare.getContext("2d");
        ctx.imageSmoothingQuality = "high";
        ctx.drawImage(bmp, 0, 0, c.width, c.height);
        const a = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        const b = ctx.getImageData(0, 0, c.width, c.height).data;
        let d = 0;
        for (let i = 0; i < a.length; i += 4) {
          for (let k = 0; k < 3; k++) d += Math.abs(a[i + k] - b[i + k]);
        }
        return d / (3 * a.length / 4);
        }"""
    )


@pytest.mark.browser
@pytest.mark.heavy
def test_standalone_html_opens_offline_and_a_click_changes_the_query(att, page, tmp_path):
    path = att.to_html(tmp_path / "view.html")
    size = path.stat().st_size
    after_render, after_start = open_file(page, path)
    print(
        f"\nto_html: {size / 1e6:.1f} MB; first draw {after_render} ms after render(), "
        f"{after_start} ms after the file began to load"
    )
    assert page.text_content("[data-testid=hs-query]") == "cls"
    assert page.text_content("[data-testid=hs-caption]") == f"{att.model} · {SAMPLE.name}"
    # The overlay is drawn over the picture: colour-mapped attention, not the bare photo.
    assert _picture_difference(page) > 10
    before = _pixels(page)
    R, C = att.grid
    click_cell(page, 7, 5, att.grid)
    assert page.text_content("[data-testid=hs-query]") == "patch:7,5"
    after = _pixels(page)
    assert len(after) == len(before) and after != before
    # The legend's maximum is the patch maximum of that row (layer 11, head 0) at the temperature.
    w = att.widget()
    q = 1 + 7 * C + 5
    row = torch.softmax(torch.from_numpy(_logp(w))[-1, 0, q] / 1.0, -1)[1:]
    shown = float(page.text_content("[data-testid=hs-legend-max]"))
    assert shown == pytest.approx(float(row.max()), rel=5e-3, abs=6e-4)
    # The temperature slider re-tempers the rows in the page (log scale: 10^0.4 = 2.51).
    page.locator("[data-testid=hs-temperature]").fill("0.4")
    assert page.text_content("[data-testid=hs-temperature-value]") == "2.51"
    hot = torch.softmax(torch.from_numpy(_logp(w))[-1, 0, q] / 2.51, -1)[1:]
    shown = float(page.text_content("[data-testid=hs-legend-max]"))
    assert shown == pytest.approx(float(hot.max()), rel=5e-3, abs=6e-4)


@pytest.mark.heavy
def test_notebook_kernel_displays_the_widget_with_binary_buffers(tmp_path):
    """In a real ipykernel (through nbclient): ``att`` as a cell's last line and ``att.show()`` give
    the widget's view, and its state reaches the front end with ``logp``, ``logp_max`` and ``image`` as binary
    buffers (base64 in the saved notebook), the rest as JSON."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    load = f"import headscope\nscope = headscope.load(device='cpu')\natt = scope.attention({str(SAMPLE)!r}, layers=-1)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in (load, "att", "att.show()")])
    where = {"metadata": {"path": str(tmp_path)}}
    run = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources=where)
    run.execute()
    views = []
    for cell in nb.cells[1:]:
        (out,) = [o for o in cell.outputs if o.output_type == "display_data" or o.output_type == "execute_result"]
        views.append(out.data["application/vnd.jupyter.widget-view+json"]["model_id"])
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    for model_id in views:
        widget = state[model_id]
        assert widget["model_name"] == "AnyModel"
        values = widget["state"]
        assert values["shape"][:2] == [1, 6] and values["layers"] == [11] and values["model_name"] == "dinov2-s14-focus"
        buffers = {tuple(b["path"]): base64.b64decode(b["data"]) for b in widget["buffers"]}
        assert set(buffers) == {("logp",), ("logp_max",), ("image",)}
        assert len(buffers[("logp",)]) == int(np.prod(values["shape"])) * 2
        assert len(buffers[("logp_max",)]) == int(np.prod(values["shape"][:3])) * 4
        assert buffers[("image",)].startswith(b"\x89PNG")


@pytest.mark.browser
def test_swin_view_covers_one_stage(page, tmp_path):
    """A windowed model: the view of one stage's layers (its grid, rows zero outside the query's
    window), every layer refused with the way out; a click picks the stage grid's cell."""
    swin = headscope.load("random:swin_tiny_patch4_window7_224", device="cpu", models_dir=tmp_path / "models")
    with pytest.raises(ValueError, match="one stage"):
        swin.attention(SAMPLE, query="patch:0,0").to_html(tmp_path / "all.html")
    att = swin.attention(SAMPLE, layers="-2,-1", query="patch:0,0")
    w = att.widget()
    logp = _logp(w)
    N = att.tokens["count"]
    assert w.shape == [2, att.maps.shape[1], N, N] and att.tokens["window"]
    _assert_rounded(torch.from_numpy(logp[:, :, 0]), att.maps[:, :, 0])
    open_file(page, att.to_html(tmp_path / "swin.html"))
    assert page.text_content("[data-testid=hs-query]") == "patch:0,0"
    R, C = att.grid
    click_cell(page, R - 1, C - 1, att.grid)
    assert page.text_content("[data-testid=hs-query]") == f"patch:{R - 1},{C - 1}"

    # The last stage's 7 x 11 cells in 7 x 7 windows: the second window is padded, its padding keys
    # hold part of each row's softmax. The view draws the weights themselves (it renormalised them
    # over the N tokens: 1.6x too large, found by a reviewer) and offers T = 1 only.
    import traitlets

    assert (R, C) == (7, 11)
    padded = swin.attention(SAMPLE, layers="-1", heads="0", query=f"patch:3,{C - 1}")
    row = padded.maps[0, 0, 0].double()
    assert row.sum() < 0.95
    w = padded.widget()
    assert w.complete is False and w.temperature == 1.0
    with pytest.raises(traitlets.TraitError, match="T = 1 only"):
        w.temperature = 2.0
    stage2 = swin.attention(SAMPLE, layers="4", query="patch:0,0")  # 14 x 21 cells: whole windows
    assert stage2.grid == (14, 21) and stage2.widget().complete is True
    open_file(page, padded.to_html(tmp_path / "padded.html"))
    shown = float(page.text_content("[data-testid=hs-legend-max]"))
    assert shown == pytest.approx(float(row.max()), rel=2e-2), (shown, float(row.max()))  # 2 digits shown
    assert page.is_disabled("[data-testid=hs-temperature]")
