"""Playwright fixtures: one Debian Chromium per module, a fresh page per test with guards.

The guards fail a test on a console error, an uncaught page error, a JavaScript dialog
(``alert`` from an injected script) or any request to a host other than the test server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from helpers.chromium import chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

VIEWPORT = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@dataclass
class Guard:
    """What the page did that a test may check: console errors, dialogs, outside requests."""

    origin: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    # Tests that provoke 4xx/5xx answers allow Chromium's "Failed to load resource" lines.
    allow_http_errors: bool = False

    def unexpected_console_errors(self) -> list[str]:
        return [
            m for m in self.console_errors if not (self.allow_http_errors and m.startswith("Failed to load resource"))
        ]


@pytest.fixture
def guard(base_url) -> Guard:
    return Guard(origin=base_url)


def guarded_context(browser, base_url, guard, viewport, pace, **options):
    """A browser context whose pages report to ``guard`` and may only reach the test server;
    ``options`` go to Playwright's new_context (``device_scale_factor=2``: 200 % zoom)."""
    context = browser.new_context(viewport=viewport, accept_downloads=True, **options)
    host = urlsplit(base_url).hostname

    def route(r):
        url = r.request.url
        if url.startswith(("data:", "blob:")) or urlsplit(url).hostname in (host, "localhost", "127.0.0.1"):
            return r.continue_()
        guard.external.append(url)
        return r.abort()

    context.route("**/*", route)

    def on_dialog(d):
        guard.dialogs.append(d.message)
        d.dismiss()

    def on_page(pg):
        pg.on("console", lambda m: guard.console_errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: guard.page_errors.append(str(e)))
        pg.on("dialog", on_dialog)
        pg.set_default_timeout(pace.s(30) * 1000)  # 30 s on the quiet development machine

    context.on("page", on_page)
    return context


def check_guard(guard: Guard) -> None:
    assert not guard.external, f"requests to other hosts: {guard.external}"
    assert not guard.page_errors, f"uncaught page errors: {guard.page_errors}"
    assert not guard.dialogs, f"dialogs fired: {guard.dialogs}"
    assert not guard.unexpected_console_errors(), f"console errors: {guard.unexpected_console_errors()}"


def _screenshot_if_failed(request, pg, name: str) -> None:
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"failed-{request.node.name}{name}.png"), full_page=True)


@pytest.fixture
def page(browser, base_url, guard, request, pace):
    context = guarded_context(browser, base_url, guard, VIEWPORT, pace)
    pg = context.new_page()
    yield pg
    try:
        _screenshot_if_failed(request, pg, "")
    finally:
        context.close()
    check_guard(guard)


@pytest.fixture
def page_at(browser, base_url, guard, request, pace):
    """Open guarded pages at other viewports: ``page_at(390, 844)`` (a phone) gives a new page;
    ``page_at(640, 400, device_scale_factor=2)`` a 1280x800 window at 200 % zoom."""
    contexts = []

    def make(width: int, height: int, **options):
        context = guarded_context(browser, base_url, guard, {"width": width, "height": height}, pace, **options)
        contexts.append((context, f"-{width}x{height}"))
        return context.new_page()

    yield make
    try:
        for context, name in contexts:
            for pg in context.pages:
                _screenshot_if_failed(request, pg, name)
    finally:
        for context, _ in contexts:
            context.close()
    check_guard(guard)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="module")
def report(tmp_path_factory, samples):
    """A survey of the samples (tiny random model, every optional column) and its report: the
    report's path and the model."""
    from headscope.config import Settings
    from headscope.survey.compute import Surveyor
    from headscope.survey.output import SurveyOutput
    from headscope.survey.report import write_report
    from headscope.survey.run import run_meta
    from headscope.survey.sources import list_images

    src = tmp_path_factory.mktemp("report-src")
    for p in samples.values():
        (src / p.name).write_bytes(p.read_bytes())
    (src / "broken.png").write_bytes(b"not a picture")
    settings = Settings(models_dir=tmp_path_factory.mktemp("models"), device="cpu")
    sv = Surveyor("random:test_vit", "cpu", batch_size=4, settings=settings, similarity=True, ranks=True)
    out = tmp_path_factory.mktemp("report") / "s.parquet"
    w = SurveyOutput(out, run_meta(sv.lm.id, "cpu", settings, True, True))
    res = sv.process(list_images(src))
    w.add(res.rows, res.failures, res.images)
    w.close()
    page = write_report(out, out.parent / "report.html")
    return page, sv.lm
