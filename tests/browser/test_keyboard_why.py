"""The Why view without a mouse and with a screen reader (#43), in real Chromium against the real
server, keys only, at 1280x800 and at 200 % zoom:

- the saliency output takes focus: a cell cursor on the arrows, Shift+arrows grow a box, Enter makes
  it the target (the "a box" target without a mouse), each move said in the live region;
- the maps have a colour bar;
- "Run the test" keeps focus after Enter; the progress, the time left and the finish are said in a
  polite live region; the result is a table in words and rounded numbers, equal to the API's answer;
- the faithfulness chart tells the methods apart by marker shape, not colour alone;
- axe-core finds no WCAG 2 / 2.1 A or AA violation in the view with its chart.
"""

from __future__ import annotations

import re

import pytest

from helpers.api import follow_up
from helpers.charts import show_chart
from helpers.keyboard import SCREENS, axe_violations, focused, tab_to
from helpers.page import image_id, open_page, upload
from helpers.screens import sizes

pytestmark = pytest.mark.browser

MAP = "[data-testid=relevance-map]"
SLOW_MS = 600_000  # a perturbation test on a loaded 2-core machine
# A different box on each screen, so that each runs its own test (the server caches answers).
GROW = {"1280x800": (2, 1), "zoom200": (3, 2)}


@pytest.fixture(params=sizes(GROW))
def screen(request):
    return request.param


def said(page) -> str:
    return page.inner_text("[data-testid=announce]")


@pytest.mark.timeout(1200)
def test_a_box_by_keyboard_and_a_faithfulness_test_a_screen_reader_follows(page_at, base_url, samples, screen):
    width, height, options = SCREENS[screen]
    page = page_at(width, height, **options)
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url, "?view=why")
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    page.wait_for_selector("[data-testid=why-saliency]")
    page.wait_for_selector("#relevance-figure[data-state=ready]")
    m = re.search(r"(\d+) × (\d+) patches", page.inner_text("#token-info"))
    R, C = int(m[1]), int(m[2])
    h, w = follow_up(base_url, iid, "output")["input_size"]

    # Tab to the saliency output: the cursor starts in the middle and is said.
    tab_to(page, "[data-testid=why-saliency]", most=40)
    assert focused(page)["role"] == "application"
    r0, c0 = R // 2, C // 2
    page.wait_for_function(
        "w => document.querySelector('[data-testid=announce]').textContent.startsWith(w)", arg=f"row {r0}, column {c0}:"
    )
    assert page.is_visible("[data-testid=why-cursor]")
    right, down = GROW[screen]
    page.keyboard.press("ArrowLeft")
    for _ in range(right):
        page.keyboard.press("Shift+ArrowRight")
    for _ in range(down):
        page.keyboard.press("Shift+ArrowDown")
    c0 -= 1
    sel = (r0, c0, r0 + down, c0 + right)
    box = [round(sel[1] * w / C), round(sel[0] * h / R), round((sel[3] + 1) * w / C), round((sel[2] + 1) * h / R)]
    words = f"rows {r0} to {r0 + down}, columns {c0} to {c0 + right} ({down + 1} by {right + 1} cells)"
    page.wait_for_function("w => document.querySelector('[data-testid=announce]').textContent.startsWith(w)", arg=words)
    assert f"x {box[0]}–{box[2]}, y {box[1]}–{box[3]}" in said(page)
    page.keyboard.press("Enter")
    target = "box:" + ",".join(map(str, box))
    page.wait_for_function(
        "t => document.querySelector('[data-testid=relevance-map]').dataset.target === t"
        " && document.querySelector('#relevance-figure').dataset.state === 'ready'",
        arg=target,
    )
    assert page.input_value("[data-testid=relevance-target]") == "box"
    assert page.is_visible("[data-testid=why-box]")
    assert focused(page)["testid"] == "why-saliency"
    assert "Explaining the box" in said(page)

    # The map's colour bar: 0 to the map's largest share.
    rel = follow_up(base_url, iid, "relevance", method="chefer", target=target)
    top = max(max(row) for row in rel["relevance"])
    assert page.is_visible("[data-testid=relevance-colorbar]")
    assert float(page.inner_text("[data-testid=relevance-colorbar] .cb-max")) == pytest.approx(top, rel=5e-3)

    # Run the test by keyboard; focus stays on the button, the live region follows.
    page.evaluate(
        """() => { window.__said = [];
            const el = document.querySelector('[data-testid=faithfulness-live]');
            new MutationObserver(() => window.__said.push(el.textContent))
                .observe(el, {childList: true, characterData: true, subtree: true}); }"""
    )
    tab_to(page, "[data-testid=faithfulness-run]", most=20)
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-testid=faithfulness-run][aria-disabled=true]")
    assert focused(page)["testid"] == "faithfulness-run"
    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=done]", timeout=SLOW_MS)
    page.wait_for_function(
        "() => /test done/.test(document.querySelector('[data-testid=faithfulness-live]').textContent)"
    )
    assert page.inner_text("[data-testid=faithfulness-live]").startswith("Faithfulness test done: ")
    assert focused(page)["testid"] == "faithfulness-run"
    heard = page.evaluate("() => window.__said")
    assert heard[0] == "Faithfulness test started: removing patches and running the model.", heard
    assert page.get_attribute("[data-testid=faithfulness-live]", "aria-live") == "polite"
    answer = follow_up(
        base_url, iid, "faithfulness", methods="chefer,attention,random", target=target, fractions="0,0.25,0.5,0.75"
    )
    assert answer["cached"]  # the page's own test
    final = page.inner_text("[data-testid=faithfulness-live]")
    assert f"{answer['forwards']} forwards in" in final
    # The verdicts are read out as sentences: none run into the next, and no link label is spoken.
    assert page.inner_text("[data-testid=why-verdict-head]") in final
    assert "How to read the verdict" not in final
    assert not re.search(r"[a-z)]\.[A-Z]", final), final
    chefer = answer["methods"]["chefer"]
    assert (
        f"Chefer et al.: area under the positive curve {chefer['auc_positive']:.3f} (lower is better), "
        f"under the negative curve {chefer['auc_negative']:.3f} (higher is better)."
    ) in final
    # The result as a table: method names in words, numbers rounded; no raw ids or long numbers.
    rows = page.eval_on_selector_all(
        "[data-testid=faithfulness-results] tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    names = {"chefer": "Chefer et al.", "attention": "raw attention", "random": "random"}
    assert rows == [
        [names[m], f"{c['auc_positive']:.3f}", f"{c['auc_negative']:.3f}"] for m, c in answer["methods"].items()
    ]
    text = final + page.inner_text("[data-testid=faithfulness-results]")
    assert not re.search(r"\d{6,}", text) and "grad_attention" not in text
    assert "chefer:" not in (page.get_attribute("[data-testid=faithfulness-chart]", "aria-label") or "")
    # The chart: a marker shape per method (the same on both panels), distinct across methods.
    show_chart(page, "faithfulness-chart")
    symbols = page.eval_on_selector(
        "[data-testid=faithfulness-chart]", "c => c.data.map(t => [t.meta.method, t.marker.symbol])"
    )
    per = {}
    for method, symbol in symbols:
        per.setdefault(method, set()).add(symbol)
    assert all(len(s) == 1 for s in per.values()) and len({next(iter(s)) for s in per.values()}) == len(per)

    # axe-core: the view with its chart and table, no WCAG 2 / 2.1 A or AA violation.
    assert axe_violations(page) == []
