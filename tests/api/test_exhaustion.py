"""Resource exhaustion against real servers (issue #20): every request admitted, memory bounded
per request, answers bounded, HTTP limits. Assertions are on status codes, counts and memory,
never on speed; the long measurements behind docs/limits.md's figures are ``scripts/load.py``'s
``decode-flood``, ``follow-up-flood`` and ``answers`` modes."""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load as st_load

from helpers import api
from helpers.api import API, assert_error, png
from helpers.server import ROOT, Server
from helpers.waiting import wait_until

sys.path.insert(0, str(ROOT / "scripts"))
import load as loadscript  # noqa: E402

MiB = 2**20
FAULT = "X-Headscope-Fault"
T = 600  # client timeout: generous, these tests run on loaded machines


def get(*a, **k):
    return httpx.get(*a, timeout=T, **k)


def head(*a, **k):
    return httpx.head(*a, timeout=T, **k)


def hpost(*a, **k):
    return httpx.post(*a, timeout=T, **k)


post = partial(api.post, timeout=T)


LIMITS = {
    "HEADSCOPE_ENABLE_FAULT_INJECTION": "1",
    "HEADSCOPE_MAX_WAIT_MS": "20",
    "HEADSCOPE_DECODE_BUDGET_BYTES": str(150 * MiB),
    "HEADSCOPE_MAX_IMAGE_PIXELS": "100000000",  # over Pillow's own 89,478,485
    "HEADSCOPE_MAX_FOLLOW_UPS": "8",
    "HEADSCOPE_MAX_LARGE_ANSWERS": "2",
    "HEADSCOPE_SEND_TIMEOUT_S": "3",
    "HEADSCOPE_HEADER_TIMEOUT_S": "2",
    "HEADSCOPE_KEEP_ALIVE_S": "1",
    # Generous: a picture's first /stats is about 2.5 forwards, over a minute on a crowded machine.
    "HEADSCOPE_REQUEST_TIMEOUT_S": "300",
}


@pytest.fixture(scope="module")
def srv():
    """One server with small limits, so that each of them is reached by a few requests."""
    s = Server(LIMITS)
    yield s
    assert s.stop() == 0
    log = s.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, f"see {s.log_path}"


def metric(base: str, name: str, labels: str = "") -> float:
    text = get(base + "/metrics").text
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def status(pid: int) -> dict[str, int]:
    return {
        line.split(":")[0]: int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith(("VmRSS", "VmHWM"))
    }


def wait_for(condition, limit_s: float = T) -> None:
    """Poll ``condition`` until it holds; fail after ``limit_s`` (a hang guard, not a speed test)."""
    wait_until(condition, limit_s, "the server")


def reset_peak(pid: int) -> int:
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status(pid)["VmRSS"]


def fresh(seed: int, size=(224, 224)) -> bytes:
    """A picture no earlier test has sent (the server caches by content)."""
    return loadscript.make_image(int(time.time() * 1000) % 10**9 + seed, size)


def raw(port: int, data: bytes) -> bytes:
    return api.raw(port, data, T)


# -- 1. decoding --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bombs():
    return loadscript.decode_bombs()


def test_a_picture_whose_header_says_it_will_not_fit_is_refused_before_decoding(srv, bombs):
    """The float TIFF decodes to 40 MP; its estimate (about 330 MiB) is over the 150 MiB budget."""
    pid = srv.proc.pid
    base = reset_peak(pid)
    r = post(srv.url, bombs["tiff 8000x5000 float"], "f.tiff")
    assert_error(r, 413, "image_too_large")
    assert "decode budget" in r.json()["error"]["message"]
    assert status(pid)["VmHWM"] - base < 64 * MiB  # nothing was decoded


def test_the_servers_pixel_limit_is_the_one_that_holds(srv):
    """Between Pillow's default limit (89 M pixels) and the server's (100 M here): decoded; over it: 413."""
    r = post(srv.url, png(Image.new("1", (9_600, 9_600))), layers="-1")  # 92 M pixels, 11 KB
    assert r.status_code == 200, r.text
    r = post(srv.url, png(Image.new("1", (10_100, 10_000))), layers="-1")
    assert_error(r, 413, "image_too_large")
    assert "over the limit of 100,000,000 pixels" in r.json()["error"]["message"]
    assert "DecompressionBombWarning" not in srv.log()  # Pillow's limit is the server's (adopt_pixel_limit)


