"""The page at / walked the way a person uses it, in real Chromium against a real server.

Every test gets a fresh page whose guard (tests/browser/conftest.py) fails it on a console
error, an uncaught exception, a dialog or a request to another host.
"""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from PIL import Image

from helpers import fetch_faults
from helpers.charts import show_chart
from helpers.learn import set_range
from helpers.page import (
    ERROR,
    OVERLAY,
    STATUS,
    api_rows,
    assert_close,
    canvas_png,
    click_cell,
    image_id,
    open_page,
    patch_range,
    pixel_stats,
    upload,
    view,
    wait_scroll_settled,
    wait_view,
)

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = pytest.mark.browser


def test_upload_shows_overlay_heads_model_view_and_charts(page, base_url, samples):
    open_page(page, base_url)
    assert page.locator(OVERLAY).is_hidden()
    assert page.get_attribute(STATUS, "data-state") == "idle"
    assert page.locator("[data-testid=model]").input_value() == "dinov2-s14-focus"

    v = upload(page, samples["cat"])
    # Defaults: the last layer, head 0, the CLS row.
    assert (v["layer"], v["head"], v["query"], v["marked"]) == ("11", "0", "cls", "")
    assert page.locator("[data-testid=filename]").inner_text() == "cat.png"

    st = pixel_stats(page)
    assert st["std"] > 15 and st["colours"] > 500, st  # a picture, not a blank canvas
    assert abs(st["w"] / st["h"] - 451 / 300) < 0.01  # the image's own aspect ratio, no crop
    assert float(v["max"]) > float(v["min"]) >= 0

    # The overlay is the CLS row of layer 11, head 0 exactly: compare the colour bar range to the API.
    ans = api_rows(base_url, v["image"], layers="11", heads="0", query="cls")
    assert ans["tokens"]["grid"] == [16, 24]
    lo, hi = patch_range(ans["attention"][0][0][0], 1)
    assert_close(v["min"], lo)
    assert_close(v["max"], hi)

    # Colour bar, prefix tokens, heads at a glance and the model view.
    assert page.locator("#cb-max").inner_text() != ""
    cls_item = page.locator("[data-testid=prefix-list] [data-kind=cls]")
    assert_close(cls_item.get_attribute("data-value"), ans["attention"][0][0][0][0])
    tiles = page.locator("[data-testid=head-grid] .tile")
    assert tiles.count() == 6 + 3
    assert page.locator("[data-testid=head-grid] .tile.selected").get_attribute("data-head") == "0"
    page.wait_for_function("() => document.querySelectorAll('[data-testid=model-view] .tile').length === 12 * 9")
    help_text = page.locator("[data-testid=explain]").inner_text()
    assert "softmax(QKᵀ/√d)" in help_text and "layer 11, head 0" in help_text

    # Plotly charts are drawn when scrolled to (and the CSP did not stop them: the guard checks the
    # console); none is on the first screen, so none was drawn before.
    assert page.eval_on_selector_all(".chart[data-rendered='1']", "cs => cs.length") == 0
    for chart in ("chart-entropy", "chart-prefix", "chart-row"):
        show_chart(page, chart)
    assert page.locator("[data-testid=chart-row] .scatterlayer .trace").count() == 2
    assert page.locator("[data-testid=chart-entropy] .hm").count() == 1
    # a printed page has them all, scrolled to or not
    page.evaluate("() => window.dispatchEvent(new Event('beforeprint'))")
    states = page.eval_on_selector_all(
        "[data-testid=analytics] .chart", "cs => cs.map(c => [c.id, c.dataset.rendered, !!c.querySelector('svg')])"
    )
    assert len(states) == 7 and all(r == "1" and svg for _, r, svg in states), states

    # The rollout tiles arrive from the server.
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=head-grid] .tile[data-head=rollout]')"
        ".classList.contains('pending')"
    )
    page.wait_for_timeout(200)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-cat.png"), full_page=True)


