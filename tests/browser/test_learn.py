"""The "Inside a head" view in real Chromium against a real server: the stages with the model's
numbers, the temperature slider (recomputed in the page, no request), hover numbers, queries, and
what differs for models without CLS, with registers, RoPE or a relative position bias."""

from __future__ import annotations

import json
import math
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import pytest

from helpers import fetch_faults
from helpers.learn import (
    LEARN,
    LONG,
    cell_center,
    entropy,
    explain,
    image_id,
    open_page,
    set_range,
    softmax,
    upload,
    wait_learn,
)
from helpers.page import ERROR, wait_view

pytestmark = pytest.mark.browser

STAGES = ["stage-x", "stage-qkv", "stage-scores", "stage-softmax", "stage-weighted", "stage-concat", "stage-proj"]


def test_learn_view_walks_one_heads_computation(page, base_url, samples):
    open_page(page, base_url)
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    page.click("[data-testid=learn-tab]")
    v = wait_learn(page, image=iid)
    assert page.is_hidden("#overlay") and page.is_visible(LEARN)
    assert parse_qs(urlsplit(page.url).query)["view"] == ["learn"]
    assert (v["layer"], v["head"], v["query"], v["temperature"]) == ("11", "0", "0", "1")
    for stage in STAGES:
        assert page.is_visible(f"[data-testid={stage}]"), stage
    text = page.inner_text(LEARN)
    for shape in ("385 × 384", "385 × 64", "384 × 64", "1 × 385", "1 × 64", "6 × 64 = 384"):
        assert shape in text, shape
    # the numbers are the model's: the same row as the API's explain answer
    ans = explain(base_url, iid, layer=11, head=0, query="cls")
    p = softmax(ans["scores"])
    assert math.isclose(float(v["entropy"]), entropy(p), rel_tol=1e-5)
    assert [int(t) for t in v["top"].split(",")] == [int(t) for t in np.argsort(-p, kind="stable")[:5]]
    shares = [
        float(s)
        for s in page.eval_on_selector_all("[data-testid=learn-bars] .bar-row", "r => r.map(x => x.dataset.share)")
    ]
    assert len(shares) == 7 and math.isclose(sum(shares), 1.0, abs_tol=1e-4)  # 6 heads + the bias
    y = np.asarray(ans["attn_output"])
    want0 = float(np.dot(ans["head_contributions"][0], y) / np.dot(y, y))
    assert math.isclose(shares[0], want0, rel_tol=1e-4, abs_tol=1e-6)
    notes = page.eval_on_selector_all("[data-testid=learn-notes] li", "l => l.map(x => x.dataset.note)")
    assert notes == ["abs-pos"]  # DINOv2: position embeddings only