def test_a_decode_flood_is_bounded_by_the_budget_and_refused_with_retry_after(srv):
    """Six different 78 KB PNGs of 1 x 40,000,000 pixels at once (1.4 GB each to decode before):
    one decode fits the budget at a time, the rest get 429 at once; the peak stays bounded."""
    datas = [loadscript._save(Image.new("L", (40_000_000, 1), 100 + i), "PNG") for i in range(6)]
    pid = srv.proc.pid
    base = reset_peak(pid)
    with ThreadPoolExecutor(6) as ex:
        rs = list(ex.map(lambda d: post(srv.url, d, layers="-1"), datas))
    growth = status(pid)["VmHWM"] - base
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 429} and 200 in codes and 429 in codes, codes
    assert all(r.headers.get("retry-after") for r in rs if r.status_code == 429)
    ok = next(r.json() for r in rs if r.status_code == 200)
    assert ok["image_size"] == [1, 40_000_000] and ok["input_size"] == [224, 672]
    assert growth < 400 * MiB, growth / MiB
    # The page's picture decodes within the same budget, once; HEAD answers too.
    pic = get(f"{srv.url}/api/v1/images/{ok['image_id']}")
    assert pic.status_code == 200 and Image.open(io.BytesIO(pic.content)).size == (1600, 1)
    h = head(f"{srv.url}/api/v1/images/{ok['image_id']}")
    assert h.status_code == 200 and h.content == b""
    assert int(h.headers["content-length"]) == len(pic.content)


# -- 2. follow-ups, priorities, deadlines ------------------------------------------------------
def test_a_follow_up_flood_neither_starves_a_new_upload_nor_queues_unbounded(srv, pace):
    """30 concurrent /stats follow-ups (each a distinct mass, each holding the worker 0.3 s
    longer, scaled to this machine) then a new upload: 8 follow-ups are admitted, the rest get
    429 at once; the upload's forward and answer overtake the queued follow-ups (FIFO would have
    run every admitted one before it)."""
    res = asyncio.run(loadscript.follow_up_flood(srv.url, 30, fault=f"sleep:{pace.s(0.3):.2f}"))
    assert res["upload_status"] == 200, res
    codes = res["follow_up_codes"]
    assert set(codes) <= {200, 429} and codes.get(429, 0) >= 30 - 8 - 2, res
    assert res["follow_ups_done_before_upload"] < codes[200] - 1, res


@pytest.mark.waits
def test_every_follow_up_endpoint_takes_a_slot_and_uploads_have_their_own(srv, pace):
    """With every follow-up slot held (8 GETs whose worker calls are slowed), each endpoint that
    takes worker time about a picture already sent (maps, stats, explain, the picture) gets 429
    + Retry-After at once, while a new upload is still answered 200."""
    image_id = post(srv.url, fresh(5), layers="-1").json()["image_id"]
    # Each held call sleeps 1 s (paced); they run one after another, so the slots stay held ~8 s.
    slow = {FAULT: f"sleep:{pace.s(1):.1f}"}
    follow_ups = 'headscope_admitted{pool="follow_up"}'
    with ThreadPoolExecutor(8) as ex:
        held = [ex.submit(get, f"{srv.url}{API}/{image_id}", params={"layers": i}, headers=slow) for i in range(8)]
        wait_for(lambda: metric(srv.url, follow_ups) == 8)
        for path in (
            f"{API}/{image_id}?layers=-1",
            f"{API}/{image_id}/stats",
            f"{API}/{image_id}/explain",
            f"/api/v1/images/{image_id}",
        ):
            r = get(srv.url + path)
            assert_error(r, 429, "busy")
            assert r.headers["retry-after"], path
        assert post(srv.url, fresh(6), layers="-1").status_code == 200
        # (Their slowed calls run one after another: the last may pass its deadline, 504.)
        assert {f.result().status_code for f in held} <= {200, 504}


