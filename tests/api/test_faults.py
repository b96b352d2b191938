"""Faults injected into a real server: only the culprit fails, the server keeps serving."""

from __future__ import annotations

import re
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from helpers.api import assert_error, png, post
from helpers.cli import run_cli
from helpers.server import HTTP_TIMEOUT, ROOT, free_port

FAULT = "X-Headscope-Fault"


def images(n: int, seed: int = 0) -> list[bytes]:
    return [png(Image.new("RGB", (224, 224), ((seed * 37 + i * 53) % 256, i * 11 % 256, 90))) for i in range(n)]


def metric(base: str, name: str, labels: str = "") -> float:
    text = httpx.get(base + "/metrics", timeout=HTTP_TIMEOUT).text
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def sleep(seconds: float) -> str:
    """The fault that makes the worker sleep ``seconds`` inside a compute."""
    return f"sleep:{seconds:.3f}"


def concurrently(base, datas, faults, **fields):
    with ThreadPoolExecutor(len(datas)) as ex:
        futs = [ex.submit(post, base, d, headers={FAULT: f} if f else None, **fields) for d, f in zip(datas, faults)]
        return [f.result() for f in futs]


def test_an_exception_mid_batch_fails_only_that_request(live_server):
    base = live_server.url
    rs = concurrently(base, images(3, 1), [None, "raise", None])
    assert [r.status_code for r in rs] == [200, 500, 200]
    assert_error(rs[1], 500, "compute_failed")
    assert post(base, images(1, 2)[0]).status_code == 200


def test_out_of_memory_splits_the_batch(live_server, pace):
    base = live_server.url
    splits = metric(base, "headscope_oom_splits_total")
    # Keep the worker busy so the four queue up together and form one batch.
    blocker = threading.Thread(
        target=post, args=(base, images(1, 12)[0]), kwargs={"headers": {FAULT: sleep(pace.s(0.8))}}
    )
    blocker.start()
    time.sleep(pace.s(0.3))
    rs = concurrently(base, images(4, 3), [None, "oom", None, "oom-always"])
    blocker.join()
    assert [r.status_code for r in rs] == [200, 200, 200, 503]
    assert_error(rs[3], 503, "out_of_memory")
    assert metric(base, "headscope_oom_splits_total") > splits
    assert post(base, images(1, 4)[0]).status_code == 200


def test_fault_header_is_ignored_unless_enabled(server_factory):
    srv = server_factory({"HEADSCOPE_ENABLE_FAULT_INJECTION": "0"})
    assert post(srv.url, images(1, 5)[0], headers={FAULT: "raise"}).status_code == 200


