"""Head analytics on the page, in real Chromium against a real server: the stats charts against
GET …/stats, clicks that open heads, DINO mass masks, dropping sink tokens, the rollout strip
and compare mode.

Every test gets a fresh page whose guard (tests/browser/conftest.py) fails it on a console
error, an uncaught exception, a dialog or a request to another host.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from helpers import waiting
from helpers.charts import assert_matrix, click_plot, plot_data, show_chart
from helpers.learn import set_range
from helpers.page import OVERLAY, api_rows, assert_close, canvas_png, image_id, open_page, upload, wait_view

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = pytest.mark.browser

PANEL = "[data-testid=analytics]"
STATS_URL = re.compile(r"/api/v1/attention/[0-9a-f]+/stats")


# ------------------------------------------------------------------ helpers
def get_stats(base_url, iid) -> dict:
    r = httpx.get(f"{base_url}/api/v1/attention/{iid}/stats", timeout=60)
    r.raise_for_status()
    return r.json()


def wait_analytics(page) -> None:
    """Wait until the stats are in and every chart of the panel is drawn (scrolled to: a chart
    out of sight waits to be drawn)."""
    page.wait_for_selector(f"{PANEL}[data-state=ready]")
    for chart in (
        "chart-entropy",
        "distance-heatmap",
        "distance-scatter",
        "chart-prefix",
        "similarity-matrix",
        "rank-chart",
        "chart-row",
    ):
        show_chart(page, chart)


def eventually(check, timeout: float = 15.0):
    """Retry ``check`` (which asserts) until it passes or the time is up."""
    return waiting.eventually(check, timeout)


def mass_count(weights: list[float], fraction: float) -> int:
    """Smallest number of patches holding ``fraction`` of the weights (as app/stats.py counts)."""
    s = sorted(weights, reverse=True)
    total = sum(s)
    acc = 0.0
    n = 0
    for w in s:
        acc += w
        if acc / total < fraction - 1e-7:
            n += 1
    return n + 1


def count_pixels(page, selector: str, test: str) -> int:
    """How many pixels of a canvas satisfy the JS expression ``test`` over r, g, b."""
    return page.eval_on_selector(
        selector,
        f"""c => {{
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) {{
            const r = d[i], g = d[i + 1], b = d[i + 2];
            if ({test}) n++;
        }}
        return n;
    }}""",
    )


WHITE = "r > 235 && g > 235 && b > 235"
ORANGE = "r > 225 && g > 115 && g < 175 && b < 100"


# ------------------------------------------------------------------ the tests
def test_analytics_panel_shows_the_stats_and_opens_heads(page, base_url, samples):
    page.add_init_script("""window.__analyticsStates = [];
        new MutationObserver(() => {
            const p = document.querySelector('[data-testid=analytics]');
            if (p) window.__analyticsStates.push(p.dataset.state);
        }).observe(document, {attributes: true, subtree: true, attributeFilter: ['data-state']});""")
    open_page(page, base_url)
    assert page.get_attribute(PANEL, "data-state") == "idle"
    v = upload(page, samples["cat"])
    wait_analytics(page)
    states = page.evaluate("() => window.__analyticsStates")
    assert "loading" in states and states.index("loading") < states.index("ready"), states
    st = get_stats(base_url, v["image"])
    L, H = st["layers"], st["heads"]
    assert (L, H) == (12, 6)

    # Entropy: this query row (CLS, computed in the page), CLS row and all rows (from the stats).
    ent = plot_data(page, "entropy-heatmap")
    assert len(ent) == 1 and ent[0]["type"] == "heatmap"
    assert_matrix(ent[0]["z"], st["entropy_cls"], rel=1e-3, abs_=1e-4)
    page.select_option("[data-testid=entropy-kind]", "all")
    eventually(lambda: assert_matrix(plot_data(page, "entropy-heatmap")[0]["z"], st["entropy"]))
    page.select_option("[data-testid=entropy-kind]", "cls")
    eventually(lambda: assert_matrix(plot_data(page, "entropy-heatmap")[0]["z"], st["entropy_cls"]))

    # Mean attention distance: heat map and the scatter against depth (one dot per head and layer).
    dist = plot_data(page, "distance-heatmap")
    assert_matrix(dist[0]["z"], st["distance_px"])
    scatter = {t["name"]: t for t in plot_data(page, "distance-scatter")}
    for h in range(H):
        t = scatter[f"h{h}"]
        assert t["x"] == list(range(L))
        assert_matrix(t["y"], [st["distance_px"][layer][h] for layer in range(L)])
        assert t["customdata"] == [h] * L

    # Attention sinks: prefix mass over all rows and artifact mass.
    page.select_option("[data-testid=sink-kind]", "prefix-all")
    eventually(lambda: assert_matrix(plot_data(page, "chart-prefix")[0]["z"], st["prefix_mass"]))
    page.select_option("[data-testid=sink-kind]", "artifacts")
    eventually(lambda: assert_matrix(plot_data(page, "chart-prefix")[0]["z"], st["artifact_mass"]))
    assert "no high-norm artifact tokens" in page.locator("#sinks-hint").inner_text()

    # Head similarity of the current layer (11) and the rank per layer.
    assert_matrix(plot_data(page, "similarity-matrix")[0]["z"], st["similarity"][11])
    assert page.locator("#similarity-layer").inner_text() == "layer 11"
    page.select_option("[data-testid=similarity-kind]", "cos")
    eventually(lambda: assert_matrix(plot_data(page, "similarity-matrix")[0]["z"], st["cls_cosine"][11]))
    rank = {t["name"]: t for t in plot_data(page, "rank-chart")}
    assert rank["numerical rank"]["y"] == st["rank"]["numerical"]
    assert_matrix(rank["effective rank"]["y"], st["rank"]["effective"])

    # A click on a heat-map cell opens that head.
    click_plot(page, "distance-heatmap", 5, 3)
    wait_view(page, layer=3, head=5)

    # A click on a dot of the scatter: pick the dot farthest from the others of its layer.
    def gap(layer, h):
        ys = [st["distance_px"][layer][k] for k in range(H)]
        return min(abs(ys[h] - y) for k, y in enumerate(ys) if k != h)

    layer, head = max(((lay, h) for lay in range(L) for h in range(H) if (lay, h) != (3, 5)), key=lambda p: gap(*p))
    click_plot(page, "distance-scatter", layer, st["distance_px"][layer][head])
    wait_view(page, layer=layer, head=head)

    # A click on a row of the similarity matrix opens that head of the current layer.
    other = (head + 2) % H
    page.wait_for_function("l => document.querySelector('#similarity-layer').textContent === `layer ${l}`", arg=layer)
    click_plot(page, "similarity-matrix", 0, other)
    wait_view(page, layer=layer, head=other)

    # A click on the rank chart opens that layer.
    target = 6 if layer != 6 else 7
    click_plot(page, "rank-chart", target, st["rank"]["numerical"][target])
    wait_view(page, layer=target, head=other)

    page.mouse.move(5, 5)  # no hover label in the picture
    page.evaluate("() => window.scrollTo(0, 0)")  # the sticky bars at the top of a full-page shot
    page.wait_for_timeout(200)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "analytics.png"), full_page=True)


def test_stats_failure_is_shown(page, base_url, guard, samples):
    guard.allow_http_errors = True
    body = '{"error": {"code": "out_of_memory", "message": "no memory for the statistics", "request_id": "t"}}'
    page.route(STATS_URL, lambda route: route.fulfill(status=503, content_type="application/json", body=body))
    open_page(page, base_url)
    upload(page, samples["coffee"])
    page.wait_for_selector(f"{PANEL}[data-state=error]")
    err = page.locator("[data-testid=error]")
    err.wait_for(state="visible")
    assert err.get_attribute("data-code") == "out_of_memory"
    assert "no memory for the statistics" in err.inner_text()
    # The per-row charts still work.
    show_chart(page, "chart-entropy")


def test_mass_mask_outlines_k_patches(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    before = count_pixels(page, OVERLAY, WHITE)
    row = api_rows(base_url, v["image"], layers="11", heads="0", query="cls")["attention"][0][0][0]
    k = mass_count(row[1:], 0.6)

    page.check("[data-testid=mass-toggle]")
    v = wait_view(page, maskPatches=k, maskFraction="0.6")
    assert page.locator("[data-testid=mass-count]").inner_text() == f"{k} of 384 patches"
    # The server's count for the CLS row agrees.
    assert get_stats(base_url, v["image"])["mass_patches"][11][0] == k
    # The outline (white over a dark halo) is drawn.
    assert count_pixels(page, OVERLAY, WHITE) > before + 200

    page.fill("[data-testid=mass-slider]", "0.9")
    wait_view(page, maskPatches=mass_count(row[1:], 0.9), maskFraction="0.9")
    page.fill("[data-testid=mass-slider]", "0.1")
    wait_view(page, maskPatches=mass_count(row[1:], 0.1))

    # Another head and layer: K follows the row shown.
    page.fill("[data-testid=layer]", "3")
    page.select_option("[data-testid=head]", "2")
    row3 = api_rows(base_url, v["image"], layers="3", heads="2", query="cls")["attention"][0][0][0]
    wait_view(page, layer=3, head=2, maskPatches=mass_count(row3[1:], 0.1))

    page.uncheck("[data-testid=mass-toggle]")
    page.wait_for_function("() => !('maskPatches' in document.querySelector('[data-testid=overlay]').dataset)")


def test_drop_sink_tokens_renormalises_rows(page, base_url, samples):
    """No sample has high-norm tokens with the small test model: the stats answer is given two."""
    fake = {}

    def with_artifacts(route):
        resp = route.fetch()
        body = resp.json()
        norms = body["token_norms_last"]
        top = sorted(range(1, len(norms)), key=lambda i: -norms[i])[:2]
        body["artifacts"] = {**body["artifacts"], "tokens": top, "norms": [norms[i] for i in top]}
        fake.update(tokens=top, norms=[norms[i] for i in top])
        route.fulfill(response=resp, json=body)

    page.route(STATS_URL, with_artifacts)
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    page.wait_for_selector(f"{PANEL}[data-state=ready]")
    top = fake["tokens"]
    v = wait_view(page, artifacts=",".join(map(str, top)))

    # The artifact tokens are listed with their norm and ringed on the map.
    items = page.locator("[data-testid=artifact-list] [data-kind=artifact]")
    assert items.count() == 2
    for i, (tok, norm) in enumerate(zip(top, fake["norms"])):
        assert items.nth(i).get_attribute("data-index") == str(tok)
        assert f"norm {norm:.1f}" in items.nth(i).inner_text()
    assert count_pixels(page, OVERLAY, ORANGE) > 20

    row = api_rows(base_url, v["image"], layers="11", heads="0", query="cls")["attention"][0][0][0]
    plain_png = canvas_png(page)
    cb_max = page.locator("#cb-max").inner_text()

    # Prefix tokens dropped: the patches carry the whole row; the server's drop=prefix agrees.
    page.select_option("[data-testid=drop-tokens]", "prefix")
    v = wait_view(page, drop="prefix", dropped="0")
    assert_close(v["patchSum"], 1.0, rel=1e-5)
    s = sum(row[1:])
    assert_close(v["max"], max(row[1:]) / s)
    assert_close(v["min"], min(row[1:]) / s)
    server = api_rows(base_url, v["image"], layers="11", heads="0", query="cls", drop="prefix")
    assert server["dropped"] == [0]
    assert_close(v["max"], max(server["attention"][0][0][0][1:]))
    assert page.locator("#cb-max").inner_text() != cb_max
    assert "is-dropped" in page.get_attribute("[data-testid=prefix-list] [data-kind=cls]", "class")

    # Artifact tokens dropped: their columns are zero and the row is renormalised over the rest.
    page.select_option("[data-testid=drop-tokens]", "artifacts")
    v = wait_view(page, drop="artifacts", dropped=",".join(map(str, sorted(top))))
    kept = [0.0 if i in top else w for i, w in enumerate(row)]
    s = sum(kept)
    assert_close(v["patchSum"], sum(kept[1:]) / s)
    assert_close(v["max"], max(kept[1:]) / s)
    assert float(v["min"]) == 0.0
    assert canvas_png(page) != plain_png

    page.select_option("[data-testid=drop-tokens]", "prefix,artifacts")
    v = wait_view(page, drop="prefix,artifacts", dropped=",".join(map(str, sorted([0, *top]))))
    assert_close(v["patchSum"], 1.0, rel=1e-5)
    s = sum(kept[1:])
    assert_close(v["max"], max(kept[1:]) / s)
    # The page's drop value is the API's own spelling: the server agrees on the same string.
    server = api_rows(base_url, v["image"], layers="11", heads="0", query="cls", drop="prefix,artifacts")
    assert server["dropped"][0] == 0

    page.select_option("[data-testid=drop-tokens]", "none")
    wait_view(page, drop="none", dropped="")
    assert canvas_png(page) == plain_png


def test_rollout_strip_follows_its_options(page, base_url, samples):
    rollout_urls: list[str] = []
    page.on("request", lambda r: rollout_urls.append(r.url) if "aggregate=rollout" in r.url else None)
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    strip = page.locator("[data-testid=rollout-strip]")
    assert strip.is_hidden()

    page.select_option("[data-testid=head]", "rollout")
    wait_view(page, head="rollout")
    page.wait_for_selector("[data-testid=rollout-strip][data-loaded='1'][data-count='12']")
    assert strip.locator("canvas").count() == 12

    page.select_option("[data-testid=rollout-start]", "4")
    page.select_option("[data-testid=head-fusion]", "max")
    page.fill("[data-testid=discard-ratio]", "0.5")
    page.wait_for_selector(
        "[data-testid=rollout-strip][data-start='4'][data-fusion='max'][data-discard='0.5']"
        "[data-count='8'][data-loaded='1']"
    )
    assert strip.locator("canvas").count() == 12 - 4
    assert [strip.locator(".tile").nth(i).get_attribute("data-layer") for i in range(8)] == [
        str(i) for i in range(4, 12)
    ]

    # One GET for the whole strip: layers 4..11 with the options.
    want = {"layers": ["4-11"], "rollout_start": ["4"], "head_fusion": ["max"], "discard_ratio": ["0.5"]}
    hits = [u for u in rollout_urls if all(parse_qs(urlsplit(u).query).get(k) == val for k, val in want.items())]
    assert len(hits) == 1, rollout_urls

    # The main view shows the same rollout as the API.
    params = dict(query="cls", aggregate="rollout", rollout_start=4, head_fusion="max", discard_ratio=0.5)
    v = wait_view(page, layer=11, head="rollout", rollout="4,max,0.5")
    roll = api_rows(base_url, v["image"], layers="11", **params)["attention"][0][0][0]
    assert_close(v["max"], max(roll[1:]))
    assert_close(v["min"], min(roll[1:]))

    # A click on a map of the strip opens that layer.
    strip.locator(".tile[data-layer='6']").click()
    v = wait_view(page, layer=6, head="rollout", rollout="4,max,0.5")
    roll6 = api_rows(base_url, v["image"], layers="6", **params)["attention"][0][0][0]
    assert_close(v["max"], max(roll6[1:]))
    assert "selected" in strip.locator(".tile[data-layer='6']").get_attribute("class")

    # Before the start layer the product is empty: the CLS row puts nothing on the patches.
    page.fill("[data-testid=layer]", "2")
    v = wait_view(page, layer=2, head="rollout")
    assert float(v["max"]) == 0.0

    page.select_option("[data-testid=head]", "0")
    wait_view(page, head=0)
    assert strip.is_hidden()


@pytest.mark.thorough
def test_compare_mode_shows_two_views(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    panel = page.locator("[data-testid=compare]")
    assert panel.is_hidden()

    def side(name: str) -> dict:
        return page.eval_on_selector(f"[data-testid=compare-{name}]", "c => ({...c.dataset})")

    def wait_side(name: str, **want) -> dict:
        page.wait_for_function(
            """([name, want]) => {
            const c = document.querySelector(`[data-testid=compare-${name}]`);
            return c && c.dataset.pending === '0' && Object.entries(want).every(([k, v]) => c.dataset[k] === v);
        }""",
            arg=[name, {k: str(x) for k, x in want.items()}],
        )
        return side(name)

    page.check("[data-testid=compare-toggle]")
    panel.wait_for(state="visible")
    a = wait_side("a", image=v["image"], layer=11, head=0, query="cls")
    b = wait_side("b", image=v["image"], layer=11, head=1, query="cls")
    png = lambda name: page.eval_on_selector(f"[data-testid=compare-{name}]", "c => c.toDataURL('image/png')")  # noqa: E731
    assert png("a") != png("b")
    ans = api_rows(base_url, v["image"], layers="11", heads="0,1", query="cls")["attention"][0]
    assert_close(a["max"], max(ans[0][0][1:]))
    assert_close(b["max"], max(ans[1][0][1:]))
    # Each side has its own colour bar.
    cb = lambda name: page.locator(f".compare-side[data-side={name}] .cb-max").inner_text()  # noqa: E731
    assert cb("a") != cb("b")

    # Two layers of one head.
    page.select_option("[data-testid=compare-mode]", "layers")
    b = wait_side("b", head=0)
    assert b["layer"] != "11"
    page.select_option("[data-testid=compare-b-layer]", "2")
    b = wait_side("b", layer=2, head=0)
    row2 = api_rows(base_url, v["image"], layers="2", heads="0", query="cls")["attention"][0][0][0]
    assert_close(b["max"], max(row2[1:]))

    # Two images: the same layer and head of a sample, uploaded on demand.
    page.select_option("[data-testid=compare-b-image]", "sample:/static/samples/astronaut.png")
    astro = image_id(samples["astronaut"].read_bytes())
    b = wait_side("b", image=astro, layer=2, head=0)
    assert side("a")["image"] == v["image"]
    assert png("a") != png("b")
    shape = page.eval_on_selector("[data-testid=compare-b]", "c => c.width / c.height")
    assert abs(shape - 1.0) < 0.02  # the astronaut's own aspect ratio
    ans = api_rows(base_url, astro, layers="2", heads="0", query="cls")["attention"][0][0][0]
    assert_close(b["max"], max(ans[1:]))

    # Both sides follow the query: a click on a patch of the main view.
    box = page.locator(OVERLAY).bounding_box()
    page.locator(OVERLAY).click(position={"x": 4.5 * box["width"] / 24, "y": 8.5 * box["height"] / 16})
    wait_side("a", query="patch:8,4")
    b = wait_side("b", image=astro, query="patch:8,3")  # the same place on the 16 x 16 grid: (4.5 / 24) * 16 = 3

    # The map's temperature tempers the other image's side too (the docs said it stayed at T = 1).
    set_range(page, "[data-testid=map-temperature]", str(math.log10(2)))
    page.wait_for_function(
        """() => { const c = document.querySelector('[data-testid=compare-b]');
        return c.dataset.pending === '0' && Math.abs(Number(c.dataset.temperature) - 2) < 1e-9; }"""
    )
    hot = api_rows(base_url, astro, layers="2", heads="0", query="patch:8,3", temperature=2)["attention"][0][0][0]
    assert_close(side("b")["max"], max(hot[1:]))

    # A shared link opens the same comparison: the mode, both sides, the other image by its id.
    q = parse_qs(urlsplit(page.url).query)
    assert (q["compare"], q["a"], q["b"], q["t"]) == (["layers"], ["11,0"], [f"2,0,{astro}"], ["2"])
    other = page.context.new_page()  # another tab: no names, no session images
    open_page(other, base_url, "?" + urlsplit(page.url).query)
    other.wait_for_function(
        """want => ['a', 'b'].every((n) => { const c = document.querySelector(`[data-testid=compare-${n}]`);
            return c && c.dataset.pending === '0' && c.dataset.image === want[n]; })""",
        arg={"a": v["image"], "b": astro},
    )
    for name in ("a", "b"):
        got = other.eval_on_selector(f"[data-testid=compare-{name}]", "c => ({...c.dataset})")
        want = side(name)
        assert {k: got[k] for k in ("layer", "head", "query", "temperature", "max")} == {
            k: want[k] for k in ("layer", "head", "query", "temperature", "max")
        }
    assert other.input_value("[data-testid=compare-b-image]") == astro  # the picker lists the link's image
    assert other.input_value("[data-testid=compare-mode]") == "layers"
    other.close()

    page.uncheck("[data-testid=compare-toggle]")
    panel.wait_for(state="hidden")


@pytest.mark.thorough
def test_two_images_in_a_tab_opened_from_a_link_are_two_pictures(page, base_url, samples):
    """Such a tab knows neither the shown picture's name nor that it is the cat sample: the preset
    picked the cat sample, which was the shown picture again, and the titles said "null"."""
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    other = page.context.new_page()
    open_page(other, base_url, f"?image={v['image']}")
    wait_view(other, image=v["image"])
    other.check("[data-testid=compare-toggle]")
    other.select_option("[data-testid=compare-mode]", "images")
    astro = image_id(samples["astronaut"].read_bytes())  # the next sample
    other.wait_for_function(
        """id => { const c = document.querySelector('[data-testid=compare-b]');
            return c && c.dataset.pending === '0' && c.dataset.image === id; }""",
        arg=astro,
    )
    title = other.locator(".compare-side[data-side=a] .compare-title").inner_text()
    assert title.startswith(f"image {v['image'][:8]} · layer 11"), title
    assert "null" not in other.inner_text("#compare-a-words")
    other.close()
