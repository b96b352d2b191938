"""A finger and a zoomed window (a reviewer's findings), in real Chromium against a real server.

- A tap on the map (and on "Inside a head"'s maps) shows the numbers a hover shows, and keeps them.
- At 320 CSS px (a 1280 x 800 window at 400 % zoom) nothing scrolls sideways: "Inside a head",
  the Ablation view and the survey report.
- In a window that short the layer/head/query dock is in the page, not fixed over half of it;
  phones keep it fixed under the thumb.
- After an upload at 200 % zoom the whole map is in view above the dock (its top at 400 %).
- On a phone the report's chart toolbar covers no chart's title.

Every page of the server comes from the guarded fixtures of tests/browser/conftest.py.
"""

from __future__ import annotations

import pytest
from test_screens import assert_no_sideways_scroll

from helpers.learn import wait_learn
from helpers.page import OVERLAY, image_id, open_page, upload, wait_output, wait_scroll_settled, wait_view

pytestmark = pytest.mark.browser

SLOW_MS = 180_000
TOUCH = {"is_mobile": True, "has_touch": True, "device_scale_factor": 3}
ZOOM200 = (640, 400, {"device_scale_factor": 2})  # a 1280 x 800 window at 200 %
ZOOM400 = (320, 200, {"device_scale_factor": 4})  # ... at 400 %
CAT_GRID = (16, 24)


def rect(pg, selector: str) -> dict:
    return pg.eval_on_selector(
        selector,
        "e => { const r = e.getBoundingClientRect();"
        " return {l: r.left, t: r.top, r: r.right, b: r.bottom, w: r.width, h: r.height}; }",
    )


def cell_point(pg, selector: str, r: int, c: int, grid: tuple[int, int]) -> tuple[float, float]:
    """The centre of cell (r, c) of a canvas showing ``grid`` patches, in window coordinates."""
    b = rect(pg, selector)
    return b["l"] + (c + 0.5) * b["w"] / grid[1], b["t"] + (r + 0.5) * b["h"] / grid[0]


def readout(pg) -> str:
    return pg.inner_text("[data-testid=readout]")


def dock_state(pg) -> dict:
    return pg.evaluate(
        """() => { const d = document.querySelector('[data-testid=view-dock]'); const r = d.getBoundingClientRect();
        return {position: getComputedStyle(d).position, t: r.top, b: r.bottom, h: r.height, ih: innerHeight}; }"""
    )


def room_below(pg) -> float:
    """Where the window's free room ends: the top of the fixed dock, else the window's bottom."""
    d = dock_state(pg)
    return d["t"] if d["position"] == "fixed" else d["ih"]


