"""The pictures of the documentation's page views, taken from the real page.

Starts a real server (the embedded default model, plus a Swin-T with random weights for the two
Swin pictures, as a ``local:`` checkpoint written with tests/helpers/swin_reference.py), drives Debian's
Chromium through Playwright, and writes each picture into docs/ (docs/page.md shows them; the
README shows ``screenshot.png``). Every picture is of the cat sample, so they can be taken again
whenever the page changes:

    .venv/bin/python scripts/screenshots.py                  # all of them
    .venv/bin/python scripts/screenshots.py --only learn     # one (or several) by name
    .venv/bin/python scripts/screenshots.py --list           # the names

HEADSCOPE_CHROMIUM names another Chromium binary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers.server import SAMPLES, Server  # noqa: E402
from helpers.swin_reference import SWIN_ARCH, SWIN_CHECKPOINT, write_checkpoint  # noqa: E402

CHROMIUM = os.environ.get("HEADSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 900}
SWIN = f"local:{SWIN_ARCH}@{SWIN_CHECKPOINT}"  # the id the server lists the checkpoint under
WAIT_MS = 600_000  # a loaded 2-core machine takes minutes for an importance sweep
CAT = SAMPLES / "cat.png"
CAT_ID = hashlib.sha256(CAT.read_bytes()).hexdigest()[:24]
WHY_BOX = (60, 40, 150, 120)  # the cat's head on its 336 x 224 output map (docs/relevance.md's box)


class Shots:
    """One browser and one server; each method takes one picture."""

    def __init__(self, browser, url: str, out: Path):
        self.browser, self.url, self.out = browser, url, out

    # ------------------------------------------------------------------ helpers
    def page(self, query: str = "", viewport: dict | None = None):
        pg = self.browser.new_page(viewport=viewport or VIEWPORT)
        pg.set_default_timeout(WAIT_MS)
        pg.goto(f"{self.url}/{query}")
        pg.wait_for_function("() => document.body.dataset.ready === '1'")
        return pg

    def post(self, path: Path = CAT, model: str | None = None) -> str:
        data = {"layers": "-1"} if model is None else {"model": model, "layers": "0", "query": "patch:0,0"}
        r = httpx.post(
            f"{self.url}/api/v1/attention", files={"image": (path.name, path.read_bytes())}, data=data, timeout=600
        )
        r.raise_for_status()
        return r.json()["image_id"]

    @staticmethod
    def wait_map(pg, **want) -> None:
        """The overlay shows ``want`` (its data-* values) and the page is idle."""
        pg.wait_for_function(
            """want => {
                const s = document.querySelector('[data-testid=status]');
                const c = document.querySelector('[data-testid=overlay]');
                if (!c || c.hidden || s.dataset.state !== 'ready') return false;
                return Object.entries(want).every(([k, v]) => c.dataset[k] === v);
            }""",
            arg={k: str(v) for k, v in want.items()},
        )

    @staticmethod
    def wait_tiles(pg, selector: str, count: int) -> None:
        """``count`` thumbnails under ``selector``, none of them still waiting for its rows."""
        pg.wait_for_function(
            """([sel, n]) => { const t = document.querySelectorAll(sel + ' .tile');
                return t.length === n && ![...t].some(x => x.classList.contains('pending')); }""",
            arg=[selector, count],
        )

    @staticmethod
    def wait_analytics(pg) -> None:
        pg.wait_for_selector("[data-testid=analytics][data-state=ready]")
        pg.wait_for_function(
            """() => ['chart-entropy', 'distance-heatmap', 'distance-scatter', 'chart-prefix',
                'similarity-matrix', 'rank-chart', 'chart-row'].every(id => {
                const el = document.querySelector(`[data-testid=${id}]`);
                return el && el.dataset.rendered === '1' && el.querySelector('svg.main-svg'); })"""
        )

    @staticmethod
    def wait_learn(pg) -> None:
        pg.wait_for_function(
            "() => { const e = document.querySelector('[data-testid=learn-view]');"
            " return !e.hidden && e.dataset.state === 'ready'; }"
        )

    def save(self, pg, name: str, selector: str | None = None) -> None:
        pg.wait_for_timeout(400)  # the last frame of a smooth scroll or a chart's transition
        path = self.out / f"{name}.png"
        if selector is None:
            pg.evaluate("() => window.scrollTo(0, 0)")
            pg.wait_for_timeout(300)
            pg.screenshot(path=str(path))
        else:
            # A picture taller than the window is taken in scrolled pieces: sticky bars would show
            # up in the middle of it.
            pg.add_style_tag(content=".topbar, .sidebar .panel-view { position: static !important; }")
            pg.wait_for_timeout(200)
            pg.locator(selector).first.screenshot(path=str(path))
        pg.close()
        print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

    # ------------------------------------------------------------------ the pictures
    def screenshot(self) -> None:
        """The README's picture: the page right after the cat is dropped on it."""
        pg = self.page()
        pg.set_input_files("[data-testid=image-input]", str(CAT))
        self.wait_map(pg, image=CAT_ID, layer=11, head=0, query="cls")
        self.wait_tiles(pg, "[data-testid=head-grid]", 6 + 3)
        self.wait_analytics(pg)
        self.save(pg, "screenshot")

    def page_map(self) -> None:
        """A patch query: the cat's eye, layer 8, head 3."""
        self.post()
        pg = self.page(f"?image={CAT_ID}&layer=8&head=3&q=patch:6,9")
        self.wait_map(pg, image=CAT_ID, layer=8, head=3, query="patch:6,9")
        self.wait_analytics(pg)  # the artifact list beside the map comes with the statistics
        self.save(pg, "page-map", ".viewer-panel")

    def page_heads(self) -> None:
        self.post()
        pg = self.page(f"?image={CAT_ID}&layer=11&head=0&q=cls")
        self.wait_map(pg, image=CAT_ID, layer=11)
        self.wait_tiles(pg, "[data-testid=head-grid]", 6 + 3)
        self.save(pg, "page-heads", "[data-testid=heads-panel]")

    def page_rollout(self) -> None:
        self.post()
        pg = self.page(f"?image={CAT_ID}&layer=11&head=rollout&q=cls")
        self.wait_map(pg, image=CAT_ID, layer=11, head="rollout")
        pg.wait_for_selector("[data-testid=rollout-strip][data-loaded='1']")
        self.save(pg, "page-rollout", "#rollout-panel")

    def page_analytics(self) -> None:
        self.post()
        pg = self.page(f"?image={CAT_ID}&layer=11&head=0&q=cls")
        self.wait_map(pg, image=CAT_ID)
        self.wait_analytics(pg)
        self.save(pg, "page-analytics", "[data-testid=analytics]")

    def page_model_view(self) -> None:
        self.post()
        pg = self.page(f"?image={CAT_ID}&layer=11&head=0&q=cls")
        self.wait_map(pg, image=CAT_ID)
        self.wait_tiles(pg, "[data-testid=model-view]", 12 * 9)
        self.save(pg, "page-model-view", "[data-testid=model-panel]")

    def page_compare(self) -> None:
        self.post()
        pg = self.page(f"?image={CAT_ID}&layer=11&head=0&q=cls")
        self.wait_map(pg, image=CAT_ID)
        pg.check("[data-testid=compare-toggle]")
        pg.select_option("[data-testid=compare-mode]", "heads")
        pg.select_option("[data-testid=compare-b-head]", "4")
        for side in ("a", "b"):
            pg.wait_for_function(
                "side => { const c = document.querySelector(`[data-testid=compare-${side}]`);"
                " return c && c.dataset.pending === '0'; }",
                arg=side,
            )
        self.save(pg, "page-compare", "[data-testid=compare]")

    def learn(self) -> None:
        """Inside a head: the query on one eye finds both."""
        self.post()
        pg = self.page(f"?image={CAT_ID}&layer=8&head=3&q=patch:6,9&view=learn", {"width": 1280, "height": 1200})
        self.wait_learn(pg)
        self.save(pg, "learn", ".learn-panel")

    def ablation(self) -> None:
        """Two heads off, the saliency and its difference, importance and the pruning curve."""
        self.post()
        pg = self.page(f"?image={CAT_ID}&view=ablation", {"width": 1360, "height": 1000})

        def wait_output(ablate: str) -> None:
            pg.wait_for_function(
                """a => { const e = document.querySelector('[data-testid=model-output]');
                          return e.dataset.state === 'ready' && e.dataset.ablate === a; }""",
                arg=ablate,
            )

        wait_output("")
        for layer, head, now in ((11, 0, "11:0"), (3, 2, "3:2,11:0")):
            pg.click(f"[data-testid=ablate-head][data-layer='{layer}'][data-head='{head}']")
            wait_output(now)
        pg.click("[data-testid=importance-run]")
        pg.wait_for_function("() => document.querySelector('[data-testid=importance-heatmap] svg.main-svg')")
        pg.wait_for_function("() => document.querySelector('[data-testid=pruning-curve] svg.main-svg')")
        pg.wait_for_selector("[data-testid=importance-progress][data-state=done]")
        self.save(pg, "ablation", "[data-testid=ablation-view]")

    def why(self, viewport: dict | None = None, name: str = "why") -> None:
        """Why: Chefer's map of a box drawn on the cat's head, the raw attention beside it, and the
        faithfulness test of the box with the paper's fractions."""
        self.post()
        pg = self.page(f"?image={CAT_ID}&view=why", viewport or {"width": 1280, "height": 800})
        pg.wait_for_selector("[data-testid=why-output][data-state=ready]")
        canvas = pg.locator("[data-testid=why-saliency]")
        canvas.scroll_into_view_if_needed()
        r = canvas.bounding_box()
        assert r is not None
        x0, y0, x1, y1 = WHY_BOX
        h, w = 224, 336  # the cat's output map (the model's input size)
        pg.mouse.move(r["x"] + x0 / w * r["width"], r["y"] + y0 / h * r["height"])
        pg.mouse.down()
        pg.mouse.move(r["x"] + x1 / w * r["width"], r["y"] + y1 / h * r["height"], steps=5)
        pg.mouse.up()
        pg.wait_for_function(
            """() => ['relevance-map', 'raw-attention'].every(id => {
                const c = document.querySelector(`[data-testid=${id}]`);
                return c.closest('figure').dataset.state === 'ready' && c.dataset.target.startsWith('box:'); })"""
        )
        pg.select_option("[data-testid=faithfulness-steps]", "full")
        pg.click("[data-testid=faithfulness-run]")
        pg.wait_for_function("() => document.querySelector('[data-testid=faithfulness-chart] svg.main-svg')")
        pg.wait_for_selector("[data-testid=faithfulness-progress][data-state=done]")
        self.save(pg, name, "[data-testid=why-view]")

    def why_phone(self) -> None:
        """The same on a phone (390 x 844)."""
        self.why({"width": 390, "height": 844}, "why-phone")

    def swin_shifted_window(self) -> None:
        """Swin-T, a shifted layer of stage 1, the query in the bottom-left corner."""
        self.post(model=SWIN)
        pg = self.page(f"?image={CAT_ID}&model={SWIN}&layer=3&head=0&q=patch:55,0")
        self.wait_map(pg, image=CAT_ID, model=SWIN, layer=3, query="patch:55,0")
        pg.wait_for_selector("[data-testid=analytics][data-state=ready]")
        self.save(pg, "swin-shifted-window", ".viewer-panel")

    def learn_swin(self) -> None:
        """Inside a head for the same Swin query: the scores over the wrapped window."""
        self.post(model=SWIN)
        pg = self.page(f"?image={CAT_ID}&model={SWIN}&layer=3&head=0&q=patch:55,0&view=learn")
        self.wait_learn(pg)
        self.save(pg, "learn-swin", "[data-testid=stage-scores]")


