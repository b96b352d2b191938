"""The any-model picker without a mouse (#43), in real Chromium against a real --any-model server
(offline hub: nothing is loaded here), keys only, at 1280x800 and at 200 % zoom: the page's arrow
and Escape shortcuts stay out of the dialog (Escape closes it from a result, ArrowRight there leaves
the head behind it alone), and axe-core finds no WCAG 2 / 2.1 A or AA violation with it open.
"""

from __future__ import annotations

import pytest

from helpers.hub_standin import offline_any_model_server
from helpers.keyboard import SCREENS, axe_violations, focus_in, focused, tab_to
from helpers.page import open_page, upload, view
from helpers.screens import sizes

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def picker_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-keys")
    with offline_any_model_server(root) as srv:
        yield srv


@pytest.fixture
def base_url(picker_server) -> str:  # the page and its guard use this server
    return picker_server.url


# The results list answers the words typed last (each key starts a search; a loaded machine answers
# the earlier ones too).
ANSWERED = "q => document.querySelector('[data-testid=model-results]').dataset.query === q"
SEARCH_AGAIN = """q => { const i = document.querySelector('[data-testid=model-search]');
    i.value = q; i.dispatchEvent(new Event('input')); }"""


@pytest.mark.parametrize("screen", sizes(["1280x800", "zoom200"]))
def test_escape_and_arrows_in_the_model_picker_stay_in_the_dialog(page_at, base_url, samples, screen):
    width, height, options = SCREENS[screen]
    page = page_at(width, height, **options)
    open_page(page, base_url)
    before = upload(page, samples["cat"])
    tab_to(page, "[data-testid=model-search-open]", most=10)
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('[data-testid=model-dialog]').open")
    assert focused(page)["testid"] == "model-search"
    page.locator("[data-testid=model-result]").first.wait_for()
    page.keyboard.type("test_vit")
    page.wait_for_function(ANSWERED, arg="test_vit")
    assert page.locator("[data-testid=model-result]").count() == 3
    tab_to(page, "[data-testid=model-result]", most=5)
    assert focus_in(page, "[data-testid=model-dialog]")
    assert axe_violations(page) == []
    # The arrows belong to the dialog: the head behind it stays.
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowUp")
    assert (view(page)["layer"], view(page)["head"]) == (before["layer"], before["head"])
    assert page.input_value("[data-testid=head]") == before["head"]
    # Escape from a result closes the dialog; focus goes back to the button that opened it.
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.querySelector('[data-testid=model-dialog]').open")
    assert focused(page)["testid"] == "model-search-open"
    assert view(page)["query"] == before["query"]  # the page's Escape (back to CLS) did not run either


def test_a_later_answer_keeps_the_focus_of_a_keyboard_user_in_the_dialog(page_at, base_url):
    """Typing on while focus is on a result (a search answered late) replaces every button: focus
    stays on the same model, or goes to the search field when it is gone, never behind the dialog."""
    page = page_at(1280, 800)
    open_page(page, base_url)
    tab_to(page, "[data-testid=model-search-open]", most=10)
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('[data-testid=model-dialog]').open")
    page.keyboard.type("test_vit")
    page.wait_for_function(ANSWERED, arg="test_vit")
    tab_to(page, "[data-testid=model-result]", most=5)
    page.keyboard.press("Tab")
    was = focused(page)
    assert was["testid"] == "model-result"
    page.evaluate("() => { document.activeElement.dataset.old = '1'; }")
    page.evaluate(SEARCH_AGAIN, "test_vit ")  # the same words: the same models, new buttons
    page.wait_for_function("() => !document.querySelector('[data-testid=model-results] [data-old]')")
    now = focused(page)
    assert (now["testid"], now["data"].get("name")) == ("model-result", was["data"]["name"])
    assert "old" not in now["data"]  # the new button of that model, not the old one
    page.evaluate(SEARCH_AGAIN, "no-such-model-anywhere")
    page.wait_for_function(ANSWERED, arg="no-such-model-anywhere")
    assert page.locator("[data-testid=model-result]").count() == 0
    assert focused(page)["testid"] == "model-search"


def test_enter_in_the_search_box_loads_nothing_and_escape_there_closes_the_dialog(page_at, base_url):
    """Enter in the search box moves to the first result (a load is a download: only Enter on a
    result starts one), or stays put with none; Escape closes the dialog from the search box too,
    typed words or not (a search field alone would only clear itself)."""
    page = page_at(1280, 800)
    loads = []
    page.on("request", lambda r: loads.append(r.url) if r.method == "POST" and "/catalog/" in r.url else None)
    open_page(page, base_url)
    tab_to(page, "[data-testid=model-search-open]", most=10)
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('[data-testid=model-dialog]').open")
    page.locator("[data-testid=model-result]").first.wait_for()
    page.keyboard.press("Enter")  # the empty box
    first = page.eval_on_selector("[data-testid=model-result]", "b => b.dataset.name")
    assert (focused(page)["testid"], focused(page)["data"].get("name")) == ("model-result", first)
    page.keyboard.press("Shift+Tab")
    assert focused(page)["testid"] == "model-search"
    page.keyboard.type("no-such-model-anywhere")
    page.wait_for_function(ANSWERED, arg="no-such-model-anywhere")
    page.keyboard.press("Enter")  # no result: nothing happens
    assert focused(page)["testid"] == "model-search"
    page.wait_for_timeout(300)
    assert loads == [] and page.is_hidden("[data-testid=model-load]")
    # Escape with words in the box: the dialog closes, focus goes back to its opener.
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.querySelector('[data-testid=model-dialog]').open")
    assert focused(page)["testid"] == "model-search-open"
