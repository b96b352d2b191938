"""Reading and clicking the page's Plotly charts (the browser tests)."""

from __future__ import annotations

import math

# The chart element at (or inside) the element with a data-testid (the card of the entropy heat
# map has the testid entropy-heatmap, its chart chart-entropy).
_CHART = (
    "(id => { const e = document.querySelector(`[data-testid=${id}]`);"
    " return e.matches('.chart') ? e : e.querySelector('.chart'); })"
)


def show_chart(page, testid: str, timeout: float | None = None) -> None:
    """Scroll the chart at (or inside) ``testid`` to the middle of the screen and wait until it is
    drawn: a chart out of sight waits to be drawn (data-rendered="waiting", charts.js) until it
    comes near the viewport, as when a person scrolls to it."""
    page.evaluate(f"id => {_CHART}(id).scrollIntoView({{block: 'center'}})", testid)
    page.wait_for_function(
        f"id => {{ const el = {_CHART}(id);"
        " return el.dataset.rendered === '1' && !!el.querySelector('svg.main-svg'); }",
        arg=testid,
        timeout=timeout,
    )


def wait_plotted(page, testid: str, timeout: float | None = None) -> None:
    """Wait until the chart at (or inside) ``testid`` has its traces: drawn, or waiting to be
    drawn until it is scrolled to (show_chart draws it)."""
    page.wait_for_function(
        f"id => ['1', 'waiting'].includes({_CHART}(id).dataset.rendered)", arg=testid, timeout=timeout
    )


def show_all_charts(page, timeout: float | None = None) -> list[str]:
    """Scroll to each shown chart still waiting to be drawn, in page order, until all are drawn;
    the testids of the charts it scrolled to."""
    shown = []
    while True:
        waiting = page.eval_on_selector_all(
            ".chart[data-rendered=waiting]",
            "cs => cs.filter(c => c.getClientRects().length > 0).map(c => c.dataset.testid)",
        )
        if not waiting:
            return shown
        show_chart(page, waiting[0], timeout)
        shown.append(waiting[0])


def plot_data(page, testid: str) -> list[dict]:
    """The traces of the Plotly chart at (or inside) the element with this data-testid, scrolled
    to and drawn first (show_chart)."""
    show_chart(page, testid)
    return page.evaluate(
        f"""id => {_CHART}(id).data.map(t => ({{name: t.name ?? null, type: t.type, x: t.x ?? null,
            y: t.y ?? null, z: t.z ?? null, customdata: t.customdata ?? null}}))""",
        testid,
    )


def assert_matrix(got, want, rel=1e-5, abs_=1e-6) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, list):
            assert_matrix(a, b, rel, abs_)
        else:
            assert math.isclose(a, b, rel_tol=rel, abs_tol=abs_), (a, b)


def click_plot(page, testid: str, x: float, y: float) -> None:
    """Click the chart at data coordinates (x, y); Plotly picks the point from the hover."""
    show_chart(page, testid)
    pos = page.evaluate(
        f"""([id, x, y]) => {{
        const el = {_CHART}(id);
        const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, r = el.getBoundingClientRect();
        return {{x: r.left + xa._offset + xa.l2p(x), y: r.top + ya._offset + ya.l2p(y)}};
    }}""",
        [testid, x, y],
    )
    page.mouse.move(pos["x"] - 3, pos["y"] - 3)
    page.mouse.move(pos["x"], pos["y"])
    page.mouse.click(pos["x"], pos["y"])


def assert_drawings_hidden(page, selector: str = ".js-plotly-plot") -> None:
    """Every SVG of every chart at ``selector`` is hidden from screen readers (the figure's name and
    its table say what it draws) and none of the toolbar's buttons is."""
    hidden = page.eval_on_selector_all(
        selector,
        """cs => cs.map(c => ({
            svgs: [...c.querySelectorAll('svg.main-svg')].map(s => s.getAttribute('aria-hidden')),
            buttons: [...c.querySelectorAll('.modebar-btn')].filter(b => b.closest('[aria-hidden=true]')).length}))""",
    )
    assert hidden and all(set(h["svgs"]) == {"true"} and h["buttons"] == 0 for h in hidden), hidden
