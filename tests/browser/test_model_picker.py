"""The any-model picker in real Chromium: search, load with progress, switch; an unreachable hub.

The server runs with --any-model, HF_HUB_OFFLINE=1 and a prepared Hugging Face cache holding one
tiny model (tests/helpers/hub_standin.py): loading it needs no network, and a model that is not cached
gets the server's sentence about the hub in the picker.
"""

from __future__ import annotations

import httpx
import pytest

from helpers import fetch_faults
from helpers.hub_standin import offline_any_model_server, prepare_cache, weights
from helpers.server import SAMPLES
from helpers.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.thorough]  # the everyday command leaves it to make test-long

CACHED = "test_vit.r160_in1k"
MISSING = "test_vit2.r160_in1k"


@pytest.fixture(scope="module")
def picker_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    prepare_cache(root / "hub", CACHED, weights(CACHED, seed=1))
    with offline_any_model_server(root) as srv:
        yield srv


@pytest.fixture
def base_url(picker_server) -> str:  # the page and its guard use this server
    return picker_server.url


def test_pick_a_timm_model_by_name_and_see_it_load(page, base_url, guard):
    page.goto(base_url + "/")
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    page.set_input_files("[data-testid=image-input]", str(SAMPLES / "cat.png"))
    page.wait_for_function("() => document.querySelector('[data-testid=status]').dataset.state === 'ready'")

    page.click("[data-testid=model-search-open]")
    page.locator("[data-testid=model-result]").first.wait_for()  # every model before a word is typed
    page.fill("[data-testid=model-search]", "test_vit")
    results = page.locator("[data-testid=model-result]")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=model-result]').length === 3")
    names = results.evaluate_all("bs => bs.map(b => b.dataset.name)")
    assert names == [CACHED, MISSING, "test_vit3.r160_in1k"]
    assert "cached" in results.first.inner_text()
    page.fill("[data-testid=model-search]", "resnet50")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=model-results-count]').textContent.startsWith('No pretrained')"
    )

    # Not cached, hub offline: the server's sentence, and the page keeps its model.
    guard.allow_http_errors = True  # the 503 is the expected answer
    page.fill("[data-testid=model-search]", MISSING)
    page.locator(f"[data-testid=model-result][data-name='{MISSING}']").click()
    page.wait_for_selector("[data-testid=model-load][data-state=failed]")
    status = page.inner_text("[data-testid=model-load-status]")
    assert MISSING in status and "HF_HUB_OFFLINE" in status and "not in its Hugging Face cache" in status
    assert page.input_value("[data-testid=model]") == "random:test_vit"

    # Cached: loads, the menu offers it, the page switches to it and computes the maps with it.
    page.fill("[data-testid=model-search]", CACHED)
    page.locator(f"[data-testid=model-result][data-name='{CACHED}']").click()
    page.wait_for_function(f"() => document.querySelector('[data-testid=model]').value === 'timm:{CACHED}'")
    assert not page.locator("[data-testid=model-dialog]").evaluate("d => d.open")
    page.wait_for_function("() => document.querySelector('[data-testid=status]').dataset.state === 'ready'")
    options = page.locator("[data-testid=model] option").evaluate_all("os => os.map(o => o.value)")
    assert options == ["random:test_vit", f"timm:{CACHED}"]
    assert f"model=timm%3A{CACHED}" in page.url or f"model=timm:{CACHED}" in page.url
    assert page.locator("[data-testid=overlay]").evaluate("c => c.dataset.model || ''") in ("", f"timm:{CACHED}")


def test_the_picker_is_hidden_when_the_server_does_not_offer_it(browser, live_server, pace):
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(live_server.url + "/")
        pg.wait_for_function("() => document.body.dataset.ready === '1'")
        assert pg.locator("[data-testid=model-search-open]").is_hidden()
    finally:
        context.close()


def test_the_picker_finds_an_open_clip_model_and_says_its_weights_are_unreachable(page, base_url, guard):
    """open_clip's models are in the picker (issue 42); offline and not cached, choosing one gives
    the server's sentence (no download) and the page keeps its model."""
    pytest.importorskip("open_clip")
    page.goto(base_url + "/")
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    page.click("[data-testid=model-search-open]")
    page.fill("[data-testid=model-search]", "open_clip vit-b-32 openai")
    name = "ViT-B-32/openai"
    hit = page.locator(f"[data-testid=model-result][data-name='{name}']")
    hit.wait_for()
    assert "clip" in hit.inner_text()
    guard.allow_http_errors = True  # the 503 is the expected answer
    hit.click()
    page.wait_for_selector("[data-testid=model-load][data-state=failed]")
    status = page.inner_text("[data-testid=model-load-status]")
    assert name in status and "HF_HUB_OFFLINE" in status and "not in its Hugging Face cache" in status
    assert "open_clip:ViT-B-32 (the same model with random weights)" in status
    assert page.input_value("[data-testid=model]") == "random:test_vit"


def test_a_load_answered_after_another_model_was_chosen_does_not_switch_the_page(page, base_url, guard, pace):
    """A model chosen in the picker after another: the first one's late "ready" switched the page
    to it, over the later choice (here one the server refused at once)."""
    httpx.post(f"{base_url}/api/v1/models/catalog/{CACHED}/load", timeout=60)  # loaded: its POST answers "ready"
    wait_until(
        lambda: httpx.get(f"{base_url}/api/v1/models/catalog/{CACHED}/load", timeout=60).json()["state"] == "ready",
        pace.s(120),
        f"{CACHED} to load",
    )
    fetch_faults.install(page)
    page.goto(base_url + "/")
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    fetch_faults.delay(page, f"/catalog/{CACHED}/load", 1500)
    page.click("[data-testid=model-search-open]")
    page.fill("[data-testid=model-search]", "test_vit")
    page.locator(f"[data-testid=model-result][data-name='{CACHED}']").click()
    guard.allow_http_errors = True  # the 503 is the expected answer
    page.locator(f"[data-testid=model-result][data-name='{MISSING}']").click()
    page.wait_for_selector("[data-testid=model-load][data-state=failed]")
    page.wait_for_function(f"() => window.__log.some((e) => e.url.includes('/catalog/{CACHED}/load') && e.status)")
    page.wait_for_timeout(500)  # the page's handling of the late answer
    assert MISSING in page.inner_text("[data-testid=model-load-status]")
    assert page.input_value("[data-testid=model]") == "random:test_vit"
    assert page.locator("[data-testid=model-dialog]").evaluate("d => d.open")