def test_every_mass_fraction_is_answered_from_one_computation_and_the_memo_is_bounded(srv):
    image_id = post(srv.url, fresh(1), layers="-1").json()["image_id"]
    before = metric(srv.url, "headscope_cache_bytes")
    counts = []
    for i in range(20):
        s = get(f"{srv.url}{API}/{image_id}/stats", params={"mass": 0.3 + i * 0.03}).json()
        counts.append(np.array(s["mass_patches"]))
        assert s["mass_fraction"] == pytest.approx(0.3 + i * 0.03)
        if i == 0:
            charged = metric(srv.url, "headscope_cache_bytes") - before
            assert charged > 10_000  # the statistics are charged to the cache
    grown = metric(srv.url, "headscope_cache_bytes") - before - charged
    assert grown < 8 * 16 * 1024  # at most 8 mass fractions kept, a few KB each
    # More mass needs at least as many patches, in every head of every layer.
    assert all((b >= a).all() for a, b in zip(counts, counts[1:]))


# -- 3. answers ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wide(srv):
    """The 900 x 300 picture of the issue: 16 x 48 patches, 769 tokens; all its maps are 545 MB of JSON."""
    r = post(srv.url, loadscript.wide_picture(), layers="-1")
    assert r.status_code == 200, r.text
    return r.json()["image_id"]


def test_json_over_the_limit_is_refused_saying_what_to_ask_for(srv, wide):
    r = get(f"{srv.url}{API}/{wide}", params={"query": "all"})
    assert_error(r, 413, "answer_too_large")
    msg = r.json()["error"]["message"]
    assert "format=safetensors" in msg and "query=cls" in msg and "MiB" in msg
    assert get(f"{srv.url}{API}/{wide}", params={"query": "all", "layers": "-1", "heads": "0"}).status_code == 200


def test_streamed_binary_answers_are_byte_exact(srv, wide):
    full = get(f"{srv.url}{API}/{wide}", params={"query": "all", "format": "safetensors"})
    assert full.status_code == 200
    assert int(full.headers["content-length"]) == len(full.content)
    maps = st_load(full.content)["attention"]
    assert maps.shape == (12, 6, 769, 769) and maps.dtype == np.float32
    header_len = int.from_bytes(full.content[:8], "little")
    meta = json.loads(json.loads(full.content[8 : 8 + header_len])["__metadata__"]["headscope"])
    assert meta["query"] == list(range(769))  # the whole metadata is in the body
    short = full.headers["x-headscope-meta"]
    assert len(short) < 1024 and json.loads(short)["omitted"] == ["query"]
    assert json.loads(short)["shape"] == [12, 6, 769, 769]
    # Spot checks against JSON answers of one layer and head (8 MB each), built whole by the
    # other path. (The rows of a subset of queries are recomputed from q and k, and round
    # differently by a few 1e-7: every row is compared here.)
    for layer, h in [(0, 0), (7, 3), (11, 5)]:
        b = get(f"{srv.url}{API}/{wide}", params={"layers": layer, "heads": h, "query": "all"})
        np.testing.assert_array_equal(np.array(b.json()["attention"], np.float32)[0, 0], maps[layer, h])
    npy = get(f"{srv.url}{API}/{wide}", params={"query": "all", "format": "npy", "dtype": "float16"})
    half = np.load(io.BytesIO(npy.content), allow_pickle=False)
    assert half.dtype == np.float16 and np.array_equal(half, maps.astype(np.float16))
    roll = get(f"{srv.url}{API}/{wide}", params={"query": "all", "aggregate": "rollout", "format": "npy"})
    rolled = np.load(io.BytesIO(roll.content), allow_pickle=False)
    cls = get(f"{srv.url}{API}/{wide}", params={"query": "0", "aggregate": "rollout"}).json()
    np.testing.assert_array_equal(rolled[:, :, :1], np.array(cls["attention"], np.float32))
    # HEAD: the headers of the answer, none of its chunks computed.
    h = head(f"{srv.url}{API}/{wide}", params={"query": "all", "format": "safetensors"})
    assert h.status_code == 200 and h.content == b""
    assert h.headers["content-length"] == full.headers["content-length"]


