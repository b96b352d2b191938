"""The "Inside a head" view for Swin in real Chromium against a real server: the keys are the
query's window, drawn on the layer's stage grid with the window outlined (wrapped round the
image in a shifted block), hover numbers with the bias and the shift mask, padding keys listed,
the temperature recomputed over the window in the page. The server offers random-weight Swin v1
and v2 by configuration (HEADSCOPE_EXTRA_MODELS), like tests/browser/test_swin_page.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from helpers.learn import cell_center, entropy, explain, image_id, open_page, set_range, softmax, upload, wait_learn
from helpers.page import window_ink as ink
from helpers.swin_reference import SWIN_V1 as V1
from helpers.swin_reference import SWIN_V2 as V2

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def notes(page) -> list[str]:
    return page.eval_on_selector_all("[data-testid=learn-notes] li", "l => l.map(x => x.dataset.note)")


def hover_cell(page, selector: str, r: int, c: int, grid) -> dict:
    x, y = cell_center(page, selector, r, c, grid)
    page.mouse.move(x, y)
    token = r * grid[1] + c
    page.wait_for_function(f"() => document.querySelector('[data-testid=learn-hover]').dataset.token === '{token}'")
    return page.eval_on_selector("[data-testid=learn-hover]", "e => ({...e.dataset, text: e.textContent})")


def test_learn_view_of_a_shifted_swin_window(page, swin_server, samples, guard):
    url = swin_server.url
    open_page(page, url, f"?view=learn&model={V1}")
    upload(page, samples["cat"])  # 451 x 300 -> 224 x 336: stage 0 is 56 x 84 cells
    iid = image_id(samples["cat"].read_bytes())
    wait_learn(page, image=iid, model=V1)
    set_range(page, "[data-testid=layer]", "1", ("input",))  # stage 0, windows shifted by 3
    grid = (56, 84)
    wait_learn(page, image=iid, layer=1)
    # A click on the softmax map queries that cell: the bottom-left corner, whose window wraps round.
    x, y = cell_center(page, "[data-testid=learn-weights]", 55, 0, grid)
    page.mouse.click(x, y)
    v = wait_learn(page, image=iid, layer=1, query=55 * 84)
    ans = explain(url, iid, model=V1, layer=1, head=0, query="patch:55,0")
    assert ans["stage"] == 0 and ans["window"]["shift"] == [3, 3] and len(ans["key_tokens"]) == 49
    assert notes(page) == ["window", "shift-mask", "bias"]
    text = page.inner_text("[data-testid=learn-view]")
    for shape in ("X: 49 × 96", "49 × 32", "1 × 49", "3 × 32 = 96"):
        assert shape in text, shape
    assert "cell (55, 0) of stage 0" in page.inner_text("[data-testid=learn-status]")
    assert "7 × 7 = 49 places of its window" in text and "+ m_j" in text
    # The row is the window's: entropy and top keys from the answer's 49 scores.
    p = softmax(ans["scores"])
    assert math.isclose(float(v["entropy"]), entropy(p), rel_tol=1e-5)
    assert [int(t) for t in v["top"].split(",")] == [int(t) for t in np.argsort(-p, kind="stable")[:5]]
    mask = np.asarray(ans["mask"])
    kept = int(((mask == 0) & (np.asarray(ans["key_tokens"]) >= 0)).sum())
    assert kept == 4 * 3  # the corner's own region of the wrapped window: rows 52-55, cols 0-2
    assert page.get_attribute("[data-testid=learn-scores]", "data-keys") == str(kept)
    for canvas in ("[data-testid=learn-weights]", "[data-testid=learn-scores]"):
        k = ink(page, canvas)
        assert k["tl"] and k["tr"] and k["bl"] and k["br"], (canvas, k)  # four wrapped pieces outlined

    # Hover: a key of the query's region, a key masked apart (same window, other region), no key.
    h = hover_cell(page, "[data-testid=learn-scores]", 55, 1, grid)
    j = ans["key_tokens"].index(55 * 84 + 1)
    assert h["place"] == str(j)
    assert math.isclose(float(h["dot"]), ans["dot"][j], rel_tol=1e-6)
    assert math.isclose(float(h["score"]), ans["scores"][j], rel_tol=1e-6)
    assert math.isclose(float(h["bias"]), ans["bias"][j], rel_tol=1e-6)
    assert math.isclose(float(h["weight"]), p[j], rel_tol=1e-5)
    assert "q·k" in h["text"] and "+ bias" in h["text"] and "+ mask 0" in h["text"]
    h = hover_cell(page, "[data-testid=learn-weights]", 0, 0, grid)
    j = ans["key_tokens"].index(0)
    assert ans["mask"][j] == -100.0 and "mask -100" in h["text"]
    assert math.isclose(float(h["weight"]), p[j], rel_tol=1e-5, abs_tol=1e-30)
    h = hover_cell(page, "[data-testid=learn-scores]", 30, 40, grid)
    assert "outside the query's window" in h["text"] and "place" not in h

    # The temperature recomputes over the window in the page, with no request.
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/api/" in r.url else None)
    after = page.evaluate(
        """() => {
            const s = document.querySelector('[data-testid=temperature]');
            s.value = '0.7';
            s.dispatchEvent(new Event('input', {bubbles: true}));
            const e = document.querySelector('[data-testid=learn-view]').dataset;
            return {entropy: e.entropy, top: e.top, temperature: e.temperature};
        }"""
    )
    T = float(after["temperature"])
    pt = softmax(ans["scores"], T)
    assert math.isclose(float(after["entropy"]), entropy(pt), rel_tol=1e-5)
    assert float(after["entropy"]) > float(v["entropy"])  # warmer: flatter over the window
    assert [int(t) for t in after["top"].split(",")] == [int(t) for t in np.argsort(-pt, kind="stable")[:5]]
    page.wait_for_timeout(300)
    assert requests == [], requests
    set_range(page, "[data-testid=temperature]", "0")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("[data-testid=stage-scores]").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "learn-swin.png"), full_page=False)


def test_learn_view_of_swin_v2_says_cosine_and_lists_padding(page, swin_server, samples):
    url = swin_server.url
    open_page(page, url, f"?view=learn&model={V2}")
    upload(page, samples["cat"])  # 256 x 384: the last stage is 8 x 12 cells in 8 x 8 windows
    iid = image_id(samples["cat"].read_bytes())
    wait_learn(page, image=iid, model=V2, layer=11)
    # A cell of the right-hand window, which hangs 4 columns over the 12-column grid's edge.
    x, y = cell_center(page, "[data-testid=learn-weights]", 4, 10, (8, 12))
    page.mouse.click(x, y)
    v = wait_learn(page, image=iid, model=V2, layer=11, query=4 * 12 + 10)
    assert page.url.endswith("q=patch%3A32%2C80") or "q=patch%3A32%2C80&" in page.url
    ans = explain(url, iid, model=V2, layer=11, head=v["head"], query="patch:4,10")
    assert ans["query"] == 4 * 12 + 10 and ans["tokens"]["grid"] == [8, 12]
    pad = ans["window"]["padding"]
    assert pad == 32 and ans["steps"]["cosine"]
    assert notes(page) == ["window", "padding", "cosine", "bias"]
    chips = page.locator("[data-testid=learn-prefix] li")
    assert chips.count() == pad and "padding (place" in chips.first.inner_text()
    p = softmax(ans["scores"])
    assert math.isclose(float(v["entropy"]), entropy(p), rel_tol=1e-5)
    chips.first.hover()
    j = next(i for i, t in enumerate(ans["key_tokens"]) if t < 0)
    page.wait_for_function(f"() => document.querySelector('[data-testid=learn-hover]').dataset.place === '{j}'")
    h = page.eval_on_selector("[data-testid=learn-hover]", "e => ({...e.dataset, text: e.textContent})")
    assert "cos(q, k)" in h["text"] and "padding" in h["text"]
    assert math.isclose(float(h["weight"]), p[j], rel_tol=1e-5)
    assert "τ·cos(q, k_j)" in page.inner_text("[data-testid=stage-scores]")
