"""A real `headscope serve` process on a free loopback port (tests, the benchmark, load and soak
scripts), and the machine's pace."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
SAMPLES = ROOT / "static" / "samples"

# Every test client waits this long for an answer (httpx's default 5 s failed on a loaded machine);
# a test about deadlines sets its own, derived from Pace.
HTTP_TIMEOUT = 120.0
# The default model's forward at 224x224 (batch 1, fp32) on the quiet 2-core development VM:
# 94-98 ms in the 2026-11-23 benchmark table of docs/performance.md. Pace compares this machine, now, against it.
QUIET_FORWARD_S = 0.1
MAX_SLOWDOWN = 20.0


@dataclass(frozen=True)
class Pace:
    """How slow this machine is now: one forward, timed through a real server at the start.

    Deadlines, fault sleeps and latency bounds in the tests are written for the quiet development
    machine and scaled by :attr:`slowdown`, so the tests hold on a loaded or slower machine.
    """

    forward_s: float

    @property
    def slowdown(self) -> float:
        # Capped: past MAX_SLOWDOWN the scaled waits would outgrow pytest's per-test timeout (900 s)
        # and the machine is too overloaded for any test about time to mean something.
        return min(MAX_SLOWDOWN, max(1.0, self.forward_s / QUIET_FORWARD_S))

    def s(self, quiet_seconds: float) -> float:
        """``quiet_seconds`` on the development machine, scaled to this one."""
        return quiet_seconds * self.slowdown


def measure_pace(url: str, rounds: int = 3) -> Pace:
    """Time the default model's forward through the server at ``url`` (median of ``rounds``)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng()
    times = []
    for _ in range(rounds):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(buf, "PNG")  # never cached
        r = httpx.post(
            url + "/api/v1/attention",
            files={"image": ("pace.png", buf.getvalue(), "image/png")},
            data={"layers": "-1"},
            timeout=HTTP_TIMEOUT,
        )
        r.raise_for_status()
        times.append(r.json()["timing_ms"]["compute"] / 1000)
    return Pace(sorted(times)[len(times) // 2])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real `headscope serve` process on 127.0.0.1."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        timeout: float = 300,
        command: list[str] | None = None,
        cwd: Path = ROOT,
        models_dir: Path | None = ROOT / "models",
        args: list[str] | None = None,
        log_path: Path | None = None,
    ):
        """Start the server and wait until it answers.

        Args:
            env: extra environment variables for the server.
            wait_ready: wait for /readyz (the model loaded), else only for /healthz.
            timeout: seconds to wait for it.
            command: the program that serves (default: this checkout's ``python -m headscope.cli``);
                ``serve --port N --log-level warning`` is appended.
            cwd: where it runs.
            models_dir: ``HEADSCOPE_MODELS_DIR``; None leaves it unset (the app picks its default).
            args: more ``serve`` options (``--model ID``...).
            log_path: where its output goes (default ``test-artifacts/server-PORT.log``).

        Raises:
            RuntimeError: the server exited, or was not ready within ``timeout``.
        """
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or ARTIFACTS / f"server-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = {k: v for k, v in os.environ.items() if k != "HEADSCOPE_MODELS_DIR"}
        if models_dir is not None:
            full_env["HEADSCOPE_MODELS_DIR"] = str(models_dir)
        full_env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                *(command or [sys.executable, "-m", "headscope.cli"]),
                "serve",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                *(args or []),
            ],
            cwd=cwd,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid
        started = time.monotonic()
        deadline = started + timeout
        path = "/readyz" if wait_ready else "/healthz"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + path, timeout=5).status_code == 200:
                    self.startup_s = time.monotonic() - started
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout}s: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop_cleanly(self) -> None:
        """Stop it (SIGTERM) and assert that it exited 0 with no traceback in its log: the end of
        every server fixture."""
        assert self.stop() == 0
        assert "Traceback" not in self.log(), "the server logged an unhandled error; see " + str(self.log_path)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