def test_readers_that_never_read_hold_little_memory_and_few_slots(srv, wide):
    """Four clients ask for every map (170 MB each) and never read: two get the answer's first
    bytes (a chunk each in memory), two get 429 (two large answers at once); after the send
    timeout (3 s) the server closes the stalled connections and serves large answers again."""
    res = asyncio.run(loadscript.slow_readers(srv.url, srv.proc.pid, wide, 4, 4.0, "query=all"))
    assert res["codes"] == {200: 2, 429: 2}, res
    assert res["rss_held_growth_mb"] < 150, res  # was the whole answer per reader before
    wait_for(lambda: metric(srv.url, 'headscope_admitted{pool="large_answer"}') == 0, 120)
    r = get(f"{srv.url}{API}/{wide}", params={"query": "all", "format": "npy", "layers": "0-5"})
    assert r.status_code == 200 and np.load(io.BytesIO(r.content)).shape == (6, 6, 769, 769)


# -- 4. HTTP -------------------------------------------------------------------------------------
def assert_request_id_header(out: bytes) -> None:
    """A raw answer's X-Request-ID header holds its body's request_id, as on every answer."""
    head, _, body = out.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^x-request-id: (\S+)\r?$", head)
    assert m, head
    assert json.loads(body)["error"]["request_id"] == m.group(1).decode()


@pytest.mark.parametrize("split", [False, True], ids=["one-read", "many-reads"])
def test_oversized_headers_get_431(srv, split):
    port = srv.port
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n"
    if split:
        with socket.create_connection(("127.0.0.1", port)) as s:
            for i in range(0, len(head), 4096):
                try:
                    s.sendall(head[i : i + 4096])
                except OSError:
                    break
            out = s.recv(65536)
    else:
        out = raw(port, head)
    assert out.startswith(b"HTTP/1.1 431"), out[:100]
    assert b'"headers_too_large"' in out
    assert_request_id_header(out)
    assert get(srv.url + "/healthz", headers={"X-Fine": "b" * 8000}).status_code == 200


def test_slow_or_idle_clients_are_timed_out(srv):
    port = srv.port
    out = raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its headers
    assert out.startswith(b"HTTP/1.1 408")
    assert_request_id_header(out)
    with socket.create_connection(("127.0.0.1", port)) as s:  # keep-alive, then idle
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):  # the server closes it after the keep-alive timeout
            got += chunk
        assert got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1") == 1


def test_a_client_that_drops_mid_upload_leaves_no_traceback(srv):
    body = b'--b\r\nContent-Disposition: form-data; name="image"; filename="x.png"\r\n\r\n' + b"\0" * 50_000
    uploads = 'headscope_admitted{pool="upload"}'
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(
            b"POST /api/v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            b"Content-Length: 1000000\r\n\r\n" + body
        )
        wait_for(lambda: metric(srv.url, uploads) == 1)  # the server is reading the body
    wait_for(lambda: metric(srv.url, uploads) == 0)  # ... and has seen the client go
    assert get(srv.url + "/healthz").status_code == 200
    assert "Traceback" not in srv.log() and "ClientDisconnect" not in srv.log()


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/", "/metrics", "/api/v1/models", "/openapi.json"])
def test_head_answers_like_get_without_a_body(srv, path):
    g, h = get(srv.url + path), head(srv.url + path)
    assert h.status_code == g.status_code == 200 and h.content == b""
    assert h.headers["content-type"] == g.headers["content-type"]
    if path != "/metrics":  # the metrics change between the two requests
        assert h.headers["content-length"] == g.headers["content-length"]


