"""Issue 39 against real servers: nobody cancels or starves another client's work.

Item 1 (a task left to run on is not cancelled by a client that joins and leaves), item 2 (slow
bodies: a minimum rate after a grace period, a per-client share of the upload slots, the client's
address from a proxy's header only when the operator trusts that proxy), item 3 (a per-client
share of the long computations, a cost bound, cancelling your own task), item 4 (--any-model on
a network address; the catalogue's size cap before any download) and item 8 (a faithfulness
box is checked before the task starts).

Different client addresses are real: Linux answers on all of 127.0.0.0/8, so a socket bound to
127.0.0.2 is another client than one bound to 127.0.0.3.
"""

from __future__ import annotations

import re
import select
import socket
import subprocess
import sys
import time

import httpx
import pytest

from helpers.api import API, assert_error, fresh_png
from helpers.server import HTTP_TIMEOUT, ROOT, Server, free_port

GRACE_S = 15.0  # the body's grace period on this server: long enough to look at the held slots
PROXY = "127.0.0.5"  # the one address whose X-Forwarded-For this server believes
HEAVY = dict(
    methods="chefer,grad_attention,rollout,attention,random", fractions="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"
)


@pytest.fixture(scope="module")
def srv():
    s = Server(
        {
            "HEADSCOPE_MAX_QUEUE": "8",
            "HEADSCOPE_MAX_UPLOADS_PER_CLIENT": "2",
            "HEADSCOPE_BODY_GRACE_S": str(GRACE_S),
            "HEADSCOPE_MIN_BODY_BYTES_PER_S": "5000",
            "HEADSCOPE_REQUEST_TIMEOUT_S": "600",  # without the rate, a slow body would hold on this long
            "HEADSCOPE_TRUSTED_PROXIES": PROXY,
            "HEADSCOPE_MAX_TEST_FORWARDS": "100",
            "HEADSCOPE_MAX_WAIT_MS": "20",
        }
    )
    yield s
    s.stop_cleanly()


def client(source: str, headers: dict | None = None) -> httpx.Client:
    """An HTTP client whose connections come from ``source`` (a loopback address)."""
    return httpx.Client(
        transport=httpx.HTTPTransport(local_address=source), timeout=HTTP_TIMEOUT, headers=headers or {}
    )


def upload(c: httpx.Client, url: str, data: bytes) -> httpx.Response:
    return c.post(url + API, files={"image": ("x.png", data, "image/png")}, data={"layers": "-1"})


def image_of(url: str, seed: int) -> str:
    with client("127.0.0.1") as c:
        r = upload(c, url, fresh_png(seed, (224, 224)))
    assert r.status_code == 200, r.text
    return r.json()["image_id"]


