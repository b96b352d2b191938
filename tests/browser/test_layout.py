"""Where things are on the screen (issue #30: "the map is below the fold", "the page's rough
edges"), measured in real Chromium against a real server.

Desktop (1280x800, 1440x900): after an upload the whole map, its colour bar and the layer, head
and query controls are in the window without scrolling, for a wide and for a tall picture.
Phone (390x844): the map comes into view and the layer and head controls sit at the bottom of the
screen, under the thumb, while the map is in view (and while the page scrolls on to the charts).
Plotly's toolbar never covers a legend or a heat map's top row; the model view shows every head
inside its panel; the compare image menu shows its whole label.
"""

from __future__ import annotations

import io

import pytest
from PIL import Image
from test_page import ARTIFACTS, OVERLAY, image_id, open_page, upload, wait_scroll_settled, wait_view

from helpers.charts import show_chart
from helpers.screens import sizes

pytestmark = pytest.mark.browser

DESKTOPS = [(1280, 800), (1440, 900)]
PHONE = (390, 844)
SLOW_MS = 180_000
CONTROLS = ("layer", "head", "query-mode")


def tall_png() -> bytes:
    """A portrait picture (300 x 640): its map is as tall as the window allows."""
    img = Image.new("RGB", (300, 640), (40, 90, 160))
    for y in range(0, 640, 40):
        for x in range(0, 300, 30):
            img.putpixel((x, y), (250, 240, 20))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def rect(pg, selector: str) -> dict:
    return pg.eval_on_selector(
        selector,
        "e => { const r = e.getBoundingClientRect();"
        " return {l: r.left, t: r.top, r: r.right, b: r.bottom, w: r.width, h: r.height}; }",
    )


def window(pg) -> dict:
    return pg.evaluate("() => ({w: innerWidth, h: innerHeight, y: scrollY})")


def assert_inside(r: dict, win: dict, what: str, bottom: float | None = None) -> None:
    """``r`` lies wholly in the window (above ``bottom`` when given)."""
    limit = win["h"] if bottom is None else bottom
    assert r["w"] > 0 and r["h"] > 0, (what, r)
    assert r["l"] >= -0.5 and r["r"] <= win["w"] + 0.5, (what, r, win)
    assert r["t"] >= -0.5 and r["b"] <= limit + 0.5, (what, r, win, limit)


def overlaps(a: dict, b: dict) -> bool:
    return a["l"] < b["r"] - 0.5 and b["l"] < a["r"] - 0.5 and a["t"] < b["b"] - 0.5 and b["t"] < a["b"] - 0.5


# ------------------------------------------------------------------ desktop: above the fold
@pytest.mark.parametrize("width,height", sizes(DESKTOPS, [f"{w}x{h}" for w, h in DESKTOPS]))
def test_desktop_map_colour_bar_and_controls_in_the_window_after_upload(page_at, base_url, samples, width, height):
    pg = page_at(width, height)
    open_page(pg, base_url)
    for name, upload_it in (
        ("cat", lambda: upload(pg, samples["cat"])),
        ("tall", lambda: upload_bytes(pg, "tall.png", tall_png())),
    ):
        v = upload_it()
        pg.wait_for_timeout(300)  # a late relayout (fonts, the colour bar) would show here
        win = window(pg)
        assert win["y"] == 0, (name, "the page scrolled", win)
        bar = rect(pg, "[data-testid=colorbar]")
        assert_inside(rect(pg, OVERLAY), win, f"{name}: map")
        assert_inside(bar, win, f"{name}: colour bar")
        for testid in CONTROLS:
            assert_inside(rect(pg, f"[data-testid={testid}]"), win, f"{name}: {testid}")
        # The map uses the room it has: as wide as the viewer, or as tall as the window allows.
        m, viewer = rect(pg, OVERLAY), rect(pg, "#viewer")
        assert m["w"] >= viewer["w"] - 2 or m["b"] >= win["h"] - 120, (name, m, viewer, win)
        assert v["pending"] == "0"
    shot(pg, f"layout-{width}x{height}.png")