def test_head_on_api_follow_ups(srv):
    image_id = post(srv.url, fresh(2), layers="-1").json()["image_id"]
    # (An answer with timing_ms in its body varies in length, the npy maps' does not.)
    for path, same_length in (
        (f"{API}/{image_id}?format=npy", True),
        (f"{API}/{image_id}/stats", True),
        (f"/api/v1/images/{image_id}", True),
        (f"{API}/{image_id}/explain", False),
    ):
        g, h = get(srv.url + path), head(srv.url + path)
        assert h.status_code == g.status_code == 200 and h.content == b"", path
        assert h.headers["content-type"] == g.headers["content-type"], path
        if same_length:
            assert h.headers["content-length"] == g.headers["content-length"], path
    assert head(f"{srv.url}{API}/{'0' * 24}").status_code == 404


# -- 5. smaller things ---------------------------------------------------------------------------
def test_identical_uploads_in_flight_run_one_forward(srv):
    data = fresh(3)
    forwards = metric(srv.url, "headscope_batch_size_count")
    with ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda _: post(srv.url, data, layers="-1"), range(8)))
    assert [r.status_code for r in rs] == [200] * 8
    assert len({r.json()["image_id"] for r in rs}) == 1
    assert all(r.json()["attention"] == rs[0].json()["attention"] for r in rs)
    assert metric(srv.url, "headscope_batch_size_count") == forwards + 1


@pytest.mark.parametrize(
    "field,value",
    [
        ("layers", "\u0663"),  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
        ("heads", "\uff11"),  # FULLWIDTH DIGIT ONE
        ("query", "\u0661\u0667"),
        ("query", "patch:\u0661,2"),
        ("layers", "0-\u0663"),
    ],
)
def test_unicode_digits_in_selections_are_refused(srv, field, value):
    image_id = post(srv.url, png(Image.new("RGB", (224, 224), (9, 9, 9))), layers="-1").json()["image_id"]
    assert_error(get(f"{srv.url}{API}/{image_id}", params={field: value}), 422, "bad_selection")
    assert_error(post(srv.url, png(Image.new("RGB", (224, 224), (9, 9, 9))), **{field: value}), 422, "bad_selection")


def test_rollout_start_is_checked_against_the_model_not_wrapped(srv):
    image_id = post(srv.url, png(Image.new("RGB", (224, 224), (8, 8, 8))), layers="-1").json()["image_id"]
    url = f"{srv.url}{API}/{image_id}"
    r = get(url, params={"aggregate": "rollout", "rollout_start": "-1000"})
    assert_error(r, 422, "bad_selection")
    assert "-12..11" in r.json()["error"]["message"]
    assert_error(get(url, params={"aggregate": "rollout", "rollout_start": "12"}), 422, "bad_selection")
    a = get(url, params={"aggregate": "rollout", "rollout_start": "-1", "layers": "-1"}).json()
    b = get(url, params={"aggregate": "rollout", "rollout_start": "11", "layers": "-1"}).json()
    assert a["attention"] == b["attention"]


def test_repeated_fields_and_parameters_are_refused(srv):
    data = png(Image.new("RGB", (224, 224), (7, 7, 7)))
    r = hpost(srv.url + API, files={"image": ("a.png", data)}, data={"layers": ["0", "5"]})
    assert_error(r, 422, "duplicate_field")
    assert "layers" in r.json()["error"]["message"]
    image_id = post(srv.url, data, layers="-1").json()["image_id"]
    r = get(f"{srv.url}{API}/{image_id}?layers=0&layers=5")
    assert_error(r, 422, "duplicate_parameter")
    assert_error(get(f"{srv.url}{API}/{image_id}/stats?mass=0.5&mass=0.7"), 422, "duplicate_parameter")


