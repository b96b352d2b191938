"""Debian's Chromium through Playwright (Playwright's own browser download does not work here)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("HEADSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched browser, closed afterwards; the test is skipped where Playwright or Chromium is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (set HEADSCOPE_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
