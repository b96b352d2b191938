"""``/guide/`` where the documentation site is not built: a 404 that says how to build it or where
the documentation is, where it was a bare "Not Found" at the address docs/cli.md gives."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from headscope import paths
from headscope.config import Settings
from headscope.web import main


@pytest.mark.parametrize("docs_url", ["", "https://docs.example.org/headscope/"])
def test_the_guide_without_a_built_site_says_where_the_docs_are(monkeypatch, tmp_path, docs_url):
    monkeypatch.setattr(paths, "built_docs_dir", lambda: None)
    monkeypatch.setattr(main, "_load_default", lambda registry, model_id=None: None)  # no model needed
    app = main.create_app(Settings(model="random:test_vit", models_dir=tmp_path, docs_url=docs_url))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for path in ("/guide", "/guide/", "/guide/relevance/"):
            r = client.get(path)
            assert r.status_code == 404, path
            error = r.json()["error"]
            assert error["code"] == "not_found"
            said = f"the documentation is at {docs_url}" if docs_url else "run `make docs`"
            assert said in error["message"], error