NAMES: dict[str, Callable[[Shots], None]] = {
    "screenshot": Shots.screenshot,
    "page-map": Shots.page_map,
    "page-heads": Shots.page_heads,
    "page-rollout": Shots.page_rollout,
    "page-analytics": Shots.page_analytics,
    "page-model-view": Shots.page_model_view,
    "page-compare": Shots.page_compare,
    "learn": Shots.learn,
    "ablation": Shots.ablation,
    "why": Shots.why,
    "why-phone": Shots.why_phone,
    "swin-shifted-window": Shots.swin_shifted_window,
    "learn-swin": Shots.learn_swin,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(NAMES), help="take only these pictures")
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go (default docs/)")
    ap.add_argument("--list", action="store_true", help="print the pictures' names and exit")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(NAMES))
        return 0
    from playwright.sync_api import sync_playwright

    names = a.only or list(NAMES)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / SWIN_CHECKPOINT
        write_checkpoint(checkpoint, SWIN_ARCH)
        server = Server({"HEADSCOPE_EXTRA_MODELS": json.dumps([f"local:{SWIN_ARCH}@{checkpoint}"])})
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    shots = Shots(browser, server.url, a.out)
                    for name in names:
                        NAMES[name](shots)
                finally:
                    browser.close()
        finally:
            server.stop()
    print(f"{len(names)} pictures in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
