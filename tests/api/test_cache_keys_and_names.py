"""Issue 33 against a real server: one computation per question however it is spelled (item 4),
one image's ablated variants cannot flush other uploads (item 5), an upload's name stays with
the request that gave it (item 6), and a client that leaves mid-request leaves no traceback."""

from __future__ import annotations

import json
import re
import socket

import httpx
import pytest

from helpers.api import API, fresh_png, get, image_id, post
from helpers.server import HTTP_TIMEOUT, Server
from helpers.waiting import wait_until

MODEL = "random:test_vit"  # 6 layers x 2 heads: a pruning curve has at most 13 points
CACHE_BYTES = 8_000_000  # about eight captures of a fresh_png under MODEL (0.93 MB each)
VARIANT_BYTES = 2_500_000  # about two of them


@pytest.fixture(scope="module")
def srv():
    """A server of its own: a tiny default model, a small cache, fault injection for the waits."""
    server = Server(
        {
            "HEADSCOPE_MODEL": MODEL,
            "HEADSCOPE_CACHE_BYTES": str(CACHE_BYTES),
            "HEADSCOPE_MAX_VARIANT_BYTES": str(VARIANT_BYTES),
            "HEADSCOPE_ENABLE_FAULT_INJECTION": "1",
        }
    )
    yield server
    assert server.stop() == 0
    log = server.log()
    assert "Traceback" not in log and "never retrieved" not in log, f"see {server.log_path}"


def uploaded(base: str, seed: int, name: str = "img.png") -> str:
    r = post(base, fresh_png(seed), name, layers="-1", heads="0")
    assert r.status_code == 200, r.text
    return r.json()["image_id"]


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


# -- item 4: parameters are normalised before they become a cache or task key ----------------------


def test_pruning_points_beyond_the_curve_share_one_computation(srv):
    iid = uploaded(srv.url, 401)
    path = f"{API}/{iid}/pruning"
    first = ok(get(srv.url, path, method="gradient", points=1000))
    assert first["cached"] is False and first["removed"] == list(range(13))  # capped at heads + 1
    for points in (1001, 1025, 13):
        again = ok(get(srv.url, path, method="gradient", points=points))
        assert again["cached"] is True, points  # the same curve: no second computation
        assert again["change"] == first["change"] and again["removed"] == first["removed"]
        progress = ok(get(srv.url, f"{path}/progress", method="gradient", points=points))
        assert progress["state"] == "done", points
    smaller = ok(get(srv.url, path, method="gradient", points=12))  # a different curve
    assert smaller["cached"] is False and len(smaller["removed"]) == 12


def test_one_ablation_set_or_model_spelled_two_ways_is_one_entry(srv):
    iid = uploaded(srv.url, 402)
    first = ok(get(srv.url, f"{API}/{iid}", layers="-1", ablate="0:1,1:0"))
    assert first["cached"] is False and first["ablated"] == [[0, 1], [1, 0]]
    # The same heads, in another order, counted from the end, and the default model by name.
    again = ok(get(srv.url, f"{API}/{iid}", layers="-1", ablate=" 1:0, -6:-1", model=MODEL))
    assert again["cached"] is True and again["ablated"] == [[0, 1], [1, 0]]
    out = ok(get(srv.url, f"{API}/{iid}/output", ablate="1:0,0:1"))
    assert out["cached"] is False
    assert ok(get(srv.url, f"{API}/{iid}/output", ablate="-5:0,0:1", model=MODEL))["cached"] is True
    imp = ok(get(srv.url, f"{API}/{iid}/importance", method="gradient"))
    assert ok(get(srv.url, f"{API}/{iid}/importance", method="gradient", model=MODEL))["cached"] is True
    assert imp["cached"] is False


# -- item 5: many ablated variants of one image evict each other, not other uploads ---------------


