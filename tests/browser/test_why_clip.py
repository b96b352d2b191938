"""The Why view's text side in real Chromium against a real server whose default model is a
random-weight open_clip model: the target picker's "a phrase", the prompt box, the phrase's tokens
shaded by relevance under it, zero-shot labels as a ranked list whose labels switch the map,
LeGrad, and the faithfulness test with the phrase as its target, each equal to the API's answer.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("open_clip")

from helpers.api import follow_up
from helpers.charts import assert_matrix, plot_data, wait_plotted  # noqa: E402
from helpers.clip_models import MODEL_ID  # noqa: E402
from helpers.keyboard import axe_violations  # noqa: E402
from helpers.page import image_id, open_page, upload  # noqa: E402
from helpers.server import Server  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.thorough]  # the everyday command leaves it to make test-long

MAP = "[data-testid=relevance-map]"
SLOW_MS = 240_000
PHRASE = "a cat on a sofa"


@pytest.fixture(scope="module")
def base_url():  # the page fixtures (guard, routes) follow this server
    srv = Server(args=["--model", MODEL_ID])
    yield srv.url
    srv.stop_cleanly()


def wait_map(page, **want) -> dict:
    page.wait_for_function(
        """([sel, want]) => {
            const c = document.querySelector(sel);
            return c && c.closest('figure').dataset.state === 'ready'
                && Object.entries(want).every(([k, v]) => (c.dataset[k] || '') === v);
        }""",
        arg=[MAP, want],
    )
    return page.eval_on_selector(MAP, "c => ({...c.dataset})")


@pytest.mark.timeout(900)
def test_phrase_tokens_zero_shot_and_legrad(page, base_url, samples, guard):
    page.set_default_timeout(SLOW_MS)
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    open_page(page, base_url)
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    page.click("[data-testid=why-tab]")
    page.wait_for_selector("[data-testid=why-text]", state="visible")
    wait_map(page, method="chefer", target="embedding")
    options = page.eval_on_selector_all("[data-testid=relevance-target] option", "os => os.map(o => o.value)")
    assert options == ["embedding", "text"]
    assert page.is_disabled("[data-testid=relevance-method] option[value=legrad]")
    page.select_option("[data-testid=relevance-method]", "attnlrp")
    wait_map(page, method="attnlrp", target="embedding")

    # A phrase typed into the prompt box becomes the target; its tokens appear under it. AttnLRP
    # is not offered for a phrase: Chefer's map is shown and the menu and its hint say so (the
    # menu kept the switched-off method, and its 422 left the map empty).
    page.fill("[data-testid=relevance-phrase]", PHRASE)
    page.press("[data-testid=relevance-phrase]", "Enter")
    wait_map(page, method="chefer", target=f"text:{PHRASE}")
    assert page.input_value("[data-testid=relevance-target]") == "text"
    assert page.input_value("[data-testid=relevance-method]") == "chefer"
    assert page.text_content("#relevance-hint").startswith("AttnLRP is not offered for a phrase")
    want = follow_up(base_url, iid, "relevance", model=MODEL_ID, method="chefer", target=f"text:{PHRASE}")
    page.wait_for_selector("[data-testid=text-token]")
    tokens = page.eval_on_selector_all(
        "[data-testid=text-token]", "ts => ts.map(t => [t.dataset.token, Number(t.dataset.relevance)])"
    )
    assert [t for t, _ in tokens] == [t["token"] for t in want["text_tokens"]] == PHRASE.split()
    assert [r for _, r in tokens] == pytest.approx([t["relevance"] for t in want["text_tokens"]], rel=1e-6)
    # each token's share is written under it, for a screen reader and a finger (it was a tooltip)
    shares = page.eval_on_selector_all("[data-testid=text-token-share]", "ss => ss.map(s => s.textContent)")
    assert shares == [f"{100 * t['relevance']:.1f}%" for t in want["text_tokens"]]
    assert page.is_visible("[data-testid=text-token-share]")
    # The tokens' shading keeps the text readable (orange-600 under the light text was 3.4:1).
    assert axe_violations(page) == []

    # LeGrad is offered for a phrase.
    assert page.is_enabled("[data-testid=relevance-method] option[value=legrad]")
    page.select_option("[data-testid=relevance-method]", "legrad")
    wait_map(page, method="legrad", target=f"text:{PHRASE}")
    page.select_option("[data-testid=relevance-method]", "chefer")
    wait_map(page, method="chefer", target=f"text:{PHRASE}")

    # The faithfulness test with the phrase as its target: the curves and AUCs are the API's.
    page.click("[data-testid=faithfulness-run]")
    wait_plotted(page, "faithfulness-chart")
    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=done]")
    tests = [u for u in seen if urlsplit(u).path.endswith("/faithfulness")]
    asked = {k: v[0] for k, v in parse_qs(urlsplit(tests[-1]).query).items()}
    assert asked["target"] == f"text:{PHRASE}" and asked.get("model", MODEL_ID) == MODEL_ID
    answer = follow_up(base_url, iid, "faithfulness", **{k: asked[k] for k in ("methods", "target", "fractions")})
    assert answer["cached"] and answer["target"] == f"text:{PHRASE}"  # the page's test, not a second one
    traces = plot_data(page, "faithfulness-chart")
    metas = page.evaluate("() => document.querySelector('[data-testid=faithfulness-chart]').data.map(t => t.meta)")
    assert len(traces) == 2 * len(answer["methods"]) >= 4
    for trace, meta in zip(traces, metas, strict=True):
        curves = answer["methods"][meta["method"]]
        assert trace["x"] == answer["fractions"]
        assert_matrix(trace["y"], curves[meta["sign"]])
        assert f"AUC {curves['auc_' + meta['sign']]:.3f}" in trace["name"]

    # Zero-shot labels: a ranked list as the API ranks them; a label switches the map to its phrase.
    page.fill("[data-testid=zero-shot-labels]", "a dog, a cat, a red car")
    page.press("[data-testid=zero-shot-labels]", "Enter")
    page.wait_for_selector("[data-testid=zero-shot-list][data-state=ready] [data-testid=zero-shot-label]")
    shown = page.eval_on_selector_all("[data-testid=zero-shot-label]", "bs => bs.map(b => b.dataset.label)")
    ranked = follow_up(base_url, iid, "zero-shot", model=MODEL_ID, labels="a dog,a cat,a red car")["labels"]
    assert shown == [r["label"] for r in ranked]
    # Picked from the keyboard: the list is drawn again (the marked label moves) and focus stays on it.
    page.focus(f"[data-testid=zero-shot-label][data-label='{shown[-1]}']")
    page.keyboard.press("Enter")
    wait_map(page, method="chefer", target=f"text:{shown[-1]}")
    assert page.get_attribute(f"[data-testid=zero-shot-label][data-label='{shown[-1]}']", "aria-pressed") == "true"
    assert page.evaluate("() => document.activeElement.dataset.label") == shown[-1]
    assert page.input_value("[data-testid=relevance-phrase]") == shown[-1]

    # A phrase the model cannot read (78 tokens): the refusal is shown, and neither figure waits on
    # (the raw map is asked for only after the chosen one, so it said "Computing the map" forever).
    guard.allow_http_errors = True  # the 422s are the expected answers
    page.fill("[data-testid=relevance-phrase]", " ".join(["a"] * 76))
    page.press("[data-testid=relevance-phrase]", "Enter")
    page.wait_for_selector("[data-testid=error]:not([hidden])")
    assert "this model reads at most 77" in page.text_content("[data-testid=error]")
    page.wait_for_function(
        "() => ['relevance-figure', 'raw-figure']"
        ".every((id) => document.getElementById(id).dataset.state !== 'loading')"
    )
    # A phrase it can read: the refusal goes once the map is in (it stayed beside the good map).
    page.fill("[data-testid=relevance-phrase]", "a cat")
    page.press("[data-testid=relevance-phrase]", "Enter")
    wait_map(page, method="chefer", target="text:a cat")
    page.wait_for_selector("[data-testid=error]", state="hidden")
    # The choice of a method a phrase does not take is kept: to the phrase and back to the
    # embedding, AttnLRP is drawn again.
    page.select_option("[data-testid=relevance-target]", "embedding")
    wait_map(page, method="chefer", target="embedding")
    page.select_option("[data-testid=relevance-method]", "attnlrp")
    wait_map(page, method="attnlrp", target="embedding")
    page.select_option("[data-testid=relevance-target]", "text")
    wait_map(page, method="chefer", target="text:a cat")
    page.select_option("[data-testid=relevance-target]", "embedding")
    wait_map(page, method="attnlrp", target="embedding")
    assert page.input_value("[data-testid=relevance-method]") == "attnlrp"
