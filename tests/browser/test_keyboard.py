"""Every view without a mouse (#43), in real Chromium against the real server: keys only
(page.keyboard.press; a picture comes in through the file input, as a keyboard user picks it), at
1280x800 and at 200 % zoom (640x400 CSS pixels at scale 2), and on a phone for the fixed bars.

- focus never hides under the fixed layer/head dock or the sticky top bar (scroll-padding);
- the view tabs follow the WAI-ARIA tabs pattern: the arrows move along the tabs, not the head;
- the attention map (and the softmax map of "Inside a head") takes focus: a cell cursor on the
  arrows, Enter queries that patch;
- the tile grids and the ablation toggles are one Tab stop each, with the arrows inside, and a
  toggle is named "layer L, head H, on/off";
- Plotly's toolbar shows a visible focus ring, and each chart has a "Show as table" twin.

The Why view (its box and the faithfulness test) is in test_keyboard_why.py, the model picker in
test_keyboard_picker.py, axe-core's check of every view in test_axe.py.
"""

from __future__ import annotations

import re

import pytest

from helpers.charts import assert_drawings_hidden, show_chart, wait_plotted
from helpers.keyboard import FOCUS_BOX, SCREENS, focus_in, focused, hidden_by_bars, tab_to
from helpers.learn import wait_learn
from helpers.page import image_id, open_page, upload, view, wait_output, wait_scroll_settled, wait_view
from helpers.screens import sizes

pytestmark = pytest.mark.browser


@pytest.fixture(params=sizes(["1280x800", "zoom200"]))
def kpage(request, page_at):
    """A guarded page at 1280x800, then at 200 % zoom."""
    width, height, options = SCREENS[request.param]
    return page_at(width, height, **options)


def press(page, key: str, times: int = 1) -> None:
    for _ in range(times):
        page.keyboard.press(key)


def announced(page) -> str:
    """What the page's live region says (a move's words arrive a frame after the key)."""
    page.wait_for_function("() => document.querySelector('[data-testid=announce]').textContent !== ''")
    return page.inner_text("[data-testid=announce]")


def said(page, words: str) -> None:
    """Wait until the page's live region says ``words``."""
    page.wait_for_function("w => document.querySelector('[data-testid=announce]').textContent === w", arg=words)


def walk_focus(page, most: int = 200) -> list[str]:
    """Tab once round the page from the top; at each stop the focused element must be clear of the
    fixed bars. Returns the stops' names.

    Focus scrolls at once (the page sets no CSS smooth scrolling); with reduced motion asked for,
    so do the page's own scrolls, and a stop need not wait out a smooth scroll (150 ms a stop)."""
    page.emulate_media(reduced_motion="reduce")
    page.evaluate("() => { document.activeElement.blur(); window.scrollTo(0, 0); }")
    stops: list[str] = []
    hidden = []
    for _ in range(most):
        page.keyboard.press("Tab")
        wait_scroll_settled(page, quiet_ms=0)
        f = focused(page)
        if f["tag"] == "BODY":
            break
        stops.append(f["testid"] or f["id"] or f["tag"])
        bad = hidden_by_bars(page)
        if bad:
            hidden.append(bad)
    assert not hidden, f"{len(hidden)} of {len(stops)} Tab stops hidden by a fixed bar: {hidden[:5]}"
    return stops


@pytest.mark.timeout(600)
@pytest.mark.parametrize("screen", sizes(["zoom200", "phone"]))
def test_focus_never_hides_under_the_fixed_bars(page_at, base_url, samples, screen):
    width, height, options = SCREENS[screen]
    page = page_at(width, height, **options)
    open_page(page, base_url)
    upload(page, samples["cat"])
    page.wait_for_function("() => document.querySelectorAll('[data-testid=model-view] .tile').length === 12 * 9")
    assert page.evaluate("() => getComputedStyle(document.querySelector('#view-dock')).position") == "fixed"
    stops = walk_focus(page)
    # The map view's stops: the 108 model-view tiles and the heads at a glance are one stop each.
    assert len(stops) < 120, stops
    assert "overlay" in stops and "download-png" in stops and "compare-toggle" in stops
    # Inside a head: the same (its temperature slider among the stops).
    open_page(page, base_url, "?view=learn")
    upload(page, samples["cat"])
    wait_learn(page, image=image_id(samples["cat"].read_bytes()))
    stops = walk_focus(page)
    assert "learn-tab" in stops and "temperature" in stops, " ".join(stops)


