"""``/readyz`` through start-up in-process: ``loading`` while a configured model is still being
tried after the default failed (an alert keyed on ``failed`` fired for a server about to serve),
``failed`` only once none is left. The loads are stand-ins that fail or wait when told."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from headscope.config import Settings
from headscope.web import main
from helpers.waiting import wait_until

FIRST, SECOND = "random:test_vit", "random:test_vit2"


@pytest.fixture
def loads(monkeypatch):
    """The stand-in loads: a model id in ``broken`` fails; the others wait for ``release``."""
    release = threading.Event()
    broken: set[str] = set()

    def load(registry, model_id=None):
        if model_id in broken:
            raise RuntimeError(f"{model_id} has broken weights")
        assert release.wait(60), "the test never released the load"

    monkeypatch.setattr(main, "_load_default", load)
    yield broken, release
    release.set()  # a failed test leaves no worker thread waiting


def ready(client: TestClient) -> tuple[int, dict]:
    r = client.get("/readyz")
    return r.status_code, r.json()


def test_loading_while_another_model_is_tried_then_ready(loads, tmp_path):
    broken, release = loads
    broken.add(FIRST)
    app = main.create_app(Settings(model=f"{FIRST},{SECOND}", models_dir=tmp_path))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        wait_until(lambda: app.state.registry.error(FIRST), 60, "the default's load to fail")
        assert ready(client) == (
            503,
            {"status": "loading", "model": FIRST, "load_errors": {FIRST: f"{FIRST} has broken weights"}},
        )
        release.set()
        wait_until(lambda: ready(client)[0] == 200, 60, "the other model to load")
        assert ready(client) == (200, {"status": "ready", "model": SECOND})


def test_failed_once_no_model_is_left_to_try(loads, tmp_path):
    broken, _ = loads
    broken.update({FIRST, SECOND})
    app = main.create_app(Settings(model=f"{FIRST},{SECOND}", models_dir=tmp_path))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        wait_until(lambda: app.state.fatal, 60, "start-up to give up")
        status, body = ready(client)
    assert status == 503 and body["status"] == "failed" and body["reason"] == f"{FIRST} has broken weights"
    assert body["load_errors"] == {m: f"{m} has broken weights" for m in (FIRST, SECOND)}


def test_a_default_refused_before_start_up_is_listed_while_the_next_loads(loads, tmp_path):
    """`headscope serve`'s check refused the default (a misspelt name): it is never tried here,
    yet /readyz names it with why while the next model loads (it said only "loading")."""
    _, release = loads
    app = main.create_app(Settings(model=f"{FIRST},{SECOND}", models_dir=tmp_path))
    app.state.startup_problems = {FIRST: ("timm has no model named 'x'", True)}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert ready(client) == (
            503,
            {"status": "loading", "model": FIRST, "load_errors": {FIRST: "timm has no model named 'x'"}},
        )
        release.set()
        wait_until(lambda: ready(client)[0] == 200, 60, "the other model to load")
