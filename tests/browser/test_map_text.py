"""The maps drawn on canvases say their numbers (screen readers), in real Chromium against a real
server: the Why view's relevance map and the raw attention beside it, the two compare maps and
"Inside a head"'s scores are images whose accessible description (Chromium's own accessibility
tree) names their three highest patches with their values and the lowest one, equal to the API's
numbers, and follows the map when it changes.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from helpers.learn import LONG, explain, wait_learn
from helpers.page import api_rows, image_id, open_page, upload

pytestmark = pytest.mark.browser

SLOW_MS = 240_000
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
CELL = re.compile(rf"patch \((\d+), (\d+)\) ({NUMBER})")


def described(page, selector: str) -> str:
    """The accessible description Chromium gives the element at ``selector`` (its AX tree), after
    checking that the element is an image."""
    cdp = page.context.new_cdp_session(page)
    try:
        doc = cdp.send("DOM.getDocument", {"depth": -1})
        nid = cdp.send("DOM.querySelector", {"nodeId": doc["root"]["nodeId"], "selector": selector})["nodeId"]
        node = cdp.send("Accessibility.getPartialAXTree", {"nodeId": nid, "fetchRelatives": False})["nodes"][0]
    finally:
        cdp.detach()
    assert not node.get("ignored") and node["role"]["value"] == "image", node
    return node.get("description", {}).get("value", "")


def assert_words_match(text: str, grid: np.ndarray) -> None:
    """``text`` names the three highest patches of ``grid`` (rows x cols) with their values, largest
    first, then the lowest one, to the 3 significant digits it writes."""
    m = re.search(r"Highest: (.*); lowest: (.*)\. (\d+) × (\d+) patches", text)
    assert m, text
    top = [(int(r), int(c), float(v)) for r, c, v in CELL.findall(m[1])]
    low = [(int(r), int(c), float(v)) for r, c, v in CELL.findall(m[2])]
    assert (int(m[3]), int(m[4])) == grid.shape, text
    assert len(top) == 3 and len(low) == 1, text
    want = np.sort(grid.ravel())[::-1][:3]
    for (r, c, shown), w in zip(top, want, strict=True):
        # the named patch holds the i-th largest value (ties may name another of the same value)
        assert np.isclose(grid[r, c], w, rtol=1e-5, atol=1e-9), (text, r, c, w)
        assert np.isclose(shown, grid[r, c], rtol=6e-3, atol=1e-12), (text, r, c, grid[r, c])
    r, c, shown = low[0]
    assert np.isclose(grid[r, c], grid.min(), rtol=1e-5, atol=1e-9), (text, grid.min())
    assert np.isclose(shown, grid[r, c], rtol=6e-3, atol=1e-12), (text, grid[r, c])


@pytest.mark.timeout(900)
def test_the_why_maps_say_their_highest_and_lowest_patches(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    open_page(page, base_url)
    upload(page, samples["cat"])
    page.click("[data-testid=why-tab]")

    def check(method: str) -> None:
        for fig, sel, want in (
            ("relevance-figure", "relevance-map", method),
            ("raw-figure", "raw-attention", "attention"),
        ):
            page.wait_for_function(
                """([fig, sel, m]) => document.getElementById(fig).dataset.state === 'ready'
                    && document.querySelector(`[data-testid=${sel}]`).dataset.method === m""",
                arg=[fig, sel, want],
            )
            # the map the page shows is the answer to its own last request for this method
            url = [u for u in seen if urlsplit(u).path.endswith("/relevance") and f"method={want}" in u][-1]
            answer = httpx.get(url, timeout=600).json()
            grid = np.asarray(answer["relevance"], dtype=np.float64)
            text = described(page, f"[data-testid={sel}]")
            assert text == page.text_content(f"[data-testid={sel}-words]")
            assert_words_match(text, grid)

    check("chefer")
    before = page.text_content("[data-testid=relevance-map-words]")
    # Another method: the description follows the new map.
    page.select_option("[data-testid=relevance-method]", "grad_attention")
    check("grad_attention")
    assert page.text_content("[data-testid=relevance-map-words]") != before


def test_the_compare_maps_say_their_numbers_and_colour_scales(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    page.check("[data-testid=compare-toggle]")

    def side_ready(name: str, head: str) -> dict:
        page.wait_for_function(
            """([n, h]) => { const c = document.querySelector(`[data-testid=compare-${n}]`);
                             return c.dataset.pending === '0' && c.dataset.head === h; }""",
            arg=[name, head],
        )
        return page.eval_on_selector(f"[data-testid=compare-{name}]", "c => ({...c.dataset})")

    def check(name: str, head: str) -> str:
        d = side_ready(name, head)
        assert d["dropped"] == "" and d["query"] == "cls"
        ans = api_rows(base_url, v["image"], layers=d["layer"], heads=head, query="cls")
        R, C = ans["tokens"]["grid"]
        row = np.asarray(ans["attention"][0][0][0], dtype=np.float64)
        grid = row[ans["tokens"]["num_prefix"] :].reshape(R, C)
        text = described(page, f"[data-testid=compare-{name}]")
        side = "Left" if name == "a" else "Right"
        assert text.startswith(f"{side} map, cat.png · layer {d['layer']} · head {head} · query CLS. "), text
        assert_words_match(text, grid)
        # The colour bar is one image named by its range (not two bare numbers in the figure's name).
        cb = page.locator(f"[data-testid=compare] .compare-side[data-side={name}] .compare-cb")
        assert cb.get_attribute("role") == "img"
        m = re.fullmatch(rf"Colour scale: (\w+) from ({NUMBER}) to ({NUMBER})", cb.get_attribute("aria-label"))
        assert m and np.isclose(float(m[2]), grid.min(), rtol=6e-3) and np.isclose(float(m[3]), grid.max(), rtol=6e-3)
        return text

    check("a", "0")
    before = check("b", "1")
    # Another head on the right: its words follow.
    page.select_option("[data-testid=compare-b-head]", "2")
    assert check("b", "2") != before


@pytest.mark.timeout(900)
def test_inside_a_head_the_scores_say_their_highest_and_lowest_patches(page, base_url, samples):
    open_page(page, base_url)
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    page.click("[data-testid=learn-tab]")
    page.set_default_timeout(LONG)
    v = wait_learn(page, image=iid)
    ans = explain(base_url, iid, layer=int(v["layer"]), head=int(v["head"]), query="cls")
    tokens = ans["tokens"]
    R, C = tokens["grid"]
    grid = np.asarray(ans["scores"], dtype=np.float64)[tokens["num_prefix"] : tokens["num_prefix"] + R * C]
    text = described(page, "[data-testid=learn-scores]")
    assert text.startswith("Scores. "), text
    assert_words_match(text, grid.reshape(R, C))
    mean = re.search(rf"centred on the mean, ({NUMBER})\.$", text)
    assert mean and np.isclose(float(mean[1]), grid.mean(), rtol=1e-3, atol=1e-3), (text, grid.mean())
