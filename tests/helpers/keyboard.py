"""The page without a mouse: axe-core's check, Tab walks, what has focus and whether it is in view."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.server import ROOT

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"  # package.json's devDependency (make test: npm ci)
WCAG = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]

# Two screens for every keyboard test: a desktop window, and the same window at 200 % zoom (half the
# CSS pixels at twice the device pixels, as Chromium's zoom does).
# (width, height, new_context options) for conftest's page_at.
SCREENS = {
    "1280x800": (1280, 800, {}),
    "zoom200": (640, 400, {"device_scale_factor": 2}),
    "phone": (390, 844, {"device_scale_factor": 3, "is_mobile": True, "has_touch": True}),
}


def axe_source() -> str:
    if not AXE.exists():
        pytest.skip(f"axe-core is not installed ({AXE} missing): npm ci (make test runs it)")
    return Path(AXE).read_text()


def axe_violations(page) -> list[dict]:
    """axe-core's WCAG 2 / 2.1 A and AA violations on the page as it is now (id, impact, the first nodes).

    The script goes in through the DevTools protocol (page.evaluate), which the page's CSP allows."""
    if not page.evaluate("() => !!window.axe"):
        page.evaluate(axe_source())
    return page.evaluate(
        """tags => axe.run(document, {runOnly: {type: 'tag', values: tags}}).then(r => r.violations.map(v => ({
            id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ') + ' :: ' + n.failureSummary)})))""",
        WCAG,
    )


def focused(page) -> dict:
    """What has focus: its tag, data-testid, id, role, accessible-name attributes and data-*."""
    return page.evaluate(
        """() => { const e = document.activeElement;
            return {tag: e.tagName, testid: e.dataset.testid || '', id: e.id, role: e.getAttribute('role') || '',
                    label: e.getAttribute('aria-label') || '', text: e.textContent.trim().slice(0, 80),
                    tabindex: e.getAttribute('tabindex'), data: {...e.dataset}}; }"""
    )


def focus_in(page, selector: str) -> bool:
    return page.evaluate("s => !!document.activeElement.closest(s)", selector)


def tab_to(page, selector: str, most: int = 60, back: bool = False) -> int:
    """Press Tab (Shift+Tab with ``back``) until focus is inside ``selector``; returns the presses."""
    for n in range(1, most + 1):
        page.keyboard.press("Shift+Tab" if back else "Tab")
        if focus_in(page, selector):
            return n
    raise AssertionError(f"{selector} never got focus in {most} Tab presses; focus on {focused(page)}")


# Where the focused element is against the bars that stay on screen: the sticky top bar and the
# layer/head/query dock fixed to the bottom (a phone, 200 % zoom). Elements inside a bar are in view
# by definition. A zero-size element (the file input) is measured by its label.
FOCUS_BOX = """() => {
    const e = document.activeElement;
    if (!e || e === document.body) return null;
    let box = e.getBoundingClientRect();
    if (box.width * box.height === 0 && e.closest('label')) box = e.closest('label').getBoundingClientRect();
    const bar = (sel) => {
        const b = document.querySelector(sel);
        if (!b) return null;
        const pos = getComputedStyle(b).position;
        return pos === 'fixed' || pos === 'sticky' ? b.getBoundingClientRect() : null;
    };
    const top = bar('#topbar'), dock = bar('#view-dock');
    const inBar = !!e.closest('#topbar, #view-dock, .skip-links, dialog');
    return {name: (e.dataset.testid || e.id || e.className || e.tagName) + '', tag: e.tagName,
            top: box.top, bottom: box.bottom, height: box.height, vh: innerHeight, inBar,
            topBar: top && top.top <= 0.5 ? top.bottom : 0, dockTop: dock ? dock.top : innerHeight};
}"""


def hidden_by_bars(page) -> dict | None:
    """The focused element's box when a fixed bar or the window's edge hides part of it, else None."""
    b = page.evaluate(FOCUS_BOX)
    if b is None or b["inBar"] or b["height"] == 0:
        return None
    # taller than the room between the bars: its top must show
    room = b["dockTop"] - b["topBar"]
    if b["height"] > room:
        return None if b["topBar"] - 1 <= b["top"] < b["dockTop"] else b
    return None if b["top"] >= b["topBar"] - 1 and b["bottom"] <= b["dockTop"] + 1 else b