def test_deadline_full_queue_and_disconnect(server_factory, pace):
    # Durations for the quiet development machine, scaled by this machine's pace now.
    deadline = pace.s(1.5)
    srv = server_factory(
        {
            "HEADSCOPE_ENABLE_FAULT_INJECTION": "1",
            "HEADSCOPE_REQUEST_TIMEOUT_S": f"{deadline:.3f}",
            "HEADSCOPE_MAX_QUEUE": "2",
            "HEADSCOPE_MAX_BATCH_SIZE": "1",
        }
    )
    base = srv.url
    datas = images(8, 6)
    # A hung compute: the deadline answers 504 before the compute ends; the worker recovers.
    hang = 2 * deadline
    t0 = time.monotonic()
    r = post(base, datas[0], headers={FAULT: sleep(hang)})
    assert_error(r, 504, "timeout")
    assert time.monotonic() - t0 < hang
    time.sleep(max(0.0, t0 + hang - time.monotonic()) + pace.s(0.5))  # the hung compute is over
    assert post(base, datas[1]).status_code == 200

    # Full queue: while one request computes, two wait, the rest get 429 at once.
    slow = threading.Thread(target=post, args=(base, datas[2]), kwargs={"headers": {FAULT: sleep(pace.s(0.8))}})
    slow.start()
    time.sleep(pace.s(0.3))
    with ThreadPoolExecutor(5) as ex:
        t0 = time.monotonic()
        futs = [ex.submit(lambda d: (post(base, d), time.monotonic() - t0), d) for d in datas[3:8]]
        results = [f.result() for f in futs]
    slow.join()
    refused = [(r, dt) for r, dt in results if r.status_code == 429]
    assert len(refused) >= 2, [r.status_code for r, _ in results]
    assert all(r.headers.get("retry-after") for r, _ in refused)
    assert all(dt < pace.s(0.5) for _, dt in refused), "429 must come at once, not after a wait"
    assert all(r.status_code in (200, 429) for r, _ in results)

    # A client that goes away while queued: its request is never computed.
    time.sleep(pace.s(1.6))
    computed = metric(base, "headscope_batch_size_count")
    cancelled = metric(base, "headscope_rejections_total", '{reason="cancelled_before_compute"}')
    blocker = threading.Thread(target=post, args=(base, images(1, 9)[0]), kwargs={"headers": {FAULT: sleep(pace.s(1))}})
    blocker.start()
    time.sleep(pace.s(0.2))
    with pytest.raises(httpx.TimeoutException):
        post(base, images(1, 10)[0], timeout=pace.s(0.4))  # leaves while the blocker computes
    blocker.join()
    time.sleep(pace.s(0.3))
    assert metric(base, "headscope_batch_size_count") == computed + 1
    assert metric(base, "headscope_rejections_total", '{reason="cancelled_before_compute"}') == cancelled + 1


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_model_load_failure(tmp_path, damage):
    # Issue 41: a server whose only model cannot load is no server. `serve` says why on the
    # terminal and exits 1 (a missing weights file before it starts, corrupt weights once the load
    # fails), instead of serving 503s that "Try again" cannot fix.
    src = ROOT / "models" / "dinov2-s14-focus"
    dst = tmp_path / "models" / "dinov2-s14-focus"
    dst.mkdir(parents=True)
    shutil.copy(src / "manifest.json", dst / "manifest.json")
    env = {"HEADSCOPE_MODELS_DIR": str(tmp_path / "models"), "HEADSCOPE_EXTRA_MODELS": ""}
    if damage == "corrupt":
        (dst / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json" + b"\0" * 100)
    else:
        env["HEADSCOPE_MODEL"] = "local:vit_small_patch14_dinov2@/nonexistent/w.safetensors"
    r = run_cli("serve", "--port", str(free_port()), "--no-fetch", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    if damage == "corrupt":
        assert "headscope serve: no model could be loaded (dinov2-s14-focus: " in r.stderr
    else:
        assert "cannot load: the weights file w.safetensors is not there" in r.stderr
        assert "no model to serve" in r.stderr


def test_pickle_checkpoint_that_runs_code_is_refused(server_factory, tmp_path, pace):
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    ckpt = tmp_path / "evil.pth"
    ckpt.write_bytes(pickle.dumps({"pos_embed": Evil()}))
    srv = server_factory({"HEADSCOPE_MODEL": f"local:vit_small_patch16_224@{ckpt}"}, wait_ready=False)
    deadline = time.monotonic() + pace.s(60)  # the load fails in seconds on a quiet machine
    while (
        time.monotonic() < deadline
        and httpx.get(srv.url + "/readyz", timeout=HTTP_TIMEOUT).json()["status"] == "loading"
    ):
        time.sleep(0.2)
    r = httpx.get(srv.url + "/readyz", timeout=HTTP_TIMEOUT)
    assert r.status_code == 503 and "cannot read weights" in r.json()["reason"]
    assert not marker.exists(), "the pickle ran code"


def test_sigterm_drains_in_flight_requests(server_factory, pace):
    # The grace period scales with the sleeps it must wait for (20 s, the default, when quiet).
    srv = server_factory(
        {
            "HEADSCOPE_ENABLE_FAULT_INJECTION": "1",
            "HEADSCOPE_MAX_BATCH_SIZE": "2",
            "HEADSCOPE_SHUTDOWN_GRACE_S": f"{pace.s(20):.1f}",
        }
    )
    datas = images(4, 11)
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(post, srv.url, d, headers={FAULT: sleep(pace.s(0.5))}) for d in datas]
        time.sleep(pace.s(0.4))
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(pace.s(0.2))
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.url + "/readyz", timeout=1)  # no longer accepting: readiness dropped
        codes = [f.result().status_code for f in futs]
    assert codes == [200] * 4
    assert srv.proc.wait(pace.s(30)) == 0
    assert time.monotonic() - t0 < pace.s(15)
