"""The Why view in real Chromium against a real server: the relevance map of a target beside the
raw attention, the method and target pickers (their requests), a box drawn on the saliency output
that becomes the target, and the faithfulness chart (curves and AUCs equal to the API's answer)
with its progress.

Every test gets a fresh page whose guard (tests/browser/conftest.py) fails it on a console
error, an uncaught exception, a dialog or a request to another host.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlsplit

import pytest

from helpers.api import follow_up
from helpers.charts import assert_matrix, plot_data, wait_plotted
from helpers.models import write_classifier
from helpers.page import image_id, open_page, upload
from helpers.server import Server
from helpers.swin_reference import SWIN_V1

pytestmark = [pytest.mark.browser, pytest.mark.thorough]  # the everyday command leaves it to make test-long

VIEW = "[data-testid=why-view]"
MAP = "[data-testid=relevance-map]"
RAW = "[data-testid=raw-attention]"
SLOW_MS = 240_000  # every forward here competes with the rest of the suite on a loaded machine
CLF = "local:test_vit@why_page_head.safetensors"  # the id the server lists the classifier under


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):  # the page fixtures (guard, routes) follow this server
    """The default model, a small classifier (class targets) and a Swin (refused), one server."""
    clf = write_classifier(tmp_path_factory.mktemp("why-page") / "why_page_head.safetensors")
    srv = Server({"HEADSCOPE_EXTRA_MODELS": json.dumps([clf, SWIN_V1])})
    yield srv.url
    srv.stop_cleanly()


def wait_map(page, sel: str, **want) -> dict:
    """Wait until the map canvas at ``sel`` shows an answer whose data-* match ``want`` (strings or
    regular expressions); returns its data-*."""
    page.wait_for_function(
        """([sel, want]) => {
            const c = document.querySelector(sel);
            return c && c.closest('figure').dataset.state === 'ready'
                && Object.entries(want).every(([k, v]) => new RegExp(`^(?:${v})$`).test(c.dataset[k] || ''));
        }""",
        arg=[sel, want],
    )
    return page.eval_on_selector(sel, "c => ({...c.dataset, png: c.toDataURL()})")


def queries(seen: list[str], what: str) -> list[dict]:
    """The query parameters of the requests seen to GET …/{what}."""
    out = []
    for url in seen:
        parts = urlsplit(url)
        if parts.path.endswith(f"/{what}"):
            out.append({k: v[0] for k, v in parse_qs(parts.query).items()})
    return out


def test_a_shared_link_opens_the_same_method_target_and_steps(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    open_page(page, base_url)
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    open_page(page, base_url, f"?image={iid}&view=why&method=grad_attention&target=box:20,30,200,200&steps=full")
    wait_map(page, MAP, method="grad_attention", target=re.escape("box:20,30,200,200"))
    assert page.input_value("[data-testid=relevance-method]") == "grad_attention"
    assert page.input_value("[data-testid=relevance-target]") == "box"
    assert page.input_value("[data-testid=faithfulness-steps]") == "full"
    assert page.is_visible("[data-testid=why-box]")
    # and the page writes what it shows back in the same spelling
    q = parse_qs(urlsplit(page.url).query)
    assert q["method"] == ["grad_attention"] and q["target"] == ["box:20,30,200,200"] and q["steps"] == ["full"]
    page.select_option("[data-testid=relevance-method]", "chefer")  # the default: not in the link
    wait_map(page, MAP, method="chefer", target=re.escape("box:20,30,200,200"))
    assert "method" not in parse_qs(urlsplit(page.url).query)


@pytest.mark.timeout(900)  # maps and a perturbation test: a minute or more on a loaded 2-core machine
def test_why_view_maps_pickers_box_and_faithfulness_chart(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    open_page(page, base_url)
    upload(page, samples["cat"])
    iid = image_id(samples["cat"].read_bytes())
    assert page.is_hidden(VIEW)
    page.click("[data-testid=why-tab]")
    page.wait_for_selector(VIEW, state="visible")
    assert "view=why" in page.url
    assert page.get_attribute("[data-testid=why-tab]", "aria-selected") == "true"

    # The map of the default target (the whole saliency output) by Chefer's rule, beside the raw
    # attention of the same target; the note says the whole output is a poor target.
    chefer = wait_map(page, MAP, method="chefer", target="output")
    raw = wait_map(page, RAW, method="attention", target="output")
    assert chefer["png"] != raw["png"]
    assert {"method": "chefer", "target": "output"}.items() <= queries(seen, "relevance")[0].items()
    assert page.input_value("[data-testid=relevance-target]") == "output"
    assert "poor target" in page.inner_text("[data-testid=why-target-note]")
    want = follow_up(base_url, iid, "relevance", method="chefer", target="output")
    assert f"{want['y']:.3g}" in page.inner_text("#relevance-caption")

    # The method picker asks for that method's map.
    page.select_option("[data-testid=relevance-method]", "grad_attention")
    grad = wait_map(page, MAP, method="grad_attention", target="output")
    assert grad["png"] != chefer["png"]
    assert any(q.get("method") == "grad_attention" for q in queries(seen, "relevance"))

    # A box drawn on the saliency output becomes the target (output-map pixels, end-exclusive).
    canvas = page.locator("[data-testid=why-saliency]")
    canvas.scroll_into_view_if_needed()
    r = canvas.bounding_box()
    page.mouse.move(r["x"] + 0.2 * r["width"], r["y"] + 0.2 * r["height"])
    page.mouse.down()
    page.mouse.move(r["x"] + 0.45 * r["width"], r["y"] + 0.4 * r["height"], steps=4)
    page.mouse.move(r["x"] + 0.6 * r["width"], r["y"] + 0.65 * r["height"], steps=4)
    page.mouse.up()
    boxed = wait_map(page, MAP, method="grad_attention", target=r"box:\d+,\d+,\d+,\d+")
    x0, y0, x1, y1 = map(int, boxed["target"][4:].split(","))
    h, w = follow_up(base_url, iid, "output")["input_size"]
    assert abs(x0 - 0.2 * w) <= 3 and abs(y0 - 0.2 * h) <= 3 and abs(x1 - 0.6 * w) <= 3 and abs(y1 - 0.65 * h) <= 3
    assert any(q.get("target") == boxed["target"] for q in queries(seen, "relevance"))
    assert page.input_value("[data-testid=relevance-target]") == "box"
    assert page.is_visible("[data-testid=why-box]")
    assert page.is_hidden("[data-testid=why-target-note]")
    wait_map(page, RAW, method="attention", target=re.escape(boxed["target"]))

    # The target picker goes back to the whole output (answered from the page's answers).
    page.select_option("[data-testid=relevance-target]", "output")
    wait_map(page, MAP, method="grad_attention", target="output")
    page.select_option("[data-testid=relevance-target]", "box")
    wait_map(page, MAP, method="grad_attention", target=re.escape(boxed["target"]))

    # The faithfulness test of the box: progress while it runs, then the curves with their AUCs.
    page.evaluate(
        """() => {
            window.__progress = [];
            const el = document.querySelector('[data-testid=faithfulness-progress]');
            new MutationObserver(() => window.__progress.push([el.dataset.state, el.hidden]))
                .observe(el, {attributes: true, childList: true, subtree: true});
        }"""
    )
    assert page.input_value("[data-testid=faithfulness-steps]") == "quick"
    page.click("[data-testid=faithfulness-run]")
    wait_plotted(page, "faithfulness-chart", timeout=600_000)
    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=done]")
    progress = page.evaluate("() => window.__progress")
    assert any(s == "running" and not hidden for s, hidden in progress), progress
    asked = queries(seen, "faithfulness")[-1]
    assert asked["target"] == boxed["target"] and asked["fractions"] == "0,0.25,0.5,0.75"
    assert asked["methods"] == "chefer,grad_attention,attention,random"  # the chosen method and the baseline set
    answer = follow_up(base_url, iid, "faithfulness", **{k: asked[k] for k in ("methods", "target", "fractions")})
    assert answer["cached"]  # the page's test, not a second one
    traces = plot_data(page, "faithfulness-chart")
    assert len(traces) == 2 * 4
    styles = page.evaluate(
        "() => document.querySelector('[data-testid=faithfulness-chart]').data.map(t => [t.meta, t.line.dash])"
    )
    for trace, (meta, dash) in zip(traces, styles, strict=True):
        curves = answer["methods"][meta["method"]]
        assert trace["x"] == answer["fractions"]
        assert_matrix(trace["y"], curves[meta["sign"]])
        assert f"AUC {curves['auc_' + meta['sign']]:.3f}" in trace["name"]
        assert dash == ("dash" if meta["method"] == "random" else "solid")
    assert {m["sign"] for m, _ in styles} == {"positive", "negative"}


@pytest.mark.timeout(900)
def test_a_test_the_view_no_longer_shows_is_given_up_on_the_server_too(page, base_url, samples):
    """Fractions changed while a test runs: the page closes the older test's request, the server
    cancels that test (it would hold one of this client's two heavy slots until its end), and the
    new test runs with no busy error. Found by a reviewer: a box's map, the new test and the old
    test together were three heavy requests of one client, and the page gave up after 3 tries."""
    page.set_default_timeout(SLOW_MS)
    failed: list[tuple[str, str]] = []
    page.on("requestfailed", lambda r: failed.append((r.url, r.failure or "")))
    open_page(page, base_url, "?view=why")
    upload(page, samples["astronaut"])
    iid = image_id(samples["astronaut"].read_bytes())
    wait_map(page, MAP, method="chefer", target="output")
    page.select_option("[data-testid=faithfulness-steps]", "full")
    with page.expect_request(lambda r: "/faithfulness?" in r.url) as first:
        page.click("[data-testid=faithfulness-run]")
    full = {k: v[0] for k, v in parse_qs(urlsplit(first.value.url).query).items()}
    assert "fractions" not in full  # the server's default, 0, 0.1, ..., 0.9
    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=running]")
    page.select_option("[data-testid=faithfulness-steps]", "quick")  # the asked test follows the fractions

    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=done]")
    assert page.is_hidden("[data-testid=error]")
    assert "Faithfulness test done" in page.inner_text("[data-testid=faithfulness-live]")
    assert [f for u, f in failed if u == first.value.url and "ABORTED" in f], failed
    # The server gave the older test up: its progress is idle again, not running on to its end.
    asked = {k: full[k] for k in ("methods", "target")}
    states = []
    for _ in range(100):
        states.append(follow_up(base_url, iid, "faithfulness/progress", **asked)["state"])
        if states[-1] == "idle":
            break
        page.wait_for_timeout(200)
    assert states[-1] == "idle", states


def test_a_classifier_explains_a_class_of_its_top_5_and_a_swin_says_why_not(page, base_url, samples):
    page.set_default_timeout(SLOW_MS)
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    open_page(page, base_url, f"?model={CLF}&view=why")
    assert page.is_visible(VIEW)
    upload(page, samples["coffee"])
    iid = image_id(samples["coffee"].read_bytes())
    wait_map(page, MAP, method="chefer", target="top")
    top5 = follow_up(base_url, iid, "output", model=CLF)["output"]["top5"]
    options = page.eval_on_selector_all("[data-testid=relevance-target] option", "o => o.map(x => x.value)")
    assert options == ["top"] + [f"class:{c['index']}" for c in top5]
    third = f"class:{top5[2]['index']}"
    page.select_option("[data-testid=relevance-target]", third)
    wait_map(page, MAP, method="chefer", target=third)
    assert any(q.get("target") == third and q.get("model") == CLF for q in queries(seen, "relevance"))
    assert page.is_hidden("[data-testid=why-target-note]")

    # A windowed model: the view says why, and asks the server for nothing it would refuse.
    before = len(queries(seen, "relevance"))
    open_page(page, base_url, f"?model={SWIN_V1}&view=why")
    upload(page, samples["coffee"])
    page.wait_for_selector("[data-testid=why-windowed]", state="visible")
    assert "Swin" in page.inner_text("[data-testid=why-windowed]")
    assert page.is_hidden("#why-body") and page.is_hidden("#faithfulness-panel")
    assert len(queries(seen, "relevance")) == before
