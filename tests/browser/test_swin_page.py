"""The page with Swin models offered by configuration, in real Chromium against a real server.

The server offers ``random:`` Swin-T and a ``local:`` Swin-T checkpoint of random weights written
here (HEADSCOPE_EXTRA_MODELS). Each layer is drawn on its stage's grid; the query's window is
outlined, in shifted blocks as the pieces that wrap round the edges.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from helpers.charts import show_chart
from helpers.page import window_ink
from helpers.swin_reference import SWIN_LOCAL as LOCAL
from helpers.swin_reference import SWIN_V1 as RANDOM

pytestmark = [pytest.mark.browser, pytest.mark.thorough]  # the everyday command leaves it to make test-long

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
OVERLAY = "[data-testid=overlay]"


@pytest.fixture(scope="module")
def base_url(swin_server) -> str:  # the page fixtures (guard, routes) follow this server
    return swin_server.url


def wait_view(page, **want) -> dict:
    page.wait_for_function(
        """want => {
            const s = document.querySelector('[data-testid=status]');
            const c = document.querySelector('[data-testid=overlay]');
            if (!c || c.hidden || s.dataset.state !== 'ready' || c.dataset.pending !== '0') return false;
            return Object.entries(want).every(([k, v]) => c.dataset[k] === v);
        }""",
        arg={k: str(v) for k, v in want.items()},
        timeout=180_000,
    )
    return page.eval_on_selector(OVERLAY, "c => ({...c.dataset})")


def open_with(page, base_url, model: str, sample) -> dict:
    page.goto(f"{base_url}/?model={model}")
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    page.set_input_files("[data-testid=image-input]", str(sample))
    return wait_view(page, model=model)


def set_layer(page, layer: int) -> None:
    page.fill("[data-testid=layer]", str(layer))


def click_cell(page, r: int, c: int, grid: tuple[int, int]) -> None:
    box = page.locator(OVERLAY).bounding_box()
    x, y = (c + 0.5) * box["width"] / grid[1], (r + 0.5) * box["height"] / grid[0]
    page.locator(OVERLAY).click(position={"x": x, "y": y})


def api_row(base_url, image_id, model, layer, head, query) -> list[float]:
    r = httpx.get(
        f"{base_url}/api/v1/attention/{image_id}",
        params={"model": model, "layers": str(layer), "heads": str(head), "query": query},
        timeout=120,
    )
    r.raise_for_status()
    return r.json()["attention"][0][0][0]


def test_layers_are_drawn_on_their_stage_grid_with_the_query_window(page, base_url, samples):
    v = open_with(page, base_url, RANDOM, samples["cat"])
    # Defaults: the last layer (stage 3, a 7 x 11 grid for the 451 x 300 cat), the centre cell of stage 0.
    assert (v["layer"], v["head"], v["query"]) == ("11", "0", "patch:28,42")
    assert (v["stage"], v["cells"], v["window"], v["shift"], v["marked"]) == ("3", "7,11", "7,7", "0,0", "3,5")
    assert "stage 3" in page.locator("[data-testid=layer-value]").inner_text()
    # The words name the cell on the shown stage's grid, with its token there (they named stage 0's
    # cell 28,42, outside this 7 x 11 grid, beside stage 3's token)
    assert "row q = patch (row 3, col 5) (token 38)" in page.locator("[data-testid=explain]").inner_text()
    # The map is the API's row of that stage cell, exactly (colour bar range).
    row = api_row(base_url, v["image"], RANDOM, 11, 0, "patch:3,5")
    assert float(v["min"]) == pytest.approx(min(row), abs=1e-9) and float(v["max"]) == pytest.approx(max(row), rel=1e-6)
    assert sum(x > 0 for x in row) <= 49  # one window

    # A shifted layer of stage 0 keeps the query's place: the stage cell under it.
    set_layer(page, 1)
    v = wait_view(page, layer=1)
    assert (v["stage"], v["cells"], v["shift"], v["marked"]) == ("0", "56,84", "3,3", "28,42")
    assert "stage 0, shifted windows" in page.locator("[data-testid=layer-value]").inner_text()
    row = api_row(base_url, v["image"], RANDOM, 1, 0, "patch:28,42")
    assert float(v["max"]) == pytest.approx(max(row), rel=1e-6)
    assert "4 × 4 px cells" in page.locator("[data-testid=explain]").inner_text()

    # A head the next stage lacks is clamped, not left blank.
    set_layer(page, 11)
    wait_view(page, layer=11)
    page.select_option("[data-testid=head]", "20")
    wait_view(page, layer=11, head=20)
    set_layer(page, 2)
    wait_view(page, layer=2, head=5)  # stage 1 has 6 heads
    # Rollout is offered only where it means something: listed, disabled, with the reason.
    opt = page.locator("[data-testid=head] option[value=rollout]")
    assert opt.is_disabled() and "different grids" in opt.inner_text()


def test_a_corner_query_in_a_shifted_block_outlines_the_wrapped_window(page, base_url, samples):
    v = open_with(page, base_url, LOCAL, samples["cat"])
    set_layer(page, 3)  # stage 1: 28 x 42 cells, shifted by 3
    wait_view(page, layer=3)
    click_cell(page, 55, 0, (56, 84))  # bottom-left cell of stage 0 -> (27, 0) on stage 1
    v = wait_view(page, layer=3, query="patch:55,0")
    assert (v["stage"], v["shift"], v["marked"]) == ("1", "3,3", "27,0")
    assert "wraps round the edges (4 dashed pieces)" in page.locator("[data-testid=explain]").inner_text()
    ink = window_ink(page)
    assert ink["tl"] and ink["tr"] and ink["bl"] and ink["br"], ink  # the four wrapped pieces
    # The attention itself stays in the query's own region of the wrapped window (rows 24-27, cols 0-2).
    row = api_row(base_url, v["image"], LOCAL, 3, 0, "patch:27,0")
    lit = {divmod(i, 42) for i, x in enumerate(row) if x > 1e-30}
    assert lit == {(r, c) for r in range(24, 28) for c in range(3)}
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(OVERLAY).scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "swin-shifted-window.png"), full_page=False)

    # Downloads ask for the stage of the shown layer and the query's cell on its grid.
    href = page.get_attribute("[data-testid=download-tensors]", "href")
    q = parse_qs(urlsplit(href).query)
    assert q["layers"] == ["2-3"] and q["query"] == ["patch:27,0"]
    assert httpx.get(base_url + href, timeout=120).status_code == 200


def test_analytics_for_windows(page, base_url, samples):
    open_with(page, base_url, RANDOM, samples["coffee"])
    show_chart(page, "chart-entropy", timeout=180_000)
    show_chart(page, "distance-heatmap", timeout=180_000)
    show_chart(page, "similarity-matrix")
    show_chart(page, "rank-chart")
    sinks = page.locator("[data-testid=chart-prefix]").inner_text()
    assert "Swin has no prefix tokens" in sinks
    assert "different grids" in page.locator("#analytics-status").inner_text()
    assert page.locator("[data-testid=drop-tokens]").is_disabled()
    assert page.locator("[data-testid=entropy-kind] option[value=cls]").is_disabled()
    # The model view has every stage's heads, blank where a stage has fewer (3/6/12/24 in Swin-T).
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=model-view] .tile').length === 2*5 + 2*8 + 6*14 + 2*26"
    )
    # Heads at a glance: the shown layer's heads (24 at layer 11) plus mean and max, all drawn.
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=head-grid] .tile').length === 26"
        " && !document.querySelector('[data-testid=head-grid] .tile.pending')"
    )


def test_switching_a_shown_image_to_swin_and_compare(page, base_url, samples):
    page.goto(base_url)
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    page.set_input_files("[data-testid=image-input]", str(samples["astronaut"]))
    wait_view(page, model="dinov2-s14-focus")
    page.select_option("[data-testid=model]", RANDOM)
    v = wait_view(page, model=RANDOM)
    assert v["stage"] == "3" and v["cells"] == "7,7" and v["query"] == "patch:28,28"
    page.check("[data-testid=compare-toggle]")
    page.select_option("[data-testid=compare-mode]", "layers")
    page.wait_for_function(
        "() => ['a', 'b'].every(s => document.querySelector(`[data-testid=compare-${s}]`).dataset.pending === '0')",
        timeout=180_000,
    )
    a = page.eval_on_selector("[data-testid=compare-a]", "c => ({...c.dataset})")
    b = page.eval_on_selector("[data-testid=compare-b]", "c => ({...c.dataset})")
    assert (a["layer"], b["layer"]) == ("11", "5")
