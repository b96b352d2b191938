"""The Ablation view with a windowed model (Swin) in real Chromium against a real server: the
model's own output (a classifier's classes) is shown; the head toggles and importance are not,
with a note saying why (the server answers 422 ``ablation_unsupported`` to head ablation there).
"""

from __future__ import annotations

import httpx
import pytest

from helpers.page import ABLATION_VIEW as VIEW
from helpers.page import OUTPUT, image_id, open_page, upload, wait_output
from helpers.swin_reference import SWIN_LOCAL as MODEL

pytestmark = pytest.mark.browser

SLOW_MS = 240_000


@pytest.fixture(scope="module")
def base_url(swin_server) -> str:  # the page fixtures (guard, routes) follow this server
    return swin_server.url


def test_a_windowed_model_shows_its_output_without_head_toggles(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url, f"?model={MODEL}&view=ablation")
    assert page.is_visible(VIEW)
    upload(page, samples["cat"])
    wait_output(page, "")
    assert page.get_attribute(OUTPUT, "data-kind") == "classes"
    iid = image_id(samples["cat"].read_bytes())
    want = httpx.get(f"{base_url}/api/v1/attention/{iid}/output", params={"model": MODEL}, timeout=600).json()
    top = want["output"]["top5"][0]
    assert top["label"] in page.inner_text(OUTPUT)
    assert page.is_visible("[data-testid=ablation-windowed]")
    assert "Swin" in page.inner_text("[data-testid=ablation-windowed]")
    assert page.is_hidden("[data-testid=ablate-grid]")
    assert page.is_hidden("[data-testid=importance-run]")
    assert page.is_hidden("[data-testid=output-difference]")