def test_the_page_scrolls_at_once_for_a_user_who_asked_for_reduced_motion(page_at, base_url, samples):
    """A tile of the model view scrolls the map into view: smoothly, or at once where the system
    asks for reduced motion (WCAG 2.3.3): the scroll is then done when the click's handler returns."""
    page = page_at(640, 400)
    open_page(page, base_url)
    upload(page, samples["cat"])
    page.wait_for_function("() => document.querySelectorAll('[data-testid=model-view] .tile').length === 12 * 9")
    # Plotly arrives after the page is up and its charts change the layout (a chart out of sight
    # keeps its drawing's height, data-rendered="waiting"), which redraws the tiles: the clicks
    # below wait for it, so that they land on tiles in the page.
    wait_plotted(page, "chart-row")
    # the scroll offset when the click's handler has returned, and once it has rested 300 ms
    click_last_tile = """async () => {
        const frame = () => new Promise((r) => requestAnimationFrame(r));
        const last = () => [...document.querySelectorAll('[data-testid=model-view] .tile')].at(-1);
        last().scrollIntoView({block: 'end'});
        await frame();
        last().click();
        const atOnce = scrollY;
        let y = scrollY, since = performance.now();
        while (performance.now() - since < 300) {
            await frame();
            if (scrollY !== y) { y = scrollY; since = performance.now(); }
        }
        return [atOnce, scrollY];
    }"""
    at_once, rested = page.evaluate(click_last_tile)
    assert at_once != rested, "no smooth scroll: the map was in place when the click returned"
    page.emulate_media(reduced_motion="reduce")
    at_once, rested = page.evaluate(click_last_tile)
    assert at_once == rested, "with reduced motion asked for, the page still scrolled smoothly"
    box = page.eval_on_selector("#overlay", "e => { const b = e.getBoundingClientRect(); return [b.top, b.bottom]; }")
    assert box[0] < 400 and box[1] > 0, f"the map is not in view: {box}"


# Every live region of the page (role="status" or aria-live), except the one that says each move.
LIVE_WRITES = """() => { window.__liveWrites = new Map();
    for (const e of document.querySelectorAll('[role=status], [aria-live]')) {
        if (e.id === 'announce') continue;
        new MutationObserver((m) => { window.__liveWrites.set(e.id, (window.__liveWrites.get(e.id) || 0) + m.length); })
            .observe(e, {childList: true, characterData: true, subtree: true});
    }
}"""
LIVE_WORDS = """() => Object.fromEntries(
    [...document.querySelectorAll('[role=status], [aria-live]')].map(e => [e.id, e.textContent]))"""


@pytest.mark.parametrize("view", ["viewer", "learn"])
def test_live_regions_are_not_told_the_same_words_again(page, base_url, samples, view):
    """A live region written again with the words it holds is said again by some screen readers:
    at every step through the heads, the page's status, the analytics panel's and "Inside a head"'s
    would repeat themselves. Those whose words stay are not written."""
    open_page(page, base_url, f"?view={view}")
    upload(page, samples["cat"])
    if view == "learn":
        wait_learn(page, image=image_id(samples["cat"].read_bytes()))
    else:
        page.wait_for_selector("[data-testid=analytics][data-state=ready]")
    before = page.evaluate(LIVE_WORDS)
    page.evaluate(LIVE_WRITES)
    page.locator("h1").click()  # focus outside the form controls: the arrows step through the heads
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    if view == "learn":
        wait_learn(page, layer=10, head=1)
    else:
        wait_view(page, layer=10, head=1)
        # the charts' render (debounced) has drawn the new head too
        page.wait_for_selector("[data-testid=chart-row][data-layer='10'][data-head='1']")
    after = page.evaluate(LIVE_WORDS)
    writes = page.evaluate("() => Object.fromEntries(window.__liveWrites)")
    same = [k for k in before if k != "announce" and before[k] == after.get(k)]
    assert same, (before, after)
    assert {k: writes[k] for k in same if writes.get(k)} == {}, "written again with the same words"


