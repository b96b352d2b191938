"""CORS, headers, and no client-chosen model sources."""

from __future__ import annotations

import httpx
import pytest

from helpers.api import API, assert_error, post
from helpers.server import HTTP_TIMEOUT


def preflight(base: str, origin: str) -> httpx.Response:
    return httpx.options(
        base + API, headers={"Origin": origin, "Access-Control-Request-Method": "POST"}, timeout=HTTP_TIMEOUT
    )


def test_no_cors_by_default(base_url):
    r = preflight(base_url, "https://evil.example")
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(base_url + "/api/v1/models", headers={"Origin": "https://evil.example"}, timeout=HTTP_TIMEOUT)
    assert "access-control-allow-origin" not in r.headers


def test_cors_allow_list_never_reflects_others(server_factory):
    # '*' is refused at start-up (tests/unit/test_config.py): it was dropped unsaid, leaving CORS off.
    srv = server_factory({"HEADSCOPE_CORS_ORIGINS": "https://good.example"})
    ok = preflight(srv.url, "https://good.example")
    assert ok.headers.get("access-control-allow-origin") == "https://good.example"
    assert ok.headers.get("access-control-allow-credentials") != "true"
    bad = preflight(srv.url, "https://evil.example")
    assert bad.headers.get("access-control-allow-origin") not in ("https://evil.example", "*")
    r = httpx.get(srv.url + "/api/v1/models", headers={"Origin": "https://evil.example"}, timeout=HTTP_TIMEOUT)
    assert r.headers.get("access-control-allow-origin") is None


def test_page_headers(base_url):
    r = httpx.get(base_url + "/", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    "model",
    [
        "local:vit_small_patch16_224@/etc/passwd",
        "https://example.com/model.safetensors",
        "timm:vit_base_patch16_224",
        "random:test_vit",
        "../models/dinov2-s14-focus",
    ],
)
def test_models_come_only_from_server_configuration(base_url, cat_bytes, model):
    assert_error(post(base_url, cat_bytes, model=model), 404, "unknown_model")
    assert_error(
        httpx.get(f"{base_url}{API}/{'a' * 24}", params={"model": model}, timeout=HTTP_TIMEOUT), 404, "unknown_model"
    )


@pytest.fixture(scope="module")
def cat_bytes(samples):
    return samples["cat"].read_bytes()
