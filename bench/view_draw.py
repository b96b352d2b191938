"""``python -m bench.view_draw``: the notebook view's first draw in Chromium, and what it ships.

For the default model and a sample photo: the time to build the widget in Python (every row of
the result's layers as float16 log-probabilities; the first build also imports anywidget) and to
write ``to_html``; the bytes shipped; the
first draw in Chromium of the widget's own ES module (a minimal anywidget host: render() ->
the overlay over the picture) and of the standalone file (after render(), and after the file
began to load: parsing and decoding the embedded data too). Medians of ``--rounds``, each in a
fresh page. Target: the first draw under 1 s (#28). Run it with ``headscope`` importing this
checkout (``PYTHONPATH`` holding a ``headscope`` link to ``app/`` in a worktree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers.view_host import draw_widget, open_file  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
TARGET_MS = 1000.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.view_draw", description=__doc__)
    p.add_argument("--image", default=str(ROOT / "static" / "samples" / "cat.png"))
    p.add_argument("--layers", default="all", help="the result's layers (what the view ships)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args(argv)

    from playwright.sync_api import sync_playwright

    import headscope

    scope = headscope.load(device="cpu")
    att = scope.attention(args.image, layers=args.layers)
    t = time.perf_counter()
    w = att.widget()
    cold_s = time.perf_counter() - t  # the first also imports anywidget (and ipywidgets)
    builds = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        w = att.widget()
        builds.append(time.perf_counter() - t)
    out: dict = {
        "model": att.model,
        "image": Path(args.image).name,
        "grid": list(att.grid),
        "shape": w.shape,
        "logp_bytes": len(w.logp) + len(w.logp_max),
        "image_bytes": len(w.image),
        "widget_build_first_ms": round(1000 * cold_s, 1),
        "widget_build_ms": round(1000 * statistics.median(builds), 1),
    }
    with tempfile.TemporaryDirectory() as d, sync_playwright() as pw:
        folder = Path(d)
        t = time.perf_counter()
        path = att.to_html(folder / "view.html")
        out["to_html_ms"] = round(1000 * (time.perf_counter() - t), 1)
        out["html_bytes"] = path.stat().st_size
        browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        widget_ms, file_render_ms, file_start_ms = [], [], []
        for _ in range(args.rounds):
            page = browser.new_page(viewport={"width": 1000, "height": 800})
            widget_ms.append(draw_widget(page, w, folder))
            page.close()
            page = browser.new_page(viewport={"width": 1000, "height": 800})
            a, b = open_file(page, path)
            file_render_ms.append(a)
            file_start_ms.append(b)
            page.close()
        browser.close()
    out["widget_first_draw_ms"] = statistics.median(widget_ms)
    out["file_first_draw_after_render_ms"] = statistics.median(file_render_ms)
    out["file_first_draw_after_load_ms"] = statistics.median(file_start_ms)
    worst = max(out["widget_first_draw_ms"], out["file_first_draw_after_load_ms"])
    out["target"] = f"first draw < {TARGET_MS:.0f} ms: {'PASS' if worst < TARGET_MS else 'MISS'}"
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