def test_view_tabs_arrows_move_between_tabs_not_the_head(kpage, base_url, samples):
    page = kpage
    open_page(page, base_url)
    before = upload(page, samples["cat"])
    # The skip link to the tabs, then one Tab stop on the shown tab.
    page.keyboard.press("Tab")
    assert focused(page)["testid"] == "skip-main"
    page.keyboard.press("Tab")
    assert focused(page)["testid"] == "skip-tabs"
    page.keyboard.press("Enter")  # onto the shown tab, where the tabs' keys work at once
    assert focused(page)["testid"] == "viewer-tab"
    assert page.eval_on_selector_all("[role=tab]", "ts => ts.map(t => t.tabIndex)") == [0, -1, -1, -1]
    page.keyboard.press("ArrowRight")
    assert focused(page)["testid"] == "learn-tab"
    press(page, "ArrowRight", 2)
    assert focused(page)["testid"] == "why-tab"
    page.keyboard.press("ArrowRight")  # wraps round
    assert focused(page)["testid"] == "viewer-tab"
    page.keyboard.press("End")
    assert focused(page)["testid"] == "why-tab"
    page.keyboard.press("Home")
    assert focused(page)["testid"] == "viewer-tab"
    page.keyboard.press("ArrowLeft")
    assert focused(page)["testid"] == "why-tab"
    page.keyboard.press("ArrowLeft")
    # The arrows moved focus only: the same view, layer and head.
    after = view(page)
    assert (after["layer"], after["head"]) == (before["layer"], before["head"])
    assert page.get_attribute("[data-testid=viewer-tab]", "aria-selected") == "true"
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-testid=ablation-view]", state="visible")
    assert page.get_attribute("[data-testid=ablation-tab]", "aria-selected") == "true"
    assert page.get_attribute("[data-testid=ablation-tab]", "aria-controls") == "ablation-view"
    assert "view=ablation" in page.url
    # One Tab stop: Tab leaves the tab list.
    page.keyboard.press("Tab")
    assert not focus_in(page, "[role=tablist]")
    page.keyboard.press("Shift+Tab")
    assert focused(page)["testid"] == "ablation-tab"


def test_the_map_takes_focus_a_cell_cursor_and_enter_queries_the_patch(kpage, base_url, samples):
    page = kpage
    open_page(page, base_url)
    v0 = upload(page, samples["cat"])
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")  # skip to the view
    tab_to(page, "[data-testid=overlay]", most=8)
    words = announced(page)
    m = re.match(r"patch \((\d+), (\d+)\) · token (\d+) · ", words)
    assert m, words
    r, c = int(m[1]), int(m[2])
    # The arrows move the cursor (its outline shows), not the layer or the head.
    press(page, "ArrowRight", 2)
    press(page, "ArrowDown")
    page.wait_for_function(
        "w => document.querySelector('[data-testid=announce]').textContent.startsWith(w)",
        arg=f"patch ({r + 1}, {c + 2})",
    )
    assert page.is_visible("[data-testid=overlay-cursor]")
    assert (view(page)["layer"], view(page)["head"]) == (v0["layer"], v0["head"])
    token = int(re.match(r"patch \(\d+, \d+\) · token (\d+)", announced(page))[1])
    page.keyboard.press("Enter")
    v = wait_view(page, query=f"patch:{r + 1},{c + 2}")
    assert v["marked"] == f"{r + 1},{c + 2}" and v["layer"] == v0["layer"]
    assert focused(page)["testid"] == "overlay"
    said(page, f"query: patch ({r + 1}, {c + 2}), token {token}")  # the new query, said
    # Escape: back to the default row; focus stays on the map.
    page.keyboard.press("Escape")
    wait_view(page, query=v0["query"])
    assert focused(page)["testid"] == "overlay"
    said(page, "query: CLS")
    # Tab leaves the map, and the cursor's outline goes with focus.
    page.keyboard.press("Tab")
    assert page.is_hidden("[data-testid=overlay-cursor]")


