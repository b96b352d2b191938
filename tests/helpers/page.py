"""Driving the page in Chromium (the browser tests): open it, upload, wait for what it shows, read
its canvases and charts."""

from __future__ import annotations

import math

import httpx

from headscope.serving.uploads import image_id_of as image_id  # the app's own, never re-derived

OVERLAY = "[data-testid=overlay]"
STATUS = "[data-testid=status]"
ERROR = "[data-testid=error]"
ABLATION_VIEW = "[data-testid=ablation-view]"
OUTPUT = "[data-testid=model-output]"


def open_page(page, base_url, query: str = "") -> None:
    """Open the page at ``base_url`` with ``query`` (``?view=learn&...``) and wait until it is set up."""
    page.goto(f"{base_url}/{query}")
    page.wait_for_function("() => document.body.dataset.ready === '1'")


def view(page) -> dict:
    """What the overlay canvas says it shows (its data-* attributes)."""
    return page.eval_on_selector(OVERLAY, "c => ({...c.dataset})")


def wait_view(page, timeout: float | None = None, **want) -> dict:
    """Wait until the page is idle and the overlay shows ``want`` (data-* values as strings)."""
    page.wait_for_function(
        """want => {
            const s = document.querySelector('[data-testid=status]');
            const c = document.querySelector('[data-testid=overlay]');
            if (!c || c.hidden || s.dataset.state !== 'ready') return false;
            return Object.entries(want).every(([k, v]) => c.dataset[k] === v);
        }""",
        arg={k: str(v) for k, v in want.items()},
        timeout=timeout,
    )
    return view(page)


def wait_scroll_settled(page, quiet_ms: int = 150) -> None:
    """Wait until the page has stopped scrolling: the same offset for ``quiet_ms`` and at least three
    animation frames. The page scrolls smoothly, and an answer can arrive before the scroll has
    ended, so boxes measured meanwhile are still moving; on a loaded machine two frames in a row
    can show one offset while the smooth scroll is still under way, hence the time as well."""
    page.evaluate("() => { window.__hsScroll = null; }")
    page.wait_for_function(
        """(quiet) => {
        const y = scrollY, now = performance.now(), s = window.__hsScroll;
        if (!s || s.y !== y) { window.__hsScroll = {y, since: now, frames: 0}; return false; }
        s.frames += 1;
        return s.frames >= 3 && now - s.since >= quiet;
    }""",
        arg=quiet_ms,
        polling="raf",
    )


def upload(page, path, timeout: float | None = None) -> dict:
    """Choose the picture at ``path`` as a person does and wait until the overlay shows it."""
    page.set_input_files("[data-testid=image-input]", str(path))
    return wait_view(page, timeout, image=image_id(path.read_bytes()))


def canvas_png(page) -> str:
    return page.eval_on_selector(OVERLAY, "c => c.toDataURL('image/png')")


def pixel_stats(page) -> dict:
    return page.eval_on_selector(
        OVERLAY,
        """c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0, s = 0, s2 = 0; const colours = new Set();
        for (let i = 0; i < d.length; i += 4 * 7) {
            const y = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
            s += y; s2 += y * y; n++; colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
        }
        return {mean: s / n, std: Math.sqrt(s2 / n - (s / n) ** 2), colours: colours.size,
                w: c.width, h: c.height, cssW: c.clientWidth, cssH: c.clientHeight};
    }""",
    )


def click_cell(page, r: int, c: int, grid: tuple[int, int], **kw) -> None:
    box = page.locator(OVERLAY).bounding_box()
    page.locator(OVERLAY).click(
        position={"x": (c + 0.5) * box["width"] / grid[1], "y": (r + 0.5) * box["height"] / grid[0]}, **kw
    )


def api_rows(base_url, iid, **params) -> list:
    r = httpx.get(f"{base_url}/api/v1/attention/{iid}", params=params, timeout=30)
    r.raise_for_status()
    return r.json()


def patch_range(row: list[float], num_prefix: int) -> tuple[float, float]:
    patches = row[num_prefix:]
    return min(patches), max(patches)


def assert_close(a: str | float, b: float, rel=2e-5) -> None:
    assert math.isclose(float(a), b, rel_tol=rel, abs_tol=1e-9), (a, b)


def wait_output(page, ablate: str) -> None:
    """Wait until the model-output figure shows the output of this ablation set."""
    page.wait_for_function(
        """a => { const e = document.querySelector('[data-testid=model-output]');
                  return e.dataset.state === 'ready' && e.dataset.ablate === a; }""",
        arg=ablate,
    )


def window_ink(page, selector: str = OVERLAY) -> dict:
    """Pixels of the window outline's dash colour (#facc15) in each corner quarter of a canvas
    (the overlay unless said)."""
    return page.eval_on_selector(
        selector,
        """c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const out = {tl: 0, tr: 0, bl: 0, br: 0, all: 0};
        for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {
            const i = 4 * (y * c.width + x);
            if (Math.abs(d[i] - 250) < 12 && Math.abs(d[i + 1] - 204) < 12 && d[i + 2] < 60) {
                out.all++;
                const k = (y < c.height / 4 ? 't' : y > 3 * c.height / 4 ? 'b' : 'm')
                        + (x < c.width / 4 ? 'l' : x > 3 * c.width / 4 ? 'r' : 'm');
                if (k in out) out[k]++;
            }
        }
        return out;
    }""",
    )
