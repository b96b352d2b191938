"""Answers that come late or fail while the person changes something, in real Chromium against a
real server (tests/helpers/fetch_faults.py delays or refuses chosen requests in the page): what
the page gives up, asks again or keeps. A model switch's: tests/browser/test_learn.py.

Every test gets a fresh page whose guard (tests/browser/conftest.py) fails it on a console
error (a refused request is allowed where the test refuses one), an uncaught exception, a dialog
or a request to another host.
"""

from __future__ import annotations

import pytest

from helpers import fetch_faults
from helpers.api import fresh_png
from helpers.page import ERROR, open_page, upload, wait_view

pytestmark = pytest.mark.browser

SLOW_MS = 240_000


def test_importance_of_a_picture_left_is_given_up(page, base_url, tmp_path):
    """It held this page's share of the server's heavy work, so the next picture's was refused 429."""
    page.set_default_timeout(SLOW_MS)
    fetch_faults.install(page)
    open_page(page, base_url, "?view=ablation")
    first = tmp_path / "first.png"
    first.write_bytes(fresh_png(size=(224, 224)))  # not in the server's cache: the sweep takes a while
    upload(page, first)
    page.click("[data-testid=importance-run]")
    page.wait_for_function("() => window.__log.some((e) => /\\/importance\\?/.test(e.url))")
    second = tmp_path / "second.png"
    second.write_bytes(fresh_png(size=(224, 224)))
    upload(page, second)
    page.wait_for_function(
        "() => window.__log.filter((e) => /\\/(importance|pruning)\\?/.test(e.url)).every((e) => e.error || e.status)"
    )
    left = [r for r in fetch_faults.requests(page, r"/(importance|pruning)\?") if "wait=" in r["url"]]
    assert left and all(r["error"] == "AbortError" for r in left), left


def test_a_rollout_that_failed_ahead_is_asked_again_once_chosen(page, base_url, samples, guard):
    guard.allow_http_errors = True
    fetch_faults.install(page)
    open_page(page, base_url)
    fetch_faults.refuse(page, "aggregate=rollout")
    v = upload(page, samples["cat"])
    page.wait_for_function("() => window.__log.some((e) => /aggregate=rollout/.test(e.url) && e.status === 429)")
    page.select_option("[data-testid=head]", "rollout")
    wait_view(page, image=v["image"], head="rollout")
    page.wait_for_function("() => document.querySelector('[data-testid=overlay]').dataset.pending === '0'")
    assert [r["status"] for r in fetch_faults.requests(page, "aggregate=rollout")][-1] == 200
    assert page.is_hidden(ERROR)


def test_a_busy_answer_in_inside_a_head_can_be_tried_again(page, base_url, samples, guard):
    guard.allow_http_errors = True
    fetch_faults.install(page)
    open_page(page, base_url, "?view=learn")
    fetch_faults.refuse(page, "/explain")
    upload(page, samples["cat"])
    retry = page.locator("#error-retry")
    retry.wait_for(state="visible")
    retry.click()
    page.wait_for_function("() => window.__log.filter((e) => /\\/explain/.test(e.url)).some((e) => e.status === 200)")
    page.wait_for_selector(ERROR, state="hidden")
    # Another head and back: asked again after a busy answer (it stayed failed for the session).
    fetch_faults.refuse(page, "/explain.*head=1")
    page.select_option("[data-testid=head]", "1")
    page.wait_for_function("() => window.__log.some((e) => /head=1/.test(e.url) && e.status === 429)")
    page.select_option("[data-testid=head]", "0")
    page.select_option("[data-testid=head]", "1")
    page.wait_for_function("() => window.__log.some((e) => /explain.*head=1/.test(e.url) && e.status === 200)")


@pytest.mark.thorough
def test_a_busy_faithfulness_test_can_be_run_again(page, base_url, samples, guard):
    """Refused busy three times, it stayed failed for good: no Try again, Run did nothing, and the
    chart said it was running."""
    page.set_default_timeout(SLOW_MS)
    guard.allow_http_errors = True
    fetch_faults.install(page)
    open_page(page, base_url, "?view=why")
    fetch_faults.refuse(page, r"/faithfulness\?", times=3)
    upload(page, samples["cat"])
    page.wait_for_selector("[data-testid=faithfulness-run]:not([aria-disabled=true])")
    page.click("[data-testid=faithfulness-run]")
    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=failed]")
    page.locator("#error-retry").wait_for(state="visible")
    assert "Running the test" not in page.inner_text("[data-testid=faithfulness-chart]")
    assert page.get_attribute("[data-testid=faithfulness-run]", "aria-disabled") != "true"
    page.click("[data-testid=faithfulness-run]")
    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=done]")
    page.wait_for_selector(ERROR, state="hidden")
    asked = [r["status"] for r in fetch_faults.requests(page, r"/faithfulness\?")]
    assert asked[:3] == [429, 429, 429] and asked[-1] == 200, asked


def test_a_test_that_fails_while_another_view_is_shown_is_said_when_the_view_is_back(page, base_url, samples, guard):
    """The Why view's test goes on when another view is shown; its failure was a banner over that
    view. It is said once the Why view is shown again."""
    guard.allow_http_errors = True
    fetch_faults.install(page)
    open_page(page, base_url, "?view=why")
    upload(page, samples["cat"])
    page.wait_for_selector("[data-testid=faithfulness-run]:not([aria-disabled=true])")
    fetch_faults.refuse(page, r"/faithfulness\?", status=500, code="internal", message="It broke.", after_ms=1500)
    page.click("[data-testid=faithfulness-run]")
    page.click("[data-testid=viewer-tab]")
    page.wait_for_function("() => window.__log.some((e) => /\\/faithfulness\\?/.test(e.url) && e.status === 500)")
    page.wait_for_timeout(300)  # the page's handling of the answer
    assert page.is_hidden(ERROR)
    page.click("[data-testid=why-tab]")
    page.wait_for_selector("[data-testid=faithfulness-progress][data-state=failed]")
    page.wait_for_selector(ERROR)
    assert "It broke." in page.inner_text(ERROR)
