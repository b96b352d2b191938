"""Every operation of the app's OpenAPI schema has a section in the REST API page (docs/api.md):
a heading that names its method and path, e.g. ``### `GET /api/v1/models` ``, and a tested
example that calls it."""

from __future__ import annotations

import functools
import re
import sys

from headscope.web.main import create_app
from helpers.server import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import doc_examples  # noqa: E402

PAGE = ROOT / "docs" / "api.md"
METHODS = {"get", "post", "put", "patch", "delete"}


@functools.cache
def spec() -> dict:
    return create_app().openapi()  # the schema the server serves at /openapi.json, built in-process


def operations() -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, item in spec()["paths"].items() for m in item if m in METHODS}


def takes_a_form(method: str, path: str) -> bool:
    body = spec()["paths"][path][method.lower()].get("requestBody") or {}
    return "multipart/form-data" in body.get("content", {})


def sections() -> set[tuple[str, str]]:
    """(METHOD, path) of every heading of the page that names an operation."""
    text = PAGE.read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,4} `([A-Z]+) (/[^`\s]*)`\s*$", text, re.M))


def test_every_endpoint_has_a_section():
    ops, documented = operations(), sections()
    assert len(ops) >= 14
    missing = sorted(ops - documented)
    assert not missing, f"endpoints without a section in docs/api.md: {missing}"
    stale = sorted(documented - ops)
    assert not stale, f"docs/api.md has sections for endpoints the app does not have: {stale}"


def test_every_endpoint_has_a_tested_example():
    tested = doc_examples.tested(PAGE)
    for method, path in sorted(operations()):
        # the path with a real image id (and real values of its other parameters), followed by a
        # query, a quote, a space or the line's end
        pattern = re.escape(path).replace(r"\{image_id\}", "[0-9a-f]{24}")
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[A-Za-z0-9_.-]+", pattern) + r"(\?|\"|\s|$)"
        hits = [b for b in tested if re.search(pattern, b.code, re.M)]
        assert hits, f"{method} {path}: no tested example in docs/api.md calls it"
        if takes_a_form(method, path):
            assert any("-F " in b.code for b in hits), f"{method} {path}: no example posts a form"
        elif method == "POST":
            assert any("-X POST" in b.code for b in hits), f"{method} {path}: no example posts to it"