def test_layer_head_and_aggregates_change_the_overlay(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    before = canvas_png(page)

    page.fill("[data-testid=layer]", "3")
    wait_view(page, layer=3, head=0)
    at_layer3 = canvas_png(page)
    assert at_layer3 != before

    page.select_option("[data-testid=head]", "2")
    wait_view(page, layer=3, head=2)
    assert canvas_png(page) != at_layer3

    # mean and max over heads are computed in the page: check them against the API's rows.
    ans = api_rows(base_url, v["image"], layers="3", heads="all", query="cls")
    rows = [h[0] for h in ans["attention"][0]]
    mean = [sum(col) / len(col) for col in zip(*rows)]
    peak = [max(col) for col in zip(*rows)]
    page.select_option("[data-testid=head]", "mean")
    v = wait_view(page, layer=3, head="mean")
    assert_close(v["min"], min(mean[1:]))
    assert_close(v["max"], max(mean[1:]))
    page.select_option("[data-testid=head]", "max")
    v = wait_view(page, layer=3, head="max")
    assert_close(v["max"], max(peak[1:]))

    # rollout comes from GET ...&aggregate=rollout.
    page.select_option("[data-testid=head]", "rollout")
    v = wait_view(page, layer=3, head="rollout")
    roll = api_rows(base_url, v["image"], layers="3", query="cls", aggregate="rollout")
    lo, hi = patch_range(roll["attention"][0][0][0], 1)
    assert_close(v["min"], lo)
    assert_close(v["max"], hi)

    # A click on a thumbnail of the model view opens it.
    page.click("[data-testid=model-view] .tile[data-layer='7'][data-head='4']")
    wait_view(page, layer=7, head=4)
    # ... and on a tile of heads at a glance.
    page.click("[data-testid=head-grid] .tile[data-head='1']")
    wait_view(page, layer=7, head=1)

    # Opacity and the patch grid change the drawing, not the data.
    same = canvas_png(page)
    page.fill("[data-testid=opacity]", "0.2")
    wait_view(page, opacity="0.2")
    assert canvas_png(page) != same
    page.check("[data-testid=patch-grid-toggle]")
    wait_view(page, grid="1")


def test_keyboard_steps_layer_and_head(page, base_url, samples):
    open_page(page, base_url)
    upload(page, samples["cat"])
    page.locator("h1").click()  # focus outside the form controls
    page.keyboard.press("ArrowDown")
    wait_view(page, layer=10, head=0)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowUp")
    wait_view(page, layer=10)
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    wait_view(page, layer=10, head=2)
    page.keyboard.press("ArrowLeft")
    wait_view(page, head=1)
    for _ in range(8):  # past the last head: mean, max, rollout, then it stops
        page.keyboard.press("ArrowRight")
    wait_view(page, head="rollout")
    for _ in range(12):
        page.keyboard.press("ArrowUp")
    wait_view(page, layer=11, head="rollout")
    assert page.locator("[data-testid=layer]").input_value() == "11"
    assert page.locator("[data-testid=head]").input_value() == "rollout"


def test_clicking_a_patch_queries_it_and_marks_it(page, base_url, samples):
    open_page(page, base_url)
    v0 = upload(page, samples["cat"])
    cls_value = page.get_attribute("[data-testid=prefix-list] [data-kind=cls]", "data-value")

    click_cell(page, 5, 7, (16, 24))
    v = wait_view(page, query="patch:5,7")
    assert v["marked"] == "5,7" and v["token"] == str(1 + 5 * 24 + 7)
    assert page.locator("[data-testid=query-mode]").input_value() == "patch"
    ans = api_rows(base_url, v0["image"], layers="11", heads="0", query="patch:5,7")
    lo, hi = patch_range(ans["attention"][0][0][0], 1)
    assert_close(v["max"], hi)
    page.wait_for_function(
        "v => document.querySelector('[data-testid=prefix-list] [data-kind=cls]').dataset.value !== v", arg=cls_value
    )

    # The marker (pink inside black) is drawn on the edge of the chosen cell.
    marked = page.eval_on_selector(
        OVERLAY,
        """c => {
        const ctx = c.getContext('2d');
        const x0 = Math.round(7 * c.width / 24), x1 = Math.round(8 * c.width / 24);
        const y0 = Math.round(5 * c.height / 16);
        let hits = 0;
        for (let y = y0 - 1; y <= y0 + 1; y++) {
            const d = ctx.getImageData(x0, y, x1 - x0, 1).data;
            for (let i = 0; i < d.length; i += 4)
                if (d[i] > 200 && d[i + 1] < 110 && d[i + 2] > 70 && d[i + 2] < 150) hits++;
        }
        return hits;
    }""",
    )
    assert marked > 5

    # The URL follows; Escape goes back to the CLS row.
    assert parse_qs(urlsplit(page.url).query)["q"] == ["patch:5,7"]
    page.locator("h1").click()
    page.keyboard.press("Escape")
    wait_view(page, query="cls", marked="")

    # Hover mode follows the pointer; without it, Shift does the same.
    page.check("[data-testid=hover-toggle]")
    box = page.locator(OVERLAY).bounding_box()
    page.mouse.move(box["x"] + 3.5 * box["width"] / 24, box["y"] + 2.5 * box["height"] / 16)
    wait_view(page, query="patch:2,3")
    page.uncheck("[data-testid=hover-toggle]")
    page.mouse.move(box["x"] + 10.5 * box["width"] / 24, box["y"] + 12.5 * box["height"] / 16)
    page.wait_for_timeout(100)
    assert view(page)["query"] == "patch:2,3"
    page.keyboard.down("Shift")
    page.mouse.move(box["x"] + 11.5 * box["width"] / 24, box["y"] + 12.5 * box["height"] / 16)
    page.keyboard.up("Shift")
    wait_view(page, query="patch:12,11")
    assert "patch (12, 11)" in page.locator("[data-testid=readout]").inner_text()


def test_samples_paste_and_drop_bring_images(page, base_url, samples):
    open_page(page, base_url)
    credits = page.locator("[data-testid=credits]")
    assert "CC0" in credits.inner_text() and credits.locator("a").get_attribute("href") == "/static/samples/CREDITS.md"

    page.click("[data-testid=sample-astronaut]")
    v = wait_view(page, image=image_id(samples["astronaut"].read_bytes()))
    assert page.locator("[data-testid=filename]").inner_text() == "astronaut.png"
    st = pixel_stats(page)
    assert abs(st["w"] / st["h"] - 1) < 0.01

    page.evaluate("""async () => {
        const blob = await (await fetch('/static/samples/coffee.png')).blob();
        const dt = new DataTransfer();
        dt.items.add(new File([blob], 'pasted-coffee.png', {type: 'image/png'}));
        document.dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt, bubbles: true}));
    }""")
    wait_view(page, image=image_id(samples["coffee"].read_bytes()))
    assert page.locator("[data-testid=filename]").inner_text() == "pasted-coffee.png"

    page.evaluate("""async () => {
        const blob = await (await fetch('/static/samples/rocket.jpg')).blob();
        const dt = new DataTransfer();
        dt.items.add(new File([blob], 'dropped-rocket.jpg', {type: 'image/jpeg'}));
        const zone = document.querySelector('[data-testid=overlay]');
        for (const type of ['dragenter', 'dragover', 'drop'])
            zone.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""")
    v = wait_view(page, image=image_id(samples["rocket"].read_bytes()))
    assert page.locator("[data-testid=filename]").inner_text() == "dropped-rocket.jpg"
    assert v["layer"] == "11"


def test_url_keeps_the_view(page, base_url, samples):
    open_page(page, base_url)
    upload(page, samples["coffee"])
    page.fill("[data-testid=layer]", "4")
    page.select_option("[data-testid=head]", "max")
    click_cell(page, 3, 9, (16, 24))
    v = wait_view(page, layer=4, head="max", query="patch:3,9")
    # The display choices travel too: colour map, opacity, grid, smoothing, the mass mask, the charts' modes.
    page.select_option("[data-testid=colormap]", "magma")
    set_range(page, "[data-testid=opacity]", "0.85")
    page.check("[data-testid=patch-grid-toggle]")
    page.check("[data-testid=smooth-toggle]")
    page.check("[data-testid=mass-toggle]")
    set_range(page, "[data-testid=mass-slider]", "0.45")
    page.select_option("[data-testid=entropy-kind]", "all")
    page.select_option("[data-testid=sink-kind]", "artifacts")
    page.select_option("[data-testid=similarity-kind]", "cos")
    q = parse_qs(urlsplit(page.url).query)
    assert q["image"] == [v["image"]] and q["layer"] == ["4"] and q["head"] == ["max"]
    assert q["model"] == ["dinov2-s14-focus"]
    display = {"cmap": "magma", "opacity": "0.85", "grid": "1", "smooth": "1", "mask": "0.45"}
    display |= {"entropy": "all", "sinks": "artifacts", "sim": "cos"}
    assert {k: q[k][0] for k in display if k in q} == display
    controls = """() => Object.fromEntries(['colormap', 'opacity', 'mass-slider', 'entropy-kind', 'sink-kind',
        'similarity-kind', 'patch-grid-toggle', 'smooth-toggle', 'mass-toggle'].map((id) => {
          const el = document.querySelector(`[data-testid=${id}]`);
          return [id, el.type === 'checkbox' ? el.checked : el.value]; }))"""
    chosen = page.evaluate(controls)
    wait_view(page, layer=4, head="max", query="patch:3,9")
    shown = canvas_png(page)

    page.reload()
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    v2 = wait_view(page, image=v["image"], layer=4, head="max", query="patch:3,9")
    assert v2["marked"] == "3,9"
    assert page.evaluate(controls) == chosen
    assert canvas_png(page) == shown
    assert page.locator("[data-testid=filename]").inner_text() == "coffee.png"

    # The Ablation view's importance method.
    open_page(page, base_url, f"?image={v['image']}&view=ablation&importance=gradient")
    page.wait_for_function("() => document.querySelector('[data-testid=importance-method]').value === 'gradient'")
    assert parse_qs(urlsplit(page.url).query)["importance"] == ["gradient"]


@pytest.mark.thorough
def test_shared_links_speak_the_apis_query_grammar(page, base_url, samples):
    """?q= takes what the API's `query` takes for one row (a token index, patch:R,C counted from
    the far edge with a minus, cls) and the page writes it back in its one spelling."""
    open_page(page, base_url)
    v = upload(page, samples["cat"])  # 1 prefix token (CLS) + 16 x 24 patches
    for q, want, marked in (
        ("17", "patch:0,16", "0,16"),  # token 17 is a patch
        ("patch:-1,-1", "patch:15,23", "15,23"),
        ("0", "cls", ""),
        ("tok:0", "cls", ""),  # the page's own spelling before: links shared then still open
    ):
        open_page(page, base_url, f"?image={v['image']}&layer=3&head=1&q={q}")
        got = wait_view(page, image=v["image"], layer=3, query=want)
        assert got["marked"] == marked, (q, got)
        assert parse_qs(urlsplit(page.url).query)["q"] == [want]
    # The query is the API's: the page's map is the API's row for it.
    ans = api_rows(base_url, v["image"], layers="3", heads="1", query="17")
    open_page(page, base_url, f"?image={v['image']}&layer=3&head=1&q=17")
    got = wait_view(page, image=v["image"], layer=3, query="patch:0,16")
    lo, hi = patch_range(ans["attention"][0][0][0], 1)
    assert_close(got["min"], lo)
    assert_close(got["max"], hi)


def test_a_temperature_chosen_while_an_image_loads_draws_that_temperature(page, base_url, samples):
    """The first answer's rows are of the temperature it was asked at: a slider moved meanwhile asks
    for the new one's rows (they were labelled with the new T and drawn at the old one)."""
    fetch_faults.install(page)
    open_page(page, base_url)
    fetch_faults.delay(page, r"/api/v1/attention(\?|$)", 2500)
    page.set_input_files("[data-testid=image-input]", str(samples["cat"]))
    page.wait_for_function("() => document.querySelector('[data-testid=status]').dataset.state === 'busy'")
    set_range(page, "[data-testid=map-temperature]", str(math.log10(2)))
    iid = image_id(samples["cat"].read_bytes())
    v = wait_view(page, image=iid, layer=11, head="0", query="cls", temperature="2")
    page.wait_for_function("() => document.querySelector('[data-testid=overlay]').dataset.pending === '0'")
    v = view(page)
    row = api_rows(base_url, iid, layers="11", heads="0", query="cls", temperature=2)["attention"][0][0][0]
    lo, hi = patch_range(row, 1)
    assert_close(v["max"], hi)
    assert_close(v["min"], lo)


def test_a_links_unknown_model_view_or_empty_layer_is_left_out(page, base_url, samples):
    """As every malformed value of a link: the default stays, and the page writes it back."""
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    open_page(page, base_url, f"?image={v['image']}&model=no-such-model&layer=&view=bogus&head=1")
    got = wait_view(page, image=v["image"], model="dinov2-s14-focus", layer=11, head="1")
    assert got["query"] == "cls"
    q = parse_qs(urlsplit(page.url).query)
    assert q["model"] == ["dinov2-s14-focus"] and q["layer"] == ["11"] and "view" not in q
    assert "no-such-model" not in page.locator("[data-testid=model] option").all_inner_texts()


def test_shared_url_of_an_evicted_image_says_so(page, base_url, guard):
    guard.allow_http_errors = True
    open_page(page, base_url, "?image=0123456789abcdef01234567&layer=2&head=1&q=cls")
    err = page.locator(ERROR)
    err.wait_for(state="visible")
    assert err.get_attribute("data-code") == "image_not_found"
    assert "no longer on the server" in err.inner_text()
    assert "Upload the image again" in err.inner_text()
    assert page.get_attribute(STATUS, "data-state") != "busy"


def test_not_an_image_shows_a_clear_error(page, base_url, guard, samples):
    guard.allow_http_errors = True
    open_page(page, base_url)
    page.set_input_files(
        "[data-testid=image-input]",
        files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"just some text\n"}],
    )
    err = page.locator(ERROR)
    err.wait_for(state="visible")
    assert err.get_attribute("data-code") == "not_an_image"
    assert "not an image" in err.inner_text().lower()
    assert page.get_attribute(STATUS, "data-state") != "busy"

    # The next good upload clears it.
    upload(page, samples["cat"])
    assert err.is_hidden()