def upload_bytes(pg, name: str, data: bytes) -> dict:
    pg.set_input_files("[data-testid=image-input]", files=[{"name": name, "mimeType": "image/png", "buffer": data}])
    return wait_view(pg, image=image_id(data))


def shot(pg, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / name))


# ------------------------------------------------------------------ phone: the controls under the thumb
def test_phone_layer_and_head_controls_sit_under_the_thumb_while_the_map_is_in_view(page_at, base_url, samples):
    pg = page_at(*PHONE)
    open_page(pg, base_url)
    upload(pg, samples["cat"])
    wait_scroll_settled(pg)
    win = window(pg)
    dock = rect(pg, "[data-testid=view-dock]")
    # The dock is at the bottom of the screen, where the thumb is ...
    assert dock["b"] >= win["h"] - 1 and dock["t"] >= win["h"] * 0.75, (dock, win)
    for testid in ("layer", "head"):
        r = rect(pg, f"[data-testid={testid}]")
        assert_inside(r, win, testid)
        assert r["t"] >= win["h"] * 0.75, (testid, r, win)
    # ... and the whole map and its colour bar are in view above it, not under it.
    assert_inside(rect(pg, OVERLAY), win, "map", bottom=dock["t"])
    assert_inside(rect(pg, "[data-testid=colorbar]"), win, "colour bar", bottom=dock["t"])
    shot(pg, "layout-390x844.png")

    # The layer slider and the head menu work from there, with the map in view.
    pg.fill("[data-testid=layer]", "4")
    pg.select_option("[data-testid=head]", "3")
    wait_view(pg, layer="4", head="3")
    assert_inside(rect(pg, OVERLAY), window(pg), "map after a change", bottom=dock["t"])

    # Scrolling on (heads at a glance, the charts) keeps the controls under the thumb.
    pg.locator("[data-testid=head-grid]").scroll_into_view_if_needed()
    wait_scroll_settled(pg)
    for testid in ("layer", "head"):
        assert_inside(rect(pg, f"[data-testid={testid}]"), window(pg), f"{testid} after scrolling")
    # Nothing of the page hides under the dock at its end: the footer scrolls clear of it.
    pg.evaluate("() => window.scrollTo(0, document.documentElement.scrollHeight)")
    wait_scroll_settled(pg)
    assert rect(pg, ".footer")["b"] <= rect(pg, "[data-testid=view-dock]")["t"] + 0.5

    # The Ablation view has no use for them: there the dock is back in the page.
    pg.click("[data-testid=ablation-tab]")
    assert pg.eval_on_selector("[data-testid=view-dock]", "e => getComputedStyle(e).position") == "static"
    pg.wait_for_selector("[data-testid=model-output][data-state=ready]", timeout=SLOW_MS)  # no request left open


# ------------------------------------------------------------------ Plotly's toolbar
CHARTS = [
    "chart-entropy",
    "chart-prefix",
    "distance-heatmap",
    "distance-scatter",
    "similarity-matrix",
    "rank-chart",
    "chart-row",
]


def toolbar_clashes(pg, testid: str) -> list:
    """What Plotly's toolbar of a chart covers: its legend, or the top row of its heat map."""
    return pg.eval_on_selector(
        f"[data-testid={testid}]",
        """el => {
            const bar = el.querySelector('.modebar');
            if (!bar || getComputedStyle(bar).display === 'none') return [];
            const b = bar.getBoundingClientRect();
            if (!b.width || !b.height) return [];
            const hit = (r) => b.left < r.right && r.left < b.right && b.top < r.bottom && r.top < b.bottom;
            const out = [];
            for (const g of el.querySelectorAll('.legend')) if (hit(g.getBoundingClientRect())) out.push('legend');
            const hm = el.querySelector('.hm image, .hm');
            const plot = el.querySelector('.nsewdrag');
            if (hm && plot) {
                const p = plot.getBoundingClientRect();
                const rows = (el._fullData && el._fullData[0] && el._fullData[0].z) ? el._fullData[0].z.length : 1;
                const top = {left: p.left, right: p.right, top: p.top, bottom: p.top + p.height / rows};
                if (hit(top)) out.push('top row');
            }
            return out;
        }""",
    )


