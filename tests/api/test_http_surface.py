"""The HTTP surface an API consumer and a browser page meet, against real servers: every error
carries the id, security and CORS headers; CORS lets an allowed page do and read what the API
offers; 405s name every method of the path; refusals name what was wrong."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from helpers.api import API, assert_error, raw
from helpers.server import HTTP_TIMEOUT, Server

GOOD = "https://good.example"
IMAGE_ID = "a" * 24  # well formed, never uploaded


@pytest.fixture(scope="module")
def cors_server():
    srv = Server({"HEADSCOPE_CORS_ORIGINS": GOOD, "HEADSCOPE_MAX_UPLOAD_BYTES": "100000"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cat_bytes(samples):
    return samples["cat"].read_bytes()


def test_cors_lets_an_allowed_page_cancel_a_task_and_read_the_headers(cors_server):
    pre = httpx.options(
        f"{cors_server.url}/api/v1/tasks/sometoken",
        headers={"Origin": GOOD, "Access-Control-Request-Method": "DELETE"},
        timeout=HTTP_TIMEOUT,
    )
    assert pre.status_code == 200, pre.text
    assert "DELETE" in pre.headers["access-control-allow-methods"]
    r = httpx.delete(f"{cors_server.url}/api/v1/tasks/sometoken", headers={"Origin": GOOD}, timeout=HTTP_TIMEOUT)
    assert_error(r, 404, "task_not_found")
    assert r.headers["access-control-allow-origin"] == GOOD
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"x-request-id", "x-headscope-meta", "content-disposition", "retry-after"} <= exposed


def test_a_refused_preflight_is_the_one_json_error(cors_server):
    """Starlette's plain-text "Disallowed CORS origin", against the real server: 400 cors_refused."""
    asked = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    r = httpx.options(cors_server.url + API, headers=asked, timeout=HTTP_TIMEOUT)
    assert_error(r, 400, "cors_refused")
    assert "HEADSCOPE_CORS_ORIGINS" in r.json()["error"]["message"]
    assert "access-control-allow-origin" not in r.headers
    assert r.headers["x-request-id"] == r.json()["error"]["request_id"]
    assert httpx.get(cors_server.url + "/healthz", timeout=HTTP_TIMEOUT).status_code == 200  # still serving


def test_refusals_before_routing_carry_cors_and_security_headers(cors_server):
    origin = {"Origin": GOOD}
    twice = httpx.get(f"{cors_server.url}{API}/{IMAGE_ID}?layers=1&layers=2", headers=origin, timeout=HTTP_TIMEOUT)
    assert_error(twice, 422, "duplicate_parameter")
    big = httpx.post(  # refused on its declared length, before a byte of it is read
        cors_server.url + API, content=b"x" * 300_000, headers={**origin, "Content-Type": "image/png"}
    )
    assert_error(big, 413, "upload_too_large")
    foreign = httpx.get(
        cors_server.url + "/api/v1/models", headers={**origin, "Host": "evil.example"}, timeout=HTTP_TIMEOUT
    )
    assert_error(foreign, 400, "bad_host")
    for r in (twice, big, foreign):
        assert r.headers["access-control-allow-origin"] == GOOD, r.request.url
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["x-request-id"] == r.json()["error"]["request_id"]


def test_405_names_every_method_of_the_path(base_url):
    spec = httpx.get(base_url + "/openapi.json", timeout=HTTP_TIMEOUT).json()
    for path in ("/healthz", "/api/v1/models/catalog/{name}/load", "/api/v1/tasks/{token}", API):
        methods = {m.upper() for m in spec["paths"][path]}
        if "GET" in methods:
            methods.add("HEAD")  # answered on every GET route
        url = base_url + path.replace("{name}", "vit_small_patch16_224").replace("{token}", "t")
        r = httpx.put(url, timeout=HTTP_TIMEOUT)
        assert_error(r, 405, "method_not_allowed")
        assert {m.strip() for m in r.headers["allow"].split(",")} == methods, path
    r = httpx.put(base_url + "/static/css/app.css", timeout=HTTP_TIMEOUT)
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}