def test_the_page_shortcuts_say_the_new_layer_head_and_query(page, base_url, samples):
    """The arrows and Escape change the map with focus elsewhere: the live region says the new
    layer and head, or the new query, and nothing where a key changed nothing."""
    open_page(page, base_url)
    v0 = upload(page, samples["cat"])
    layer, head = int(v0["layer"]), int(v0["head"])
    page.evaluate("() => document.activeElement.blur()")
    page.keyboard.press("ArrowDown")
    said(page, f"layer {layer - 1}, head {head}")
    page.keyboard.press("ArrowRight")
    said(page, f"layer {layer - 1}, head {head + 1}")
    page.keyboard.press("ArrowUp")
    said(page, f"layer {layer}, head {head + 1}")
    page.keyboard.press("ArrowUp")  # the last layer already: nothing changes, nothing is said
    page.wait_for_timeout(300)
    assert page.inner_text("[data-testid=announce]") == f"layer {layer}, head {head + 1}"
    assert view(page)["layer"] == str(layer)
    # Escape on the CLS row says nothing; on a patch row it says the query is CLS again.
    page.locator("[data-testid=overlay]").click()  # a patch row (the mouse, to set it up)
    page.wait_for_function("() => new URLSearchParams(location.search).get('q').startsWith('patch:')")
    page.evaluate("() => document.activeElement.blur()")
    page.keyboard.press("Escape")
    wait_view(page, query=v0["query"])
    said(page, "query: CLS")


def test_tile_grids_are_one_tab_stop_with_the_arrows_inside(kpage, base_url, samples):
    page = kpage
    open_page(page, base_url)
    v0 = upload(page, samples["cat"])
    page.wait_for_function("() => document.querySelectorAll('[data-testid=model-view] .tile').length === 12 * 9")
    for grid in ("head-grid", "model-view"):
        stops = page.eval_on_selector_all(f"[data-testid={grid}] .tile", "ts => ts.filter(t => t.tabIndex == 0).length")
        assert stops == 1, grid
    # Heads at a glance: its selected tile is the stop; ArrowRight, Enter opens the next head.
    tab_to(page, "[data-testid=head-grid]", most=120)
    assert focused(page)["data"] == {"layer": v0["layer"], "head": v0["head"]}
    page.keyboard.press("ArrowRight")
    assert focused(page)["data"]["head"] == str(int(v0["head"]) + 1)
    page.keyboard.press("Enter")
    wait_view(page, layer=v0["layer"], head=int(v0["head"]) + 1)
    page.keyboard.press("Tab")
    assert not focus_in(page, "[data-testid=head-grid]")
    # The model view: up two layers, right one head, Enter opens it; Tab leaves the grid at once.
    tab_to(page, "[data-testid=model-view]", most=120)
    start = focused(page)["data"]
    assert start == {"layer": v0["layer"], "head": str(int(v0["head"]) + 1)}
    press(page, "ArrowUp", 2)
    page.keyboard.press("ArrowRight")
    want = {"layer": str(int(start["layer"]) - 2), "head": str(int(start["head"]) + 1)}
    assert focused(page)["data"] == want
    assert "layer" in focused(page)["label"] and focused(page)["label"].endswith(f"head {want['head']}")
    page.keyboard.press("Enter")
    wait_view(page, **want)
    # Focus goes to the map the page scrolled to: in sight, its cell cursor on the arrows.
    assert focused(page)["testid"] == "overlay"
    wait_scroll_settled(page)
    assert hidden_by_bars(page) is None, page.evaluate(FOCUS_BOX)
    page.wait_for_function(
        "w => document.querySelector('[data-testid=announce]').textContent.startsWith(w)",
        arg=f"layer {want['layer']}, head {want['head']}. patch (",
    )
    assert page.is_visible("[data-testid=overlay-cursor]")
    tab_to(page, "[data-testid=model-view]", most=120)
    assert focused(page)["data"] == want  # Tab comes back to the tile last used
    page.keyboard.press("Tab")
    assert not focus_in(page, "[data-testid=model-view]")


def test_ablation_toggles_one_tab_stop_roving_and_named(kpage, base_url, samples):
    page = kpage
    open_page(page, base_url, "?view=ablation")
    upload(page, samples["coffee"])
    wait_output(page, "")
    layer = page.input_value("[data-testid=layer]")
    assert page.eval_on_selector_all("[data-testid=ablate-head]", "bs => bs.filter(b => b.tabIndex === 0).length") == 1
    tab_to(page, "[data-testid=ablate-grid]", most=40)
    assert focused(page)["label"] == "layer 0, head 0, on"
    press(page, "ArrowDown", 2)
    press(page, "ArrowRight", 3)
    assert focused(page)["label"] == "layer 2, head 3, on"
    page.keyboard.press("End")
    assert focused(page)["label"] == "layer 2, head 5, on"
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("Space")
    page.wait_for_selector("[data-testid=ablate-head][aria-label='layer 2, head 4, off'][aria-pressed=true]")
    wait_output(page, "2:4")
    assert focused(page)["label"] == "layer 2, head 4, off"  # focus stays on the toggle after the redraw
    assert page.input_value("[data-testid=layer]") == layer  # the arrows moved focus, not the layer
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-testid=ablate-head][aria-label='layer 2, head 4, on'][aria-pressed=false]")
    wait_output(page, "")
    page.keyboard.press("Tab")
    assert not focus_in(page, "[data-testid=ablate-grid]")
    page.keyboard.press("Shift+Tab")
    assert focused(page)["label"] == "layer 2, head 4, on"