def metric(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics", timeout=HTTP_TIMEOUT).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_many_ablated_variants_of_one_image_do_not_evict_other_uploads(srv):
    others = [uploaded(srv.url, 500 + i) for i in range(2)]
    flood = uploaded(srv.url, 510)
    sets = [f"{layer}:{head}" for layer in range(6) for head in range(2)]  # 12 sets: 11 MB of captures
    for spec in sets:
        ok(get(srv.url, f"{API}/{flood}", layers="-1", ablate=spec))
        ok(get(srv.url, f"{API}/{flood}/output", ablate=spec))
        assert metric(srv.url, "headscope_cache_bytes") <= CACHE_BYTES
    for iid in others:  # their uploads and captures are still there
        body = ok(get(srv.url, f"{API}/{iid}", layers="0", heads="1"))
        assert body["cached"] is True
    # The newest variants stay (a follow-up on the last set is answered from the cache), the
    # oldest went; the image itself and its unablated capture stay too.
    assert ok(get(srv.url, f"{API}/{flood}", layers="0", ablate=sets[-1]))["cached"] is True
    assert ok(get(srv.url, f"{API}/{flood}/output", ablate=sets[-1]))["cached"] is True
    assert ok(get(srv.url, f"{API}/{flood}", layers="0", ablate=sets[0]))["cached"] is False
    assert ok(get(srv.url, f"{API}/{flood}", layers="0"))["cached"] is True


# -- item 6: an upload's name stays with the request that gave it ----------------------------------


def test_a_second_upload_of_the_same_bytes_does_not_rename_the_first_ones_follow_ups(srv):
    data = fresh_png(601)
    iid = image_id(data)
    alice = post(srv.url, data, "alice-passport-scan.png", layers="-1")
    assert ok(alice)["filename"] == "alice-passport-scan.png"
    assert alice.headers["cache-control"] == "no-store"
    bob = post(srv.url, data, "bob.png", layers="-1", format="npy")
    assert bob.status_code == 200 and bob.headers["cache-control"] == "no-store"
    assert json.loads(bob.headers["x-headscope-meta"])["filename"] == "bob.png"
    again = ok(post(srv.url, data, "alice-passport-scan.png", layers="-1"))  # her own answer: her name
    assert again["filename"] == "alice-passport-scan.png" and again["image_id"] == iid

    # Follow-ups of that id, by anyone who has it: no name, neither hers nor his.
    follow_ups = [
        get(srv.url, f"{API}/{iid}", layers="-1"),
        get(srv.url, f"{API}/{iid}", layers="-1", format="npy"),
        get(srv.url, f"{API}/{iid}", layers="-1", format="safetensors"),
        get(srv.url, f"{API}/{iid}/explain", layer="-1"),
    ]
    for r in follow_ups:
        assert r.status_code == 200, r.text
        assert b"alice" not in r.content and b"bob" not in r.content
        assert "alice" not in str(r.headers) and "bob" not in str(r.headers)
    assert follow_ups[0].json()["filename"] is None and follow_ups[3].json()["filename"] is None
    assert json.loads(follow_ups[1].headers["x-headscope-meta"])["filename"] is None


def test_an_upload_without_a_name_is_not_marked_no_store(srv):
    r = httpx.post(
        srv.url + API,
        files={"image": ("uploads/", fresh_png(602), "image/png")},  # no name left once cleaned
        data={"layers": "-1"},
        timeout=HTTP_TIMEOUT,
    )
    assert ok(r)["filename"] is None and "cache-control" not in r.headers


# -- a client that leaves while its request waits -----------------------------------------------


def slots_held(base: str) -> float:
    """Admission slots held now, every pool together: requests the server is working on."""
    text = httpx.get(base + "/metrics", timeout=HTTP_TIMEOUT).text
    return sum(float(v) for v in re.findall(r'^headscope_admitted\{pool="\w+"\} (\S+)$', text, re.M))


def leave_early(srv, path: str, hold_s: float, timeout: float) -> None:
    """Send ``GET path`` (each worker call held ``hold_s`` by an injected fault) once the server
    is idle, and close the connection once the server works on it, before the answer."""
    wait_until(lambda: slots_held(srv.url) == 0, timeout, "the server to be idle")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=HTTP_TIMEOUT) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Headscope-Fault: sleep:{hold_s}\r\n\r\n".encode())
        wait_until(lambda: slots_held(srv.url) > 0, timeout, f"the server to take {path}")


def test_a_client_that_leaves_mid_request_leaves_no_traceback(srv, pace):
    iid = uploaded(srv.url, 701)
    paths = [
        *(f"{API}/{iid}/output?ablate={layer}:1" for layer in range(4)),  # each a new ablated output
        f"{API}/{iid}/stats",
        f"{API}/{iid}?layers=-1&ablate=2:0",
        f"{API}/{iid}/explain?ablate=3:0",
    ]
    before = srv.log().count(" 499 ")
    for path in paths:
        leave_early(srv, path, pace.s(0.9), pace.s(30))
    wait_until(lambda: srv.log().count(" 499 ") >= before + len(paths), pace.s(30), "a 499 for each client that left")
    assert srv.log().count(" 499 ") == before + len(paths), srv.log()[-3000:]
    # What the waits left behind has ended (and would have been logged).
    wait_until(lambda: slots_held(srv.url) == 0, pace.s(30), "the abandoned requests to end")
    assert httpx.get(srv.url + "/healthz", timeout=HTTP_TIMEOUT).status_code == 200
    log = srv.log()
    assert "never retrieved" not in log and "Traceback" not in log, log[-3000:]
