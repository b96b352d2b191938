"""The Ablation view in real Chromium against a real server: the model's output beside the
picture, head toggles that change it (with the difference map), importance with progress, and
the pruning curve.

Every test gets a fresh page whose guard (tests/browser/conftest.py) fails it on a console
error, an uncaught exception, a dialog or a request to another host.
"""

from __future__ import annotations

import json
import struct
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from helpers.api import follow_up
from helpers.charts import assert_matrix, click_plot, plot_data, wait_plotted
from helpers.page import ABLATION_VIEW, OUTPUT, canvas_png, image_id, open_page, upload, wait_output, wait_view

pytestmark = pytest.mark.browser

VIEW = ABLATION_VIEW
DIFF = "[data-testid=output-difference]"
PROGRESS = "[data-testid=importance-progress]"
SLOW_MS = 240_000  # every forward here competes with the rest of the suite on a loaded machine


def toggle(layer: int, head: int) -> str:
    return f"[data-testid=ablate-head][data-layer='{layer}'][data-head='{head}']"


def output_png(page, testid: str = "model-output") -> str:
    return page.eval_on_selector(f"[data-testid={testid}] canvas", "c => c.toDataURL()")


def test_toggles_change_the_models_output_and_show_the_difference(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url)
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    assert page.is_hidden(VIEW)
    page.click("[data-testid=ablation-tab]")
    page.wait_for_selector(VIEW, state="visible")
    assert "view=ablation" in page.url
    assert page.get_attribute("[data-testid=ablation-tab]", "aria-selected") == "true"
    wait_output(page, "")
    assert page.get_attribute(OUTPUT, "data-kind") == "saliency"
    assert page.is_visible("[data-testid=ablation-picture]")
    assert page.is_hidden(DIFF)
    base_png = output_png(page)
    assert page.locator("[data-testid=ablate-head]").count() == 12 * 6

    page.click(toggle(11, 0))
    assert page.get_attribute(toggle(11, 0), "aria-pressed") == "true"
    wait_output(page, "11:0")
    assert output_png(page) != base_png
    page.wait_for_selector(DIFF, state="visible")
    want = follow_up(base_url, iid, "output", ablate="11:0")["change"]["mean_abs_diff"]
    assert f"mean |Δ| {want:.4f}" in page.inner_text(DIFF)
    assert "1 of 72 heads off" in page.inner_text("[data-testid=ablate-count]")

    page.click(toggle(3, 2))
    wait_output(page, "3:2,11:0")
    two = output_png(page)
    assert two not in (base_png,)
    page.click(toggle(11, 0))  # back on
    wait_output(page, "3:2")
    assert page.get_attribute(toggle(11, 0), "aria-pressed") == "false"
    # The maps' tensors download holds the maps shown, with the head off (it held the model's own
    # maps under the same name), and its name says so.
    page.click("[data-testid=viewer-tab]")
    page.wait_for_selector("[data-testid=download-tensors][href*='ablate=3%3A2']")
    name = page.get_attribute("[data-testid=download-tensors]", "download")
    assert name == f"headscope-{iid[:12]}-dinov2-s14-focus-cls-ablate-3_2.safetensors"
    href = page.get_attribute("[data-testid=download-tensors]", "href")
    r = httpx.get(base_url + href, timeout=60)
    assert r.status_code == 200 and f'filename="{name}"' in r.headers["content-disposition"]
    (n,) = struct.unpack("<Q", r.content[:8])
    meta = json.loads(json.loads(r.content[8 : 8 + n])["__metadata__"]["headscope"])
    assert meta["ablated"] == [[3, 2]]
    page.click("[data-testid=ablation-tab]")
    page.wait_for_selector(VIEW, state="visible")
    # From the keyboard: the reset turns itself off but keeps focus (aria-disabled, not disabled).
    page.focus("[data-testid=ablate-reset]")
    page.keyboard.press("Enter")
    wait_output(page, "")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "ablate-reset"
    assert page.get_attribute("[data-testid=ablate-reset]", "aria-disabled") == "true"
    page.keyboard.press("Enter")  # off: nothing happens
    assert page.evaluate("() => document.activeElement.dataset.testid") == "ablate-reset"
    assert output_png(page) == base_png
    assert page.is_hidden(DIFF)
    assert page.locator("[data-testid=ablate-head][aria-pressed=true]").count() == 0