def test_chart_toolbars_show_a_focus_ring_and_every_chart_has_a_table(kpage, base_url, samples):
    page = kpage
    open_page(page, base_url)
    upload(page, samples["cat"])
    show_chart(page, "chart-entropy")  # drawn once scrolled to, as when focus comes near it
    if page.evaluate("() => !!document.querySelector('[data-testid=chart-entropy] .modebar-btn')"):
        tab_to(page, "[data-testid=chart-entropy] .modebar", most=150)
        ring = page.evaluate(
            """() => { const b = document.activeElement, s = getComputedStyle(b);
                return {width: parseFloat(s.outlineWidth), style: s.outlineStyle, colour: s.outlineColor,
                        bar: getComputedStyle(b.closest('.modebar')).opacity}; }"""
        )
        assert ring["width"] >= 2 and ring["style"] == "solid" and ring["bar"] == "1", ring
        assert ring["colour"] == "rgb(251, 191, 36)", ring  # amber on the near-black bar
    # The entropy heat map's table: opened with Enter on its summary, one row per layer.
    tab_to(page, "[data-testid=entropy-heatmap] summary", most=40)
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-testid=entropy-heatmap] table")
    rows = page.eval_on_selector_all(
        "[data-testid=entropy-heatmap] table tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert rows[0][:3] == ["layer \\ head", "head 0", "head 1"] and len(rows) == 1 + 12
    z = page.evaluate("() => document.querySelector('[data-testid=chart-entropy]').data[0].z")
    for r, zr in zip(rows[1:], z, strict=True):
        assert [float(v) for v in r[1:]] == pytest.approx(zr, rel=5e-3)
    assert page.get_attribute("[data-testid=chart-entropy]", "role") == "figure"
    assert page.get_attribute("[data-testid=chart-entropy]", "aria-label").startswith("Entropy per head")
    # every drawn chart of the view has its table
    charts = page.eval_on_selector_all(
        ".js-plotly-plot", "cs => cs.map(c => !!c.nextElementSibling?.matches('details.chart-table'))"
    )
    assert charts and all(charts)
    # A screen reader gets the figure's name and its table, not the drawing's tick labels one by
    # one: every SVG of every chart is hidden from it, and the toolbar's buttons are not.
    assert_drawings_hidden(page)
    # The current row's table: token order, the prefix tokens (CLS, token 0) first.
    page.evaluate("() => { document.querySelector('[data-testid=chart-row] + details.chart-table').open = true; }")
    rows = page.eval_on_selector_all(
        "[data-testid=chart-row] + details table tbody tr", "rs => rs.map(r => r.cells[0].textContent)"
    )
    assert rows[:2] == ["0", "1"] and [int(t) for t in rows] == sorted(int(t) for t in rows), rows[:3] + rows[-2:]


def test_inside_a_head_the_softmax_map_takes_a_cell_cursor(kpage, base_url, samples):
    page = kpage
    open_page(page, base_url, "?view=learn")
    upload(page, samples["cat"])
    wait_learn(page, image=image_id(samples["cat"].read_bytes()))
    tab_to(page, "[data-testid=learn-weights]", most=60)
    words = announced(page)
    m = re.match(r"row (\d+), column (\d+)\. Enter queries this patch\.", words)
    assert m, words
    r, c = int(m[1]), int(m[2])
    page.keyboard.press("ArrowUp")
    page.wait_for_function(
        "w => document.querySelector('[data-testid=announce]').textContent.startsWith(w)", arg=f"row {r - 1},"
    )
    assert page.is_visible("[data-testid=learn-cursor]")
    page.keyboard.press("Enter")
    page.wait_for_function("q => new URLSearchParams(location.search).get('q') === q", arg=f"patch:{r - 1},{c}")
    wait_learn(page, image=image_id(samples["cat"].read_bytes()))
    assert focused(page)["testid"] == "learn-weights"
