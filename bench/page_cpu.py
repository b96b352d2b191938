"""``python -m bench.page_cpu``: what the page costs the browser, in Chromium's CPU seconds.

A real server (this checkout) and Debian's Chromium through Playwright, a 1280 x 900 window. Per
round, a fresh page: the picture chosen as a person does, then ``--clicks`` heads clicked in
the grid, then every chart scrolled to (what a person who reads them all pays). Each step's cost
is the renderer's ``TaskDuration`` and ``ScriptDuration`` (the DevTools protocol's Performance
metrics: main-thread time, not wall time, so a loaded machine moves it less), measured from
the step's start until the page has settled. Medians of ``--rounds``. Plotly is loaded and
evaluated before the upload in each round, so its 0.8 s of evaluation is in none of the rows.

Run it before and after a change to the front end and compare the rows in one sitting (the
machine's speed drifts between sittings); the performance page keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers.chromium import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from helpers.page import open_page, upload, wait_view  # noqa: E402

from .api import start_server  # noqa: E402

SETTLE_MS = 1500  # charts and tiles that follow the overlay: drawn within this on a slow machine


def metrics(cdp) -> tuple[float, float]:
    m = {x["name"]: x["value"] for x in cdp.send("Performance.getMetrics")["metrics"]}
    return m["TaskDuration"], m["ScriptDuration"]


def one_round(browser, url: str, image: Path, clicks: int) -> dict[str, float]:
    """One fresh page: the upload, the clicks on heads, the scroll through every chart."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = ctx.new_page()
        page.set_default_timeout(180_000)
        cdp = ctx.new_cdp_session(page)
        cdp.send("Performance.enable")
        open_page(page, url)
        page.wait_for_function("() => typeof window.Plotly === 'object'")
        page.wait_for_timeout(SETTLE_MS)
        out: dict[str, float] = {}
        t0 = metrics(cdp)
        upload(page, image)
        page.wait_for_selector("[data-testid=analytics][data-state=ready]")
        page.wait_for_timeout(SETTLE_MS)
        t1 = metrics(cdp)
        out["upload_task_s"], out["upload_script_s"] = t1[0] - t0[0], t1[1] - t0[1]
        heads = page.eval_on_selector_all(
            "[data-testid=head-grid] .tile[data-head]",
            "ts => ts.map(t => t.dataset.head).filter(h => /^\\d+$/.test(h))",
        )
        per_click = []
        for h in [h for h in heads if h != "0"][:clicks]:
            a = metrics(cdp)
            page.click(f"[data-testid=head-grid] .tile[data-head='{h}']")
            wait_view(page, head=h)
            page.wait_for_timeout(SETTLE_MS // 2)
            per_click.append(metrics(cdp)[0] - a[0])
        out["click_task_s"] = statistics.median(per_click)
        a = metrics(cdp)
        for chart in page.eval_on_selector_all(
            ".chart[data-testid]", "cs => cs.filter(c => c.getClientRects().length).map(c => c.id)"
        ):
            page.evaluate("id => document.getElementById(id).scrollIntoView({block: 'center'})", chart)
            page.wait_for_function(
                "id => ['1', undefined].includes(document.getElementById(id).dataset.rendered)",
                arg=chart,
            )
        page.wait_for_timeout(SETTLE_MS // 2)
        out["scroll_all_charts_task_s"] = metrics(cdp)[0] - a[0]
        return out
    finally:
        ctx.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.page_cpu", description=__doc__)
    p.add_argument("--image", default=str(ROOT / "static" / "samples" / "cat.png"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clicks", type=int, default=5, help="heads clicked per round")
    p.add_argument("--chromium", default=CHROMIUM, help="the browser (HEADSCOPE_CHROMIUM, as the tests)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)

    from playwright.sync_api import sync_playwright

    rounds = []
    with tempfile.TemporaryDirectory() as d, sync_playwright() as pw:
        server = start_server({}, Path(d))
        try:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            for _ in range(args.rounds):
                rounds.append(one_round(browser, server.url, Path(args.image), args.clicks))
            browser.close()
        finally:
            server.stop()
    out = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    out["rounds"] = args.rounds
    out["image"] = Path(args.image).name
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
