"""Issue 33, item 8, against the real server: every route of the API schema takes exactly the query
parameters it declares; anything else is 422 ``invalid_parameter`` in the one error body, before
any work (admission, decoding, a computation) is done."""

from __future__ import annotations

import httpx
import pytest

from helpers.api import API, assert_error, fresh_png, post
from helpers.server import HTTP_TIMEOUT

# Routes the issue names: the walk below must reach them (it walks whatever the schema lists).
NAMED = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/v1/models",
    "/api/v1/models/catalog",
    "/api/v1/models/catalog/{name}/load",
    "/api/v1/images/{image_id}",
    "/api/v1/attention",
    "/api/v1/attention/{image_id}",
    "/api/v1/attention/{image_id}/stats",
    "/api/v1/attention/{image_id}/explain",
    "/api/v1/attention/{image_id}/output",
    "/api/v1/attention/{image_id}/importance",
    "/api/v1/attention/{image_id}/importance/progress",
    "/api/v1/attention/{image_id}/pruning",
    "/api/v1/attention/{image_id}/pruning/progress",
}
# Unknown everywhere, or (temperature, ablate) unknown where a route does not take them.
PROBES = [{"x": "1"}, {"temperature": "nan"}, {"ablate": "<script>alert(1)</script>"}, {"": "1"}]
CATALOG_NAME = "vit_small_patch16_224.augreg_in21k"


@pytest.fixture(scope="module")
def schema(base_url) -> dict:
    r = httpx.get(base_url + "/openapi.json", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200
    return r.json()


@pytest.fixture(scope="module")
def known_id(base_url) -> str:
    r = post(base_url, fresh_png(801), layers="-1")
    assert r.status_code == 200, r.text
    return r.json()["image_id"]


def operations(schema: dict):
    """(method, path template, the query parameters it declares) for every operation."""
    for path, item in schema["paths"].items():
        for method, op in item.items():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
            yield method.upper(), path, declared


def call(base: str, method: str, path: str, image_id: str, params: dict) -> httpx.Response:
    url = base + path.replace("{image_id}", image_id).replace("{name}", CATALOG_NAME)
    if method == "POST" and path == API:  # a real upload: only the query string is wrong
        files = {"image": ("x.png", fresh_png(802), "image/png")}
        return httpx.post(url, params=params, files=files, data={"layers": "-1"}, timeout=HTTP_TIMEOUT)
    return httpx.request(method, url, params=params, timeout=HTTP_TIMEOUT)


def test_every_route_refuses_a_query_parameter_it_does_not_declare(base_url, schema, known_id):
    ops = list(operations(schema))
    missing = NAMED - {path for _, path, _ in ops}
    assert not missing, missing
    wrong = []
    for method, path, declared in ops:
        for probe in PROBES:
            name = next(iter(probe))
            r = call(base_url, method, path, known_id, probe)
            if r.status_code != 422:
                wrong.append(f"{method} {path}?{name}=… -> {r.status_code}")
                continue
            assert_error(r, 422)  # the one error body, whatever the code
            error = r.json()["error"]
            if name not in declared and (
                error["code"] != "invalid_parameter" or f"unknown query parameter(s) {name!r}" not in error["message"]
            ):
                wrong.append(f"{method} {path}?{name}=… -> 422 {error['code']}: {error['message']}")
    assert not wrong, "\n".join(wrong)


def test_the_answer_says_what_the_route_takes(base_url, known_id):
    r = httpx.get(f"{base_url}{API}/{known_id}/importance", params={"ablate": "0:0"}, timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "invalid_parameter")  # was: 200 with the unablated importance
    message = r.json()["error"]["message"]
    assert "'ablate'" in message and "it takes method, model, wait" in message
    r = httpx.get(base_url + "/healthz", params={"verbose": "1"}, timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "invalid_parameter")
    assert "it takes no query parameters" in r.json()["error"]["message"]
    # Several unknown ones are named together; declared ones beside them are fine.
    r = httpx.get(f"{base_url}{API}/{known_id}/output", params={"a": "1", "b": "2", "model": ""}, timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "invalid_parameter")
    assert "'a', 'b'" in r.json()["error"]["message"]


def test_declared_parameters_still_work_and_the_page_takes_its_own(base_url, known_id):
    r = httpx.get(f"{base_url}{API}/{known_id}", params={"layers": "-1", "heads": "0"}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{base_url}{API}/{known_id}/stats", params={"mass": "0.5"}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    # The page's query string is for its script (a shared view), not for the server.
    r = httpx.get(base_url + "/", params={"image": known_id, "layer": "3", "q": "cls", "x": "1"}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
