"""A server whose log nobody reads keeps serving (app/web/log_writer.py).

`headscope serve` started with its stdout and stderr on pipes that are never read, the way a
notebook's `subprocess.Popen(..., stdout=PIPE)` leaves them: once a pipe's 64 KiB were full, the
next access-log line blocked the event loop, and with it every request (measured before the
change: the 1,093rd GET /healthz of a run at --log-level info never got an answer).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from helpers.server import HTTP_TIMEOUT, ROOT, SAMPLES, free_port

# Each GET writes an access line of about 70 bytes: 3,000 of them are three times a full pipe.
REQUESTS = 3000


def start_with_unread_pipes(env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HEADSCOPE_MODELS_DIR": str(ROOT / "models"), "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "headscope.cli", "serve", "--port", str(port), "--log-level", "info"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server was not ready in 300 s")


def read_all(stream) -> tuple[threading.Thread, list[bytes]]:
    chunks: list[bytes] = []

    def run() -> None:
        while data := stream.read1(65536):
            chunks.append(data)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, chunks


@pytest.mark.lifecycle
def test_a_server_whose_log_nobody_reads_keeps_answering_and_stops():
    proc, url = start_with_unread_pipes()
    try:
        with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as client:
            for _ in range(REQUESTS):
                assert client.get("/healthz").status_code == 200
            r = client.post(
                "/api/v1/attention",
                files={"image": ("cat.png", (SAMPLES / "cat.png").read_bytes(), "image/png")},
                data={"layers": "-1"},
            )
            assert r.status_code == 200, r.text
        # A graceful stop while the pipes are still full: the writer is left behind, not waited for.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.lifecycle
def test_once_the_log_is_read_again_its_lines_resume_and_say_what_was_dropped():
    # 100 records may wait: most of the 3,000 lines are dropped while nobody reads.
    proc, url = start_with_unread_pipes({"HEADSCOPE_LOG_QUEUE_RECORDS": "100"})
    try:
        with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as client:
            for _ in range(REQUESTS):
                assert client.get("/healthz").status_code == 200
            out_reader, out = read_all(proc.stdout)
            err_reader, err = read_all(proc.stderr)
            # Written once the writer has caught up with the 100 queued (the queue may be full
            # for a moment yet: asked again until it is written).
            deadline = time.monotonic() + 60
            while b"GET /api/v1/models" not in b"".join(out):
                assert time.monotonic() < deadline, "no access line after the log was read again"
                assert client.get("/api/v1/models").status_code == 200
                time.sleep(0.2)
            metrics = client.get("/metrics").text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        out_reader.join(30)
        err_reader.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout, stderr = b"".join(out).decode(), b"".join(err).decode()
    healthz = [line for line in stdout.splitlines() if "GET /healthz" in line]
    assert 0 < len(healthz) < REQUESTS
    said = re.findall(r"(\d+) log record\(s\) were dropped", stderr)
    assert said, stderr[-2000:]
    # every line it lost is counted: those of /healthz, and any /api/v1/models dropped above
    assert sum(map(int, said)) >= REQUESTS - len(healthz)
    counted = re.search(r"^headscope_log_records_dropped_total (\S+)$", metrics, re.M)
    assert counted and float(counted.group(1)) == sum(map(int, said)), metrics[-1500:]
    assert "Traceback" not in stderr
