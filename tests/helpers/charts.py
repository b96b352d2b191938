"""Reading and clicking the page's Plotly charts (the browser tests)."""

from __future__ import annotations

import math


def plot_data(page, testid: str) -> list[dict]:
    """The traces of the Plotly chart at (or inside) the element with this data-testid."""
    return page.evaluate(
        """id => {
        let el = document.querySelector(`[data-testid=${id}]`);
        if (!el.classList.contains('js-plotly-plot')) el = el.querySelector('.js-plotly-plot');
        return el.data.map(t => ({name: t.name ?? null, type: t.type, x: t.x ?? null, y: t.y ?? null,
                                  z: t.z ?? null, customdata: t.customdata ?? null}));
    }""",
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
    page.evaluate("id => document.querySelector(`[data-testid=${id}]`).scrollIntoView({block: 'center'})", testid)
    pos = page.evaluate(
        """([id, x, y]) => {
        let el = document.querySelector(`[data-testid=${id}]`);
        if (!el.classList.contains('js-plotly-plot')) el = el.querySelector('.js-plotly-plot');
        const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, r = el.getBoundingClientRect();
        return {x: r.left + xa._offset + xa.l2p(x), y: r.top + ya._offset + ya.l2p(y)};
    }""",
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