@pytest.mark.parametrize("width,height", sizes([DESKTOPS[0], PHONE], ["1280x800", "390x844"]))
def test_plotly_toolbar_covers_no_legend_and_no_top_row(page_at, base_url, samples, width, height):
    pg = page_at(width, height)
    open_page(pg, base_url)
    upload(pg, samples["cat"])
    pg.wait_for_selector("[data-testid=analytics][data-state=ready]", timeout=SLOW_MS)
    for testid in CHARTS:
        show_chart(pg, testid, timeout=SLOW_MS)
        chart = pg.locator(f"[data-testid={testid}]")
        box = chart.bounding_box()
        # The pointer on the chart (a tap on a phone) is what shows the toolbar.
        pg.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
        pg.wait_for_timeout(150)
        assert toolbar_clashes(pg, testid) == [], testid
    if width < 640:  # phones get no toolbar at all
        assert pg.locator(".modebar:visible").count() == 0


# ------------------------------------------------------------------ the model view on a phone
def test_phone_model_view_shows_every_head_inside_its_panel(page_at, base_url, samples):
    pg = page_at(*PHONE)
    open_page(pg, base_url)
    upload(pg, samples["cat"])
    pg.wait_for_function("() => document.querySelectorAll('[data-testid=model-view] .tile').length === 12 * 9")
    pg.locator("[data-testid=model-view]").scroll_into_view_if_needed()
    # laid out: the view is redrawn once the rollout is in (on a loaded machine, after the count above)
    pg.wait_for_function(
        """() => [...document.querySelectorAll("[data-testid=model-view] .tile[data-layer='11']")]
            .every((t) => t.getBoundingClientRect().width > 0)"""
    )
    panel = rect(pg, "[data-testid=model-panel]")
    grid = pg.eval_on_selector("[data-testid=model-view]", "e => [e.scrollWidth, e.clientWidth]")
    assert grid[0] <= grid[1], f"the model view scrolls sideways: {grid}"
    for head in ("0", "4", "5", "mean", "max", "rollout"):
        tile = rect(pg, f"[data-testid=model-view] .tile[data-layer='11'][data-head='{head}']")
        assert tile["l"] >= panel["l"] and tile["r"] <= panel["r"], (head, tile, panel)
        assert tile["w"] >= 20, (head, tile)
    # A thumbnail still opens its map.
    pg.click("[data-testid=model-view] .tile[data-layer='5'][data-head='max']")
    wait_view(pg, layer="5", head="max")


# ------------------------------------------------------------------ the compare image menu
def test_compare_image_menu_shows_the_whole_label(page, base_url, samples, tmp_path):
    long = tmp_path / "a_rather_long_holiday_picture_name_2024.png"
    long.write_bytes(samples["coffee"].read_bytes())
    open_page(page, base_url)
    upload(page, long)
    page.check("[data-testid=compare-toggle]")
    page.wait_for_selector("[data-testid=compare]", state="visible")
    for side in ("a", "b"):
        sel = f"[data-testid=compare-{side}-image]"
        label = page.eval_on_selector(sel, "s => s.options[s.selectedIndex].textContent")
        assert label.endswith("(shown)") and "…" in label, label
        fits = page.eval_on_selector(
            sel,
            """s => { const c = document.createElement('canvas').getContext('2d');
                      const cs = getComputedStyle(s); c.font = `${cs.fontSize} ${cs.fontFamily}`;
                      const text = c.measureText(s.options[s.selectedIndex].textContent).width;
                      const room = s.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 16;
                      return [text, room]; }""",
        )
        assert fits[0] <= fits[1], (side, label, fits)
