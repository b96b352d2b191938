"""Faults injected into a real server: only the culprit fails, the server keeps serving."""

from __future__ import annotations

import re
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from helpers.api import assert_error, png, post
from helpers.cli import run_cli
from helpers.server import HTTP_TIMEOUT, ROOT, free_port
from helpers.waiting import wait_until

FAULT = "X-Headscope-Fault"


def images(n: int, seed: int = 0) -> list[bytes]:
    return [png(Image.new("RGB", (224, 224), ((seed * 37 + i * 53) % 256, i * 11 % 256, 90))) for i in range(n)]


def metric(base: str, name: str, labels: str = "") -> float:
    text = httpx.get(base + "/metrics", timeout=HTTP_TIMEOUT).text
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def computing(base: str) -> bool:
    """Whether the one upload admitted has been decoded and taken by the worker: it holds its
    slot, no decode is reserved and nothing waits in the queue (the upload's own body is a few
    bytes on loopback, read as soon as it is admitted)."""
    return (
        metric(base, "headscope_admitted", '{pool="upload"}') >= 1
        and metric(base, "headscope_decode_reserved_bytes") == 0
        and metric(base, "headscope_queue_depth") == 0
    )


def idle(base: str) -> bool:
    """Whether every request is over: no slot held, nothing queued."""
    held = sum(metric(base, "headscope_admitted", f'{{pool="{p}"}}') for p in ("upload", "follow_up", "heavy"))
    return held == 0 and metric(base, "headscope_queue_depth") == 0


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
    # The log names the job's model and batch (a real failure adds its traceback: tests/unit/web).
    assert re.search(
        r"compute failed: InjectedFault \(capture on dinov2-s14-focus, one picture of a batch of [1-3]\)",
        live_server.log(),
    )
    assert post(base, images(1, 2)[0]).status_code == 200


def test_out_of_memory_splits_the_batch(live_server, pace):
    base = live_server.url
    splits = metric(base, "headscope_oom_splits_total")
    # Keep the worker busy so the four queue up together and form one batch.
    blocker = threading.Thread(
        target=post, args=(base, images(1, 12)[0]), kwargs={"headers": {FAULT: sleep(pace.s(0.8))}}
    )
    blocker.start()
    wait_until(lambda: computing(base), pace.s(10), "the blocker on the worker")
    rs = concurrently(base, images(4, 3), [None, "oom", None, "oom-always"])
    blocker.join()
    assert [r.status_code for r in rs] == [200, 200, 200, 503]
    assert_error(rs[3], 503, "out_of_memory")
    assert metric(base, "headscope_oom_splits_total") > splits
    assert post(base, images(1, 4)[0]).status_code == 200


@pytest.mark.thorough
def test_fault_header_is_ignored_unless_enabled(server_factory):
    srv = server_factory({"HEADSCOPE_ENABLE_FAULT_INJECTION": "0"})
    assert post(srv.url, images(1, 5)[0], headers={FAULT: "raise"}).status_code == 200


