"""Driving the notebook view (``att.widget()``, ``att.to_html()``) in Chromium: a minimal anywidget
host for the widget's own ES module, the standalone file, the first draw's times. Used by
tests/python/test_view_widget.py and bench/view_draw.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

VIEW = "[data-testid=hs-view]"
QUERY = "[data-testid=hs-query]"
OVERLAY = "[data-testid=hs-overlay]"
BINARY = ("logp", "logp_max", "image")

# A minimal anywidget host: the widget's ES module text, imported from a blob: URL, given a model
# over the widget's synced state (bytes traits as DataViews, as anywidget gives them) that records
# what the view saves (what the kernel would receive) in window.saved.
HOST = """
async ([esm, values, binary]) => {
  for (const k of binary) {
    const s = atob(values[k]);
    const b = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
    values[k] = new DataView(b.buffer);
  }
  const handlers = {};
  window.saved = [];
  const model = {
    get: (k) => values[k],
    set: (k, v) => { values[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); },
    save_changes: () => window.saved.push({ ...values, logp: null, logp_max: null, image: null }),
    on: (e, f) => { (handlers[e] = handlers[e] || []).push(f); },
    off: (e, f) => { handlers[e] = (handlers[e] || []).filter((g) => g !== f); },
  };
  const url = URL.createObjectURL(new Blob([esm], { type: "text/javascript" }));
  const mod = await import(url);
  const el = document.createElement("div");
  document.body.append(el);
  window.cleanup = mod.default.render({ model, el });
}
"""


def widget_values(w) -> dict:
    """The widget's synced traits (its own, not ipywidgets' layout/comm ones), bytes as base64."""
    import anywidget

    base = set(anywidget.AnyWidget.class_trait_names(sync=True))
    values = {k: getattr(w, k) for k in w.trait_names(sync=True) if k not in base and not k.startswith("_")}
    for k in BINARY:
        values[k] = base64.b64encode(values[k]).decode()
    return json.loads(json.dumps(values))


def draw_widget(page, w, folder: Path, timeout: float = 30_000) -> float:
    """Render widget ``w`` through its ES module in ``page`` (a file: host page in ``folder``);
    returns the first draw's milliseconds (render() -> the overlay over the picture)."""
    host = folder / "host.html"
    host.write_text("<!doctype html><meta charset=utf-8><body></body>")
    page.goto(host.as_uri())
    page.evaluate(HOST, [w._esm, widget_values(w), list(BINARY)])
    page.wait_for_selector(f"{VIEW}[data-drawn='1']", timeout=timeout)
    return float(page.get_attribute(VIEW, "data-first-draw-ms"))


def open_file(page, path: Path, timeout: float = 60_000) -> tuple[float, float]:
    """Open a ``to_html`` file from disk; returns its first draw's milliseconds after render()
    and after the document began to load (parsing and decoding the embedded data too)."""
    page.goto(Path(path).resolve().as_uri())
    page.wait_for_selector(f"{VIEW}[data-drawn='1']", timeout=timeout)
    return float(page.get_attribute(VIEW, "data-first-draw-ms")), float(page.get_attribute(VIEW, "data-since-start-ms"))


def click_cell(page, r: int, c: int, grid: tuple[int, int]) -> None:
    """Click the middle of grid cell (r, c) of the overlay."""
    box = page.locator(OVERLAY).bounding_box()
    R, C = grid
    page.mouse.click(box["x"] + box["width"] * ((c + 0.5) / C), box["y"] + box["height"] * ((r + 0.5) / R))