def test_temperature_slider_recomputes_in_the_page_then_tempers_the_maps(page, base_url, samples, guard):
    open_page(page, base_url, "?view=learn")
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    v0 = wait_learn(page, image=iid)
    ans = explain(base_url, iid, layer=11, head=0, query="cls")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/api/" in r.url else None)
    before = page.eval_on_selector("[data-testid=learn-weights]", "c => c.toDataURL()")
    top_before = page.inner_text("[data-testid=learn-top]")
    # One input event, read back in the same task: recomputed synchronously, without a request.
    after = page.evaluate(
        """() => {
            const s = document.querySelector('[data-testid=temperature]');
            s.value = '-0.5';
            s.dispatchEvent(new Event('input', {bubbles: true}));
            const e = document.querySelector('[data-testid=learn-view]').dataset;
            return {entropy: e.entropy, top: e.top, temperature: e.temperature,
                    shown: document.querySelector('[data-testid=temperature-value]').textContent,
                    list: document.querySelector('[data-testid=learn-top]').innerText};
        }"""
    )
    T = float(after["temperature"])
    assert math.isclose(T, 10**-0.5, rel_tol=2e-3) and after["shown"] == "0.32"
    p = softmax(ans["scores"], T)
    assert math.isclose(float(after["entropy"]), entropy(p), rel_tol=1e-5)
    assert float(after["entropy"]) < float(v0["entropy"])  # a colder softmax is sharper
    assert [int(t) for t in after["top"].split(",")] == [int(t) for t in np.argsort(-p, kind="stable")[:5]]
    assert after["list"] != top_before
    assert page.eval_on_selector("[data-testid=learn-weights]", "c => c.toDataURL()") != before
    page.wait_for_timeout(300)
    assert requests == [], f"the slider made requests while sliding: {requests}"
    # Released: the page's maps follow (one GET of the cached capture at T).
    page.dispatch_event("[data-testid=temperature]", "change")
    assert parse_qs(urlsplit(page.url).query)["t"] == [str(T)]
    page.click("[data-testid=viewer-tab]")
    page.wait_for_function(
        """t => { const c = document.querySelector('[data-testid=overlay]');
                  return !c.hidden && c.dataset.temperature === t && c.dataset.pending === '0'; }""",
        arg=str(T),
        timeout=LONG,
    )
    assert any("temperature=" in u for u in requests)
    row = httpx.get(
        f"{base_url}/api/v1/attention/{iid}", params={"layers": 11, "heads": 0, "temperature": T}, timeout=120
    ).json()["attention"][0][0][0]
    assert math.isclose(float(page.eval_on_selector("#overlay", "c => c.dataset.max")), max(row[1:]), rel_tol=2e-5)
    assert page.input_value("[data-testid=map-temperature]") == page.input_value("[data-testid=temperature]")
    assert "temperature T = " in page.inner_text("[data-testid=explain]")
    # Back to the model itself from the maps' own control.
    set_range(page, "[data-testid=map-temperature]", "0")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=overlay]').dataset.temperature === '1'", timeout=LONG
    )
    assert "t" not in parse_qs(urlsplit(page.url).query)
    # "T = 1" is off at T = 1 but keeps its Tab stop (aria-disabled): pressed, it keeps focus.
    assert page.get_attribute("[data-testid=temperature-reset]", "aria-disabled") == "true"
    assert page.eval_on_selector("[data-testid=temperature-reset]", "b => b.disabled") is False


def test_hover_shows_the_numbers_of_a_key_and_a_click_queries_it(page, base_url, samples):
    open_page(page, base_url, "?view=learn")
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    set_range(page, "[data-testid=layer]", "9", ("input",))
    page.select_option("[data-testid=head]", "3")
    wait_learn(page, image=iid, layer=9, head=3)
    ans = explain(base_url, iid, layer=9, head=3, query="cls")
    grid = ans["tokens"]["grid"]
    r, c = 7, 15
    token = 1 + r * grid[1] + c
    x, y = cell_center(page, "[data-testid=learn-scores]", r, c, grid)
    page.mouse.move(x, y)
    page.wait_for_function(f"() => document.querySelector('[data-testid=learn-hover]').dataset.token === '{token}'")
    hover = page.eval_on_selector("[data-testid=learn-hover]", "e => ({...e.dataset, text: e.textContent})")
    assert math.isclose(float(hover["dot"]), ans["dot"][token], rel_tol=1e-6)
    assert math.isclose(float(hover["score"]), ans["scores"][token], rel_tol=1e-6)
    assert math.isclose(float(hover["weight"]), softmax(ans["scores"])[token], rel_tol=1e-5)
    assert "q·k" in hover["text"] and "scaled" in hover["text"] and "weight" in hover["text"]
    assert f"patch ({r}, {c})" in hover["text"]
    # the same key on the softmax map
    x, y = cell_center(page, "[data-testid=learn-weights]", 2, 3, grid)
    page.mouse.move(x, y)
    page.wait_for_function(
        f"() => document.querySelector('[data-testid=learn-hover]').dataset.token === '{1 + 2 * grid[1] + 3}'"
    )
    # a click makes that patch the query: a new answer for it, and the page's query follows
    page.mouse.click(x, y)
    v = wait_learn(page, query=1 + 2 * grid[1] + 3, layer=9, head=3)
    assert parse_qs(urlsplit(page.url).query)["q"] == ["patch:2,3"]
    assert "patch (2, 3)" in page.inner_text("#learn-title")
    # an aggregate in the maps view: this view follows head 0 and says so
    page.select_option("[data-testid=head]", "mean")
    wait_learn(page, head=0, query=v["query"])
    assert "head 0" in page.inner_text("[data-testid=learn-status]")