def admitted(url: str, pool: str) -> float:
    text = httpx.get(url + "/metrics", timeout=HTTP_TIMEOUT).text
    m = re.search(rf'^headscope_admitted\{{pool="{pool}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def wait_for(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {seconds:.0f} s")


def slow_upload(port: int, source: str, forwarded: str | None = None) -> socket.socket:
    """An upload that declares 5 MB and sends its first bytes only (a slow client)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT, source_address=(source, 0))
    head = (
        f"POST {API} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 5000000\r\n"
        "Content-Type: multipart/form-data; boundary=XX\r\n"
        + (f"X-Forwarded-For: {forwarded}\r\n" if forwarded else "")
        + "\r\n--XX\r\n"
    )
    s.sendall(head.encode())
    return s


def read_answer(s: socket.socket) -> bytes:
    """One whole HTTP answer (headers and a Content-Length body) from ``s``."""
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = s.recv(65536)
        if not chunk:
            return out
        out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    m = re.search(rb"content-length: (\d+)", head, re.I)
    while m and len(body) < int(m.group(1)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def trickle_until_answered(socks: list[socket.socket], seconds: float) -> list[bytes]:
    """Send 10 bytes a second on every socket until each has an answer (or ``seconds`` pass)."""
    answers: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + seconds
    while len(answers) < len(socks) and time.monotonic() < deadline:
        waiting = [s for s in socks if s not in answers]
        readable, _, _ = select.select(waiting, [], [], 1.0)
        for s in readable:
            answers[s] = read_answer(s)
        for s in waiting:
            if s not in readable:
                try:
                    s.sendall(b"x" * 10)
                except OSError:  # the server closed it: its answer is readable next round
                    pass
    for s in socks:
        s.close()
    return [answers.get(s, b"") for s in socks]


# -- item 2: slow bodies ------------------------------------------------------------------------


@pytest.mark.waits
def test_slow_uploads_hold_only_their_clients_share_and_end_in_408(srv, pace):
    port = srv.port
    forged = [slow_upload(port, "127.0.0.2", f"10.9.9.{i}") for i in (1, 2)]  # not a proxy: header ignored
    proxied = [slow_upload(port, PROXY, "10.0.0.1") for _ in range(2)]  # the proxy: header believed
    wait_for(lambda: admitted(srv.url, "upload") >= 4, pace.s(30), "four slow uploads admitted")

    with client("127.0.0.2", {"X-Forwarded-For": "10.9.9.3"}) as c:  # a forged address changes nothing
        r = upload(c, srv.url, fresh_png(1))
    assert_error(r, 429, "busy")
    assert "this client" in r.json()["error"]["message"]
    with client(PROXY, {"X-Forwarded-For": "10.0.0.1"}) as c:
        assert_error(upload(c, srv.url, fresh_png(2)), 429, "busy")
    with client(PROXY, {"X-Forwarded-For": "10.0.0.2"}) as c:  # another client behind the proxy
        assert upload(c, srv.url, fresh_png(3)).status_code == 200
    with client("127.0.0.3") as c:  # another client: not locked out
        assert upload(c, srv.url, fresh_png(4)).status_code == 200

    answers = trickle_until_answered(forged + proxied, GRACE_S + pace.s(30))
    for out in answers:
        assert out.startswith(b"HTTP/1.1 408"), out[:200]
        assert b'"code":"request_timeout"' in out and b"too slowly" in out
    wait_for(lambda: admitted(srv.url, "upload") == 0, pace.s(10), "the slots given back")


# -- item 1: a task left to run on ------------------------------------------------------------


@pytest.mark.thorough
def test_a_client_that_joins_and_leaves_does_not_cancel_a_task_left_to_run_on(srv, pace):
    image_id = image_of(srv.url, 11)
    q = dict(HEAVY, methods="chefer,attention,random", seed=11)
    path = f"{API}/{image_id}/faithfulness"
    r = httpx.get(srv.url + path, params={**q, "wait": 0}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 202, r.text
    query = str(httpx.QueryParams(q))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=HTTP_TIMEOUT) as s:  # joins, then leaves
        s.sendall(f"GET {path}?{query} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode())
        time.sleep(1.0)
    time.sleep(1.0)  # the server notices a client gone within 0.1 s
    progress = httpx.get(srv.url + path + "/progress", params=q, timeout=HTTP_TIMEOUT).json()
    assert progress["state"] in ("running", "done"), progress
    wait = min(3600, pace.s(300))
    r = httpx.get(srv.url + path, params={**q, "wait": wait}, timeout=wait + HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    assert list(r.json()["methods"]) == ["chefer", "attention", "random"]


# -- item 3: a fair share of the long computations, a cost bound, cancelling your own -------------


def test_one_client_gets_its_share_of_the_long_computations_and_can_cancel_its_own(srv):
    image_id = image_of(srv.url, 12)
    path = f"{API}/{image_id}/faithfulness"
    tokens = []
    with client("127.0.0.2") as mine, client("127.0.0.3") as theirs:
        for seed in (1, 2):  # the share of one client: half of the 4 at once
            r = mine.get(srv.url + path, params={**HEAVY, "seed": seed, "wait": 0})
            assert r.status_code == 202, r.text
            tokens.append(r.json()["cancel_token"])
        r = mine.get(srv.url + path, params={**HEAVY, "seed": 3, "wait": 0})
        assert_error(r, 429, "busy")
        assert "DELETE /api/v1/tasks/" in r.json()["error"]["message"]
        r = theirs.get(srv.url + path, params={**HEAVY, "seed": 4, "wait": 0})  # another client still gets one
        assert r.status_code == 202, r.text
        tokens.append(r.json()["cancel_token"])
        joined = mine.get(srv.url + path, params={**HEAVY, "seed": 4, "wait": 0})  # a joiner gets no token
        assert joined.status_code == 202 and joined.json().get("cancel_token") is None

        for seed, token in zip((1, 2, 4), tokens):
            r = httpx.delete(f"{srv.url}/api/v1/tasks/{token}", timeout=HTTP_TIMEOUT)
            assert r.status_code == 200 and r.json() == {"state": "cancelled"}, r.text
            p = httpx.get(srv.url + path + "/progress", params={**HEAVY, "seed": seed}, timeout=HTTP_TIMEOUT)
            assert p.json()["state"] == "idle", p.json()
            assert_error(httpx.delete(f"{srv.url}/api/v1/tasks/{token}", timeout=HTTP_TIMEOUT), 404, "task_not_found")
        r = mine.get(srv.url + path, params={**HEAVY, "seed": 3, "wait": 0})  # its share is free again
        assert r.status_code == 202, r.text
        assert httpx.delete(f"{srv.url}/api/v1/tasks/{r.json()['cancel_token']}", timeout=HTTP_TIMEOUT).is_success
    for bad in ("short", "x" * 65, "a b c d e f g h", "café" * 3):  # of no token's shape: unknown all the same
        assert_error(httpx.delete(f"{srv.url}/api/v1/tasks/{bad}", timeout=HTTP_TIMEOUT), 404, "task_not_found")
    assert_error(httpx.delete(f"{srv.url}/api/v1/tasks/no/slash", timeout=HTTP_TIMEOUT), 404)


def test_a_test_over_the_cost_bound_is_a_clear_422_before_it_starts(srv):
    image_id = image_of(srv.url, 13)
    fractions = ",".join(f"{i / 50:g}" for i in range(50))
    path = f"{API}/{image_id}/faithfulness"
    r = httpx.get(srv.url + path, params={**HEAVY, "fractions": fractions, "wait": 0}, timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "task_too_large")
    assert "490 perturbed forwards" in r.json()["error"]["message"] and "100" in r.json()["error"]["message"]
    p = httpx.get(srv.url + path + "/progress", params={**HEAVY, "fractions": fractions}, timeout=HTTP_TIMEOUT)
    assert p.json()["state"] == "idle"


# -- item 8: the faithfulness target is checked before the task starts ---------------------------


def test_a_box_outside_the_map_is_refused_at_once_with_wait_0(srv):
    image_id = image_of(srv.url, 14)
    path = f"{API}/{image_id}/faithfulness"
    q = {"methods": "chefer", "fractions": "0,0.5", "target": "box:0,0,999999,999999"}
    assert_error(httpx.get(srv.url + path, params={**q, "wait": 0}, timeout=HTTP_TIMEOUT), 422, "bad_target")
    assert httpx.get(srv.url + path + "/progress", params=q, timeout=HTTP_TIMEOUT).json()["state"] == "idle"
    rel = httpx.get(srv.url + f"{API}/{image_id}/relevance", params={"target": q["target"]}, timeout=HTTP_TIMEOUT)
    assert_error(rel, 422, "bad_target")  # the same answer relevance gives


# -- item 4: --any-model on a network address -------------------------------------------------------


@pytest.mark.thorough
def test_any_model_on_a_network_address_is_refused_unless_said_explicitly(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "headscope.cli",
        "serve",
        "--any-model",
        "--host",
        "0.0.0.0",
        "--port",
        str(free_port()),
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HTTP_TIMEOUT)
    assert out.returncode == 2, out.stderr
    assert "--any-model-on-network" in out.stderr and "Traceback" not in out.stderr
    env = {"HEADSCOPE_HOST": "0.0.0.0", "HEADSCOPE_ANY_MODEL": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd[:4] + ["--port", str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 2 and "HEADSCOPE_ANY_MODEL_ON_NETWORK" in out.stderr
    from headscope.config import Settings

    assert Settings(host="0.0.0.0", any_model=True, any_model_on_network=True).any_model_refusal() is None
    assert Settings(host="::1", any_model=True).any_model_refusal() is None
    assert Settings(host="192.168.1.5", any_model=True).any_model_refusal() is not None


@pytest.mark.thorough
def test_the_catalogue_cap_is_checked_before_any_download(server_factory, tmp_path):
    from helpers.hub_standin import StandInHub, weights

    small = "test_vit3.r160_in1k"
    hub = StandInHub({f"timm/{small}/model.safetensors": weights(small, seed=3)}, seconds=1.0)
    try:
        env = {
            "HF_HOME": str(tmp_path / "home"),
            "HF_HUB_CACHE": str(tmp_path / "hub"),
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HEADSCOPE_MODEL": "random:test_vit",
            "HEADSCOPE_ANY_MODEL": "1",
            "HEADSCOPE_CATALOG_MAX_PARAMS": "10000000",  # 10 M: vit_base (86 M) is over it
            "HEADSCOPE_CATALOG_MAX_BYTES": "1000",  # test_vit3's weights are more
        }
        s = server_factory(env)
        load = s.url + "/api/v1/models/catalog/{}/load"
        r = httpx.post(load.format("vit_base_patch16_224.augreg_in21k"), timeout=HTTP_TIMEOUT)
        assert_error(r, 422, "model_too_large")
        assert (
            "M parameters" in r.json()["error"]["message"]
            and "HEADSCOPE_CATALOG_MAX_PARAMS" in r.json()["error"]["message"]
        )
        r = httpx.post(load.format(small), timeout=HTTP_TIMEOUT)
        assert_error(r, 422, "model_too_large")
        assert "HEADSCOPE_CATALOG_MAX_BYTES" in r.json()["error"]["message"]
        st = httpx.get(load.format(small), timeout=HTTP_TIMEOUT).json()  # what a poll of it says
        assert st["state"] == "failed" and st["error"]["code"] == "model_too_large", st
        assert not any(q.startswith("GET") and "/resolve/" in q for q in hub.requests), (
            hub.requests
        )  # nothing downloaded
        assert not (tmp_path / "hub" / f"models--timm--{small}" / "snapshots").exists()
    finally:
        hub.stop()
