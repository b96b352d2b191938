"""Driving the "Inside a head" view (the learn view's browser tests): its answers, the numbers it
should show, its controls."""

from __future__ import annotations

import httpx
import numpy as np

from .page import (
    image_id,  # noqa: F401  # the app's own
    open_page,  # noqa: F401
)
from .page import upload as page_upload

LEARN = "[data-testid=learn-view]"
LONG = 600_000  # ms: a 518 px model's first forward and statistics on a loaded 2-core machine


def upload(page, path) -> None:
    """:func:`helpers.page.upload`, waiting as long as a large model's first forward may take."""
    page_upload(page, path, timeout=LONG)


def learn(page) -> dict:
    return page.eval_on_selector(LEARN, "e => ({...e.dataset})")


def wait_learn(page, **want) -> dict:
    """Wait until the view shows an answer with ``want`` (its data-* values, as strings)."""
    page.wait_for_function(
        """want => {
            const e = document.querySelector('[data-testid=learn-view]');
            return !e.hidden && e.dataset.state === 'ready'
                && Object.entries(want).every(([k, v]) => e.dataset[k] === v);
        }""",
        arg={k: str(v) for k, v in want.items()},
        timeout=LONG,
    )
    return learn(page)


def explain(base_url, iid, **params) -> dict:
    r = httpx.get(f"{base_url}/api/v1/attention/{iid}/explain", params=params, timeout=LONG / 1000)
    r.raise_for_status()
    return r.json()


def softmax(x, T=1.0):
    x = np.asarray(x, np.float64) / T
    e = np.exp(x - x.max())
    return e / e.sum()


def entropy(p) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def set_range(page, selector: str, value: str, events=("input", "change")) -> None:
    """Move a range input the way a person's drag ends: input, then change."""
    page.eval_on_selector(
        selector,
        "(s, [v, events]) => { s.value = v; for (const e of events) s.dispatchEvent(new Event(e, {bubbles: true})); }",
        [value, list(events)],
    )


def cell_center(page, selector: str, r: int, c: int, grid) -> tuple[float, float]:
    page.locator(selector).scroll_into_view_if_needed()
    box = page.locator(selector).bounding_box()
    return box["x"] + (c + 0.5) * box["width"] / grid[1], box["y"] + (r + 0.5) * box["height"] / grid[0]