def test_media_type_case_and_rfc5987_file_names(srv):
    data = png(Image.new("RGB", (224, 224), (6, 6, 6)))
    body = (
        b"--b\r\nContent-Disposition: form-data; name=\"image\"; filename*=UTF-8''caf%C3%A9%20%E2%9C%93.png\r\n"
        b"Content-Type: image/png\r\n\r\n" + data + b'\r\n--b\r\nContent-Disposition: form-data; name="layers"\r\n\r\n'
        b"-1\r\n--b--\r\n"
    )
    r = hpost(srv.url + API, content=body, headers={"content-type": "Multipart/Form-Data; boundary=b"})
    assert r.status_code == 200, r.text
    assert r.json()["filename"] == "café ✓.png"
    both = body.replace(b"filename*=", b'filename="plain.png"; filename*=')
    r = hpost(srv.url + API, content=both, headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.json()["filename"] == "café ✓.png"
    bad = body.replace(b"UTF-8''caf%C3%A9%20%E2%9C%93.png", b"UTF-8''%FF%FE.png")
    r = hpost(srv.url + API, content=bad, headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 200 and r.json()["filename"] is None


# -- deadlines (a server of its own: a short request deadline) ----------------------------------
@pytest.mark.waits
def test_every_request_that_takes_worker_time_has_a_deadline(server_factory, pace):
    """Follow-ups whose worker call cannot start before their deadline are answered 504 and
    dropped without running; an upload body that has not arrived by the deadline gets 408.
    (A deadline of 1.5 follow-ups' time: of 4 queued at once, at most 2 can start.)"""
    sleep = pace.s(4)  # 0.1 s forwards on the quiet machine: room for the upload before it
    timeout = 1.5 * sleep
    s = server_factory({"HEADSCOPE_ENABLE_FAULT_INJECTION": "1", "HEADSCOPE_REQUEST_TIMEOUT_S": f"{timeout:.1f}"})
    r = post(s.url, fresh(4), layers="-1")
    assert r.status_code == 200, r.text
    image_id = r.json()["image_id"]
    dropped = "headscope_rejections_total", '{reason="cancelled_before_compute"}'
    before = metric(s.url, *dropped)

    def follow_up(i):
        fault = {FAULT: f"sleep:{sleep:.1f}"}
        return get(f"{s.url}{API}/{image_id}", params={"layers": str(i)}, headers=fault).status_code

    with ThreadPoolExecutor(4) as ex:
        codes = list(ex.map(follow_up, range(4)))
    assert set(codes) <= {200, 504} and codes.count(504) >= 2, codes  # at most 2 can start
    # The calls that had not started by their deadline are dropped when the worker reaches
    # them (after the one running at the deadline), never run.
    wait_for(lambda: metric(s.url, *dropped) - before >= codes.count(504) - 1, 2 * T)
    wait_for(lambda: metric(s.url, "headscope_queue_depth") == 0)
    # An upload whose body stops arriving.
    head = (
        b"POST /api/v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        b'Content-Length: 100000\r\n\r\n--b\r\nContent-Disposition: form-data; name="image"; filename="x"\r\n\r\n'
    )
    with socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.sendall(head + b"\0" * 1000)
        out = b""
        while b'"request_timeout"' not in out and (chunk := sock.recv(65536)):  # the head and body may come apart
            out += chunk
    assert out.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in out, out[:300]
    assert "Traceback" not in s.log()


@pytest.mark.waits  # holds a slot through a paced sleep
def test_the_body_of_a_refused_upload_is_not_taken_for_headers(server_factory, pace):
    """An upload refused with 429 before its body is read goes on sending the body: those bytes
    are no request head, so they never get a 431 and a reset connection (they did, under the
    load test's ramp)."""
    s = server_factory({"HEADSCOPE_ENABLE_FAULT_INJECTION": "1", "HEADSCOPE_MAX_QUEUE": "1"})
    uploads = 'headscope_admitted{pool="upload"}'
    with ThreadPoolExecutor(1) as ex:
        holder = ex.submit(post, s.url, fresh(7), layers="-1", headers={FAULT: f"sleep:{pace.s(2):.1f}"})
        wait_for(lambda: metric(s.url, uploads) == 1)
        body = b"x" * MiB  # no blank line in it
        out = b""
        with socket.create_connection(("127.0.0.1", s.port), timeout=T) as sock:
            sock.sendall(
                b"POST /api/v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: multipart/form-data; boundary=b\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(65536):
                out += chunk
        assert holder.result().status_code in (200, 504)  # it only held the slot (504: a slow machine)
    assert out.startswith(b"HTTP/1.1 429") and b"431" not in out, out[:400]
    assert "Request headers too large" not in s.log()