# ------------------------------------------------------------------ a tap shows the numbers
def test_a_tap_on_the_maps_shows_the_numbers_a_hover_shows_and_keeps_them(page_at, base_url, samples):
    pg = page_at(390, 844, **TOUCH)
    open_page(pg, base_url)
    upload(pg, samples["cat"])
    wait_scroll_settled(pg)
    x, y = cell_point(pg, OVERLAY, 8, 12, CAT_GRID)
    pg.touchscreen.tap(x, y)  # pointerdown, pointerup, pointerleave, click: all touch
    # The tap's words at once, before the patch's own row is in ...
    pg.wait_for_function(
        "() => document.querySelector('[data-testid=readout]').textContent.startsWith('patch (8, 12) · token 205 · ')",
        timeout=10_000,
    )
    # ... and kept once it is (the finger's pointerleave does not clear them), with its numbers.
    wait_view(pg, query="patch:8,12")
    pg.wait_for_timeout(300)
    tapped = readout(pg)
    assert tapped.startswith("patch (8, 12) · token 205 · ") and not tapped.endswith("…"), tapped
    # The very words a mouse hovering that patch gets; a mouse that leaves still clears them.
    x, y = cell_point(pg, OVERLAY, 8, 12, CAT_GRID)  # the title above the map may have grown a line
    pg.mouse.move(x, y)
    assert readout(pg) == tapped
    pg.mouse.move(x, rect(pg, OVERLAY)["b"] + 30)
    assert readout(pg) == ""

    # Inside a head: a tap on the softmax map shows that key's numbers, and they stay.
    pg.tap("[data-testid=learn-tab]")
    wait_learn(pg, query="205")
    pg.locator("[data-testid=learn-weights]").scroll_into_view_if_needed()
    wait_scroll_settled(pg)
    x, y = cell_point(pg, "[data-testid=learn-weights]", 3, 5, CAT_GRID)
    pg.touchscreen.tap(x, y)
    token = str(1 + 3 * 24 + 5)
    pg.wait_for_function(
        "t => document.querySelector('[data-testid=learn-hover]').dataset.token === t", arg=token, timeout=10_000
    )
    wait_learn(pg, query=token)  # the tap is also a click: it queries that patch
    pg.wait_for_timeout(300)
    hover = pg.eval_on_selector("[data-testid=learn-hover]", "e => [e.dataset.token, e.textContent]")
    assert hover[0] == token and hover[1].startswith("key patch (3, 5)") and "weight" in hover[1], hover
    # A tap on the CLS token's chip shows its numbers too, and they stay.
    chip = pg.locator("#learn-prefix li[data-token='0']")
    chip.scroll_into_view_if_needed()
    wait_scroll_settled(pg)
    chip.tap()
    pg.wait_for_function("() => document.querySelector('[data-testid=learn-hover]').dataset.token === '0'")
    pg.wait_for_timeout(300)
    assert pg.eval_on_selector("[data-testid=learn-hover]", "e => e.dataset.token") == "0"


# ------------------------------------------------------------------ 320 CSS px: nothing sideways
def test_inside_a_head_fits_a_window_at_400_percent(page_at, base_url, samples):
    width, height, options = ZOOM400
    pg = page_at(width, height, **options)
    open_page(pg, base_url, "?view=learn")
    upload(pg, samples["rocket"])
    wait_learn(pg, image=image_id(samples["rocket"].read_bytes()))
    pg.wait_for_timeout(300)
    assert_no_sideways_scroll(pg, "Inside a head at 400 %")
    for sel in ("#learn-scores", "#learn-weights", "#temperature", "#temperature-reset"):
        b = rect(pg, sel)
        assert b["w"] > 0 and b["l"] >= -0.5 and b["r"] <= width + 0.5, (sel, b)
    # The maps keep their picture's aspect ratio when they shrink.
    for sel in ("#learn-scores", "#learn-weights"):
        b, (cw, ch) = rect(pg, sel), pg.eval_on_selector(sel, "c => [c.width, c.height]")
        assert abs(b["w"] / b["h"] - cw / ch) < 0.03, (sel, b, cw, ch)


def test_the_ablation_view_fits_a_window_at_400_percent(page_at, base_url, samples):
    width, height, options = ZOOM400
    pg = page_at(width, height, **options)
    open_page(pg, base_url, "?view=ablation")
    upload(pg, samples["rocket"])
    wait_output(pg, "")
    pg.wait_for_timeout(300)
    assert_no_sideways_scroll(pg, "Ablation at 400 %")
    for sel in ("#importance-method", "#importance-run"):
        b = rect(pg, sel)
        assert b["w"] > 0 and b["l"] >= -0.5 and b["r"] <= width + 0.5, (sel, b)


# ------------------------------------------------------------------ the dock in a short window
def test_a_short_window_keeps_the_dock_in_the_page_and_a_phone_keeps_it_fixed(page_at, base_url, samples):
    width, height, options = ZOOM400
    pg = page_at(width, height, **options)
    open_page(pg, base_url)
    upload(pg, samples["cat"])
    d = dock_state(pg)
    assert d["position"] != "fixed" or d["h"] <= d["ih"] / 4, d
    # The footer is not pushed far below by room kept for a dock that is not fixed.
    gap = pg.evaluate(
        "() => document.documentElement.scrollHeight - document.querySelector('.footer').getBoundingClientRect().bottom"
        " - scrollY"
    )
    assert gap < 60, gap

    phone = page_at(375, 667, **TOUCH)
    open_page(phone, base_url)
    upload(phone, samples["cat"])
    d = dock_state(phone)
    assert d["position"] == "fixed" and d["b"] >= d["ih"] - 1, d


