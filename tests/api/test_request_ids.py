"""Every error answer's request id is in the server's log line for it, and in X-Request-ID."""

from __future__ import annotations

import re

import httpx

from helpers.api import API, assert_error, fresh_png, post
from helpers.waiting import wait_until

TIMEOUT = 120  # seconds: generous, the machine may be loaded


def _log_line(server, rid: str) -> str:
    # The server's log writer is a thread of its own (web/log_writer.py): the line may reach the
    # file a moment after the answer reached the client.
    def lines() -> list[str]:
        return [line for line in server.log().splitlines() if f"[request_id={rid}]" in line]

    wait_until(lines, TIMEOUT, f"the log line of request {rid}")
    found = lines()
    assert len(found) == 1, f"request id {rid}: {len(found)} log lines"
    return found[0]


def test_each_error_answer_is_logged_with_its_request_id(live_server, samples):
    base = live_server.url
    cat = samples["cat"].read_bytes()
    answers = [
        (httpx.get(base + "/api/v1/nothing", timeout=TIMEOUT), 404, "not_found"),
        (httpx.delete(base + "/api/v1/models", timeout=TIMEOUT), 405, "method_not_allowed"),
        (post(base, b"not an image", timeout=TIMEOUT), 415, None),
        (post(base, cat, timeout=TIMEOUT, layers="99"), 422, "bad_selection"),
        (post(base, cat, timeout=TIMEOUT, model="timm:not_offered"), 404, "unknown_model"),
        (httpx.post(base + API, content=b"x" * (21 * 1024 * 1024), timeout=TIMEOUT), 413, "upload_too_large"),
        # A picture no other test sends: a cached one would not reach the worker and its fault.
        (post(base, fresh_png(), timeout=TIMEOUT, headers={"X-Headscope-Fault": "raise"}), 500, "compute_failed"),
    ]
    for r, status, code in answers:
        assert r.status_code == status, (status, r.status_code, r.text[:300])
        assert_error(r, status, code)
        rid = r.json()["error"]["request_id"]
        assert r.headers["x-request-id"] == rid
        line = _log_line(live_server, rid)
        assert f" -> {status} {r.json()['error']['code']}: " in line, line
        assert ("WARNING" if status >= 500 else "INFO") in line, line


def test_a_clients_request_id_is_kept_and_an_unsafe_one_replaced(base_url):
    r = httpx.get(base_url + "/api/v1/nothing", headers={"X-Request-ID": "trace-42.a_b"}, timeout=TIMEOUT)
    assert r.json()["error"]["request_id"] == "trace-42.a_b" == r.headers["x-request-id"]
    r = httpx.get(base_url + "/api/v1/nothing", headers={"X-Request-ID": "evil\tline [x]"}, timeout=TIMEOUT)
    assert re.fullmatch(r"[0-9a-f]{12}", r.json()["error"]["request_id"])
    assert httpx.get(base_url + "/healthz", timeout=TIMEOUT).headers["x-request-id"]


def test_a_path_cannot_forge_log_lines(live_server):
    r = httpx.get(live_server.url + "/api/v1/nothing%0AFORGED%20line", timeout=TIMEOUT)
    assert r.status_code == 404
    assert "/api/v1/nothing FORGED line" in _log_line(live_server, r.json()["error"]["request_id"])
    assert not any(line.startswith("FORGED") for line in live_server.log().splitlines())
