"""The app's middleware stack in-process: a bug in a route is a 500 with every header any other
error has; the documentation site's CSP allows its own inline scripts and no others."""

from __future__ import annotations

import base64
import hashlib
import logging

from fastapi.testclient import TestClient

from headscope.config import Settings
from headscope.web.main import create_app
from headscope.web.middleware import CSP, site_csp

GOOD = "https://good.example"


def test_an_unexpected_error_is_a_500_with_the_id_security_and_cors_headers(caplog):
    app = create_app(Settings(cors_origins=[GOOD]))

    async def broken():
        raise RuntimeError("a bug")

    app.add_api_route("/api/v1/broken", broken, methods=["GET"])
    # No lifespan (no model): the route needs none. The Host is one the server answers to.
    client = TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1")
    with caplog.at_level(logging.ERROR, logger="headscope"):
        r = client.get("/api/v1/broken", headers={"Origin": GOOD, "X-Request-ID": "req-1"})
    assert r.status_code == 500
    assert r.json() == {
        "error": {"code": "internal", "message": "internal error; the server log has details", "request_id": "req-1"}
    }
    assert r.headers["x-request-id"] == "req-1"
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["access-control-allow-origin"] == GOOD
    assert "a bug" not in r.text
    logged = [rec for rec in caplog.records if "req-1" in rec.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback is in the log, under the id
    assert client.get("/healthz").status_code == 200  # and the app goes on


def _sha(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def test_site_csp_allows_the_sites_own_inline_scripts_only(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<script>var a = 1;</script><script src="x.js"></script>'
        '<script id="__config" type="application/json">{"b": 2}</script>'
    )
    # as built on Windows (CRLF): hashed as the bytes are served; a data-src attribute is no src
    (tmp_path / "sub" / "index.html").write_bytes(
        b"<script>\r\nvar c = 3;\r\n</script><script>var a = 1;</script><script data-src=y>var d;</script>"
    )
    csp = site_csp(tmp_path)
    script_src = next(d for d in csp.split("; ") if d.startswith("script-src"))
    want = [_sha("var a = 1;"), _sha("\r\nvar c = 3;\r\n"), _sha("var d;")]
    assert script_src.split() == ["script-src", "'self'", *sorted(want)]
    assert "unsafe-inline" not in script_src
    # every other directive as the page's
    assert [d for d in csp.split("; ") if not d.startswith("script-src")] == [
        d for d in CSP.split("; ") if not d.startswith("script-src")
    ]


def test_a_refused_cors_preflight_is_the_one_json_error():
    """Starlette answered a plain-text "Disallowed CORS origin"; every other error is the JSON body."""
    client = TestClient(create_app(Settings(cors_origins=[GOOD])), base_url="http://127.0.0.1")
    for origin, method, what in (
        ("https://evil.example", "POST", "origin"),
        (GOOD, "PATCH", "method"),
        ("https://evil.example", "PUT", "origin, method"),
    ):
        r = client.options(
            "/api/v1/attention",
            headers={"Origin": origin, "Access-Control-Request-Method": method, "X-Request-ID": "rq"},
        )
        assert r.status_code == 400
        assert r.json() == {
            "error": {
                "code": "cors_refused",
                "message": f"this server does not allow this cross-origin request (its {what})"
                + ("; the origins it allows are set by HEADSCOPE_CORS_ORIGINS" if "origin" in what else ""),
                "request_id": "rq",
            }
        }
        if origin != GOOD:
            assert "access-control-allow-origin" not in r.headers
        assert r.headers["x-content-type-options"] == "nosniff"
    ok = client.options("/api/v1/attention", headers={"Origin": GOOD, "Access-Control-Request-Method": "POST"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == GOOD
