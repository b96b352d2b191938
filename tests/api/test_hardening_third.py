"""Issue 33 against real servers: the Host names a server answers to (item 7), ASCII digits in
every number (item 9), one validation code and negative indices read as Python's (item 10)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from test_api import API, assert_error, post

from helpers.api import raw
from helpers.server import HTTP_TIMEOUT


@pytest.fixture(scope="module")
def cat(samples):
    return samples["cat"].read_bytes()


@pytest.fixture(scope="module")
def cat_answer(base_url, cat) -> dict:
    r = post(base_url, cat, layers="-1", heads="0")
    assert r.status_code == 200, r.text
    return r.json()


def get(base: str, path: str = "", host: str | None = None, **params) -> httpx.Response:
    headers = {"Host": host.encode()} if host is not None else None  # bytes: any character goes out as is
    return httpx.get(base + path, params=params, headers=headers, timeout=HTTP_TIMEOUT)


# -- item 7: the Host header ------------------------------------------------------------------

FOREIGN_HOSTS = [
    "evil.example",
    "evil.example:8000",
    "127.0.0.1.nip.io",  # a name that resolves to loopback: the rebinding case itself
    "localhost.evil.example",
    "192.168.1.5:8000",  # an address this loopback-bound server cannot be reached by
    "evil.example:８０",  # a port that is not ASCII digits
]


@pytest.mark.parametrize("host", FOREIGN_HOSTS)
def test_a_foreign_host_gets_400_in_the_one_error_shape(base_url, host):
    for path in ("/healthz", "/api/v1/models", "/"):
        r = get(base_url, path, host=host)
        assert_error(r, 400, "bad_host")
        assert r.headers["x-request-id"] == r.json()["error"]["request_id"]
        assert "HEADSCOPE_ALLOWED_HOSTS" in r.json()["error"]["message"]


def test_a_foreign_host_is_refused_before_any_work(base_url, cat):
    """An upload under a foreign Host is not decoded, not computed and not cached."""
    r = httpx.post(
        base_url + API,
        files={"image": ("cat.png", cat, "image/png")},
        headers={"Host": "evil.example"},
        timeout=HTTP_TIMEOUT,
    )
    assert_error(r, 400, "bad_host")
    head = httpx.head(base_url + "/healthz", headers={"Host": "evil.example"}, timeout=HTTP_TIMEOUT)
    assert head.status_code == 400 and head.content == b""


@pytest.mark.parametrize("host", ["localhost", "LocalHost", "localhost:1", "127.0.0.1", "127.0.0.1:80", "[::1]:8000"])
def test_loopback_names_with_any_port_are_answered(base_url, host):
    assert get(base_url, "/healthz", host=host).status_code == 200
    assert get(base_url, "/api/v1/models", host=host).status_code == 200


def test_a_request_without_host_is_refused(live_server):
    out = raw(live_server.port, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400") and b'"code":"bad_host"' in out
    ok = raw(live_server.port, f"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1:{live_server.port}\r\n\r\n".encode())
    assert ok.startswith(b"HTTP/1.1 200")


def test_allowed_hosts_setting_adds_names_and_subdomains(server_factory):
    srv = server_factory({"HEADSCOPE_ALLOWED_HOSTS": "headscope.example, *.lab.example"}, wait_ready=False)
    for host in ("headscope.example", "headscope.example:443", "gpu1.lab.example", "a.b.lab.example:8000"):
        assert get(srv.url, "/healthz", host=host).status_code == 200, host
    for host in ("lab.example", "evil.example", "headscope.example.evil.example", "xlab.example"):
        assert_error(get(srv.url, "/healthz", host=host), 400, "bad_host")
    assert get(srv.url, "/healthz", host="localhost").status_code == 200  # the defaults stay


# -- item 9: ASCII digits only ------------------------------------------------------------------

UNICODE_PAIRS = ["١:٢", "１:２", "𝟏:𝟐", "0:١", "٣:0", "0:1\n,2:3"]  # the last: "$" matched before the newline


@pytest.mark.parametrize("ablate", UNICODE_PAIRS)
def test_ablate_takes_ascii_digits_only(base_url, cat, cat_answer, ablate):
    image_id = cat_answer["image_id"]
    assert_error(get(base_url, f"{API}/{image_id}/output", ablate=ablate), 422, "bad_ablate")
    assert_error(get(base_url, f"{API}/{image_id}", ablate=ablate, layers="-1"), 422, "bad_ablate")
    assert_error(post(base_url, cat, ablate=ablate, layers="-1"), 422, "bad_ablate")


@pytest.mark.parametrize(
    "params",
    [{"layers": "٣"}, {"heads": "１"}, {"query": "𝟏"}, {"query": "patch:١,٢"}, {"layers": "0-٣"}],
)
def test_selections_take_ascii_digits_only(base_url, cat_answer, params):
    assert_error(get(base_url, f"{API}/{cat_answer['image_id']}", **params), 422, "bad_selection")


# -- item 10: one validation code; negative indices ---------------------------------------------


@pytest.mark.parametrize("params", [{"temperature": "abc"}, {"aggregate": "median"}, {"bogus": "1"}])
def test_validation_errors_have_one_code_on_get_and_post(base_url, cat, cat_answer, params):
    image_id = cat_answer["image_id"]
    assert_error(get(base_url, f"{API}/{image_id}", **params), 422, "invalid_parameter")
    if "bogus" not in params:  # the form ignores extra fields today (issue 33 item 8)
        assert_error(post(base_url, cat, **params), 422, "invalid_parameter")
    explain = {"layer": "x"} if "bogus" not in params else params
    assert_error(get(base_url, f"{API}/{image_id}/explain", **explain), 422, "invalid_parameter")


def test_negative_token_and_cell_indices_count_from_the_end(base_url, cat_answer):
    """``patch:-1,0`` is the first cell of the last row, token ``-1`` the last token, as in Python;
    the answer names the resolved tokens; one past either end is a 422 that says the range."""
    image_id, tokens = cat_answer["image_id"], cat_answer["tokens"]
    (gh, gw), p, n = tokens["grid"], tokens["num_prefix"], tokens["count"]

    def answer(query: str) -> dict:
        r = get(base_url, f"{API}/{image_id}", layers="-1", heads="0", query=query)
        assert r.status_code == 200, r.text
        return r.json()

    for negative, plain, token in [
        ("patch:-1,0", f"patch:{gh - 1},0", p + (gh - 1) * gw),
        ("patch:0,-1", f"patch:0,{gw - 1}", p + gw - 1),
        (f"patch:{-gh},{-gw}", "patch:0,0", p),
        ("-1", str(n - 1), n - 1),
        (str(-n), "0", 0),
    ]:
        a, b = answer(negative), answer(plain)
        assert a["query"] == b["query"] == [token], negative
        np.testing.assert_array_equal(np.asarray(a["attention"]), np.asarray(b["attention"]))
        e = get(base_url, f"{API}/{image_id}/explain", layer="-1", head="0", query=negative)
        assert e.status_code == 200 and e.json()["query"] == token, e.text

    r = get(base_url, f"{API}/{image_id}", query=f"patch:{-gh - 1},0")
    assert_error(r, 422, "bad_selection")
    assert f"rows {-gh}..{gh - 1}, columns {-gw}..{gw - 1}" in r.json()["error"]["message"]
    r = get(base_url, f"{API}/{image_id}", query=str(-n - 1))
    assert_error(r, 422, "bad_selection")
    assert f"valid: {-n}..{n - 1}" in r.json()["error"]["message"]