def test_hostile_filename_is_shown_as_text(page, base_url, samples):
    name = "<img src=x onerror=alert(1)>"
    open_page(page, base_url)
    page.set_input_files(
        "[data-testid=image-input]",
        files=[{"name": name, "mimeType": "image/png", "buffer": samples["cat"].read_bytes()}],
    )
    wait_view(page, image=image_id(samples["cat"].read_bytes()))
    page.wait_for_function("n => document.querySelector('[data-testid=filename]').textContent === n", arg=name)
    assert page.locator("[data-testid=filename]").inner_text() == name
    assert page.locator("img[src=x]").count() == 0
    assert name in page.locator(STATUS).inner_text()
    # The guard asserts no dialog fired.


def test_progress_and_server_errors_are_shown(page, base_url, guard):
    """A fresh image (cache miss) with the server's fault injection: a slow run, then a failure."""
    guard.allow_http_errors = True
    open_page(page, base_url)

    def fresh_png(seed: int) -> bytes:
        img = Image.new("RGB", (96, 64), (seed * 40 % 255, 90, 160))
        img.putpixel((seed % 96, 3), (255, 255, 255))
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return buf.getvalue()

    fault = {"value": "sleep:1.5"}

    def add_fault(route):
        if route.request.method == "POST":
            return route.continue_(headers={**route.request.headers, "x-headscope-fault": fault["value"]})
        return route.continue_()

    page.route("**/api/v1/attention", add_fault)
    data = fresh_png(1)
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "slow.png", "mimeType": "image/png", "buffer": data}]
    )
    # read in the same poll as the state: on a loaded machine the 1.5 s can be over between two
    # calls from here
    page.wait_for_function(
        """() => { const s = document.querySelector('[data-testid=status]');
            const spin = s.querySelector('.spinner');
            return s.dataset.state === 'busy' && s.innerText.includes('Computing')
                && !!spin && spin.checkVisibility(); }"""
    )
    wait_view(page, image=image_id(data))

    # A failed computation: sending the same image again cannot help, so no "Try again".
    fault["value"] = "raise"
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "broken.png", "mimeType": "image/png", "buffer": fresh_png(2)}]
    )
    err = page.locator(ERROR)
    page.wait_for_selector(f"{ERROR}[data-code=compute_failed]")
    assert page.locator("#error-retry").is_hidden()
    # The previous view stays usable.
    assert view(page)["image"] == image_id(data)

    # Out of memory (503): a retry can succeed, and does once the server has room.
    fault["value"] = "oom-always"
    again = fresh_png(3)
    page.set_input_files(
        "[data-testid=image-input]", files=[{"name": "retry.png", "mimeType": "image/png", "buffer": again}]
    )
    page.wait_for_selector(f"{ERROR}[data-code=out_of_memory]")
    assert page.locator("#error-retry").is_visible()
    fault["value"] = "sleep:0"
    page.click("#error-retry")
    wait_view(page, image=image_id(again))
    assert err.is_hidden()