@pytest.mark.waits
def test_deadline_full_queue_and_disconnect(server_factory, pace_now):
    # Durations for the quiet development machine, scaled by this machine's pace now: measured as
    # the test starts, not at the session's start (a CI run's load changes over its minutes; with
    # the session's pace a queued request met its 1.5 s deadline and answered 504).
    pace = pace_now
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
    computed = metric(base, "headscope_batch_size_count")  # counted when a compute ends
    r = post(base, datas[0], headers={FAULT: sleep(hang)})
    assert_error(r, 504, "timeout")
    assert metric(base, "headscope_batch_size_count") == computed, "the 504 came after the compute, not before"
    wait_until(lambda: metric(base, "headscope_batch_size_count") == computed + 1, pace.s(30), "the hung compute's end")
    assert post(base, datas[1]).status_code == 200

    # Full queue: while one request computes, two wait, the rest get 429 at once.
    slow_done = threading.Event()

    def slow_post():
        post(base, datas[2], headers={FAULT: sleep(pace.s(0.8))})
        slow_done.set()

    slow = threading.Thread(target=slow_post)
    slow.start()
    wait_until(lambda: computing(base), pace.s(10), "the slow request on the worker")
    with ThreadPoolExecutor(5) as ex:
        # Each answer with whether the slow compute had ended when it came.
        futs = [ex.submit(lambda d: (post(base, d), slow_done.is_set()), d) for d in datas[3:8]]
        results = [f.result() for f in futs]
    slow.join()
    refused = [(r, after) for r, after in results if r.status_code == 429]
    assert len(refused) >= 2, [r.status_code for r, _ in results]
    assert all(r.headers.get("retry-after") for r, _ in refused)
    assert not any(after for _, after in refused), "429 must come at once, not after waiting for the worker"
    assert all(r.status_code in (200, 429) for r, _ in results), [(r.status_code, r.text[:120]) for r, _ in results]

    # A client that goes away while queued: its request is never computed.
    wait_until(lambda: idle(base), pace.s(30), "the requests above to end")
    computed = metric(base, "headscope_batch_size_count")
    cancelled = metric(base, "headscope_rejections_total", '{reason="cancelled_before_compute"}')
    blocker = threading.Thread(target=post, args=(base, images(1, 9)[0]), kwargs={"headers": {FAULT: sleep(pace.s(1))}})
    blocker.start()
    wait_until(lambda: computing(base), pace.s(10), "the blocker on the worker")
    with pytest.raises(httpx.TimeoutException):
        post(base, images(1, 10)[0], timeout=pace.s(0.4))  # leaves while the blocker computes
    blocker.join()
    wait_until(
        lambda: metric(base, "headscope_rejections_total", '{reason="cancelled_before_compute"}') == cancelled + 1,
        pace.s(10),
        "the queued request of the client that left to be dropped",
    )
    wait_until(lambda: idle(base), pace.s(10), "the server to be idle")
    assert metric(base, "headscope_batch_size_count") == computed + 1


@pytest.mark.lifecycle
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


def test_pickle_checkpoint_that_runs_code_is_refused(tmp_path):
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    ckpt = tmp_path / "evil.pth"
    ckpt.write_bytes(pickle.dumps({"pos_embed": Evil()}))
    # Its only model refused, the server does not start (issue 41): it says why and exits 1.
    env = {"HEADSCOPE_MODEL": f"local:vit_small_patch16_224@{ckpt}", "HEADSCOPE_EXTRA_MODELS": ""}
    r = run_cli("serve", "--port", str(free_port()), "--no-fetch", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot read weights 'evil.pth'" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists(), "the pickle ran code"


def refused(url: str) -> bool:
    """Whether the server no longer takes connections (or says it is shutting down)."""
    try:
        return httpx.get(url + "/readyz", timeout=1).json().get("status") == "shutting_down"
    except httpx.HTTPError:
        return True


@pytest.mark.lifecycle
def test_sigterm_drains_in_flight_requests(server_factory, pace):
    # A grace period far longer than the drain: the server exits once the four are answered,
    # well within it (the wait below ends before the grace period could have run out).
    grace = pace.s(60)
    srv = server_factory(
        {
            "HEADSCOPE_ENABLE_FAULT_INJECTION": "1",
            "HEADSCOPE_MAX_BATCH_SIZE": "2",
            "HEADSCOPE_SHUTDOWN_GRACE_S": f"{grace:.1f}",
        }
    )
    datas = images(4, 11)
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(post, srv.url, d, headers={FAULT: sleep(pace.s(0.5))}) for d in datas]
        wait_until(lambda: metric(srv.url, "headscope_admitted", '{pool="upload"}') == 4, pace.s(10), "4 in flight")
        srv.proc.send_signal(signal.SIGTERM)
        # No longer accepting: readiness dropped.
        wait_until(lambda: refused(srv.url), pace.s(10), "the server to stop taking requests")
        codes = [f.result().status_code for f in futs]
    assert codes == [200] * 4
    assert srv.proc.wait(grace / 2) == 0