# ------------------------------------------------------------------ the map in view after an upload
def map_after_upload(page_at, base_url, samples, zoom):
    """The cat uploaded at a zoom (``ZOOM200``, ``ZOOM400``), the page at rest: the page, the map's
    box and the room above the dock."""
    width, height, options = zoom
    pg = page_at(width, height, **options)
    open_page(pg, base_url)
    upload(pg, samples["cat"])
    wait_scroll_settled(pg)
    return pg, rect(pg, OVERLAY), room_below(pg)


def test_after_an_upload_at_200_percent_the_whole_map_is_in_view_above_the_dock(page_at, base_url, samples):
    pg, m, below = map_after_upload(page_at, base_url, samples, ZOOM200)
    assert m["h"] <= below, (m, below)  # it fits: then all of it shows
    assert m["t"] >= -0.5 and m["b"] <= below + 0.5, (m, below, dock_state(pg))

    # At 400 % it cannot fit beside anything: its top is in view.
    _, m, below = map_after_upload(page_at, base_url, samples, ZOOM400)
    assert -0.5 <= m["t"] < below - 40, (m, below)


# ------------------------------------------------------------------ the survey report
CHARTS = ["fig-distance", "fig-entropy", "fig-mass", "fig-heads", "fig-rank"]


def open_report(browser, path, width: int, height: int, **options):
    ctx = browser.new_context(viewport={"width": width, "height": height}, offline=True, **options)
    pg = ctx.new_page()
    pg.goto(path.as_uri())
    pg.wait_for_function(
        "ids => ids.every(id => document.getElementById(id)?.querySelector('.main-svg'))", arg=CHARTS, timeout=60_000
    )
    pg.wait_for_timeout(300)
    return ctx, pg


def test_the_report_fits_a_window_at_400_percent(browser, report):
    width, height, options = ZOOM400
    ctx, pg = open_report(browser, report[0], width, height, **options)
    try:
        assert_no_sideways_scroll(pg, "the report at 400 %")
        # The head tables scroll on their own, as the charts' tables do: named regions a key reaches.
        for caption in ("Most similar pairs", "Most specialised heads"):
            region = pg.evaluate(
                """c => { const t = [...document.querySelectorAll('table')].find(t => t.caption?.textContent === c);
                const r = t && t.closest('.table-scroll');
                return r && [r.getAttribute('role'), r.getAttribute('aria-label'), r.tabIndex]; }""",
                caption,
            )
            assert region and region[0] == "region" and caption in region[1] and region[2] == 0, (caption, region)
    finally:
        ctx.close()


def test_the_report_toolbar_covers_no_chart_title_on_a_phone(browser, report):
    ctx, pg = open_report(browser, report[0], 390, 844, **TOUCH)
    try:
        for fig in CHARTS:
            pg.locator(f"#{fig}").scroll_into_view_if_needed()
            b = rect(pg, f"#{fig}")
            pg.mouse.move(b["l"] + b["w"] * 0.6, b["t"] + b["h"] * 0.5)  # what shows the toolbar
            pg.wait_for_timeout(100)
            clashes = pg.eval_on_selector(
                f"#{fig}",
                """el => {
                const bar = el.querySelector('.modebar');
                if (!bar || getComputedStyle(bar).display === 'none') return [];
                const b = bar.getBoundingClientRect();
                if (!b.width || !b.height) return [];
                return [...el.querySelectorAll('.annotation-text, .gtitle, .legendtext')].filter(t => {
                    const r = t.getBoundingClientRect();
                    return b.left < r.right && r.left < b.right && b.top < r.bottom && r.top < b.bottom;
                }).map(t => t.textContent); }""",
            )
            assert clashes == [], (fig, clashes)
    finally:
        ctx.close()