def test_busy_and_too_large_answers_are_explained(page, base_url, guard, samples):
    guard.allow_http_errors = True
    open_page(page, base_url)
    answers = {  # the retryable one last: its "Try again" is clicked below
        "upload_too_large": (413, {}),
        "busy": (429, {"Retry-After": "3"}),
    }
    for code, (status, headers) in answers.items():
        body = {"error": {"code": code, "message": f"{code} from the server", "request_id": "test"}}

        def answer(route, status=status, headers=headers, body=body):
            route.fulfill(status=status, headers={"Content-Type": "application/json", **headers}, body=json.dumps(body))

        page.route("**/api/v1/attention", lambda route: answer(route))
        page.set_input_files("[data-testid=image-input]", str(samples["cat"]))
        err = page.locator(f"{ERROR}[data-code={code}]")
        err.wait_for(state="visible")
        text = err.inner_text()
        if code == "busy":
            assert "busy" in text.lower() and "3 s" in text
            assert page.locator("#error-retry").is_visible()
        else:
            assert "too large" in text.lower()
            assert page.locator("#error-retry").is_hidden()  # the same file stays too large
        page.unroute("**/api/v1/attention")

    # "Try again" re-sends the same file, which now goes through.
    page.click("#error-retry")
    wait_view(page, image=image_id(samples["cat"].read_bytes()))
    assert page.locator(ERROR).is_hidden()


