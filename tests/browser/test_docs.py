"""/docs (Swagger UI) and /redoc render offline under the page's CSP, in real Chromium.

The guard (tests/browser/conftest.py) fails a test on any request to another host, a console
error (a CSP violation is one) or an uncaught exception.
"""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from headscope import paths

pytestmark = pytest.mark.browser

HTTP_METHODS = {"get", "post", "put", "patch", "delete", "head", "options"}


def operations(base_url: str) -> list[tuple[str, str, str]]:
    """(METHOD, path, summary) of every operation in the OpenAPI spec."""
    spec = httpx.get(base_url + "/openapi.json", timeout=120).json()
    return [
        (method.upper(), path, op.get("summary", ""))
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in HTTP_METHODS
    ]


def test_swagger_ui_shows_every_operation_with_no_outside_request(page, base_url, guard):
    ops = operations(base_url)
    assert ("POST", "/api/v1/attention") in {(m, p) for m, p, _ in ops}
    resp = page.goto(base_url + "/docs")
    assert resp is not None and "script-src 'self'" in resp.headers["content-security-policy"]
    page.wait_for_selector(".opblock-summary")
    shown = page.eval_on_selector_all(
        ".opblock-summary",
        """els => els.map(e => [
            e.querySelector('.opblock-summary-method').textContent.trim(),
            e.querySelector('.opblock-summary-path').dataset.path,
        ])""",
    )
    assert sorted(map(tuple, shown)) == sorted((m, p) for m, p, _ in ops)
    # The UI works, not just renders: open the upload operation and see its form fields.
    page.locator('.opblock-post .opblock-summary-path[data-path="/api/v1/attention"]').click()
    page.get_by_text("Try it out").first.wait_for()
    assert page.locator(".opblock-post .parameters-container, .opblock-post .opblock-section-request-body").count()
    assert page.title().startswith("Headscope")


def test_redoc_shows_every_operation_with_no_outside_request(page, base_url, guard):
    ops = operations(base_url)
    resp = page.goto(base_url + "/redoc")
    assert resp is not None and "script-src 'self'" in resp.headers["content-security-policy"]
    page.wait_for_selector("h2")
    headings = set(page.locator("h2").all_inner_texts())
    assert {summary for _, _, summary in ops} <= headings, {summary for _, _, summary in ops} - headings
    # ReDoc's side menu used to load Redocly's logo from their CDN (blocked by the CSP, a console
    # error): the served bundle no longer names it, and the guard fails on either.
    assert page.locator("img[alt='redocly logo'][src^='http']").count() == 0


def test_the_guide_works_under_its_csp(page, base_url, guard):
    """The documentation site the server mounts at /guide (where the page's "how to read it" links
    go), when `make docs` has built it: MkDocs Material's inline scripts run under the CSP (each
    allowed by its hash: a blocked one is a console error the guard fails on), and search finds
    pages."""
    if paths.built_docs_dir() is None:
        pytest.skip("the documentation site is not built (make docs)")
    resp = page.goto(base_url + "/guide/")
    assert resp is not None and resp.status == 200
    csp = resp.headers["content-security-policy"]
    script_src = next(d for d in csp.split("; ") if d.startswith("script-src"))
    assert "'sha256-" in script_src and "unsafe-inline" not in script_src
    page.locator("label.md-search__icon, .md-search__input").first.click()
    box, found = page.locator("input.md-search__input"), page.locator(".md-search-result__item")
    for _ in range(6):  # typed again: on a loaded machine a query can come before the index is ready
        box.fill("")
        box.press_sequentially("rollout")  # keys: Material reads the query on keyup, not on input
        try:
            found.first.wait_for(timeout=15_000)
            break
        except PlaywrightTimeout:
            continue
    assert found.count() > 0, page.locator(".md-search-result__meta").inner_text()