def test_a_refused_parameter_named_query_is_named(base_url):
    r = httpx.get(f"{base_url}{API}/{IMAGE_ID}", params={"query": "1" * 5000}, timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "invalid_parameter")
    assert r.json()["error"]["message"].startswith("query: "), r.text


def test_two_pictures_in_one_form_are_a_repeated_field(base_url, cat_bytes):
    r = httpx.post(
        base_url + API,
        files=[("image", ("a.png", cat_bytes, "image/png")), ("image", ("b.png", cat_bytes, "image/png"))],
        timeout=HTTP_TIMEOUT,
    )
    assert_error(r, 422, "duplicate_field")
    assert "image" in r.json()["error"]["message"]


def test_an_upper_case_image_id_is_told_ids_are_lower_case(base_url):
    r = httpx.get(f"{base_url}{API}/{'A' * 24}", timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "invalid_image_id")
    assert "lower-case" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/vendor/plotly.min.js", "/docs-assets/redoc.standalone.js"])
def test_bundles_answer_304_to_their_etag(base_url, path):
    first = httpx.get(base_url + path, timeout=HTTP_TIMEOUT)
    assert first.status_code == 200 and first.content
    etag = first.headers["etag"]
    again = httpx.get(base_url + path, headers={"If-None-Match": etag}, timeout=HTTP_TIMEOUT)
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    other = httpx.get(base_url + path, headers={"If-None-Match": '"other"'}, timeout=HTTP_TIMEOUT)
    assert other.status_code == 200 and other.content == first.content


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBroken header\r\n\r\n",
        b"GET /heal thz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /api/v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
    ],
)
def test_a_malformed_request_gets_the_one_error_body(base_url, request_head):
    out = raw(urlsplit(base_url).port, request_head)
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert lines[0].startswith("HTTP/1.1 400"), out
    assert headers["content-type"] == "application/json" and headers["x-content-type-options"] == "nosniff"
    error = orjson.loads(body)["error"]
    assert error["code"] == "bad_request" and error["request_id"] == headers["x-request-id"]
    assert httpx.get(base_url + "/healthz", timeout=HTTP_TIMEOUT).status_code == 200


def test_openapi_documents_what_every_route_can_answer(base_url):
    spec = httpx.get(base_url + "/openapi.json", timeout=HTTP_TIMEOUT).json()
    error_body = "#/components/schemas/ErrorBody"
    for path in ("/healthz", "/readyz", "/metrics", "/api/v1/models"):
        got = spec["paths"][path]["get"]["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
        assert got == error_body, path
        assert httpx.get(base_url + path, params={"zzz": "1"}, timeout=HTTP_TIMEOUT).status_code == 422
    images = spec["paths"]["/api/v1/images/{image_id}"]["get"]["responses"]
    for status in ("404", "413", "422", "429"):
        assert images[status]["content"]["application/json"]["schema"]["$ref"] == error_body, status


@pytest.mark.parametrize("path", ["/static/css/app.css", "/vendor/plotly.min.js"])
@pytest.mark.parametrize(
    "value", ["bytes=abc", "items=0-5", "bytes=5-2", "bytes=-", f"bytes=0-{'9' * 5000}", "bytes=0-4", "bytes=-5"]
)
def test_a_range_the_server_cannot_read_is_ignored_and_others_served(base_url, path, value):
    """RFC 9110: an unknown unit or a range that cannot be read is ignored (200, the whole file),
    where Starlette answered 400 in plain text (and 5,000 digits, past int()'s limit, were a 500)."""
    url = base_url + path
    whole = httpx.get(url, timeout=HTTP_TIMEOUT).content
    r = httpx.get(url, headers={"Range": value}, timeout=HTTP_TIMEOUT)
    if value == "bytes=0-4":
        assert r.status_code == 206 and r.content == whole[:5]
    elif value == "bytes=-5":
        assert r.status_code == 206 and r.content == whole[-5:]
    else:
        assert r.status_code == 200 and r.content == whole, value
