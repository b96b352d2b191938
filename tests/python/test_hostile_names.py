"""Issue 39 item 6: a file name that would put the HTML parser in its double-escaped state
(``<!--<script>x.png``) is data, not markup, in every JSON embedded in HTML: ``att.to_html()``
still draws in real Chromium, and the escaping itself (``script_json``) keeps the value."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import headscope
from headscope.html_json import script_json
from helpers.chromium import chromium
from helpers.view_host import open_file

SAMPLE = Path(__file__).resolve().parents[2] / "static" / "samples" / "cat.png"
HOSTILE = "<!--<script>x.png"


@pytest.mark.parametrize("value", [HOSTILE, "</script><script>alert(1)</script>", "a & b > c \u2028 d"])
def test_script_json_keeps_the_value_and_hides_every_angle_bracket(value):
    text = script_json({"name": value, "n": [1, 2]})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": value, "n": [1, 2]}


def test_the_view_of_a_file_named_like_markup_still_draws(tmp_path):
    picture = tmp_path / HOSTILE
    shutil.copy(SAMPLE, picture)
    att = headscope.load(device="cpu").attention(picture)
    assert att.filename == HOSTILE
    path = att.to_html(tmp_path / "view.html")
    text = path.read_text()
    assert HOSTILE not in text and "\\u003c!--\\u003cscript\\u003ex.png" in text
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1000, "height": 800})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        open_file(page, path)  # waits for the first draw: a swallowed module script never draws
        assert HOSTILE in page.text_content("[data-testid=hs-caption]")
        context.close()
    assert errors == []