def test_downloads_png_and_tensors(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    with page.expect_download() as dl:
        page.click("[data-testid=download-png]")
    path = dl.value.path()
    with Image.open(path) as img:
        # The picture at its own resolution, then the legend band under it (test_screens.py).
        assert img.format == "PNG" and img.size[0] == 451 and img.size[1] > 300
        assert len(img.crop((0, 0, 451, 300)).convert("RGB").getcolors(1 << 20)) > 1000
    assert dl.value.suggested_filename.endswith(".png")

    href = page.get_attribute("[data-testid=download-tensors]", "href")
    q = parse_qs(urlsplit(href).query)
    assert q["format"] == ["safetensors"] and q["query"] == ["cls"] and q["layers"] == ["all"]
    body = httpx.get(base_url + href, timeout=30).content
    (n,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8 : 8 + n])
    assert header["attention"]["shape"] == [12, 6, 1, 385]
    assert header["attention"]["dtype"] == "F32"
    assert json.loads(header["__metadata__"]["headscope"])["image_id"] == v["image"]
    full = page.get_attribute("[data-testid=download-full]", "href")
    assert "query=all" in full and "format=safetensors" in full


def test_entropy_chart_click_opens_that_head(page, base_url, samples):
    open_page(page, base_url)
    upload(page, samples["cat"])
    page.wait_for_selector("[data-testid=analytics][data-state=ready]", timeout=120_000)
    show_chart(page, "chart-entropy")
    # the toolbar's camera saves each chart under its own name (Plotly's was plot-image.png for all)
    saved_as = "((document.querySelector('[data-testid=chart-entropy]')._context || {}).toImageButtonOptions || {})"
    page.wait_for_function(f"() => {saved_as}.filename === 'headscope_chart-entropy'")
    cells = page.locator("[data-testid=chart-entropy][data-rendered='1'] .nsewdrag")
    cells.scroll_into_view_if_needed()
    wait_scroll_settled(page)
    box = cells.bounding_box()
    x = box["x"] + (4 + 0.5) * box["width"] / 6  # head 4
    y = box["y"] + (2 + 0.5) * box["height"] / 12  # layer 2 (layer 0 at the top)
    page.evaluate(
        """() => { window.__reacts = {}; const react = window.Plotly.react;
            window.Plotly.react = (el, ...rest) => {
                window.__reacts[el.id] = (window.__reacts[el.id] || 0) + 1; return react(el, ...rest); }; }"""
    )
    page.mouse.move(x - 2, y - 2)
    page.mouse.move(x, y)  # Plotly picks the clicked cell from the hover
    page.mouse.click(x, y)
    wait_view(page, layer=2, head=4)
    # The selection box moved to the clicked head, the chart not redrawn for it: its shapes are
    # relaid out (under 1 ms), where Plotly.react redrew the whole chart.
    page.wait_for_function(
        """() => { const s = document.querySelector('[data-testid=chart-entropy]').layout.shapes[0];
            return !!s && s.x0 === 3.5 && s.y0 === 1.5; }"""
    )
    assert page.evaluate("() => window.__reacts['chart-entropy'] || 0") == 0
