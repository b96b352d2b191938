"""axe-core's check (WCAG 2 and 2.1, A and AA) stays at 0 violations in every state of the page
(#43): before an upload, the maps, compare, every chart's table open, a head queried by keyboard,
"Inside a head", the Ablation view with a head off, and the Why view. The Why view with its
faithfulness chart is checked in test_keyboard_why.py, the model picker in
test_keyboard_picker.py. axe-core comes from node_modules (package.json; make test installs it),
injected through the DevTools protocol: nothing from a CDN.
"""

from __future__ import annotations

import pytest

from helpers.charts import show_all_charts
from helpers.keyboard import axe_violations
from helpers.learn import wait_learn
from helpers.page import image_id, open_page, upload, wait_output, wait_view

pytestmark = pytest.mark.browser


def clean(page, state: str) -> None:
    found = axe_violations(page)
    assert found == [], f"{state}: {found}"


@pytest.mark.timeout(900)
@pytest.mark.heavy
def test_no_axe_violations_in_any_view(page, base_url, samples):
    page.set_default_timeout(240_000)
    open_page(page, base_url)
    clean(page, "before an upload")
    v = upload(page, samples["cat"])
    page.wait_for_function("() => document.querySelectorAll('[data-testid=model-view] .tile').length === 12 * 9")
    page.wait_for_selector("[data-testid=analytics][data-state=ready]")
    show_all_charts(page)  # each drawn once scrolled to: axe sees every drawing
    clean(page, "the maps")
    # every chart's table open
    page.eval_on_selector_all("details.chart-table:not([hidden])", "ds => ds.forEach(d => { d.open = true; })")
    page.wait_for_selector("[data-testid=entropy-heatmap] table")
    clean(page, "the maps with their tables")
    # a patch queried from the keyboard, the cell cursor on show
    page.focus("[data-testid=overlay]")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    wait_view(page, image=v["image"], query="patch:" + page.get_attribute("[data-testid=overlay]", "data-cursor"))
    clean(page, "a patch queried, the cursor on the map")
    page.check("[data-testid=compare-toggle]")
    page.wait_for_selector("[data-testid=compare]", state="visible")
    clean(page, "compare")
    page.uncheck("[data-testid=compare-toggle]")

    open_page(page, base_url, "?view=learn")
    upload(page, samples["cat"])
    wait_learn(page, image=image_id(samples["cat"].read_bytes()))
    clean(page, "inside a head")

    open_page(page, base_url, "?view=ablation")
    upload(page, samples["cat"])
    wait_output(page, "")
    page.focus("[data-testid=ablate-head][data-layer='3'][data-head='2']")
    page.keyboard.press("Space")
    wait_output(page, "3:2")
    clean(page, "ablation, a head off")

    open_page(page, base_url, "?view=why")
    upload(page, samples["cat"])
    page.wait_for_selector("#relevance-figure[data-state=ready]")
    page.wait_for_selector("#raw-figure[data-state=ready]")
    clean(page, "why")
