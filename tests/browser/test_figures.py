"""The map's figure downloads (issues #28 and #30), in real Chromium against a real server: the
SVG beside the PNG, whose text and colour bar are vectors, and a caption that wraps instead of
being cut short.
"""

from __future__ import annotations

import base64
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image
from test_page import ARTIFACTS, open_page, upload, wait_view

pytestmark = pytest.mark.browser

SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"


def download(page, testid: str):
    with page.expect_download() as dl:
        page.click(f"[data-testid={testid}]")
    return dl.value


def texts(root) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def test_svg_download_parses_and_holds_the_caption_as_text(page, base_url, samples):
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    # A long caption: dropped tokens, the mass mask and a temperature.
    page.check("[data-testid=mass-toggle]")
    page.select_option("[data-testid=drop-tokens]", "prefix,artifacts")
    v = wait_view(page, drop="prefix,artifacts", maskFraction="0.6")

    dl = download(page, "download-svg")
    # what changes the numbers is in the name too (two maps of one picture saved under one name)
    assert dl.suggested_filename == "headscope_cat_L11_0_cls_drop-prefix_artifacts.svg"
    data = Path(dl.path()).read_bytes()
    root = ET.fromstring(data)  # well-formed XML
    assert root.tag == f"{SVG}svg"
    W, H = int(root.get("width")), int(root.get("height"))
    assert root.get("viewBox") == f"0 0 {W} {H}"

    # The title and the caption are text, whole: nothing is cut short with an ellipsis.
    assert root.find(f"{SVG}title").text == "Layer 11 · head 0 · query CLS"
    caption = [" ".join(t.itertext()) for t in root.find(f".//{SVG}g[@id='caption']")]
    assert len(caption) >= 2, caption  # 451 px wide: the caption wraps
    joined = " · ".join(caption)
    for part in ("model dinov2-s14-focus", "cat.png", "dropped: prefix,artifacts", "mass mask 60%", "Headscope"):
        assert part in joined, (part, caption)
    assert not any("…" in t for t in texts(root)), texts(root)
    meta = json.loads(root.find(f"{SVG}metadata").text)
    assert (meta["layer"], meta["head"], meta["query"], meta["image_id"]) == (11, "0", "cls", v["image"])
    assert abs(meta["min"] - float(v["min"])) < 1e-9 and abs(meta["max"] - float(v["max"])) < 1e-9

    # The scale's ends are text, the colour bar a vector gradient of the colour map.
    assert root.find(f".//{SVG}text[@id='scale-min']").text == page.inner_text("#cb-min")
    assert root.find(f".//{SVG}text[@id='scale-max']").text == page.inner_text("#cb-max")
    grad = root.find(f".//{SVG}linearGradient[@id='colour-bar']")
    stops = grad.findall(f"{SVG}stop")
    assert len(stops) >= 16
    assert stops[0].get("stop-color") == "rgb(68,1,84)" and stops[-1].get("stop-color") == "rgb(253,231,37)"  # viridis
    bar = root.find(f".//{SVG}rect[@id='colour-bar-rect']")
    assert bar.get("fill") == "url(#colour-bar)" and float(bar.get("width")) > 200

    # The picture with its overlay is one embedded PNG at the picture's own size.
    img = root.find(f"{SVG}image")
    href = img.get(f"{XLINK}href") or img.get("href")
    assert href.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(href.split(",", 1)[1]))) as pic:
        assert pic.size == (451, 300)
    assert (int(img.get("width")), int(img.get("height"))) == (451, 300) and meta["legend_px"] + 300 == H

    # The PNG has the same legend band (the same layout), and its caption is the SVG's.
    png = download(page, "download-png")
    with Image.open(png.path()) as im:
        im.load()
        pmeta = json.loads(im.text["headscope"])
        assert pmeta["legend_px"] == meta["legend_px"] and im.size == (W, H)
        assert all(line in im.text["Description"] for line in caption)

    # Chromium draws the SVG file (a look for the record: test-artifacts/figure.svg.png).
    ARTIFACTS.mkdir(exist_ok=True)
    view = page.context.new_page()
    view.set_content(f"<body style='margin:0;background:#fff'>{data.decode()}</body>")
    box = view.locator("svg").bounding_box()
    assert (round(box["width"]), round(box["height"])) == (W, H)
    view.locator("svg").screenshot(path=str(ARTIFACTS / "figure.svg.png"))
    view.close()


@pytest.mark.thorough
def test_a_link_opened_in_another_tab_names_its_figure_by_the_image_id(page, base_url, samples):
    """The name stays with the tab that uploaded (sessionStorage); a link opened elsewhere has none."""
    open_page(page, base_url)
    v = upload(page, samples["cat"])
    other = page.context.new_page()
    open_page(other, base_url, f"?image={v['image']}&layer=11&head=0&q=cls")
    wait_view(other, image=v["image"], layer=11)
    assert other.locator("[data-testid=filename]").inner_text() == "(no name)"
    dl = download(other, "download-svg")
    assert dl.suggested_filename == f"headscope_image_{v['image'][:8]}_L11_0_cls.svg"
    root = ET.fromstring(Path(dl.path()).read_bytes())
    caption = " · ".join(" ".join(t.itertext()) for t in root.find(f".//{SVG}g[@id='caption']"))
    assert f"image {v['image'][:8]}" in caption
    other.close()