FAMILY_MODELS = {
    "random:vit_base_patch16_siglip_224": ["no-cls", "abs-pos"],
    "random:vit_small_patch14_reg4_dinov2": ["registers", "abs-pos"],
    "random:eva02_tiny_patch14_224": ["rope"],
    "random:beit_base_patch16_224": ["bias"],
}


@pytest.fixture(scope="module")
def family_server():
    from helpers.server import Server

    srv = Server({"HEADSCOPE_EXTRA_MODELS": json.dumps(list(FAMILY_MODELS))})
    yield srv
    srv.stop()
    assert "Traceback" not in srv.log()


@pytest.mark.parametrize("model", list(FAMILY_MODELS))
def test_learn_view_says_what_differs_for_every_family(page, family_server, samples, model):
    open_page(page, family_server.url, f"?view=learn&model={model}")
    upload(page, samples["astronaut"])
    iid = image_id(samples["astronaut"].read_bytes())
    v = wait_learn(page, image=iid, model=model)
    notes = page.eval_on_selector_all("[data-testid=learn-notes] li", "l => l.map(x => x.dataset.note)")
    assert notes == FAMILY_MODELS[model]
    ans = explain(family_server.url, iid, model=model, layer=v["layer"], head=v["head"], query=v["query"])
    assert math.isclose(float(v["entropy"]), entropy(softmax(ans["scores"])), rel_tol=1e-5)
    prefix = ans["tokens"]["num_prefix"]
    assert page.eval_on_selector_all("[data-testid=learn-prefix] li", "l => l.length") == prefix
    if model.endswith("siglip_224"):
        assert int(v["query"]) >= prefix == 0  # no CLS: a patch is the query
    if "beit" in model:  # hover shows the bias that is added to the score
        grid = ans["tokens"]["grid"]
        x, y = cell_center(page, "[data-testid=learn-scores]", 1, 1, grid)
        page.mouse.move(x, y)
        page.wait_for_function("() => /bias/.test(document.querySelector('[data-testid=learn-hover]').textContent)")


EVA_TINY = "random:eva02_tiny_patch14_224"  # 3 heads, where the default model has 6


@pytest.mark.thorough
def test_a_model_switch_keeps_what_was_chosen_meanwhile_and_asks_nothing_of_both_models(page, family_server, samples):
    """While the new model's answer is on its way, the state names the new model and still holds the
    old one's heads: the views asked the 3-head model for head 5 (422), and the answer put back the
    head chosen before the switch."""
    page.set_default_timeout(LONG)
    fetch_faults.install(page)
    open_page(page, family_server.url, "?view=learn")
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    page.select_option("[data-testid=head]", "5")
    page.wait_for_function("() => window.__log.some((e) => /explain.*head=5/.test(e.url) && e.status === 200)")
    fetch_faults.delay(page, "model=random%3Aeva02", 3000)
    page.select_option("[data-testid=model]", EVA_TINY)
    page.select_option("[data-testid=head]", "2")  # chosen while the switch is under way
    got = wait_view(page, image=iid, model=EVA_TINY)
    assert got["head"] == "2"
    page.wait_for_function(
        "() => window.__log.some((e) => /explain.*model=random%3Aeva02/.test(e.url) && e.status === 200)"
    )
    refused = [r for r in fetch_faults.requests(page) if r["status"] and r["status"] >= 400]
    assert not refused, refused
    assert page.is_hidden(ERROR)
