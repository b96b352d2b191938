"""The page on every screen, and the rough edges a newcomer hit (issue #18), in real Chromium
against a real server: phones at 360-430 px, the loading state on the map, compare captions,
"Try again" only where it helps, layout jumps, the empty page, the exported PNG's legend, the
tensors download name, when the statistics are asked for, and the glossary.

Every page comes from the guarded fixtures of tests/browser/conftest.py (no console errors,
page errors, dialogs or outside requests).
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from PIL import Image

from helpers.api import fresh_png
from helpers.charts import show_all_charts, show_chart
from helpers.page import ERROR, OVERLAY, click_cell, image_id, open_page, upload, view, wait_scroll_settled, wait_view
from helpers.screens import sizes

pytestmark = pytest.mark.browser

PHONES = [(360, 740), (390, 844), (430, 932)]
SLOW_MS = 180_000  # the statistics of a fresh image take seconds, much longer on a loaded machine
STATS_URL = re.compile(r"/api/v1/attention/[0-9a-f]+/stats")


def scroll_width(pg) -> tuple[int, int]:
    return tuple(pg.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]"))


def assert_no_sideways_scroll(pg, when: str) -> None:
    sw, iw = scroll_width(pg)
    assert sw <= iw, f"{when}: the page is {sw} px wide in a {iw} px window"


def in_view(pg, selector: str) -> bool:
    return pg.eval_on_selector(
        selector, "e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.top < innerHeight * 0.9; }"
    )


def box(pg, selector: str) -> dict:
    return pg.eval_on_selector(
        selector, "e => { const r = e.getBoundingClientRect(); return {l: r.left, r: r.right, t: r.top, b: r.bottom}; }"
    )


def boxes_at_once(pg, *selectors: str) -> list[dict]:
    """The boxes of ``selectors`` measured in one frame."""
    return pg.evaluate(
        """sels => sels.map(s => { const r = document.querySelector(s).getBoundingClientRect();
        return {l: r.left, r: r.right, t: r.top, b: r.bottom}; })""",
        list(selectors),
    )


def wait_side(pg, name: str, **want) -> dict:
    pg.wait_for_function(
        """([name, want]) => {
        const c = document.querySelector(`[data-testid=compare-${name}]`);
        return c && c.dataset.pending === '0' && Object.entries(want).every(([k, v]) => c.dataset[k] === v);
    }""",
        arg=[name, {k: str(x) for k, x in want.items()}],
    )
    return pg.eval_on_selector(f"[data-testid=compare-{name}]", "c => ({...c.dataset})")


def caption(pg, side: str) -> str:
    return pg.locator(f".compare-side[data-side={side}] .compare-title").inner_text()


# ------------------------------------------------------------------ phones
@pytest.mark.parametrize("width,height", sizes(PHONES, [f"{w}x{h}" for w, h in PHONES]))
def test_phone_nothing_scrolls_sideways_and_the_result_comes_into_view(page_at, base_url, samples, width, height):
    pg = page_at(width, height)
    open_page(pg, base_url)
    assert_no_sideways_scroll(pg, "empty page")

    # Choosing a file scrolls the status line (and the map under it) into view at once.
    pg.set_input_files("[data-testid=image-input]", str(samples["cat"]))
    pg.wait_for_function(
        "() => { const r = document.querySelector('[data-testid=status]').getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= innerHeight; }"
    )
    v = wait_view(pg, image=image_id(samples["cat"].read_bytes()))
    wait_scroll_settled(pg)  # the answer may come before the smooth scroll has ended
    assert in_view(pg, OVERLAY)
    cbox, vbox = box(pg, OVERLAY), box(pg, "#viewer")
    assert vbox["l"] >= 0 and vbox["r"] <= width and cbox["l"] >= vbox["l"] - 0.5 and cbox["r"] <= vbox["r"] + 0.5
    # The colour bar sits right under the map, inside the window.
    bar = box(pg, "[data-testid=colorbar]")
    assert bar["r"] <= width and 0 <= bar["t"] - cbox["b"] < 60

    # Once every chart is drawn (each scrolled to), still nothing sticks out.
    pg.wait_for_selector("[data-testid=analytics][data-state=ready]", timeout=SLOW_MS)
    show_all_charts(pg, timeout=SLOW_MS)
    assert pg.get_attribute("[data-testid=rank-chart]", "data-rendered") == "1"
    pg.wait_for_timeout(300)
    assert_no_sideways_scroll(pg, "image and charts shown")
    assert v["layer"] == "11"

    # "Inside a head": its strips, matrices, maps and bars fit the phone too.
    pg.click("[data-testid=learn-tab]")
    pg.wait_for_selector("[data-testid=learn-view][data-state=ready]", timeout=SLOW_MS)
    pg.wait_for_timeout(300)
    assert_no_sideways_scroll(pg, "Inside a head")
    for sel in ("#learn-q", "#learn-o", "#learn-concat", "#learn-out", "#learn-scores", "#learn-weights"):
        r = box(pg, sel)
        assert r["l"] >= 0 and r["r"] <= width, (sel, r)


@pytest.mark.parametrize("width,height", sizes(PHONES[:2], [f"{w}x{h}" for w, h in PHONES[:2]]))
def test_compare_mode_fits_a_phone(page_at, base_url, samples, width, height):
    pg = page_at(width, height)
    open_page(pg, base_url)
    v = upload(pg, samples["cat"])
    pg.check("[data-testid=compare-toggle]")
    pg.select_option("[data-testid=compare-mode]", "images")
    pg.select_option("[data-testid=compare-b-image]", "sample:/static/samples/astronaut.png")
    wait_side(pg, "a", image=v["image"])
    wait_side(pg, "b", image=image_id(samples["astronaut"].read_bytes()))
    assert_no_sideways_scroll(pg, "compare mode")
    wait_scroll_settled(pg)
    for side in ("a", "b"):
        # one measurement for both, so a late scroll cannot move one between the two
        frame, canvas = boxes_at_once(
            pg, f".compare-side[data-side={side}] .compare-canvas", f"[data-testid=compare-{side}]"
        )
        assert frame["l"] >= 0 and frame["r"] <= width, (side, frame)
        # the map stays inside its frame
        assert canvas["l"] >= frame["l"] - 0.5 and canvas["r"] <= frame["r"] + 0.5, (side, canvas, frame)
        assert canvas["t"] >= frame["t"] - 0.5 and canvas["b"] <= frame["b"] + 0.5, (side, canvas, frame)
        # the pickers do not overlap one another and stay in the window
        pickers = pg.eval_on_selector_all(
            f".compare-side[data-side={side}] .compare-pickers label",
            "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })",
        )
        for i, (l1, t1, r1, b1) in enumerate(pickers):
            assert l1 >= 0 and r1 <= width, (side, i, pickers)
            for l2, t2, r2, b2 in pickers[i + 1 :]:
                assert r1 <= l2 + 0.5 or r2 <= l1 + 0.5 or b1 <= t2 + 0.5 or b2 <= t1 + 0.5, (side, pickers)
    pg.locator("[data-testid=compare]").scroll_into_view_if_needed()


# ------------------------------------------------------------------ the map while computing
def slow_uploads(page) -> None:
    """Every upload of the page takes 1.5 s longer on the server (fault injection), so the
    state while an image is computing stays long enough to be seen."""
    page.route(
        "**/api/v1/attention",
        lambda route: (
            route.continue_(headers={**route.request.headers, "x-headscope-fault": "sleep:1.5"})
            if route.request.method == "POST"
            else route.continue_()
        ),
    )


def test_the_map_shows_a_loading_state_while_computing(page, base_url, guard):
    slow_uploads(page)
    open_page(page, base_url)
    loading = page.locator("[data-testid=viewer-loading]")
    assert loading.is_hidden() and page.locator("#empty").is_visible()

    first = fresh_png(11)
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "slow.png", "mimeType": "image/png", "buffer": first}]
    )
    loading.wait_for(state="visible")
    assert "Computing attention for “slow.png”" in loading.inner_text()
    assert page.locator("#empty").is_hidden()  # no "Drop an image anywhere" while one is on its way
    wait_view(page, image=image_id(first))
    assert loading.is_hidden()

    # A second image: the loading state lies over the previous map, which stays until the new one is in.
    second = fresh_png(12)
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "next.png", "mimeType": "image/png", "buffer": second}]
    )
    loading.wait_for(state="visible")
    assert page.locator(OVERLAY).is_visible() and view(page)["image"] == image_id(first)
    wait_view(page, image=image_id(second))
    assert loading.is_hidden()


def test_inside_a_head_says_an_image_is_computing(page, base_url, guard):
    """The learn view, like the map, says an image is on its way instead of "Bring an image"."""
    slow_uploads(page)
    open_page(page, base_url, "?view=learn")
    status = page.locator("[data-testid=learn-status]")
    assert "Bring an image" in status.inner_text()
    first = fresh_png(13)
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "slow.png", "mimeType": "image/png", "buffer": first}]
    )
    page.wait_for_selector("[data-testid=learn-view][data-state=loading]")
    assert "Computing attention for “slow.png”" in status.inner_text()
    page.wait_for_selector("[data-testid=learn-view][data-state=ready]", timeout=SLOW_MS)
    assert "slow.png" in status.inner_text()

    # The next image: the shown head stays, named for its own image, and the status says what comes.
    second = fresh_png(14)
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "next.png", "mimeType": "image/png", "buffer": second}]
    )
    page.wait_for_function(
        "() => /Computing attention for “next.png”/"
        ".test(document.querySelector('[data-testid=learn-status]').textContent)"
    )
    text = status.inner_text()
    assert "previous image" in text and "numbers for slow.png" in text
    page.wait_for_function(
        "iid => document.querySelector('[data-testid=learn-view]').dataset.image === iid",
        arg=image_id(second),
        timeout=SLOW_MS,
    )
    assert "numbers for next.png" in status.inner_text() and "previous image" not in status.inner_text()


# ------------------------------------------------------------------ compare captions
def test_compare_two_images_captions_name_each_sides_own_cell(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])  # 16 x 24 patches
    astro = image_id(samples["astronaut"].read_bytes())  # 16 x 16 patches
    page.check("[data-testid=compare-toggle]")
    page.select_option("[data-testid=compare-mode]", "images")
    page.select_option("[data-testid=compare-b-image]", "sample:/static/samples/astronaut.png")
    wait_side(page, "b", image=astro)

    click_cell(page, 8, 4, (16, 24))
    wait_side(page, "a", query="patch:8,4")
    wait_side(page, "b", image=astro, query="patch:8,3")
    assert "patch (row 8, col 4)" in caption(page, "a")
    assert "patch (row 8, col 3)" in caption(page, "b")  # the mapped cell, where its marker is drawn

    # A click on the right map queries its cell; each caption again names its own.
    b = page.locator("[data-testid=compare-b]")
    b.scroll_into_view_if_needed()
    bb = b.bounding_box()
    b.click(position={"x": 10.5 * bb["width"] / 16, "y": 2.5 * bb["height"] / 16})
    wait_side(page, "b", query="patch:2,10")
    wait_side(page, "a", query="patch:2,15")  # (10.5 / 16) * 24 = 15.75
    assert "patch (row 2, col 10)" in caption(page, "b")
    assert "patch (row 2, col 15)" in caption(page, "a")
    assert view(page)["query"] == "patch:2,15" and view(page)["image"] == v["image"]


# ------------------------------------------------------------------ "Try again"
def test_try_again_only_for_errors_a_retry_can_fix(page, base_url, guard, samples):
    guard.allow_http_errors = True
    open_page(page, base_url)
    retry = page.locator("#error-retry")

    # An unsupported file: no "Try again".
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"text\n"}]
    )
    page.wait_for_selector(f"{ERROR}[data-code=not_an_image]")
    assert retry.is_hidden()

    # The network failed: a retry can help, and does.
    page.route("**/api/v1/attention", lambda route: route.abort("connectionreset"))
    page.set_input_files("[data-testid=image-input]", str(samples["coffee"]))
    page.wait_for_selector(f"{ERROR}[data-code=network]")
    assert retry.is_visible()
    page.unroute("**/api/v1/attention")
    retry.click()
    wait_view(page, image=image_id(samples["coffee"].read_bytes()))
    assert page.locator(ERROR).is_hidden()


# ------------------------------------------------------------------ layout jumps, empty page
def test_no_layout_jumps_and_labels_next_to_their_checkboxes(page, base_url, samples):
    open_page(page, base_url)
    upload(page, samples["cat"])
    before = box(page, "[data-testid=drop-tokens]")
    page.check("[data-testid=mass-toggle]")
    wait_view(page, maskFraction="0.6")
    assert page.locator("[data-testid=mass-count]").inner_text().endswith("of 384 patches")
    after = box(page, "[data-testid=drop-tokens]")
    assert (after["l"], after["t"]) == (before["l"], before["t"])  # the count had its room already
    page.fill("[data-testid=mass-slider]", "0.95")
    wait_view(page, maskFraction="0.95")
    assert box(page, "[data-testid=drop-tokens]")["l"] == before["l"]

    # "follow the pointer" sits right after its checkbox.
    check = box(page, "[data-testid=hover-toggle]")
    text = box(page, "[data-testid=hover-toggle] + span")
    assert 0 <= text["l"] - check["r"] < 16, (check, text)
    assert abs((text["t"] + text["b"]) / 2 - (check["t"] + check["b"]) / 2) < 6


def test_the_empty_page_has_no_empty_chart_cards(page, base_url, samples):
    open_page(page, base_url)
    for testid in ("analytics", "heads-panel", "model-panel"):
        assert page.locator(f"[data-testid={testid}]").is_hidden(), testid
    assert page.locator(".card:visible").count() == 0
    body = page.locator("body").inner_text()
    assert "Head similarity ·" not in body and "Drop an image anywhere on the page" in body

    upload(page, samples["cat"])
    for testid in ("analytics", "heads-panel", "model-panel"):
        assert page.locator(f"[data-testid={testid}]").is_visible(), testid
    page.wait_for_function(
        "() => document.querySelector('#similarity-layer').textContent === 'layer 11'", timeout=SLOW_MS
    )
    heading = page.eval_on_selector(
        "#similarity-layer",
        "e => e.parentElement.textContent.trim() + getComputedStyle(e, '::before').content",
    )
    assert heading.startswith("Head similarity layer 11") and '"· "' in heading


# Records when the page says it is ready (performance.now()), for the Plotly test below.
READY_AT = """new MutationObserver(() => {
    if (!window.__readyAt && document.body && document.body.dataset.ready === '1') window.__readyAt = performance.now();
}).observe(document, {subtree: true, attributes: true, attributeFilter: ['data-ready']});"""


def test_the_page_is_up_before_plotly_and_says_so_when_plotly_cannot_load(page_at, base_url, samples, guard):
    """Plotly (4.8 MB) is asked for only once the page is ready, and the charts come when it has
    loaded; where it cannot load, the map still works and each chart says why it is missing."""
    pg = page_at(1280, 800)
    pg.add_init_script(READY_AT)
    open_page(pg, base_url)
    upload(pg, samples["cat"])
    show_chart(pg, "chart-row", timeout=SLOW_MS)
    asked_at, ready_at = pg.evaluate(
        "() => [performance.getEntriesByName(location.origin + '/vendor/plotly.min.js')[0].startTime, window.__readyAt]"
    )
    assert ready_at is not None and asked_at >= ready_at, f"Plotly asked for at {asked_at} ms, ready at {ready_at}"

    guard.allow_http_errors = True  # the aborted script's "Failed to load resource"
    broken = page_at(1280, 800)
    broken.route("**/vendor/plotly.min.js", lambda route: route.abort())
    open_page(broken, base_url)
    upload(broken, samples["cat"])
    broken.wait_for_function(
        "() => document.querySelector('[data-testid=chart-row]').textContent.includes('Charts are unavailable')"
    )
    assert view(broken)["layer"] == "11"  # the map itself is drawn without Plotly


# ------------------------------------------------------------------ downloads
def test_exported_png_has_a_colour_bar_scale_and_labels(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    page.fill("[data-testid=layer]", "7")
    page.select_option("[data-testid=head]", "2")
    v = wait_view(page, layer=7, head=2)
    with page.expect_download() as dl:
        page.click("[data-testid=download-png]")
    with Image.open(dl.value.path()) as img:
        img.load()
        meta = json.loads(img.text["headscope"])
        assert img.text["Title"] == "Layer 7 · head 2 · query CLS"
        assert "dinov2-s14-focus" in img.text["Description"] and "cat.png" in img.text["Description"]
        assert (meta["layer"], meta["head"], meta["query"], meta["model"]) == (7, "2", "cls", "dinov2-s14-focus")
        assert meta["image_id"] == v["image"] and meta["colormap"] == "viridis"
        assert abs(meta["min"] - float(v["min"])) < 1e-9 and abs(meta["max"] - float(v["max"])) < 1e-9
        band = meta["legend_px"]
        assert img.size == (451, 300 + band) and band >= 60
        legend = img.convert("RGB").crop((0, 300, 451, 300 + band))
        colours = legend.getcolors(1 << 20)

    def near(rgb, tol=8):
        return any(all(abs(a - b) <= tol for a, b in zip(c, rgb)) for _, c in colours)

    # The colour bar runs through viridis, dark purple to yellow; the labels are light text.
    assert near((68, 1, 84)) and near((253, 231, 37)) and near((33, 145, 140), tol=14)
    light = sum(n for n, c in colours if min(c) > 190)
    assert light > 150, light


def test_tensors_download_is_saved_under_the_name_the_page_gives(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    click_cell(page, 3, 5, (16, 24))
    wait_view(page, query="patch:3,5")
    link = page.locator("[data-testid=download-tensors]")
    name = link.get_attribute("download")
    assert name == f"headscope-{v['image'][:12]}-dinov2-s14-focus-patch_3_5.safetensors"
    with page.expect_download() as dl:
        link.click()
    assert dl.value.suggested_filename == name

    # The full attention's link and the server's Content-Disposition name the same file.
    full = page.locator("[data-testid=download-full]")
    with httpx.stream("GET", base_url + full.get_attribute("href"), timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-disposition"] == f'attachment; filename="{full.get_attribute("download")}"'

    # At another softmax temperature the links are the maps shown, named for it, as the server names them.
    page.eval_on_selector(
        "[data-testid=map-temperature]",
        "s => { s.value = '0.4'; s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change')); }",
    )
    wait_view(page, temperature="2.51")
    href = link.get_attribute("href")
    assert "temperature=2.51" in href
    assert link.get_attribute("download") == f"headscope-{v['image'][:12]}-dinov2-s14-focus-patch_3_5-T2.51.safetensors"
    with httpx.stream("GET", base_url + href, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-disposition"] == f'attachment; filename="{link.get_attribute("download")}"'


# ------------------------------------------------------------------ statistics
FETCH_LOG = """window.__fetches = [];
    const orig = window.fetch;
    window.fetch = function (input, init) {
        const url = typeof input === 'string' ? input : input.url;
        const c = document.querySelector('[data-testid=overlay]');
        const shown = c && !c.hidden && c.dataset.pending === '0' ? c.dataset.image : null;
        window.__fetches.push({url, shown});
        return orig.apply(this, arguments);
    };"""


def test_stats_wait_for_the_overlay_and_a_new_image_cancels_them(page, base_url, samples):
    held = []
    failed: list[str] = []
    page.add_init_script(FETCH_LOG)
    page.route(STATS_URL, lambda route: held.append(route))  # never answered while the test looks
    page.on("requestfailed", lambda r: failed.append(r.url) if STATS_URL.search(r.url) else None)
    open_page(page, base_url)
    cat = upload(page, samples["cat"])["image"]
    page.wait_for_function("() => window.__fetches.some(f => f.url.includes('/stats'))", timeout=SLOW_MS)
    stats = [f for f in page.evaluate("() => window.__fetches") if "/stats" in f["url"]]
    assert len(stats) == 1 and cat in stats[0]["url"]
    assert stats[0]["shown"] == cat, "the statistics were asked for before the overlay showed the image"
    assert page.get_attribute("[data-testid=analytics]", "data-state") == "loading"

    # A new image: the statistics of the previous one are cancelled, the new ones asked after its overlay.
    coffee = upload(page, samples["coffee"])["image"]
    page.wait_for_function(
        "cat => window.__fetches.some(f => f.url.includes('/stats') && !f.url.includes(cat))", arg=cat, timeout=SLOW_MS
    )
    assert any(cat in u for u in failed), failed
    stats = [f for f in page.evaluate("() => window.__fetches") if "/stats" in f["url"]]
    assert [f["shown"] for f in stats] == [cat, coffee]
    assert coffee in stats[1]["url"]
    page.unroute(STATS_URL)
    for route in held:
        try:
            route.continue_()
        except Exception:  # noqa: BLE001 - the cancelled one is gone already
            pass
    page.wait_for_selector("[data-testid=analytics][data-state=ready]", timeout=SLOW_MS)


# ------------------------------------------------------------------ words
def test_glossary_says_head_query_token_and_cls_in_one_sentence_each(page, base_url):
    open_page(page, base_url)
    glossary = page.locator("[data-testid=glossary]")
    assert page.locator("[data-testid=define-head]").is_hidden()  # folded: not a wall of text
    glossary.locator("summary").click()
    for testid, word in (("define-head", "head"), ("define-query", "query token"), ("define-cls", "CLS")):
        text = page.locator(f"[data-testid={testid}]").inner_text().strip()
        assert word.lower() in text.lower(), (testid, text)
        assert text.endswith(".") and text.count(". ") == 0 and len(text) < 200, text
    # The same sentences as tooltips where the words are used.
    for label, testid in (("head", "define-head"), ("query-mode", "define-query")):
        sentence = page.locator(f"[data-testid={testid}]").inner_text().strip()
        assert page.get_attribute(f"label[for={label}]", "title") == sentence
