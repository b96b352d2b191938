"""Switching views while requests are in flight (issue #30, "the page's rough edges"), in real
Chromium against a real server.

The race: the maps view drew itself while its panel was hidden (0 px wide, so at the 120 px
floor); back on the maps with the heads of the Ablation view switched off, the rows of the
ablated model were still on their way (behind an importance sweep), so that 120 px picture
stayed, with "…" in the prefix list, and "Download PNG" did nothing.
"""

from __future__ import annotations

import pytest
from test_page import OVERLAY, click_cell, open_page, upload, wait_view

pytestmark = [pytest.mark.browser, pytest.mark.thorough]  # the everyday command leaves it to make test-long

SLOW_MS = 240_000

# Every animation frame from now on: the overlay's box, whether it waits for its row, the text of
# the first prefix token's value, the loading note on the map and the PNG button's state.
RECORD = """() => {
    window.__frames = [];
    const tick = () => {
        const c = document.querySelector('[data-testid=overlay]');
        const r = c.getBoundingClientRect();
        const v = document.querySelector('[data-testid=prefix-list] .prefix-val');
        window.__frames.push({w: r.width, h: r.height, pending: c.dataset.pending,
            prefix: v ? v.textContent : null, png: document.querySelector('[data-testid=download-png]').disabled,
            shown: !document.querySelector('[data-view-panel=viewer]').hidden});
        if (window.__frames.length < 20000) requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
}"""


def slow_ablated_rows(page, seconds: float) -> None:
    """The ablated model's rows take ``seconds`` longer on the server (fault injection), so the
    window between the switch and their answer is wide on any machine."""

    def route(r):
        url = r.request.url
        if "ablate=" in url and "layers=all" in url and "/output" not in url:
            return r.continue_(headers={**r.request.headers, "x-headscope-fault": f"sleep:{seconds}"})
        return r.continue_()

    page.route("**/api/v1/attention/**", route)


@pytest.mark.timeout(900)
def test_back_from_the_ablation_view_while_a_sweep_runs_keeps_the_map_whole(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url)
    upload(page, samples["cat"])
    # The report's setting: mass mask, a patch query, prefix and artifact tokens dropped.
    page.check("[data-testid=mass-toggle]")
    click_cell(page, 6, 7, (16, 24))
    page.select_option("[data-testid=drop-tokens]", "prefix,artifacts")
    v = wait_view(page, query="patch:6,7", drop="prefix,artifacts", maskFraction="0.6")
    page.wait_for_function("() => document.querySelector('[data-testid=overlay]').dataset.pending === '0'")
    full = page.locator(OVERLAY).bounding_box()
    assert full["width"] > 400, full

    slow_ablated_rows(page, 2.0)
    page.click("[data-testid=ablation-tab]")
    page.wait_for_selector("[data-testid=model-output][data-state=ready]")
    page.click("[data-testid=importance-run]")  # an importance sweep holds the worker in pieces
    page.wait_for_selector("[data-testid=importance-progress][data-state=running]")
    page.click("[data-testid=ablate-head][data-layer='3'][data-head='1']")
    page.evaluate(RECORD)
    page.click("[data-testid=viewer-tab]")  # straight back, while the ablated rows are on their way

    page.wait_for_function(
        "() => window.__frames.some(f => f.shown && f.pending === '1')"
    )  # the ablated rows are asked for
    page.wait_for_function(
        "() => { const f = window.__frames; return f.length && f[f.length - 1].pending === '0'; }", timeout=SLOW_MS
    )
    frames = page.evaluate("() => window.__frames")
    shown = [f for f in frames if f["shown"]]
    waiting = [f for f in shown if f["pending"] == "1"]
    assert waiting, "the test saw no frame while the rows were loading"
    # The whole time, the map keeps its size (no 120 px picture) ...
    for f in shown:
        assert abs(f["w"] - full["width"]) <= 2 and abs(f["h"] - full["height"]) <= 2, (f, full)
    # ... the prefix list keeps its numbers (no "…") ...
    assert all(f["prefix"] not in (None, "…") for f in shown), {f["prefix"] for f in shown}
    # ... and "Download PNG" is off while the map waits for its row, on again once it is in.
    assert all(f["png"] for f in waiting)
    assert not page.is_disabled("[data-testid=download-png]")
    v = wait_view(page, query="patch:6,7", drop="prefix,artifacts")
    assert v["ablate"] == "3:1"
    with page.expect_download() as dl:
        page.click("[data-testid=download-png]")
    assert dl.value.suggested_filename.endswith(".png")
    note = page.inner_text("[data-testid=maps-ablated]")
    assert "1 head off (layer 3 head 1)" in note and "Layers 0–3 are unchanged" in note and "from layer 4 on" in note