@pytest.mark.sweeps  # its own picture's sweep, reused by no other test: `make test-long`
@pytest.mark.timeout(1500)  # a sweep, a pruning curve and a gradient pass: minutes on a loaded 2-core machine
def test_importance_shows_with_progress_then_the_pruning_curve(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url, "?view=ablation")
    assert page.is_visible(VIEW)
    upload(page, samples["coffee"])
    iid = image_id(samples["coffee"].read_bytes())
    wait_output(page, "")
    # Record every state the progress bar goes through (a MutationObserver sees each one).
    page.evaluate(
        """() => {
            window.__progress = [];
            const el = document.querySelector('[data-testid=importance-progress]');
            const note = () => window.__progress.push(
                [el.dataset.state, el.getAttribute('aria-valuenow'), el.hidden, el.textContent.trim()]);
            new MutationObserver(note).observe(el, {attributes: true, childList: true, subtree: true});
        }"""
    )
    page.click("[data-testid=importance-run]")
    wait_plotted(page, "importance-heatmap", timeout=600_000)
    wait_plotted(page, "pruning-curve", timeout=600_000)
    page.wait_for_selector(f"{PROGRESS}[data-state=done]")
    seen = page.evaluate("() => window.__progress")
    running = [s for s in seen if s[0] == "running"]
    assert running and all(not s[2] for s in running), seen  # shown while it ran
    assert any("Head importance" in s[3] for s in running) and any("Pruning curve" in s[3] for s in running)
    assert "computed in" in page.inner_text(PROGRESS)

    imp = follow_up(base_url, iid, "importance")
    z = [t for t in plot_data(page, "importance-heatmap") if t["type"] == "heatmap"][0]["z"]
    assert_matrix(z, imp["importance"])
    curve = follow_up(base_url, iid, "pruning")
    line = plot_data(page, "pruning-curve")[0]
    assert line["x"] == curve["removed"]
    assert_matrix(line["y"], curve["change"])

    # the toggles are tinted by importance; a click on the heat map switches that head off
    assert page.eval_on_selector(toggle(8, 2), "b => b.style.getPropertyValue('--cell')")
    click_plot(page, "importance-heatmap", 4, 9)
    page.wait_for_selector(f"{toggle(9, 4)}[aria-pressed=true]")
    wait_output(page, "9:4")

    # the gradient method on demand, from the same control
    page.select_option("[data-testid=importance-method]", "gradient")
    page.wait_for_function(
        """() => { const el = document.querySelector('[data-testid=importance-heatmap]');
                   return ['1', 'waiting'].includes(el.dataset.rendered)
                       && (el.dataset.key || '').includes('gradient'); }""",
        timeout=600_000,
    )
    grad = follow_up(base_url, iid, "importance", method="gradient")
    z = [t for t in plot_data(page, "importance-heatmap") if t["type"] == "heatmap"][0]["z"]
    assert_matrix(z, grad["importance"])


def test_the_maps_view_shows_the_model_with_the_heads_switched_off(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url)
    upload(page, samples["astronaut"])
    page.fill("[data-testid=layer]", "11")
    wait_view(page, layer="11")
    page.wait_for_function("() => document.querySelector('[data-testid=overlay]').dataset.pending === '0'")
    before = canvas_png(page)
    assert page.is_hidden("[data-testid=maps-ablated]")

    page.click("[data-testid=ablation-tab]")
    wait_output(page, "")
    page.click(toggle(2, 1))
    wait_output(page, "2:1")

    # The maps' rows are asked again of the ablated model (GET …?ablate=2:1) once the maps show.
    # (statistics too: GET …/stats?ablate=2:1)
    def rows_ablated(r) -> bool:
        return "/api/v1/attention/" in r.url and "layers=all" in r.url and "ablate=2%3A1" in r.url

    with page.expect_response(rows_ablated) as resp:
        page.click("[data-testid=viewer-tab]")
    assert resp.value.status == 200
    page.wait_for_selector("[data-testid=maps-ablated]", state="visible")
    assert "1 head off (layer 2 head 1)" in page.inner_text("[data-testid=maps-ablated]")
    wait_view(page, layer="11")
    page.wait_for_function(
        "b => document.querySelector('[data-testid=overlay]').toDataURL('image/png') !== b", arg=before
    )

    # Its note hides itself once every head is on: the button's focus goes to the map, and is said.
    page.focus("[data-testid=maps-ablated-reset]")
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-testid=maps-ablated]", state="hidden")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "overlay"
    page.wait_for_function("() => /All heads on/.test(document.querySelector('[data-testid=announce]').textContent)")
    page.wait_for_function(
        "b => document.querySelector('[data-testid=overlay]').toDataURL('image/png') === b", arg=before
    )
    page.click("[data-testid=ablation-tab]")
    assert page.locator("[data-testid=ablate-head][aria-pressed=true]").count() == 0


@pytest.mark.thorough
def test_a_shared_link_shows_the_same_maps_heads_off_drop_and_rollout_included(page, base_url, samples):
    """Heads switched off change every view's maps: a link without them showed the model's own."""
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url)
    upload(page, samples["astronaut"])
    page.click("[data-testid=ablation-tab]")
    wait_output(page, "")
    page.click(toggle(2, 1))
    page.click(toggle(0, 3))
    wait_output(page, "0:3,2:1")
    page.click("[data-testid=viewer-tab]")
    page.select_option("[data-testid=head]", "rollout")
    page.select_option("[data-testid=head-fusion]", "max")
    page.select_option("[data-testid=drop-tokens]", "prefix")
    q = parse_qs(urlsplit(page.url).query)
    assert q["ablate"] == ["0:3,2:1"] and q["drop"] == ["prefix"] and q["rollout"] == ["0,max,0"]
    wait_view(page, head="rollout")
    page.wait_for_function("() => document.querySelector('[data-testid=overlay]').dataset.pending === '0'")
    shown = canvas_png(page)

    page.reload()
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    wait_view(page, head="rollout")
    page.wait_for_selector("[data-testid=maps-ablated]", state="visible")
    assert "2 heads off" in page.inner_text("[data-testid=maps-ablated]")
    assert page.input_value("[data-testid=drop-tokens]") == "prefix"
    assert page.input_value("[data-testid=head-fusion]") == "max"
    page.wait_for_function(
        "b => document.querySelector('[data-testid=overlay]').toDataURL('image/png') === b", arg=shown
    )
    page.click("[data-testid=ablation-tab]")
    wait_output(page, "0:3,2:1")
    assert page.locator("[data-testid=ablate-head][aria-pressed=true]").count() == 2
